"""lmdbio.mpiutil: collective failure agreement, abort instead of hang, timeouts, shutdown hooks."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mpi_harness import REPO, run_mpi

from lmdbio.errors import LmdbioError
from lmdbio.mpiutil import AgreementError, on_shutdown, remove_shutdown, run_shutdown

# agree / agreed / the timeout helpers inside the ranks of one job: tests/test_collectives.py
# (pytest-mpi, make mpi)


@pytest.mark.mpiexec
def test_abort_on_error_ends_the_job_instead_of_hanging(tmp_path: Path) -> None:
    # ranks 0, 1, 3 wait in a barrier rank 2 never reaches: without the abort the harness
    # would hit its timeout and fail the test
    run = run_mpi(4, "abort_check.py", ["2", str(tmp_path)], timeout=45, check=False)
    assert run.returncode != 0, run.output()
    assert "[rank 2/4" in run.stderr and "RuntimeError: boom on rank 2" in run.stderr
    assert "aborting the MPI job" in run.stderr
    # the failing rank ran its shutdown callbacks (reason "abort") before aborting
    assert (tmp_path / "shutdown-2").read_text() == "abort"


def test_agreement_error_message() -> None:
    err = AgreementError("map the file", {3: "ENOMEM", 1: "EEXIST"}, 8)
    assert isinstance(err, LmdbioError)
    assert str(err) == (
        "map the file: failed on 2 of 8 ranks ([1, 3]): rank 1: EEXIST; rank 3: ENOMEM"
    )


# --------------------------------------------------------------------------- shutdown hooks


def test_shutdown_callbacks_run_once_newest_first() -> None:
    calls: list[tuple[str, str]] = []
    a = on_shutdown(lambda reason: calls.append(("a", reason)))

    @on_shutdown
    def b(reason: str) -> None:
        calls.append(("b", reason))
        raise RuntimeError("a failing callback must not stop the others")

    c = on_shutdown(lambda reason: calls.append(("c", reason)))
    assert remove_shutdown(c) and not remove_shutdown(c)
    assert run_shutdown("test") == 2
    assert calls == [("b", "test"), ("a", "test")]
    assert run_shutdown("again") == 0  # each callback runs at most once
    assert not remove_shutdown(a)


@pytest.mark.parametrize(
    ("sig", "expected_rc", "reason"),
    [(signal.SIGTERM, -signal.SIGTERM, "signal:SIGTERM"), (signal.SIGINT, 3, "signal:SIGINT")],
)
def test_shutdown_callbacks_run_on_signal(
    tmp_path: Path, sig: signal.Signals, expected_rc: int, reason: str
) -> None:
    marker = tmp_path / "marker"
    code = textwrap.dedent(
        f"""
        import sys, time
        from lmdbio.mpiutil import on_shutdown
        on_shutdown(lambda reason: open({str(marker)!r}, "a").write(reason + "\\n"))
        try:
            print("ready", flush=True)
            time.sleep(30)
        except KeyboardInterrupt:  # SIGINT keeps Python's default: KeyboardInterrupt
            sys.exit(3)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == expected_rc
    # ran exactly once: the atexit pass after the signal finds nothing left to run
    assert marker.read_text() == reason + "\n"


@pytest.mark.mpiexec
def test_abort_on_a_config_error_prints_its_message_not_a_traceback() -> None:
    """A configuration mistake ends the job like any error, named by one line per rank
    (a traceback would read as a crash of lmdbio)."""
    snippet = textwrap.dedent("""
        from lmdbio.errors import ConfigError
        from lmdbio.mpiutil import abort_on_error
        with abort_on_error():
            raise ConfigError("batch.size must be >= 1, got 0")
    """)
    run = run_mpi(2, snippet, timeout=45, check=False)
    assert run.returncode != 0, run.output()
    assert "ConfigError: batch.size must be >= 1, got 0" in run.stderr, run.output()
    assert "Traceback" not in run.stderr, run.output()
