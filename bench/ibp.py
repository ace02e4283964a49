"""Full IBP figure set: every data set, both chunk sizes, clustered runs; JSON to
bench/results/ibp.json (or the path given). Numbers go into docs/ibp.md.

    NUMBA_CACHE_DIR=build/numba-cache .venv/bin/python -m bench.ibp [OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.common import RESULTS
from bench.kinds import ibp


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "ibp.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    parser = argparse.ArgumentParser()
    ibp.add_arguments(parser)
    args = parser.parse_args([
        "--datasets", "digits,breast_cancer,wine,lfw,bow,svd,mnist5k",
        "--chunk-bytes", "4,8", "--seeds", "5", "--tile-mb", "48", "--repeat", "7",
        "--clusters", "1,2,4,8,16,32,64", "--cluster-datasets", "digits,lfw,svd,bow",
        "--json", str(out),
    ])
    code = ibp.main(args)
    out.with_suffix(".md").write_text(ibp.markdown(json.loads(out.read_text())))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return code


if __name__ == "__main__":
    sys.exit(main())
