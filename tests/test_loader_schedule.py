"""The loader's epoch schedule and resume state (loaders.schedule): pure, no MPI, no data.

Which slots carry an epoch's batches, how many a reader has published when a worker
leaves, how a slot's records split into batches, and how a saved state maps onto the next
run: the epoch, its batch, its stop and the job's iteration count.
"""

from __future__ import annotations

import numpy as np
import pytest

from lmdbio.errors import ConfigError, LmdbioError
from loaders.schedule import (
    RESUME_INVARIANTS,
    EpochSchedule,
    EpochSlots,
    batch_bounds,
    check_resumable,
    epoch_length,
    whole_first_slot_batches,
)


def run_job(schedule: EpochSchedule, epochs: int, limit: int, per: int,
            consumed: dict[int, int] | None = None) -> list[tuple[int, int, int]]:
    """``(epoch, start, stop)`` of each epoch ``schedule.job`` chooses, each then run from
    its start to its stop (or to ``consumed[epoch]``, a trainer leaving early) as the
    loader's loop does: begin, enter, move, end or leave."""
    out = []
    for epoch in schedule.job(epochs, limit, per):
        start, stop = schedule.begin()
        schedule.enter(start)
        out.append((epoch, start, stop))
        end = epoch_length(per, stop)
        if consumed is not None and epoch in consumed:
            schedule.position = consumed[epoch]
            schedule.left(end)
        else:
            schedule.position = end
            schedule.end(end)
    return out


# ----------------------------------------------------------------- slots
def test_an_epoch_travels_in_runs_of_per_slot_batches_the_last_shorter() -> None:
    slots = EpochSlots.of(0, 10, 3)
    assert slots.groups == ((0, 3), (3, 3), (6, 3), (9, 1))
    assert len(slots) == 4
    assert [slots.slot_of(i) for i in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert [slots.batches_in_slot_of(i) for i in (0, 5, 8, 9)] == [3, 3, 3, 1]


def test_a_resumed_epoch_starts_with_the_rest_of_its_run() -> None:
    slots = EpochSlots.of(4, 10, 3)
    assert slots.groups == ((4, 2), (6, 3), (9, 1))
    assert [slots.slot_of(i) for i in (4, 5, 6, 9)] == [0, 0, 1, 2]
    assert slots.batches_in_slot_of(4) == 2


def test_a_stopped_epoch_ends_its_last_slot_at_the_stop() -> None:
    assert EpochSlots.of(0, 7, 3).groups == ((0, 3), (3, 3), (6, 1))
    assert EpochSlots.of(0, 2, 3).groups == ((0, 2),)
    assert EpochSlots.of(5, 5, 3).groups == ()


def test_one_batch_per_slot_is_one_slot_per_batch() -> None:
    slots = EpochSlots.of(2, 6, 1)
    assert slots.groups == ((2, 1), (3, 1), (4, 1), (5, 1))
    assert [slots.slot_of(i) for i in range(2, 6)] == [0, 1, 2, 3]


def test_a_colocated_reader_reads_depth_slots_ahead_never_past_the_epoch() -> None:
    slots = EpochSlots.of(0, 10, 3)  # 4 slots
    assert [slots.read_ahead_limit(i, 2) for i in (0, 2, 3, 6, 9)] == [2, 2, 3, 4, 4]
    assert [slots.read_ahead_limit(i, 1) for i in (0, 3, 9)] == [1, 2, 4]


def test_what_a_worker_leaving_early_must_drain_depends_on_who_reads() -> None:
    slots = EpochSlots.of(0, 10, 3)
    # a dedicated reader publishes the whole epoch whatever the workers do
    assert slots.published(1, 2, shared=True, dedicated=True) == 4
    # colocated: the read-ahead at the last batch taken (batch 4: slot 1, depth 2)
    assert slots.published(5, 2, shared=True, dedicated=False) == 3
    # nothing taken yet: the read-ahead at the epoch's first batch
    assert slots.published(0, 2, shared=True, dedicated=False) == 2
    # every rank reads for itself: nothing published for others
    assert slots.published(5, 2, shared=False, dedicated=False) == 0


def test_a_resumed_colocated_epoch_counts_from_its_first_slot() -> None:
    slots = EpochSlots.of(4, 10, 3)  # slots from 4, 6, 9
    assert slots.published(4, 1, shared=True, dedicated=False) == 1
    assert slots.published(7, 1, shared=True, dedicated=False) == 2


# ----------------------------------------------------------------- batches of a slot
def test_a_slot_s_records_split_into_its_batches_by_the_plan() -> None:
    sizes = np.array([[2, 3], [2, 3], [1, 2], [2, 2]], np.int64)  # batches x workers
    np.testing.assert_array_equal(batch_bounds(sizes, 1, 0, 3, 8), [0, 3, 6, 8])
    np.testing.assert_array_equal(batch_bounds(sizes, 0, 2, 2, 3), [0, 1, 3])
    # a slot of one batch is all its records, whatever the plan holds
    np.testing.assert_array_equal(batch_bounds(sizes, 0, 1, 1, 7), [0, 7])


def test_a_slot_that_disagrees_with_the_plan_is_refused() -> None:
    sizes = np.array([[2], [2], [2]], np.int64)
    with pytest.raises(LmdbioError, match="holds 5 records for worker 0, the plan 6"):
        batch_bounds(sizes, 0, 0, 3, 5)


def test_the_first_slot_of_a_whole_epoch() -> None:
    assert whole_first_slot_batches(10, 3) == 3
    assert whole_first_slot_batches(2, 3) == 2
    assert whole_first_slot_batches(0, 3) == 0


def test_an_epoch_s_length_is_its_stop_when_it_has_one() -> None:
    assert epoch_length(10, 0) == 10
    assert epoch_length(10, 4) == 4
    assert epoch_length(10, 12) == 10


# ----------------------------------------------------------------- choosing epochs
def test_set_epoch_keeps_the_start_and_stop_of_the_same_epoch_only() -> None:
    s = EpochSchedule()
    s.load({"epoch": 2, "iteration": 5, "stop_iteration": 8, "job_iteration": 25}, 10)
    s.set_epoch(2)  # the loaded epoch: its batch and its stop stay
    assert (s.epoch, s.start_iteration, s.stop_iteration) == (2, 5, 8)
    s.set_epoch(3)  # another epoch: from its start, whole
    assert (s.epoch, s.start_iteration, s.stop_iteration) == (3, 0, 0)
    s.set_epoch(3, 6)
    assert s.stop_iteration == 6
    s.set_epoch(3)
    assert s.stop_iteration == 6
    with pytest.raises(ConfigError, match="stop_iteration must be >= 0"):
        s.set_epoch(3, -1)


def test_a_job_runs_its_epochs_whole_without_a_limit() -> None:
    s = EpochSchedule()
    assert run_job(s, 3, 0, 10) == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    assert (s.epoch, s.position, s.job_base) == (3, 0, 30)


def test_max_iterations_stops_the_last_epoch_inside_itself() -> None:
    s = EpochSchedule()
    assert run_job(s, 5, 25, 10) == [(0, 0, 0), (1, 0, 0), (2, 0, 5)]
    assert (s.epoch, s.job_base) == (3, 25)


def test_an_epoch_left_early_still_counts_whole_for_the_job() -> None:
    s = EpochSchedule()
    assert run_job(s, 3, 25, 10, consumed={0: 4}) == [(0, 0, 0), (1, 0, 0), (2, 0, 5)]


def test_leaving_an_epoch_moves_on_unless_the_next_one_was_chosen() -> None:
    s = EpochSchedule()
    s.set_epoch(0)
    start, _ = s.begin()
    s.enter(start)
    s.position = 3
    s.left(10)  # nothing chosen since: the next epoch
    assert (s.epoch, s.position, s.job_base) == (1, 0, 10)
    start, _ = s.begin()
    s.enter(start)
    s.position = 2
    s.set_epoch(7)  # chosen while still inside epoch 1: leaving starts epoch 7
    s.left(10)
    assert (s.epoch, s.position, s.job_base) == (7, 0, 10)


def test_a_stop_before_the_start_is_refused() -> None:
    s = EpochSchedule()
    s.load({"epoch": 0, "iteration": 6, "stop_iteration": 6, "job_iteration": 6}, 10)
    s.set_epoch(0, 4)
    with pytest.raises(ConfigError, match="stop_iteration 4 is before the batch the loop "
                       r"starts at \(6\)"):
        s.begin()


# ----------------------------------------------------------------- state and resume
def test_the_state_holds_the_epoch_the_batch_and_the_job_iteration() -> None:
    s = EpochSchedule()
    assert run_job(s, 2, 0, 10) == [(0, 0, 0), (1, 0, 0)]
    s.set_epoch(2, 7)
    start, stop = s.begin()
    s.enter(start)
    s.position = 3
    assert s.state(stop) == {"epoch": 2, "iteration": 3, "job_iteration": 23,
                             "stop_iteration": 7}


def test_a_state_round_trips_and_resumes_at_its_batch() -> None:
    saved = EpochSchedule()
    for epoch in saved.job(4, 0, 10):
        start, _ = saved.begin()
        saved.enter(start)
        if epoch == 1:
            saved.position = 6
            break
        saved.position = 10
        saved.end(10)
    state = saved.state(0)
    assert state == {"epoch": 1, "iteration": 6, "job_iteration": 16, "stop_iteration": 0}
    resumed = EpochSchedule()
    resumed.load(state, 10)
    assert (resumed.epoch, resumed.start_iteration, resumed.job_base) == (1, 6, 10)
    # the job goes on at epoch 1 batch 6, then runs the rest as the straight one did
    assert run_job(resumed, 4, 0, 10) == [(1, 6, 0), (2, 0, 0), (3, 0, 0)]
    assert resumed.job_base == 40


def test_a_resumed_job_counts_the_iterations_that_ran_before_against_the_limit() -> None:
    resumed = EpochSchedule()
    resumed.load({"epoch": 1, "iteration": 4, "stop_iteration": 0, "job_iteration": 14}, 10)
    assert run_job(resumed, 5, 35, 10) == [(1, 4, 0), (2, 0, 0), (3, 0, 5)]
    # a state saved before job_iteration was kept: every earlier epoch ran whole
    old = EpochSchedule()
    old.load({"epoch": 2, "iteration": 3}, 10)
    assert (old.job_base, old.stop_iteration) == (20, 0)
    assert run_job(old, 5, 39, 10) == [(2, 3, 0), (3, 0, 9)]


def test_a_state_at_the_limit_runs_nothing() -> None:
    s = EpochSchedule()
    s.load({"epoch": 2, "iteration": 5, "stop_iteration": 5, "job_iteration": 25}, 10)
    assert run_job(s, 5, 25, 10) == []


def test_a_limit_that_cuts_the_saved_epoch_elsewhere_is_refused() -> None:
    s = EpochSchedule()
    s.load({"epoch": 1, "iteration": 4, "stop_iteration": 8, "job_iteration": 14}, 10)
    with pytest.raises(ConfigError, match=r"max_iterations 30 ends this job after epoch 1 "
                       r"whole.*\(max_iterations 18, or at most 14"):
        run_job(s, 5, 30, 10)
    s.load({"epoch": 1, "iteration": 4, "stop_iteration": 8, "job_iteration": 14}, 10)
    assert run_job(s, 5, 18, 10) == [(1, 4, 8)]


def test_a_loop_that_stops_the_resumed_epoch_elsewhere_is_refused() -> None:
    s = EpochSchedule()
    s.load({"epoch": 1, "iteration": 4, "stop_iteration": 8, "job_iteration": 14}, 10)
    s.set_epoch(1, 9)
    with pytest.raises(ConfigError, match="the state loaded stops this epoch at 8, this "
                       "loop at 9"):
        s.begin()
    # the loaded state is consumed by that loop: the next one may stop where it likes
    s.set_epoch(1, 9)
    assert s.begin() == (4, 9)


def test_a_state_resumes_only_the_same_data_order_and_world() -> None:
    mine = {"seed": 1, "shuffle": "global", "batch_size": 8, "last": "drop",
            "consumers": 2, "snapshot": [1, 7, 3, 4096]}
    check_resumable(dict(mine), mine)
    for key in RESUME_INVARIANTS:
        other = {**mine, key: "changed"}
        with pytest.raises(ConfigError, match=f"load_state_dict: {key} was 'changed'"):
            check_resumable(other, mine)
    lacking = {k: v for k, v in mine.items() if k != "snapshot"}
    with pytest.raises(ConfigError, match="snapshot was None"):
        check_resumable(lacking, mine)
