"""What the benchmarks share: the checkout's folders, the environment of the MPI jobs they
start, generated databases, timing and result files.

Every script used to set these up itself (its own ``REPO``, its own copy of the Open MPI
variables, its own "write the database unless it is there"); one definition keeps the
scripts' runs comparable with each other.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: the source checkout the benchmarks run from
REPO = Path(__file__).resolve().parents[1]
#: where the scripts write their JSON unless told otherwise (``--out``)
RESULTS = REPO / "bench" / "results"
#: generated databases, kept between runs
BENCH_DATA = REPO / "build" / "bench-data"
#: the real databases of ``../shared/testdata`` (absent in most checkouts)
SHARED_LMDBS = REPO.parent / "shared" / "testdata" / "lmdb"
#: the virtualenv's programs (``mpiexec``, ``lmdbio``, ``python``)
BIN = REPO / ".venv" / "bin"
#: numba's on-disk cache of compiled kernels, as the Makefile sets it
NUMBA_CACHE = REPO / "build" / "numba-cache"

#: Open MPI from PyPI in a container on a small host: allow root, oversubscribe the cores,
#: and skip the UCX one-sided component (no InfiniBand: it only prints errors)
OPENMPI_ENV: dict[str, str] = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_osc": "^ucx",
}
#: the variables every MPI job a benchmark starts runs with (on top of ``os.environ``)
MPI_ENV: dict[str, str] = {**OPENMPI_ENV, "NUMBA_CACHE_DIR": str(NUMBA_CACHE)}


def use_numba_cache() -> None:
    """Point numba at the checkout's kernel cache unless the caller chose one: a benchmark
    then times cached kernels, not the first compile."""
    os.environ.setdefault("NUMBA_CACHE_DIR", str(NUMBA_CACHE))


def random_db(path: Path, records: int, value_bytes: int, *, seed: int,
              map_size: int = 1 << 31, commit_every: int = 1000) -> Path:
    """A database of ``records`` random values of ``value_bytes`` at ``path`` (keys
    ``%08d``), written with py-lmdb unless it is there already (generating the large ones
    takes minutes); returns ``path``."""
    if not (path / "data.mdb").exists():
        from bench.lmdbgen import random_items, write_db

        path.mkdir(parents=True, exist_ok=True)
        print(f"generating {path}: {records} records of {value_bytes} random bytes",
              flush=True)
        write_db(path, random_items(records, value_bytes, seed=seed), map_size=map_size,
                 commit_every=commit_every)
    return path


def best_seconds(fn: Callable[[], Any], repeat: int, *, warmup: bool = True) -> float:
    """The fastest wall seconds of ``repeat`` calls of ``fn``, after one untimed call
    (compiled code loaded, caches warm) unless ``warmup`` is false."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def json_safe(x: Any) -> Any:
    """A copy of ``x`` that JSON writes as numbers: numpy scalars become Python ones, and
    non-finite floats (the PSNR of identical images) None."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    if isinstance(x, float | np.floating):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def write_json(path: str | Path, doc: Any, *, indent: int = 1,
               default: Callable[[Any], Any] | None = None) -> Path:
    """Write ``doc`` as JSON to ``path`` (its folder made if missing), ending in a newline;
    returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=indent, default=default) + "\n")
    return out
