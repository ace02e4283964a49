"""Trace what every simulated rank of a job reads, by running the real read strategies.

A projection is only as good as its page sets, so they are not derived from formulas: this
module opens the real database once and runs each strategy's own code
(:mod:`lmdbio.plan.strategies`) for every simulated reader, through the job reader's own
:class:`~lmdbio.slot_locator.SlotLocator` (its share, the slot's fetch, the read-ahead),
one after the other in one process, over the real epoch plan
(:func:`~lmdbio.plan.epoch.plan_epoch`) and the same slot grouping, node split
(:func:`~lmdbio.topology.simulated_node_bounds`) and page accounting
(:class:`~lmdbio.io.accounting.PageAccounting`, reset per read as
:meth:`lmdbio.reader.ReadSession.read_group` resets it) that ``lmdbio bench read`` runs
under ``mpiexec``. What replaces MPI:

* the DM cursor hand-off is a mailbox: readers run in chain order within each slot, so the
  cursor reader ``r`` sends is there when reader ``r + 1`` asks for it;
* the kernel's page cache: advice (``MADV_WILLNEED``) is recorded, not sent, and every
  page is taken as absent (a cold node), so the advised ranges are the exact read requests
  of ``dm-spec`` and ``indexed``.

The result, a :class:`Trace`, lists one :class:`Step` per reader and read (a ring slot of
one or more iterations): its records, the pages its walk and its values touched, the pages
it asked for ahead, the records its cursor stepped over, and its cursor messages. It is
deterministic: a pure function of the file and the arguments.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.errors import ConfigError

if TYPE_CHECKING:
    from lmdbio.plan.strategies.base import ReadStrategy
    from lmdbio.slot_locator import SlotLocator

_EMPTY = np.empty(0, np.int64)


@dataclass
class Step:
    """One reader's read of one slot (``batches`` consecutive iterations)."""

    slot: int
    epoch: int
    first_iteration: int
    batches: int
    #: index into :attr:`Trace.actors`
    actor: int
    records: int = 0
    bytes: int = 0
    #: records a cursor stepped over one at a time (``walk_collect``: the naive
    #: strategies, LMM, the DM chains' collection), own records included
    walked: int = 0
    #: records passed leaf by leaf (``walk_skip``: the DM chain's walk over its share)
    skipped: int = 0
    #: records located through the leaf directory (``indexed``)
    located: int = 0
    #: pages the locate/walk read (branch and leaf pages; the accounting before values)
    tree_pages: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: pages of the records' values (marked as the workers read them)
    value_pages: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: pages holding the records: their leaves and every value page
    own_pages: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: pages asked for ahead of the reads (dm-spec's prefetch, indexed's advice): exact
    #: asynchronous read requests
    advised: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: pages the walk read before the cursor went on (DM: on the chain's critical path)
    chain_pages: np.ndarray = field(default_factory=lambda: _EMPTY)
    chain_walked: int = 0
    chain_skipped: int = 0
    messages: int = 0
    message_bytes: int = 0
    prefetched_pages: int = 0
    missed_pages: int = 0
    redundant_pages: int = 0
    #: :meth:`touched`, once computed (the model asks for it on every evaluation)
    touched_pages: np.ndarray | None = field(default=None, repr=False, compare=False)

    def touched(self) -> np.ndarray:
        """The distinct pages the step's walk and values touch (sorted), computed once."""
        if self.touched_pages is None:
            self.touched_pages = np.union1d(self.tree_pages, self.value_pages)
        return self.touched_pages


@dataclass
class Actor:
    """A reading rank: a node's reader (node-level strategies) or any rank (naive)."""

    index: int
    rank: int
    node: int
    #: the node's consumer ranks this actor reads for (1 for a naive rank)
    consumers: int
    setup_pages: np.ndarray = field(default_factory=lambda: _EMPTY)


@dataclass
class Trace:
    """Everything the simulated readers of one job read (see the module docstring)."""

    strategy: str
    path: str
    ranks: int
    nodes: int
    batch: int
    psize: int
    n_pages: int
    n_records: int
    record_bytes: float
    batches_per_slot: int
    iterations: int
    epoch_iterations: int
    shared: bool
    #: the strategy faults pages with the kernel's read-around (it does not advise)
    read_around: bool
    chained: bool
    actors: list[Actor]
    steps: list[Step]
    #: ranks per node
    node_ranks: tuple[int, ...]
    #: a chain whose readers ask ahead for the pages they expect (dm-spec): every read
    #: also estimates, checks residency and observes (``Costs.cpu_speculate_s``)
    speculates: bool = False
    #: :meth:`page_totals`, once computed (the model reports them on every evaluation)
    totals: list[dict[str, int]] | None = field(default=None, repr=False, compare=False)

    def actor_steps(self, actor: int) -> list[Step]:
        return [s for s in self.steps if s.actor == actor]

    def page_totals(self) -> list[dict[str, int]]:
        """Per actor, over the traced iterations, the figures ``bench read`` reports per
        rank: distinct pages touched, pages holding its records, touched pages holding none
        of them (``extra``), and the pages read outside every iteration (``setup``).
        Computed once; each call returns fresh dicts."""
        if self.totals is None:
            self.totals = self.count_pages()
        return [dict(p) for p in self.totals]

    def count_pages(self) -> list[dict[str, int]]:
        """:meth:`page_totals`, counted from the steps."""
        out = []
        for a in self.actors:
            steps = self.actor_steps(a.index)
            touched = _union([s.tree_pages for s in steps] + [s.value_pages for s in steps])
            own = _union([s.own_pages for s in steps])
            extra = np.setdiff1d(touched, own, assume_unique=True)
            out.append({"rank": a.rank, "node": a.node, "pages_touched": int(touched.size),
                        "own_pages": int(own.size), "extra_pages": int(extra.size),
                        "setup_pages": int(a.setup_pages.size)})
        return out


def _union(arrays: list[np.ndarray]) -> np.ndarray:
    arrays = [a for a in arrays if a.size]
    return np.unique(np.concatenate(arrays)) if arrays else _EMPTY


def _runs_to_pages(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    starts = np.asarray(starts, np.int64)
    counts = np.asarray(counts, np.int64)
    keep = counts > 0
    starts, counts = starts[keep], counts[keep]
    if not starts.size:
        return _EMPTY
    total = int(counts.sum())
    offsets = np.repeat(starts - np.cumsum(counts) + counts, counts)
    return np.unique(offsets + np.arange(total))


class _Recorder:
    """Counters and advice shared by a traced strategy and its database wrappers."""

    def __init__(self) -> None:
        self.walked = 0
        self.skipped = 0
        self.advised: list[np.ndarray] = []
        self.chain: tuple[np.ndarray, int, int] | None = None
        self.messages = 0
        self.message_bytes = 0

    def take_advised(self) -> np.ndarray:
        pages, self.advised = _union(self.advised), []
        return pages


def _traced_class(cls: type, recorder_attr: str = "_rec") -> type:
    """A subclass of strategy ``cls`` whose advice is recorded instead of sent and whose
    page-cache tests say "absent"; for the DM chains, a mailbox instead of MPI."""
    from lmdbio.plan.strategies.dm import DmSerial

    def advise_pages(self, starts, counts) -> bool:
        if not self.advising or not np.any(counts):
            return False
        self._rec.advised.append(_runs_to_pages(starts, counts))
        return True

    def cached_sample(self, pages, samples: int = 16) -> bool:
        return False

    body: dict[str, Any] = {"advise_pages": advise_pages, "cached_sample": cached_sample}
    if issubclass(cls, DmSerial):
        def receive_cursor(self, iteration, stats) -> None:
            r, n = self.ctx.reader_index, self.ctx.n_readers
            if n == 1 or (r == 0 and iteration == self.first_iteration):
                return
            data = self._mail.pop(r)
            self.cursor_record = int.from_bytes(data[:8], "little")
            self.cursor = self.db.cursor_from_bytes(data[8:])

        def send_cursor(self, last_iteration) -> None:
            rec = self._rec
            rec.chain = (np.flatnonzero(self.db.accounting.touched), rec.walked, rec.skipped)
            r, n = self.ctx.reader_index, self.ctx.n_readers
            if n == 1 or (r == n - 1 and last_iteration == self.iterations - 1):
                return
            msg = self.cursor_record.to_bytes(8, "little") + self.cursor.to_bytes()
            self._mail[(r + 1) % n] = msg
            rec.messages += 1
            rec.message_bytes += len(msg)

        body.update(receive_cursor=receive_cursor, send_cursor=send_cursor,
                    drain_cursor=lambda self: None,
                    close=lambda self: None)
    return type(f"Traced{cls.__name__}", (cls,), body)


def _instrument(db: Any, rec: _Recorder) -> None:
    """Count the records the cursor kernels pass (instance attributes over the methods)."""
    collect, skip = db.walk_collect, db.walk_skip

    def walk_collect(cursor, n, wrap=False):
        rec.walked += int(n)
        return collect(cursor, n, wrap)

    def walk_skip(cursor, n, wrap=False):
        rec.skipped += int(n)
        return skip(cursor, n, wrap)

    db.walk_collect, db.walk_skip = walk_collect, walk_skip


@contextlib.contextmanager
def _alone(ctx: Any) -> Iterator[None]:
    """The reader as the only one (index 0 of 1) for the collectives of setup and
    ``begin_epoch`` (a leaf directory built by this one process: its setup pages are then
    an upper bound, every leaf instead of ``1 / readers`` of them)."""
    saved = ctx.reader_index, ctx.n_readers
    ctx.reader_index, ctx.n_readers = 0, 1
    try:
        yield
    finally:
        ctx.reader_index, ctx.n_readers = saved


def default_batches_per_slot(db: Any, batch: int, node_ranks: tuple[int, ...]) -> int:
    """The slot size ``batches_per_slot: 0`` gives node rings of record spans (``bench
    read``'s default): :func:`lmdbio.ring_setup.choose_batches_per_slot` per node from the
    file's bytes per record, the smallest over the nodes (the readers agree on it)."""
    from lmdbio.ring_setup import choose_batches_per_slot, file_bytes_per_record

    per_record = file_bytes_per_record(db)
    return min(choose_batches_per_slot(batch, per_record * batch * c, spans=True, consumers=c)
               for c in node_ranks)


def trace(path: str | Path, strategy: str, ranks: int, nodes: int, batch: int, *,
          iterations: int | None = None, batches_per_slot: int = 0, last: str = "pad",
          subdb: str | None = None, max_ranks: int = 4096) -> Trace:
    """Run ``strategy`` for ``ranks`` ranks on ``nodes`` nodes (every rank a consumer of
    ``batch`` records per iteration, one reader per node for the node-level strategies,
    as ``bench read --mode colocated``) over the database at ``path`` for ``iterations``
    iterations (default: one epoch; more wrap into further epochs, as ``bench read
    --iters``), and record every read (see the module docstring).

    ``batches_per_slot`` 0 takes a job's default (:func:`default_batches_per_slot`); the
    naive strategies always read one batch at a time."""
    from lmdbio.lmdb import Database
    from lmdbio.plan.strategies import strategy_class
    from lmdbio.topology import simulated_node_bounds

    if not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be a positive integer, got {ranks!r}")
    if ranks > max_ranks:
        raise ConfigError(f"ranks {ranks} is more than this tracer runs ({max_ranks})")
    if not isinstance(nodes, int) or not 1 <= nodes <= ranks:
        raise ConfigError(f"nodes must be in 1..ranks ({ranks}), got {nodes!r}")
    if batch < 1:
        raise ConfigError(f"batch must be >= 1, got {batch}")
    cls = strategy_class(strategy)
    db = Database(path, subdb, pin_snapshot=False, accounting=True)
    try:
        tracer = _Tracer(db, cls, ranks, batch, simulated_node_bounds(ranks, nodes),
                         batches_per_slot)
        return tracer.run(nodes, iterations, last)
    finally:
        db.close()


class _Tracer:
    """One traced job: the database, the strategy's traced class, and one slot locator
    per reading actor (:class:`~lmdbio.slot_locator.SlotLocator`, as a job's reader runs
    it), run slot by slot in chain order."""

    def __init__(self, db: Any, cls: type[ReadStrategy], ranks: int, batch: int,
                 bounds: list[tuple[int, int]], batches_per_slot: int) -> None:
        if len(db) == 0:
            raise ConfigError(f"{db.path}: the database holds no records")
        self.db, self.cls, self.ranks, self.batch, self.bounds = db, cls, ranks, batch, bounds
        self.node_ranks = tuple(b - a for a, b in bounds)
        self.rec = _Recorder()
        _instrument(db, self.rec)
        db.read_around = not cls.advises
        if cls.shared:
            self.per_slot = batches_per_slot or default_batches_per_slot(db, batch,
                                                                         self.node_ranks)
            self.actors = [Actor(k, a, k, b - a) for k, (a, b) in enumerate(bounds)]
        else:
            self.per_slot = 1
            self.actors = [Actor(r, r, k, 1) for k, (a, b) in enumerate(bounds)
                           for r in range(a, b)]
        self.locators = self._locators()
        #: per actor, the pages its previous read asked for on behalf of its next one
        self.pending: list[np.ndarray] = [_EMPTY] * len(self.actors)

    def _locators(self) -> list[SlotLocator]:
        """One slot locator per actor, its strategy set up alone (its setup pages kept)."""
        from lmdbio.plan.strategies import ReaderContext
        from lmdbio.slot_locator import SlotLocator

        traced = _traced_class(self.cls)
        mail: dict[int, bytes] = {}
        acc = self.db.accounting
        locators = []
        for a in self.actors:
            ctx = ReaderContext(self.db, None, a.index, len(self.actors), 60.0, advise=True)
            strat = traced(ctx)
            strat._rec, strat._mail = self.rec, mail
            acc.reset()
            with _alone(ctx):
                strat.setup()
            a.setup_pages = np.flatnonzero(acc.touched)
            first = self.bounds[a.node][0] if self.cls.shared else a.rank
            locators.append(SlotLocator(strat, rank=a.rank, first_consumer=first,
                                        node_consumers=a.consumers,
                                        batches_per_slot=self.per_slot))
        return locators

    def run(self, nodes: int, iterations: int | None, last: str) -> Trace:
        """Every slot of ``iterations`` iterations (None: one epoch), every actor's read
        of it in chain order; the :class:`Trace`."""
        from lmdbio.plan.epoch import iteration_schedule, schedule_slots, scheme_iterations

        cls, db = self.cls, self.db
        per_epoch = scheme_iterations(len(db), self.ranks, self.batch, last, cls.scheme)
        schedule = iteration_schedule(per_epoch, iterations or per_epoch)
        stops = {schedule[-1][0]: schedule[-1][1] + 1} if schedule and \
            schedule[-1][1] + 1 < per_epoch else {}
        steps: list[Step] = []
        plan, epoch_now = None, -1
        for slot_index, (epoch, first, count) in enumerate(schedule_slots(schedule,
                                                                          self.per_slot)):
            if epoch != epoch_now:
                epoch_now = epoch
                plan = self._begin_epoch(epoch, stops.get(epoch, 0), last)
            steps.extend(self._read(a, sim, plan, slot_index, epoch, first, count)
                         for a, sim in zip(self.actors, self.locators, strict=True))
        return Trace(strategy=cls.name, path=str(db.path), ranks=self.ranks, nodes=nodes,
                     batch=self.batch, psize=db.psize, n_pages=db.file_size // db.psize,
                     n_records=len(db), record_bytes=float(db.file_size) / len(db),
                     batches_per_slot=self.per_slot, iterations=len(schedule),
                     epoch_iterations=per_epoch, shared=cls.shared,
                     read_around=not cls.advises, chained=cls.chained,
                     actors=self.actors, steps=steps, node_ranks=self.node_ranks,
                     speculates=cls.chained and cls.advises)

    def _begin_epoch(self, epoch: int, stop: int, last: str) -> Any:
        """The epoch's plan (as the job plans it), begun by every actor alone; what
        beginning reads is setup, what it asks for is dropped (not an iteration's)."""
        from lmdbio.plan.epoch import plan_epoch

        cls = self.cls
        group = self.per_slot if cls.shared and cls.walks_slots else 1
        plan = plan_epoch(len(self.db), self.ranks, self.batch, last, "none", 0, epoch, None,
                          scheme=cls.scheme, group=group, node_consumers=self.node_ranks,
                          split=stop)
        acc = self.db.accounting
        for a, sim in zip(self.actors, self.locators, strict=True):
            sim.stop_epoch_at(plan, stop)
            acc.reset()
            with _alone(sim.strategy.ctx):
                sim.strategy.begin_epoch(plan)
            a.setup_pages = np.union1d(a.setup_pages, np.flatnonzero(acc.touched))
            self.rec.take_advised()
        return plan

    def _read(self, a: Actor, sim: SlotLocator, plan: Any, slot_index: int, epoch: int,
              first: int, count: int) -> Step:
        """Actor ``a`` reads its share of one slot through the reader's own slot locator; the
        :class:`Step` with what it touched, asked for, walked and sent."""
        from lmdbio.plan.strategies import IterationStats

        rec, db = self.rec, self.db
        stats = IterationStats(first, batches=count)
        db.accounting.reset()
        w0, s0, m0, b0 = rec.walked, rec.skipped, rec.messages, rec.message_bytes
        rec.chain = None
        ids = sim.share(plan, first, count)[0]
        refs = sim.fetch_group(plan, first, count, ids, stats)
        chain, cw, cs = rec.chain if rec.chain is not None else (_EMPTY, w0, s0)
        advised = _union([self.pending[a.index], rec.take_advised()])
        # the next slot's pages, asked for now (counted for the slot they serve); what
        # asking reads is in this read's pages, as the session accounts it
        sim.read_ahead(plan, first + count)
        self.pending[a.index] = rec.take_advised()
        return Step(slot_index, epoch, first, count, a.index, records=len(refs),
                    bytes=refs.nbytes, walked=rec.walked - w0, skipped=rec.skipped - s0,
                    located=len(refs) if self.cls.shuffles else 0,
                    tree_pages=np.flatnonzero(db.accounting.touched),
                    value_pages=refs.value_pages(db.psize), own_pages=refs.pages(db.psize),
                    advised=advised, chain_pages=chain, chain_walked=cw - w0,
                    chain_skipped=cs - s0, messages=rec.messages - m0,
                    message_bytes=rec.message_bytes - b0,
                    prefetched_pages=stats.prefetched_pages,
                    missed_pages=stats.missed_pages, redundant_pages=stats.redundant_pages)


def cached_trace(cache: Path | None, path: str | Path, strategy: str, ranks: int,
                 nodes: int, batch: int, **kwargs: Any) -> Trace:
    """:func:`trace`, kept in the folder ``cache`` (one pickle per database and arguments)
    and read back from it on a later call with the same arguments; ``None``: no cache.

    A trace depends on the costs of nothing, only on the file and the strategies' code, so
    a projection or a calibration rerun with other costs need not trace again. The key
    holds the file's size and modification time (a regenerated database is traced
    again), not the code's version: empty the folder after changing a strategy."""
    import hashlib
    import pickle

    if cache is None:
        return trace(path, strategy, ranks, nodes, batch, **kwargs)
    from lmdbio.lmdb.snapshot import resolve_file

    file = resolve_file(path)
    stat = file.stat()
    key = repr((str(file), stat.st_size, stat.st_mtime_ns, strategy, ranks, nodes, batch,
                sorted(kwargs.items())))
    name = f"{file.parent.name}-{strategy}-r{ranks}-n{nodes}-b{batch}-" \
        f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pickle"
    kept = Path(cache) / name
    if kept.exists():
        got = pickle.loads(kept.read_bytes())
        if isinstance(got, Trace):
            return got
    got = trace(path, strategy, ranks, nodes, batch, **kwargs)
    kept.parent.mkdir(parents=True, exist_ok=True)
    part = kept.with_suffix(".part")
    part.write_bytes(pickle.dumps(got, protocol=pickle.HIGHEST_PROTOCOL))
    part.replace(kept)  # whole or absent, even if this process is stopped mid-write
    return got
