"""The consumer's copy in ``lmdbio bench read``: spans copied batch by batch."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdbio.benchmarks.read import _BatchCopy


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), max_size=40), batch=st.integers(1, 9),
       start_size=st.integers(0, 700), seed=st.integers(0, 2**16))
def test_gather_batches_copies_every_batch_into_one_buffer(lengths, batch, start_size, seed):
    rng = np.random.default_rng(seed)
    mapping = rng.integers(0, 256, 4096, dtype=np.uint8)
    lens = np.array(lengths, np.int64)
    starts = rng.integers(0, 4096 - 300, lens.size).astype(np.int64)
    copy = _BatchCopy()
    copy.buf = np.zeros(start_size, np.uint8)  # a buffer left by an earlier, smaller slot
    assert copy.gather_batches(mapping, starts, lens, batch) == int(lens.sum())
    if lens.size:  # the buffer ends holding the last batch, back to back
        last = range((lens.size - 1) // batch * batch, lens.size)
        expect = np.concatenate([mapping[starts[t]:starts[t] + lens[t]] for t in last])
        assert np.array_equal(copy.buf[:expect.size], expect)
        biggest = max(int(lens[i:i + batch].sum()) for i in range(0, lens.size, batch))
        assert copy.buf.size >= biggest
