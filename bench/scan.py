"""Scan benchmark over generated shapes and the real files in ../shared/testdata.

Shapes (generated with py-lmdb, random bytes, said so in the output):
  inline   100,000 records of 200 B (several per leaf page)
  cifar     20,000 records of 3 KB (one overflow page each, CIFAR-like)
  imagenet     500 records of 150 KB (ImageNet-like)
Writes bench/results/scan.json: per database the engine / py-lmdb ratio (> 1 = faster).
Run: .venv/bin/python bench/scan.py [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lmdbio.benchmarks.scan import run  # noqa: E402
from tests.lmdbgen import random_items, write_db  # noqa: E402

SHAPES = {"inline-200B": (100_000, 200), "cifar-3KB": (20_000, 3072),
          "imagenet-150KB": (500, 150_000)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--data", default=str(REPO / "build" / "bench-data"))
    args = parser.parse_args()
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, (n, size) in SHAPES.items():
        d = data / name
        if not (d / "data.mdb").exists():
            d.mkdir(parents=True, exist_ok=True)
            write_db(d, random_items(n, size, seed=1), map_size=1 << 31)
        r = run(str(d), startup=(name == "cifar-3KB"))
        r["data"] = f"generated: {n} records of {size} random bytes"
        results.append(r)
        print(f"{name}: ratio {r['ratio_engine_over_pylmdb']:.2f}", flush=True)
    shared = REPO.parent / "shared" / "testdata" / "lmdb"
    for d in sorted(shared.glob("*")) if shared.is_dir() else []:
        r = run(str(d))
        r["data"] = f"real: {d.name} (see ../shared/testdata/README.md)"
        results.append(r)
        print(f"{d.name}: ratio {r['ratio_engine_over_pylmdb']:.2f}", flush=True)
    (out / "scan.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
