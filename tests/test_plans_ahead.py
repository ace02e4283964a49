"""Epoch plans made several epochs at a time (:mod:`lmdbio.plan.ahead`): the same plans as
made one at a time, made in groups only where they are small, read-only, and the epoch a
worker is finishing kept."""

from __future__ import annotations

import numpy as np
import pytest

from lmdbio.plan.ahead import AHEAD_EPOCHS, AHEAD_RECORDS, PlansAhead, epochs_ahead
from lmdbio.plan.epoch import EpochPlan, plan_epoch

FIELDS = ("order", "table", "sizes", "pad", "dropped")


def _plan(epoch: int) -> EpochPlan:
    return plan_epoch(600, 2, 32, "pad", "global", 7, epoch)


def _same(a: EpochPlan, b: EpochPlan) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


@pytest.mark.parametrize(("n", "ahead"), [(0, AHEAD_EPOCHS), (600, AHEAD_EPOCHS),
                                          (AHEAD_RECORDS // 3, 3), (AHEAD_RECORDS, 1),
                                          (10 * AHEAD_RECORDS, 1)])
def test_small_data_sets_plan_several_epochs_at_once(n: int, ahead: int) -> None:
    assert epochs_ahead(n) == ahead


def test_plans_made_ahead_are_the_plans_made_on_time_and_read_only() -> None:
    made: list[int] = []

    def make(e: int) -> EpochPlan:
        made.append(e)
        return _plan(e)

    plans = PlansAhead(make, 4)
    for e in range(10):
        got = plans.get(e)
        assert _same(got, _plan(e)), e
        assert not any(getattr(got, f).flags.writeable for f in FIELDS)
    # two groups of four, then the third from epoch 8: each epoch made once, in order
    assert made == list(range(12)) and plans.made == 12
    assert plans.get(9) is plans.get(9)  # one object per epoch


def test_the_epoch_before_is_kept_and_older_ones_forgotten() -> None:
    plans = PlansAhead(_plan, 3)
    first = plans.get(0)  # makes 0, 1, 2
    plans.get(3)  # makes 3, 4, 5; keeps 2 (a worker finishing it may ask again)
    assert plans.made == 6 and len(plans) == 4
    plans.get(2)
    assert plans.made == 6  # still there
    assert plans.get(0) is not first and plans.made == 8  # forgotten: made again (0, 1)
    assert len(plans) == 3  # 0, 1 and 2: 3 .. 5 forgotten too (at most ahead + 1 kept)


def test_one_epoch_at_a_time_when_ahead_is_one() -> None:
    plans = PlansAhead(_plan, 1)
    for e in (0, 1, 5, 2):
        plans.get(e)
    assert plans.made == 4
    with pytest.raises(ValueError, match="ahead >= 1"):
        PlansAhead(_plan, 0)


def test_threads_asking_at_once_get_one_plan_each_epoch() -> None:
    """A worker's decoding thread and its trainer's thread may ask at once: each epoch is
    made once and every asker of it gets the same object."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    plans = PlansAhead(_plan, 2)
    with ThreadPoolExecutor(4) as pool:
        for e in range(6):
            start = threading.Barrier(4)

            def ask(epoch: int, start: threading.Barrier = start) -> EpochPlan:
                start.wait(timeout=10)
                return plans.get(epoch)

            got = list(pool.map(ask, [e] * 4))
            assert len({id(p) for p in got}) == 1 and _same(got[0], _plan(e))
    assert plans.made == 6
