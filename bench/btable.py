"""Full BTable figure set: BTable vs CSV (pandas) and .npz on real and generated tables.

Runs ``lmdbio bench btable`` on every data set (the btable-py fixture, gensim's
lee_background.cor bag-of-words, scikit-learn digits, and the blog post's 50,000 x 500 shape,
GENERATED) and writes bench/results/btable.json.

Usage: ``python -m bench.btable [--repeat 3] [--out bench/results]`` (from the repository root)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import REPO, RESULTS, use_numba_cache, write_json


def main() -> int:
    use_numba_cache()  # before numba is imported: it reads the variable once
    from bench.kinds import btable as bench_btable

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--datasets", default=",".join(bench_btable.DATASETS))
    a = ap.parse_args()
    work = REPO / "build"
    work.mkdir(exist_ok=True)
    result = bench_btable.run([s for s in a.datasets.split(",") if s], None, a.repeat,
                              str(work))
    written = write_json(Path(a.out) / "btable.json", result, indent=2)
    print(f"\nwrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
