"""dm-spec's compiled per-iteration bookkeeping equals the numpy set-operation definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdbio.lmdb.records import RecordRefs
from lmdbio.plan.strategies.kernels import observe_iteration
from lmdbio.plan.strategies.spec_estimate import main_run


def value_pages(val_off, val_len, psize):
    """Distinct pages covered by the values' bytes (the engine's own definition)."""
    n = val_off.shape[0]
    refs = RecordRefs(val_off, val_len, np.empty(0, np.int64),
                      *(np.empty(n, np.int64) for _ in range(3)))
    return refs.value_pages(psize)


def reference(val_off, val_len, leaf_pg, psize, touched, starts, lengths):
    values = value_pages(val_off, val_len, psize)
    walked = np.flatnonzero(touched)
    needed = np.union1d(values, walked)
    holding = np.union1d(values, leaf_pg)  # the run leaves branch pages out
    ranges = np.unique(np.concatenate([np.arange(s, s + n) for s, n in
                                       zip(starts.tolist(), lengths.tolist(), strict=True)]
                                      + [np.empty(0, np.int64)])).astype(np.int64)
    run = main_run(holding, max(2, needed.size // 8))
    return ((run if run is not None else (-1, -1))
            + (int(needed.size), int((~np.isin(values, ranges)).sum()),
               int((~np.isin(walked, ranges)).sum()),
               int(ranges.size - np.isin(ranges, needed).sum()), int(ranges.size)))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_observe_iteration_matches_the_set_definition(data) -> None:
    psize = 64
    npages = data.draw(st.integers(4, 200))
    n = data.draw(st.integers(0, 30))
    offs = data.draw(st.lists(st.integers(0, npages * psize - 1), min_size=n, max_size=n))
    val_off = np.array(offs, np.int64)
    lens = [data.draw(st.integers(0, npages * psize - 1 - o)) for o in offs]
    val_len = np.array(lens, np.int64)
    leaf_pg = np.array(data.draw(st.lists(st.integers(0, npages - 1), min_size=n,
                                          max_size=n)), np.int64)
    touched = np.array(data.draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=npages,
                                          max_size=npages)), np.uint8)
    k = data.draw(st.integers(0, 3))
    starts = np.array(data.draw(st.lists(st.integers(0, npages - 1), min_size=k,
                                         max_size=k)), np.int64)
    lengths = np.array([data.draw(st.integers(0, npages - s)) for s in starts.tolist()],
                       np.int64)
    scratch = np.zeros(npages, np.uint8)
    got = observe_iteration(val_off, val_len, leaf_pg, psize, touched, scratch, starts,
                            lengths)
    assert tuple(int(x) for x in got) == reference(val_off, val_len, leaf_pg, psize, touched,
                                                   starts, lengths)
    assert not scratch.any()  # left zeroed for the next call
