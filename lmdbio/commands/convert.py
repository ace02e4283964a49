"""``lmdbio convert SRC DST --layout L``: write a data set into an LMDB layout.

Layouts live in :mod:`lmdbio.convert` as modules with ``add_arguments(parser)`` (their own
options) and ``convert(src, dst, args) -> dict`` (a summary printed as JSON). The layout is
parsed first, then its module adds its options and the command line is parsed again.
"""

from __future__ import annotations

import argparse
import json
import sys

from lmdbio.convert import LAYOUTS, load_layout

#: the layout's own options arrive as unknown arguments of the first parse
ACCEPTS_EXTRA_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="source: a file, a folder, or a bundled data set name")
    parser.add_argument("dst", help="destination LMDB directory (created)")
    parser.add_argument("--layout", required=True, choices=sorted(LAYOUTS))
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DST")
    parser.add_argument(
        "--format-version", type=int, choices=(1, 3), default=1,
        help="LMDB data format to write: 1 (LMDB 0.9, Caffe) or 3 (LMDB 1.0)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args: argparse.Namespace) -> int:
    module = load_layout(args.layout)
    p = argparse.ArgumentParser(prog=f"lmdbio convert --layout {args.layout}")
    module.add_arguments(p)
    layout_args = p.parse_args(args.extra_args)
    for key, value in vars(args).items():
        if not hasattr(layout_args, key):
            setattr(layout_args, key, value)
    summary = module.convert(args.src, args.dst, layout_args)
    if args.json:
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
    else:
        for key, value in summary.items():
            print(f"{key}: {value}")
    return 0
