"""Run the full TOC figure set and write ``bench/results/toc.json``.

Every data set at mini-batch sizes 50..250 and large batches (10%..100% of the rows):
compression ratios of TOC and the baselines, compressed-domain operation times against
scipy CSR and numpy dense, codec speed against gzip and snappy, and the end-to-end training
comparison. The numbers quoted in ``docs/toc.md`` come from this script::

    NUMBA_CACHE_DIR=build/numba-cache .venv/bin/python -m bench.toc

Extra arguments are passed to ``lmdbio bench toc`` (e.g. ``--datasets fair,mnist``).
"""

from __future__ import annotations

import argparse
import sys

from bench.common import RESULTS
from bench.kinds import toc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    toc.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.json is None:
        args.json = str(RESULTS / "toc.json")
    return toc.main(args)


if __name__ == "__main__":
    sys.exit(main())
