"""The read-strategy figure set: pages and throughput of every strategy under mpiexec.

Databases (generated with py-lmdb from random bytes, committed 1,000 records at a time as
Caffe's converter does; said so in every result):
  cifar     20,000 records of 3,072 B  (one overflow page each, CIFAR10-Large-like)
  imagenet   1,600 records of 150 KB   (37 overflow pages each, ImageNet-like)
  mnist     60,000 records of 784 B    (inline, five to a leaf page, MNIST-like)

Experiments (each one ``lmdbio bench read`` run under ``mpiexec -n R``, Open MPI,
oversubscribed on this machine's cores; results in bench/results/read/*.json):
  pages       every strategy, R = 1, 2, 4, 8, 16 ranks on max(1, R/2) simulated nodes
              (a reader and a worker per node), every database: pages per rank and node
  estimator   dm-spec, 8 ranks on 4 nodes, 300 iterations: missed/redundant per iteration
  throughput  every strategy, 8 ranks on 4 nodes, colocated (every rank trains, so every
              strategy delivers the same batches), warm and cold (the file dropped from
              the page cache after setup; each node reads its own copy of the file, so
              nodes do not share a page cache), with the node's resident pages afterwards
              (mincore), the py-lmdb baseline for the naive strategies and a sequential
              read of the file; cold twice: with the kernel's default read-around on page
              faults (8 MiB on this machine) and with it off (MADV_RANDOM, page-exact I/O)
  production  warm throughput without per-iteration page accounting (as a training job
              runs), cifar and mnist, 8 ranks on 4 nodes, colocated
  direct      every simulated node reads into its own O_DIRECT cache, emptied every epoch
              (``--direct``), every database and strategy, 8 ranks on 4 nodes, colocated
              and dedicated, three repeats (table: ``--table direct``)
  warm        the same matrix on cifar with one warm page cache, no accounting
              (``--table warm``)
  slots       cifar, 8 ranks on 4 nodes, colocated, no accounting: one batch per ring
              slot against the training job's default (``--batches-per-slot 0``: 16 here,
              one walk and one cursor hand-off per slot for LMM and the DM chains), warm
              (one shared page cache, 1,500 iterations) and cold (per-node copies, one
              epoch), every strategy with its default read-around; three repeats
              (table: ``--table slots``)
  defaults    the issue's command with every option at its default (batch 64, colocated
              readers, the job's slot size, record spans, accounting on), 8 ranks on 4
              nodes, cifar, mnist and imagenet, warm (4 epochs) and cold (per-node
              copies, one epoch), plus dm-spec and indexed with records copied into the
              ring; three repeats (table: ``--table defaults``)
  repeats     the same command on cifar, warm, naive-stride, dm-serial, dm-spec and
              indexed, 4 epochs and 100 iterations, seven repeats with the strategies
              interleaved in each (table: ``--table repeats``: medians and the range of
              the ratios to naive-stride within a repeat)
  replay      no MPI: dm-spec's estimate replayed from each database's record table for
              4 and 16 readers, 32 and 128 records per reader, with the reference code's
              estimator and lmdbio's (missed and redundant pages after two iterations)
Then ``python -m bench.plot_read`` draws docs/figures/read-*.png from the JSON files.

Run: .venv/bin/python -m bench.read [--only pages,estimator,throughput] [--quick]
(from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import BENCH_DATA, BIN, MPI_ENV, RESULTS, random_db, write_json
from lmdbio.plan.strategies import STRATEGIES as _REGISTERED

STRATEGIES = list(_REGISTERED)  # every registered strategy, in registry order
SHAPES = {  # name: (records, value bytes, per-consumer batch)
    "cifar": (20_000, 3072, 32),
    "imagenet": (1_600, 150_000, 4),
    "mnist": (60_000, 784, 64),
}


def generate(data: Path, name: str) -> Path:
    n, size, _ = SHAPES[name]
    return random_db(data / f"read-{name}", n, size, seed=3, map_size=1 << 32)


def node_copies(src: Path, nodes: int) -> str:
    """Byte-identical copies of the database, one per simulated node; returns the path
    template with ``{node}``."""
    for k in range(nodes):
        dst = src.parent / f"{src.name}-node{k}"
        if not (dst / "data.mdb").exists() or \
                (dst / "data.mdb").stat().st_size != (src / "data.mdb").stat().st_size:
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / "data.mdb", dst / "data.mdb")
    return str(src.parent / f"{src.name}-node{{node}}")


def bench(out: Path, ranks: int, path: str, strategy: str, *extra: str,
          timeout: float = 900) -> dict | None:
    """One ``lmdbio bench read`` run; its JSON (also kept in ``out``), or None on failure."""
    if out.exists():
        return json.loads(out.read_text())
    if "--batches-per-slot" not in extra:
        # the series measured before `lmdbio bench read` took the job's slot size by
        # default ran one batch per slot; they stay what docs/reading.md describes
        extra = (*extra, "--batches-per-slot", "1")
    if "--transfer" not in extra:
        # and before node rings carried record spans by default: records copied
        extra = (*extra, "--transfer", "copy")
    cmd = [str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "lmdbio"), "bench", "read", path,
           "--strategy", strategy, "--json", str(out), *extra]
    env = dict(os.environ, **MPI_ENV)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.perf_counter() - t0
    if proc.returncode or not out.exists():
        print(f"FAILED ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}", flush=True)
        return None
    result = json.loads(out.read_text())
    result["command"] = " ".join(["mpiexec", "-n", str(ranks), "lmdbio", "bench", "read",
                                  path, "--strategy", strategy, *extra])
    result["launch_seconds"] = took
    # other work on the machine shows in the timings: the 1-minute load before and after
    result["loadavg"] = [load_before, os.getloadavg()[0]]
    write_json(out, result)
    print(f"{took:6.1f} s  {result['command']}", flush=True)
    return result


def pages(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    rank_counts = [1, 2, 4] if quick else [1, 2, 4, 8, 16]
    for name in ("cifar", "mnist", "imagenet"):
        batch = SHAPES[name][2]
        iters = 6 if quick else 20
        for r in rank_counts:
            nodes = max(1, r // 2)
            for s in STRATEGIES:
                bench(res / f"pages-{name}-{s}-r{r}.json", r, str(dbs[name]), s,
                      "--batch-size", str(batch), "--iters", str(iters),
                      "--simulate-nodes", str(nodes))


def estimator(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    for name in ("cifar", "imagenet"):
        iters = 30 if quick else (300 if name == "cifar" else 100)
        bench(res / f"estimator-{name}.json", 8, str(dbs[name]), "dm-spec",
              "--batch-size", str(SHAPES[name][2]), "--iters", str(iters),
              "--simulate-nodes", "4", "--mode", "colocated")


def throughput(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    for name in ("cifar", "mnist", "imagenet"):
        batch = SHAPES[name][2]
        iters = 20 if quick else (150 if name != "imagenet" else 60)
        copies = node_copies(dbs[name], 4)
        for s in STRATEGIES:
            common = ["--batch-size", str(batch), "--iters", str(iters), "--warmup", "5",
                      "--simulate-nodes", "4", "--mode", "colocated", "--sequential"]
            if not _REGISTERED[s].shared:  # every rank reads for itself: py-lmdb replays it
                common.append("--pylmdb")
            bench(res / f"throughput-{name}-{s}-warm.json", 8, str(dbs[name]), s, *common)
            bench(res / f"throughput-{name}-{s}-cold.json", 8, copies, s, *common,
                  "--cold", "--footprint")
            bench(res / f"throughput-{name}-{s}-coldrandom.json", 8, copies, s, *common,
                  "--cold", "--footprint", "--advice", "random")


class ReferenceEstimator:
    """The reference code's estimator (branch ``icpads-multiple-readers``), for comparison:
    the range observed is from the first value's page to the end of the last value; min and
    max of the stride and max of the pages over all iterations; next start = previous end +
    min stride, next length = max stride - min stride + max pages."""

    name = "reference"

    def __init__(self, tree) -> None:
        self.prev_end: int | None = None
        self.strides: list[int] = []
        self.max_pages = 0

    def observe(self, first_id: int, refs, pages, stack, psize: int) -> None:
        first = int(refs.val_off[0]) // psize
        end = (int(refs.val_off[-1]) + max(int(refs.val_len[-1]), 1) - 1) // psize + 1
        if self.prev_end is not None:
            self.strides.append(first - self.prev_end)
        self.max_pages = max(self.max_pages, end - first)
        self.prev_end = end

    def predict(self, first_id: int, count: int):
        if not self.strides or self.prev_end is None:
            return None
        lo, hi = min(self.strides), max(self.strides)
        return [(max(self.prev_end + lo, 2), max(hi - lo + self.max_pages, 1))]


class RangeEstimator:
    """lmdbio's min/max estimator alone (:class:`PageRangeEstimator`): dm-spec's fallback."""

    name = "min/max"

    def __init__(self, tree) -> None:
        from lmdbio.plan.strategies import PageRangeEstimator

        self.e = PageRangeEstimator()

    def observe(self, first_id: int, refs, pages, stack, psize: int) -> None:
        self.e.observe_pages(refs.pages(psize))

    def predict(self, first_id: int, count: int):
        g = self.e.predict()
        return None if g is None else [g]


class DmSpecEstimator(RangeEstimator):
    """What dm-spec does (:func:`predict_regular`): exact value pages for records of one
    size plus the walk's branch pages, else the min/max estimator."""

    name = "lmdbio"

    def __init__(self, tree) -> None:
        from lmdbio.plan.strategies import ValuePageEstimator

        super().__init__(tree)
        self.v = ValuePageEstimator(tree)
        self.stack: list = []

    def observe(self, first_id: int, refs, pages, stack, psize: int) -> None:
        from lmdbio.plan.strategies.spec_estimate import main_run

        run = main_run(refs.pages(psize), max(2, pages.size // 8))
        if run is not None:
            self.e.observe(*run)
        self.v.observe(first_id, refs, psize, run)
        self.stack = [list(x) for x in stack]

    def predict(self, first_id: int, count: int):
        from lmdbio.plan.strategies.spec_estimate import predict_regular

        return predict_regular(self.v, self.e, self.stack, first_id, count)


def replay(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """dm-spec's estimate replayed without MPI: ``n`` readers take ``count`` records each per
    iteration in key order (one epoch), as DM's chain does, walking them with a cursor.
    Needed pages: the values' pages, the records' leaf pages and the branch pages on the
    walk's path. Same first guess for every estimator; the first two iterations left out."""
    import numpy as np

    from lmdbio.lmdb import Database
    from lmdbio.plan.strategies.spec_estimate import KnownTreePages

    out = []
    for name in ("cifar", "imagenet", "mnist"):
        db = Database(dbs[name])
        ps = db.psize
        t = db.record_table(0, 1)
        ppr = max(1, -(-(int(t.val_len[0]) + db.layout.header_size) // ps))
        for readers in (4, 16):
            for count in (32, 64, 128):
                for est_cls in (ReferenceEstimator, RangeEstimator, DmSpecEstimator):
                    tree = KnownTreePages()
                    ests = [est_cls(tree) for _ in range(readers)]
                    cursor = db.cursor()
                    cursor.first()
                    missed = redundant = needed = 0
                    iters = len(db) // (readers * count)
                    for i in range(iters):
                        for r in range(readers):
                            lo = (i * readers + r) * count
                            g = ests[r].predict(lo, count) if i >= 2 else None
                            ranges = g or [(2 + lo * ppr, count * ppr)]
                            refs, _, _ = db.walk_collect(cursor, count)
                            first = refs.val_off // ps
                            n = np.maximum(refs.ovf_pages, 1)
                            values = np.unique(np.repeat(first, n) + np.arange(n.sum())
                                               - np.repeat(np.cumsum(n) - n, n))
                            walked = np.union1d(refs.leaf_pg,
                                                [p for p, _ in cursor.stack[:-1]])
                            pages = np.union1d(values, walked)
                            fetched = np.unique(np.concatenate(
                                [np.arange(a, a + k) for a, k in ranges]))
                            if i >= 2:
                                missed += int(np.setdiff1d(values, fetched).size)
                                redundant += int(np.setdiff1d(fetched, pages).size)
                                needed += int(pages.size)
                            tree.learn(db, cursor.stack)
                            ests[r].observe(lo, refs, pages, cursor.stack, ps)
                    row = {"db": name, "readers": readers, "records_per_reader": count,
                           "estimator": est_cls.name, "iterations": iters,
                           "needed_pages": needed, "missed_value_pages": missed,
                           "redundant_pages": redundant,
                           "redundant_percent": 100 * redundant / max(needed, 1),
                           "missed_percent": 100 * missed / max(needed, 1)}
                    out.append(row)
                    print(row, flush=True)
        db.close()
    write_json(res / "estimator-replay.json", out)


DIRECT_ITERS = {"cifar": 400, "mnist": 600, "imagenet": 120}


def warm(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """The ``direct`` matrix on the CIFAR-like database with one shared, warm page cache
    and no per-iteration accounting (as a training job runs): what one host shows."""
    _matrix(res, dbs, quick, "warm", ("cifar",), ["--no-accounting"])


def direct(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """Every simulated node reads into its own cache with O_DIRECT reads, emptied at every
    epoch (``--direct``): storage reads that one host's shared page cache hides. 8 ranks on
    4 nodes, every strategy colocated (the consumers and batches of naive-stride) and the
    node-level ones also dedicated; three repeats, interleaved, so that the machine's other
    load falls on every strategy alike. Runs span several epochs, so every epoch reads from
    storage again (a data set larger than a node's memory)."""
    _matrix(res, dbs, quick, "direct", ("cifar", "mnist", "imagenet"), ["--direct"])


def _matrix(res: Path, dbs: dict[str, Path], quick: bool, prefix: str, names: tuple,
            extra: list[str]) -> None:
    """Every strategy colocated, the node-level ones also dedicated, 8 ranks on 4 nodes,
    three repeats interleaved; results ``{prefix}-{db}-{strategy}-{mode}-r{k}.json``."""
    repeats = 1 if quick else 3
    for rep in range(repeats):
        for name in names:
            batch = SHAPES[name][2]
            iters = 30 if quick else DIRECT_ITERS[name]
            for s in STRATEGIES:
                for mode in ("colocated", "dedicated"):
                    if mode == "dedicated" and not _REGISTERED[s].shared:
                        continue  # every rank reads for itself: the mode does not apply
                    bench(res / f"{prefix}-{name}-{s}-{mode}-r{rep}.json", 8, str(dbs[name]),
                          s, "--batch-size", str(batch), "--iters", str(iters), "--warmup",
                          "5", "--simulate-nodes", "4", "--mode", mode, *extra)


def _median(runs: list[dict], get) -> float:
    """Median of ``get(run)`` over repeated runs."""
    import statistics

    return statistics.median(get(r) for r in runs)


def _steady(r: dict) -> float:
    return r["totals"]["steady"]["records_per_second"]


def _loop(r: dict) -> float:
    return r["totals"]["loop_records_per_second"]


def _whole(r: dict) -> float:
    return r["totals"]["records_per_second"]


def direct_table(res: Path, prefix: str = "direct") -> str:
    """Markdown table of the ``direct`` (or ``warm``) runs: medians over repeats, ratios to
    naive-stride (colocated) of the same repeat set."""
    rows: dict[tuple[str, str, str], list[dict]] = {}
    for f in sorted(res.glob(f"{prefix}-*.json")):
        r = json.loads(f.read_text())
        mode = "dedicated" if "--mode dedicated" in r.get("command", "") else "colocated"
        rows.setdefault((Path(r["path"]).name.replace("read-", ""), r["strategy"], mode),
                        []).append(r)

    out = ["| db | strategy | mode | consumers | steady records/s | x naive-stride | loop "
           "records/s | x naive-stride | whole run records/s | x naive-stride | storage "
           "pages read per record | pread calls per record | runs |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for db in ("cifar", "mnist", "imagenet"):
        base = rows.get((db, "naive-stride", "colocated"))
        if not base:
            continue
        for s in STRATEGIES:
            for mode in ("colocated", "dedicated"):
                runs = rows.get((db, s, mode))
                if not runs:
                    continue
                consumers = sum(1 for p in runs[0]["per_rank"] if p["worker"])
                io = [r["totals"].get("direct_io") for r in runs]
                pages = _median(runs, lambda r: r["totals"]["direct_io"]["pages"]
                            / max(r["totals"]["records_delivered"], 1)) if all(io) else None
                calls = _median(runs, lambda r: r["totals"]["direct_io"]["reads"]
                            / max(r["totals"]["records_delivered"], 1)) if all(io) else None
                cells = [db, s, mode, str(consumers)]
                for get in (_steady, _loop, _whole):
                    v = _median(runs, get)
                    cells += [f"{v:,.0f}", f"{v / _median(base, get):.2f}"]
                cells += ["-" if pages is None else f"{pages:.3f}",
                          "-" if calls is None else f"{calls:.3f}", str(len(runs))]
                out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


#: iterations within one epoch at 8 consumers (the file is dropped from the cache once, after
#: the setup: a second epoch would read it warm)
ONE_EPOCH_ITERS = {"cifar": 75, "mnist": 110, "imagenet": 48}
ADVICE_CASES = {"cold": ["--cold"], "coldrandom": ["--cold", "--advice", "random"]}
#: the ``advice`` runs, ``(strategy, extra flags)``: every strategy but lmm (left out of
#: these runs from the start), those that advise (``advises``) also without their advice
ADVICE_RUNS = [(s, extra) for s in STRATEGIES if s != "lmm"
               for extra in ([[], ["--no-prefetch-advice"]] if _REGISTERED[s].advises else [[]])]


def advice(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """Cold page cache, every simulated node its own copy of the file (so nodes share no
    cached page), with the kernel's read-around and without it (LMDB's MDB_NORDAHEAD):
    naive-stride and naive-contig (no advice: what Caffe and DALI do), dm-serial, and
    dm-spec and indexed with and without asking the kernel for their pages first
    (``--no-prefetch-advice``). 8 ranks on 4 nodes, colocated, one epoch (the file is
    cold once), three repeats interleaved;
    results ``advice-{db}-{strategy}[-noadvice]-{cache}-r{k}.json``."""
    repeats = 1 if quick else 3
    for rep in range(repeats):
        for name in ("cifar", "mnist", "imagenet"):
            batch = SHAPES[name][2]
            iters = 30 if quick else ONE_EPOCH_ITERS[name]
            copies = node_copies(dbs[name], 4)
            for cache, flags in ADVICE_CASES.items():
                for s, extra in ADVICE_RUNS:
                    tag = s + ("-noadvice" if extra else "")
                    bench(res / f"advice-{name}-{tag}-{cache}-r{rep}.json", 8, copies, s,
                          "--batch-size", str(batch), "--iters", str(iters), "--warmup",
                          "5", "--simulate-nodes", "4", "--mode", "colocated",
                          "--no-accounting", "--footprint", *flags, *extra)


def advice_table(res: Path) -> str:
    """Markdown table of the ``advice`` runs: medians over repeats, ratios to naive-stride
    of the same database and cache state."""
    rows: dict[tuple[str, str, str], list[dict]] = {}
    for f in sorted(res.glob("advice-*.json")):
        name, rest = f.stem.split("-", 2)[1:]
        tag, cache, _ = rest.rsplit("-", 2)
        rows.setdefault((name, tag, cache), []).append(json.loads(f.read_text()))

    def resident(r: dict) -> float:
        return (r["totals"].get("resident_pages") or 0) / \
            max(r["totals"]["records_delivered"], 1)

    out = ["| db | cache | strategy | advice | steady records/s | x naive-stride | loop "
           "records/s | x naive-stride | resident pages per record delivered | runs |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    tags = [s + ("-noadvice" if extra else "") for s, extra in ADVICE_RUNS]
    for name in ("cifar", "mnist", "imagenet"):
        for cache in ADVICE_CASES:
            base = rows.get((name, "naive-stride", cache))
            if not base:
                continue
            for tag in tags:
                runs = rows.get((name, tag, cache))
                if not runs:
                    continue
                s = tag.replace("-noadvice", "")
                adv = "-" if not _REGISTERED[s].advises else \
                    ("off" if tag.endswith("-noadvice") else "on")
                cells = [name, "cold" if cache == "cold" else "cold, no read-around", s, adv]
                for get in (_steady, _loop):
                    v = _median(runs, get)
                    cells += [f"{v:,.0f}", f"{v / _median(base, get):.2f}"]
                cells += [f"{_median(runs, resident):.2f}", str(len(runs))]
                out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


SLOT_RUNS = [("naive-stride", "1"), ("lmm", "0"), ("dm-serial", "1"), ("dm-serial", "0"),
             ("dm-spec", "1"), ("dm-spec", "0"), ("indexed", "1"), ("indexed", "0")]


def slots(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """One batch per ring slot against the training job's default slot size, warm and
    cold (module docstring); results ``slots-cifar-{strategy}-s{per_slot}-{cache}-r{k}``."""
    repeats = 1 if quick else 3
    batch = SHAPES["cifar"][2]
    copies = node_copies(dbs["cifar"], 4)
    for rep in range(repeats):
        for cache in ("warm", "cold"):
            path = str(dbs["cifar"]) if cache == "warm" else copies
            iters = (30 if quick else 1500) if cache == "warm" else ONE_EPOCH_ITERS["cifar"]
            flags = [] if cache == "warm" else ["--cold", "--footprint"]
            for s, per in SLOT_RUNS:
                bench(res / f"slots-cifar-{s}-s{per}-{cache}-r{rep}.json", 8, path, s,
                      "--batch-size", str(batch), "--iters", str(iters), "--warmup", "5",
                      "--simulate-nodes", "4", "--mode", "colocated", "--no-accounting",
                      "--batches-per-slot", per, *flags)


def slots_table(res: Path) -> str:
    """Markdown table of the ``slots`` runs: medians over repeats, ratios to naive-stride
    of the same cache state."""
    rows: dict[tuple[str, str, str], list[dict]] = {}
    for f in sorted(res.glob("slots-cifar-*.json")):
        strategy, per, cache, _ = f.stem[len("slots-cifar-"):].rsplit("-", 3)
        rows.setdefault((strategy, per, cache), []).append(json.loads(f.read_text()))

    def resident(r: dict) -> float:
        return (r["totals"].get("resident_pages") or 0) / \
            max(r["totals"]["records_delivered"], 1)

    out = ["| cache | strategy | batches per slot | read-around | steady records/s | "
           "x naive-stride | loop records/s | x naive-stride | resident pages per record "
           "| runs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for cache in ("warm", "cold"):
        base = rows.get(("naive-stride", "s1", cache))
        if not base:
            continue
        for s, per in SLOT_RUNS:
            runs = rows.get((s, f"s{per}", cache))
            if not runs:
                continue
            cells = [cache, s, str(runs[0].get("batches_per_slot", per)),
                     "on" if runs[0].get("read_around", True) else "off"]
            for get in (_steady, _loop):
                v = _median(runs, get)
                cells += [f"{v:,.0f}", f"{v / _median(base, get):.2f}"]
            cells += [f"{_median(runs, resident):.2f}" if cache == "cold" else "-",
                      str(len(runs))]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


DEFAULT_RUN_EPOCHS = {"warm": 4, "cold": 1}
#: the databases of the ``defaults`` series (imagenet: 1,600 records of 150 KB, 7
#: iterations an epoch at batch 64 on 4 consumers)
DEFAULT_DBS = ("cifar", "mnist", "imagenet")
#: (row label, strategy, --transfer) of the ``defaults`` series: every strategy with the
#: command's default transfer (record spans; the naive strategies have no ring), and the
#: two node-level strategies of the targets with records copied into the ring too
DEFAULT_VARIANTS = [*((s, s, "spans") for s in STRATEGIES),
                    ("dm-spec-copy", "dm-spec", "copy"), ("indexed-copy", "indexed", "copy")]


def _epoch_iters(name: str, ranks: int, batch: int) -> int:
    """Iterations of one epoch of ``name`` with ``lmdbio bench read``'s default layout
    (colocated: every rank consumes, whatever the strategy)."""
    from lmdbio.plan.epoch import iterations_per_epoch

    return iterations_per_epoch(SHAPES[name][0], ranks, batch, "pad")


def defaults(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """The issue's command with every option at its default (batch 64, colocated readers,
    the job's ring slot size, per-iteration accounting on, each strategy's read-around),
    8 ranks on 4 simulated nodes: warm (one shared page cache, 4 epochs) and cold (every
    node its own copy, dropped after the setup, one epoch, resident pages counted after);
    cifar, mnist and imagenet, three repeats (table: ``--table defaults``)."""
    repeats = 1 if quick else 3
    for rep in range(repeats):
        for name in DEFAULT_DBS:
            copies = node_copies(dbs[name], 4)
            for cache in ("warm", "cold"):
                path = str(dbs[name]) if cache == "warm" else copies
                flags = [] if cache == "warm" else ["--cold", "--footprint"]
                for label, s, transfer in DEFAULT_VARIANTS:
                    iters = DEFAULT_RUN_EPOCHS[cache] * _epoch_iters(name, 8, 64)
                    bench(res / f"defaults-{name}-{label}-{cache}-r{rep}.json", 8, path, s,
                          "--batch-size", "64", "--iters", str(20 if quick else iters),
                          "--simulate-nodes", "4", "--batches-per-slot", "0",
                          "--transfer", transfer, *flags)


def defaults_table(res: Path) -> str:
    """Markdown table of the ``defaults`` runs: medians over repeats, ratios to
    naive-stride of the same database and cache state."""
    rows: dict[tuple[str, str, str], list[dict]] = {}
    for f in sorted(res.glob("defaults-*.json")):
        name, rest = f.stem[len("defaults-"):].split("-", 1)
        strategy, cache, _ = rest.rsplit("-", 2)
        rows.setdefault((name, strategy, cache), []).append(json.loads(f.read_text()))

    def setup(r: dict) -> float:
        return max(p["seconds"]["setup"] for p in r["per_rank"])

    def node_pages(r: dict) -> float:
        t = r["totals"]
        return t["node_pages_touched"] / max(t["own_pages_union"], 1)

    def resident(r: dict) -> float:
        t = r["totals"]
        return (t.get("resident_pages") or 0) / max(t["own_pages_union"], 1)

    out = ["| db | cache | strategy | consumers | records | whole run records/s | x naive-stride "
           "| loop records/s | x naive-stride | setup s | node pages touched / needed "
           "| resident / needed | runs |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in DEFAULT_DBS:
        for cache in ("warm", "cold"):
            base = rows.get((name, "naive-stride", cache))
            if not base:
                continue
            for s, _, _ in DEFAULT_VARIANTS:
                runs = rows.get((name, s, cache))
                if not runs:
                    continue
                r0 = runs[0]
                cells = [name, cache, s, str(sum(p["worker"] for p in r0["per_rank"])),
                         f"{r0['totals']['records_delivered']:,}"]
                for get in (_whole, _loop):
                    v = _median(runs, get)
                    cells += [f"{v:,.0f}", f"{v / _median(base, get):.2f}"]
                cells += [f"{_median(runs, setup):.3f}", f"{_median(runs, node_pages):.2f}",
                          f"{_median(runs, resident):.2f}" if cache == "cold" else "-",
                          str(len(runs))]
                out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def production(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """Warm throughput as a training job runs: no per-iteration page accounting."""
    for name in ("cifar", "mnist"):
        batch = SHAPES[name][2]
        for s in STRATEGIES:
            extra = [] if _REGISTERED[s].shared else ["--pylmdb"]
            bench(res / f"production-{name}-{s}.json", 8, str(dbs[name]), s,
                  "--batch-size", str(batch), "--iters", "20" if quick else "150",
                  "--warmup", "5", "--simulate-nodes", "4", "--mode", "colocated",
                  "--no-accounting", *extra)


#: the ``repeats`` experiment: its strategies, in the order each repeat runs them
REPEAT_STRATEGIES = ("naive-stride", "dm-serial", "dm-spec", "indexed")
REPEATS = 7


def repeats(res: Path, dbs: dict[str, Path], quick: bool) -> None:
    """The issue's command with its defaults on the CIFAR-like file, warm, 8 ranks on 4
    simulated nodes, for 4 epochs and for 100 iterations: ``REPEATS`` repeats, the
    strategies interleaved within each repeat, so that a slow moment of the machine falls
    on every strategy of that repeat (table: ``--table repeats``: medians and the range of
    the ratios within a repeat)."""
    for iters in (DEFAULT_RUN_EPOCHS["warm"] * _epoch_iters("cifar", 8, 64), 100):
        for rep in range(2 if quick else REPEATS):
            for s in REPEAT_STRATEGIES:
                bench(res / f"repeats-i{iters}-{s}-r{rep}.json", 8, str(dbs["cifar"]), s,
                      "--batch-size", "64", "--iters", str(iters), "--simulate-nodes", "4",
                      "--batches-per-slot", "0", "--transfer", "spans")


def repeats_table(res: Path) -> str:
    """Markdown table of the ``repeats`` runs: per run length and strategy, medians of
    the whole-run and loop rates, their ratios to naive-stride's medians, the lowest and
    highest ratio to naive-stride's run of the same repeat, and the median setup (whole
    run minus loop)."""
    runs: dict[tuple[int, str], dict[int, dict]] = {}
    for f in sorted(res.glob("repeats-i*.json")):
        iters, rest = f.stem[len("repeats-i"):].split("-", 1)
        strategy, rep = rest.rsplit("-r", 1)
        runs.setdefault((int(iters), strategy), {})[int(rep)] = json.loads(f.read_text())

    def setup(r: dict) -> float:
        return r["totals"]["seconds"] - r["totals"]["loop_seconds"]

    out = ["| iterations | strategy | whole run records/s | x naive-stride | per-repeat range "
           "| loop records/s | x naive-stride | setup s | runs |",
           "|---|---|---|---|---|---|---|---|---|"]
    for iters in sorted({i for i, _ in runs}):
        base = runs.get((iters, "naive-stride"), {})
        if not base:
            continue
        for s in REPEAT_STRATEGIES:
            got = runs.get((iters, s), {})
            if not got:
                continue
            ratios = [_whole(r) / _whole(base[k]) for k, r in got.items() if k in base]
            cells = [str(iters), s]
            for get in (_whole, _loop):
                v = _median(list(got.values()), get)
                cells.append(f"{v:,.0f}")
                cells.append(f"{v / _median(list(base.values()), get):.2f}")
                if get is _whole:
                    cells.append(f"{min(ratios):.2f}-{max(ratios):.2f}")
            cells += [f"{_median(list(got.values()), setup):.3f}", str(len(got))]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(RESULTS / "read"))
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--only",
                        default="replay,pages,estimator,throughput,production,direct,warm")
    parser.add_argument("--quick", action="store_true", help="fewer ranks and iterations")
    parser.add_argument("--table", choices=["direct", "warm", "advice", "slots", "defaults",
                                            "repeats"],
                        default=None,
                        help="print the markdown table of those runs in --out and exit")
    args = parser.parse_args()
    res = Path(args.out)
    if args.table:
        tables = {"advice": advice_table, "slots": slots_table,
                  "defaults": defaults_table, "repeats": repeats_table}
        print(tables[args.table](res) if args.table in tables
              else direct_table(res, args.table))
        return 0
    res.mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    dbs = {name: generate(data, name) for name in SHAPES}
    for part in args.only.split(","):
        {"pages": pages, "estimator": estimator, "throughput": throughput,
         "replay": replay, "production": production, "direct": direct, "warm": warm,
         "advice": advice, "slots": slots, "defaults": defaults, "repeats": repeats}[part](
            res, dbs, args.quick)
    write_json(res / "databases.json", {
        name: {"path": str(dbs[name]), "records": n, "value_bytes": size,
               "batch_per_consumer": b, "data": f"generated: {n} records of {size} random "
               "bytes, py-lmdb, committed every 1,000 records"}
        for name, (n, size, b) in SHAPES.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
