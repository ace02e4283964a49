"""The loader's pool of reusable output arrays: reuse only what nothing refers to."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from loaders.buffer_pool import BufferPool


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_dropped_array_is_handed_out_again():
    pool = BufferPool(2)
    a = pool.take((4, 3, 2), np.float32)
    assert a.shape == (4, 3, 2) and a.dtype == np.float32 and a.flags.c_contiguous
    where = _address(a)
    del a
    b = pool.take((2, 3, 2), np.float32)  # smaller fits in the same memory
    assert _address(b) == where
    assert (pool.reused, pool.allocated, len(pool)) == (1, 1, 1)


@pytest.mark.parametrize("keep", [
    lambda a: a,
    lambda a: a[1:3],
    lambda a: a.reshape(-1),
    lambda a: a.astype(np.float32, copy=False),
    lambda a: a.view(np.uint8)[::2],
    lambda a: memoryview(a[0]),
    lambda a: np.asarray(a)[0, 0],
])
def test_an_array_with_a_live_view_is_never_reused(keep):
    pool = BufferPool(2)
    a = pool.take((4, 3, 2), np.float32)
    a[:] = 7
    held = keep(a)
    before = np.array(held, copy=True)
    del a
    b = pool.take((4, 3, 2), np.float32)
    b[:] = -1
    assert np.array_equal(np.asarray(held), before)  # untouched by the next take
    assert pool.reused == 0
    del held, b
    pool.take((4, 3, 2), np.float32)
    assert pool.reused == 1


def test_beyond_capacity_arrays_are_plain_allocations():
    pool = BufferPool(2)
    kept = [pool.take((8,), np.int64) for _ in range(5)]
    assert len(pool) == 2 and pool.allocated == 5
    assert len({_address(a) for a in kept}) == 5
    off = BufferPool(0)
    x = off.take((3,), np.uint8)
    del x
    off.take((3,), np.uint8)
    assert (len(off), off.reused) == (0, 0)


def test_a_free_array_too_small_makes_room_for_a_larger_shape():
    pool = BufferPool(1)
    a = pool.take((10,), np.uint8)
    del a
    b = pool.take((1000,), np.uint8)  # the free 10-byte array is dropped, this one pooled
    assert len(pool) == 1 and b.nbytes == 1000
    del b
    pool.take((500,), np.uint8)
    assert pool.reused == 1


def test_threads_never_share_an_array():
    pool = BufferPool(3)
    seen: list[tuple[int, bool]] = []
    lock = threading.Lock()

    def work(tag: int) -> None:
        for _ in range(300):
            a = pool.take((64,), np.int64)
            a[:] = tag
            time.sleep(0)  # let another thread take (and write) meanwhile
            ok = bool((a == tag).all())
            with lock:
                seen.append((tag, ok))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1200 and all(ok for _, ok in seen)


def test_negative_capacity_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        BufferPool(-1)
