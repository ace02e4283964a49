"""How a node's batch ring is agreed, sized and made, once, while a read session starts.

A node-level strategy's reader publishes each slot of a node's batches into a shared-memory
ring (:class:`~lmdbio.shm.BatchRing`) that the node's workers read. Before the first slot the
node must agree on what the ring carries and how large it is, and that is this module:

- :func:`check_batch_fits`: a batch larger than the data set is refused (``batch.last:
  drop``) or warned about, on every rank alike;
- :meth:`RingSetup.share_codec`: the node's reader fits the ring codec a batch codec's
  registry entry names (:class:`~lmdbio.codecs.registry.RingTransport`), its workers get it;
- :meth:`RingSetup.create_ring`: batches per slot (:func:`choose_batches_per_slot`, from
  the largest values of the file, :func:`largest_values`, or from its bytes per record when
  slots carry spans), agreed by every reader so that every node's epoch plan lays out the
  same slot groups, then the ring, its slots as large as the worst batch group needs.

It is cut from :class:`lmdbio.reader.ReadSession`, which calls it from its constructor and
then only fills and reads slots: the sizing rules and their collectives read in one place.
Every rank runs the same calls in the same order (the collectives over the readers and the
node depend on the topology and the run plan only), and a failure on one rank is agreed on
(:func:`~lmdbio.mpiutil.agree`) so that no rank waits for another forever.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.config import setting_error
from lmdbio.errors import LmdbioError
from lmdbio.io.prefetch import advise_page_ranges
from lmdbio.kernel_args import read_only
from lmdbio.mpiutil import agree, sleeping_barrier
from lmdbio.plan.epoch import scheme_iterations
from lmdbio.shm import BatchRing
from lmdbio.shm.layout import CHECKSUM_XXH64, checksum_kind

if TYPE_CHECKING:
    from lmdbio.codecs.registry import RingCodec, RingTransport
    from lmdbio.lmdb import Database
    from lmdbio.run_plan import RunPlan
    from lmdbio.topology import Topology

__all__ = ["MAX_KEY_BYTES", "SLOT_BATCHES_SHIFT", "RingSetup", "batch_capacity",
           "check_batch_fits", "choose_batches_per_slot", "file_bytes_per_record",
           "largest_values"]

log = logging.getLogger(__name__)

#: LMDB's default maximum key size: a slot that copies keys has room for it per record
MAX_KEY_BYTES = 511

#: a slot's flags carry how many batches it holds from this bit on (the ring's caller bits)
SLOT_BATCHES_SHIFT = 16

#: what ``batches_per_slot: 0`` aims at: records per worker and slot, payload bytes per
#: slot, and at most this many batches per slot
SLOT_TARGET_RECORDS = 1024
SLOT_TARGET_BYTES = 4 << 20
#: slots of record spans: at most this much decoded output per worker and slot (float32
#: estimated as 4 bytes per record byte), the whole slot being decoded ahead at once
SLOT_TARGET_DECODED_BYTES = 48 << 20
SLOT_MAX_BATCHES = 16
#: slots of record spans carry 8 bytes per record, not the records: the per-slot work
#: (~1 ms of a reader's CPU and ~0.3 ms of each worker's on the project's machine, mostly
#: Python and numpy calls whatever the slot's size) is amortized over more records. 4,096
#: records per worker against 2,048: CIFAR-like whole runs 1.23-1.36x faster warm and
#: 1.30-1.40x cold (docs/reading.md, seventh session)
SLOT_TARGET_SPAN_RECORDS = 4096
SLOT_MAX_SPAN_BATCHES = 64
#: slots of record spans for workers that assemble each batch as it is asked for (Caffe
#: Datums on CPU workers: the fused kernels read a batch's records straight from the
#: file), which never decode a slot whole: the decoded-output rule does not apply and the
#: per-slot work is amortized over 16,384 records per worker. Measured in one process
#: (two loaders, epochs alternating): CIFAR-like 128 batches of 64 per slot against the
#: 47 the rule above gives, 0.885x the CPU per sample (256: 0.97x of 128); ImageNet-like
#: 16 batches of 32 against 2, 0.78x (64: 0.94x of 16). A slot's records are what its
#: reader asks the kernel for ahead on a cold file (the next slot's pages), so they stay
#: within 64 MiB of the file per worker: 13 ImageNet-sized batches of 32
SLOT_TARGET_BATCHWISE_SPAN_RECORDS = 16384
SLOT_MAX_BATCHWISE_SPAN_BYTES = 64 << 20
SLOT_MAX_BATCHWISE_SPAN_BATCHES = 1024


def file_bytes_per_record(db: Database) -> int:
    """The database file's bytes per record (every page counted): what a slot of record
    spans is sized by, since no leaf is read to size it."""
    return db.psize * (db.meta.last_pg + 1) // max(len(db), 1)


def choose_batches_per_slot(per_worker: int, batch_bytes: int, *, spans: bool = False,
                            consumers: int = 1, batchwise: bool = False) -> int:
    """Batches per ring slot for ``batches_per_slot: 0``: enough to amortize the per-slot
    work (hand-off, validation, one decode call: ~0.5 ms of CPU on the project's machine),
    which counts where batches are small - the fewest batches that reach
    :data:`SLOT_TARGET_RECORDS` records per worker (``per_worker`` per batch) or
    :data:`SLOT_TARGET_BYTES` of payload (``batch_bytes`` per node batch), at most
    :data:`SLOT_MAX_BATCHES`. Batches of large records stay one per slot: grouping them
    only makes each slot's copy and decode larger than the caches (measured in
    docs/service.md).

    Slots of record ``spans`` copy nothing: they aim at :data:`SLOT_TARGET_SPAN_RECORDS`
    records per worker (at most :data:`SLOT_MAX_SPAN_BATCHES` batches), and the payload rule
    gives way to the workers' decoded output, at most :data:`SLOT_TARGET_DECODED_BYTES` per
    worker (``consumers`` workers share the node batch), so 32 ImageNet-sized records per
    worker travel two batches per slot: 8 ranks, 45-49 CPU µs per sample against 63-65 with
    one (the readers' per-slot Python halved), and less of the workers' time in the loader
    (docs/service.md). Workers that assemble each batch from the spans as it is asked for
    (``batchwise``) never decode a slot whole: their slots aim at
    :data:`SLOT_TARGET_BATCHWISE_SPAN_RECORDS` records per worker, at most
    :data:`SLOT_MAX_BATCHWISE_SPAN_BYTES` of the file per worker and
    :data:`SLOT_MAX_BATCHWISE_SPAN_BATCHES` batches."""
    if spans and batchwise:
        by_records = -(-SLOT_TARGET_BATCHWISE_SPAN_RECORDS // max(per_worker, 1))
        per_worker_bytes = max(batch_bytes, 1) // max(consumers, 1)
        by_bytes = max(1, SLOT_MAX_BATCHWISE_SPAN_BYTES // max(per_worker_bytes, 1))
        return max(1, min(by_records, by_bytes, SLOT_MAX_BATCHWISE_SPAN_BATCHES))
    if spans:
        by_records = -(-SLOT_TARGET_SPAN_RECORDS // max(per_worker, 1))
        decoded = 4 * max(batch_bytes, 1) // max(consumers, 1)
        by_bytes = max(1, SLOT_TARGET_DECODED_BYTES // max(decoded, 1))
        return max(1, min(by_records, by_bytes, SLOT_MAX_SPAN_BATCHES))
    by_records = -(-SLOT_TARGET_RECORDS // max(per_worker, 1))
    by_bytes = -(-SLOT_TARGET_BYTES // max(batch_bytes, 1))
    return max(1, min(by_records, by_bytes, SLOT_MAX_BATCHES))


def largest_values(db: Database, comm: Any, rank: int, size: int, k: int) -> np.ndarray:
    """The ``k`` largest value sizes of the database, ascending (fewer when it holds fewer
    records), or an upper bound of them. Collective over ``comm``: each rank reads its share
    of the leaves. A tree without overflow pages has only inline values, smaller than
    :meth:`Database.inline_value_limit`: that bound stands for every value and no leaf is
    read (on such a file the leaves are the whole file, which this would otherwise read at
    every start, hidden from the page accounting, which starts after the setup)."""
    limit = db.inline_value_limit()
    if comm is not None:  # the same path on every rank (node copies could differ)
        limits = comm.allgather(limit)
        limit = None if None in limits else max(limits)
    if limit is not None:
        return np.full(min(k, len(db)), limit, np.int64)
    leaves, err = None, None
    if rank == 0:
        try:
            leaves = db.leaves()
        except Exception as exc:  # agreed on below
            err = str(exc)
    if comm is not None:
        agree(comm, err is None, err or "", "listing leaf pages")
        leaves = comm.bcast(leaves, root=0)
    lo, hi = leaves.shape[0] * rank // size, leaves.shape[0] * (rank + 1) // size
    if hi > lo:
        # the share's leaves asked for at once (a cold file: one batch of reads, not a
        # fault and a read per leaf); advisory, nothing is read or counted by asking
        with contextlib.suppress(LmdbioError):  # a refused advice (not a file mapping)
            advise_page_ranges(db.buf, leaves[lo:hi], np.ones(hi - lo, np.int64), db.psize)
    sizes = db.build_table(db.db, leaves[lo:hi]).val_len if hi > lo else np.empty(0, np.int64)
    top = np.sort(sizes)[-k:]
    if comm is not None:
        top = np.concatenate(comm.allgather(top))
    return np.sort(top)[-k:]


def batch_capacity(top: np.ndarray, batch: int) -> int:
    """Bytes a slot needs so that any ``batch`` records fit, from :func:`largest_values`
    (at least ``batch`` of them, or all): the sum of the ``batch`` largest values; records
    repeat when ``batch`` exceeds the database (padding), the largest standing in for each
    repeat."""
    if not top.size:
        return 0
    top = top[-batch:]
    return int(top.sum()) + (batch - top.size) * int(top[-1])


def check_batch_fits(db: Database, run_plan: RunPlan, consumers: int, scheme: str,
                     rank: int) -> None:
    """A global batch (``run_plan.batch_size`` per each of ``consumers`` consuming ranks)
    larger than the data set: under ``drop`` (no iteration in an epoch of ``scheme``) no
    batch would ever be delivered (a :class:`~lmdbio.errors.ConfigError` at the key's line,
    on every rank alike); under ``pad`` and ``partial`` every epoch is one padded or short
    batch (a warning, from world rank 0 only)."""
    n, per = len(db), run_plan.batch_size
    total = per * consumers
    if n >= total:
        return
    split = f" ({per} per consuming rank x {consumers} ranks)" if consumers > 1 else ""
    what = (f"the batch (batch.size) of {total} records{split} is larger than the data "
            f"set: {db.path} holds {n} records")
    if scheme_iterations(n, consumers, per, run_plan.last, scheme) == 0:
        raise setting_error(run_plan.origin, "batch.size", f"{what}; with batch.last: "
                            "drop every record would be dropped and no batch delivered: "
                            f"make batch.size at most {n} or use batch.last: pad or partial")
    if rank == 0:
        if run_plan.last == "pad":
            log.warning("%s: every epoch is one batch of %d records padded with %d "
                        "repeated ones (batch.last: pad)", what, total, total - n)
        else:
            log.warning("%s: every epoch is one batch of %d records (batch.last: %s)",
                        what, n, run_plan.last)


def _host_oversubscribed(topo: Topology) -> bool:
    """Whether this host runs more ranks than it has cores for this process. Then ring
    waits must not spin (a spinning rank takes the core from the peer it waits for): they
    sleep from the first poll."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return topo.host_size > cores


class RingSetup:
    """The making of one rank's node ring for a node-level strategy: ``db`` is the rank's
    database (set up by its strategy where the rank reads), ``node_consumers`` the node's
    number of workers. Construct on every rank of the node and call the same methods in
    the same order on each: they are collective over the node (and the readers)."""

    def __init__(self, topo: Topology, run_plan: RunPlan, db: Database, *,
                 node_consumers: int) -> None:
        self.topo, self.run_plan, self.db = topo, run_plan, db
        self.node_consumers = node_consumers

    def share_codec(self, transport: RingTransport) -> RingCodec:
        """The ring codec of ``transport``: the node's reader fits it on its database, the
        node's workers get it (collective over the node; a reader's failure to fit is
        raised on every rank of the node)."""
        topo = self.topo
        blob, err = None, None
        if topo.is_reader:
            try:
                blob = transport.fit(self.db, dict(self.run_plan.codec_options)).to_bytes()
            except Exception as exc:  # agreed on below so no rank waits forever
                err = f"{type(exc).__name__}: {exc}"
        what = f"the {transport.title} transport model"
        self.wait_for_reader(f"the reader to fit {what}")
        agree(topo.node, err is None, err or "", f"fitting {what}")
        blob = topo.node.bcast(blob, root=0)
        return transport.from_bytes(blob)

    def create_ring(self, *, ring_codec: RingCodec | None, by_reference: bool) -> BatchRing:
        """The node's ring (collective over the node; over the readers where they size it
        together). Its reader sizes the slots: ``by_reference`` slots hold the record and
        key spans (8 bytes each); others hold the worst group of batches of the file's
        largest values, encoded per worker with ``ring_codec`` when one is given. Batches
        per slot as the run plan says, or chosen and agreed by the readers
        (``batches_per_slot: 0``); the ring's ``reader_info`` carries them to the workers.
        A worker first loads its compiled checksum (:meth:`warm_up_worker`)."""
        topo, run = self.topo, self.run_plan
        if not topo.is_reader:
            self.warm_up_worker()
        node_batch = run.batch_size * self.node_consumers
        cap = None
        per_slot = max(int(run.batches_per_slot), 0)
        if topo.is_reader and by_reference:
            # spans: a slot holds 8 bytes per record, and no leaf is read to size it; the
            # decoded-output rule goes by the file's bytes per record
            if per_slot == 0:
                per_record = file_bytes_per_record(self.db)
                per_slot = self.agreed_slot_size(choose_batches_per_slot(
                    run.batch_size, per_record * node_batch, spans=True,
                    consumers=self.node_consumers, batchwise=run.batchwise_assembly))
            node_batch *= per_slot
            cap = 8 * node_batch
        elif topo.is_reader:
            # one pass over the leaves gives the capacity of any slot size; nodes of
            # unequal size need different counts: every reader collects the largest
            most = node_batch * (per_slot or SLOT_MAX_BATCHES)
            if topo.readers is not None:
                from mpi4py import MPI

                most = int(topo.readers.allreduce(most, op=MPI.MAX))
            top = largest_values(self.db, topo.readers, topo.reader_rank, topo.n_readers,
                                 most)
            cap = batch_capacity(top, node_batch)
            if per_slot == 0:
                per_slot = self.agreed_slot_size(
                    1 if ring_codec is not None else
                    choose_batches_per_slot(run.batch_size, cap))
            if per_slot > 1:
                cap = batch_capacity(top, node_batch * per_slot)
            node_batch *= per_slot
            if ring_codec is not None:  # one encoded part per worker, at its worst
                cap = ring_codec.slot_bytes(node_batch, self.node_consumers, cap)
        # a reader's slot key bytes: the keys' spans (8 bytes each) when records travel by
        # reference, else room for LMDB's longest key for every record
        keys = (8 if by_reference else MAX_KEY_BYTES) * node_batch
        self.wait_for_reader("the reader to size the batch ring")
        return BatchRing.create(
            topo.node, 0, slots=run.prefetch_depth,
            payload_bytes=max(cap, 1) if cap is not None else None,
            max_records=node_batch if topo.is_reader else None,
            key_bytes=keys if topo.is_reader else None,
            colocated=topo.mode == "colocated", timeout=run.timeout,
            checksum=run.checksum,
            spin=0.0 if _host_oversubscribed(topo) else 2e-4,
            reader_info=per_slot if topo.is_reader else None)

    def agreed_slot_size(self, per_slot: int) -> int:
        """Collective over the readers: the smallest of their automatic slot sizes. Every
        node's epoch plan lays slot groups out with one size, and nodes of unequal size
        (or sizing from their own leaves) could choose different ones."""
        readers = self.topo.readers
        if readers is None:
            return per_slot
        from mpi4py import MPI

        return int(readers.allreduce(per_slot, op=MPI.MIN))

    def wait_for_reader(self, what: str) -> None:
        """Collective over the node: its workers wait here, sleeping
        (:func:`~lmdbio.mpiutil.sleeping_barrier`), until the reader has done its part of
        the setup (mapping, strategy, ring sizing), not in the next node collective."""
        sleeping_barrier(self.topo.node, self.run_plan.timeout,
                         f"node {self.topo.node_index}: waiting for {what}")

    def warm_up_worker(self) -> None:
        """Load the compiled checksum a worker verifies slots with, while the readers set
        up (the workers would otherwise wait for them in the next collective): numba's
        first call in a process costs ~0.5 s of CPU, which then no batch pays."""
        if checksum_kind(self.run_plan.checksum) == CHECKSUM_XXH64:
            from lmdbio.shm.kernels import part_hash_at

            empty = read_only(np.zeros(0, np.uint8))  # as part_checksum passes its arrays
            part_hash_at(empty, empty, empty, empty, empty, 0, 0, 0, 0, 0, 0)
