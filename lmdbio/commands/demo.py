"""``lmdbio demo``: the quickstart behind ``make run``.

1. Converts scikit-learn's bundled handwritten digits (1,797 real 8x8 images) into a
   Caffe-compatible LMDB of Datum records (once; reused afterwards).
2. Describes it with ``lmdbio inspect`` and runs the scan benchmark (engine vs py-lmdb).
3. Launches 4 MPI ranks as 2 simulated nodes (1 reader + 1 worker each) training the
   example Caffe-style trainer through the loader, which prints the loss per epoch and a
   summary (samples/s, MB/s, time waiting for data).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

#: where ``make run`` (and ``lmdbio demo`` from the project root) writes the data set;
#: configs/quickstart.yaml reads it from there
DEFAULT_WORKDIR = "build/demo"
#: the LMDB's folder inside the work directory
DATASET = "digits-datum"


def dataset_path(workdir: str | Path) -> Path:
    """The Caffe Datum LMDB the demo writes in ``workdir``."""
    return Path(workdir) / DATASET


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR,
                        help="where the LMDB is written (default: %(default)s, which "
                        "configs/quickstart.yaml reads)")
    parser.add_argument("-n", "--nprocs", type=int, default=4)
    parser.add_argument("--simulate-nodes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--strategy", default="indexed")


def _step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def main(args: argparse.Namespace) -> int:
    from launch.mpirun import build_launch
    from lmdbio.benchmarks.scan import run as scan
    from lmdbio.lmdb.report import inspect_database

    work = Path(args.workdir)
    db = dataset_path(work)
    _step(f"1. scikit-learn digits -> Caffe Datum LMDB at {db}")
    if not (db / "data.mdb").exists():
        subprocess.run([sys.executable, "-m", "lmdbio.cli", "convert", "sklearn:digits",
                        str(db), "--layout", "caffe-datum", "--overwrite"], check=True)
    else:
        print("(already converted)")
    _step("2. lmdbio inspect")
    report = inspect_database(str(db))
    print(json.dumps({k: report[k] for k in ("format_version", "page_size", "entries",
                                             "depth", "pages", "value_bytes", "file_order")},
                     indent=1))
    _step("2b. lmdbio bench scan (engine gather vs py-lmdb iteration + copy, same run)")
    r = scan(str(db), batch=256, repeat=5)
    print(f"engine {r['engine']['records_per_second']:.0f} records/s, py-lmdb "
          f"{r['pylmdb']['records_per_second']:.0f} records/s: ratio "
          f"{r['ratio_engine_over_pylmdb']:.2f} ({r['records']} records, small database: "
          "open and walk costs dominate)")
    _step(f"3. training: {args.nprocs} ranks as {args.simulate_nodes} simulated nodes, "
          f"strategy {args.strategy}, dedicated readers")
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    overrides = [f"dataset.path={db.resolve()}", "readers.mode=dedicated",
                 f"readers.strategy={args.strategy}",
                 f"topology.simulate_nodes={args.simulate_nodes}", f"epochs={args.epochs}",
                 "metrics.every=0"]
    cmd = [sys.executable, "-m", "loaders.caffe_trainer", str(config)]
    for o in overrides:
        cmd += ["--set", o]
    plan = build_launch(args.nprocs, cmd, simulate_nodes=args.simulate_nodes)
    print(plan.shell_line(), flush=True)
    import os

    env = {**os.environ, **plan.env}
    return subprocess.run(plan.argv, env=env, check=False).returncode
