"""The first hour of a new user: what went wrong, each checked as the user met it.

1. ``lmdbio launch --simulate-nodes K`` reaches ``lmdbio run`` and ``loaders.open`` (the
   config's ``topology.simulate_nodes`` defaults to null: the launcher's variable), and the
   launcher applies the Open MPI settings a one-host job needs (no osc/ucx error lines).
2. Every error path of ``lmdbio run`` and ``loaders.open`` in one process (bad config,
   missing dataset, ``workers.device: cuda`` without a GPU) leaves nothing in /dev/shm.
3. Under mpiexec a user error is one message from rank 0 and exit code 2; a rank-local
   error still ends the job; Ctrl-C on one process is "interrupted" and exit code 130.
4. ``configs/quickstart.yaml`` reads the data set ``make run`` writes.
5. A batch larger than the data set warns (``pad``) or is an error (``drop``); a truncated
   file says what is wrong; a job of one process does not warn about its one rank.

Subprocesses run with the environment a new user has: no Open MPI settings, no launcher.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from functools import cache
from pathlib import Path

import pytest

from bench.lmdbgen import tiny_datum_items, write_db
from launch import mpirun
from lmdbio.commands import demo
from lmdbio.config import load_config
from lmdbio.errors import LmdbFormatError
from tests.mpi_harness import CLI_SCRIPT, require_mpiexec, run_mpi

REPO = Path(__file__).resolve().parents[1]
N_RECORDS = 40
#: lines Open MPI's own runtime prints about a job's teardown, whatever the job printed
OPEN_MPI_RUNTIME_NOISE = re.compile(r"^\[[^\]]+\] PMIX ERROR: ")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A small Caffe Datum LMDB: ``N_RECORDS`` 1x4x4 images."""
    path = tmp_path_factory.mktemp("first-hour-db")
    write_db(path, tiny_datum_items(N_RECORDS, seed=3))
    return path


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a new user's shell: no Open MPI or launcher settings (they would
    hide what lmdbio must set itself), this checkout importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PRTE_", "PMIX_", "PMI_", "SLURM_", "LMDBIO_"))}
    env.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def write_job(path: Path, dataset: Path | str, extra: str = "") -> Path:
    path.write_text(f"dataset: {{path: {dataset}, layout: caffe-datum}}\n"
                    f"workers: {{device: cpu}}\nmetrics: {{every: 0}}\n{extra}")
    return path


def lmdbio(*args: str, env: dict[str, str] | None = None, timeout: float = 120
           ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmdbio.cli", *args], cwd=REPO,
                          env=env or user_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


# --------------------------------------------------------------------------- 1. nodes


@pytest.mark.slow  # whole loader jobs in two subprocesses (make test runs it)
def test_simulate_nodes_defaults_to_the_launchers_variable(db: Path, tmp_path: Path) -> None:
    """``loaders.open`` in a process the launcher told ``LMDBIO_SIMULATE_NODES=1`` runs on
    one simulated node; a number in the config wins over the variable."""
    assert load_config({"dataset": {"path": "/d"}}).topology.simulate_nodes is None
    assert load_config({"dataset": {"path": "/d"},
                        "topology": {"simulate_nodes": 0}}).topology.simulate_nodes == 0
    code = textwrap.dedent("""
        import json, sys, loaders
        with loaders.open(sys.argv[1]) as loader:
            print(json.dumps([loader.topo.simulated, loader.topo.n_nodes]))
    """)
    job = write_job(tmp_path / "job.yaml", db)
    pinned = write_job(tmp_path / "pinned.yaml", db, "topology: {simulate_nodes: 0}\n")
    seen = {}
    for name, cfg in (("env", job), ("pinned", pinned)):
        out = subprocess.run([sys.executable, "-c", code, str(cfg)], cwd=REPO, timeout=120,
                             env=user_env(LMDBIO_SIMULATE_NODES="1"), capture_output=True,
                             text=True, check=False)
        assert out.returncode == 0, out.stderr
        seen[name] = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"env": [True, 1], "pinned": [False, 1]}


def test_launch_applies_the_one_host_open_mpi_settings(tmp_path: Path) -> None:
    def plan(environ: dict[str, str], **kw: object) -> mpirun.LaunchPlan:
        return mpirun.build_launch(4, ["python", "t.py"], flavor="openmpi", mpiexec="m",
                                   cores=2, is_root=True, environ=environ, **kw)

    assert plan({}).env == {**mpirun.OPENMPI_ROOT_ENV, "OMPI_MCA_osc": "^ucx"}
    assert "--oversubscribe" in plan({}).argv  # 4 ranks on 2 cores
    # the user's own setting is kept (not overridden: mpiexec inherits it)
    assert "OMPI_MCA_osc" not in plan({"OMPI_MCA_osc": "ucx"}).env
    # several hosts (a host file, ranks per node, a Slurm allocation) may have a network
    # that UCX serves
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=2\n")
    assert "OMPI_MCA_osc" not in plan({}, hostfile=hosts).env
    assert "OMPI_MCA_osc" not in plan({}, per_node=2).env
    assert "OMPI_MCA_osc" not in plan({"SLURM_JOB_NUM_NODES": "2"}).env
    # MPICH needs none of it
    hydra = mpirun.build_launch(4, ["t"], flavor="mpich", mpiexec="m", cores=2,
                                is_root=True, environ={})
    assert hydra.env == {}


def test_launch_counts_cores_as_open_mpi_counts_slots(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Open MPI's slots are physical cores: 4 logical CPUs on 2 cores of 2 threads each
    hold 2 ranks without ``--oversubscribe``, not 4."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for cpu, core in enumerate((0, 1, 0, 1)):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    assert mpirun._cores(tmp_path) == 2
    assert mpirun._cores(tmp_path / "elsewhere") == 4  # no topology: logical CPUs


@pytest.mark.mpiexec
def test_launch_simulated_nodes_reach_lmdbio_run(db: Path, tmp_path: Path) -> None:
    """``lmdbio launch -n 4 --simulate-nodes 2 JOB -- lmdbio run JOB`` from a plain shell:
    the job runs as 2 nodes, without Open MPI's osc/ucx error lines; the batch larger than
    the data set is named once, by rank 0."""
    mpiexec = require_mpiexec()
    job = write_job(tmp_path / "job.yaml", db, "batch: {size: 64}\n")
    out = tmp_path / "metrics.json"
    run = lmdbio("launch", "-n", "4", "--simulate-nodes", "2", "--mpiexec", str(mpiexec),
                 str(job), "--", sys.executable, "-m", "lmdbio.cli", "run", str(job),
                 "--metrics-json", str(out), timeout=240)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text
    assert json.loads(out.read_text())["totals"]["nodes"] == 2, text
    assert "osc_ucx" not in text and "Error" not in text, text
    warnings = [line for line in text.splitlines() if "larger than the data set" in line]
    assert len(warnings) == 1 and "64" in warnings[0] and f"{N_RECORDS} records" in \
        warnings[0], text


# --------------------------------------------------------------------------- 2. /dev/shm


@cache
def _private_shm_works() -> bool:
    """Whether this host lets a process run with a /dev/shm of its own (a new mount
    namespace with a fresh tmpfs), so that other jobs' files cannot disturb the listing."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs lmdbio-probe "
                                "/dev/shm"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def run_with_own_shm(argv: list[str], env: dict[str, str], listing: Path
                     ) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    """Run ``argv`` with an empty /dev/shm of its own; returns the process and what
    /dev/shm held before and after it."""
    if not _private_shm_works():
        pytest.skip("cannot give a process its own /dev/shm here (unshare -m and a tmpfs "
                    "mount need CAP_SYS_ADMIN); other jobs' files would make the listing "
                    "meaningless")
    script = ('mount -t tmpfs lmdbio-test /dev/shm || exit 90; ls -A /dev/shm > "$0.before"; '
              '"$@"; rc=$?; ls -A /dev/shm > "$0.after"; exit $rc')
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, str(listing), *argv],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode != 90, proc.stderr
    before = Path(f"{listing}.before").read_text().split()
    after = Path(f"{listing}.after").read_text().split()
    return proc, before, after


def _usable_gpu() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import cupy; print(cupy.cuda.runtime."
                            "getDeviceCount())"], env=user_env(), capture_output=True,
                           text=True, timeout=120, check=False)
    return probe.returncode == 0 and probe.stdout.strip() not in ("", "0")


OPEN_LOADER = "import sys, loaders\nloaders.open(sys.argv[1])\n"


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["lmdbio run", "loaders.open"])
@pytest.mark.parametrize(("case", "message"), [
    ("bad-config", "unknown key"),
    ("missing-dataset", "no such LMDB file"),
    ("cuda-without-gpu", "workers.device is cuda"),
])
def test_error_paths_leave_nothing_in_dev_shm(db: Path, tmp_path: Path, entry: str,
                                              case: str, message: str) -> None:
    if case == "cuda-without-gpu" and _usable_gpu():
        pytest.skip("a GPU is usable here: workers.device cuda is no error")
    job = tmp_path / "job.yaml"
    if case == "bad-config":
        write_job(job, db, "batch: {sise: 4}\n")
    elif case == "missing-dataset":
        write_job(job, tmp_path / "nowhere")
    else:
        job.write_text(f"dataset: {{path: {db}}}\nworkers: {{device: cuda}}\n")
    argv = [sys.executable, "-m", "lmdbio.cli", "run", str(job)] if entry == "lmdbio run" \
        else [sys.executable, "-c", OPEN_LOADER, str(job)]
    proc, before, after = run_with_own_shm(argv, user_env(), tmp_path / "shm")
    assert proc.returncode == (2 if entry == "lmdbio run" else 1), proc.stderr
    assert message in proc.stderr, proc.stderr
    assert before == [] and after == [], (after, proc.stderr)


# --------------------------------------------------------------------------- 3. reports


def _truncated_copy(db: Path, dst: Path) -> Path:
    dst.mkdir()
    data = (db / "data.mdb").read_bytes()
    (dst / "data.mdb").write_bytes(data[:-4096])  # the last page is gone
    return dst


@pytest.mark.mpiexec
@pytest.mark.parametrize("case", ["missing-dataset", "truncated-file"])
def test_a_user_error_under_mpiexec_is_one_message_from_rank_0(db: Path, tmp_path: Path,
                                                                 case: str) -> None:
    dataset = tmp_path / "nowhere" if case == "missing-dataset" else \
        _truncated_copy(db, tmp_path / "truncated")
    job = write_job(tmp_path / "job.yaml", dataset)
    run = run_mpi(4, CLI_SCRIPT, ["run", str(job), "--set", "topology.simulate_nodes=2"],
                  timeout=120, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 2, run.output()
    # Open MPI's runtime may report its own teardown under load ("[host:pid] PMIX ERROR:
    # PMIX_ERR_UNREACH ..."): not lmdbio's output (seen with a second suite running at once)
    errors = [line for line in out.splitlines() if "error" in line.lower()
              and not OPEN_MPI_RUNTIME_NOISE.search(line)]
    assert len(errors) == 1 and errors[0].startswith("lmdbio run: error: "), run.output()
    assert str(dataset) in errors[0], run.output()
    assert "no such LMDB file" in errors[0] if case == "missing-dataset" else \
        "truncated" in errors[0], run.output()
    # no rank's traceback, no rank prefixes, no abort (Open MPI's banner about a non-zero
    # exit of its own stays)
    assert "Traceback" not in out and "[rank" not in out and "MPI_ABORT" not in out, \
        run.output()


@pytest.mark.mpiexec
def test_an_error_on_one_rank_still_ends_the_job(tmp_path: Path) -> None:
    """Rank 1 fails while the others wait for it in a barrier: they cannot join the report,
    so after the grace rank 1 says what failed and aborts the job (never a hang)."""
    snippet = textwrap.dedent("""
        from lmdbio.errors import LmdbioError
        from lmdbio.mpiutil import fail_together
        with fail_together():
            from mpi4py import MPI
            if MPI.COMM_WORLD.Get_rank() == 1:
                raise LmdbioError("the disk of rank 1 is gone")
            MPI.COMM_WORLD.Barrier()  # never completes
    """)
    run = run_mpi(3, snippet, env={"LMDBIO_FAILURE_GRACE": "1"}, timeout=90, check=False)
    assert run.returncode == 2, run.output()
    assert "[rank 1/3" in run.stderr and "error: the disk of rank 1 is gone" in run.stderr, \
        run.output()
    assert "aborting the MPI job" in run.stderr, run.output()


@pytest.mark.mpiexec
def test_every_rank_failing_reports_once_with_the_agreed_exit_code() -> None:
    """Every rank fails (ranks 0 and 2 alike, rank 1 otherwise): one report from rank 0
    naming each distinct error and its ranks, every rank exits 2, none aborts."""
    snippet = textwrap.dedent("""
        import os, sys
        from lmdbio.cli import main
        rank = os.environ["OMPI_COMM_WORLD_RANK"]
        sys.exit(main(["run", "/elsewhere/job.yaml" if rank == "1" else "/nonexistent/job.yaml"]))
    """)
    run = run_mpi(3, snippet, timeout=90, check=False)
    assert run.returncode == 2, run.output()
    lines = [line for line in run.stderr.splitlines() if line.startswith("lmdbio run")]
    assert len(lines) == 1, run.output()
    assert "ranks 0, 2: " in lines[0] and "/nonexistent/job.yaml" in lines[0], run.output()
    assert "rank 1: " in lines[0] and "/elsewhere/job.yaml" in lines[0], run.output()
    assert "MPI_ABORT" not in run.stderr, run.output()


def _interrupt_when_batches_flow(argv: list[str], log: Path, disposition: object
                                 ) -> tuple[int, str]:
    """Start ``argv``, send it SIGINT once ``log`` holds some batches; (exit code, stderr)."""
    proc = subprocess.Popen(argv, cwd=REPO, env=user_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and len(log.read_text().splitlines()) > 20):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no batch delivered in 120 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


# Ctrl-C in a terminal (SIGINT's default disposition), and `kill -INT` of a script's
# background job (which inherits SIGINT ignored)
@pytest.mark.slow
@pytest.mark.parametrize("disposition", [signal.SIG_DFL, signal.SIG_IGN],
                         ids=["terminal", "background"])
def test_ctrl_c_on_one_process_is_interrupted_with_exit_code_130(db: Path, tmp_path: Path,
                                                                  disposition: object) -> None:
    job = write_job(tmp_path / "job.yaml", db, "batch: {size: 4}\nepochs: 100000\n")
    logs = tmp_path / "records"
    code, err = _interrupt_when_batches_flow(
        [sys.executable, "-m", "lmdbio.cli", "run", str(job), "--record-log", str(logs),
         "--step-seconds", "0.002"], logs / "rank-00000.log", disposition)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "lmdbio run: interrupted", err


@pytest.mark.mpiexec
def test_ctrl_c_on_a_launched_job_is_interrupted_with_exit_code_130(db: Path,
                                                                     tmp_path: Path) -> None:
    mpiexec = require_mpiexec()
    job = write_job(tmp_path / "job.yaml", db, "batch: {size: 4}\nepochs: 100000\n")
    logs = tmp_path / "records"
    code, err = _interrupt_when_batches_flow(
        [sys.executable, "-m", "lmdbio.cli", "launch", "-n", "2", "--mpiexec", str(mpiexec),
         str(job), "--", sys.executable, "-m", "lmdbio.cli", "run", str(job), "--record-log",
         str(logs), "--step-seconds", "0.002"], logs / "rank-00001.log", signal.SIG_DFL)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "lmdbio launch: interrupted", err


# --------------------------------------------------------------------------- 4. quickstart


def test_quickstart_config_reads_what_make_run_writes() -> None:
    """README: ``make run``, then ``loaders.open("configs/quickstart.yaml")``."""
    makefile = (REPO / "Makefile").read_text()
    build = re.search(r"^BUILD\s*:?=\s*(\S+)", makefile, re.M).group(1)
    workdir = re.search(r"lmdbio demo --workdir (\S+)", makefile).group(1)
    workdir = workdir.replace("$(BUILD)", build)
    written = os.path.normpath(REPO / demo.dataset_path(workdir))
    assert load_config(REPO / "configs" / "quickstart.yaml").dataset.path == written
    # ``lmdbio demo`` with no --workdir, from the project root, writes the same place
    assert workdir == demo.DEFAULT_WORKDIR


# --------------------------------------------------------------------------- 5. smaller


@pytest.mark.slow
def test_a_batch_larger_than_the_data_set(db: Path, tmp_path: Path) -> None:
    """``pad``: a warning naming both numbers (once: one process here; the launch test
    above has four), and no warning about the one rank of a one-process job; ``drop``:
    an error instead of a job that delivers nothing."""
    job = write_job(tmp_path / "job.yaml", db, "batch: {size: 1000}\n")
    padded = lmdbio("run", str(job))
    assert padded.returncode == 0, padded.stderr
    warned = [line for line in padded.stderr.splitlines() if "larger than the data set" in line]
    assert len(warned) == 1 and "1000" in warned[0] and f"{N_RECORDS} records" in warned[0], \
        padded.stderr
    assert "960 repeated" in warned[0], padded.stderr  # what padding means here
    assert "node 0 has 1 rank(s)" not in padded.stderr, padded.stderr
    dropped = lmdbio("run", str(job), "--set", "batch.last=drop")
    assert dropped.returncode == 2, dropped.stdout + dropped.stderr
    assert "done: 0 samples" not in dropped.stdout
    assert "larger than the data set" in dropped.stderr and "1000" in dropped.stderr, \
        dropped.stderr


@pytest.mark.slow  # a whole CLI run in a subprocess (make test runs it)
def test_a_single_process_job_does_not_warn_about_its_one_rank(db: Path,
                                                               tmp_path: Path) -> None:
    done = lmdbio("run", str(write_job(tmp_path / "job.yaml", db, "batch: {size: 8}\n")))
    assert done.returncode == 0, done.stderr
    assert "rank(s)" not in done.stderr and "colocated" not in done.stderr, done.stderr
    assert "done: 40 samples" in done.stdout


def test_a_truncated_file_says_what_is_wrong(db: Path, tmp_path: Path) -> None:
    import lmdbio as engine

    pages = (db / "data.mdb").stat().st_size // 4096
    cut = _truncated_copy(db, tmp_path / "truncated")
    with pytest.raises(LmdbFormatError) as err:
        engine.open(cut)
    text = str(err.value)
    assert str(cut / "data.mdb") in text
    assert f"holds only pages 0..{pages - 2}" in text
    assert f"page {pages - 1} is past its end" in text and "truncated" in text
