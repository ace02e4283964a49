"""tests/mpi_harness.py itself: results are collected per rank, and a hung job is killed."""

from __future__ import annotations

import pytest
from mpi_harness import _session_pids, run_mpi


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


def test_hung_job_is_killed_and_fails_the_test() -> None:
    code = """
import os
print("PID", os.getpid(), flush=True)
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 0:
    MPI.COMM_WORLD.recv(source=1)  # never sent: rank 0 hangs, rank 1 waits in finalize
"""
    with pytest.raises(pytest.fail.Exception, match="timed out after 4 s") as info:
        run_mpi(2, code, timeout=4)
    message = str(info.value)
    pids = [int(line.split()[1]) for line in message.splitlines() if line.startswith("PID ")]
    assert len(pids) == 2
    # no rank survived the kill
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            assert state in ("Z", "X"), f"rank pid {pid} still alive (state {state})"
        except FileNotFoundError:
            pass


def test_session_scan_finds_nothing_for_unused_session() -> None:
    assert _session_pids(2**22 + 12345) == []
