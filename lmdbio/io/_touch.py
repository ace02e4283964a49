"""Compiled page-touch loops (numba). Imported lazily by :mod:`lmdbio.io.prefetch`.

Reading one byte of a page of a file mapping makes the kernel fault it in (from the page cache,
or from storage). The loops return the sum of the bytes they read so the compiler cannot
drop the reads; they release the GIL, so a prefetch can run in a thread beside Python code.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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
        start = starts[i]
        stop = stops[i]
        if stop <= start:
            continue
        first = start // os_page
        last = (stop - 1) // os_page
        for p in range(first, last + 1):
            pos = p * os_page
            if pos < start:
                pos = start
            total += np.uint64(arr[pos])
    return total
