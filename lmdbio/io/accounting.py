"""Page accounting: which pages of the file a reader has touched.

A bitmap with one byte per file page. Kernels mark the pages they read (branch and leaf
pages in walks and seeks, every page of a value in gathers), so the parallel strategies can
report exactly how many pages each rank read beyond the ones holding its own records.

The accounting also feeds a node's O_DIRECT page cache (:class:`lmdbio.io.direct.NodeCache`,
``lmdbio bench read --direct``): with one attached, the branch and leaf pages a walk, seek
or locate marked are read into it (:meth:`PageAccounting.fill_node_cache`) and gathers copy
values from it (:mod:`lmdbio.io.gather`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lmdbio.kernel_cache import kernel_module

if TYPE_CHECKING:
    from lmdbio.io.direct import NodeCache
    from lmdbio.lmdb.records import RecordRefs


class PageAccounting:
    """One byte per file page: 1 where the page was read since the last :meth:`reset`."""

    def __init__(self, npages: int, enabled: bool = False) -> None:
        self.enabled = enabled
        # kernels always take an array; a disabled account gets a one-page dummy
        self.touched = np.zeros(max(npages, 1) if enabled else 1, np.uint8)
        self._npages = npages
        #: a node's O_DIRECT page cache: when set, walks and seeks charge the branch and
        #: leaf pages they read to it and values are gathered from it (needs accounting)
        self.node_cache: NodeCache | None = None

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

    def mark_pages(self, pages: np.ndarray) -> None:
        """When enabled, mark ``pages`` (page numbers inside the snapshot, as the validating
        kernels give them) touched: pages read earlier, outside the accounting, that an
        iteration uses as if it had read them itself."""
        if self.enabled and pages.size:
            self.touched[pages] = 1

    def mark_values(self, refs: RecordRefs, psize: int) -> None:
        """When enabled, mark every page of ``refs``' values (pages of ``psize`` bytes)
        touched without reading them: a reader that hands out their spans counts the pages
        its node's workers read from the mapping (the node's I/O is the same as if the
        reader had copied them)."""
        if self.enabled:
            mark_values = kernel_module("lmdbio.lmdb").mark_values
            mark_values(self.touched, refs.val_off, refs.val_len, psize)

    def fill_node_cache(self) -> None:
        """Read the pages marked so far that the attached node cache lacks into it, one
        ``pread`` each (after a walk, seek or locate: the branch and leaf pages it read);
        nothing without a node cache."""
        if self.node_cache is not None:
            self.node_cache.load_touched(self.touched)
