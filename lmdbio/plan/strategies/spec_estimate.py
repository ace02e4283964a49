"""dm-spec's estimates of the pages a reader will need next iteration.

Two estimators, both corrected every iteration from the pages the reader actually used:

* :class:`PageRangeEstimator`, the min/max estimator of the reference code (branch
  ``icpads-multiple-readers``) with four changes measured in docs/reading.md: the observed
  range is the main run of the pages holding the records, their values' and leaf pages
  (values in pages freed by earlier commits sit far away; branch pages are not values'
  neighbours), the end follows the period ``end - previous end``,
  minima and maxima are taken over the last 8 iterations, and a single jump far outside
  their spread (a leaf a commit moved) moves the range without widening it. It works on
  any file, and its slack is what min and max must leave: about one page at each end of
  the range on a CIFAR-like file, where a leaf page interleaves with the values every ~150
  records (3-6 % of a 64-record range).
* :class:`ValuePageEstimator`, for records whose values all fill the same number of
  overflow pages (fixed-size images: CIFAR-, ImageNet-like files). LMDB writes overflow
  values in key order into consecutive pages; what interleaves with them are tree pages (a
  new leaf at every split, copies of the root and the rightmost leaf at every commit) and
  pages freed by earlier commits. The tree pages are known: they are the children of the
  branch pages the reader's walks read (:class:`KnownTreePages`). Counting pages with the
  known tree pages left out (the *value coordinate*), the value of record ``k + d`` starts
  ``d * pages_per_record`` after that of record ``k``: from the last record of its main run
  a reader predicts the exact pages of its next records, and the leaf page of the first.
  What it cannot know are pages freed by earlier commits and reused in between: each costs
  one page at one end of one iteration (measured: 0.5 % redundant, 0.2 % missed on the
  generated CIFAR-like file committed 1,000 records at a time; 0 % / 0 % in one commit).

:class:`~lmdbio.plan.strategies.dm.DmSpec` asks the value-page estimator first and falls back
to the min/max estimator (inline values, mixed sizes, a tree page not yet seen).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lmdbio.lmdb import RecordRefs
from lmdbio.lmdb.free_pages import free_list


def main_run(pages: np.ndarray, gap: int) -> tuple[int, int] | None:
    """``[start, end)`` of the largest run of ``pages`` (sorted, distinct) in which
    consecutive pages are at most ``gap`` apart; None for no pages."""
    if pages.size == 0:
        return None
    bounds = np.r_[0, np.flatnonzero(np.diff(pages) > gap) + 1, pages.size]
    k = int(np.argmax(np.diff(bounds)))
    return int(pages[bounds[k]]), int(pages[bounds[k + 1] - 1]) + 1


class PageRangeEstimator:
    """Predicts the page range one reader needs next iteration (min/max estimator over the
    last ``window`` iterations; see the module docstring)."""

    #: a step is a jump when it leaves the spread of the history by this many spreads
    JUMP_SPREADS = 4

    def __init__(self, window: int = 8) -> None:
        self.prev_end: int | None = None
        self.history: deque[tuple[int, int]] = deque(maxlen=window)  # (stride, period)
        self._jumped = False  # whether the last step was a jump left out of the history

    def observe(self, start: int, end: int) -> None:
        """Record the range ``[start, end)`` of pages a reader needed this iteration.

        A single jump far outside the spread of the history moves the range but is left
        out of the history: on inline records it is a leaf a commit copied into a page
        freed elsewhere in the file, and the records after it follow it with the usual
        steps; kept, it widened every prediction of the next ``window`` iterations by the
        jump (tens of pages where a share needs 2-4). A second jump in a row is a change of
        pattern and enters the history."""
        if self.prev_end is not None:
            step = (start - self.prev_end, end - self.prev_end)
            if self._is_jump(step) and not self._jumped:
                self._jumped = True
            else:
                self.history.append(step)
                self._jumped = False
        self.prev_end = end

    def _is_jump(self, step: tuple[int, int]) -> bool:
        """Whether ``step`` (stride, period) leaves the history's spread by more than
        :attr:`JUMP_SPREADS` spreads (judged once three steps are known)."""
        if len(self.history) < 3:
            return False
        lo = min(h[0] for h in self.history)
        hi = max(h[1] for h in self.history)
        margin = self.JUMP_SPREADS * max(hi - lo, 1)
        return step[0] < lo - margin or step[1] > hi + margin

    def observe_pages(self, pages: np.ndarray) -> None:
        """Record the pages holding this iteration's records (values' and leaf pages,
        sorted, distinct): their main run."""
        run = main_run(pages, max(2, pages.size // 8))
        if run is not None:
            self.observe(*run)

    def predict(self) -> tuple[int, int] | None:
        """``(start, length)`` in pages, or None until two iterations were observed."""
        if self.prev_end is None or not self.history:
            return None
        start = self.prev_end + min(h[0] for h in self.history)
        end = self.prev_end + max(h[1] for h in self.history)
        return max(start, 2), max(end - start, 1)


class KnownTreePages:
    """The branch and leaf pages a reader knows of, and the value coordinate they define.

    The value coordinate of a page is its number minus the known tree pages before it:
    consecutive overflow values written in key order have consecutive coordinates whatever
    tree pages were allocated between them.
    """

    def __init__(self) -> None:
        #: sorted: every known branch and leaf page (and, after :meth:`learn_tree`, the
        #: free-page database's pages and the free pages it lists)
        self.pages = np.empty(0, np.int64)
        self.leaves = np.empty(0, np.int64)  # sorted: the known leaf pages
        self._shifted = np.empty(0, np.int64)  # pages - arange: page_of's lookup table
        self._parsed: set[int] = set()
        self._children: dict[int, np.ndarray] = {}  # branch page: its children, key order
        #: whether every branch and leaf page is known (:meth:`learn_tree`)
        self.complete = False
        #: after :meth:`learn_tree`: every leaf page in key order, and each one's parent
        self.ordered_leaves = np.empty(0, np.int64)
        self.leaf_parents = np.empty(0, np.int64)
        #: after :meth:`learn_tree`: the parent of every branch page but the root
        self.branch_parents: dict[int, int] = {}

    def children(self, db, branch: int) -> np.ndarray:
        """The child pages of branch page ``branch`` in key order, parsed once (the
        snapshot does not change under a reader)."""
        kids = self._children.get(branch)
        if kids is None:
            kids = self._children[branch] = db.branch_children(branch)
        return kids

    def learn(self, db, stack: list[list[int]]) -> None:
        """Add the children of the branch pages on a cursor ``stack`` (root first, leaf
        last, as :class:`lmdbio.lmdb.cursor.Cursor` keeps it) that were not parsed yet."""
        branches = [int(pg) for pg, _ in stack[:-1] if int(pg) not in self._parsed]
        if not branches:
            return
        leaf_parent = int(stack[-2][0]) if len(stack) >= 2 else -1
        found = [np.asarray(branches, np.int64)]
        for pg in branches:
            children = self.children(db, pg)
            found.append(children)
            if pg == leaf_parent:
                self.leaves = np.union1d(self.leaves, children)
            self._parsed.add(pg)
        self.pages = np.union1d(self.pages, np.concatenate(found))
        self._shifted = self.pages - np.arange(self.pages.size, dtype=np.int64)

    def learn_tree(self, db) -> None:
        """Learn every branch and leaf page, and the pages of no record: parse the branch
        pages level by level from the root down to the leaves' parents (the leaves
        themselves are named by their parents, not read), and the free-page database
        (:func:`~lmdbio.lmdb.free_pages.free_list`: its own pages and the free pages it
        lists). Without it a reader knows only the leaves under the branch pages its own
        walks passed: on a tree of three levels or more the leaves under the others, and
        on any file the free database's pages and the pages freed and not reused, push
        its estimates on by a page each. Reads the branch pages (a leaf's parent per ~150
        leaves) and the free database (a page or a few), marked in the accounting as any
        page read."""
        levels, parents = db.tree_levels()
        found = list(levels)
        if len(levels) > 1:
            self._parsed.update(np.concatenate(levels[:-1]).tolist())
            self.leaves = np.union1d(self.leaves, levels[-1])
            self.ordered_leaves, self.leaf_parents = levels[-1], parents
            for level in levels[:-2]:  # branch pages with branch children (few)
                for pg in level.tolist():
                    self.branch_parents.update(
                        dict.fromkeys(self.children(db, pg).tolist(), pg))
        found.extend(free_list(db))
        self.pages = np.union1d(self.pages, np.concatenate(found))
        self._shifted = self.pages - np.arange(self.pages.size, dtype=np.int64)
        self.complete = True

    def walk_branches(self, lo: int, end: int, received: bool) -> list[int]:
        """The branch pages a walk from leaf ``lo`` to leaf ``end`` (indices into
        :attr:`ordered_leaves`) reads, as the page accounting counts them: a cursor
        rebuilt from another reader's bytes (``received``) reads its whole path, from the
        root down to leaf ``lo``'s parent; moving on to a leaf under another parent, the
        walk climbs the pages it holds and descends through the branch pages below their
        lowest common ancestor (as LMDB's ``mdb_cursor_sibling``). Empty before
        :meth:`learn_tree`."""
        if end < lo or not self.leaf_parents.size:
            return []
        par = self.leaf_parents[lo:end + 1]
        pages = set(self._ancestors(int(par[0]))) if received else set()
        for k in np.flatnonzero(par[:-1] != par[1:]).tolist():
            up = set(self._ancestors(int(par[k])))
            for pg in self._ancestors(int(par[k + 1])):
                if pg in up:
                    break
                pages.add(pg)
        return sorted(pages)

    def descent(self, leaf: int) -> list[int]:
        """The branch pages a cursor that wraps around to leaf ``leaf`` (an index into
        :attr:`ordered_leaves`; the first one when it wraps) marks read going down: the
        path from the root's child to the leaf's parent (the root it holds already, and
        :meth:`walk_branches` names it when a received cursor reads it)."""
        if not self.leaf_parents.size:
            return []
        return self._ancestors(int(self.leaf_parents[leaf]))[:-1]

    def _ancestors(self, page: int) -> list[int]:
        """``page`` and the branch pages above it, up to the root."""
        chain = [page]
        while chain[-1] in self.branch_parents and len(chain) < 64:
            chain.append(self.branch_parents[chain[-1]])
        return chain

    def coord(self, page: int) -> int:
        """Value coordinate of ``page``."""
        return int(page) - int(np.searchsorted(self.pages, page, "left"))

    def page_of(self, coord: int) -> int:
        """The page that is not a known tree page and has value coordinate ``coord``."""
        return int(coord) + int(np.searchsorted(self._shifted, coord, "right"))

    def value_range(self, coord: int, pages: int) -> tuple[int, int]:
        """``(start, length)``: the file pages from the one at value coordinate ``coord`` to
        the one at ``coord + pages - 1``, the known tree pages between them included."""
        start = self.page_of(coord)
        return start, self.page_of(coord + pages - 1) + 1 - start

    def leaf_at_or_before(self, page: int) -> int | None:
        """The last known leaf page at or before ``page``."""
        k = int(np.searchsorted(self.leaves, page, "right"))
        return int(self.leaves[k - 1]) if k else None


class ValuePageEstimator:
    """Predicts the exact pages of a reader's next records when every record's value fills
    the same number of overflow pages (see the module docstring)."""

    def __init__(self, tree: KnownTreePages, window: int = 8) -> None:
        self.tree = tree
        self.sizes: deque[int] = deque(maxlen=window)  # pages per record; -1: mixed/inline
        self.anchor: tuple[int, int] | None = None  # (next record id, its value coordinate)

    @property
    def pages_per_record(self) -> int | None:
        """The common overflow run length of the records seen lately, or None."""
        if not self.sizes or min(self.sizes) != max(self.sizes) or self.sizes[0] < 1:
            return None
        return self.sizes[0]

    def observe(self, first_id: int, refs: RecordRefs, psize: int,
                run: tuple[int, int] | None) -> None:
        """Record this iteration's records ``first_id, first_id + 1, ...`` (``refs`` in key
        order) and the main run ``[start, end)`` of the pages they needed."""
        ovf = refs.ovf_pages
        if not ovf.size:
            return
        lo, hi = int(ovf.min()), int(ovf.max())
        self.sizes.append(lo if lo == hi and lo > 0 else -1)
        first = refs.val_off // psize
        inside = np.flatnonzero((first >= run[0]) & (first < run[1])) if run else first[:0]
        if self.pages_per_record is None or not inside.size:
            self.anchor = None
            return
        k = int(inside[-1])
        last_page = int(first[k]) + int(ovf[k]) - 1
        self.anchor = (first_id + k + 1, self.tree.coord(last_page) + 1)

    def predict(self, first_id: int, count: int) -> list[tuple[int, int]] | None:
        """``[(start, length), ...]``: the values' pages of records ``first_id ..
        first_id + count - 1`` and the leaf page of the first; None when the records seen
        lately were not all of one size, or before the first observation."""
        size = self.pages_per_record
        if size is None or self.anchor is None or count < 1 or first_id < self.anchor[0]:
            return None
        next_id, coord = self.anchor
        start, length = self.tree.value_range(coord + (first_id - next_id) * size, count * size)
        ranges = [(start, length)]
        # the first record's leaf: LMDB allocates a new leaf right after the value of the
        # record that split the old one (its first record), so a leaf just after the first
        # value is that record's; otherwise it is the last leaf before (often far before)
        leaf = self.tree.leaf_at_or_before(start + size)
        if leaf is not None and leaf < start:
            ranges.append((leaf, 1))
        return ranges


def predict_regular(values: ValuePageEstimator, ranges: PageRangeEstimator,
                    stack: list[list[int]], first_id: int, count: int
                    ) -> list[tuple[int, int]] | None:
    """dm-spec's prediction for an iteration that continues the previous ones: the exact
    value pages with the branch pages on the walk's ``stack`` (its cursor's, root first),
    else the min/max range of the pages holding the records (without branch pages: the
    last walk's path names them exactly only while a reader's shares stay under one parent
    branch page, and with many readers, each share hundreds of leaves from the last, they
    were ~1 redundant page a share, 6 % on the MNIST-like replay at 16 readers); None
    before either estimator has observed enough."""
    exact = values.predict(first_id, count)
    if exact is not None:
        return exact + [(int(pg), 1) for pg, _ in stack[:-1]]
    guess = ranges.predict()
    return None if guess is None else [guess]
