"""launch/: launcher detection, mpiexec lines for Open MPI and MPICH, and a real 2-rank launch."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_harness import OPENMPI_ENV, REPO, require_mpiexec

from launch import mpirun
from launch.detect import LauncherInfo, detect_launcher, slurm_tasks_on_node
from lmdbio.commands import launch as launch_cmd
from lmdbio.errors import ConfigError, LmdbioError

# --------------------------------------------------------------------------- detection


def test_detect_nothing() -> None:
    assert detect_launcher({}) is None
    assert detect_launcher({"HOME": "/root", "RANK": "3"}) is None  # RANK alone is not enough


def test_detect_openmpi() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        # a batch allocation's variables are also there: Open MPI's must win
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "8",
        "PMIX_RANK": "5",
    }
    assert detect_launcher(env) == LauncherInfo(
        "openmpi", 5, 8, 1, 4, None, "OMPI_COMM_WORLD_*"
    )


def test_detect_mpich_hydra() -> None:
    env = {"PMI_RANK": "2", "PMI_SIZE": "6", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "3"}
    info = detect_launcher(env)
    assert (info.name, info.rank, info.size, info.local_rank, info.local_size) == (
        "mpich", 2, 6, 0, 3)


def test_detect_srun_with_pmi2() -> None:
    env = {"PMI_RANK": "9", "PMI_SIZE": "16", "SLURM_LOCALID": "1", "SLURM_PROCID": "9",
           "SLURM_NTASKS": "16"}
    info = detect_launcher(env)
    assert (info.name, info.rank, info.size, info.local_rank) == ("slurm-pmi", 9, 16, 1)


def test_detect_slurm() -> None:
    env = {
        "SLURM_PROCID": "7",
        "SLURM_NTASKS": "10",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "3",
        "SLURM_STEP_TASKS_PER_NODE": "3(x2),2(x2)",
    }
    info = detect_launcher(env)
    assert info == LauncherInfo("slurm", 7, 10, 1, 2, 3, "SLURM_PROCID/SLURM_NTASKS")
    assert info.to_dict()["node_index"] == 3


def test_detect_torchrun() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": "1"}
    assert detect_launcher(env) == LauncherInfo(
        "torchrun", 3, 4, 1, 2, 1, "RANK/WORLD_SIZE/LOCAL_RANK"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, "not below size"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE is not set"),
        ({"PMI_RANK": "-1", "PMI_SIZE": "2"}, "negative"),
        ({"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"}, "not positive"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
         "local rank 2 is not below local size 2"),
    ],
)
def test_detect_rejects_malformed(env: dict[str, str], message: str) -> None:
    with pytest.raises(LmdbioError, match=message.replace("(", r"\(").replace("[", r"\[")):
        detect_launcher(env)


_VARS = ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
         "SLURM_NODEID", "SLURM_TASKS_PER_NODE", "PMIX_RANK", "RANK", "WORLD_SIZE",
         "LOCAL_RANK", "LOCAL_WORLD_SIZE"]


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(_VARS),
                       st.one_of(st.integers(-3, 40).map(str), st.text(max_size=6))))
def test_detect_fuzz(env: dict[str, str]) -> None:
    """Any environment gives a consistent LauncherInfo, None, or a clear LmdbioError."""
    try:
        info = detect_launcher(env)
    except LmdbioError as exc:
        assert any(v in str(exc) for v in _VARS) or "rank" in str(exc) or "size" in str(exc)
        return
    if info is not None:
        assert 0 <= info.rank < info.size
        if info.local_rank is not None and info.local_size is not None:
            assert 0 <= info.local_rank < info.local_size


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 5)), min_size=1, max_size=6))
def test_slurm_tasks_per_node_parser(groups: list[tuple[int, int]]) -> None:
    text = ",".join(f"{c}(x{r})" if r > 1 else str(c) for c, r in groups)
    expanded = [c for c, r in groups for _ in range(r)]
    for node, count in enumerate(expanded):
        assert slurm_tasks_on_node(text, node) == count
    assert slurm_tasks_on_node(text, len(expanded)) is None
    assert slurm_tasks_on_node("garbage", 0) is None


# --------------------------------------------------------------------------- lines


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text("dataset: {path: /data/train}\n")
    return p


def test_flavor_from_version_text() -> None:
    f = mpirun.flavor_from_version_text
    assert f("Open MPI v5.0.11, package: Open MPI user@localhost Distribution") == "openmpi"
    assert f("mpiexec (Open MPI) 4.1.6") == "openmpi"
    assert f("MPICH Version:      4.2.0\nMPICH Release date: ...") == "mpich"
    assert f("HYDRA build details:\n    Version: 4.1.2") == "mpich"
    assert f("Intel(R) MPI Library 2021.10 for Linux* OS") == "mpich"
    assert f("something else") is None


def test_openmpi_line(config: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=4\nnode2 slots=4\n")
    plan = mpirun.build_launch(
        8, ["python", "train.py", "--lr", "0.1"], config=config, per_node=4, hostfile=hosts,
        simulate_nodes=0, flavor="openmpi", mpiexec="mpiexec", cores=16, is_root=False,
    )
    assert plan.argv == [
        "mpiexec", "-n", "8", "--map-by", "ppr:4:node", "--hostfile", str(hosts.resolve()),
        "-x", f"LMDBIO_CONFIG={config.resolve()}", "python", "train.py", "--lr", "0.1",
    ]
    assert plan.env == {}


def test_openmpi_line_oversubscribed_root_simulated(config: Path) -> None:
    plan = mpirun.build_launch(
        6, ["python", "t.py"], config=config, simulate_nodes=3, flavor="openmpi",
        mpiexec="/x/mpiexec", cores=2, is_root=True, mpi_args=["--bind-to", "none"],
        environ={},
    )
    assert plan.argv == [
        "/x/mpiexec", "-n", "6", "--oversubscribe",
        "-x", f"LMDBIO_CONFIG={config.resolve()}", "-x", "LMDBIO_SIMULATE_NODES=3",
        "--bind-to", "none", "python", "t.py",
    ]
    # one host: Open MPI's UCX one-sided component is left out (it only prints errors)
    assert plan.env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                        "OMPI_MCA_osc": "^ucx"}
    assert plan.shell_line().startswith(
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc='^ucx' "
        "/x/mpiexec -n 6"
    )
    # ranks per node beyond the cores: the oversubscribe modifier goes on the mapping
    plan = mpirun.build_launch(4, ["a"], per_node=4, flavor="openmpi", mpiexec="m", cores=2,
                               is_root=False)
    assert plan.argv[:5] == ["m", "-n", "4", "--map-by", "ppr:4:node:oversubscribe"]


def test_mpich_line(config: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1:4\nnode2:4\n")
    plan = mpirun.build_launch(
        8, ["python", "train.py"], config=config, per_node=4, hostfile=hosts, simulate_nodes=2,
        flavor="mpich", mpiexec="mpiexec.hydra", cores=2, is_root=True,
    )
    assert plan.argv == [
        "mpiexec.hydra", "-n", "8", "-ppn", "4", "-f", str(hosts.resolve()),
        "-genv", "LMDBIO_CONFIG", str(config.resolve()), "-genv", "LMDBIO_SIMULATE_NODES", "2",
        "python", "train.py",
    ]
    assert plan.env == {}  # Hydra needs neither root flags nor oversubscription


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nprocs": 0}, "-n must be at least 1"),
        ({"simulate_nodes": 5}, "--simulate-nodes must be between 0 and -n"),
        ({"per_node": 0}, "--per-node must be at least 1"),
        ({"config": "/nonexistent/job.yaml"}, "does not exist"),
        ({"hostfile": "/nonexistent/hosts"}, "does not exist"),
        ({"flavor": "lam"}, "--mpi must be one of"),
        ({"command": []}, "no command"),
    ],
)
def test_build_launch_rejects(kwargs: dict, message: str) -> None:
    args = {"nprocs": 4, "command": ["python"], "flavor": "openmpi", "mpiexec": "m",
            "cores": 2, "is_root": False}
    args.update(kwargs)
    nprocs, command = args.pop("nprocs"), args.pop("command")
    with pytest.raises(ConfigError, match=message):
        mpirun.build_launch(nprocs, command, **args)


@pytest.mark.mpiexec
def test_detected_flavor_matches_the_installed_mpiexec() -> None:
    require_mpiexec()
    imported_before = "mpi4py.MPI" in sys.modules
    mpiexec = mpirun.find_mpiexec()
    banner = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                            timeout=30, check=False).stdout
    assert mpirun.detect_mpi_flavor(mpiexec) == mpirun.flavor_from_version_text(banner)
    # detection did not import (and so initialize) MPI in this process
    assert ("mpi4py.MPI" in sys.modules) == imported_before


def test_dry_run_standalone(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = mpirun.main(["-n", "4", "--mpi", "mpich", "--per-node", "2", "--dry-run",
                      "--mpiexec", "mpiexec", str(config), "--", "python", "t.py", "-n", "3"])
    assert rc == 0
    line = capsys.readouterr().out.strip()
    assert line == (
        f"mpiexec -n 4 -ppn 2 -genv LMDBIO_CONFIG {config.resolve()} python t.py -n 3"
    )


def test_dry_run_default_command_is_lmdbio_run(config, capsys) -> None:
    assert mpirun.main(["-n", "2", "--mpi", "openmpi", "--mpiexec", "mpiexec", "--dry-run",
                        str(config)]) == 0
    out = capsys.readouterr().out
    assert f"-m lmdbio.cli run {config.resolve()}" in out


def _parse_like_cli(argv: list[str]) -> argparse.Namespace:
    """What lmdbio.cli does for ``lmdbio launch ...`` (parse_known_args + extra_args)."""
    parser = argparse.ArgumentParser(prog="lmdbio launch")
    launch_cmd.add_arguments(parser)
    args, extra = parser.parse_known_args(argv)
    assert launch_cmd.ACCEPTS_EXTRA_ARGS is True
    args.extra_args = extra
    return args


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "2", "--mpi", "mpich", "--mpiexec", "mx", "--dry-run", "CFG", "--", "py", "-n",
         "5"],
        ["-n", "2", "CFG", "--mpi", "mpich", "--mpiexec", "mx", "--dry-run", "--", "py", "-n",
         "5"],
    ],
)
def test_lmdbio_launch_command(argv: list[str], config: Path, capsys) -> None:
    argv = [str(config) if a == "CFG" else a for a in argv]
    assert launch_cmd.main(_parse_like_cli(argv)) == 0
    assert capsys.readouterr().out.strip().endswith(f"{config.resolve()} py -n 5")


def test_lmdbio_launch_unknown_option_is_not_a_command(config: Path) -> None:
    args = _parse_like_cli(["-n", "2", "--bogus", "--dry-run", str(config), "--", "py"])
    with pytest.raises(ConfigError, match="'--bogus'"):
        launch_cmd.main(args)


def test_refuses_to_nest_inside_an_mpi_job(config: Path, monkeypatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    args = _parse_like_cli(["-n", "2", "--mpi", "openmpi", "--mpiexec", "m", str(config)])
    with pytest.raises(LmdbioError, match="already running as rank 0"):
        launch_cmd.main(args)


def test_no_mpiexec_variable_is_checked_where_the_launcher_starts_mpiexec() -> None:
    check = mpirun.check_mpiexec_allowed
    check(["mpiexec", "-n", "2"], {})
    check(["mpiexec", "-n", "2"], {mpirun.NO_MPIEXEC_ENV: ""})
    with pytest.raises(LmdbioError, match=r"not starting /x/mpiexec: "
                                          r"LMDBIO_TESTS_WITHOUT_MPIEXEC=1 is set"):
        check(["/x/mpiexec", "-n", "2"], {mpirun.NO_MPIEXEC_ENV: "1"})


def _stand_in_mpiexec(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that only leaves a file when started: (the program, the file)."""
    ran = tmp_path / "mpiexec-ran"
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\ntouch '{ran}'\n")
    fake.chmod(0o755)
    return fake, ran


def test_lmdbio_launch_starts_no_mpiexec_under_make_unit(config: Path, tmp_path: Path) -> None:
    """``make unit`` sets LMDBIO_TESTS_WITHOUT_MPIEXEC: ``lmdbio launch`` run in a subprocess
    (as a test of the launcher, of ``lmdbio demo`` or of a trainer would run it) refuses to
    start mpiexec, naming the variable, and exits 2; nothing was started."""
    fake, ran = _stand_in_mpiexec(tmp_path)
    env = {**os.environ, mpirun.NO_MPIEXEC_ENV: "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "lmdbio.cli", "launch", "-n", "2", "--mpi", "openmpi",
         "--mpiexec", str(fake), str(config), "--", "true"],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"not starting {fake}: {mpirun.NO_MPIEXEC_ENV}=1 is set" in out.stderr
    assert "@pytest.mark.mpiexec" in out.stderr
    assert not ran.exists()


def test_without_the_variable_the_same_line_starts_mpiexec(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The refusal is the variable's doing: a dry run still prints the line, and without the
    variable the launcher starts the (stand-in) mpiexec."""
    fake, ran = _stand_in_mpiexec(tmp_path)
    argv = ["-n", "2", "--mpi", "openmpi", "--mpiexec", str(fake), str(config), "--", "true"]
    monkeypatch.setenv(mpirun.NO_MPIEXEC_ENV, "1")
    assert mpirun.main(["--dry-run", *argv]) == 0
    assert f"{fake} -n 2 " in capsys.readouterr().out
    monkeypatch.delenv(mpirun.NO_MPIEXEC_ENV)
    assert mpirun.main(argv) == 0
    assert ran.exists()


# --------------------------------------------------------------------------- real launch


@pytest.mark.mpiexec
def test_real_launch_two_ranks(config: Path) -> None:
    """``python -m launch.mpirun`` execs mpiexec; each rank sees the exported variables."""
    require_mpiexec()
    code = (
        "import os; from launch.detect import detect_launcher; i = detect_launcher(); "
        "print('RANK', i.rank, i.size, os.environ['LMDBIO_CONFIG'], "
        "os.environ['LMDBIO_SIMULATE_NODES'], flush=True)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(OPENMPI_ENV)  # oversubscription on a loaded 2-core host
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-m", "launch.mpirun", "-n", "2", "--simulate-nodes", "2",
         str(config), "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("RANK"))
    assert lines == [f"RANK {r} 2 {config.resolve()} 2" for r in range(2)]


# --------------------------------------------------------------------------- output passing


class _Recorder:
    """A text stream that tells a waiting test what was written so far."""

    def __init__(self) -> None:
        import threading

        self.text = ""
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            self.text += text
            self.changed.notify_all()
        return len(text)

    def flush(self) -> None:
        pass

    def wait_for(self, text: str, timeout: float = 20.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: text in self.text, timeout=timeout)


def test_pass_on_forwards_carriage_return_updates_as_they_come() -> None:
    """A progress bar redraws with \\r and no \\n: each state is passed on at once, not
    when the rank's output ends (the child waits for the test before drawing the next)."""
    import threading

    script = (
        "import sys\n"
        "for i in range(3):\n"
        "    sys.stderr.write(f'\\rstep {i}/3'); sys.stderr.flush()\n"
        "    sys.stdin.readline()\n"
        "sys.stderr.write('\\rstep 3/3\\n')\n"
        "sys.stderr.write('done\\r\\nno end')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert child.stdin is not None and child.stderr is not None
    out = _Recorder()
    copier = threading.Thread(target=mpirun._pass_on,
                              args=(child.stderr, out, mpirun._LostHosts()), daemon=True)
    copier.start()
    try:
        for i in range(3):
            assert out.wait_for(f"\rstep {i}/3"), f"step {i} not passed on: {out.text!r}"
            child.stdin.write(b"\n")
            child.stdin.flush()
    finally:
        child.stdin.close()
        child.wait(timeout=30)
        copier.join(timeout=30)
    assert out.text == "\rstep 0/3\rstep 1/3\rstep 2/3\rstep 3/3\ndone\r\nno end"


def test_pass_on_scans_for_lost_hosts_across_chunks() -> None:
    import io

    banner = (b"x" * 70000 + b"\rPRTE has lost communication with a remote daemon\n"
              b"  Remote daemon: [prterun-x] on node host7\n")
    scan = mpirun._LostHosts()
    out = _Recorder()
    mpirun._pass_on(io.BufferedReader(io.BytesIO(banner)), out, scan)  # type: ignore[arg-type]
    assert scan.lost and scan.hosts == ["host7"]
    assert out.text == banner.decode()
