"""Read every record of an LMDB into batch buffers: lmdbio's engine against a py-lmdb cursor.

The engine builds the record table once and gathers batches of ``batch`` values into one
reused buffer with a compiled kernel. The baseline, timed in the same run on the same
(warm) file, is what users do today: a py-lmdb cursor with ``buffers=True`` copying each
value into the same kind of batch buffer. :func:`run` reports records/s, bytes/s and the
ratio engine / py-lmdb (> 1 means the engine is faster), the best of ``repeat`` runs each;
with ``startup`` it also measures, in fresh processes, import + open + first batch with
the compiled code cached on disk, and with an empty cache (the first-ever compile).

Part of the package because ``lmdbio demo`` (``make run``) shows this comparison; ``lmdbio
bench scan`` (bench/kinds/scan.py in a source checkout) runs it with its own options.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

import lmdbio
from lmdbio.commands import progress
from lmdbio.io.gather import gather
from lmdbio.lmdb.snapshot import resolve_file


def engine_scan(path: str, batch: int) -> tuple[float, int, int]:
    """Seconds, records and bytes to gather every record in batches through the engine."""
    t0 = time.perf_counter()
    with lmdbio.open(path, pin_snapshot=False) as db:
        t = db.record_table()
        n = len(t)
        largest = 0
        for s in range(0, n, batch):  # size of the largest batch, for one reused buffer
            largest = max(largest, int(t.val_len[s:s + batch].sum()))
        out = np.empty(largest, np.uint8)
        total = 0
        for s in range(0, n, batch):
            _, offsets = gather(db, range(s, min(s + batch, n)), out=out)
            total += int(offsets[-1])
    return time.perf_counter() - t0, n, total


def pylmdb_scan(path: str, batch: int) -> tuple[float, int, int]:
    """The same with py-lmdb: cursor with buffers=True, copy each value into a batch buffer."""
    import lmdb

    t0 = time.perf_counter()
    f = resolve_file(path)
    env = lmdb.open(str(f), subdir=False, readonly=True, lock=False)
    n = total = 0
    out = bytearray(1 << 20)
    pos = 0
    with env.begin(buffers=True) as txn:
        for _k, v in txn.cursor():
            size = len(v)
            if pos + size > len(out):
                out.extend(bytes(pos + size - len(out)))
            out[pos:pos + size] = v
            pos += size
            n += 1
            total += size
            if n % batch == 0:
                pos = 0
    env.close()
    return time.perf_counter() - t0, n, total


_STARTUP = r"""
import sys, time
t0 = time.perf_counter()
import numpy as np
import lmdbio
from lmdbio.io.gather import gather
db = lmdbio.open(sys.argv[1], pin_snapshot=False)
n = min(int(sys.argv[2]), len(db))
buf, off = gather(db, range(n))
print(time.perf_counter() - t0)
"""


def startup_seconds(path: str, batch: int, cache_dir: str | None) -> float:
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = cache_dir
    out = subprocess.run([sys.executable, "-c", _STARTUP, path, str(batch)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def open_first_batch_seconds(path: str, batch: int) -> float:
    """Open + first batch in this process, compiled code already loaded."""
    t0 = time.perf_counter()
    with lmdbio.open(path, pin_snapshot=False) as db:
        gather(db, range(min(batch, len(db))))
    return time.perf_counter() - t0


def run(path: str, batch: int = 256, repeat: int = 3, startup: bool = False) -> dict[str, Any]:
    """The benchmark as a JSON-able dictionary."""
    engine_scan(path, batch)  # compile / load kernels and warm the page cache
    pylmdb_scan(path, batch)
    eng = min((engine_scan(path, batch)
               for _ in progress.steps(range(repeat), "engine scans", unit=" runs")),
              key=lambda r: r[0])
    ref = min((pylmdb_scan(path, batch)
               for _ in progress.steps(range(repeat), "py-lmdb scans", unit=" runs")),
              key=lambda r: r[0])
    if eng[1:] != ref[1:]:
        raise RuntimeError(f"engine read {eng[1:]} records/bytes, py-lmdb {ref[1:]}")
    result: dict[str, Any] = {
        "benchmark": "scan",
        "path": path,
        "records": eng[1],
        "bytes": eng[2],
        "batch_size": batch,
        "repeat": repeat,
        "engine": {"seconds": eng[0], "records_per_second": eng[1] / eng[0],
                   "bytes_per_second": eng[2] / eng[0]},
        "pylmdb": {"seconds": ref[0], "records_per_second": ref[1] / ref[0],
                   "bytes_per_second": ref[2] / ref[0]},
        "ratio_engine_over_pylmdb": ref[0] / eng[0],
        "open_first_batch_seconds_warm": min(open_first_batch_seconds(path, batch)
                                             for _ in range(repeat)),
    }
    if startup:
        result["fresh_process_first_batch_seconds_cached"] = startup_seconds(path, batch, None)
        with tempfile.TemporaryDirectory() as empty:
            result["fresh_process_first_batch_seconds_first_compile"] = \
                startup_seconds(path, batch, empty)
    return result

