"""The interface every read strategy implements, and what a reader reports per iteration.

A strategy decides which records a reader reads in each iteration and how it finds them
(walking, a cursor handed along a chain, a leaf directory). It returns
:class:`~lmdbio.lmdb.RecordRefs` - where the values are - and the caller gathers them,
usually straight into a shared-memory batch slot. Every reader calls :meth:`fetch` for
every iteration, in the same order: strategies that communicate (the DM chain) rely on it.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.io.prefetch import (
    advise_page_ranges,
    pages_resident,
    readahead_limit,
    residency_is_reported,
)
from lmdbio.lmdb import Database, RecordRefs
from lmdbio.plan.epoch import EpochPlan

log = logging.getLogger(__name__)


@dataclass
class IterationStats:
    """One reader's accounting for one iteration, or for one ring slot of ``batches``
    consecutive iterations read together (a slot group: one walk, one prefetch)."""

    iteration: int
    batches: int = 1
    records: int = 0
    bytes: int = 0
    pages_touched: int = 0
    own_pages: int = 0
    extra_pages: int = 0
    prefetched_pages: int = 0
    missed_pages: int = 0  # value pages needed, not prefetched (dm-spec)
    missed_walk_pages: int = 0  # leaf/branch pages the walk read, not prefetched (dm-spec)
    redundant_pages: int = 0  # prefetched, neither a value page nor walked (dm-spec)
    seconds: dict[str, float] = field(default_factory=lambda: {
        "prefetch": 0.0, "wait_cursor": 0.0, "walk": 0.0, "copy": 0.0})


class Timer:
    """Adds the time spent in a ``with`` block to ``stats.seconds[name]``."""

    def __init__(self, stats: IterationStats, name: str) -> None:
        self.stats, self.name = stats, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.stats.seconds[self.name] += time.perf_counter() - self.t0


@dataclass
class ReaderContext:
    """What a strategy knows about its place in the job.

    ``readers`` is the communicator of all readers (``None`` for strategies where every rank
    reads for itself), ``reader_index``/``n_readers`` its rank and size.
    """

    db: Database
    readers: Any
    reader_index: int
    n_readers: int
    timeout: float = 60.0
    #: whether :meth:`ReadStrategy.advise_pages` asks the kernel for pages ahead of reads
    advise: bool = True


def spread(n: int, k: int) -> np.ndarray:
    """``min(k, n)`` positions among ``0 .. n - 1`` spread evenly, the first and the last
    included (``np.linspace``'s picks in integer arithmetic: a few microseconds less per
    call, once or twice per slot)."""
    k = min(k, n)
    return np.arange(k, dtype=np.int64) * (n - 1) // max(k - 1, 1)


#: the most :meth:`ReadStrategy.cached_sample` calls answered "warm" without sampling,
#: after samples in a row found the file in the page cache
WARM_TRUST_MAX = 8


class WarmFile:
    """How many calls to trust that a file is in the page cache without sampling it again.

    A sample costs about 100 us on the 2-core VM (16 ``mincore`` calls and the range
    checks), twice per slot for indexed: 0.07 us of CPU per CIFAR-like record, every slot
    of every epoch, on a file that stays warm. Each sample that finds the file warm
    doubles the calls answered without one (1, 2, 4, up to :data:`WARM_TRUST_MAX`); one
    that finds a page missing starts over, so a file partly or wholly out of the cache is
    sampled every time, and a file evicted while trusted is noticed within
    :data:`WARM_TRUST_MAX` calls (a few slots read without advice: slower, never wrong).
    """

    def __init__(self) -> None:
        self.trust = 0
        self.credit = 0

    def trusted(self) -> bool:
        """Whether this call is answered "warm" from the samples before (uses a credit)."""
        if self.credit:
            self.credit -= 1
            return True
        return False

    def sampled(self, warm: bool) -> None:
        """A sample found the file warm (every page sampled cached) or not."""
        self.trust = min(max(2 * self.trust, 1), WARM_TRUST_MAX) if warm else 0
        self.credit = self.trust


class ReadStrategy(ABC):
    """Base class of the read strategies (see :mod:`lmdbio.plan.strategies`)."""

    #: the registered name (``readers.strategy``, ``--strategy``)
    name: ClassVar[str]
    #: one line for the configuration reference (``docs/configuration.md``)
    summary: ClassVar[str]
    #: plan scheme: ``blocked`` (a node's records are contiguous), ``stride`` or ``shard``
    scheme: ClassVar[str] = "blocked"
    #: one reader per node sharing with the node's workers (True), or every rank reads its own
    shared: ClassVar[bool] = True
    #: can follow a shuffled epoch order (needs random access: the leaf directory)
    shuffles: ClassVar[bool] = False
    #: finds records by walking to them (LMM, the DM chains): with several batches per
    #: ring slot the epoch plan lays each node's records of a slot out as one run
    #: (:func:`~lmdbio.plan.epoch.plan_epoch`'s ``group``), fetched with one walk
    walks_slots: ClassVar[bool] = False
    #: asks the kernel for the pages it will read before reading them (:meth:`advise_pages`):
    #: the kernel's read-around is then off by default (``RunPlan.read_around``)
    advises: ClassVar[bool] = False
    #: readers hand a serialized cursor along the chain of readers (the DM strategies):
    #: the mapping must be symmetric (one address on every reader)
    chained: ClassVar[bool] = False

    def __init__(self, ctx: ReaderContext) -> None:
        self.ctx = ctx
        self.db = ctx.db
        self._advice_refused = False
        #: advice not sent because every page asked for was in the page cache already
        self.resident_skips = 0
        #: bytes one MADV_WILLNEED call reads of this file (found at the first advice)
        self._advice_limit: int | None = None
        #: how long :meth:`cached_sample` trusts its last samples of a warm file
        self._warm = WarmFile()
        #: whether ``mincore`` reports which pages of the file are cached: for a file this
        #: process neither owns nor may write it shows every page resident (Linux 5.2+),
        #: so its samples would always find it warm and nothing would ever be advised
        path = getattr(self.db, "path", None)
        self._residency_reported = path is None or residency_is_reported(path)

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Collective over the readers, once before the first epoch."""

    def begin_epoch(self, plan: EpochPlan) -> None:  # noqa: B027 - optional hook
        """Called by every reader at the start of each epoch."""

    def resume(self, plan: EpochPlan, iteration: int, first_id: int) -> None:  # noqa: B027
        """Prepare to start the current epoch at ``iteration`` instead of 0 (exact resume).

        ``first_id`` is the first record the chain's first reader reads in that iteration.
        Strategies that locate records from their ids need nothing.
        """

    @abstractmethod
    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats, iterations: int = 1) -> RecordRefs:
        """Locate records ``ids``: this reader's records of iterations ``iteration ..
        iteration + iterations - 1``, in order (several iterations only for a strategy
        that :attr:`walks_slots`, when the plan's slot group makes them one run)."""

    def read_ahead(self, plan: EpochPlan, iteration: int, ids: np.ndarray) -> None:  # noqa: B027
        """Called after this reader located its records for the iteration before
        ``iteration``, with ``ids`` it will fetch in ``iteration``: a strategy that can tell
        their pages now asks the kernel for them (:meth:`advise_pages`, asynchronous), so
        their I/O overlaps this iteration's gather and hand-off. No reads, no accounting,
        no communication; the default does nothing (the naive strategies, LMM and
        dm-serial read as the systems they reproduce do)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the strategy holds (collective where setup was)."""

    @property
    def advising(self) -> bool:
        """Whether :meth:`advise_pages` asks the kernel for anything: advice is on, there is
        no node cache (``--direct``: that cache reads its runs itself) and the kernel has
        not refused it."""
        return (self.ctx.advise and self.db.accounting.node_cache is None
                and not self._advice_refused)

    def advise_pages(self, starts: np.ndarray, counts: np.ndarray) -> bool:
        """Ask the kernel for database pages ``[starts[i], starts[i] + counts[i])`` now, as
        a few large asynchronous reads (``MADV_WILLNEED``, one call per merged run), so that
        the reads that follow wait on them instead of faulting pages in one at a time; a
        no-op unless :attr:`advising`, and when every page is in the page cache already
        (:func:`~lmdbio.io.prefetch.pages_resident`, one ``mincore``: a warm file costs no
        advice; counted in :attr:`resident_skips`). A file whose residency ``mincore``
        does not report (:func:`~lmdbio.io.prefetch.residency_is_reported`: another
        user's read-only data set) is advised as a cold one. Advisory: if the kernel
        refuses (a buffer that is not a file mapping), a warning is logged once and the
        reads fault pages in as before. Returns whether the kernel was asked."""
        if not self.advising or not np.any(counts):
            return False
        if self._advice_limit is None:
            self._advice_limit = readahead_limit(self.db.path)
        try:
            if self._residency_reported and \
                    pages_resident(self.db.buf, starts, counts, self.db.psize):
                self.resident_skips += 1
                return False
            advise_page_ranges(self.db.buf, starts, counts, self.db.psize,
                               max_bytes=self._advice_limit)
        except LmdbioError as exc:
            self._advice_refused = True
            log.warning("%s: prefetch advice refused, pages are faulted in as read: %s",
                        self.db.path, exc)
            return False
        return True

    def advise_values(self, refs: RecordRefs) -> None:
        """:meth:`advise_pages` for the overflow pages of ``refs``' values (inline values are
        in the leaves that locating them read), one run per value, merged; nothing when a
        sample of their first pages is in the page cache (:meth:`cached_sample`), or the
        samples before found the file warm (:meth:`trusts_warm`)."""
        if not self.advising:
            return
        big = np.flatnonzero(refs.ovf_pages > 0)
        # advise_pages samples again, other pages (over the runs): kept on purpose. Where
        # this sample found a page missing but that one finds all there (a file mostly in
        # the cache), the advice costs more than the few faults it saves: without the
        # second sample, 8-rank cold runs of indexed were ~15 % slower (sixteenth
        # session, docs/reading.md)
        if big.size and not self.trusts_warm() and \
                not self.cached_sample(refs.val_off[big] // self.db.psize):
            self.advise_pages(*refs.take(big).value_page_runs(self.db.psize))

    def trusts_warm(self) -> bool:
        """Whether the last samples of :meth:`cached_sample` found the file warm often
        enough in a row to skip this one (:class:`WarmFile`; counted in
        :attr:`resident_skips`)."""
        if self._warm.trusted():
            self.resident_skips += 1
            return True
        return False

    def cached_sample(self, pages: np.ndarray, samples: int = 16) -> bool:
        """Whether ``samples`` of database ``pages``, spread evenly over them, are all in
        the page cache (one ``mincore`` each; counted in :attr:`resident_skips`): the test
        :meth:`advise_pages` makes, asked before the runs of a slot's thousands of records
        are built for it (on a warm file, ~0.4 ms a slot of 5,120 CIFAR-like records that
        asked for nothing). False where ``mincore`` refuses, as there, and for a file
        whose residency it does not report (:attr:`_residency_reported`). Callers ask
        :meth:`trusts_warm` first: each answer here sets how long it trusts this one."""
        if not pages.size or not self._residency_reported:
            return False  # unknown: asked for as on a cold file
        pick = pages[spread(pages.size, samples)]
        try:
            cached = pages_resident(self.db.buf, pick, np.ones_like(pick), self.db.psize,
                                    samples=samples)
        except LmdbioError:
            return False
        self.resident_skips += cached
        self._warm.sampled(cached)
        return cached

    # helpers shared by the walking strategies -------------------------------------------
    def start_walk(self) -> None:
        """A cursor on the first record: where every walking reader starts an epoch."""
        self.cursor = self.db.cursor()
        self.cursor.first()
        self.position = 0

    def walk_to(self, cursor, index: int, current: int) -> int:
        """Walk ``cursor`` forward from record ``current`` to record ``index`` (mod N),
        record by record as an LMDB cursor does; returns the new position."""
        n = len(self.db)
        steps = (index - current) % n
        if steps:
            self.db.walk_collect(cursor, steps, wrap=True)
        return index


class WalkingStrategy(ReadStrategy):
    """A strategy whose readers find records by walking a cursor from the first record."""

    def begin_epoch(self, plan: EpochPlan) -> None:
        self.start_walk()
