"""LMDBIO-DM: readers chained across nodes hand a serialized cursor along.

Per iteration, reader ``r`` receives the start cursor from reader ``r-1``, walks its share
(branch and leaf pages only: values are located, not read), sends the cursor on, then reads
its records in parallel with the others. The last reader sends its end cursor back to the
first for the next iteration. With a symmetric mapping the cursor bytes are raw page
addresses, valid in every reader; otherwise page numbers.

``dm-spec`` adds speculative prefetch before the chain: every reader asks for the pages it
expects to need, all in parallel, and waits for them after passing the cursor on, so that
the serial walk and the gather run through memory. Every branch and leaf page and the free
pages are learnt at the first epoch (:meth:`KnownTreePages.learn_tree`). Where the leaves
place a reader's next share (every leaf but the last full, so a record's number gives its
leaf and slot; else a leaf directory the readers read collectively at the first epoch),
the prefetch is exact: the share's leaves, the branch pages its walk reads, and the values
those leaves name (:class:`FarScan`), parsed before the chain from leaves the walk reads
next anyway. Where nothing places it (``placement`` off, as the reference system runs),
the estimates: the paper's first guess (every record the size of the first one; for
inline values the file's pages per record), then corrected every iteration from the pages
the reader used (:mod:`lmdbio.plan.strategies.spec_estimate`): exact value pages for
records of one size, counted past the known tree pages, else the reference code's min/max
estimator with the changes measured in docs/reading.md, and a scan of the predicted leaves
for the values far from them. From the second epoch a share read before is prefetched as
the pages it needed then (:class:`KnownShare`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdbio.io import prefetch
from lmdbio.io.prefetch import merge_ranges
from lmdbio.kernel_cache import kernel_module
from lmdbio.lmdb import RecordRefs
from lmdbio.mpiutil import wait_with_timeout
from lmdbio.plan.epoch import EpochPlan
from lmdbio.plan.strategies.base import IterationStats, ReadStrategy, Timer
from lmdbio.plan.strategies.indexed import shared_leaf_directory
from lmdbio.plan.strategies.spec_estimate import (
    KnownTreePages,
    PageRangeEstimator,
    ValuePageEstimator,
    predict_regular,
)

_TAG = 7100
#: how a reader waits for its cursor (:func:`wait_for_cursor`): the longest sleep between
#: tests of the request, and the timer slack of those sleeps (how late the kernel may end
#: each; Linux's default is 50 us). The hand-off is on the chain's critical path, every
#: hop; measured with bench/pingpong.py (docs/findings/
#: scaling-calibration-2026-11-28.md) and modelled by lmdbio.scale.model.poll_delay
CURSOR_MAX_SLEEP_S = 1e-4
CURSOR_SLEEP_SLACK_S: float | None = 1e-6


def wait_for_cursor(request: Any, seconds: float, what: str) -> Any:
    """Wait for a cursor message without burning a core: test the request between sleeps
    of 50 us doubling to :data:`CURSOR_MAX_SLEEP_S`, each ending at most
    :data:`CURSOR_SLEEP_SLACK_S` late (:func:`~lmdbio.mpiutil.wait_with_timeout`, whose
    timeout and result this has)."""
    return wait_with_timeout(request, seconds, what, max_sleep=CURSOR_MAX_SLEEP_S,
                             sleep_slack=CURSOR_SLEEP_SLACK_S)


class DmSerial(ReadStrategy):
    """Serialized cursors handed from reader to reader (LMDBIO-DM without prefetch).

    With several batches per ring slot the plan makes each reader's records of a slot one
    run (:attr:`walks_slots`): one hand-off per slot instead of one per iteration. The
    message carries the index of the record the cursor stands on, so that a reader whose
    first record is further on (an epoch resumed inside a slot group) walks the gap."""

    name = "dm-serial"
    summary = "LMDBIO-DM cursor hand-off without speculative prefetch"
    chained = True
    walks_slots = True

    def begin_epoch(self, plan: EpochPlan) -> None:
        self.drain_cursor()
        self.cursor = self.db.cursor()
        if self.ctx.reader_index == 0:
            self.cursor.first()
        self.iterations = plan.iterations
        self.first_iteration = 0
        self._last: int | None = None
        #: the index of the record the cursor stands on (reader 0's, or as received)
        self.cursor_record = 0
        self._pending = getattr(self, "_pending", [])

    def drain_cursor(self) -> None:
        """Reader 0: take the cursor the last reader sent after the last iteration read when
        no iteration of this epoch will use it (the epoch was left early, or the session
        ends mid-epoch), so that it is never taken for the cursor of a later epoch or of a
        later session on the same communicator."""
        r, n = self.ctx.reader_index, self.ctx.n_readers
        last = getattr(self, "_last", None)
        if r != 0 or n == 1 or last is None or last == self.iterations - 1:
            return
        self._last = None
        req = self.ctx.readers.irecv(source=n - 1, tag=_TAG)
        wait_with_timeout(req, self.ctx.timeout, f"the cursor reader {n - 1} sent after "
                          f"iteration {last}")

    def resume(self, plan: EpochPlan, iteration: int, first_id: int) -> None:
        """Reader 0 positions the chain's cursor on ``first_id`` (the other readers get
        theirs along the chain as usual)."""
        self.first_iteration = iteration
        if self.ctx.reader_index != 0 or first_id == 0:
            return
        self.cursor.first()
        self.cursor_record = self.walk_to(self.cursor, int(first_id), 0)

    def receive_cursor(self, iteration: int, stats: IterationStats) -> None:
        """Take the chain's cursor and :attr:`cursor_record` from the reader before (not
        alone, and not reader 0 at the epoch's first iteration). With
        :meth:`send_cursor` and :meth:`drain_cursor`, the chain's transport: a subclass
        may carry the same messages otherwise (the scale model's trace replays the
        chain through a mailbox in one process, :mod:`lmdbio.scale.trace`)."""
        r, n = self.ctx.reader_index, self.ctx.n_readers
        if n == 1 or (r == 0 and iteration == self.first_iteration):
            return
        src = r - 1 if r > 0 else n - 1
        with Timer(stats, "wait_cursor"):
            req = self.ctx.readers.irecv(source=src, tag=_TAG)
            # short, punctual sleeps: the hand-off is on the critical path of every
            # iteration, and a waiting reader that sleeps up to the default 10 ms adds
            # that much per hop
            data = wait_for_cursor(req, self.ctx.timeout,
                                   f"cursor for iteration {iteration} from reader {src}")
        self.cursor_record = int.from_bytes(data[:8], "little")
        self.cursor = self.db.cursor_from_bytes(data[8:])

    def send_cursor(self, last_iteration: int) -> None:
        """Hand the cursor and :attr:`cursor_record` to the next reader, after this
        reader's walk up to ``last_iteration`` (not the last reader after the epoch's
        last iteration: the next epoch starts from the first record)."""
        r, n = self.ctx.reader_index, self.ctx.n_readers
        if n == 1 or (r == n - 1 and last_iteration == self.iterations - 1):
            return  # the next epoch starts from the first record again
        msg = self.cursor_record.to_bytes(8, "little") + self.cursor.to_bytes()
        req = self.ctx.readers.isend(msg, dest=(r + 1) % n, tag=_TAG)
        self._pending.append(req)
        self._pending = [q for q in self._pending if not q.Test()]

    def walk_share(self, iteration: int, ids: np.ndarray, stats: IterationStats,
                   iterations: int = 1) -> RecordRefs:
        """Receive the cursor, walk to and over this reader's records ``ids`` (one run of
        the order), send the cursor on; their references.

        The next reader waits only for the cursor: the walk over the share moves it leaf
        by leaf from the leaves' record counts (:meth:`Database.walk_skip`, the same leaf
        and branch pages an LMDB cursor reads), and the records' references are collected
        from a copy of the start after the cursor has gone on, off the chain's critical
        path (measured in docs/reading.md)."""
        self.receive_cursor(iteration, stats)
        self._before_walk(ids, stats)
        start = None
        with Timer(stats, "walk"):
            if ids.size:
                # past records before this reader's share (an epoch resumed in a slot group)
                self.walk_to(self.cursor, int(ids[0]), self.cursor_record)
                start = self.cursor.copy()
                self.db.walk_skip(self.cursor, ids.size, wrap=True)
                self.cursor_record = (int(ids[-1]) + 1) % len(self.db)
        last = iteration + iterations - 1
        self.send_cursor(last)
        self._last = last
        if start is None:
            return RecordRefs.empty(0)
        with Timer(stats, "walk"):
            refs, _, _ = self.db.walk_collect(start, ids.size, wrap=True)
        return refs

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats, iterations: int = 1) -> RecordRefs:
        return self.walk_share(iteration, ids, stats, iterations)

    def _before_walk(self, ids: np.ndarray, stats: IterationStats) -> None:
        """Called with the cursor received, before the walk over ``ids``: nothing here."""

    def close(self) -> None:
        self.drain_cursor()
        if getattr(self, "_pending", None):
            wait_with_timeout(self._pending, self.ctx.timeout, "cursor sends")


class DmSpec(DmSerial):
    """LMDBIO-DM with speculative parallel prefetch of each reader's pages."""

    name = "dm-spec"
    summary = ("LMDBIO-DM: cursor hand-off between readers with speculative parallel "
               "prefetch of the pages each reader expects to need (index-free, file order)")
    advises = True
    #: place each share in the leaves (their counts, or the leaf directory where they
    #: vary) and ask for exactly its pages; False: the estimates alone, the reference
    #: system's way (kept to measure it and as the fallback, docs/reading.md)
    placement = True

    def begin_epoch(self, plan: EpochPlan) -> None:
        super().begin_epoch(plan)
        # the tree pages seen stay known across epochs: the snapshot does not change
        self.tree = getattr(self, "tree", None) or KnownTreePages()
        self._reset_estimates()
        self._expect: int | None = None
        self._after = 0  # the record after this reader's last share
        self._blind = True  # whether the last prediction was the first guess
        #: read_ahead's (ids, starts, lengths, cut, scans, asked), for the fetch after it
        self._advised: tuple[np.ndarray, np.ndarray, np.ndarray, int, list[FarScan],
                             bool] | None = None
        self._scratch: np.ndarray | None = None
        self.db.accounting.enable()
        # the first record, from the pages on the way to it (a record table would read
        # every leaf header: on an inline database the whole file, on every reader)
        first = self.db.walk_collect(self.db.cursor(), 1)[0] if len(self.db) else None
        first_size = int(first.val_len[0]) if first is not None and len(first) else 1
        psize = self.db.psize
        self.pages_per_record = max(1, -(-(first_size + self.db.layout.header_size) // psize))
        # overflow values: the first guess counts past the tree pages (every one known
        # from the first epoch on, below); inline values live in the leaves
        # (only when every value fills as many overflow pages as the first: the tree's
        # overflow page count says so; mixed sizes, some inline, go by the file's density)
        ovf = int(first.ovf_pages[0]) if first is not None and len(first) else 0
        meta = self.db.db
        self._guess_past_tree = ovf > 0 and meta.overflow_pages == ovf * meta.entries
        #: every value in the leaves (MNIST-like): a share's pages are its leaves
        self._inline = meta.overflow_pages == 0 and meta.entries > 0
        #: records on every leaf but the last, 0 when they vary (:meth:`_full_count`)
        self._full: int | None = getattr(self, "_full", None)
        if not self.tree.complete:
            # every leaf known from the start: the estimates count past the leaves under
            # other readers' branch pages too, and name leaves anywhere in the tree (the
            # branch pages read once: a leaves' parent per ~150 leaves)
            self.tree.learn_tree(self.db)
        #: ``first[j]``: the index of leaf ``j``'s first record (key order), from the leaf
        #: directory where the leaves' counts vary (:meth:`_acquire_directory`), or None
        self._leaf_first: np.ndarray | None = getattr(self, "_leaf_first", None)
        if self.placement and not getattr(self, "_directory_tried", False) \
                and self._counts_vary():
            self._directory_tried = True  # once: the snapshot does not change
            self._acquire_directory()
        # inline values: the file's pages per record (leaves, with the branch and free
        # pages between them), and the last page and record a walk ended on this epoch
        self._density = max(self.db.meta.last_pg - 1, 1) / max(len(self.db), 1)
        self._anchor: tuple[int, int] | None = None
        #: the shares of earlier epochs by first record: an unshuffled epoch reads the same
        #: records in the same order, so from the second epoch on a share's prefetch is
        #: exactly the pages it needed the first time, or the first part of a longer one's
        #: (the run's last slot stops early); the snapshot does not change
        self._known: dict[int, KnownShare] = getattr(self, "_known", None) or {}

    def _full_count(self) -> int | None:
        """The records every leaf but the last holds when the leaves look full but the last
        (a file written in key order, keys of one length): the first leaf's count, which
        the last leaf's count and the meta page's record count must add up with
        (``full * (leaves - 1) + last == records``: a leaf short of it needs another one
        over it) and two leaves between must hold too; None otherwise. Reads four leaf
        headers once (marked in the accounting: they are part of the epoch's setup
        pages). The same answer on every reader of the snapshot. A share is then placed
        by counting (:meth:`_placement`), checked against the reader's own cursor as it
        goes."""
        if self._full is None:
            leaves = self.tree.ordered_leaves
            n, total = leaves.size, self.db.db.entries
            picks = sorted({0, n // 3, 2 * n // 3, n - 1}) if n else []
            counts = {k: self.db.page_entries(int(leaves[k])) for k in picks}
            acc = self.db.accounting
            if acc.enabled and picks:
                acc.touched[leaves[picks]] = 1
            full = counts.get(0, 0)
            fits = full >= 1 and full * (n - 1) + counts.get(n - 1, 0) == total
            fits = fits and all(c == full for k, c in counts.items() if k < n - 1)
            self._full = full if fits else 0
        return self._full or None

    def _counts_vary(self) -> bool:
        """Whether the leaves' record counts cannot place a share (:meth:`_full_count`):
        keys of several lengths, deletes, inserts out of key order."""
        return bool(self.tree.ordered_leaves.size) and self._full_count() is None

    def _acquire_directory(self) -> None:
        """Collective over the readers (every one decides alike, from the snapshot): the
        leaf directory, where counting cannot place a share (:meth:`_counts_vary`): each
        reader reads the headers of ``1 / readers`` of the leaves once (or none, from the
        sidecar :mod:`.indexed` keeps per snapshot), and every share's leaves and first
        slot are exact from then on, whatever the leaves hold. Before it, on such files the
        estimate missed a value page at a share's ends where a commit's moved values
        shifted it by a page, and for values of several sizes fell back to the min/max
        range (docs/reading.md)."""
        leaves, first, _ = shared_leaf_directory(
            self.db, self.ctx.readers, self.ctx.reader_index, self.ctx.n_readers,
            self.ctx.timeout, leaves=self.tree.ordered_leaves)
        self._leaf_first = first if np.array_equal(leaves, self.tree.ordered_leaves) \
            else None

    def _leaf_starts(self) -> np.ndarray | None:
        """``starts[j]``: the index of leaf ``j``'s first record (key order), ``starts[-1]``
        the total: the leaf directory read (:meth:`_acquire_directory`), or where the
        leaves are full but the last the same by counting (:meth:`_full_count`, kept once
        made); None when neither."""
        if self._leaf_first is not None:
            return self._leaf_first
        counted = getattr(self, "_counted_starts", None)
        if counted is None and self.tree.ordered_leaves.size and self._full_count():
            n, total = self.tree.ordered_leaves.size, self.db.db.entries
            counted = np.minimum(np.arange(n + 1, dtype=np.int64) * self._full_count(),
                                 total)
            self._counted_starts = counted
        return counted

    @staticmethod
    def _place(first: np.ndarray, first_id: int, count: int
               ) -> tuple[int, int, int] | None:
        """``(lo, hi, slot)`` from ``first`` (:meth:`_leaf_starts`): leaves ``lo .. hi - 1``
        (key order) hold records ``first_id .. first_id + count - 1``, the first at
        ``slot`` on leaf ``lo``; None for no record of the file."""
        if count < 1 or not 0 <= first_id < int(first[-1]):
            return None
        lo = int(np.searchsorted(first, first_id, side="right")) - 1
        hi = min(int(np.searchsorted(first, first_id + count - 1, side="right")),
                 first.shape[0] - 1)
        return lo, hi, first_id - int(first[lo])

    def _reset_estimates(self) -> None:
        self.estimator = PageRangeEstimator()
        self.value_estimator = ValuePageEstimator(self.tree)

    def _guess(self, first_id: int, count: int) -> list[tuple[int, int]]:
        """The paper's first guess: every record is the size of the first one (so record
        ``first_id`` starts ``first_id`` records' worth of pages after the meta pages), in
        value coordinates for overflow values (the tree pages known are skipped: exact on a
        file written in one commit). For inline values the leaves in key order at the
        file's records per leaf (:meth:`_leaf_guess`), or before the tree is learnt (mixed
        sizes) :meth:`_inline_guess`."""
        size = self.pages_per_record
        if self._guess_past_tree:
            return [self.tree.value_range(2 + first_id * size, count * size)]
        if self._inline and self.tree.ordered_leaves.size:
            return self._leaf_guess(first_id, count)
        return [self._inline_guess(first_id, count)]

    def _leaf_guess(self, first_id: int, count: int) -> list[tuple[int, int]]:
        """Inline values, every leaf known in key order: the leaves records ``first_id ..
        first_id + count - 1`` are on if every leaf holds the file's average (exact when
        the leaves are full but the last, as a file written in key order has them; off by
        a leaf at most otherwise, as far as the counts vary)."""
        leaves = self.tree.ordered_leaves
        per_leaf = max(self.db.db.entries / max(leaves.size, 1), 1.0)
        lo = min(int(first_id / per_leaf), leaves.size - 1)
        hi = min(int((first_id + count - 1) / per_leaf) + 1, leaves.size)
        return [(int(pg), 1) for pg in leaves[lo:max(hi, lo + 1)].tolist()]

    def _inline_guess(self, first_id: int, count: int) -> tuple[int, int]:
        """The first guess for inline values, several to a leaf page, where "the size of
        the first record" (a page each) is 3-5 times too long and as far off in position:
        the file's pages per record from the record the last walk ended on (from the meta
        pages at an epoch's start), with 3 % slack at each end. Near on files written in
        key order; the leaves the walk reads are also asked for after a blind guess
        (:meth:`_before_walk`), whatever the layout."""
        page, record = self._anchor if self._anchor is not None and \
            first_id >= self._anchor[1] else (2, 0)
        span = count * self._density
        slack = int(0.03 * span) + 1
        start = page + int((first_id - record) * self._density)
        return max(2, start - slack), int(span) + 1 + 2 * slack

    def _predict(self, ids: np.ndarray, cut: int, regular: bool
                 ) -> tuple[list[tuple[int, int]], list[FarScan]]:
        """The page ranges to prefetch for ``ids`` (``cut``: where they wrap around), and
        for overflow values, where to look for the values the ranges do not name
        (:class:`FarScan`, one per run of records; none for inline values, whose leaves
        are the ranges). Sets :attr:`_blind` from the first run."""
        first = int(ids[0]) if ids.size else 0
        ranges, scans, self._blind = self._predict_run(first, cut, regular)
        if cut < ids.size:  # the records after the wrap-around start again at the front
            # (the walk wraps to the first record: down from the root)
            more, extra, _ = self._predict_run(int(ids[cut]), ids.size - cut, False,
                                               from_root=True)
            ranges += more
            scans += extra
        return ranges, scans

    def _predict_run(self, first: int, count: int, regular: bool, from_root: bool = False
                     ) -> tuple[list[tuple[int, int]], list[FarScan], bool]:
        """``(ranges, scans, blind)`` for records ``first .. first + count - 1``
        (``regular``: they continue this reader's last share; ``from_root``: the walk
        reaches them down from the root, as after a wrap-around; ``blind``: nothing
        observed to go by, the first guess).

        Where the leaves place the run (a leaf directory, or leaves full but the last: the
        first record's leaf and slot known), its leaves and the branch pages the walk
        moves into are the ranges, and the values those leaves name are the scan's: exact
        on any layout, values written out of key order or moved by later commits
        included, with no estimate at all. Otherwise the estimates: the exact value pages
        or the min/max range (inline values: the leaves at the average count), and a scan
        for the values far from them."""
        placed = self._placement(first, count, regular)
        if placed is not None:
            lo, hi, slot = placed
            leaves, branches = self._walk_pages(first, count, lo, hi, from_root)
            ranges = [(int(pg), 1) for pg in leaves.tolist() + branches]
            scans = [] if self._inline else \
                [FarScan(self.tree.ordered_leaves[lo:hi], 0, 0, 1, count, False, slot)]
            return ranges, scans, False
        if not regular:
            return self._guess(first, count), [], True
        leaves, branches = self._share_leaves(first, count)
        ranges = predict_regular(self.value_estimator, self.estimator, self.cursor.stack,
                                 first, count)
        if self._inline and leaves.size:
            # values in the leaves: the share's leaves, named in key order, and the branch
            # pages the walk moves into, rather than the min/max range of the file's pages
            # (the cursor's own branch pages were read by the walk that left it there)
            ranges = [(int(pg), 1) for pg in leaves.tolist() + branches]
        scans = []
        if ranges is not None and self._guess_past_tree:
            start, length = ranges[0]  # the values' main range, exact or min/max
            exact = self.value_estimator.predict(first, count) is not None
            scans = [FarScan(leaves, start, start + length, self.pages_per_record, count,
                             exact, None)]
            ranges += [(int(pg), 1) for pg in leaves.tolist() + branches]
        if ranges is None:
            return self._guess(first, count), [], True
        return ranges, scans, False

    def _placement(self, first_id: int, count: int, regular: bool
                   ) -> tuple[int, int, int] | None:
        """``(lo, hi, slot)``: leaves ``lo .. hi - 1`` (key order) hold records ``first_id ..
        first_id + count - 1``, the first at ``slot`` on leaf ``lo``: from the leaf
        directory, or by counting where the leaves are full but the last
        (:meth:`_full_count`; for a share that continues this reader's last one
        (``regular``) only while its cursor agrees: the record it stands on is where the
        count puts it). None when neither places them."""
        starts = self._leaf_starts() if self.placement else None
        if starts is None:
            return None
        if regular and self._leaf_first is None:  # counted, not read: the cursor agrees?
            stack, ordered = self.cursor.stack, self.tree.ordered_leaves
            if len(stack) < 2 or first_id < self.cursor_record:
                return None
            leaf, slot = (int(x) for x in stack[-1])
            k = int(np.searchsorted(starts, self.cursor_record, side="right")) - 1
            if k >= ordered.size or int(ordered[k]) != leaf \
                    or self.cursor_record - starts[k] != slot:
                return None
        return self._place(starts, first_id, count)

    def _walk_pages(self, first_id: int, count: int, lo: int, hi: int,
                    from_root: bool = False) -> tuple[np.ndarray, list[int]]:
        """``(leaves, branches)``: the leaf and branch pages the walk over records
        ``first_id .. first_id + count - 1``, placed on leaves ``lo .. hi - 1``, reads: those
        leaves, the next one when the walk ends on a leaf's last record (the cursor moves
        on to the next record), and the branch pages it moves through
        (:meth:`KnownTreePages.walk_branches`; the whole path to the first leaf when the
        cursor comes from another reader or ``from_root``)."""
        ordered = self.tree.ordered_leaves
        after = first_id + count
        starts = self._leaf_starts()
        ends_leaf = starts is not None and hi < ordered.size and after == int(starts[hi])
        end = hi if ends_leaf else hi - 1
        leaves = ordered[lo:end + 1]
        branches = self.tree.walk_branches(lo, end, self._receives() and not from_root)
        if from_root:  # wrapped around: the walk went down from the root to leaf lo
            branches = sorted(set(branches) | set(self.tree.descent(lo)))
        if after >= self.db.db.entries and ordered.size:
            # the share ends on the file's last record: the walk moves on past it, around
            # to the first record, down from the root
            leaves = np.union1d(leaves, ordered[:1])
            branches = sorted(set(branches) | set(self.tree.descent(0)))
        return leaves, branches

    def _receives(self) -> bool:
        """Whether this reader's next walk starts from a cursor another reader sent (its
        whole path is then read again: :meth:`KnownTreePages.walk_branches`), as
        :meth:`DmSerial.receive_cursor` decides: not alone, and not reader 0 at the first
        iteration it reads this epoch."""
        r, n = self.ctx.reader_index, self.ctx.n_readers
        return n > 1 and not (r == 0 and self._last is None)

    def _share_leaves(self, first_id: int, count: int) -> tuple[np.ndarray, list[int]]:
        """``(leaves, branches)``: the leaf pages the walk over records ``first_id ..
        first_id + count - 1`` probably reads, where the leaves' counts do not place them
        (:meth:`_placement`), and the branch pages it moves into.

        From where this reader's cursor stopped (record :attr:`cursor_record`), the leaves
        as many on in key order (:meth:`KnownTreePages.learn_tree`) as the records between
        fill, at the larger of the cursor leaf's record count and the file's average. No
        margin: a leaf more at each end was 3 % of the pages needed in redundant pages on
        64-record shares.

        For overflow values the value ranges hold the leaves allocated among the values,
        but a commit copies the leaf being filled wherever the free list has room (Caffe
        commits every 1,000 records): a share that crosses a commit walks a leaf far from
        its values, one missed page per reader and slot otherwise (docs/reading.md). For
        inline values the leaves are the values' pages (:meth:`_predict`)."""
        none = (np.empty(0, np.int64), [])
        stack, ordered = self.cursor.stack, self.tree.ordered_leaves
        if len(stack) < 2 or count < 1 or first_id < self.cursor_record:
            return none
        leaf, slot = (int(x) for x in stack[-1])
        at = np.flatnonzero(ordered == leaf)
        if not at.size:
            return none
        meta = self.db.db
        # records per leaf: the cursor's leaf's, or the file's average if that is more
        per_leaf = max(meta.entries / max(meta.leaf_pages, 1), self.db.page_entries(leaf), 1.0)
        base = int(at[0])
        ahead = slot - self.cursor_record + first_id  # records from the cursor leaf's first on
        lo = min(base + int(ahead / per_leaf), ordered.size)
        hi = min(base + int((ahead + count - 1) / per_leaf) + 1, ordered.size)
        parent = int(stack[-2][0])
        branches = [pg for pg in np.unique(self.tree.leaf_parents[lo:hi]).tolist()
                    if pg != parent]
        return ordered[lo:hi], branches

    def _before_walk(self, ids: np.ndarray, stats: IterationStats) -> None:
        """When this fetch prefetched a blind first guess (an epoch's first slot, the
        records after a wrap-around or a resume, where the guess can be hundreds of pages
        off on inline values), ask for the leaf pages the walk is about to read: the
        children of the cursor's parent branch page from its leaf on, as many as the
        share fills at the database's average records per leaf (plus a quarter), as a
        few large reads instead of one fault per leaf on the chain's critical path."""
        stack = self.cursor.stack
        if not (self._blind and ids.size and self.advising and len(stack) >= 2):
            return
        with Timer(stats, "prefetch"):
            parent, slot = stack[-2]
            meta = self.db.db
            per_leaf = max(meta.entries / max(meta.leaf_pages, 1), 1.0)
            want = int(ids.size / per_leaf * 1.25) + 2
            leaves = self.tree.children(self.db, int(parent))[int(slot):int(slot) + want]
            self.advise_pages(leaves, np.ones_like(leaves))

    def read_ahead(self, plan: EpochPlan, iteration: int, ids: np.ndarray) -> None:
        """Ask for the pages the next iteration's estimate names (the same estimate that
        iteration's :meth:`fetch` will make and touch, from the same state), while this
        one is gathered and handed off. Only when the next records continue these (not
        across a wrap-around or a resume: the fetch then starts a new estimate)."""
        if self._continues(ids) and self.advising:
            starts, lengths, cut, scans = self._ranges(ids)
            self._advised = (ids, starts, lengths, cut, scans,
                             self.advise_pages(starts, lengths))

    def _read_ahead_for(self, ids: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, int, list[FarScan], bool] | None:
        """``(starts, lengths, cut, scans, asked)`` of :meth:`read_ahead` when it was called with
        these records (forgotten either way): the fetch that follows it computes the same
        estimate from the same state, so it takes that one, and whether the kernel was
        asked for it (True) or every page was in the page cache (False); None otherwise."""
        advised, self._advised = self._advised, None
        if advised is None or not np.array_equal(advised[0], ids):
            return None
        return advised[1:]

    def _continues(self, ids: np.ndarray) -> bool:
        """Whether records ``ids`` continue this reader's last share, so that the estimates
        extrapolate to them: they start after it and no later than where shares of the
        same size would (an epoch's last slot is shorter; a wrap-around or a resume
        starts elsewhere)."""
        return ids.size > 0 and self._expect is not None and \
            self._after <= int(ids[0]) <= self._expect

    def _ranges(self, ids: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, int, list[FarScan]]:
        """``(starts, lengths, cut, scans)``: the prefetch ranges for ``ids``, clipped to the
        file, where ``ids`` wrap around (``ids.size`` if they do not), and where to look
        for the values the ranges do not name (:meth:`_predict`; none for a share known
        from an earlier epoch, whose pages are exact)."""
        npages = self.db.file_size // self.db.psize
        wrap = np.flatnonzero(np.diff(ids) < 0)
        cut = int(wrap[0]) + 1 if wrap.size else ids.size
        known = self._known.get(int(ids[0])) if ids.size else None
        # read in an earlier epoch: the whole share's pages are exact; the head of one (a
        # run stopping inside a slot group) is placed like any share where the leaves
        # place it, since the walk's pages past its head are known only for the whole
        placed = self.placement and self._leaf_starts() is not None
        if known is not None and (ids.size == known.size
                                  or (ids.size < known.size and not placed)):
            self._blind = False
            return (*known.page_runs(ids.size), cut, [])
        regular = self._continues(ids)
        guesses, scans = self._predict(ids, cut, regular)
        starts = np.array([min(max(g[0], 0), npages) for g in guesses], np.int64)
        lengths = np.array([max(0, min(g[1], npages - st)) for g, st in
                            zip(guesses, starts.tolist(), strict=True)], np.int64)
        return starts, lengths, cut, scans

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats, iterations: int = 1) -> RecordRefs:
        """Prefetch the pages of ``ids`` (estimated, or known from an earlier epoch), walk
        the share, then learn from what the walk read (see :meth:`_observe`)."""
        # the estimates extrapolate from the previous iterations only while the records
        # continue them (not across the wrap-around of a padded last batch, or a resume)
        if not self._continues(ids):
            self._reset_estimates()
        ahead = self._read_ahead_for(ids)
        if ahead is not None:
            starts, lengths, cut, scans, asked = ahead
        else:
            starts, lengths, cut, scans, asked = *self._ranges(ids), None
        scanned = np.concatenate([sc.leaves for sc in scans]) if scans else None
        if scanned is not None and scanned.size:
            starts, lengths, asked = self._add_far_values(scans, stats, starts, lengths, asked)
        if ids.size:
            self._expect = int(ids[-1]) + 1 + (self.ctx.n_readers - 1) * ids.size
            self._after = int(ids[-1]) + 1
        # with advice the reads are asked for before the chain and waited for after the
        # cursor has gone on: the chain waits only for the leaf pages its walk reads, not
        # for this reader's whole prefetch (without advice the touch is the read, before
        # the chain as in the paper)
        wait_after = self.advising and self.db.accounting.node_cache is None
        asked = self._prefetch(starts, lengths, asked, stats, wait_after)
        refs = self.walk_share(iteration, ids, stats, iterations)
        # nothing to wait for when every page was in the page cache (a warm file): the
        # walk and the workers map them as they read
        if wait_after and (asked or not self.advising) and lengths.any():
            # (not advising any more: the kernel refused the advice just now)
            with Timer(stats, "prefetch"):
                prefetch.touch_page_ranges(self.db.buf, starts, lengths, self.db.psize)
        if not len(refs):
            return refs
        self._observe(refs, ids, cut, starts, lengths, asked, scanned, stats)
        return refs

    def _add_far_values(self, scans: list[FarScan], stats: IterationStats,
                        starts: np.ndarray, lengths: np.ndarray, asked: bool | None
                        ) -> tuple[np.ndarray, np.ndarray, bool | None]:
        """The prefetch ranges with the share's values the ranges do not name.

        All of them where the leaves place the share; else those stored in pages freed by
        earlier commits. They are named by the share's leaves, which the walk reads next
        anyway: asked for now, before the chain, with the rest. The leaves are counted as
        prefetched, not walked: one the walk then does not read is a redundant page (marked
        read after the observation). Returns ``(starts, lengths, asked)``.
        """
        acc = self.db.accounting
        with Timer(stats, "prefetch"):
            was, acc.enabled = acc.enabled, False
            try:
                found = [sc.missing(*self.db.leaf_value_runs(sc.leaves))
                         for sc in scans if sc.leaves.size]
            finally:
                acc.enabled = was
            far = (np.concatenate([f[0] for f in found]),
                   np.concatenate([f[1] for f in found]))
            if far[0].size:
                if asked is not None:  # the estimate was asked for in read-ahead
                    asked = self.advise_pages(*far) or asked
                starts = np.concatenate([starts, far[0]])
                lengths = np.concatenate([lengths, far[1]])
        return starts, lengths, asked

    def _prefetch(self, starts: np.ndarray, lengths: np.ndarray, asked: bool | None,
                  stats: IterationStats, wait_after: bool) -> bool | None:
        """Read the prefetch ranges before the chain: O_DIRECT into the node cache where
        there is one, else a few large reads asked for (unless asked already) and, unless
        the wait comes after the walk (``wait_after``), every page mapped by touching.
        Returns what the advice answered (``asked``)."""
        with Timer(stats, "prefetch"):
            node_cache = self.db.accounting.node_cache
            if lengths.any() and node_cache is not None:
                node_cache.load_runs(starts, lengths)  # O_DIRECT into the node
            elif lengths.any():  # a few large reads, then every page mapped by touching
                if asked is None:
                    asked = self.advise_pages(starts, lengths)
                if not wait_after:
                    prefetch.touch_page_ranges(self.db.buf, starts, lengths, self.db.psize)
        return asked

    def _observe(self, refs: RecordRefs, ids: np.ndarray, cut: int, starts: np.ndarray,
                 lengths: np.ndarray, asked: bool | None, scanned: np.ndarray | None,
                 stats: IterationStats) -> None:
        """Learn from the walk: feed the estimators the run the values lie in, ask for the
        values the estimate missed, remember the share's exact pages for the next epoch,
        and count prefetched, missed and redundant pages in ``stats``.

        Needed are the pages of the values (read in parallel after the chain) and the leaf
        and branch pages the walk read (the bitmap holds just those: the session resets it
        per iteration and prefetching does not mark it); one compiled pass.
        """
        observe_iteration = kernel_module("lmdbio.plan.strategies").observe_iteration

        touched = self.db.accounting.touched
        if self._scratch is None or self._scratch.shape[0] != touched.shape[0]:
            self._scratch = np.zeros(touched.shape[0], np.uint8)
        run_start, run_end, _, missed, missed_walk, redundant, prefetched = \
            observe_iteration(refs.val_off, refs.val_len, refs.leaf_pg, self.db.psize,
                              touched, self._scratch, starts, lengths)
        run = (int(run_start), int(run_end)) if run_start >= 0 else None
        if run is not None:
            self.estimator.observe(*run)
            if cut == ids.size:  # record ids[-1] on the run's last page
                self._anchor = (run[1] - 1, int(ids[-1]))
        self.value_estimator.observe(int(ids[0]), refs.head(cut), self.db.psize, run)
        if missed and self.advising and asked is not False:
            # values the estimate missed: asked for now, as a few large reads before the
            # gather, rather than faulted in one by one (not when the estimate's pages were
            # all in the page cache: the file is warm, the values next to them too)
            with Timer(stats, "prefetch"):
                self.advise_values(refs.take(_outside(refs, self.db.psize, starts, lengths)))
        known = self._known.get(int(ids[0]))
        if (known is None or known.size < ids.size) and self.first_iteration == 0:
            # (not after a resume, whose walk reads more than the share's pages)
            self._known[int(ids[0])] = KnownShare(refs, touched, self.db.psize)
        if scanned is not None and scanned.size and self.db.accounting.enabled:
            # read by the scan, not the walk: in the rank's pages touched, but neither in
            # the observation nor in the pages a known share asks for next epoch
            touched[scanned] = 1
        stats.prefetched_pages = int(prefetched)
        stats.missed_pages = int(missed)
        stats.missed_walk_pages = int(missed_walk)
        stats.redundant_pages = int(redundant)


@dataclass(frozen=True)
class FarScan:
    """Where to look for a share's values that its predicted range misses: its predicted
    ``leaves`` (key order), the predicted range ``[start, stop)`` of its values
    (``per_record`` overflow pages each), its ``count`` records, whether the range is the
    exact value-page estimate (``exact``; else min/max), and where its first record is on
    the first leaf (``first_slot``; None when the leaves' record counts do not tell).

    LMDB reuses pages freed by earlier commits (Caffe commits every 1,000 records): a
    later commit stores a value there, far from its neighbours, and the page it would have
    had goes to the next record, so the values after it shift by a page. No estimate from
    earlier iterations can know either; the share's leaf nodes, which its walk reads next
    anyway, name every value's pages."""

    leaves: np.ndarray
    start: int
    stop: int
    per_record: int
    count: int
    exact: bool = False
    first_slot: int | None = None

    def missing(self, first: np.ndarray, counts: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """Of the value runs ``(first, counts)`` of the records on :attr:`leaves` (one per
        record, key order; 0 pages for an inline value), the share's overflow runs that are
        not inside ``[start, stop)``.

        The share is the :attr:`count` records from :attr:`first_slot` when the leaves'
        counts place it (exact: the other readers' records in between do not matter);
        else, with an exact estimate, from the record whose value starts at
        :attr:`start` (off by whole records when values moved among other readers'
        records between two shares: no worse than the range alone). Otherwise, and when no
        value starts there, only the values far from the rest (:meth:`far`)."""
        at = self.first_slot
        if at is None and self.exact:
            hit = np.flatnonzero((first == self.start) & (counts > 0))
            at = int(hit[0]) if hit.size else None
        if at is None:
            return self.far(first, counts)
        f, c = first[at:at + self.count], counts[at:at + self.count]
        out = (c > 0) & ((f < self.start) | (f + c > self.stop))
        return f[out], c[out]

    def far(self, first: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of the value runs ``(first, counts)`` of the records on :attr:`leaves` (key
        order; inline values left out), those of the share stored out of sequence.

        In sequence are the values in the run around the predicted range: the values'
        first pages sorted, cut where consecutive ones lie further apart than two records
        and a few tree pages (the leaves and a commit's copies LMDB puts between values),
        and the pieces that meet ``[start, stop)`` joined; the other records of the
        share's first and last leaves (other readers') lie there too. A value outside it
        is the share's when a neighbour in key order (the nearest record before or after
        it whose value is in sequence) has its value in ``[start, stop)``: a boundary
        leaf's out-of-sequence value of another reader's record is not asked for. Empty
        when no piece meets the range (the prediction is off: no basis to tell)."""
        big = counts > 0
        first, counts = first[big], counts[big]
        none = (first[:0], counts[:0])
        if not first.size:
            return none
        pages = np.sort(first)
        cuts = np.flatnonzero(np.diff(pages) > 2 * self.per_record + 8)
        lo = np.concatenate(([pages[0]], pages[cuts + 1]))
        hi = np.concatenate((pages[cuts], [pages[-1]])) + self.per_record
        meet = np.flatnonzero((lo < self.stop) & (hi > self.start))
        if not meet.size:
            return none
        outside = (first < lo[meet[0]]) | (first >= hi[meet[-1]])
        if not outside.any():
            return none
        mine = (first >= self.start) & (first < self.stop) & ~outside
        # for every record, whether the nearest in-sequence record before (after) it is
        # the share's: the last (next) in-sequence index carried forward (backward)
        idx = np.arange(first.size)
        before = np.maximum.accumulate(np.where(~outside, idx, -1))
        after = np.minimum.accumulate(np.where(~outside, idx, first.size)[::-1])[::-1]
        mine_ext = np.append(mine, False)
        near = mine_ext[np.where(before >= 0, before, first.size)] | mine_ext[after]
        keep = outside & near
        return first[keep], counts[keep]


class KnownShare:
    """The pages a reader's share of one slot needed: where its records' values are, their
    leaf pages, and the pages its walk read (a share is one run of the unshuffled order,
    named by its first record)."""

    def __init__(self, refs: RecordRefs, walked: np.ndarray, psize: int) -> None:
        self.size = len(refs)
        self.psize = psize
        self.refs = refs.take(np.arange(self.size))  # a copy: the session may reuse refs
        self.walked = np.flatnonzero(walked).astype(np.int64)
        #: walked pages that hold none of the records: branch pages, and the leaf the
        #: cursor moved on to after the last record
        self.other = np.setdiff1d(self.walked, self.refs.leaf_pg)
        self._runs: tuple[np.ndarray, np.ndarray] | None = None

    def page_runs(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` as sorted disjoint runs: the pages the first ``count``
        records of the share need: their values' pages (an empty value stands for its
        first page), their leaves, and the walk's other pages; with ``count`` below the
        share's size, also the leaf of the next record, which the walk moves on to."""
        if count == self.size and self._runs is not None:
            return self._runs
        first, counts = self.refs.head(count).value_page_runs(self.psize)
        if count == self.size:
            pages = self.walked
        else:
            pages = np.concatenate([self.refs.leaf_pg[:count + 1], self.other])
        starts, stops = merge_ranges(np.concatenate([first, pages]),
                                      np.concatenate([first + counts, pages + 1]))
        runs = (starts, stops - starts)
        if count == self.size:
            self._runs = runs
        return runs


def _outside(refs: RecordRefs, psize: int, starts: np.ndarray, lengths: np.ndarray
             ) -> np.ndarray:
    """Indices of the records whose value pages are not all inside the page ranges
    ``[starts[j], starts[j] + lengths[j])`` (their union: the values a prefetch missed, or
    part of); one compiled pass (:func:`.kernels.values_outside`)."""
    values_outside = kernel_module("lmdbio.plan.strategies").values_outside

    starts = np.asarray(starts, np.int64)
    run_starts, run_stops = merge_ranges(starts, starts + np.asarray(lengths, np.int64))
    return values_outside(refs.val_off, refs.val_len, psize, run_starts, run_stops)
