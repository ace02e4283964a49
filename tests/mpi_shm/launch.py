"""Start an mpiexec job that a test signals while it runs (``tests/mpi_harness.run_mpi`` waits
for the end, which a signal test cannot).

The job runs in its own session; :meth:`Job.kill` SIGKILLs every process of that session,
ranks included, so nothing outlives a test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from mpi_harness import MPI_SCRIPTS, OPENMPI_ENV, REPO, require_mpiexec


class Job:
    """A running ``mpiexec -n N python SCRIPT ARGS`` with its stdout lines collected."""

    def __init__(self, nprocs: int, script: Path, args: Sequence[str],
                 env: Mapping[str, str]) -> None:
        mpiexec = require_mpiexec()
        full_env = dict(os.environ)
        full_env.update(OPENMPI_ENV)
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(MPI_SCRIPTS), str(REPO), full_env.get("PYTHONPATH", "")) if p)
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update(env)
        self.argv = [str(mpiexec), "-n", str(nprocs), sys.executable, str(script), *args]
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, env=full_env,
                                     cwd=str(REPO), start_new_session=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_lines(self, prefix: str, count: int, timeout: float) -> list[str]:
        """Wait until ``count`` stdout lines start with ``prefix``; return them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = [ln for ln in self.lines if ln.startswith(prefix)]
                left = deadline - time.monotonic()
                if len(got) >= count or left <= 0 or self.proc.poll() is not None:
                    return got
                self._cond.wait(min(left, 0.2))

    def wait(self, timeout: float) -> int | None:
        """The exit status, or ``None`` if the job still runs after ``timeout`` s."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def output(self) -> str:
        return (f"$ {' '.join(self.argv)}\n--- stdout ---\n" + "\n".join(self.lines)
                + f"\n--- stderr ---\n{self.stderr()}")

    def kill(self) -> None:
        """SIGKILL every process of the job's session (mpiexec and the ranks)."""
        sid = self.proc.pid
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 3 and int(fields[3]) == sid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._stderr.close()
