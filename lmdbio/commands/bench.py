"""``lmdbio bench KIND ...``: run one benchmark and print (or write) its JSON result.

Each kind lives in the source checkout's ``bench/kinds/`` (not in the wheel) as a module
with ``add_arguments(parser)`` and ``main(args) -> int``; this command is the entry point
that finds that checkout (the one this package is installed from, editable: ``make setup``)
and, installed from a wheel, says the benchmarks need one. Every benchmark compares against
a baseline measured in the same run and reports the ratio, never an absolute time alone.

Help: the benchmark modules' docstrings are written for developers; the user-facing text
of every kind is here (``KINDS``), and option help without text gets a generic one.

Progress: the benchmark runs inside :func:`lmdbio.commands.progress.enabled`, so a loop a
benchmark wraps in :func:`lmdbio.commands.progress.steps` draws a bar on a terminal.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from lmdbio.commands import progress
from lmdbio.commands.helptext import HelpFormatter, epilog

DESCRIPTION = """\
Measure lmdbio against the baseline it replaces, in the same run: every speed figure is a
ratio to a baseline timed on the same machine and data a moment before or after, never an
absolute time alone. The result is printed, and written as JSON with --json OUT. Each
KIND has its own options: lmdbio bench KIND --help."""

EXAMPLES = """\
lmdbio bench scan build/demo/digits-datum
mpiexec -n 8 lmdbio bench read DB --strategy dm-spec --simulate-nodes 4
lmdbio bench decode DB --transform --crop 227
lmdbio bench toc --datasets digits,mnist --json toc.json"""

#: benchmark kind -> (module, one-line help, description, examples)
BENCHMARKS: dict[str, tuple[str, str, str, str]] = {
    "scan": (
        "bench.kinds.scan", "read every record: lmdbio's engine vs a py-lmdb cursor",
        "Read every record of an LMDB into batch buffers with lmdbio's page engine, and "
        "the same records with a py-lmdb cursor copying each value (what data loaders do "
        "today), on the same warm file in the same run. Reports records/s and bytes/s of "
        "both and their ratio (above 1: lmdbio is faster), the best of --repeat runs. "
        "--startup also times a fresh process's import, open and first batch.",
        "lmdbio bench scan build/demo/digits-datum\n"
        "lmdbio bench scan DB --batch-size 64 --repeat 5 --json scan.json",
    ),
    "read": (
        "bench.kinds.read", "parallel read strategies under mpiexec, with page "
        "accounting",
        "Run one parallel read strategy on every rank of an MPI job (start it with mpiexec "
        "or lmdbio launch) and measure what each rank reads: records delivered, pages "
        "touched beyond its own records, bytes, wait and throughput (whole run, loop and "
        "steady state). --pylmdb times the same access pattern through py-lmdb cursors "
        "(the naive strategies: what Caffe and DALI do). On one host, --simulate-nodes K "
        "splits the ranks into K nodes; a PATH containing {node} gives every node its own "
        "copy of the database, and --cold drops it from the page cache first.",
        "mpiexec -n 8 lmdbio bench read DB --strategy dm-spec --simulate-nodes 4\n"
        "mpiexec -n 4 lmdbio bench read DB --strategy naive-stride --pylmdb\n"
        "mpiexec -n 8 lmdbio bench read 'node{node}/db' --simulate-nodes 4 --cold",
    ),
    "toc": (
        "bench.kinds.toc", "TOC compression: ratio, compressed-domain operations, "
        "speed",
        "Compress real tables (scikit-learn digits, MNIST, statsmodels surveys...) with TOC "
        "and compare size, compressed-domain matrix operations and codec speed with dense, "
        "CSR, gzip and snappy in the same run, plus one end-to-end training comparison.",
        "lmdbio bench toc\n"
        "lmdbio bench toc --datasets digits,mnist --repeat 3 --json toc.json",
    ),
    "ibp": (
        "bench.kinds.ibp", "IBP compression ratio and decompression speed vs zstd, "
        "lz4, blosc2",
        "Compress real data sets with IBP and compare the compression ratio with zstd, lz4 "
        "and blosc2, and the decompression throughput on one core, in the same run; also "
        "fitting time and clustered savings.",
        "lmdbio bench ibp\nlmdbio bench ibp --datasets digits,lfw --json ibp.json",
    ),
    "pcr": (
        "bench.kinds.pcr", "PCR: bytes, pages, read time and quality per scan group",
        "For every scan group k of a PCR LMDB (lmdbio convert ... --layout pcr): the bytes "
        "and pages read at that fidelity, the time to read them cold, and the image quality "
        "reached, each against full fidelity measured in the same run.",
        "lmdbio bench pcr build/photos-pcr\n"
        "lmdbio bench pcr build/photos-pcr --repeat 5 --json pcr.json",
    ),
    "btable": (
        "bench.kinds.btable", "BTable vs CSV and .npz: size and read/write speed",
        "Write and read real sparse tables as BTable, CSV (pandas) and .npz (scipy), in the "
        "same run: seconds and bytes of each format and the ratios to BTable.",
        "lmdbio bench btable\nlmdbio bench btable --repeat 5 --json btable.json",
    ),
    "decode": (
        "bench.kinds.decode", "batch decoding of Datum/tensor records and the "
        "transform",
        "Decode the records of a caffe-datum or tensor LMDB a batch at a time with lmdbio's "
        "compiled decoders, against decoding them one by one and stacking them, in the same "
        "run; --transform also times Caffe's transform (crop, mirror, mean, scale).",
        "lmdbio bench decode build/demo/digits-datum\n"
        "lmdbio bench decode DB --transform --crop 227 --tile 10000",
    ),
}

#: help for options a benchmark module left without one
_GENERIC_HELP = {
    "--batch-size": "records per batch",
    "--repeat": "timed runs of each case (the best or the median is kept)",
    "--json": "write the result to OUT as JSON",
    "--seed": "seed of the random choices",
    "--datasets": "comma-separated data sets to run (default: all)",
    "--workdir": "folder for the files the benchmark writes (default: a temporary one)",
    "path": "LMDB directory or data.mdb",
    "--strategy": "the read strategy to run (default %(default)s)",
    "--simulate-nodes": "split the ranks into K simulated nodes of consecutive ranks (0: "
                        "the real hosts)",
    "--shuffle": "record order: none (key order, the default), global (the whole epoch "
                 "shuffled; what the flag alone means) or block",
    "--last": "the epoch's last, incomplete batch: pad (repeat records; default), drop or "
              "partial",
    "--prefetch-depth": "batches a reader reads ahead (default %(default)s)",
    "--timeout": "seconds a rank waits for a peer before the job fails (default "
                 "%(default)s)",
    "--batch-sizes": "comma-separated batch sizes (rows) of the compression-ratio table",
    "--ops-batch-size": "rows per batch in the operation timings (default %(default)s)",
    "--epochs": "epochs of the end-to-end training comparison (default %(default)s)",
    "--btable": "a BTable file to include as a data set",
    "--cluster-datasets": "comma-separated data sets of the clustered-mask savings",
}


#: what ``lmdbio bench`` says where no source checkout is found
NEEDS_CHECKOUT = ("lmdbio bench: the benchmarks are not part of the installed package; they "
                  "need a source checkout of lmdbio (its bench/ folder), installed with "
                  "`make setup` (pip install -e)")


def checkout_root() -> Path | None:
    """The source checkout this package runs from (installed editable, or run from the
    tree): the folder above ``lmdbio/`` when it holds ``bench/kinds/``; None otherwise
    (installed from a wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "bench" / "kinds" / "__init__.py").is_file() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    root = checkout_root()
    if root is not None and str(root) not in sys.path:
        sys.path.append(str(root))  # the checkout's top-level bench package
    for name, (module_name, help_text, description, examples) in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text, description=description,
                           epilog=epilog(examples), formatter_class=HelpFormatter)
        if root is None:  # nothing to run: accept any options, main() says why
            p.add_argument("options", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            p.set_defaults(_bench=None)
            continue
        module = importlib.import_module(module_name)
        module.add_arguments(p)
        progress.add_arguments(p)
        for action in p._actions:
            key = action.option_strings[-1] if action.option_strings else action.dest
            if not action.help and key in _GENERIC_HELP:
                action.help = _GENERIC_HELP[key]
        p.set_defaults(_bench=module)


def main(args: argparse.Namespace) -> int:
    if args._bench is None:
        print(NEEDS_CHECKOUT, file=sys.stderr)
        return 2
    with progress.enabled(progress.wanted(args)):
        return int(args._bench.main(args) or 0)
