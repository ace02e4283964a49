"""LMDBIO-DM: readers chained across nodes hand a serialized cursor along.

Per iteration, reader ``r`` receives the start cursor from reader ``r-1``, walks its share
(branch and leaf pages only: values are located, not read), sends the cursor on, then reads
its records in parallel with the others. The last reader sends its end cursor back to the
first for the next iteration. With a symmetric mapping the cursor bytes are raw page
addresses, valid in every reader; otherwise page numbers.

``dm-spec`` adds speculative prefetch before the chain: every reader touches the page range
it expects to need, all in parallel, so that the serial walk runs through memory. The
estimate starts from the first record's size (the paper's first guess) and from the third
iteration on follows the refined min/max estimator of the reference code: with ``start`` the
first page a reader touched, ``end`` one past the last, ``stride = start - previous end``:
next start = previous end + min stride, next length = max stride - min stride + max pages.
"""

from __future__ import annotations

import numpy as np

from lmdbio.lmdb import RecordRefs
from lmdbio.plan.epoch import EpochPlan
from lmdbio.plan.strategies.base import IterationStats, ReadStrategy, Timer

_TAG = 7100


class DmSerial(ReadStrategy):
    """Serialized cursors handed from reader to reader (LMDBIO-DM without prefetch)."""

    name = "dm-serial"

    def begin_epoch(self, plan: EpochPlan) -> None:
        self.cursor = self.db.cursor()
        if self.ctx.reader_index == 0:
            self.cursor.first()
        self.iterations = plan.iterations
        self.first_iteration = 0
        self._pending = []

    def resume(self, plan: EpochPlan, iteration: int, first_id: int) -> None:
        """Reader 0 positions the chain's cursor on ``first_id`` (the other readers get
        theirs along the chain as usual)."""
        self.first_iteration = iteration
        if self.ctx.reader_index != 0 or first_id == 0:
            return
        self.cursor.first()
        self.db.walk_collect(self.cursor, int(first_id), wrap=True)

    def _receive(self, iteration: int, stats: IterationStats) -> None:
        from lmdbio.mpiutil import wait_with_timeout

        r, n = self.ctx.reader_index, self.ctx.n_readers
        if n == 1 or (r == 0 and iteration == self.first_iteration):
            return
        src = r - 1 if r > 0 else n - 1
        with Timer(stats, "wait_cursor"):
            req = self.ctx.readers.irecv(source=src, tag=_TAG)
            data = wait_with_timeout(req, self.ctx.timeout,
                                     f"cursor for iteration {iteration} from reader {src}")
        self.cursor = self.db.cursor_from_bytes(data)

    def _send(self, iteration: int) -> None:
        r, n = self.ctx.reader_index, self.ctx.n_readers
        if n == 1 or (r == n - 1 and iteration == self.iterations - 1):
            return  # the next epoch starts from the first record again
        req = self.ctx.readers.isend(self.cursor.to_bytes(), dest=(r + 1) % n, tag=_TAG)
        self._pending.append(req)
        self._pending = [q for q in self._pending if not q.Test()]

    def walk_share(self, iteration: int, ids: np.ndarray, stats: IterationStats
                   ) -> RecordRefs:
        self._receive(iteration, stats)
        with Timer(stats, "walk"):
            refs, _, _ = self.db.walk_collect(self.cursor, ids.size, wrap=True) \
                if ids.size else (RecordRefs.empty(0), 0, False)
        self._send(iteration)
        return refs

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats) -> RecordRefs:
        return self.walk_share(iteration, ids, stats)

    def close(self) -> None:
        from lmdbio.mpiutil import wait_with_timeout

        if getattr(self, "_pending", None):
            wait_with_timeout(self._pending, self.ctx.timeout, "cursor sends")


def value_pages(val_off: np.ndarray, val_len: np.ndarray, psize: int) -> np.ndarray:
    """Distinct pages covered by the byte ranges of some values."""
    from lmdbio.lmdb.database import RecordRefs

    n = val_off.shape[0]
    refs = RecordRefs(val_off, val_len, np.empty(0, np.int64), *(np.empty(n, np.int64)
                                                                 for _ in range(3)))
    return refs.value_pages(psize)


class PageRangeEstimator:
    """Predicts the page range one reader needs next iteration (min/max estimator)."""

    def __init__(self) -> None:
        self.prev_end: int | None = None
        self.min_stride: int | None = None
        self.max_stride: int | None = None
        self.max_pages = 0
        self.observed = 0

    def observe(self, start: int, end: int) -> None:
        """Record the range ``[start, end)`` of pages a reader touched this iteration."""
        if self.prev_end is not None:
            stride = start - self.prev_end
            self.min_stride = stride if self.min_stride is None else min(self.min_stride,
                                                                         stride)
            self.max_stride = stride if self.max_stride is None else max(self.max_stride,
                                                                         stride)
        self.max_pages = max(self.max_pages, end - start)
        self.prev_end = end
        self.observed += 1

    def predict(self) -> tuple[int, int] | None:
        """``(start, length)`` in pages, or None until two iterations were observed."""
        if self.observed < 2 or self.prev_end is None or self.min_stride is None:
            return None
        assert self.max_stride is not None
        start = self.prev_end + self.min_stride
        length = self.max_stride - self.min_stride + self.max_pages
        return max(start, 2), max(length, 1)


class DmSpec(DmSerial):
    """LMDBIO-DM with speculative parallel prefetch of each reader's page range."""

    name = "dm-spec"

    def begin_epoch(self, plan: EpochPlan) -> None:
        super().begin_epoch(plan)
        self.estimator = PageRangeEstimator()
        self.db.accounting.enable()
        t = self.db.record_table(0, 1) if len(self.db) else None
        first_size = int(t.val_len[0]) if t is not None and len(t) else 1
        psize = self.db.psize
        self.pages_per_record = max(1, -(-(first_size + self.db.layout.header_size) // psize))

    def _guess(self, iteration: int, count: int) -> tuple[int, int]:
        """The paper's first guess: every record is the size of the first one."""
        r, n = self.ctx.reader_index, self.ctx.n_readers
        start = 2 + (iteration * n + r) * count * self.pages_per_record
        return start, count * self.pages_per_record

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats) -> RecordRefs:
        from lmdbio.io.prefetch import touch_page_ranges

        npages = self.db.file_size // self.db.psize
        guess = self.estimator.predict() or self._guess(iteration, ids.size)
        start = min(guess[0], npages)
        length = max(0, min(guess[1], npages - start))
        with Timer(stats, "prefetch"):
            if length:
                touch_page_ranges(self.db.buf, [start], [length], self.db.psize)
        refs = self.walk_share(iteration, ids, stats)
        if not len(refs):
            return refs
        # the estimate covers the pages holding the values (for inline records, their leaf
        # pages): that is the bulk of the bytes and what readers read in parallel. The
        # estimator follows the first value's page and the end of the last value, as the
        # reference code does; leaf pages of overflow records sit wherever the tree split
        # them and are read by the (serial) walk, reported apart as walk pages.
        psize = self.db.psize
        needed = value_pages(refs.val_off, refs.val_len, psize)
        first = int(refs.val_off[0] // psize)
        last_end = int((refs.val_off[-1] + max(int(refs.val_len[-1]), 1) - 1) // psize) + 1
        self.estimator.observe(first, last_end)
        in_range = (needed >= start) & (needed < start + length)
        stats.prefetched_pages = int(length)
        stats.missed_pages = int(np.count_nonzero(~in_range))
        stats.redundant_pages = int(length - np.count_nonzero(in_range))
        self.last_prefetch = (start, length)
        return refs
