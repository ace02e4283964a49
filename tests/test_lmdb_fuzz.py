"""Mutated LMDB files end in data or an LmdbioError: never a crash, a hang, or another error.

The fuzzing runs in a subprocess (``tests/fuzz_lmdb.py``) so that a crash of the
interpreter is seen as a failure here instead of killing the test run; its time bound
catches hangs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_fuzzer(args: list[str], timeout: float) -> tuple[int, int]:
    """Run ``tests/fuzz_lmdb.py ARGS`` in a subprocess (a crash of the interpreter fails the
    test instead of the run; ``timeout`` only ends a hang) and return its counts of mutated
    files that read as data and as an LmdbioError."""
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
    try:
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "fuzz_lmdb.py"), *args],
                              capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        raise AssertionError(f"fuzzing hung; last cases:\n{tail}") from None
    last_cases = "\n".join(proc.stderr.splitlines()[-15:])
    assert proc.returncode == 0, f"exit {proc.returncode}; last output:\n{last_cases}"
    m = re.search(r"RESULT ok=(\d+) error=(\d+)", proc.stdout)
    assert m, proc.stdout
    return int(m.group(1)), int(m.group(2))


@pytest.mark.slow
def test_mutated_files_never_crash_or_hang():
    """The same 1,000 cases every run (the regression set), then 500 of this run's seed
    (``structfuzz.RUN_SEED``: new every run, fixed by ``LMDBIO_FUZZ_SEED`` to replay)."""
    from structfuzz import RUN_SEED, SEED_ENV

    ok, errors = run_fuzzer(["--examples", "1000"], timeout=200)
    # the mutations must really exercise both outcomes, or this test could not fail
    assert ok > 0 and errors > 0
    try:
        run_fuzzer(["--examples", "500", "--seed", str(RUN_SEED)], timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"seed {RUN_SEED} (replay: {SEED_ENV}={RUN_SEED} pytest "
                             f"tests/test_lmdb_fuzz.py): {exc}") from None
