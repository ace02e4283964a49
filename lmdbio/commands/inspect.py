"""``lmdbio inspect PATH [--json]``: what the records are, format, pages by kind, records,
free list, file order (:mod:`lmdbio.lmdb.report`)."""

from __future__ import annotations

import argparse
import json

from lmdbio.commands.argtypes import positive_int

DESCRIPTION = """\
Describe an LMDB database without changing it. First what its records are, from a sample
spread over the whole database: Caffe Datum records (shape CxHxW, raw pixels or encoded
JPEG/PNG images, float data), lmdbio's own layouts (tensor, TOC, IBP, PCR, BTable rows),
bare image files, NumPy arrays or Python pickles, otherwise "unknown binary" with the
typical size; the labels found in the sample are counted. Then the file: LMDB format
version, page size, records, tree depth, pages by kind, free pages, key and value sizes,
and how closely the file's page order follows key order (1.0: laid out in key order,
which makes reading ahead pay)."""

EXAMPLES = """\
lmdbio inspect build/demo/digits-datum
lmdbio inspect /data/ilsvrc12_train_lmdb --sample 1000
lmdbio inspect DB --json > report.json
lmdbio inspect DB --subdb images          # a named sub-database"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory or data.mdb file")
    parser.add_argument("--subdb", default=None, metavar="NAME",
                        help="describe the named sub-database NAME instead of the main one")
    parser.add_argument("--sample", type=positive_int, default=64, metavar="N",
                        help="records looked at to say what they are, spread over the "
                             "database (default %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print the whole report as JSON (for scripts)")


def _print_tree(obj: dict, indent: int = 0) -> None:
    for key, value in obj.items():
        if isinstance(value, dict):
            print(" " * indent + f"{key}:")
            _print_tree(value, indent + 2)
        else:
            if isinstance(value, float):
                value = f"{value:.4g}"
            print(" " * indent + f"{key}: {value}")


def print_records(report: dict) -> None:
    """The first lines of ``lmdbio inspect``: what the records are."""
    from lmdbio.lmdb.report import label_text

    rec = report["records"]
    print(f"{report['path']}: {report['entries']} records")
    print(f"records: {rec['description']}")
    if rec.get("sampled"):
        print(f"  sample: {rec['sampled']} of {report['entries']} records, spread over the "
              f"database; {rec['value_bytes_typical']} bytes per value typical")
    if rec.get("label_histogram"):
        print(f"  labels in the sample: {label_text(rec['label_histogram'])}")
    if rec.get("sidecar_layout"):
        print(f"  lmdbio.json: layout {rec['sidecar_layout']}")


def main(args: argparse.Namespace) -> int:
    from lmdbio.lmdb.report import inspect_database

    report = inspect_database(args.path, args.subdb, sample=args.sample)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_records(report)
        _print_tree({k: v for k, v in report.items() if k not in ("records", "path")})
    return 0
