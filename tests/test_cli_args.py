"""Command-line values are checked before any work: the error names the flag and what is
allowed (found by acceptance runs: ``--iters -1`` ran and delivered nothing, ``--batch-size
0`` failed inside the batch ring, an unwritable ``--json`` lost the result at the end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdbio.cli import build_parser


def parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--iters", "-1", "--iters: expected an integer >= 1, got -1"),
    ("--iters", "abc", "--iters: expected an integer >= 1, got 'abc'"),
    ("--batch-size", "0", "--batch-size: expected an integer >= 1, got 0"),
    ("--prefetch-depth", "0", "--prefetch-depth: expected an integer >= 1"),
    ("--simulate-nodes", "-2", "--simulate-nodes: expected an integer >= 0"),
    ("--timeout", "0", "--timeout: expected a number > 0, got 0"),
    ("--warmup", "-1", "--warmup: expected an integer >= 0"),
])
def test_bench_read_rejects_impossible_values(flag, value, expected, capsys):
    assert expected in parse_error(["bench", "read", "DB", flag, value], capsys)


def test_output_paths_are_checked_before_the_run(tmp_path: Path, capsys):
    missing = tmp_path / "no-such-folder" / "out.json"
    err = parse_error(["bench", "read", "DB", "--json", str(missing)], capsys)
    assert "--json" in err and "does not exist" in err
    err = parse_error(["run", "job.yaml", "--metrics-json", str(tmp_path)], capsys)
    assert "--metrics-json" in err and "is a folder" in err
    ok = build_parser().parse_args(["run", "job.yaml", "--metrics-json",
                                    str(tmp_path / "m.json"), "--step-seconds", "0"])
    assert ok.metrics_json == str(tmp_path / "m.json") and ok.step_seconds == 0.0


def test_run_rejects_a_negative_step(capsys):
    assert "--step-seconds: expected a number >= 0" in parse_error(
        ["run", "job.yaml", "--step-seconds", "-1"], capsys)


def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``lmdbio inspect DB | head -1``: once the reader of stdout is gone the command stops
    with the shell's SIGPIPE status and no traceback (here the pipe is closed before it
    writes anything)."""
    import os
    import subprocess
    import sys

    from lmdbgen import random_items, write_db

    write_db(tmp_path / "db", random_items(20, 100, seed=1))
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "lmdbio.cli", "inspect",
                               str(tmp_path / "db")], stdout=w, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(w)
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
