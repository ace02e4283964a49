"""Scan benchmark over generated shapes and the real files in ../shared/testdata.

Shapes (generated with py-lmdb, random bytes, said so in the output):
  inline   100,000 records of 200 B (several per leaf page)
  cifar     20,000 records of 3 KB (one overflow page each, CIFAR-like)
  imagenet     500 records of 150 KB (ImageNet-like)
Writes bench/results/scan.json: per database the engine / py-lmdb ratio (> 1 = faster).
Run: .venv/bin/python -m bench.scan [--out bench/results]   (from the repository root)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.common import BENCH_DATA, RESULTS, SHARED_LMDBS, random_db, write_json
from lmdbio.scan_compare import run

SHAPES = {"inline-200B": (100_000, 200), "cifar-3KB": (20_000, 3072),
          "imagenet-150KB": (500, 150_000)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--data", default=str(BENCH_DATA))
    args = parser.parse_args()
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, (n, size) in SHAPES.items():
        d = random_db(data / name, n, size, seed=1)
        r = run(str(d), startup=(name == "cifar-3KB"))
        r["data"] = f"generated: {n} records of {size} random bytes"
        results.append(r)
        print(f"{name}: ratio {r['ratio_engine_over_pylmdb']:.2f}", flush=True)
    for d in sorted(SHARED_LMDBS.glob("*")) if SHARED_LMDBS.is_dir() else []:
        r = run(str(d))
        r["data"] = f"real: {d.name} (see ../shared/testdata/README.md)"
        results.append(r)
        print(f"{d.name}: ratio {r['ratio_engine_over_pylmdb']:.2f}", flush=True)
    write_json(out / "scan.json", results, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
