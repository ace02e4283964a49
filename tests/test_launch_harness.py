"""tests/mpi_harness.py itself: results are collected per rank, and a hung job is killed."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from mpi_harness import _session_pids, run_mpi


@pytest.mark.mpiexec
def test_results_and_exit_code() -> None:
    code = """
from _result import emit
emit({"x": 1})
emit({"x": 2})
"""
    run = run_mpi(2, code, timeout=60)
    assert run.returncode == 0
    assert run.results == {r: [{"rank": r, "x": 1}, {"rank": r, "x": 2}] for r in range(2)}
    assert run.result(1) == {"rank": 1, "x": 2}
    assert "RESULT " in run.stdout


@pytest.mark.mpiexec
def test_hung_job_is_killed_and_fails_the_test() -> None:
    """A job that outlives its timeout is killed, ranks and all, and fails the test. Which
    ranks were started by then depends on how busy the machine is, so the check is on the
    processes that carry this run's marker on their command line: none is left."""
    code = """
import os
print("PID", os.getpid(), flush=True)
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 0:
    MPI.COMM_WORLD.recv(source=1)  # never sent: rank 0 hangs, rank 1 waits in finalize
"""
    marker = f"hung-job-{uuid.uuid4().hex}"
    with pytest.raises(pytest.fail.Exception, match="timed out after 3 s") as info:
        run_mpi(2, code, args=[marker], timeout=3)
    assert "killed" in str(info.value)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    alive = [pid for pid in left.split() if _state(int(pid)) not in ("Z", "X", None)]
    assert alive == [], f"rank processes {alive} outlived the kill"


def _state(pid: int) -> str | None:
    """A process's state letter from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_session_scan_finds_nothing_for_unused_session() -> None:
    assert _session_pids(2**22 + 12345) == []
