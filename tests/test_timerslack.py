"""The waiting thread's timer slack (``lmdbio.timerslack``) and how
:func:`lmdbio.mpiutil.wait_with_timeout` uses it: set while it sleeps, restored after, never
touched when the request is complete at the first test. No MPI job: the requests here are
stand-ins with ``test()``."""

from __future__ import annotations

import sys

import pytest

from lmdbio.mpiutil import MPITimeoutError, wait_with_timeout
from lmdbio.timerslack import current_timer_slack_ns, set_timer_slack_ns, timer_slack

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux") or
                                current_timer_slack_ns() is None,
                                reason="prctl(PR_SET_TIMERSLACK) is Linux's")


class Request:
    """Completes at its ``tests``-th test with ``value``; records the thread's timer slack
    at every test."""

    def __init__(self, tests: int, value: object = "cursor") -> None:
        self.left = tests
        self.value = value
        self.seen: list[int | None] = []

    def test(self) -> tuple[bool, object]:
        self.seen.append(current_timer_slack_ns())
        self.left -= 1
        return (True, self.value) if self.left <= 0 else (False, None)


@linux_only
def test_timer_slack_is_set_for_the_block_and_restored() -> None:
    before = current_timer_slack_ns()
    with timer_slack(2e-6) as changed:
        assert changed
        assert current_timer_slack_ns() == 2000
    assert current_timer_slack_ns() == before


def test_no_slack_asked_changes_nothing() -> None:
    before = current_timer_slack_ns()
    with timer_slack(None) as changed:
        assert not changed
        assert current_timer_slack_ns() == before


def test_a_slack_below_one_nanosecond_is_refused() -> None:
    # 0 would mean "the default" to Linux, not "none"
    with pytest.raises(ValueError, match=">= 1 ns"):
        set_timer_slack_ns(0)


@linux_only
def test_wait_sleeps_with_the_slack_asked_and_restores_the_threads() -> None:
    before = current_timer_slack_ns()
    req = Request(tests=4)
    assert wait_with_timeout(req, 5.0, "cursor", max_sleep=1e-4, sleep_slack=1e-6) == "cursor"
    # the first test comes before any sleep; every later one after a sleep at 1 us slack
    assert req.seen == [before, 1000, 1000, 1000]
    assert current_timer_slack_ns() == before


@linux_only
def test_a_request_complete_at_once_leaves_the_slack_alone() -> None:
    before = current_timer_slack_ns()
    req = Request(tests=1)
    assert wait_with_timeout(req, 5.0, sleep_slack=1e-6) == "cursor"
    assert req.seen == [before]


@linux_only
def test_the_timeout_still_raises_and_restores_the_slack() -> None:
    before = current_timer_slack_ns()
    req = Request(tests=10**9)
    with pytest.raises(MPITimeoutError, match=r"not complete after 0\.01 s") as info:
        wait_with_timeout(req, 0.01, "cursor", max_sleep=1e-3, sleep_slack=1e-6)
    assert info.value.request is req
    assert current_timer_slack_ns() == before


def test_without_a_slack_the_wait_is_as_before() -> None:
    req = Request(tests=3, value=None)
    assert wait_with_timeout(req, 5.0, max_sleep=1e-4) is None
    assert len(set(req.seen)) == 1  # the thread's own slack throughout


def test_waiting_starts_mpi_through_start_mpi(monkeypatch) -> None:
    """``wait_with_timeout`` may be the first MPI call of a process (a test's): it starts
    MPI as ``start_mpi`` does, so that a singleton does not leave Open MPI's 16 MiB
    ``sm_segment`` file in /dev/shm (a bare ``from mpi4py import MPI`` here did, whenever
    this file's tests ran first in a pytest worker)."""
    from lmdbio import mpiutil

    calls = []
    real = mpiutil.start_mpi
    monkeypatch.setattr(mpiutil, "start_mpi", lambda: calls.append(1) or real())
    assert wait_with_timeout(Request(tests=1), 5.0) == "cursor"
    assert calls == [1]
