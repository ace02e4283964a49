"""Page accounting: which pages of the file a reader has touched.

A bitmap with one byte per file page. Kernels mark the pages they read (branch and leaf
pages in walks and seeks, every page of a value in gathers), so the parallel strategies can
report exactly how many pages each rank read beyond the ones holding its own records.
"""

from __future__ import annotations

import numpy as np


class PageAccounting:
    """One byte per file page: 1 where the page was read since the last :meth:`reset`."""

    def __init__(self, npages: int, enabled: bool = False) -> None:
        self.enabled = enabled
        # kernels always take an array; a disabled account gets a one-page dummy
        self.touched = np.zeros(max(npages, 1) if enabled else 1, np.uint8)
        self._npages = npages

    def enable(self) -> None:
        """Start counting (allocates the bitmap)."""
        if not self.enabled:
            self.touched = np.zeros(max(self._npages, 1), np.uint8)
            self.enabled = True

    def reset(self) -> None:
        """Forget every page touched so far."""
        self.touched[:] = 0

    def count(self) -> int:
        """Number of distinct pages touched."""
        return int(np.count_nonzero(self.touched)) if self.enabled else 0

    def pages(self) -> np.ndarray:
        """Page numbers touched, ascending."""
        return np.flatnonzero(self.touched) if self.enabled else np.empty(0, np.int64)

    def snapshot(self) -> np.ndarray:
        """A copy of the bitmap (for per-iteration differences)."""
        return self.touched.copy()
