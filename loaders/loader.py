"""``loaders.open(config)``: the trainer's iterator over batches.

Collective over the world communicator: every rank of the job opens the loader with the
same configuration. In dedicated mode (the default) one rank per node is the reader: its
``for batch in loader`` loop reads the node's records into node shared memory and yields
nothing; the other ranks are workers and get batches. In colocated mode every rank is a
worker and the first rank of each node also reads, up to ``readers.prefetch_depth``
batches ahead. Every worker gets the same number of batches per epoch.

:class:`Loader` composes the parts: the epoch schedule and resume state
(:mod:`loaders.schedule`), the look-ahead that decodes the next batch on a background
thread while the trainer works (:mod:`loaders.prefetch`), the batch assembler
(:mod:`loaders.assemble`) and the metrics (:mod:`loaders.metrics`), all reading the run
plan the configuration resolves into (:meth:`lmdbio.run_plan.RunPlan.resolve`).
The job configuration, the run plan and the read session (MPI topology, strategies) are
imported when a loader is opened, so that ``import loaders`` stays light.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.layouts import get_layout
from lmdbio.stages import StageClock
from loaders import options, stores
from loaders.assemble import Batch, BatchAssembler
from loaders.buffer_pool import BufferPool
from loaders.decode import make_decoder
from loaders.device_feed import DeviceFeed
from loaders.metrics import LoaderMetrics, Pace
from loaders.prefetch import Prefetcher
from loaders.schedule import EpochSchedule, EpochSlots, check_resumable, epoch_length
from loaders.transform import DataTransformer

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

    from lmdbio.config import JobConfig

#: host arrays a CPU worker keeps for reuse: the slot being delivered, the one decoded
#: ahead, and room for a trainer that holds a batch a little longer
POOLED_ARRAYS = 4


class Loader:
    """The iterable of batches (see the module docstring). Use :func:`open`."""

    def __init__(self, cfg: JobConfig, comm: MPI.Comm | None = None, *,
                 slot_checksum: bool | str | None = None) -> None:
        from lmdbio.mpiutil import agreed
        from lmdbio.reader import ReadSession
        from lmdbio.run_plan import RunPlan
        from lmdbio.topology import Topology
        self.cfg = cfg
        self.topo = Topology.build(
            comm, simulate_nodes=cfg.topology.simulate_nodes,
            readers_per_node=options.readers_per_node(cfg), mode=options.reader_mode(cfg),
            simulate_nodes_at=cfg.origin.location("topology.simulate_nodes"))
        # what the data set's sidecar decides (a crop larger than its images, a transform
        # for records that are not images) is read by every rank itself, and a node-local
        # copy may differ: agreed on, so that no rank waits in the read session for one
        # that refused
        with agreed(self.topo.world, "the job's settings", own_error=True):
            #: the resolved, checked settings every stage of this loader reads
            self.run_plan = RunPlan.resolve(
                cfg, self.topo, purpose="train", checksum=slot_checksum,
                batchwise_assembly=options.assembles_batchwise(cfg))
            #: Caffe's transform of this job's image batches, or None (options.transformer);
            #: made before the read session, so that a transform the records refuse stops
            #: the job before its ring is made
            self.transform: DataTransformer | None = options.transformer(cfg)
        #: a progressive layout (PCR): the scan groups the readers read (None: all; see
        #: :meth:`set_scan_groups`)
        self.scan_groups = cfg.dataset.scan_groups \
            if get_layout(cfg.dataset.layout).progressive else None
        self.session = ReadSession(cfg.dataset.path, self.topo, self.run_plan,
                                   value_prefix=self._scan_group_prefix(self.scan_groups))
        self.is_worker = self.topo.is_worker if self.session.shared else True
        self.xp = options.worker_device(cfg, self.topo) if self.is_worker else np
        #: a GPU worker's pinned staging ring and copy stream (loaders.device_feed)
        self.feed: DeviceFeed | None = None
        if self.xp is not np:
            self.feed = DeviceFeed(self.xp)
        #: decoded slots and transformed batches land in reused host memory (see
        #: loaders.buffer_pool: fresh arrays cost a kernel page-zeroing pass each)
        self.buffers = BufferPool(POOLED_ARRAYS if self.xp is np else 0)
        # an identity transform only converts to float32: the Datum decoder does it in its
        # pass over the pixels (on a GPU worker the pixels cross as uint8)
        decode = make_decoder(cfg, float32=self.transform is not None
                              and self.transform.is_identity and self.xp is np,
                              alloc=self.buffers.take)
        self.metrics = LoaderMetrics()
        self.schedule = EpochSchedule()
        self.pace = Pace()
        self.assembler = BatchAssembler(
            cfg, decode, self.transform, self.xp, self.feed, self.buffers.take,
            seed=self.run_plan.seed, rank=self.topo.rank, worker=self.topo.worker_rank,
            metrics=self.metrics, pace=self.pace, stages=self.session.stages)
        self.prefetcher = Prefetcher(
            self.session, self.assembler, self.metrics, self.pace, rank=self.topo.rank,
            on_host=self.xp is np, across_epochs=self.topo.mode == "dedicated"
            and not self.session.reads and self.session.shared)
        #: the slots of the epoch being delivered (None between epochs: nothing to drain)
        self.slots: EpochSlots | None = None
        self._published = 0  # slots of the epoch this rank published (a colocated reader)
        self._closed = False

    # ----------------------------------------------------------------- properties
    @property
    def comm(self) -> MPI.Comm:
        """The workers' communicator (for gradient allreduce); COMM_NULL on dedicated readers.
        """
        return self.topo.workers

    @property
    def epoch(self) -> int:
        """The epoch being delivered, or else the one the next loop delivers."""
        return self.schedule.epoch

    @property
    def position(self) -> int:
        """Batches consumed in the current epoch."""
        return self.schedule.position

    def __len__(self) -> int:
        """Batches every worker gets in the epoch being delivered, or else in the one the
        next loop delivers: the epoch's length, or its stop (:meth:`set_epoch`)."""
        return epoch_length(self.session.plan_for(self.epoch).iterations, self._stop())

    def _stop(self) -> int:
        """The stop of the epoch being delivered, or else of the next loop's (0: its end)."""
        s = self.session
        if self.slots is None:
            return self.schedule.stop_iteration
        return s.epoch_stop if s.plan is not None and s.epoch_stop < s.plan.iterations else 0

    # ----------------------------------------------------------------- epochs and state
    def set_epoch(self, epoch: int, stop_iteration: int | None = None) -> None:
        """Choose the epoch the next ``for`` loop delivers (seeds the shuffle); the epoch
        a loaded state is in keeps its position, so ``set_epoch(e); for batch in loader``
        resumes where the state was taken.

        ``stop_iteration`` (the same on every rank; 0: the whole epoch): the loop ends
        after that many batches, as Caffe's ``max_iter`` does, and the readers read nothing
        past it. The slot holding the stop is laid out for the batches before it (which
        records they carry changes), so a run resumed inside that epoch must stop at the
        same batch: :meth:`state_dict` keeps it, and ``None`` keeps the stop already set
        for this epoch, such as a loaded state's. It applies to the next loop only.
        """
        self.schedule.set_epoch(epoch, stop_iteration)

    def epochs(self) -> Iterator[int]:
        """The job's epochs, each chosen (:meth:`set_epoch`) before it is yielded:
        ``cfg.epochs`` of them, and with ``cfg.max_iterations`` the last one stopped at
        that iteration (counted across epochs), so that

            for epoch in loader.epochs():
                for batch in loader: ...

        runs the job as configured, the readers reading nothing past its last batch. Run
        it on every rank (an epoch left early still counts whole). ``max_iterations``
        takes effect only here; a loop of its own :meth:`set_epoch` calls runs what it asks.

        Each call starts from epoch 0, or after :meth:`load_state_dict` from the state's
        batch, the saved job's ``job_iteration`` counted against ``max_iterations``. A job
        ending inside the epoch the state was saved in must cut it where the saved run
        did, or a :class:`ConfigError` says which limits can resume there; a state at or
        past the limit yields no epoch. The loader is left at the epoch after the last."""
        yield from self.schedule.job(self.cfg.epochs, self.cfg.max_iterations,
                                     self.session.epoch_iterations)

    def set_scan_groups(self, k: int | None) -> None:
        """PCR: read scan groups 1..k of every record from now on (None: all). Call it on
        every rank, between epochs, like :meth:`set_epoch`: readers then read only each
        value's prefix for that fidelity."""
        self.scan_groups = k
        self.session.value_prefix = self._scan_group_prefix(k)
        self.assembler.decode = make_decoder(self.cfg, scan_groups=k)

    @staticmethod
    def _scan_group_prefix(k: int | None) -> Callable[[memoryview], int] | None:
        """The value prefix the readers read for PCR scan groups 1..k (None: all of it)."""
        from lmdbio.codecs.pcr import pcr_prefix_bytes

        return None if k is None else (lambda value: pcr_prefix_bytes(value, k))

    def state_dict(self) -> dict[str, Any]:
        """Where the workers are: resume with :meth:`load_state_dict` on every rank.

        Holds the epoch and the batches consumed in it (no replay needed to resume), plus
        what must not change between the two runs.
        """
        snap = self.session.db.snapshot
        return {
            **self.schedule.state(self._stop()),
            "seed": self.run_plan.seed, "shuffle": self.run_plan.shuffle,
            "batch_size": self.cfg.batch.size, "last": self.run_plan.last,
            "consumers": self.session.consumers, "strategy": self.run_plan.strategy,
            "snapshot": [snap.format_version, snap.txnid, snap.root, snap.file_size],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken: the next loop starts at its batch."""
        check_resumable(state, self.state_dict())
        self.schedule.load(state, self.session.epoch_iterations)

    # ----------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise LmdbioError("the loader is closed")
        self._drain()
        s = self.session
        start, stop = self.schedule.begin()
        s.begin_epoch(self.epoch, start, stop)
        self.schedule.enter(start)
        # the slots this epoch's batches travel in (several consecutive batches per slot)
        slots = EpochSlots.of(start, s.epoch_stop, s.batches_per_slot)
        if s.shared and s.reads and not self.is_worker:  # dedicated reader
            for first, count in slots.groups:
                s.read_group(first, count)
            self.schedule.end(s.epoch_stop)
            return
        self.slots = slots  # an epoch in progress: drained if left early
        self._published = 0
        self.prefetcher.begin_epoch(self.epoch, slots)
        # colocated reader, or a naive strategy: reads ahead, then consumes; what it has
        # to publish changes only where a slot begins
        read_at = frozenset(first for first, _ in slots.groups) if s.reads else frozenset()
        try:
            for it in range(slots.start, slots.end):
                if it in read_at:
                    self._read_ahead(it)
                batch, nbytes = self.prefetcher.take(it)
                self.metrics.batches += 1
                self.metrics.samples += len(batch)
                self.metrics.bytes += nbytes
                self.schedule.position = it + 1
                every = self.cfg.metrics.every  # the first worker prints its progress
                if every and self.topo.worker_rank == 0 and (it + 1) % every == 0:
                    print(self.metrics.progress(self.epoch, it + 1), flush=True)
                if it + 1 < slots.end:
                    self.prefetcher.look_ahead(it + 1)
                else:
                    self.prefetcher.look_ahead_epoch()
                yielded = time.perf_counter()
                yield batch
                self.pace.stepped(time.perf_counter() - yielded)
        except Exception:
            # reading or decoding failed: what the ring still holds is not what the rule of
            # _drain expects; closing must not wait for it (the job aborts, or the trainer
            # handles the error and closes)
            self.slots = None
            raise
        self.slots = None
        self.schedule.end(s.epoch_stop)

    def _read_ahead(self, it: int) -> None:
        """Colocated reader (or a naive strategy), at the first batch ``it`` of a slot:
        publish the slots up to ``readers.prefetch_depth`` ahead of the one carrying
        ``it`` (just that one for a rank reading for itself)."""
        s, slots = self.session, self.slots
        assert slots is not None  # only while an epoch is delivered
        limit = slots.read_ahead_limit(it, self.run_plan.prefetch_depth if s.shared else 1)
        while self._published < limit:
            s.read_group(*slots.groups[self._published])
            self._published += 1

    def _drain(self) -> None:
        """Finish an epoch the trainer left early, so readers and workers stay in step.

        Workers of a dedicated reader take (and drop) the rest of the epoch's slots, which
        the reader publishes anyway; in colocated mode only the slots already read ahead
        are dropped (every rank computes the same count from its position).
        """
        slots = self.slots
        if slots is None:
            return
        s = self.session
        self.slots = None
        self.prefetcher.drain(slots.published(self.position, self.run_plan.prefetch_depth,
                                              shared=s.shared,
                                              dedicated=self.topo.mode == "dedicated"))
        self.schedule.left(s.epoch_stop)

    # ----------------------------------------------------------------- lifecycle
    def summary(self) -> dict[str, Any]:
        """This rank's metrics and role, JSON-able; ``stages``: CPU and wall seconds per
        stage of the data path, where :attr:`stages` was enabled (see :mod:`lmdbio.stages`);
        ``stores``: the policy and trials of the store kind (:mod:`loaders.stores`);
        ``populated``: whether the database's mapping was put whole in this rank's page
        tables when it opened (:func:`lmdbio.io.prefetch.populate_if_resident`)."""
        return {"rank": self.topo.rank, "node": self.topo.host_node,
                "node_ring": self.topo.node_index,
                "worker": self.is_worker, "reader": self.session.reads,
                **self.metrics.as_dict(), "stages": self.stages.as_dict(),
                "populated": self.session.totals.populated,
                "stores": stores.STORES.as_dict()}

    @property
    def stages(self) -> StageClock:
        """This rank's per-stage clock (reader and worker stages alike); set ``enabled``
        to measure, e.g. for a warm-up epoch: each span costs about two microseconds."""
        return self.session.stages

    def close(self) -> None:
        """Collective: stop the readers, free shared memory and communicators."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drain()
            self.prefetcher.close()
            if self.feed is not None:
                self.feed.close()
            self.session.stop()
            self.session.close()
        finally:
            self.topo.close()

    def abort(self, reason: str) -> None:
        """Local, never collective: give up after an error on this rank.

        The node's ring is aborted (its other ranks raise :class:`~lmdbio.shm.
        RingAbortedError` at their next wait), the decoding thread is abandoned, nothing
        waits for a peer: a collective :meth:`close` cannot complete once a rank fails
        mid-epoch (a dedicated reader blocked on a full ring would never send the STOP a
        worker's ``close`` waits for). The process is expected to end (``lmdbio run``
        aborts the MPI job); shared memory returns to the OS when it does.
        """
        if self._closed:
            return
        self._closed = True
        self.slots = None
        self.prefetcher.abandon()
        ring = self.session.ring
        if ring is not None:
            ring.abort(reason)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        """Close collectively after a normal exit; after an exception, :meth:`abort` (a
        collective close would wait for peers that are not coming)."""
        if exc_type is None:
            self.close()
        else:
            self.abort(f"rank {self.topo.rank}: {exc_type.__name__}: {exc}")


def open(config: str | os.PathLike[str] | Mapping[str, Any] | JobConfig,
         overrides: list[str] | tuple[str, ...] = (), comm: MPI.Comm | None = None, *,
         slot_checksum: bool | str | None = None) -> Loader:
    """Open a loader from a config path, a dict or a :class:`lmdbio.config.JobConfig`.

    Collective: call it on every rank of the job. ``slot_checksum`` (True / ``"xxh64"``,
    ``"crc32"``, False / ``"none"``) overrides the config's ``readers.checksum``: the
    checksum of each worker's part of every node batch in shared memory (XXH64 by default;
    off saves a pass over every batch on each side where the path is trusted).
    """
    from lmdbio.config import load_config

    cfg = load_config(config, overrides)
    return Loader(cfg, comm, slot_checksum=slot_checksum)
