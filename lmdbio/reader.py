"""The reading side of a job: a strategy run on a reader rank, feeding the node's ring.

:class:`ReadSession` opens the database for a rank (on a symmetric mapping among the
readers when the strategy hands cursors around), runs the strategy's setup, has the node's
ring sized from the real record sizes and made (:class:`~lmdbio.ring_setup.RingSetup`), and
then, slot by slot, locates the node's records
(:class:`~lmdbio.slot_locator.SlotLocator`), gathers them straight into a shared-memory
slot (no intermediate copy), or encodes each worker's part with the ring codec the batch
codec registry names (:class:`~lmdbio.codecs.registry.RingCodec`), and publishes it.
Strategies in which every rank reads for itself (the naive ones) gather into a private
buffer instead, and a reader that is its ring's only worker hands its slots of record
spans to itself in process (:attr:`ReadSession.hands_to_itself`). Everything it does is
accounted per iteration. The node's workers receive the slots
(:meth:`ReadSession.receive`) through a :class:`~lmdbio.slot_receiver.SlotReceiver`, which
checks each before it is read.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmdbio.codecs.registry import BATCH_CODECS, RingCodec
from lmdbio.errors import ConfigError, LmdbioError
from lmdbio.io.gather import gather_batch, gather_keys, gather_refs
from lmdbio.io.prefetch import MADV_RANDOM, populate_if_resident
from lmdbio.io.symmap import map_symmetric
from lmdbio.kernel_cache import kernel_module
from lmdbio.lmdb import Database, RecordRefs
from lmdbio.lmdb.snapshot import resolve_file
from lmdbio.plan.ahead import PlansAhead, epochs_ahead, freeze
from lmdbio.plan.epoch import EpochPlan, plan_epoch, scheme_iterations
from lmdbio.plan.strategies import (
    IterationStats,
    ReaderContext,
    ReadStrategy,
    Timer,
    node_level,
    strategy_class,
)
from lmdbio.ring_setup import SLOT_BATCHES_SHIFT, RingSetup, check_batch_fits
from lmdbio.run_plan import RunPlan
from lmdbio.shm import BatchRing
from lmdbio.slot_locator import SlotLocator
from lmdbio.slot_receiver import Delivered, SlotReceiver, outside_mapping
from lmdbio.stages import StageClock
from lmdbio.topology import Topology

log = logging.getLogger(__name__)


@dataclass
class ReaderTotals:
    """Accumulated accounting of one rank: bitmaps of pages touched and pages holding the
    rank's own records (one byte per file page), and the per-iteration statistics."""

    touched: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint8))
    own: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint8))
    #: all zero between iterations: the pages of one iteration's records while counting
    scratch: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint8))
    iterations: list[dict] = field(default_factory=list)
    #: pages read outside every iteration: the session's setup (a leaf directory) and each
    #: epoch's start (dm-spec's tree and leaf directory), one byte per file page
    setup: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint8))
    setup_seconds: float = 0.0
    symmetric_attempts: int = 0
    symmetric: bool = False
    #: whether the whole mapping was put in this rank's page tables at the start (a small
    #: file found in the page cache: :func:`~lmdbio.io.prefetch.populate_if_resident`)
    populated: bool = False

    def add_setup(self, touched: np.ndarray) -> None:
        """Add the pages of ``touched`` (an accounting bitmap) to :attr:`setup` (sized
        from it the first time, as :meth:`ReadSession._account` sizes the others)."""
        if self.setup.shape != touched.shape:
            self.setup = np.zeros_like(touched)
        np.bitwise_or(self.setup, touched, out=self.setup)


def _open_database(path: str, topo: Topology, shared_cursors: bool, run_plan: RunPlan
                   ) -> tuple[Database, Any, ReaderTotals]:
    """Open the database for this rank, its snapshot not pinned yet (the session pins it
    where :func:`_pins_snapshot` says); readers that hand cursors map it symmetrically."""
    totals = ReaderTotals()
    mapping = None
    if shared_cursors and topo.is_reader and run_plan.symmetric:
        mapping = map_symmetric(topo.readers, resolve_file(path))
        totals.symmetric_attempts = mapping.attempts
        totals.symmetric = bool(mapping.symmetric)
        db = Database(path, subdb=run_plan.subdb, buffer=mapping.array, pin_snapshot=False,
                      address=mapping.address if mapping.symmetric else None)
    else:
        db = Database(path, subdb=run_plan.subdb, pin_snapshot=False)
    _refuse_names_only(db)
    return db, mapping, totals


def _refuse_names_only(db: Database) -> None:
    """Raise when the main database (no named one chosen) holds nothing but named
    databases: its records are LMDB's 48-byte descriptors of those, not data (py-lmdb
    would hand them out as values). Checked where the main tree is one leaf, as any file
    of a few named databases has it (one page, read before the accounting starts); a
    main database mixing records and names is read as py-lmdb reads it."""
    if db.subdb_name is not None or db.db.depth != 1 or not db.db.entries:
        return
    names = db.subdatabases()
    if len(names) == db.db.entries:
        raise ConfigError(f"{db.path}: the main database holds only named databases "
                          f"({', '.join(repr(n) for n in names)}), not records: choose one "
                          "(a job's dataset.subdb, `lmdbio bench read --subdb NAME`)")


def _snapshot_key(db: Database) -> tuple[int, int, int, int]:
    """What every reading rank must agree on: format version, txnid, root page and record
    count of the snapshot it opened."""
    s = db.snapshot
    return (s.format_version, s.txnid, s.root, len(db))


def _check_one_snapshot(db: Database, seen: Sequence[tuple[Any, ...]]) -> None:
    """Raise, on every rank alike, unless the reading ranks (``seen``: every rank's setup
    exchange, its snapshot last, ``None`` for a rank that does not read) opened one
    snapshot. Epoch plans, cursors and leaf directories pass between ranks on that
    assumption; ranks that opened the file on either side of a writer's commit would
    deliver some records twice and others never."""
    snaps = {s[-1] for s in seen if s[-1] is not None}
    if len(snaps) <= 1:
        return
    named = "; ".join(f"rank {r}: txnid {s[-1][1]}, root page {s[-1][2]}, {s[-1][3]} records"
                      for r, s in enumerate(seen) if s[-1] is not None)
    raise LmdbioError(f"{db.path}: the reading ranks opened different snapshots of the "
                      f"database ({named}): a writer committed while the job started; run "
                      "it again once the database is not being written to")


def pinning_local_rank(topo: Topology, shared: bool) -> int:
    """The node rank that pins the snapshot (:func:`_pins_snapshot`). Node-level strategies
    (``shared``): the node's last rank, a worker wherever the node has one. It waits while
    its reader sets up, so starting the pin's child process there (``posix_spawn`` returns
    after the child's exec, which under load waits for a core) keeps it off the chain of
    setup collectives that every reader waits in: up to ~2.6 ms of an 8-rank setup on
    2 cores (docs/reading.md, fifteenth session). Other strategies: the node's first rank."""
    return topo.local_size - 1 if shared else 0


def _pin_key(topo: Topology, path: str, pinner: int) -> tuple[Any, ...] | None:
    """What tells apart the files the nodes' pinning ranks (``pinner``: their node rank)
    pin on one host (nodes that share a host only; ``None`` elsewhere): ``(host, device, inode)``
    of the data file."""
    if not (topo.shares_host and topo.local_rank == pinner):
        return None
    try:
        st = resolve_file(path).stat()
        return (topo.hostname, st.st_dev, st.st_ino)
    except Exception:  # any rank raising here would leave the others in the exchange
        return (topo.hostname, repr(path))  # opening the database will say what is wrong


def _pins_snapshot(topo: Topology, key: tuple[Any, ...] | None,
                   keys: Sequence[tuple[Any, ...] | None], pinner: int) -> bool:
    """Whether this rank pins the snapshot (:class:`~lmdbio.lmdb.pin.SnapshotPin`): one
    rank per node (node rank ``pinner``, :func:`pinning_local_rank`), as on a cluster,
    where a node is a host: a pin registers a reader in the lock file, which every process
    of the host shares, so one pin keeps the pages of the whole node's reads from being
    recycled (a pin per rank only added a child process per rank, ~13 ms of CPU each, all
    at once, on the setup's critical path).
    Simulated nodes and reader groups share a host: the first node's pin covers the other
    nodes reading the same file, and nodes reading their own copies pin each. ``key`` is
    this rank's :func:`_pin_key`, ``keys`` every rank's, in world rank order."""
    if not topo.shares_host:
        return topo.local_rank == pinner
    return key is not None and keys.index(key) == topo.rank


def node_consumers(ranks: Sequence[tuple[int, int, Any]], node: int
                   ) -> tuple[int, int, tuple[int, ...]]:
    """From every rank's ``(node index, consumer rank or -1, ...)``: the first consumer
    rank of node ``node``, its number of consumers, and every node's number of consumers
    in consumer order (nodes without consumers left out): the plan lays slot groups out by
    node."""
    firsts: dict[int, int] = {}
    counts: dict[int, int] = {}
    for index, consumer, *_ in ranks:
        if consumer >= 0:
            firsts[index] = min(firsts.get(index, consumer), consumer)
            counts[index] = counts.get(index, 0) + 1
    order = sorted(firsts, key=firsts.__getitem__)
    return firsts.get(node, 1 << 30), counts.get(node, 0), tuple(counts[i] for i in order)


def epoch_shuffle(run_plan: RunPlan, reads: bool) -> str:
    """A rank's epoch order: the job's, but key order for a worker of a ``block`` shuffle
    (workers plan for padding flags only; the order comes with the slot)."""
    return run_plan.shuffle if reads or run_plan.shuffle != "block" else "none"


class ReadSession:
    """One rank's part of reading: a strategy, the epoch plans, and (if shared) the ring.

    Collective over the world communicator: construct on every rank.
    """

    def __init__(self, path: str, topo: Topology, run_plan: RunPlan, *,
                 value_prefix: Callable[[memoryview], int] | None = None) -> None:
        """Open ``path`` for this rank and set the session up as ``run_plan`` says (a plan
        :meth:`~lmdbio.run_plan.RunPlan.resolve` checked); ``value_prefix``: see
        :attr:`value_prefix`."""
        self.topo, self.run_plan = topo, run_plan
        #: read only a prefix of each value: a function of the value (a zero-copy view)
        #: giving how many leading bytes are needed (PCR scan groups, changed between
        #: epochs by ``Loader.set_scan_groups``); later pages are never touched
        self.value_prefix = value_prefix
        #: CPU and wall time per stage of this rank's data path (off until enabled)
        self.stages = StageClock()
        #: called with ``(first, count)`` after :meth:`read_group` has handled iterations
        #: ``first .. first + count - 1`` (a measurement's hook: ``lmdbio run`` counts a
        #: dedicated reader's iterations as it publishes them)
        self.on_read_group: list[Callable[[int, int], None]] = []
        cls = strategy_class(run_plan.strategy)
        self.cls = cls
        self.shared = cls.shared
        self.reads = topo.is_reader if self.shared else True
        t0 = time.perf_counter()
        self.db, self.mapping, self.totals = _open_database(
            path, topo, cls.chained, run_plan)
        self._agree_on_layout(path)
        self.node_cache = None
        if run_plan.direct_io:
            from lmdbio.io.direct import NodeCache  # O_DIRECT runs only
            self.node_cache = NodeCache(topo.node, self.db.path, self.db.psize)
        if run_plan.accounting or run_plan.direct_io:  # direct: walks report their pages
            self.db.accounting.enable()
        self.strategy: ReadStrategy = self._open_strategy()
        self._set_up_transport()
        #: a reader whose node ring has no worker but itself (colocated, a reader per
        #: rank): see :attr:`hands_to_itself`
        self.alone_on_ring = (self.shared and self.reads and topo.is_worker
                              and self.node_consumers == 1)
        #: slots this rank read for itself and has not received yet, oldest first (or the
        #: error receiving that slot raises: its batches come after the ones before it)
        self._own_slots: deque[Delivered | LmdbioError] = deque()
        #: which records this rank delivers per slot, where they are, what it reads ahead
        self.locator = SlotLocator(self.strategy, rank=topo.rank,
                                   first_consumer=self.first_consumer,
                                   node_consumers=self.node_consumers,
                                   batches_per_slot=self.batches_per_slot)
        if self.node_cache is None and (self.reads or self.by_reference):
            # a rank that reads the mapping (a worker of copies never does; direct I/O
            # reads past the page cache), before MADV_RANDOM: the few pages not in the
            # cache come with read-around
            self.totals.populated = populate_if_resident(self.db.buf, self.db.path)
        self._set_read_around()
        self.totals.setup_seconds = time.perf_counter() - t0
        if self.db.accounting.enabled and self.run_plan.accounting:
            self.totals.add_setup(self.db.accounting.touched)
        self.db.accounting.reset()
        self.epoch = -1
        self.plan: EpochPlan | None = None
        self._unshuffled_plan: EpochPlan | None = None
        #: shuffled epochs' plans, several made in one go on small data sets
        self._plans_ahead = PlansAhead(self.make_plan,
                                       epochs_ahead(len(self.db)))

    def _agree_on_layout(self, path: str) -> None:
        """One exchange over the world: every rank's node and consumer rank (the
        node-level strategies' layout), the pin choice of nodes sharing a host (one per file and
        host) and the snapshot every reading rank opened, which must be one; then this
        rank's consumers, the batch checked against the file, the snapshot pinned where
        this rank pins it. Collective over the world (for a node-level strategy or
        nodes sharing a host)."""
        topo = self.topo
        pinner = pinning_local_rank(topo, self.shared)
        pin_key = _pin_key(topo, path, pinner)
        exchange = self.shared or topo.shares_host
        wr = topo.worker_rank if topo.is_worker else -1
        snap = _snapshot_key(self.db) if self.reads else None
        seen = topo.world.allgather((topo.node_index, wr, pin_key, snap)) if exchange else []
        _check_one_snapshot(self.db, seen)
        self.consumers = self.run_plan.consumers  # a node ring's workers, else every rank
        if self.shared:
            self.first_consumer, self.node_consumers, self.consumers_per_node = \
                node_consumers(seen, topo.node_index)
        else:
            self.first_consumer, self.node_consumers = topo.rank, 1
            self.consumers_per_node = (1,) * topo.size
        check_batch_fits(self.db, self.run_plan, self.consumers, self.cls.scheme, topo.rank)
        if _pins_snapshot(topo, pin_key, [s[2] for s in seen], pinner):
            # the snapshot the readers opened (a worker that pins may have opened a later
            # one, if a writer committed in between: the pin then says it is not held)
            snaps = [s[-1] for s in seen if s[-1] is not None]
            self.db.pin_snapshot(txnid=snaps[0][1] if snaps else None)

    def _open_strategy(self) -> ReadStrategy:
        """The plan's read strategy over this rank's database (its readers' communicator
        for a node-level one), set up where this rank reads (collective over the
        readers)."""
        topo, run_plan = self.topo, self.run_plan
        if self.shared:
            comm = topo.readers if topo.is_reader else None
            ctx = ReaderContext(self.db, comm, topo.reader_rank, topo.n_readers,
                                run_plan.timeout, advise=run_plan.prefetch_advice)
        else:
            ctx = ReaderContext(self.db, None, topo.rank, topo.size, run_plan.timeout,
                                advise=run_plan.prefetch_advice)
        strategy = self.cls(ctx)
        if self.reads:
            strategy.setup()
        return strategy

    def _set_up_transport(self) -> None:
        """How records travel from the readers: the ring codec shared (a batch codec whose
        registry entry names a ring transport), the node's ring created
        (:class:`~lmdbio.ring_setup.RingSetup`), the O_DIRECT node cache attached and
        cleared. Collective over each node."""
        self.ring: BatchRing | None = None
        #: the worker side of the node's ring (None without one)
        self.receiver: SlotReceiver | None = None
        self.batches_per_slot = 1  # a node ring may carry several (RingSetup.create_ring)
        #: the codec the node's ring carries each worker's part encoded with (None: the
        #: records travel as they are)
        self.ring_codec: RingCodec | None = None
        setup = RingSetup(self.topo, self.run_plan, self.db, node_consumers=self.node_consumers)
        spec = BATCH_CODECS.get(self.run_plan.codec)
        transport = spec.ring_transport() if spec is not None else None
        if transport is not None:
            if not self.shared:  # RunPlan.resolve refuses it; a plan built in code may not
                raise ConfigError(f"codec {self.run_plan.codec} compresses node batches: it "
                                  f"needs a node-level strategy ({', '.join(node_level())})")
            self.ring_codec = setup.share_codec(transport)
        if self.shared:
            self.ring = setup.create_ring(ring_codec=self.ring_codec,
                                          by_reference=self.by_reference)
            #: consecutive batches in one slot, as the node's reader chose them
            self.batches_per_slot = int(self.ring.reader_info)
            self.receiver = SlotReceiver(self.ring, self.db, self.ring_codec)
        if self.node_cache is not None:
            if self.reads:
                self.db.accounting.node_cache = self.node_cache
            self.node_cache.clear()  # every node starts cold (collective over the node)

    def _set_read_around(self) -> None:
        """Apply :attr:`RunPlan.read_around <lmdbio.run_plan.RunPlan.read_around>` to this
        reading rank's mapping."""
        mode = self.run_plan.read_around
        off = mode == "off" or (mode == "auto" and self.cls.advises
                                and self.run_plan.prefetch_advice and self.node_cache is None)
        if not (off and self.reads):
            return
        try:
            self.db.advise_access(MADV_RANDOM)
        except OSError as exc:  # advisory: the kernel's read-around stays
            log.warning("%s: read-around left on, madvise(MADV_RANDOM) refused: %s",
                        self.db.path, exc)

    @property
    def slot_codec(self) -> str:
        """The ring codec's name in the slot headers (``none``: records as they are)."""
        return self.run_plan.codec if self.ring_codec is not None else "none"

    @property
    def by_reference(self) -> bool:
        """Whether this reader's slots carry record spans instead of record bytes
        (``RunPlan.transfer``; plain values only)."""
        return (self.shared and self.run_plan.transfer == "spans" and self.ring_codec is None
                and self.value_prefix is None and not self.run_plan.direct_io)

    @property
    def hands_to_itself(self) -> bool:
        """Whether this rank's slots go from its reading side to its receiving side in
        this process instead of through the ring: it is its ring's only reader and only
        worker, and slots carry record spans (nothing is copied either way). The ring
        would add a slot's header and its CRC, two messages and the receiver's checks of
        what this process itself wrote: on the 2-core VM, ImageNet-like batches of 32 at
        two ranks, ~1/4 of what each rank spent per epoch outside the transform
        kernel."""
        return self.alone_on_ring and self.by_reference

    def plan_for(self, epoch: int, stop: int = 0) -> EpochPlan:
        """The plan of epoch ``epoch`` on this rank. Unshuffled epochs share one plan (it
        does not depend on the epoch: ~0.6 ms of CPU per rank and epoch saved); shuffled
        ones are made several epochs at a time on small data sets
        (:class:`~lmdbio.plan.ahead.PlansAhead`); both have read-only arrays. ``stop``:
        the iteration the run stops at in this epoch (0: it runs the whole epoch); a slot
        group it cuts is laid out as two (:func:`~lmdbio.plan.epoch.plan_epoch`'s
        ``split``; such a plan is built for the one epoch, not shared, its arrays
        writable)."""
        if stop:
            return self.make_plan(epoch, stop)
        if epoch_shuffle(self.run_plan, self.reads) == "none":
            if self._unshuffled_plan is None:
                self._unshuffled_plan = freeze(self.make_plan(epoch))
            return self._unshuffled_plan
        return self._plans_ahead.get(epoch)

    def make_plan(self, epoch: int, stop: int = 0) -> EpochPlan:
        """:func:`~lmdbio.plan.epoch.plan_epoch` of ``epoch`` as this session lays epochs
        out, made now, its arrays writable (:meth:`plan_for` shares them; ``stop``: see
        there)."""
        run = self.run_plan
        leaf_first = self.db.leaf_directory() if self.cls.shuffles and self.reads else None
        window = 1024
        if leaf_first is not None and leaf_first.shape[0] > 1:
            per_leaf = max(1, int(leaf_first[-1]) // (leaf_first.shape[0] - 1))
            window = max(1, run.window_blocks * run.block_pages * per_leaf)
        return plan_epoch(len(self.db), self.consumers, run.batch_size, run.last,
                          epoch_shuffle(run, self.reads), run.seed, epoch, leaf_first,
                          block_leaves=run.block_pages, window=window,
                          scheme=self.cls.scheme, group=self.plan_group,
                          node_consumers=self.consumers_per_node, split=stop)

    @property
    def epoch_stop(self) -> int:
        """The iteration this epoch's run ends at (the epoch's end unless
        :meth:`begin_epoch` was told to stop earlier; 0 before the first epoch)."""
        return self.locator.epoch_stop

    @property
    def epoch_iterations(self) -> int:
        """Iterations in every epoch of this session (what its plans hold)."""
        return scheme_iterations(len(self.db), self.consumers, self.run_plan.batch_size,
                                 self.run_plan.last, self.cls.scheme)

    @property
    def plan_group(self) -> int:
        """Iterations per slot group of the epoch plans: the ring's batches per slot for
        the strategies that walk to their records (a node's records of a slot are then one
        run: one walk and one cursor hand-off per slot), 1 for the others (they locate any
        record directly; their order does not depend on the slot size)."""
        return self.batches_per_slot if self.shared and self.cls.walks_slots else 1

    def begin_epoch(self, epoch: int, start_iteration: int = 0, stop_iteration: int = 0
                    ) -> EpochPlan:
        """Plan epoch ``epoch``; with ``start_iteration`` > 0 the strategy is positioned to
        start there (exact mid-epoch resume, no replay of earlier batches). A run that
        ends inside the epoch may say where (``stop_iteration``, the same on every rank):
        a slot group it cuts short is then laid out for the part that is read, so the
        readers that walk to their records walk past no records nobody reads, and nothing
        after it is read ahead (the benchmark's ``--iters``). The cut changes which
        records the iterations before it deliver: a run resumed in that epoch must pass
        the same stop."""
        self.epoch = epoch
        self.plan = self.plan_for(epoch, stop_iteration)
        self.locator.stop_epoch_at(self.plan, stop_iteration)
        if self.node_cache is not None:
            # every epoch reads from storage again, as when the data set is larger than a
            # node's memory: each rank from its own epoch on (not collective; one rank
            # emptying the node's cache raced with the ranks that read on their own)
            self.node_cache.set_epoch(epoch)
        if self.reads:
            acc = self.db.accounting
            acc.reset()
            self.strategy.begin_epoch(self.plan)
            if start_iteration and start_iteration < self.plan.iterations:
                first = self.plan.records(start_iteration, 0)
                self.strategy.resume(self.plan, start_iteration,
                                     int(first[0]) if first.size else 0)
            if acc.enabled and self.run_plan.accounting:  # outside every iteration's pages
                self.totals.add_setup(acc.touched)
            acc.reset()
        return self.plan

    # ----------------------------------------------------------------- reading
    def read_iteration(self, iteration: int) -> IterationStats:
        """Reader side of one iteration: locate, gather into a slot (or privately), publish."""
        return self.read_group(iteration, 1)

    def read_group(self, first: int, count: int) -> IterationStats:
        """Reader side of iterations ``first .. first + count - 1`` in one ring slot (count
        1 without a ring): locate, gather, publish."""
        plan = self.plan
        assert plan is not None
        if count != 1 and not self.shared:
            raise LmdbioError("several iterations per read need a node ring (a node-level "
                              "strategy)")
        stats = IterationStats(first, batches=count)
        self.db.accounting.reset()
        ids, pad, sizes, refs = self.locate_group(plan, first, count, stats)
        if self.shared:
            self._publish_group(first, count, ids, pad, sizes, refs, stats)
        else:
            with Timer(stats, "copy"), self.stages.span("slot_fill"):
                buf, offsets = gather_refs(self.db, refs)
                koffs, kdata = gather_keys(self.db, refs)
            self.last_private = Delivered(self.epoch, first, ids, pad, buf, offsets,
                                          koffs, kdata)
        self._account(stats, refs)
        for hook in self.on_read_group:
            hook(first, count)
        return stats

    def locate_group(self, plan: EpochPlan, first: int, count: int, stats: IterationStats
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, RecordRefs]:
        """The records this reader delivers for iterations ``first .. first + count - 1``:
        ids, padding flags, records per consuming worker and where they are (with PCR's
        value prefix applied); then asks for the next slot's pages."""
        clock, locator = self.stages, self.locator
        with clock.span("locate"):
            ids, pad, sizes = locator.share(plan, first, count)
            refs = locator.fetch_group(plan, first, count, ids, stats)
        # the next slot's pages, asked for now
        with Timer(stats, "prefetch"), clock.span("read_ahead"):
            locator.read_ahead(plan, first + count)
        if self.value_prefix is not None and len(refs):
            refs = self._prefixes(refs)
        if len(refs) != ids.size:
            raise RuntimeError(f"strategy {self.cls.name} located {len(refs)} records for "
                               f"{ids.size} ids in iteration {first}")
        return ids, pad, sizes, refs

    def _publish_group(self, first: int, count: int, ids: np.ndarray, pad: np.ndarray,
                       sizes: np.ndarray, refs: RecordRefs, stats: IterationStats) -> None:
        """Fill a ring slot with the located records of iterations ``first .. first +
        count - 1`` (waiting for a free one) and publish it to the node's workers."""
        assert self.ring is not None
        clock = self.stages
        if self.hands_to_itself:
            self.ring.check_usable()  # aborted (a signal, this rank's error) or closed
            with Timer(stats, "copy"), clock.span("slot_fill"):
                got = self._own_delivery(first, count, ids, pad, refs)
            with clock.span("publish"):
                self._own_slots.append(got)
            return
        with clock.span("slot_wait"):
            w = self.ring.acquire_slot(self.epoch, first)
        with Timer(stats, "copy"), clock.span("slot_fill"):
            labels = np.where(pad, -ids - 1, ids)  # record ids; padding as -id - 1
            self._fill_slot(w, refs, labels, sizes)
        with clock.span("publish"):
            w.publish(codec=self.slot_codec,
                      flags=count << SLOT_BATCHES_SHIFT if count > 1 else 0)
        self.last_private = None

    def _own_delivery(self, first: int, count: int, ids: np.ndarray, pad: np.ndarray,
                      refs: RecordRefs) -> Delivered | LmdbioError:
        """Iterations ``first .. first + count - 1`` as this rank's own worker receives
        them (:attr:`hands_to_itself`): the record spans located, checked against the
        mapping as a worker checks a ring slot's (a record index may come from a sidecar
        file), the overflow page headers left to the pass that reads the values, the
        pages counted as a ring slot's are. A span outside the mapping gives the error
        that receiving the slot raises (after the batches read before it, as a worker
        meets a bad ring slot)."""
        db = self.db
        for what, starts, lengths in (("record", refs.val_off, refs.val_len),
                                      ("key", refs.key_off, refs.key_len)):
            wrong = outside_mapping(db, starts, lengths, what)
            if wrong is not None:
                return LmdbioError(f"epoch {self.epoch} iteration {first}: {wrong}")
        db.accounting.mark_values(refs, db.psize)
        return Delivered.of_spans(db, self.epoch, first, ids, pad, refs.val_off, refs.val_len,
                                  keys=(refs.key_off, db.buf, refs.key_len), batches=count)

    def _fill_slot(self, w: Any, refs: RecordRefs, labels: np.ndarray,
                   sizes: np.ndarray) -> None:
        """The slot's records as the run plan transfers them: spans of the file, values
        and keys gathered into the slot in one pass, through the node's O_DIRECT cache,
        or encoded per worker part (the ring codec)."""
        if self.by_reference:
            # records and keys stay in the file: their spans and labels go in the slot, their
            # pages counted, not read: each consumer checks the overflow headers of its
            # spans (ReadSession.receive), where it reads the values
            self.db.accounting.mark_values(refs, self.db.psize)
            w.set_spans(refs.val_off, refs.val_len, labels,
                        key_spans=(refs.key_off, refs.key_len))
        elif self.ring_codec is None and self.db.accounting.node_cache is None:
            # values, keys and both offset tables straight into the slot, one pass
            n = len(refs)
            nbytes, kbytes = gather_batch(self.db, refs, *w.record_buffers(n))
            w.records_written(n, labels, nbytes, kbytes)
        else:
            offsets = np.zeros(len(refs) + 1, np.int64)
            np.cumsum(refs.val_len, out=offsets[1:])
            koffs, kdata = gather_keys(self.db, refs)
            if self.ring_codec is None:  # values through the node's O_DIRECT cache
                gather_refs(self.db, refs, out=w.payload(refs.nbytes))
                w.set_records(offsets, labels, keys=(koffs, kdata))
            else:
                raw, _ = gather_refs(self.db, refs)
                w.set_records(offsets, labels, keys=(koffs, kdata), decoded=True)
                w.set_parts(sizes)
                w.write_part_blobs(self.ring_codec.encode_parts(
                    raw, offsets, sizes, keys=(koffs, kdata), where=self.db.where))
                return
        w.set_parts(sizes)

    def _prefixes(self, refs: RecordRefs) -> RecordRefs:
        """Shorten each value to the prefix ``value_prefix`` asks for (one call per record:
        records of this kind are groups of many images, read through their first page)."""
        fn = self.value_prefix
        assert fn is not None  # read_group calls it only then
        mv = self.db.mv
        lens = refs.val_len.copy()
        for i, (off, n) in enumerate(zip(refs.val_off.tolist(), refs.val_len.tolist(),
                                         strict=True)):
            lens[i] = min(n, int(fn(mv[off:off + n])))
        return RecordRefs(refs.val_off, lens, refs.leaf_pg, refs.ovf_pages, refs.key_off,
                          refs.key_len)

    def _account(self, stats: IterationStats, refs: RecordRefs) -> None:
        stats.records = len(refs)
        stats.bytes = refs.nbytes
        if not self.run_plan.accounting:
            return
        account_records = kernel_module("lmdbio.lmdb").account_records

        acc = self.db.accounting
        t = self.totals
        if t.touched.shape != acc.touched.shape:
            t.touched = np.zeros_like(acc.touched)
            t.own = np.zeros_like(acc.touched)
            t.scratch = np.zeros_like(acc.touched)
        # pages touched, pages of the records, touched beyond them; totals or-ed: one pass
        touched, own, extra = account_records(acc.touched, t.scratch, t.touched,
                                              t.own, refs.leaf_pg, refs.val_off,
                                              refs.val_len, self.db.psize)
        stats.pages_touched, stats.own_pages, stats.extra_pages = \
            int(touched), int(own), int(extra)
        # a flat copy (dataclasses.asdict deep-copies field by field: ~50 us per iteration)
        t.iterations.append({**stats.__dict__, "seconds": dict(stats.seconds)})

    def poll(self) -> bool:
        """Consumer side: whether :meth:`receive` would return at once (never blocks)."""
        if not self.shared:
            return self.last_private is not None
        if self._own_slots:
            return True
        assert self.receiver is not None
        return self.receiver.poll()

    def receive(self, timeout: float | None = None, *, defer_verify: bool = False,
                defer_value_check: bool = False) -> Delivered | None:
        """Consumer side: the next batch for this rank (None when the reader stopped): the
        node ring's next slot, received and checked by :meth:`SlotReceiver.receive
        <lmdbio.slot_receiver.SlotReceiver.receive>` (``defer_verify`` and
        ``defer_value_check``: see there), or the batch or slot this rank read for itself
        (:attr:`hands_to_itself`: its spans' overflow page headers checked here unless
        ``defer_value_check``)."""
        if not self.shared:
            out, self.last_private = self.last_private, None
            return out
        if self._own_slots:  # read by this rank for itself (hands_to_itself)
            got = self._own_slots.popleft()
            if isinstance(got, LmdbioError):
                raise got
            if not defer_value_check:
                got.check_values()
            return got
        assert self.receiver is not None
        return self.receiver.receive(timeout, defer_verify=defer_verify,
                                     defer_value_check=defer_value_check)

    def stop(self) -> None:
        """Reader: tell the node's workers that no more batches come."""
        if self.shared and self.topo.is_reader and self.ring is not None:
            self.ring.stop()

    def close(self) -> None:
        """Collective: free the ring, the strategy and the mapping."""
        self._own_slots.clear()  # views of the mapping
        if self.reads:
            self.strategy.close()
        if self.ring is not None:
            self.ring.close()
            self.ring = None
            self.receiver = None
        if self.node_cache is not None:
            self.db.accounting.node_cache = None
            self.node_cache.close()
            self.node_cache = None
        self.db.close()
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None
