"""Progress bars and the run summary (issue 36, point 7): ``convert`` and ``run`` draw a
tqdm bar with a total, the rate and the time left when someone watches stderr (a
terminal, or ``--progress``), nothing in a pipe or a log, nothing under ``--quiet``; under
MPI one rank draws; ``run`` ends with one line whose first figure is the steady-state
rate, labelled, the whole run's second."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from bench.lmdbgen import tiny_datum_items, write_db
from lmdbio.cli import main
from lmdbio.commands import progress
from lmdbio.commands.run import summary_line
from tests.mpi_harness import CLI_SCRIPT, run_mpi

REPO = Path(__file__).resolve().parents[1]
N_RECORDS = 40
#: what a bar of ``lmdbio run`` prints when it closes (tqdm's last state, then a newline)
RUN_BAR_END = re.compile(r"100%\|[^\r\n]*\| ?([\d.]+k?)/([\d.]+k?) \[[^\]]*samples/s\]")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("progress-db")
    write_db(path, tiny_datum_items(N_RECORDS, seed=5))
    return path


@pytest.fixture
def job(db: Path, tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"dataset: {{path: {db}, layout: caffe-datum}}\nworkers: {{device: cpu}}\n"
                    "batch: {size: 4}\nepochs: 3\nmetrics: {every: 2}\n")
    return path


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "LMDBIO_"))}
    out.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), out.get("PYTHONPATH")) if p)
    out.update(extra)
    return out


def lmdbio(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmdbio.cli", *args], cwd=REPO,
                          env=environ or env(), capture_output=True, text=True, timeout=180,
                          check=False)


def lmdbio_on_a_terminal(*args: str, size: tuple[int, int] | None = (24, 100)
                         ) -> tuple[int, str, str]:
    """Run ``lmdbio ARGS`` with stderr on a pseudo-terminal of ``size`` (rows, columns;
    None: 0 x 0, as ``script`` makes in a batch job): (exit code, stdout, what the terminal
    received)."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    if size is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "lmdbio.cli", *args], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    got = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other side closed (EIO)
                return
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=180)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out, got.decode(errors="replace")


# --------------------------------------------------------------------------- deciding


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize(("flags", "environ", "tty", "expected"), [
    ({}, {}, True, True),                       # a terminal: yes
    ({}, {}, False, False),                     # a pipe or a log: no
    ({"quiet": True}, {}, True, False),         # --quiet wins over a terminal
    ({"progress": True}, {}, False, True),      # --progress forces it
    ({}, {progress.ENV: "1"}, False, True),     # as lmdbio launch tells its ranks
    ({}, {progress.ENV: "0"}, True, False),
    ({"quiet": True}, {progress.ENV: "1"}, False, False),
])
def test_who_draws_a_bar(flags, environ, tty, expected, monkeypatch) -> None:
    import argparse

    for key in (progress.ENV, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    args = argparse.Namespace(**{"quiet": False, "progress": False, **flags})
    assert progress.wanted(args, stream=_Stream(tty)) is expected


def test_steps_draws_only_where_a_command_asked(capsys) -> None:
    assert list(progress.steps(range(3), "x")) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    with progress.enabled(True):
        assert list(progress.steps(range(3), "repeats")) == [0, 1, 2]
    assert "repeats: 100%" in capsys.readouterr().err


# --------------------------------------------------------------------------- convert


def test_convert_draws_records_with_a_total_when_asked(tmp_path: Path, capsys) -> None:
    assert main(["convert", "sklearn:digits", str(tmp_path / "a"), "--layout",
                 "caffe-datum", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "writing: 100%" in err and "1.80k/1.80k" in err and "records/s" in err, err


@pytest.mark.parametrize("flag", [None, "--quiet"])
def test_convert_is_silent_in_a_pipe_or_when_quiet(tmp_path: Path, flag, capsys,
                                                   monkeypatch) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    argv = ["convert", "sklearn:digits", str(tmp_path / "a"), "--layout", "caffe-datum"]
    assert main(argv + ([flag] if flag else [])) == 0
    out = capsys.readouterr()
    assert out.err == "" and "records: 1797" in out.out


def _first_state(err: str) -> str:
    """The bar's first state (drawn when it opens, before any record is written: the
    closing state always has the count, so the first one shows whether a total was known)."""
    return next(s for s in err.split("\r") if s.strip())


def _layout_sources(tmp_path: Path) -> dict[str, tuple[list[str], int]]:
    """Per layout: the convert arguments (source and options) and the records written."""
    from PIL import Image

    from lmdbio.codecs import btable

    rng = np.random.default_rng(0)
    for cls, n in (("cat", 5), ("dog", 3)):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)).save(
                tmp_path / "images" / cls / f"{i}.png")
    btable.write(tmp_path / "t.btable", ["a", "b", "c"],
                 np.array([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0], [0.0, 0.0, 4.0]]))
    return {
        "caffe-datum": (["sklearn:digits", "--limit", "37"], 37),
        "tensor": (["sklearn:digits", "--limit", "30"], 30),
        "toc": (["sklearn:iris", "--batch-size", "50"], 3),
        "ibp": (["sklearn:wine", "--rows-per-record", "40"], 5),  # 178 rows
        "pcr": ([str(tmp_path / "images"), "--group-size", "3"], 3),  # 8 images
        "btable": ([str(tmp_path / "t.btable")], 3),
    }


def test_convert_of_every_layout_draws_a_total(tmp_path: Path, capsys) -> None:
    """Every layout's converter passes its record count: the bar has a total (and a time
    left) from its first state on."""
    from lmdbio.layouts import LAYOUTS

    sources = _layout_sources(tmp_path)
    assert set(sources) == set(LAYOUTS)
    for layout, (argv, records) in sources.items():
        capsys.readouterr()
        assert main(["convert", argv[0], str(tmp_path / layout), "--layout", layout,
                     *argv[1:], "--progress"]) == 0, layout
        out = capsys.readouterr()
        assert f"records: {records}" in out.out, (layout, out.out)
        first = _first_state(out.err)
        total = re.search(r"0%\|[^|]*\| ?0(?:\.0+)?/([\d.]+) \[", first)  # unit_scale: 37.0
        assert total and float(total.group(1)) == records, (layout, first)


def test_convert_loads_a_bundled_data_set_once(tmp_path: Path, monkeypatch) -> None:
    """The bar's total comes from the converter's own source: nothing is loaded twice."""
    import lmdbio.datasets

    loads: list[str] = []
    real = lmdbio.datasets.load_dataset

    def counted(name: str, *args, **kwargs):
        loads.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(lmdbio.datasets, "load_dataset", counted)
    for layout in ("caffe-datum", "tensor"):
        loads.clear()
        assert main(["convert", "sklearn:digits", str(tmp_path / layout), "--layout", layout,
                     "--progress"]) == 0
        assert loads == ["sklearn:digits"], (layout, loads)


# --------------------------------------------------------------------------- bench


def test_bench_scan_draws_its_repeats_when_asked(db: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    assert main(["bench", "scan", str(db), "--repeat", "2", "--progress"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"engine scans: 100%\|.*\| 2/2 ", err), err
    assert re.search(r"py-lmdb scans: 100%\|.*\| 2/2 ", err), err


@pytest.mark.parametrize("flag", [None, "--quiet"])
def test_bench_scan_is_silent_in_a_pipe_or_when_quiet(db: Path, flag, capsys,
                                                      monkeypatch) -> None:
    monkeypatch.delenv(progress.ENV, raising=False)
    argv = ["bench", "scan", str(db), "--repeat", "1"]
    assert main(argv + ([flag] if flag else [])) == 0
    out = capsys.readouterr()
    assert out.err == "" and '"benchmark": "scan"' in out.out


# --------------------------------------------------------------------------- run


@pytest.mark.slow
@pytest.mark.parametrize("size", [(24, 100), None], ids=["24x100", "unknown-size"])
def test_run_draws_on_a_terminal_with_total_rate_and_time_left(job: Path, size) -> None:
    code, out, terminal = lmdbio_on_a_terminal("run", str(job), size=size)
    assert code == 0, terminal
    # 3 epochs x 10 batches x 4 samples; tqdm's [elapsed<left, rate]
    assert re.search(r"epoch 3/3: 100%\|.*\| 120/120 \[\d\d:\d\d<\d\d:\d\d, .*samples/s\]",
                     terminal), terminal
    assert "[lmdbio] epoch" not in out  # the bar replaces the metrics.every lines
    assert "done: 120 samples" in out


@pytest.mark.slow  # a whole CLI run in a subprocess (make test runs it)
def test_run_is_silent_in_a_pipe(job: Path) -> None:
    done = lmdbio("run", str(job))
    assert done.returncode == 0, done.stderr
    assert "samples/s]" not in done.stderr and "%|" not in done.stderr, done.stderr
    assert "[lmdbio] epoch 0 iteration 2" in done.stdout  # a log keeps its lines


@pytest.mark.slow
def test_run_forced_or_quiet(job: Path) -> None:
    forced = lmdbio("run", str(job), "--progress")
    assert forced.returncode == 0, forced.stderr
    assert RUN_BAR_END.search(forced.stderr), forced.stderr
    quiet = lmdbio("run", str(job), "--quiet", environ=env(**{progress.ENV: "1"}))
    assert quiet.returncode == 0, quiet.stderr
    assert "%|" not in quiet.stderr and "[lmdbio] epoch" not in quiet.stdout, quiet.stderr
    assert "done: 120 samples" in quiet.stdout


@pytest.mark.mpiexec
@pytest.mark.parametrize("mode", ["dedicated", "colocated"])
def test_under_mpi_one_rank_draws(job: Path, mode: str) -> None:
    done = run_mpi(3, CLI_SCRIPT, ["run", str(job), "--set", f"readers.mode={mode}"],
                   env={progress.ENV: "1"}, timeout=120)
    ends = [m for line in done.stderr.splitlines() for m in RUN_BAR_END.finditer(line)]
    assert len(ends) == 1, done.stderr  # one bar (tqdm's closing state), from one rank
    assert ends[0].group(1) == ends[0].group(2)  # every sample of the job counted
    total = re.search(r"done: (\d+) samples", done.stdout)
    assert total and ends[0].group(2) == total.group(1), (done.stdout, done.stderr)


# --------------------------------------------------------------------------- the summary


@pytest.mark.slow  # a whole CLI run in a subprocess (make test runs it)
def test_the_summary_leads_with_the_steady_state_figure(job: Path) -> None:
    done = lmdbio("run", str(job), "--quiet")
    line = next(x for x in done.stdout.splitlines() if x.startswith("[lmdbio] done:"))
    steady = line.index("steady state")
    assert steady < line.index("whole run"), line
    assert re.search(r"steady state [\d,]+ samples/s \(the figure to compare", line), line
    assert re.search(r"whole run [\d,]+ samples/s over [\d.]+ s", line), line
    assert len(re.findall(r"samples/s", line)) == 2


def test_summary_line_without_a_steady_state_or_with_a_step() -> None:
    total = {"samples": 8, "workers": 1, "samples_per_second": 80.0, "seconds": 0.1,
             "step_seconds": 0.0}
    line = summary_line(total, 2)
    assert "no steady-state figure" in line and "whole run 80 samples/s" in line
    total.update(step_seconds=0.005, steady={
        "samples_per_second": 12345.6, "stall_fraction_mean": 0.021,
        "blocked_fraction_mean": 0.004})
    line = summary_line(total, 2)
    assert "steady state 12,346 samples/s" in line
    assert "waited for data 2.1% of the time" in line
