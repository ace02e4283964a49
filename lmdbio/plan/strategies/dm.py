"""LMDBIO-DM: readers chained across nodes hand a serialized cursor along.

Per iteration, reader ``r`` receives the start cursor from reader ``r-1``, walks its share
(branch and leaf pages only: values are located, not read), sends the cursor on, then reads
its records in parallel with the others. The last reader sends its end cursor back to the
first for the next iteration. With a symmetric mapping the cursor bytes are raw page
addresses, valid in every reader; otherwise page numbers.

``dm-spec`` adds speculative prefetch before the chain: every reader touches the page range
it expects to need, all in parallel, so that the serial walk runs through memory. The
estimate starts from the first record's size (the paper's first guess) and from the third
iteration on follows the min/max estimator of the reference code (branch
``icpads-multiple-readers``), with ``start`` the first page a reader needed, ``end`` one past
the last and ``stride = start - previous end``: next start = previous end + min stride.
Three changes make it hold on real files (measured in docs/reading.md):

* the observed range is the largest run of the pages needed whose gaps are small: a value
  written into a page freed by an earlier commit (LMDB reuses them; Caffe commits every
  1,000 records) sits thousands of pages away, and taking it as the range's end made the
  reference's min/max grow without bound (tens of times the pages needed on a generated
  CIFAR-like database). Such pages are reported as missed: no range estimate can hold them;
* the end is predicted from the period ``end - previous end`` (next end = previous end + max
  period) instead of ``max stride - min stride + max pages``, which counts the variation
  of the start twice;
* minima and maxima are taken over the last 8 iterations, so that a one-off shift ages out.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lmdbio.lmdb import RecordRefs
from lmdbio.plan.epoch import EpochPlan
from lmdbio.plan.strategies.base import IterationStats, ReadStrategy, Timer

_TAG = 7100


class DmSerial(ReadStrategy):
    """Serialized cursors handed from reader to reader (LMDBIO-DM without prefetch)."""

    name = "dm-serial"

    def begin_epoch(self, plan: EpochPlan) -> None:
        self._drain()
        self.cursor = self.db.cursor()
        if self.ctx.reader_index == 0:
            self.cursor.first()
        self.iterations = plan.iterations
        self.first_iteration = 0
        self._last: int | None = None
        self._pending = getattr(self, "_pending", [])

    def _drain(self) -> None:
        """Reader 0: take the cursor the last reader sent after the last iteration read when
        no iteration of this epoch will use it (the epoch was left early, or the session
        ends mid-epoch), so that it is never taken for the cursor of a later epoch or of a
        later session on the same communicator."""
        from lmdbio.mpiutil import wait_with_timeout

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
        self.db.walk_collect(self.cursor, int(first_id), wrap=True)

    def _receive(self, iteration: int, stats: IterationStats) -> None:
        from lmdbio.mpiutil import wait_with_timeout

        r, n = self.ctx.reader_index, self.ctx.n_readers
        if n == 1 or (r == 0 and iteration == self.first_iteration):
            return
        src = r - 1 if r > 0 else n - 1
        with Timer(stats, "wait_cursor"):
            req = self.ctx.readers.irecv(source=src, tag=_TAG)
            # short sleeps: the hand-off is on the critical path of every iteration, and a
            # waiting reader that sleeps up to the default 10 ms adds that much per hop
            data = wait_with_timeout(req, self.ctx.timeout,
                                     f"cursor for iteration {iteration} from reader {src}",
                                     max_sleep=5e-4)
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
        self._last = iteration
        return refs

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats) -> RecordRefs:
        return self.walk_share(iteration, ids, stats)

    def close(self) -> None:
        from lmdbio.mpiutil import wait_with_timeout

        self._drain()
        if getattr(self, "_pending", None):
            wait_with_timeout(self._pending, self.ctx.timeout, "cursor sends")


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

    def __init__(self, window: int = 8) -> None:
        self.prev_end: int | None = None
        self.history: deque[tuple[int, int]] = deque(maxlen=window)  # (stride, period)
        self.observed = 0

    def observe(self, start: int, end: int) -> None:
        """Record the range ``[start, end)`` of pages a reader needed this iteration."""
        if self.prev_end is not None:
            self.history.append((start - self.prev_end, end - self.prev_end))
        self.prev_end = end
        self.observed += 1

    def observe_pages(self, pages: np.ndarray) -> None:
        """Record the pages needed this iteration (sorted, distinct): their main run."""
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


class DmSpec(DmSerial):
    """LMDBIO-DM with speculative parallel prefetch of each reader's page range."""

    name = "dm-spec"

    def begin_epoch(self, plan: EpochPlan) -> None:
        super().begin_epoch(plan)
        self.estimator = PageRangeEstimator()
        self._expect: int | None = None
        self._scratch: np.ndarray | None = None
        self.db.accounting.enable()
        t = self.db.record_table(0, 1) if len(self.db) else None
        first_size = int(t.val_len[0]) if t is not None and len(t) else 1
        psize = self.db.psize
        self.pages_per_record = max(1, -(-(first_size + self.db.layout.header_size) // psize))

    def _guess(self, first_id: int, count: int) -> tuple[int, int]:
        """The paper's first guess: every record is the size of the first one (so record
        ``first_id`` starts ``first_id`` records' worth of pages after the meta pages)."""
        return 2 + first_id * self.pages_per_record, count * self.pages_per_record

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats) -> RecordRefs:
        from lmdbio.io.prefetch import touch_page_ranges

        npages = self.db.file_size // self.db.psize
        # the estimator extrapolates from the previous iterations only while the records
        # continue them (not across the wrap-around of a padded last batch, or a resume)
        regular = ids.size > 0 and int(ids[0]) == self._expect
        if not regular:
            self.estimator = PageRangeEstimator()
        wrap = np.flatnonzero(np.diff(ids) < 0)
        cut = int(wrap[0]) + 1 if wrap.size else ids.size
        guesses = [(self.estimator.predict() if regular else None)
                   or self._guess(int(ids[0]) if ids.size else 0, cut)]
        if cut < ids.size:  # the records after the wrap-around start again near the front
            guesses.append(self._guess(int(ids[cut]), ids.size - cut))
        if ids.size:
            self._expect = int(ids[-1]) + 1 + (self.ctx.n_readers - 1) * ids.size
        starts = np.array([min(g[0], npages) for g in guesses], np.int64)
        lengths = np.array([max(0, min(g[1], npages - st)) for g, st in
                            zip(guesses, starts.tolist(), strict=True)], np.int64)
        with Timer(stats, "prefetch"):
            if lengths.any() and self.db.node_cache is not None:
                self.db.node_cache.load_runs(starts, lengths)  # O_DIRECT into the node
            elif lengths.any():
                touch_page_ranges(self.db.buf, starts, lengths, self.db.psize)
        refs = self.walk_share(iteration, ids, stats)
        if not len(refs):
            return refs
        # needed: the pages of the values (read in parallel after the chain) and the leaf and
        # branch pages the walk read (the bitmap holds just those: the session resets it per
        # iteration and prefetching does not mark it); one compiled pass
        from lmdbio.plan.strategies._spec_kernels import observe_iteration

        touched = self.db.accounting.touched
        if self._scratch is None or self._scratch.shape[0] != touched.shape[0]:
            self._scratch = np.zeros(touched.shape[0], np.uint8)
        run_start, run_end, _, missed, missed_walk, redundant, prefetched = \
            observe_iteration(refs.val_off, refs.val_len, self.db.psize, touched,
                              self._scratch, starts, lengths)
        if run_start >= 0:
            self.estimator.observe(int(run_start), int(run_end))
        stats.prefetched_pages = int(prefetched)
        stats.missed_pages = int(missed)
        stats.missed_walk_pages = int(missed_walk)
        stats.redundant_pages = int(redundant)
        self.last_prefetch = (int(starts[0]), int(lengths[0]))
        return refs
