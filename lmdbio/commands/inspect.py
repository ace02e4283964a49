"""``lmdbio inspect PATH [--json]``: format, pages by kind, records, free list, file order."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory or data.mdb file")
    parser.add_argument("--subdb", default=None, help="a named sub-database")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _print_tree(obj: dict, indent: int = 0) -> None:
    for key, value in obj.items():
        if isinstance(value, dict):
            print(" " * indent + f"{key}:")
            _print_tree(value, indent + 2)
        else:
            if isinstance(value, float):
                value = f"{value:.4g}"
            print(" " * indent + f"{key}: {value}")


def main(args: argparse.Namespace) -> int:
    from lmdbio.lmdb.report import inspect_database

    report = inspect_database(args.path, args.subdb)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_tree(report)
    return 0
