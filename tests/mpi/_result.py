"""Result reporting for scripts run by ``tests/mpi_harness.py`` (see its docstring).

``emit(obj)`` records one JSON object for this rank: appended as a line to
``$MPI_HARNESS_RESULT_DIR/rank-R.jsonl`` and echoed to stdout as ``RESULT {...}``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def world_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def emit(obj: dict[str, Any], rank: int | None = None) -> None:
    """Record ``obj`` (plus ``"rank"``) as this rank's result."""
    rank = world_rank() if rank is None else rank
    line = json.dumps({"rank": rank, **obj}, sort_keys=True)
    out_dir = os.environ.get("MPI_HARNESS_RESULT_DIR")
    if out_dir:
        with open(os.path.join(out_dir, f"rank-{rank}.jsonl"), "a") as f:
            f.write(line + "\n")
    sys.stdout.write(f"RESULT {line}\n")
    sys.stdout.flush()
