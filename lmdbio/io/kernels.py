"""Compiled page loops of the read path (numba): touching pages and sampling their
residency. Imported lazily by :mod:`lmdbio.io.prefetch`.

Touching: reading one byte of a page of a file mapping makes the kernel fault it in (from
the page cache, or from storage). The loops return the sum of the bytes they read so the
compiler cannot drop the reads; they release the GIL, so a prefetch can run in a thread
beside Python code.

Residency: a reader asks, before every prefetch advice, whether the pages it would ask for
are in the page cache already. Asking ``mincore(2)`` about every page costs ~55 ns per page
not mapped in the process; asking about a sample of pages one call each from Python cost
~6 us per page (ctypes and the sample's arithmetic): ~0.1 ms per question. Here the sample
and its ``mincore`` calls run in one compiled loop (~0.5 us per page). ``mincore`` is called as an
external symbol, which numba resolves by name when it loads its cache, so the kernel
caches as the others do.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types


@njit(cache=True, nogil=True)
def touch_range(arr: np.ndarray, start: int, stop: int, os_page: int) -> np.uint64:
    """Read one byte in every OS page overlapping ``arr[start:stop]``; return their sum."""
    total = np.uint64(0)
    if stop <= start:
        return total
    first = start // os_page
    last = (stop - 1) // os_page
    for p in range(first, last + 1):
        pos = p * os_page
        if pos < start:
            pos = start
        total += np.uint64(arr[pos])
    return total


@njit(cache=True, nogil=True)
def touch_ranges(
    arr: np.ndarray, starts: np.ndarray, stops: np.ndarray, os_page: int
) -> np.uint64:
    """:func:`touch_range` over many byte ranges ``[starts[i], stops[i])`` (pre-validated)."""
    total = np.uint64(0)
    for i in range(starts.shape[0]):
        total += touch_range(arr, starts[i], stops[i], os_page)
    return total


_mincore = types.ExternalFunction("mincore", types.intc(types.uintp, types.uintp,
                                                         types.voidptr))


@njit(cache=True, nogil=True)
def sample_resident(base, starts, counts, page_size, os_page, samples):
    """Whether ``samples`` pages spread evenly over the page ranges ``[starts[i], starts[i]
    + counts[i])`` of the mapping at address ``base`` are resident: 1 if every sampled page
    is, 0 at the first that is not, -1 if ``mincore`` refused. The sample is centred among
    the ranges' pages and its last pick is the last page (where an estimate runs out); 1
    for no pages.

    Callers check the ranges against the mapping (non-negative counts, inside it) and that
    ``samples`` is at least 1."""
    total = 0
    for i in range(counts.shape[0]):
        total += counts[i]
    if total == 0:
        return 1
    k = min(samples, total)
    vec = np.zeros(1, np.uint8)
    i = 0
    before = 0  # pages of the ranges before range i
    for j in range(k):
        pick = (2 * j + 1) * total // (2 * k) if j < k - 1 else total - 1
        while before + counts[i] <= pick:  # picks ascend: walk the ranges once
            before += counts[i]
            i += 1
        addr = (base + (starts[i] + pick - before) * page_size) // os_page * os_page
        if _mincore(addr, os_page, vec.ctypes.data) != 0:
            return -1
        if vec[0] & 1 == 0:
            return 0
    return 1
