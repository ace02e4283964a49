"""dm-spec's per-iteration bookkeeping in one compiled pass (see :mod:`.dm`).

After the chain, a dm-spec reader knows the values it will read (byte offset and length of
each), their leaf pages, the branch and leaf pages its walk read (the accounting bitmap) and
the page ranges it prefetched. From these it needs the main run of the pages that hold its
records (the estimator's observation) and the counts it reports: missed value pages,
walked pages outside the prefetched ranges, and redundant prefetched pages. Done with
numpy set operations this was ~150 us per iteration at 64 records; here it is one pass over
the records, the ranges and the bitmap, with a scratch bitmap that is left zeroed for the next call.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lmdbio.lmdb.kernels import value_page_span

_VALUE = np.uint8(1)
_WALKED = np.uint8(2)
_RANGE = np.uint8(4)
_LEAF = np.uint8(8)


@njit(cache=True, nogil=True)
def observe_iteration(val_off, val_len, leaf_pg, psize, touched, scratch, starts, lengths):
    """Returns ``(run_start, run_end, needed, missed, missed_walk, redundant, prefetched)``.

    ``run_start``/``run_end`` bound the largest run of the pages holding the records (the
    values' pages and the records' leaf pages ``leaf_pg``, sorted) whose consecutive gaps
    are at most ``max(2, needed // 8)`` (``-1, -1`` when there are none; ties go to the
    lowest run). Branch pages are left out of the run: they are needed, but on a walk of a
    few inline records a branch page far from the leaves is a run as large as the leaf
    one, and a main run that alternates between them made the min/max range run away to
    the whole file (docs/reading.md). ``needed`` counts values' pages and walked pages.
    ``touched`` is the walk's page bitmap (its length bounds the pages considered),
    ``scratch`` a zeroed ``uint8`` array at least as long, zeroed again on return.
    """
    npages = scratch.shape[0]
    lo = npages
    hi = -1
    # value pages
    for i in range(val_off.shape[0]):
        first, last = value_page_span(val_off[i], val_len[i], psize)
        for p in range(first, min(last, npages - 1) + 1):
            scratch[p] |= _VALUE
        lo = min(lo, first)
        hi = max(hi, min(last, npages - 1))
    # the records' leaf pages (walked too: only the main run tells them apart)
    for i in range(leaf_pg.shape[0]):
        p = leaf_pg[i]
        if 0 <= p < npages:
            scratch[p] |= _LEAF
            lo = min(lo, p)
            hi = max(hi, p)
    # walked pages
    for p in range(min(touched.shape[0], npages)):
        if touched[p]:
            scratch[p] |= _WALKED
            lo = min(lo, p)
            hi = max(hi, p)
    # prefetched ranges
    prefetched = 0
    redundant = 0
    for j in range(starts.shape[0]):
        for p in range(max(starts[j], 0), min(starts[j] + lengths[j], npages)):
            if not scratch[p] & _RANGE:
                prefetched += 1
                if not scratch[p] & (_VALUE | _WALKED):
                    redundant += 1
                scratch[p] |= _RANGE
    needed = 0
    missed = 0
    missed_walk = 0
    if hi >= 0:
        for p in range(lo, hi + 1):
            m = scratch[p]
            if m & (_VALUE | _WALKED):
                needed += 1
                if m & _VALUE and not m & _RANGE:
                    missed += 1
                if m & _WALKED and not m & _RANGE:
                    missed_walk += 1
    # main run of the pages holding the records
    gap = max(2, needed // 8)
    best_start = -1
    best_end = -1
    best_count = 0
    run_start = -1
    run_count = 0
    prev = -1
    if hi >= 0:
        for p in range(lo, hi + 1):
            if scratch[p] & (_VALUE | _LEAF):
                if prev < 0 or p - prev > gap:
                    run_start = p
                    run_count = 0
                run_count += 1
                prev = p
                if run_count > best_count:
                    best_count = run_count
                    best_start = run_start
                    best_end = p + 1
    # leave the scratch zeroed
    if hi >= 0:
        scratch[lo:hi + 1] = 0
    for j in range(starts.shape[0]):
        a = max(starts[j], 0)
        b = min(starts[j] + lengths[j], npages)
        if b > a:
            scratch[a:b] = 0
    return best_start, best_end, needed, missed, missed_walk, redundant, prefetched


@njit(cache=True, nogil=True)
def values_outside(val_off, val_len, psize, run_starts, run_stops):
    """Indices of the values not wholly inside the page runs ``[run_starts[j],
    run_stops[j])`` (sorted and disjoint: :func:`lmdbio.io.prefetch.merge_ranges` of the
    prefetched ranges): the values a prefetch missed, all or part of (an empty value stands
    for its first page). Each value's page span is found by binary search: one pass, where
    the numpy form built a values-by-ranges matrix (~0.12 ms a 2,048-record slot)."""
    out = np.empty(val_off.shape[0], np.int64)
    k = 0
    for i in range(val_off.shape[0]):
        first, last = value_page_span(val_off[i], val_len[i], psize)
        j = np.searchsorted(run_starts, first, side="right") - 1
        if j < 0 or last >= run_stops[j]:
            out[k] = i
            k += 1
    return out[:k]
