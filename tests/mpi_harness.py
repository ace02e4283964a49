"""Run a Python script under ``mpiexec -n N`` from an ordinary pytest test.

``run_mpi(nprocs, script)`` launches the venv's ``mpiexec`` (found next to
``sys.executable``) in its own process group, with the Open MPI settings a container needs
(run as root, oversubscribe the 2 cores) set through the environment, waits at most
``timeout`` seconds, kills the whole process group on timeout and fails the test with the
captured output - so an MPI deadlock costs one test, never the whole suite.

Result convention: a script calls ``emit(obj)`` (from ``tests/mpi/_result.py``, importable in
every script the harness runs) to record one JSON object for its rank. ``emit`` writes a line
to a per-rank file in a directory the harness creates (no interleaving with other ranks'
output) and echoes it to stdout prefixed ``RESULT ``. ``CompletedRun.results[rank]`` is the
list of objects a rank emitted; ``CompletedRun.result(rank)`` the last one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: set by ``make unit``: starting mpiexec is then an error (an unmarked MPI test); the
#: launcher refuses its own mpiexec lines then too (launch.mpirun.check_mpiexec_allowed)
from launch.mpirun import NO_MPIEXEC_ENV

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MPI_SCRIPTS = TESTS / "mpi"
RESULT_DIR_ENV = "MPI_HARNESS_RESULT_DIR"
RESULT_PREFIX = "RESULT "
#: a script for :func:`run_mpi` that runs the ``lmdbio`` command line with its arguments
CLI_SCRIPT = """
import sys
from lmdbio.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: a script for :func:`run_mpi` that runs several ``lmdbio`` command lines, one after
#: another, inside one job's ranks (one start-up, not one per command): its argument is
#: the JSON list of their argument lists; the job stops at the first that fails
CLI_RUNS_SCRIPT = """
import json, sys
from lmdbio.cli import main
for argv in json.loads(sys.argv[1]):
    code = main(argv)
    if code:
        sys.exit(code)
"""

#: what the Makefile exports: Open MPI as root in containers, more ranks than cores
OPENMPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_osc": "^ucx",  # no InfiniBand here: the UCX one-sided component only complains
}


def mpiexec_path() -> Path | None:
    """The ``mpiexec`` of the interpreter's environment (the venv), if there is one."""
    p = Path(sys.executable).parent / "mpiexec"
    return p if p.exists() else None


def require_mpiexec() -> Path:
    """``mpiexec`` or skip the test (an environment without MPI cannot run MPI tests).

    Under ``make unit`` (``LMDBIO_TESTS_WITHOUT_MPIEXEC`` set) a test that gets here fails:
    it starts mpiexec but lacks the ``mpiexec`` marker that keeps it out of the quick loop.
    """
    if os.environ.get(NO_MPIEXEC_ENV):
        pytest.fail("this test starts mpiexec but is not marked @pytest.mark.mpiexec "
                    f"({NO_MPIEXEC_ENV} is set: make unit runs no MPI jobs)")
    p = mpiexec_path()
    if p is None:
        pytest.skip(f"no mpiexec next to {sys.executable}")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed")
    return p


@dataclass
class CompletedRun:
    """What one ``mpiexec`` run produced."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    results: dict[int, list[dict]] = field(default_factory=dict)

    def result(self, rank: int) -> dict:
        """The last object ``rank`` emitted (fails the test if it emitted none)."""
        if not self.results.get(rank):
            pytest.fail(f"rank {rank} emitted no result\n{self.output()}")
        return self.results[rank][-1]

    def output(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\n(exit {self.returncode}, {self.elapsed:.1f} s)\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )

    def check(self) -> CompletedRun:
        """Fail the test (with the output) unless the run exited 0."""
        if self.returncode != 0:
            pytest.fail(f"mpiexec run failed\n{self.output()}")
        return self


def _collect(result_dir: Path, stdout: str) -> dict[int, list[dict]]:
    results: dict[int, list[dict]] = {}
    files = sorted(result_dir.glob("rank-*.jsonl"))
    if files:
        for f in files:
            for line in f.read_text().splitlines():
                if line.strip():
                    obj = json.loads(line)
                    results.setdefault(int(obj["rank"]), []).append(obj)
        return results
    for line in stdout.splitlines():  # scripts that print instead of using emit()
        if line.startswith(RESULT_PREFIX):
            obj = json.loads(line[len(RESULT_PREFIX) :])
            results.setdefault(int(obj.get("rank", 0)), []).append(obj)
    return results


def run_mpi(
    nprocs: int,
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    mpiexec_args: Sequence[str] = (),
) -> CompletedRun:
    """Run ``script`` on ``nprocs`` ranks and return their output and emitted results.

    ``script`` is a path to a ``.py`` file, a bare file name in ``tests/mpi/``, or Python
    source code (anything containing a newline). ``env`` adds to the current environment.
    With ``check`` (default) a non-zero exit fails the test; a timeout always does.
    """
    mpiexec = require_mpiexec()
    with tempfile.TemporaryDirectory(prefix="mpi-harness-") as tmp:
        tmpdir = Path(tmp)
        text = os.fspath(script)
        if "\n" in text:
            path = tmpdir / "snippet.py"
            path.write_text(text)
        else:
            path = Path(text)
            if not path.is_absolute() and not path.exists():
                path = MPI_SCRIPTS / text
            if not path.exists():
                raise FileNotFoundError(f"MPI test script {script} not found")
        result_dir = tmpdir / "results"
        result_dir.mkdir()
        full_env = dict(os.environ)
        full_env.update(OPENMPI_ENV)
        full_env.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(MPI_SCRIPTS), str(REPO), full_env.get("PYTHONPATH", "")) if p
        )
        full_env[RESULT_DIR_ENV] = str(result_dir)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        shm_folder = _private_shm_folder(full_env)
        argv = [
            str(mpiexec),
            "-n",
            str(nprocs),
            *mpiexec_args,
            sys.executable,
            str(path),
            *map(str, args),
        ]
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=str(REPO),
            start_new_session=True,  # its own process group: killable as a whole
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            run = CompletedRun(argv, -9, out, err, time.monotonic() - t0)
            pytest.fail(f"mpiexec run timed out after {timeout} s (killed)\n{run.output()}")
        finally:
            if proc.poll() is None:  # e.g. KeyboardInterrupt in communicate()
                _kill_group(proc)
            _kill_session(proc.pid)  # no rank may outlive its run (e.g. after an abort)
            if shm_folder is not None:
                shutil.rmtree(shm_folder, ignore_errors=True)
        run = CompletedRun(argv, proc.returncode, out, err, time.monotonic() - t0)
        run.results = _collect(result_dir, out)
    if check:
        run.check()
    return run


def _private_shm_folder(env: dict[str, str]) -> Path | None:
    """Point Open MPI's shared-memory files (``btl/sm`` segments, ``osc/sm`` windows) into
    a fresh folder of /dev/shm unless ``env`` names folders already (a test that inspects
    them); returns the folder, which the caller removes after the run.

    A rank that is killed (a hung job here, a test that kills one) leaves its
    ``sm_segment.*`` file behind in /dev/shm otherwise, and a suite run would leak one per
    killed job, as ``lmdbio launch`` prevents for users the same way."""
    if not os.path.isdir("/dev/shm"):
        return None
    keys = [k for k, sub in _BACKING_DIRECTORIES if k not in env]
    if not keys:
        return None
    folder = Path(tempfile.mkdtemp(prefix="lmdbio-test-mpi-", dir="/dev/shm"))
    for key, sub in _BACKING_DIRECTORIES:
        if key in keys:
            (folder / sub).mkdir()
            env[key] = str(folder / sub)
    return folder


#: Open MPI's settings for where its shared-memory files go, and a sub-folder for each
_BACKING_DIRECTORIES = (("OMPI_MCA_btl_sm_backing_directory", "btl"),
                        ("OMPI_MCA_osc_sm_backing_directory", "osc"))


def _session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (from /proc). Open MPI puts every rank in a process
    group of its own, but they all stay in the session ``start_new_session`` created."""
    pids = []
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
            pids.append(int(entry))
    return pids


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM mpiexec (it forwards to the ranks), then SIGKILL whatever of its session is
    left after 2 s, ranks included."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=2.0)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    _kill_session(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (D state): give up
        proc.wait(timeout=5.0)


def _kill_session(sid: int) -> None:
    if not os.path.isdir("/proc"):  # pragma: no cover - not Linux
        return
    for pid in _session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
