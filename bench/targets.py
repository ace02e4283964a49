"""The issue's check, as it will be run: ``lmdbio bench read`` on databases generated here
(not the figure set's), at several rank and node counts, each document checked by
:func:`bench.targets_check.check_document` (exactly once per epoch, indexed without
extra pages, dm-spec without missed and with at most 1 % redundant pages after warm-up).

Databases (py-lmdb, random bytes, seeded by ``--seed``; said so in the results):
  overflow  7,000 records of 2.5-3.5 KB (overflow pages) under Caffe-like keys
            (``%08d_`` + a name of 5-80 bytes), put in random order, 500 a commit
  inline    18,000 records of 100-1,200 B in key order
  mixed     3,000 records of 0-12 KB (5 % empty) in random order, then 5 % deleted and
            5 % overwritten with new sizes

Runs on each: every strategy at 1, 4 and 8 ranks on 1, 2 and 4 simulated nodes; indexed
with ``--shuffle global`` and ``block`` at 4 and 8 ranks; dm-spec and indexed at 16 ranks
on 8 nodes (``--quick``: 1 and 4 ranks only). Each with ``--last pad`` and ``drop``, batch
32, two epochs and a third of one. Results: bench/results/targets.json, one row per run
(command, pass, what failed) and the totals. Exit status 1 if any run failed.

Run: .venv/bin/python -m bench.targets [--seed S] [--quick]   (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import BIN, MPI_ENV, REPO, RESULTS, write_json
from bench.lmdbgen import write_db
from bench.targets_check import check_document
from lmdbio.plan.epoch import iterations_per_epoch
from lmdbio.plan.strategies import STRATEGIES as _REGISTERED

STRATEGIES = list(_REGISTERED)  # every registered strategy, in registry order
BATCH = 32
MAP_SIZE = 1 << 31


def _names(rng: np.random.Generator, n: int) -> list[bytes]:
    """Caffe's keys: ``%08d_`` and a file name of 5 to 80 bytes."""
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789._-", np.uint8)
    return [b"%08d_" % i + alphabet[rng.integers(0, alphabet.size, int(rng.integers(5, 81)))]
            .tobytes() for i in range(n)]


def generate(data: Path, seed: int) -> dict[str, Path]:
    """The three databases of the module docstring under ``data`` (kept between runs)."""
    rng = np.random.default_rng(seed)
    out = {}

    def values(sizes: np.ndarray) -> list[bytes]:
        return [rng.integers(0, 256, int(s), dtype=np.uint8).tobytes() for s in sizes]

    shapes = {"overflow": 7_000, "inline": 18_000, "mixed": 3_000}
    for name, n in shapes.items():
        path = data / f"{name}-seed{seed}"
        out[name] = path
        if (path / "data.mdb").exists():
            continue
        print(f"generating {path}", flush=True)
        path.mkdir(parents=True, exist_ok=True)
        if name == "overflow":
            keys = _names(rng, n)
            order = rng.permutation(n)
            vals = values(rng.integers(2_500, 3_501, n))
            items = [(keys[i], vals[i]) for i in order]
            write_db(path, items, commit_every=500, map_size=MAP_SIZE)
        elif name == "inline":
            vals = values(rng.integers(100, 1_201, n))
            write_db(path, [(b"%08d" % i, v) for i, v in enumerate(vals)], commit_every=n,
                     map_size=MAP_SIZE)
        else:
            keys = _names(rng, n)
            sizes = np.where(rng.random(n) < 0.05, 0, rng.integers(0, 12_001, n))
            vals = values(sizes)
            first = [(keys[i], vals[i]) for i in rng.permutation(n)]
            pick = rng.permutation(n)
            gone, redo = pick[: n // 20], pick[n // 20: n // 10]
            later = [(keys[i], None) for i in gone] + \
                [(keys[i], v) for i, v in zip(redo, values(rng.integers(0, 12_001, redo.size)),
                                              strict=True)]
            write_db(path, first + later, commit_every=n, map_size=MAP_SIZE)  # 2 commits
    return out


def _records(path: Path) -> int:
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        return int(env.stat()["entries"])
    finally:
        env.close()


def matrix(quick: bool) -> list[tuple[str, int, int, str]]:
    """``(strategy, ranks, nodes, shuffle)`` of every run on one database."""
    places = [(1, 1), (4, 2)] if quick else [(1, 1), (4, 2), (8, 4)]
    runs = [(s, r, n, "none") for r, n in places for s in STRATEGIES]
    runs += [("indexed", r, n, sh) for r, n in places if r > 1 for sh in ("global", "block")]
    if not quick:
        runs += [(s, 16, 8, "none") for s in ("dm-spec", "indexed")]
    return runs


def run_one(db: Path, n: int, strategy: str, ranks: int, nodes: int, shuffle: str,
            last: str, out: Path) -> dict:
    """One run on ``db`` (``n`` records) and its check: a results row."""
    per_epoch = iterations_per_epoch(n, ranks, BATCH, last)  # colocated: every rank consumes
    iters = 2 * per_epoch + per_epoch // 3
    args = ["-n", str(ranks), "lmdbio", "bench", "read", str(db), "--strategy", strategy,
            "--simulate-nodes", str(nodes), "--batch-size", str(BATCH), "--iters", str(iters),
            "--last", last, "--json", str(out)]
    if shuffle != "none":
        args += ["--shuffle", shuffle]
    # the venv's Open MPI (the PyPI wheel) and console script, whatever PATH holds
    cmd = ["timeout", "600", str(BIN / "mpiexec"), *args]
    row = {"database": db.name, "strategy": strategy, "ranks": ranks, "nodes": nodes,
           "shuffle": shuffle, "last": last, "iters": iters,
           "command": " ".join(["mpiexec", *args])}
    t0 = time.perf_counter()
    env = {**os.environ, **MPI_ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    if proc.returncode != 0 or not out.exists():
        row["failures"] = [f"exit status {proc.returncode} (124: timed out): "
                           f"{proc.stderr.strip()[-600:]}"]
    else:
        row["failures"] = check_document(json.loads(out.read_text()))
    row["pass"] = not row["failures"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--quick", action="store_true", help="1 and 4 ranks only")
    parser.add_argument("--data", default=str(REPO / "build" / "targets-data"))
    parser.add_argument("--out", default=str(RESULTS),
                        help="folder of targets.json")
    args = parser.parse_args()
    dbs = generate(Path(args.data), args.seed)
    work = Path(args.data) / "runs"
    work.mkdir(parents=True, exist_ok=True)
    records = {name: _records(db) for name, db in dbs.items()}
    rows = []
    for name, db in dbs.items():
        for strategy, ranks, nodes, shuffle in matrix(args.quick):
            for last in ("pad", "drop"):
                out = work / f"{name}-{strategy}-{ranks}r{nodes}n-{shuffle}-{last}.json"
                out.unlink(missing_ok=True)
                row = run_one(db, records[name], strategy, ranks, nodes, shuffle, last, out)
                rows.append(row)
                verdict = "pass" if row["pass"] else "FAIL " + "; ".join(row["failures"])
                print(f"{name} {strategy} {ranks}r/{nodes}n {shuffle} {last}: {verdict}",
                      flush=True)
    result = {"benchmark": "targets", "seed": args.seed, "quick": args.quick,
              "databases": {k: {"path": str(v), "records": records[k]}
                            for k, v in dbs.items()},
              "generated": "py-lmdb, random bytes (bench/targets.py)",
              "runs": rows, "totals": {"runs": len(rows),
                                       "passed": sum(r["pass"] for r in rows)}}
    out = write_json(Path(args.out) / "targets.json", result)
    print(f"{result['totals']['passed']} of {len(rows)} runs met every target; {out}")
    return 0 if result["totals"]["passed"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
