"""Full BTable figure set: BTable vs CSV (pandas) and .npz on real and generated tables.

Runs ``lmdbio bench btable`` on every data set (the btable-py fixture, gensim's
lee_background.cor bag-of-words, scikit-learn digits, and the blog post's 50,000 x 500 shape,
GENERATED) and writes bench/results/btable.json.

Usage: ``python bench/btable.py [--repeat 3] [--out bench/results]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))

from lmdbio.benchmarks import btable as bench_btable  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--datasets", default=",".join(bench_btable.DATASETS))
    a = ap.parse_args()
    work = REPO / "build"
    work.mkdir(exist_ok=True)
    result = bench_btable.run([s for s in a.datasets.split(",") if s], None, a.repeat,
                              str(work))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "btable.json").write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out / 'btable.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
