"""``lmdbio bench scan PATH``: gather every record into batch buffers, against py-lmdb.

The measurement is :func:`lmdbio.scan_compare.run` (in the package: ``lmdbio demo`` shows
it too); this kind gives it its options and prints (or writes) the JSON result.
"""

from __future__ import annotations

import argparse
import json

from bench.common import write_json
from lmdbio.scan_compare import run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory or data.mdb")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--startup", action="store_true",
                        help="also time the first batch in fresh processes")
    parser.add_argument("--json", metavar="OUT", default=None, help="write the result here")


def main(args: argparse.Namespace) -> int:
    result = run(args.path, args.batch_size, args.repeat, args.startup)
    if args.json:
        write_json(args.json, result, indent=2)
    print(json.dumps(result, indent=2))
    return 0
