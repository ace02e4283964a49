"""The batch ring under mpiexec: round trips, run-ahead, corruption, failures, signals.

Every job gets private Open MPI backing directories inside /dev/shm (``osc_sm`` for shared
windows, ``btl_sm`` for the runtime's own segments), so "no file left behind" is checked on
exactly this job's files even while other jobs use /dev/shm. The ring timeout in the failure
scripts (120 s) is far above these tests' deadlines: a job can only end in time if failures
propagate.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mpi_harness import run_mpi
from mpi_shm.launch import Job

HERE = Path(__file__).resolve().parent / "mpi_shm"
SCENARIOS = HERE / "ring_scenarios.py"
FAILURES = HERE / "ring_failures.py"



@pytest.fixture
def shm_env() -> Iterator[dict[str, str]]:
    """Private backing directories for this job's shared memory, checked empty afterwards."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    root = Path(tempfile.mkdtemp(prefix="lmdbio-shmtest-", dir="/dev/shm"))
    (root / "osc").mkdir()
    (root / "btl").mkdir()
    env = {
        "OMPI_MCA_osc_sm_backing_directory": str(root / "osc"),
        "OMPI_MCA_btl_sm_backing_directory": str(root / "btl"),
        "OMPI_MCA_osc": "^ucx",  # only quiets osc/ucx's component-query message
        "LMDBIO_TEST_SHM_ROOT": str(root),
    }
    try:
        yield env
    finally:
        shutil.rmtree(root, ignore_errors=True)


def leftovers(env: dict[str, str]) -> list[str]:
    root = Path(env["LMDBIO_TEST_SHM_ROOT"])
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def by_scenario(run) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for rank, objs in run.results.items():
        for obj in objs:
            out.setdefault(obj["scenario"], {})[rank] = obj
    return out


@pytest.mark.mpiexec
def test_ring_scenarios_one_node(shm_env):
    specs = ["roundtrip:1", "roundtrip:2", "roundtrip:4", "hold:1", "hold:3", "corrupt",
             "capacity", "resize", "config", "views"]
    run = run_mpi(3, SCENARIOS, ["1", *specs], timeout=90, env=shm_env)
    got = by_scenario(run)
    assert sorted(got) == sorted(specs), run.output()
    for spec in specs:
        assert sorted(got[spec]) == [0, 1, 2], (spec, run.output())
    for k in (1, 2, 4):
        reader = got[f"roundtrip:{k}"][0]
        assert reader["published"] == 40 and 1 <= reader["max_in_flight"] <= k
        assert got[f"roundtrip:{k}"][1]["consumed"] == 40
        # the window lives in this job's private osc directory, already unlinked while mapped
        assert reader["mapping"].startswith(shm_env["OMPI_MCA_osc_sm_backing_directory"])
        assert reader["mapping"].endswith("(deleted)") and reader["backing_file"] is None
    assert "checksum mismatch" in got["corrupt"][2]["payload_error"]
    assert "header checksum mismatch" in got["corrupt"][1]["header_error"]
    cap = got["capacity"][0]
    assert "needs 1500 payload bytes but a ring slot holds 1000" in cap["payload"]
    assert "needs 9 records" in cap["records"] and "needs 20 key bytes" in cap["keys"]
    assert "still holds 1 slot" in got["resize"][0]["refused"]
    assert got["resize"][0]["needed"] > 2000
    for rank in (0, 1, 2):
        errs = got["config"][rank]
        assert "must be equal on every rank" in errs["mismatch"]
        assert "the reader must give payload_bytes and max_records" in errs["sizes"]
        assert "workers must be distinct" in errs["workers"]
        assert "slots (prefetch depth) must be >= 1" in errs["slots"]
    assert "still alive" in run.stderr  # views kept past close(): window kept, warning given
    assert leftovers(shm_env) == []


@pytest.mark.mpiexec
def test_ring_two_simulated_nodes(shm_env):
    specs = ["roundtrip:2", "hold:2", "corrupt"]
    run = run_mpi(4, SCENARIOS, ["2", "--checksum=crc32", *specs], timeout=60, env=shm_env)
    got = by_scenario(run)
    for spec in specs:
        assert sorted(got[spec]) == [0, 1, 2, 3], (spec, run.output())
    # two rings, one per node, each with its own window
    maps = {got["roundtrip:2"][r]["mapping"] for r in (0, 2)}
    assert len(maps) == 2, maps
    assert got["roundtrip:2"][3]["consumed"] == 40
    assert leftovers(shm_env) == []


@pytest.mark.mpiexec
def test_ring_colocated_single_rank_nodes(shm_env):
    run = run_mpi(2, SCENARIOS, ["2", "--checksum=crc32", "solo:1", "solo:3"], timeout=60,
                  env=shm_env)
    got = by_scenario(run)
    assert sorted(got["solo:1"]) == [0, 1] and sorted(got["solo:3"]) == [0, 1], run.output()
    assert leftovers(shm_env) == []


def test_singleton_without_mpiexec(shm_env):
    """A single process started without mpiexec (an Open MPI singleton) runs a colocated ring.

    ``OMPI_MCA_btl=self``: a singleton has no peers, and Open MPI 5 leaves the 16 MiB btl/sm
    segment of a singleton in /dev/shm even after a normal exit (observed; nothing cleans up
    without prterun), so singletons should run without btl/sm.
    """
    code = (
        "from mpi4py import MPI\n"
        "from lmdbio.shm import BatchRing\n"
        "with BatchRing.create(MPI.COMM_WORLD, 0, slots=2, payload_bytes=4096, max_records=4,"
        " checksum='crc32') as ring:\n"
        "    for it in range(5):\n"
        "        w = ring.acquire_slot(0, it)\n"
        "        w.write(bytes([it]) * 8, [0, 3, 8], labels=[it, it])\n"
        "        w.publish()\n"
        "        with ring.next_slot(timeout=10) as v:\n"
        "            assert bytes(v.payload) == bytes([it]) * 8 and list(v.labels) == [it, it]\n"
        "print('SOLO OK')\n"
    )
    env = dict(os.environ, **shm_env, OMPI_MCA_btl="self", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=str(HERE.parent.parent))
    for key in [k for k in env if k.startswith(("PMIX_", "OMPI_COMM_WORLD"))]:
        del env[key]  # a singleton, even if pytest itself runs under mpiexec
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "SOLO OK" in proc.stdout, proc.stdout + proc.stderr
    assert leftovers(shm_env) == []


def read_markers(marker_dir: Path) -> dict[int, str]:
    return {int(p.name.split("-")[1]): p.read_text() for p in marker_dir.glob("shutdown-*")}


@pytest.mark.parametrize(
    ("mode", "origin", "phrase"),
    [
        ("worker-raises", 2, "injected failure in node rank 2 at iteration 5"),
        ("reader-raises", 0, "injected failure in the reader at iteration 5"),
        ("no-close", 1, "exited without closing the ring"),
    ],
)
@pytest.mark.mpiexec
def test_failure_ends_the_job(shm_env, tmp_path, mode, origin, phrase):
    run = run_mpi(4, FAILURES, [mode, str(tmp_path)], timeout=45, env=shm_env, check=False)
    assert run.returncode != 0, run.output()
    assert f"aborted by node rank {origin}" in run.stderr, run.output()
    assert "RingAbortedError" in run.stderr and phrase in run.stderr, run.output()
    markers = read_markers(tmp_path)
    assert sorted(markers) == [0, 1, 2, 3], (markers, run.output())
    for rank, text in markers.items():
        assert phrase in text, (rank, text)  # every rank's ring was aborted for that reason
    assert leftovers(shm_env) == []


@pytest.mark.mpiexec
@pytest.mark.parametrize(
    ("target", "signum"),
    [("mpiexec", signal.SIGTERM), (2, signal.SIGTERM), (1, signal.SIGINT)],
    ids=["mpiexec-SIGTERM", "rank-SIGTERM", "rank-SIGINT"],
)
def test_signal_cleans_up(shm_env, tmp_path, target, signum):
    job = Job(3, FAILURES, ["loop", str(tmp_path)], shm_env)
    try:
        running = job.wait_lines("RUNNING", 3, timeout=40)
        assert len(running) == 3, job.output()
        pids = {int(ln.split()[1]): int(ln.split()[2]) for ln in running}
        os.kill(job.proc.pid if target == "mpiexec" else pids[target], signum)
        status = job.wait(timeout=30)
        assert status is not None, f"the job did not end after {signum!r}\n{job.output()}"
        assert status != 0
        markers = read_markers(tmp_path)
        name = signal.Signals(signum).name
        direct = f"signal:{name} node rank {{r}}: signal:{name}"
        if target == "mpiexec":
            # Open MPI forwards SIGTERM to every rank; a rank may see a peer's ABORT first
            # (then it exits through the exception), and Open MPI SIGKILLs stragglers, so a
            # marker can be cut short; at least one rank ran its signal handler.
            assert any(markers.get(r) == direct.format(r=r) for r in range(3)), markers
            for text in markers.values():
                assert text == "" or f"signal:{name}" in text, markers
        else:
            assert markers[target] == direct.format(r=target), markers
            for r in set(range(3)) - {target}:
                assert f"aborted by node rank {target}: node rank {target}: signal:{name}" \
                    in markers[r], markers
        assert leftovers(shm_env) == []
    finally:
        job.kill()
