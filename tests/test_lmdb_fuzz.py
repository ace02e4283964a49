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

REPO = Path(__file__).resolve().parents[1]


def test_mutated_files_never_crash_or_hang():
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
    try:
        proc = subprocess.run(
            [sys.executable, str(REPO / "tests" / "fuzz_lmdb.py"), "--examples", "1500"],
            capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        raise AssertionError(f"fuzzing hung; last cases:\n{tail}") from None
    last_cases = "\n".join(proc.stderr.splitlines()[-15:])
    assert proc.returncode == 0, f"exit {proc.returncode}; last output:\n{last_cases}"
    m = re.search(r"RESULT ok=(\d+) error=(\d+)", proc.stdout)
    assert m, proc.stdout
    ok, errors = int(m.group(1)), int(m.group(2))
    # the mutations must really exercise both outcomes, or this test could not fail
    assert ok > 0 and errors > 0
