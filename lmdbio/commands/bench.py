"""``lmdbio bench KIND ...``: run one benchmark and print (or write) its JSON result.

Each kind lives in :mod:`lmdbio.benchmarks` as a module with ``add_arguments(parser)`` and
``main(args) -> int``. Every benchmark compares against a baseline measured in the same run
and reports the ratio, never an absolute time alone.
"""

from __future__ import annotations

import argparse
import importlib

#: benchmark kind -> (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "scan": ("lmdbio.benchmarks.scan", "gather every record vs py-lmdb iteration + copy"),
    "read": ("lmdbio.benchmarks.read", "parallel read strategies under mpiexec"),
    "toc": ("lmdbio.benchmarks.toc", "TOC compression ratio and compressed-domain ops"),
    "ibp": ("lmdbio.benchmarks.ibp", "IBP compression ratio and decompression throughput"),
    "pcr": ("lmdbio.benchmarks.pcr", "PCR bytes, pages and quality per scan group"),
    "btable": ("lmdbio.benchmarks.btable", "BTable vs CSV and .npz: size and speed"),
    "decode": ("lmdbio.benchmarks.decode", "Datum/tensor batch decoding and the transform"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for name, (module_name, help_text) in BENCHMARKS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # that benchmark is not part of this build
        p = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(_bench=module)


def main(args: argparse.Namespace) -> int:
    return int(args._bench.main(args) or 0)
