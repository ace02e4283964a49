"""``loaders.open(config)``: the trainer's iterator over batches.

Collective over the world communicator: every rank of the job opens the loader with the
same configuration. In dedicated mode (the default) one rank per node is the reader: its
``for batch in loader`` loop reads the node's records into node shared memory and yields
nothing; the other ranks are workers and get batches. In colocated mode every rank is a
worker and the first rank of each node also reads, up to ``readers.prefetch_depth``
batches ahead. Every worker gets the same number of batches per epoch.

A worker decodes the next batch on a background thread while the trainer works on the one
just yielded, whenever that next batch has already arrived (the decoding kernels release
the GIL); receiving and releasing slots stay on the trainer's thread.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.errors import ConfigError, LmdbioError
from lmdbio.plan.epoch import job_epochs
from lmdbio.stages import StageClock
from loaders.buffer_pool import BufferPool

log = logging.getLogger("lmdbio.loader")

#: host arrays a CPU worker keeps for reuse: the slot being delivered, the one decoded
#: ahead, and room for a trainer that holds a batch a little longer
_POOLED_ARRAYS = 4
#: weight of the newest sample in the running means of the trainer's step and of a batch's
#: assembly (:meth:`Loader._ahead_pays`)
_EWMA = 0.25


@dataclass
class Batch:
    """One worker's batch.

    ``data`` is ``(N, C, h, w)`` float32 for Caffe Datums (after Caffe's transform),
    ``(N, *shape)`` for tensor records, a :class:`~lmdbio.codecs.toc.TocMatrix` for TOC;
    numpy on CPU hosts, cupy on GPU workers. ``keys`` are the LMDB keys (traceability),
    ``ids`` the records' positions in key order, ``padding`` flags records repeated to fill
    the epoch's last batch (policy ``pad``).
    """

    data: Any
    label: Any
    ids: np.ndarray
    padding: np.ndarray
    epoch: int
    iteration: int
    key_offsets: np.ndarray
    key_data: np.ndarray

    def __len__(self) -> int:  # images (rows): a PCR, IBP or TOC record holds several
        return int(self.label.shape[0])

    @property
    def keys(self) -> list[bytes]:
        """The LMDB keys of the batch's records (built on demand: not on the hot path)."""
        ko, kd = self.key_offsets, self.key_data
        return [bytes(kd[ko[i]:ko[i + 1]]) for i in range(ko.shape[0] - 1)]


@dataclass
class LoaderMetrics:
    """What a worker measured: batches, samples, bytes, time waiting for data.

    ``wait_seconds`` is the time spent receiving batches (blocked on the node's ring, then
    validating the slot and verifying its checksum); ``blocked_seconds`` the part of it
    spent blocked on the ring alone, with nothing to do but wait for the reader.
    ``epochs_decoded_ahead`` counts epochs whose first slot was decoded during the previous
    epoch's last step (a dedicated reader ahead across the epoch boundary).
    """

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    wait_seconds: float = 0.0
    blocked_seconds: float = 0.0
    decode_seconds: float = 0.0
    skipped: int = 0
    substituted: int = 0
    epochs_decoded_ahead: int = 0
    started: float = field(default_factory=time.perf_counter)

    def as_dict(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        return {
            "batches": self.batches, "samples": self.samples, "bytes": self.bytes,
            "seconds": elapsed, "wait_seconds": self.wait_seconds,
            "blocked_seconds": self.blocked_seconds,
            "decode_seconds": self.decode_seconds,
            "samples_per_second": self.samples / elapsed if elapsed else 0.0,
            "megabytes_per_second": self.bytes / elapsed / 1e6 if elapsed else 0.0,
            "stall_fraction": self.wait_seconds / elapsed if elapsed else 0.0,
            "blocked_fraction": self.blocked_seconds / elapsed if elapsed else 0.0,
            "skipped_records": self.skipped, "substituted_records": self.substituted,
            "epochs_decoded_ahead": self.epochs_decoded_ahead,
        }


def _slot_checksum(value: bool | str) -> bool | str:
    """The ring's checksum setting for ``readers.checksum`` (``"none"`` -> off)."""
    return False if value == "none" else value


def _reader_mode(cfg: Any) -> str:
    """``readers.mode`` for the topology: ``auto`` means colocated where the workers use
    GPUs (each rank drives a device: a rank that only reads would leave one idle); the
    topology resolves ``auto`` by node size otherwise (:func:`lmdbio.topology.auto_mode`)."""
    mode = cfg.readers.mode
    if mode == "auto" and _gpu_workers(cfg):
        return "colocated"
    return mode


def _gpu_workers(cfg: Any) -> bool:
    """Whether workers will run on a GPU (``workers.device`` cuda, or auto and cupy finds
    one): asked before the topology is built, so the same on every rank of a host."""
    want = cfg.workers.device
    if want == "cpu":
        return False
    if want == "cuda":
        return True
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no cupy, no driver, no device
        return False


def _device(cfg: Any, topo: Any) -> Any:
    """numpy, or cupy with the device picked from the worker's local index."""
    want = cfg.workers.device
    if want == "cpu":
        return np
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no cupy, no driver, no device
        if want == "cuda":
            raise LmdbioError(f"workers.device is cuda but no GPU is usable here ({exc})") \
                from None
        return np
    if n == 0:
        if want == "cuda":
            raise LmdbioError("workers.device is cuda but cupy finds no device")
        return np
    cupy.cuda.Device(max(topo.device_index, 0) % n).use()
    return cupy


class Loader:
    """The iterable of batches (see the module docstring). Use :func:`open`."""

    def __init__(self, cfg: Any, comm: Any = None, *, slot_checksum: bool | str | None = None
                 ) -> None:
        from lmdbio.reader import ReadOptions, ReadSession
        from lmdbio.topology import Topology
        from loaders.decode import make_decoder
        from loaders.transform import DataTransformer

        self.cfg = cfg
        from lmdbio.codecs.registry import BATCH_CODECS
        from lmdbio.layouts import LAYOUTS, layout_names

        codec = BATCH_CODECS.get(cfg.codec.name)
        if codec is None or not codec.transport:
            transport = " and ".join(n for n, c in BATCH_CODECS.items() if c.transport)
            raise ConfigError(f"codec.name: {cfg.codec.name!r} is a storage layout here, not a "
                              f"transport codec (transport supports {transport}); use "
                              f"dataset.layout: {cfg.codec.name}")
        from loaders.decode import records_per_batch

        transfer = cfg.readers.transfer
        layout = LAYOUTS.get(cfg.dataset.layout)
        as_stored = layout is not None and layout.spans and cfg.codec.name == "none"
        if transfer == "auto":
            transfer = "spans" if as_stored else "copy"
        if transfer == "spans" and not as_stored:
            raise ConfigError(f"readers.transfer: spans hands out records as they are stored "
                              f"(dataset.layout {' or '.join(layout_names(spans=True))}, "
                              f"codec.name none); this job has layout {cfg.dataset.layout!r} "
                              f"and codec {cfg.codec.name!r}: use transfer: copy")
        if cfg.readers.per_node != 1:
            raise ConfigError(f"readers.per_node: {cfg.readers.per_node} readers per node is not "
                              "supported yet (one node ring has one reader); use 1")
        self.topo = Topology.build(comm, simulate_nodes=cfg.topology.simulate_nodes,
                                   readers_per_node=cfg.readers.per_node,
                                   mode=_reader_mode(cfg))
        from lmdbio.plan.strategies import strategy_class

        shared = strategy_class(cfg.readers.strategy).shared
        consumers = self.topo.n_workers if shared else self.topo.size
        if cfg.batch.size < consumers:
            raise ConfigError(f"batch.size {cfg.batch.size} is smaller than the number of "
                              f"consuming ranks ({consumers}); every rank needs a record")
        per_worker = cfg.batch.size // consumers
        if per_worker * consumers != cfg.batch.size and self.topo.rank == 0:
            log.warning("batch.size %d is not a multiple of the %d consuming ranks: the global "
                        "batch is %d", cfg.batch.size, consumers, per_worker * consumers)
        # batch.size counts images (rows): a PCR, IBP or TOC record holds several
        per_worker, note = records_per_batch(cfg, per_worker, consumers)
        if note and self.topo.rank == 0:
            log.warning("%s", note)
        self.per_worker = per_worker
        self.opts = ReadOptions(
            strategy=cfg.readers.strategy, batch_size=per_worker, last=cfg.batch.last,
            shuffle=cfg.shuffle.mode, seed=cfg.shuffle.seed,
            block_pages=cfg.shuffle.block_pages, window_blocks=cfg.shuffle.window,
            prefetch_depth=cfg.readers.prefetch_depth,
            batches_per_slot=cfg.readers.batches_per_slot, subdb=cfg.dataset.subdb,
            codec=cfg.codec.name, codec_options=cfg.codec.options_dict(),
            accounting=False,  # page accounting is for `lmdbio bench read`, not training
            checksum=_slot_checksum(cfg.readers.checksum if slot_checksum is None
                                    else slot_checksum),
            transfer=transfer)
        if cfg.dataset.layout == "pcr":
            self.set_scan_groups(cfg.dataset.scan_groups)
        self.session = ReadSession(cfg.dataset.path, self.topo, self.opts)
        self.is_worker = self.topo.is_worker if shared else True
        self.transform = DataTransformer.from_config(cfg.transform) \
            if cfg.dataset.layout in ("caffe-datum", "pcr") else None
        # an identity transform only converts to float32: the Datum decoder does it in its
        # pass over the pixels
        self.xp = _device(cfg, self.topo) if self.is_worker else np
        #: a GPU worker's pinned staging ring and copy stream (loaders.device_feed)
        self.feed: Any = None
        if self.xp is not np:
            from loaders.device_feed import DeviceFeed

            self.feed = DeviceFeed(self.xp)
        #: decoded slots and transformed batches land in reused host memory (see
        #: loaders.buffer_pool: fresh arrays cost a kernel page-zeroing pass each)
        self.buffers = BufferPool(_POOLED_ARRAYS if self.xp is np else 0)
        # (on a GPU worker the pixels cross to the device as uint8: no float32 on the host)
        self.decode = make_decoder(cfg, float32=self.transform is not None
                                   and self.transform.is_identity and self.xp is np,
                                   alloc=self.buffers.take)
        self.epoch = 0
        self.start_iteration = 0
        #: where the next loop's epoch stops (set_epoch; 0: its end)
        self.stop_iteration = 0
        #: (epoch, iteration, stop) of a state loaded and not yet resumed
        self._resumed: tuple[int, int, int] | None = None
        #: iterations of the job before the current epoch's batch 0 (each finished epoch
        #: counts its length or its stop): the state's ``job_iteration`` is this plus
        #: :attr:`position`, counted against ``max_iterations`` by :meth:`epochs`
        self._job_base = 0
        self.position = 0  # batches consumed in the current epoch
        self.metrics = LoaderMetrics()
        self._last_good: tuple[Any, int] | None = None
        # (iteration, received batch, future of its decoding) while a batch decodes ahead
        self._ahead: tuple[int, Any, Any] | None = None
        self._pool: Any = None  # the decoding thread, started with the first look-ahead
        #: (slot, future of its decoding or None) of the next epoch's first slot, received
        #: at the previous epoch's last batch (:meth:`_look_ahead_epoch`)
        self._next_epoch_slot: tuple[Any, Any] | None = None
        #: the received slot whose batches are assembled as they are asked for: released
        #: once the last one is (:meth:`_set_decoded`)
        self._held: Any = None
        #: running means of the trainer's time between two batches and of the time one
        #: batch takes to assemble (:meth:`_ahead_pays`)
        self._step_s = 0.0
        self._assemble_s = 0.0
        self._decoded: tuple[int, list[Any]] | None = None
        self._closed = False
        self._open: tuple[int, int] | None = None
        self._published = 0
        #: set_epoch / load_state_dict named the epoch the next loop delivers (then leaving
        #: an epoch early does not move on to the one after it)
        self._epoch_chosen = False

    # ----------------------------------------------------------------- properties
    @property
    def comm(self) -> Any:
        """The workers' communicator (for gradient allreduce); COMM_NULL on dedicated readers.
        """
        return self.topo.workers

    def __len__(self) -> int:
        """Batches every worker gets in the epoch being delivered, or else in the one the
        next loop delivers: the epoch's length, or its stop (:meth:`set_epoch`)."""
        whole = self.session.plan_for(self.epoch).iterations
        stop = self._delivered_stop() if self._open is not None else self.stop_iteration
        return min(stop, whole) if stop else whole

    def _delivered_stop(self) -> int:
        """The stop of the epoch being delivered (0: it runs whole), from the session."""
        s = self.session
        return s.epoch_stop if s.plan is not None and s.epoch_stop < s.plan.iterations else 0

    # ----------------------------------------------------------------- epochs and state
    def set_epoch(self, epoch: int, stop_iteration: int | None = None) -> None:
        """Choose the epoch the next ``for`` loop delivers (seeds the shuffle).

        Setting the epoch a loaded state is in keeps that state's position, so the usual
        ``set_epoch(e); for batch in loader`` resumes where the state was taken.

        ``stop_iteration`` (the same on every rank): the loop ends after that many batches
        of the epoch, as a trainer that stops at its last iteration (Caffe's ``max_iter``)
        does; 0 or the epoch's length: the whole epoch. The readers then read nothing
        past it: the slot that holds the stop is laid out for the batches before it,
        which changes which records those batches carry (each record still at most once),
        so a run resumed inside that epoch must stop at the same batch: :meth:`state_dict`
        keeps it, and ``None`` (the default) keeps the stop already set for this epoch, such
        as a loaded state's. It applies to the next loop only.
        """
        if stop_iteration is None:
            stop = self.stop_iteration if int(epoch) == self.epoch else 0
        else:
            stop = int(stop_iteration)
        if stop < 0:
            raise ConfigError(f"set_epoch: stop_iteration must be >= 0, got {stop}")
        if int(epoch) != self.epoch:
            self.start_iteration = 0
        self.epoch = int(epoch)
        self.stop_iteration = stop
        self._epoch_chosen = True  # an epoch left early is not followed by epoch + 1

    def epochs(self) -> Iterator[int]:
        """The job's epochs, each chosen (:meth:`set_epoch`) before it is yielded:
        ``cfg.epochs`` of them, and with ``cfg.max_iterations`` the last one stopped at
        that iteration (counted across epochs), so that

            for epoch in loader.epochs():
                for batch in loader: ...

        runs the job as configured, the readers reading nothing past its last batch. Run
        it on every rank: every rank computes the same schedule from the plan (a trainer
        that leaves an epoch early still counts it whole). ``max_iterations`` takes
        effect only here; a loop of its own :meth:`set_epoch` calls runs what it asks for.

        Each call starts the job from epoch 0, or after :meth:`load_state_dict` from the
        state's batch, with the iterations the saved job had run (``job_iteration`` in
        the state) counted against ``max_iterations``: a job resumed with a larger limit
        runs up to it. Ending the job inside the epoch the state was saved in must cut it
        where the saved run did (which records a cut epoch's batches carry depends on the
        cut); otherwise a :class:`ConfigError` says which limits can resume there. A
        state at or past the limit yields no epoch. When the generator ends, the loader
        is left at the epoch after the last one."""
        per = self.session.epoch_iterations
        limit = self.cfg.max_iterations
        epoch0, start0, stop0 = self._resumed if self._resumed is not None else (0, 0, 0)
        base = self._job_base if self._resumed is not None else 0
        schedule = job_epochs(self.cfg.epochs, limit, per, epoch=epoch0, iteration=start0,
                              done=base + start0)
        if start0 and schedule and schedule[0][1] != stop0:
            raise ConfigError(self._cut_mismatch(schedule[0][1], epoch0, start0, stop0, base))
        for epoch, stop in schedule:
            self._job_base = base
            self.set_epoch(epoch, stop)
            yield epoch
            base += stop or per
            self._job_base = base

    def _cut_mismatch(self, stop: int, epoch: int, start: int, saved: int, base: int) -> str:
        """The error of a resume whose ``max_iterations`` cuts the saved epoch elsewhere."""
        limit, per = self.cfg.max_iterations, self.session.epoch_iterations
        ends = f"inside epoch {epoch} at batch {stop}" if stop else \
            f"after epoch {epoch} whole"
        fits = f"{base + saved}" if saved else f"0 or at least {base + per}"
        return (f"max_iterations {limit} ends this job {ends}, but the state loaded was "
                f"saved at batch {start} of epoch {epoch}, in a run that stopped that "
                f"epoch {f'at batch {saved}' if saved else 'at its end'}: which records "
                "a cut epoch's batches carry depends on where it is cut, so a run resumed "
                f"inside it must cut it there too (max_iterations {fits}, or at most "
                f"{base + start} to end the job where it was saved)")

    def set_scan_groups(self, k: int | None) -> None:
        """PCR: read scan groups 1..k of every record from now on (None: all). Call it on
        every rank, between epochs, like :meth:`set_epoch`: readers then read only each
        value's prefix for that fidelity."""
        from lmdbio.codecs.pcr import pcr_prefix_bytes

        self.scan_groups = k
        self.opts.value_prefix = None if k is None else (
            lambda value: pcr_prefix_bytes(value, k))
        if hasattr(self, "decode"):
            from loaders.decode import make_decoder

            self.decode = make_decoder(self.cfg, scan_groups=k)

    def state_dict(self) -> dict[str, Any]:
        """Where the workers are: resume with :meth:`load_state_dict` on every rank.

        Holds the epoch and the batches consumed in it (no replay needed to resume), plus
        what must not change between the two runs.
        """
        snap = self.session.db.snapshot
        return {
            "epoch": self.epoch, "iteration": self.position,
            "job_iteration": self._job_base + self.position,
            "stop_iteration": self._delivered_stop() if self._open is not None
            else self.stop_iteration,
            "seed": self.opts.seed, "shuffle": self.opts.shuffle,
            "batch_size": self.cfg.batch.size, "last": self.opts.last,
            "consumers": self.session.consumers, "strategy": self.opts.strategy,
            "snapshot": [snap.format_version, snap.txnid, snap.root, snap.file_size],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken: the next loop starts at its batch."""
        mine = self.state_dict()
        for key in ("seed", "shuffle", "batch_size", "last", "consumers", "snapshot"):
            saved: Any = state.get(key)  # None where the state lacks it: never equal
            if list(np.atleast_1d(saved)) != list(np.atleast_1d(mine[key])):
                raise ConfigError(f"load_state_dict: {key} was {state.get(key)!r} when the "
                                  f"state was saved but is {mine[key]!r} now; an exact "
                                  "resume needs the same data, order and world")
        self.epoch = int(state["epoch"])
        self.start_iteration = int(state["iteration"])
        self.stop_iteration = int(state.get("stop_iteration", 0))
        # states saved before job_iteration was kept: every earlier epoch ran whole
        job = int(state.get("job_iteration", self.epoch * self.session.epoch_iterations
                            + self.start_iteration))
        self._job_base = job - self.start_iteration
        self._resumed = (self.epoch, self.start_iteration, self.stop_iteration)
        self._epoch_chosen = True

    # ----------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Batch]:
        from lmdbio.reader import slot_groups

        if self._closed:
            raise LmdbioError("the loader is closed")
        self._drain()
        s = self.session
        start, stop = self.start_iteration, self.stop_iteration
        if 0 < stop < start:
            raise ConfigError(f"epoch {self.epoch}: stop_iteration {stop} is before the "
                              f"batch the loop starts at ({start})")
        resumed, self._resumed = self._resumed, None
        if resumed is not None and start > 0 and resumed[:2] == (self.epoch, start) \
                and resumed[2] != stop:
            raise ConfigError(f"epoch {self.epoch}: the state loaded stops this epoch at "
                              f"{resumed[2] or 'its end'}, this loop at {stop or 'its end'}: "
                              "where an epoch stops decides which records its batches "
                              "carry, so a run resumed inside it must stop where the "
                              "saved run did")
        s.begin_epoch(self.epoch, start, stop)
        self.start_iteration = self.stop_iteration = 0
        self._epoch_chosen = False
        self.position = start
        end = s.epoch_stop  # the epoch's length, or the stop inside it
        depth = self.opts.prefetch_depth
        # the slots this epoch's batches travel in (several consecutive batches per slot)
        groups = slot_groups(start, end, s.batches_per_slot)
        if s.shared and s.reads and not self.is_worker:  # dedicated reader
            for first, count in groups:
                s.read_group(first, count)
            self._end_epoch()
            return
        self._open = (end, start)  # an epoch in progress: drained if left early
        self._groups = groups
        self._published = 0  # slots this rank published (a colocated reader)
        self._received = 0  # slots this rank received
        self._decoded = None
        try:
            for it in range(start, end):
                if s.reads:  # colocated reader, or a naive strategy: read ahead, consume
                    self._read_ahead(it, depth)
                batch = self._take(it)
                self.position = it + 1
                self._report(it)
                if it + 1 < end:
                    self._look_ahead(it + 1)
                else:
                    self._look_ahead_epoch()
                yielded = time.perf_counter()
                yield batch
                self._step_s += _EWMA * (time.perf_counter() - yielded - self._step_s)
        except Exception:
            # reading or decoding failed: what the ring still holds is not what the rule of
            # _drain expects; closing must not wait for it (the job aborts, or the trainer
            # handles the error and closes)
            self._open = None
            raise
        self._open = None
        self._end_epoch()

    def _slot_of(self, it: int) -> int:
        """Index (in this epoch's :func:`~lmdbio.reader.slot_groups`) of the slot carrying
        iteration ``it``."""
        _, start = self._open  # type: ignore[misc]
        per = max(self.session.batches_per_slot, 1)
        return it // per - start // per

    def _have(self, it: int) -> bool:
        """Whether batch ``it`` is among those decoded from the last slot received."""
        d = self._decoded
        return d is not None and d[0] <= it < d[0] + len(d[1])

    def _look_ahead(self, it: int) -> None:
        """If the slot of batch ``it`` has already arrived, start decoding it on the
        loader's thread, so that it decodes while the trainer computes on the batch just
        yielded (nothing to do when ``it`` came in the slot already decoded).

        The decoding kernels release the GIL, so the two really overlap. Only the arrival is
        checked here (MPI stays on the calling thread: receiving, and releasing the slot
        once decoded, happen in :meth:`_take`); a slot not there yet is received and
        decoded when asked for, as before. Device (cupy) workers decode in line.
        """
        if self.xp is not np or self._have(it) or not self.session.poll():
            return
        if self._fuses_datums() and not self._ahead_pays():
            # its batches are assembled one by one as asked for: the slot's own work
            # (checks, keys) is little, and a hand-off to the thread for it costs more
            # than it hides unless the trainer's step is long (one process, CIFAR-like:
            # the trainer's thread waited on it 10% of the time)
            return
        got = self._receive(defer_verify=True)  # verified on the decoding thread
        if got is None:  # the reader stopped: said when this batch is asked for
            self._ahead = (it, None, None)
            return
        self._ahead = (it, got, self._decoding_thread().submit(self._make_batches, got, it))

    def _look_ahead_epoch(self) -> None:
        """At an epoch's last batch: when the node's dedicated reader has already published
        the next epoch's first slot (it runs ahead across epochs), receive it now and, if it
        is what the usual ``set_epoch(epoch + 1)`` loop asks for next (that epoch, from its
        first batch), start decoding it on the loader's thread. Otherwise every new epoch
        began with a slot decoded inside the trainer's wait: with 600 ImageNet-like records
        and 4 workers of 32, one batch in 5, 60% of the workers' time in the loader.

        A slot of another epoch (the trainer chose one; the reader, running the same script,
        did too) is kept undecoded and decoded when asked for; the next epoch's plan is
        made on the thread, the session's stays the current one's.
        """
        s = self.session
        if (self.xp is not np or self.topo.mode != "dedicated" or s.reads or not s.shared
                or self._next_epoch_slot is not None or not s.poll()):
            return
        got = self._receive(defer_verify=True)
        if got is None:  # the reader stopped: the next receive says so again
            return
        future = None
        if got.epoch == self.epoch + 1 and got.iteration == 0:
            future = self._decoding_thread().submit(self._make_next_epoch_batches, got,
                                                    got.epoch)
        self._next_epoch_slot = (got, future)

    def _decoding_thread(self) -> Any:
        """The loader's one decoding thread (an executor), started on first use."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="lmdbio-decode")
        return self._pool

    def _whole_first_slot_batches(self, epoch: int) -> int:
        """Batches in the first slot of ``epoch`` run whole (no stop inside it): what
        the first slot decoded ahead of it holds (:meth:`_look_ahead_epoch`)."""
        from lmdbio.reader import slot_groups

        plan = self.session.plan_for(epoch)
        groups = slot_groups(0, plan.iterations, self.session.batches_per_slot)
        return groups[0][1] if groups else 0

    def _make_next_epoch_batches(self, got: Any, epoch: int) -> list[Any]:
        """:meth:`_make_batches` of the first slot of ``epoch`` (not the current one), as
        the epoch run whole lays it out."""
        plan = self.session.plan_for(epoch)
        return self._make_batches(got, 0, plan=plan, epoch=epoch,
                                  expected=self._whole_first_slot_batches(epoch))

    @staticmethod
    def _wait_quietly(future: Any) -> None:
        """Wait for a decoding whose result is not used (its memory is the slot's)."""
        if future is None:
            return
        try:
            future.result()
        except Exception as exc:  # a slot laid out otherwise, or a bad record: unused
            log.debug("dropping a slot decoded ahead: %s", exc)

    def _take(self, it: int) -> Batch:
        """Batch ``it``: from the slot already decoded, the one decoded ahead, or a slot
        received and decoded now."""
        if not self._have(it) and self._next_epoch_slot is not None:
            got, future = self._next_epoch_slot
            self._next_epoch_slot = None
            try:
                if (got.epoch, got.iteration) != (self.epoch, it):
                    raise LmdbioError(
                        f"rank {self.topo.rank}: the reader's next slot is epoch {got.epoch} "
                        f"iteration {got.iteration}, this worker asks for epoch {self.epoch} "
                        f"iteration {it}: every rank of the job must call set_epoch and "
                        "load_state_dict alike")
                if future is not None and self._groups[0][1] == \
                        self._whole_first_slot_batches(self.epoch):
                    batches = future.result()
                    self.metrics.epochs_decoded_ahead += 1
                else:
                    # decoded ahead as the epoch's whole first slot, but this epoch stops
                    # inside it (set_epoch's stop_iteration): its slot is laid out for
                    # the batches before the stop, decoded now with this epoch's plan
                    self._wait_quietly(future)
                    batches = self._make_batches(got, it)
            except BaseException:
                got.release()
                raise
            self._received += 1
            self._set_decoded(it, batches, got)
        if not self._have(it):
            if self._ahead is None:
                got = self._receive(defer_values=self._fuses_datums())
                if got is None:
                    raise LmdbioError(f"the reader stopped before epoch {self.epoch} "
                                      f"iteration {it}")
                try:
                    batches = self._make_batches(got, it)
                except BaseException:
                    got.release()
                    raise
            else:
                ahead_it, got, future = self._ahead
                self._ahead = None
                if ahead_it != it:  # cannot happen: look-ahead is always for the next one
                    raise LmdbioError(f"internal: batch {ahead_it} was decoded ahead, {it} "
                                      "asked for")
                if got is None:
                    raise LmdbioError(f"the reader stopped before epoch {self.epoch} "
                                      f"iteration {it}")
                try:
                    with self.session.stages.span("handoff"):
                        batches = future.result()
                except BaseException:
                    got.release()
                    raise
            self._received += 1
            self._set_decoded(it, batches, got)
        first, batches = self._decoded  # type: ignore[misc]
        item = batches[it - first]
        batches[it - first] = None  # the loader keeps no reference to a delivered batch
        if isinstance(item, Future):
            with self.session.stages.span("handoff"):
                item = item.result()
        elif isinstance(item, partial):
            item = item()
        if it == first + len(batches) - 1:
            self._forget_decoded()
        elif isinstance(batches[it + 1 - first], partial) and self._ahead_pays():
            # assemble the next batch while the trainer computes on this one
            batches[it + 1 - first] = self._decoding_thread().submit(batches[it + 1 - first])
        if isinstance(item, Exception):  # this batch's records failed under on_error raise
            raise item
        batch, nbytes = item
        self.metrics.batches += 1
        self.metrics.samples += len(batch)
        self.metrics.bytes += nbytes
        return batch

    def _ahead_pays(self) -> bool:
        """Whether to assemble the next batch on the decoding thread while the trainer
        works on this one. It pays when the trainer's step is at least as long as an
        assembly (the two then overlap); for a faster trainer, the hand-off between the two
        threads (queue, wake-ups, the GIL) costs more than it hides: measured on the 2-core
        VM, one process, CIFAR-like batches of 64 and no step, 6.3-7.5 us of CPU per sample
        with every batch assembled ahead against 4.8-5.3 us assembled in line."""
        return self.xp is np and self._step_s >= self._assemble_s > 0

    def _set_decoded(self, first: int, batches: list[Any], got: Any) -> None:
        """The batches of the slot ``got`` just received, from iteration ``first``. A slot
        whose batches are assembled as they are asked for (:meth:`_fused_batch`) is held
        until its last one is; any other is released now."""
        self._forget_decoded()  # nothing is left of the slot before (a no-op but for drains)
        self._decoded = (first, batches)
        if any(isinstance(b, partial) for b in batches):
            self._held = got
        else:
            got.release()

    def _forget_decoded(self) -> None:
        """Drop what is left of the slot being delivered: wait for a batch assembling on
        the decoding thread (it reads the slot), then release the slot if it was held."""
        decoded, self._decoded = self._decoded, None
        if decoded is not None:
            for item in decoded[1]:
                if isinstance(item, Future):
                    self._wait_quietly(item)
        held, self._held = self._held, None
        if held is not None:
            held.release()

    def _read_ahead(self, it: int, depth: int) -> None:
        """Colocated reader (or a naive strategy): publish the slots up to ``depth`` ahead
        of the one carrying ``it`` (just that one for a rank reading for itself)."""
        s = self.session
        limit = min(len(self._groups), self._slot_of(it) + (depth if s.shared else 1))
        while self._published < limit:
            s.read_group(*self._groups[self._published])
            self._published += 1

    def _receive(self, defer_verify: bool = False, defer_values: bool = False) -> Any:
        """The next slot from the session, timed (``wait_seconds``, ``blocked_seconds``).
        ``defer_values``: the overflow page headers of records delivered by reference are
        checked later (:meth:`_make_batches`: the whole slot, or each fused batch's own)."""
        t0 = time.perf_counter()
        # deferred with the checksum: the overflow page headers of records delivered by
        # reference, checked with it on the decoding thread (_make_batches)
        with self.session.stages.span("receive"):
            got = self.session.receive(timeout=self.opts.timeout, defer_verify=defer_verify,
                                       defer_value_check=defer_verify or defer_values)
        self.metrics.wait_seconds += time.perf_counter() - t0
        ring = self.session.ring
        if ring is not None:
            self.metrics.blocked_seconds = ring.stats.worker_wait_s
        return got

    def _drain(self) -> None:
        """Finish an epoch the trainer left early, so readers and workers stay in step.

        Workers of a dedicated reader take (and drop) the rest of the epoch's slots, which
        the reader publishes anyway; in colocated mode only the slots already read ahead
        are dropped (every rank computes the same count from its position).
        """
        opened = getattr(self, "_open", None)
        if opened is None:
            return
        _, start = opened
        s = self.session
        self._forget_decoded()
        taken = 0  # a slot received for decoding ahead is already out of the ring
        if self._ahead is not None:
            _, got, future = self._ahead
            self._ahead = None
            if got is not None:
                taken = 1
                self._drop_received(got, future)
        n_slots = len(self._groups)
        if s.shared and self.topo.mode == "dedicated":  # the dedicated reader reads it all
            published = n_slots
        elif s.shared:  # colocated: the read-ahead rule at the last batch taken
            last = max(self.position - 1, start)
            published = min(n_slots, self._slot_of(last) + self.opts.prefetch_depth)
        else:
            published = 0
        self._open = None
        for _ in range(max(published - self._received - taken, 0)):
            got = s.receive(timeout=self.opts.timeout)
            if got is not None:
                got.release()
        if self._epoch_chosen:  # set_epoch after leaving: that epoch, from its start
            self.position = self.start_iteration
        else:
            self._end_epoch()

    def _drop_next_epoch_slot(self) -> None:
        """Give back a next epoch's slot nobody asked for (the job ends after the epoch)."""
        if self._next_epoch_slot is not None:
            got, future = self._next_epoch_slot
            self._next_epoch_slot = None
            self._drop_received(got, future)

    def _drop_received(self, got: Any, future: Any) -> None:
        """Give a received slot back to the ring unused, once the decoding thread (if it
        was decoding it) is done with its memory."""
        try:
            self._wait_quietly(future)
        finally:
            got.release()

    def _end_epoch(self) -> None:
        self._job_base += self.session.epoch_stop  # its length, or the stop inside it
        self.epoch += 1
        self.position = 0

    def _make_batches(self, got: Any, first: int, plan: Any = None, epoch: int | None = None,
                      expected: int | None = None) -> list[Any]:
        """The batches of a received slot, iterations ``first ..``: ``(Batch, payload
        bytes)`` each, or the exception that batch raises when it is taken.

        The records of every batch of the slot are decoded in one call where the layout
        has one output row per record and all decode; otherwise (or when a record fails)
        batch by batch, which is exactly what one slot per batch gives (the ``on_error``
        policy, the substitute for a bad record, where a ``raise`` surfaces).
        """
        from loaders.decode import ROW_PER_RECORD_LAYOUTS

        t0 = time.perf_counter()
        clock = self.session.stages
        with clock.span("prepare"):
            got.verify()  # the slot checksum, where receiving deferred it (look-ahead)
            offsets = np.asarray(got.offsets, np.int64)
            payload = np.asarray(got.payload)
            lengths = got.lengths  # by reference: spans of the database mapping
            fused = self._parse_fused(got, payload, offsets, lengths)
            if fused is None:  # (fused batches check their own records, as they read them)
                got.check_values()  # the overflow page headers of records by reference
        count = got.batches
        if expected is None and self._open is not None:
            expected = self._expected_batches(first)
        if got.iteration != first or (expected is not None and count != expected):
            raise LmdbioError(f"internal: slot of epoch {got.epoch} iteration {got.iteration} "
                              f"({count} batches) where iteration {first} was expected")
        ko, kd = got.packed_keys()  # copies: the slot is released before the batch is used
        n = offsets.shape[0] - (1 if lengths is None else 0)
        bounds = self._batch_bounds(first, count, n, plan)
        out: list[Any] = []
        whole = None
        if fused is not None:  # each batch assembled when asked for, or just ahead of it
            self.metrics.decode_seconds += time.perf_counter() - t0
            return [partial(self._fused_batch, got, first + j, int(bounds[j]),
                            int(bounds[j + 1]), payload, offsets, ko, kd, fused, lengths,
                            epoch) for j in range(count)]
        with clock.span("assemble"):
            if count > 1 and self.cfg.dataset.layout in ROW_PER_RECORD_LAYOUTS:
                try:
                    whole = self.decode(payload, offsets,
                                        lambda i: bytes(kd[ko[i]:ko[i + 1]]), lengths)
                except LmdbioError:
                    whole = None  # a bad record: batch by batch, where it belongs
                if whole is not None and (isinstance(whole[0], list) or not whole[2].all()):
                    whole = None
            for j in range(count):
                a, b = int(bounds[j]), int(bounds[j + 1])
                try:
                    part = None if whole is None else (whole[0][a:b], whole[1][a:b])
                    out.append(self._finish_batch(got, first + j, a, b, payload, offsets, ko,
                                                  kd, part, lengths, epoch))
                except LmdbioError as exc:
                    out.append(exc)
        self.metrics.decode_seconds += time.perf_counter() - t0
        return out

    def _fused_batch(self, got: Any, iteration: int, a: int, b: int, payload: np.ndarray,
                     offsets: np.ndarray, ko: np.ndarray, kd: np.ndarray, fused: Any,
                     lengths: np.ndarray | None, epoch: int | None) -> Any:
        """Batch ``iteration`` (records ``a .. b - 1`` of the slot ``got``, parsed as
        :class:`~loaders.decode.DatumSpans`) as :meth:`_make_batches` gives it: ``(Batch,
        payload bytes)``, or the error its ``_take`` raises. Reads the slot: it is held
        until its last batch is assembled."""
        t0 = time.perf_counter()
        try:
            with self.session.stages.span("assemble"):
                # the overflow page headers still to check are checked by the kernel as it
                # reads each value; a batch it gives up on gets the exact check, which names
                # a bad header's page, before the general path reads its values
                fmt = got.header_format()
                part = self._assemble_datums(payload, fused.rows(a, b), iteration, epoch,
                                             fmt)
                if part is None and fmt is not None:
                    got.check_value_rows(a, b)
                self._assemble_s += _EWMA * (time.perf_counter() - t0 - self._assemble_s)
                # None: a record of another kind or shape, or a bad one: the general path
                return self._finish_batch(got, iteration, a, b, payload, offsets, ko, kd,
                                          part, lengths, epoch, transformed=part is not None)
        except LmdbioError as exc:
            return exc
        finally:
            self.metrics.decode_seconds += time.perf_counter() - t0

    def _fuses_datums(self) -> bool:
        """Whether this worker's batches may be assembled by the fused Datum kernels
        (Caffe Datums with a transform, on the CPU): see :meth:`_parse_fused`."""
        return (self.transform is not None and self.xp is np
                and self.cfg.dataset.layout == "caffe-datum")

    def _parse_fused(self, got: Any, payload: np.ndarray, offsets: np.ndarray,
                     lengths: np.ndarray | None) -> Any:
        """The slot's records as :class:`~loaders.decode.DatumSpans` where they may go
        from their bytes to the transformed float32 batch in one compiled pass (Caffe
        Datums whose first is raw uint8, a CPU worker); ``None`` otherwise."""
        if not self._fuses_datums():
            return None
        from loaders.decode import datum_spans

        if lengths is not None:
            got.check_value_rows(0, 1)  # the first record's header, before it is parsed
        return datum_spans(payload, offsets, lengths)

    def _assemble_datums(self, payload: np.ndarray, spans: Any, iteration: int,
                         epoch: int | None, header_fmt: np.ndarray | None = None
                         ) -> tuple[np.ndarray, np.ndarray] | None:
        """One batch of :meth:`_parse_fused`'s records, transformed, in pooled memory;
        ``None`` when one of them is not a raw uint8 Datum of the slot's shape, or (with
        ``header_fmt``, spans of the mapping) its overflow page header is wrong."""
        t = self.transform
        assert t is not None  # only called where _fuses_datums: there is a transform
        if t.is_identity:  # widened only (streaming stores for large batches)
            from loaders.decode import uniform_datums_float32

            return uniform_datums_float32(payload, spans, self.buffers.take,
                                          header_fmt=header_fmt)
        rng = self._transform_rng(iteration, self.epoch if epoch is None else epoch)
        return t.datums(payload, spans, rng, alloc=self.buffers.take, header_fmt=header_fmt)

    def _transform_rng(self, iteration: int, epoch: int) -> np.random.Generator | None:
        """The random generator of one batch's transform decisions (None: it draws
        nothing)."""
        t = self.transform
        assert t is not None  # called only when the job has a transform
        if not (t.mirror or (t.crop_size and t.phase == "train")):
            return None
        from loaders.transform import transform_rng

        return transform_rng(self.opts.seed, epoch, iteration, self.topo.rank)

    def _expected_batches(self, first: int) -> int:
        return self._groups[self._slot_of(first)][1]

    def _batch_bounds(self, first: int, count: int, n: int, plan: Any = None) -> np.ndarray:
        """Record bounds of the slot's ``count`` batches within this worker's part."""
        if count == 1:
            return np.array([0, n], np.int64)
        plan = self.session.plan if plan is None else plan
        c = self.topo.worker_rank
        bounds = np.zeros(count + 1, np.int64)
        np.cumsum(plan.sizes[first:first + count, c], out=bounds[1:])
        if int(bounds[-1]) != n:
            raise LmdbioError(f"internal: a slot of {count} batches from iteration {first} "
                              f"holds {n} records for worker {c}, the plan {int(bounds[-1])}")
        return bounds

    def _finish_batch(self, got: Any, iteration: int, a: int, b: int, payload: np.ndarray,
                      offsets: np.ndarray, ko_all: np.ndarray, kd_all: np.ndarray,
                      decoded: tuple[Any, Any] | None,
                      lengths: np.ndarray | None = None,
                      epoch: int | None = None, *, transformed: bool = False
                      ) -> tuple[Batch, int]:
        """Batch ``iteration`` (of ``epoch``, by default the current one) from records
        ``a .. b - 1`` of the slot: decoded here unless ``decoded`` holds its rows already;
        then the ``on_error`` policy and the transform. With ``lengths``, ``offsets`` are
        record starts in ``payload`` (the database mapping).
        """
        epoch = self.epoch if epoch is None else epoch
        ko = ko_all[a:b + 1] - ko_all[a]
        kd = kd_all[ko_all[a]:ko_all[b]]
        if lengths is None:
            lo, hi = int(offsets[a]), int(offsets[b])
            nbytes = hi - lo
        else:
            nbytes = got.value_bytes(a, b)

        def key(i: int) -> bytes:
            return bytes(kd[ko[i]:ko[i + 1]])

        ids, padding = got.ids[a:b].copy(), got.padding[a:b].copy()
        if decoded is not None:
            data, labels = decoded
        else:
            if lengths is not None:  # spans of the database mapping
                data, labels, valid, errors = self.decode(payload, offsets[a:b], key,
                                                          lengths[a:b])
            else:
                offs = offsets[a:b + 1] - lo if (a, b) != (0, offsets.shape[0] - 1) \
                    else offsets
                data, labels, valid, errors = self.decode(payload[lo:hi], offs, key)
            if not valid.all():
                keep = self._apply_policy(data, labels, valid, errors, key)
                if keep is not None:
                    data, labels, ids, padding = (data[keep], labels[keep], ids[keep],
                                                  padding[keep])
                    lens = np.diff(ko)[keep]
                    starts = ko[:-1][keep]
                    kd = np.concatenate([kd[s:s + n] for s, n in
                                         zip(starts.tolist(), lens.tolist(), strict=True)]
                                        or [np.empty(0, np.uint8)])
                    ko = np.zeros(keep.size + 1, np.int64)
                    np.cumsum(lens, out=ko[1:])
        if self.transform is not None and not isinstance(data, list) and not transformed:
            if self.xp is not np and isinstance(data, np.ndarray):
                data, labels = self._transform_on_device(data, labels, iteration, epoch)
            else:
                data = self._transform(data, iteration, epoch)
        if self.xp is not np:
            data, labels = self._to_device(data, labels)
        return Batch(data, labels, ids, padding, epoch, iteration, ko, kd), nbytes

    def _transform(self, data: np.ndarray, iteration: int, epoch: int) -> np.ndarray:
        """Caffe's transform of a decoded batch (float32 out).

        The identity (no crop, mirror, mean or scale: the output is the pixels as float32)
        is one numpy conversion; the random generator is only seeded when the transform
        draws something (random crops or mirrors).
        """
        t = self.transform
        assert t is not None  # called only when the job has a transform
        if not data.shape[0] or t.is_identity:  # decoders return fresh arrays: no copy
            return data.astype(np.float32, copy=False)
        rng = self._transform_rng(iteration, epoch)
        out = None
        if self.xp is np and isinstance(data, np.ndarray) and data.ndim == 4:
            out = self.buffers.take((data.shape[0], *t.check(data.shape)), np.float32)
        return t(data, rng=rng, out=out)

    def _transform_on_device(self, data: np.ndarray, labels: Any, iteration: int,
                             epoch: int) -> tuple[Any, Any]:
        """Caffe's transform of a decoded batch on the worker's device: the pixels cross
        as they are (uint8 for Datums: a quarter of float32's bytes; with the labels, from
        the pinned ring of :attr:`feed`), and crop, mirror, mean and scale run there
        (:func:`loaders.transform.transform_batch`, the same float32 operations in the same
        order as the CPU kernel, so the same values). The decisions are drawn on the host
        from the same generator as on a CPU worker. Returns (data, labels) on the device."""
        copied = self.feed.submit(*[x for x in (data, labels) if isinstance(x, np.ndarray)])
        device, *rest = copied.arrays()
        labels = rest[0] if rest else labels
        if not data.shape[0]:
            out = device.astype(self.xp.float32)
        else:
            assert self.transform is not None  # called only when the job has a transform
            out = self.transform(device, self._transform_rng(iteration, epoch), xp=self.xp)
        copied.release()  # the raw pixels' reader (the transform) is queued
        return out, labels

    def _to_device(self, data: Any, labels: Any) -> tuple[Any, Any]:
        """``data`` and ``labels`` on the worker's device: the host (numpy) ones through
        the pinned ring of :attr:`feed` in one asynchronous copy; others as they are."""
        if isinstance(labels, (list, tuple)):
            labels = np.asarray(labels)
        host = [i for i, x in enumerate((data, labels)) if isinstance(x, np.ndarray)]
        if not host:
            return data, labels
        pair = [data, labels]
        got = self.feed.submit(*[pair[i] for i in host]).arrays()
        for i, dev in zip(host, got, strict=True):
            pair[i] = dev
        return pair[0], pair[1]

    def _apply_policy(self, data, labels, valid, errors, key) -> np.ndarray | None:
        """Apply ``on_error`` to the records that failed: ``skip`` returns the indices to
        keep; ``substitute`` overwrites them in place and returns None."""
        policy = self.cfg.on_error
        for err in errors:
            log.warning("rank %d: %s (%s)", self.topo.rank, err, policy)
        bad = np.flatnonzero(~valid)
        if policy == "skip":
            self.metrics.skipped += bad.size
            return np.flatnonzero(valid)
        # substitute: the previous good record of this worker takes the bad one's place
        good = np.flatnonzero(valid)
        for i in bad.tolist():
            prev = good[good < i]
            if prev.size:
                src_data, src_label = data[prev[-1]], labels[prev[-1]]
            elif self._last_good is not None:
                src_data, src_label = self._last_good
            else:
                raise LmdbioError(f"on_error substitute: record {key(i)!r} failed and no good "
                                  "record came before it to stand in") from None
            data[i], labels[i] = src_data, src_label
            self.metrics.substituted += 1
        if good.size:
            self._last_good = (data[good[-1]].copy(), labels[good[-1]])
        return None

    def _report(self, iteration: int) -> None:
        every = self.cfg.metrics.every
        if every and self.topo.worker_rank == 0 and (iteration + 1) % every == 0:
            m = self.metrics.as_dict()
            print(f"[lmdbio] epoch {self.epoch} iteration {iteration + 1}: "
                  f"{m['samples_per_second']:.0f} samples/s, "
                  f"{m['megabytes_per_second']:.1f} MB/s, "
                  f"stall {100 * m['stall_fraction']:.1f}%", flush=True)

    # ----------------------------------------------------------------- lifecycle
    def summary(self) -> dict[str, Any]:
        """This rank's metrics and role, JSON-able; ``stages``: CPU and wall seconds per
        stage of the data path, where :attr:`stages` was enabled (see :mod:`lmdbio.stages`)."""
        return {"rank": self.topo.rank, "node": self.topo.node_index,
                "worker": self.is_worker, "reader": self.session.reads,
                **self.metrics.as_dict(), "stages": self.stages.as_dict()}

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
            self._forget_decoded()
            self._drop_next_epoch_slot()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self.feed is not None:
                self.feed.close()
            self.session.stop()
            self.session.close()
        finally:
            self.topo.close()

    def abort(self, reason: str) -> None:
        """Local, never collective: give up after an error on this rank.

        The node's ring is aborted (its other ranks raise :class:`~lmdbio.shm.
        RingAbortedError` at their next wait instead of waiting out a timeout), the decoding
        thread is abandoned, nothing waits for a peer. What :meth:`close` does collectively
        (drain, stop, free the window and communicators) cannot complete once a rank fails
        mid-epoch: a dedicated reader blocked on a full ring would never send the STOP a
        worker's ``close`` waits for. The process is expected to end (``lmdbio run``
        aborts the MPI job); shared memory returns to the OS when it does.
        """
        if self._closed:
            return
        self._closed = True
        self._open = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
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


def open(config: Any, overrides: list[str] | tuple[str, ...] = (), comm: Any = None, *,
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


def write_json(path: str | Path, obj: Any) -> None:
    Path(path).write_text(json.dumps(obj, indent=2, default=str) + "\n")
