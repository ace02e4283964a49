"""Calibrate and check the scaling model (lmdbio.scale) against ``lmdbio bench read``.

Databases: bench/read.py's generators (build/bench-data/read-{cifar,imagenet,mnist}:
20,000 x 3,072 B, 1,600 x 150 KB, 60,000 x 784 B, py-lmdb, 1,000 records a commit), and
:data:`SIZE_SHAPES` (read-size-48k: 2,000 x 48 KB, the split "databases+sizes" only).

Stages (``--only pages,fit``; the fit runs first; ``io``, ``copy`` and ``ring`` on request):
  pages  every strategy at 1, 2, 4, 8 ranks on max(1, R/2) simulated nodes (oversubscribed
         on this host: page counts only, never speed), one batch per slot (the paper's
         regime) on cifar, and imagenet at 2 ranks: the model's pages per rank (touched,
         own, extra) against bench read's, per run and rank.
  fit    1. warm runs (every page in the page cache: the file system costs nothing here)
         of every strategy and database at 1 rank and at 2 ranks on 2 simulated nodes
         (never more ranks than this host's 2 cores), ``--batches-per-slot 0`` (a job's
         default), and the node-level strategies at 1 rank on the fit databases at 1 and
         4 batches a slot (:data:`FIT_SLOT_SIZES`: a cost per slot), whole epochs: a
         probe run of 3 epochs per configuration sets how many epochs reach
         ``--target`` seconds of loop, then ``--repeats`` runs of every
         configuration interleaved (A B C .. A B C ..), the load average before each
         pass; medians kept, spreads reported.
         2. every 1-rank configuration run twice at once (two independent jobs, one per
         core): its CPU seconds against the same configuration alone (the median of its
         repeats) give the host's ``cpu_contention_factor`` (the median over the
         configurations), which the model applies to the runs with a rank on every core.
         3. a ping-pong between 2 ranks under mpiexec, waiting as the DM chain waits for
         its cursor and with a blocking ``recv`` (:mod:`bench.pingpong`, kept in
         ``runs/pingpong.json`` with the runs it describes): the message latency
         (``mpi_latency_s``: half the blocking round trip) and how much longer than asked
         the waiting rank's sleeps last (``poll_overshoot_s``: the round trip without work
         less the first sleep), for the model's :func:`~lmdbio.scale.model.poll_delay`;
         the cases with work check that model (``pingpong.model_check``).
         4. per split (:data:`SPLITS`), the CPU costs fitted by non-negative least squares
         on each rank's CPU seconds of the loop (``cpu_seconds.loop``: user + system, far
         less sensitive to other load than wall time) of the split's fit set; per run the
         model's CPU seconds per rank against the measured ones, and its loop time (the
         critical path of those costs with the measured latency and sleeps) against the
         measured loop, as throughput (records / loop seconds): against the median of
         the repeats, and against the fastest (the repeat least disturbed by other work
         on the host, reported beside it, never instead of it).

  io     cold runs: every strategy and database at 1 rank and at 2 ranks on 2 nodes,
         ``--direct`` (each simulated node reads every page it needs into its own cache
         with ``O_DIRECT`` reads, empty at every epoch; faults read their aligned 128 KiB
         window, ``--direct-read-around 128``), :data:`IO_EPOCHS` epochs, once each. The
         file system's costs (``fs_latency_s``, ``fs_node_bandwidth_bps``) fitted by
         non-negative least squares on each 1-rank run's I/O seconds against its reads
         and bytes (``direct_io``); per run the model's requests and bytes (its page
         cache replay under those read rules) against the reads and bytes measured, its
         I/O seconds per rank against the measured ones (2 ranks held out), and its loop
         time (the fitted CPU costs of ``fit`` with the fitted I/O costs) against the
         measured loop.

  copy   the consumer's copy alone (:func:`copy_probe`), on every calibration database
         and the projection's two (bench/scale_project.py): CPU seconds per byte and per
         record by record size, apart from every fit.
  ring   the node ring's hand-off alone (:mod:`bench.ring_handoff`, kept in
         ``ring-handoff.json``): CPU per slot and per record by slot size on every
         calibration database; the per-slot intercept (median over the databases) is the
         model's ``handoff_s_per_slot``, which ``fit`` then takes as known (with the page
         accounting of ``copy``), as it cannot tell it from a cost per record.
         ``--rerun-held-out DIR`` (with ``fit``): the configurations some split holds out
         measured again into DIR, ``--rerun-repeats`` interleaved repeats each, fitted and
         evaluated with those runs as their rows (``fit_rerun`` in calibration.json; the
         fit and fitted-costs.yaml stay the runs of ``runs/``).

Output: bench/results/scale/calibration.json, bench/results/scale/fitted-costs.yaml and
one JSON per bench read run (bench/results/scale/runs/, the delivered record ids left out).

Run: .venv/bin/python -m bench.scale_calibrate [--only pages,fit,io,copy,ring] [--quick]
     [--repeats 3] [--trace-cache build/scale-calib-traces]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import read as bench_read
from bench.common import BENCH_DATA, RESULTS, random_db, write_json
from bench.pingpong import run as pingpong_run
from lmdbio.plan.strategies import node_level
from lmdbio.scale import Costs, epoch_time, trace
from lmdbio.scale.model import actor_cpu_seconds, step_costs
from lmdbio.scale.trace import Trace, cached_trace

STRATEGIES = bench_read.STRATEGIES
#: the costs fitted (the file system's are 0 on a warm page cache)
FITTED = ("cpu_walk_s", "cpu_skip_s", "cpu_locate_s", "cpu_page_s", "cpu_step_s",
          "cpu_speculate_s", "cpu_slot_s", "copy_s_per_byte", "consume_s_per_record")
#: CPU costs measured by probes of their own, taken as known in the fit: the page
#: accounting (``--only copy``) and the ring's cost per slot (``--only ring``,
#: :mod:`bench.ring_handoff`: a fit on slots of 222-4,000 records cannot tell it from a
#: cost per record)
MEASURED_APART = ("cpu_account_s_per_file_page", "handoff_s_per_slot")
#: the databases the splits "databases" and "ranks+databases" fit on; the rest is held out
FIT_DBS = ("cifar", "mnist")
#: databases of other record sizes, measured at 1 rank for the split "databases+sizes"
#: only (records, value bytes, per-consumer batch: a batch of about 400 KB): the fit set of
#: cifar and mnist spans 784-3,072 B records, too little to tell a cost per byte from one
#: per record or per page, and the held-out imagenet's are 150 KB
SIZE_SHAPES = {"size-48k": (2_000, 48_000, 8)}
#: slot sizes (batches a slot) of the extra fit runs: every node-level strategy at 1 rank
#: on the fit databases. A job's default slots hold 2,000-4,000 of their records, so a
#: cost per slot (``cpu_slot_s``) hides in the costs per record there, and the held-out
#: imagenet's slots hold 80; slots of 1 and 4 batches (32-256 records) pin it
FIT_SLOT_SIZES = (1, 4)
#: the node-level strategies (a node's reader hands slots through a ring), from the
#: strategy registry
NODE_STRATEGIES = node_level()
#: the fit / held-out splits: name -> (what it fits on, what it holds out). The first
#: gives bench/results/scale/fitted-costs.yaml
SPLITS = {
    "ranks": ("1 rank on every database", "2 ranks on 2 nodes on every database (a rank "
              "count not in the fit)"),
    "databases": (f"1 and 2 ranks on {', '.join(FIT_DBS)}", "1 and 2 ranks on the other "
                  "databases (imagenet: 150 KB records, 37 pages each)"),
    "ranks+databases": (f"1 rank on {', '.join(FIT_DBS)}", "1 rank on the other "
                        "databases (imagenet) and 2 ranks on 2 nodes on every database"),
    "databases+sizes": (f"1 and 2 ranks on {', '.join(FIT_DBS)}, 1 rank on "
                        f"{', '.join(SIZE_SHAPES)} (48 KB records)", "1 and 2 ranks on "
                        "imagenet (150 KB records)"),
}
#: epochs of the probe run that sets each configuration's epochs
PROBE_EPOCHS = 3
#: epochs of each cold run (every epoch starts with empty node caches)
IO_EPOCHS = 2
#: how ``bench read --direct --direct-read-around 128`` reads, in the model's terms: a
#: fault reads its aligned 128 KiB window, a run asked for is one read however long, and
#: every read is waited for (``pread``), one at a time
IO_READS = {"readahead_bytes": 128 << 10, "fs_max_request_bytes": 1 << 40,
            "fs_async_depth": 1}


@dataclass(frozen=True)
class Config:
    """One measured configuration: a database, a strategy, ranks on as many nodes, and
    batches a slot (0: a job's default)."""

    db: str
    strategy: str
    ranks: int
    batches_per_slot: int = 0

    def role(self, split: str) -> str:
        """``fit`` for the runs split ``split`` fits the costs on, ``held-out`` for those
        it checks them on, ``unused`` for the databases of other record sizes outside the
        split that measures them."""
        sized = self.db in SIZE_SHAPES
        if sized and split != "databases+sizes":
            return "unused"
        fits = {"ranks": self.ranks == 1, "databases": self.db in FIT_DBS,
                "ranks+databases": self.ranks == 1 and self.db in FIT_DBS,
                "databases+sizes": self.db in FIT_DBS or sized}[split]
        return "fit" if fits else "held-out"

    def file(self, kind: str, epochs: int, repeat: int = 0) -> str:
        slot = f"-s{self.batches_per_slot}" if self.batches_per_slot else ""
        return f"{kind}-{self.db}-{self.strategy}-r{self.ranks}{slot}-e{epochs}-{repeat}.json"


def time_configs(quick: bool, sizes: bool = False) -> list[Config]:
    """Every database and strategy at 1 rank and 2 ranks (on 2 nodes: cores = 2), a job's
    slot size; the node-level strategies at 1 rank on :data:`FIT_DBS` at each of
    :data:`FIT_SLOT_SIZES` too (fit runs in every split); with ``sizes``, the databases of
    :data:`SIZE_SHAPES` at 1 rank."""
    dbs = ("cifar", "mnist") if quick else ("cifar", "mnist", "imagenet")
    slots = [Config(d, s, 1, k) for d in FIT_DBS for s in NODE_STRATEGIES
             for k in FIT_SLOT_SIZES]
    extra = [Config(d, s, 1) for d in SIZE_SHAPES for s in STRATEGIES] if sizes else []
    return [Config(d, s, r) for d in dbs for r in (1, 2) for s in STRATEGIES] + slots + \
        extra


def batch_of(db: str) -> int:
    """The per-consumer batch of a calibration database."""
    return (SIZE_SHAPES[db] if db in SIZE_SHAPES else bench_read.SHAPES[db])[2]


def databases(data: Path) -> dict[str, Path]:
    """Every calibration database (bench/read.py's and :data:`SIZE_SHAPES`), generated
    where missing."""
    out = {name: bench_read.generate(data, name) for name in bench_read.SHAPES}
    for name, (n, size, _) in SIZE_SHAPES.items():
        out[name] = random_db(data / f"read-{name}", n, size, seed=3, map_size=1 << 32)
    return out


def run_bench(out: Path, ranks: int, db: Path, strategy: str, *extra: str,
              tries: int = 3) -> dict | None:
    """One bench read run (bench/read.py's runner: kept in ``out``, reused if there),
    kept without the delivered record ids (megabytes over many epochs). A run that fails
    or hangs (a rank dead at import leaves ``mpiexec`` waiting) is tried again after a
    pause, ``tries`` times in all: other work edits this checkout while it runs."""
    got = None
    for attempt in range(tries):
        try:
            got = bench_read.bench(out, ranks, str(db), strategy, *extra, timeout=180)
        except subprocess.TimeoutExpired:
            print(f"TIMED OUT: {out.name}", flush=True)
        if got is not None or attempt == tries - 1:
            break
        time.sleep(20)
    if got is not None and any("records" in p for p in got["per_rank"]):
        for p in got["per_rank"]:
            p.pop("records", None)
            p.pop("padding", None)
        write_json(out, got)
    return got


def timed_run(res: Path, dbs: dict[str, Path], cfg: Config, per_epoch: int, epochs: int,
              kind: str, repeat: int = 0) -> dict | None:
    """``cfg`` for ``epochs`` whole epochs of ``per_epoch`` iterations, warm."""
    batch = batch_of(cfg.db)
    return run_bench(res / cfg.file(kind, epochs, repeat), cfg.ranks, dbs[cfg.db],
                     cfg.strategy, "--batch-size", str(batch), "--iters",
                     str(per_epoch * epochs), "--simulate-nodes", str(cfg.ranks),
                     "--batches-per-slot", str(cfg.batches_per_slot), "--transfer", "spans")


def epoch_traces(dbs: dict[str, Path], cfgs: list[Config], cache: Path | None = None
                 ) -> dict[Config, Trace]:
    """One traced epoch per configuration (its slot size, as measured), kept in ``cache``
    when given (:func:`~lmdbio.scale.trace.cached_trace`)."""
    return {c: cached_trace(cache, dbs[c.db], c.strategy, c.ranks, c.ranks, batch_of(c.db),
                            batches_per_slot=c.batches_per_slot)
            for c in cfgs}


def choose_epochs(res: Path, dbs: dict[str, Path], cfgs: list[Config],
                  traces: dict[Config, Trace], target: float) -> dict[Config, int]:
    """Per configuration, the whole epochs that take ``target`` seconds of loop, from a
    probe run of :data:`PROBE_EPOCHS` epochs (its first epoch's warm-up included, so the
    measured runs are at least about ``target``)."""
    out = {}
    for c in cfgs:
        got = timed_run(res, dbs, c, traces[c].epoch_iterations, PROBE_EPOCHS, "probe")
        if got is None:
            continue
        per_epoch = got["totals"]["loop_seconds"] / PROBE_EPOCHS
        out[c] = max(1, min(400, math.ceil(target / max(per_epoch, 1e-6))))
    return out


def measure(res: Path, dbs: dict[str, Path], cfgs: list[Config],
            traces: dict[Config, Trace], epochs: dict[Config, int],
            repeats: int) -> tuple[dict[Config, list[dict]], list[dict]]:
    """``repeats`` runs of every configuration, interleaved: each pass runs every
    configuration once, so slow drifts of the host's load spread over all of them. Also
    returns, per pass, when it started and ended, the host's load averages then, and
    which configurations it ran (``ran``) or found run before (``reused``: their files
    were there, from an earlier session whose passes are not these)."""
    runs: dict[Config, list[dict]] = {c: [] for c in epochs}
    passes = []
    for k in range(repeats):
        load = os.getloadavg()
        print(f"pass {k + 1}/{repeats}: load average {load}", flush=True)
        started = time.strftime("%H:%M:%S", time.gmtime())
        ran: list[str] = []
        reused: list[str] = []
        for c in epochs:
            kept = (res / c.file("time", epochs[c], k)).exists()
            got = timed_run(res, dbs, c, traces[c].epoch_iterations, epochs[c], "time", k)
            if got is not None:
                runs[c].append(got)
                (reused if kept else ran).append(f"{c.db} {c.strategy} r{c.ranks}")
        passes.append({"pass": k + 1, "started_utc": started, "loadavg_before": load,
                       "ended_utc": time.strftime("%H:%M:%S", time.gmtime()),
                       "loadavg_after": os.getloadavg(), "ran": ran, "reused": reused})
    return runs, passes


def corun(res: Path, dbs: dict[str, Path], traces: dict[Config, Trace],
          epochs: dict[Config, int], alone: dict[Config, float]) -> dict[str, Any]:
    """Each 1-rank configuration of ``epochs`` run twice at the same time (two independent
    jobs: one per core of this 2-core host, no MPI between them): the CPU seconds of each
    against ``alone`` (the configuration's median loop CPU seconds, run by itself). The
    median ratio over the configurations is the host's ``cpu_contention_factor``: what
    sharing caches and memory bandwidth with a busy neighbour core costs, measured
    without the 2-rank runs the model is checked against."""
    rows = []
    for c in [c for c in epochs if c.ranks == 1 and c in alone and c.db not in SIZE_SHAPES
              and not c.batches_per_slot]:
        per_epoch = traces[c].epoch_iterations
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda k, c=c, n=per_epoch: timed_run(
                res, dbs, c, n, epochs[c], "corun", k), (0, 1)))
        both = [g for g in got if g is not None]
        if len(both) < 2:
            continue
        cpus = [g["per_rank"][0]["cpu_seconds"]["loop"] for g in both]
        rows.append({"db": c.db, "strategy": c.strategy, "epochs": epochs[c],
                     "alone_cpu_s": alone[c], "corun_cpu_s": cpus,
                     "factor": statistics.mean(cpus) / alone[c],
                     "loadavg": [g.get("loadavg") for g in both]})
    factor = statistics.median(r["factor"] for r in rows) if rows else 1.0
    print(f"contention: CPU x {factor:.3f} with both cores busy (median of {len(rows)} "
          "configurations run twice at once)", flush=True)
    return {"factor": factor, "configs": rows}


def measured(runs: list[dict]) -> dict[str, Any]:
    """The medians of a configuration's repeats and their spread ((max - min) / median):
    loop wall seconds, each rank's loop CPU seconds, records delivered."""
    walls = [r["totals"]["loop_seconds"] for r in runs]
    fastest = walls.index(min(walls))
    cpus = [{p["rank"]: p["cpu_seconds"]["loop"] for p in r["per_rank"]} for r in runs]
    ranks = sorted(cpus[0])
    cpu = {k: statistics.median(c[k] for c in cpus) for k in ranks}
    cpu_sums = [sum(c.values()) for c in cpus]
    wall = statistics.median(walls)
    waits = [max(p["seconds"]["wait_cursor"] for p in r["per_rank"]) for r in runs]
    return {"repeats": len(runs), "loop_s": wall, "loop_all_s": walls,
            "loop_best_s": walls[fastest],
            "core_share_best": sum(cpus[fastest].values()) / len(cpus[fastest])
            / walls[fastest],
            # how much of a core each rank had over the loop: 1 = never runnable and
            # waiting for a core; less = waiting (for a core, a cursor, a slot)
            "core_share": statistics.median(s / len(cpus[0]) / w
                                            for s, w in zip(cpu_sums, walls, strict=True)),
            "cursor_wait_s": statistics.median(waits),
            "loop_spread": (max(walls) - min(walls)) / wall,
            "cpu_s_per_rank": [cpu[k] for k in ranks], "cpu_sum_all_s": cpu_sums,
            "cpu_spread": (max(cpu_sums) - min(cpu_sums)) / statistics.median(cpu_sums),
            "records": runs[0]["totals"]["records_delivered"],
            "batches_per_slot": runs[0]["batches_per_slot"],
            "loadavg": [r.get("loadavg") for r in runs]}


def cpu_features(tr: Trace) -> np.ndarray:
    """Per actor (rows), its CPU seconds with each fitted cost (columns) at 1 and the
    others 0: the model's CPU is linear in these costs."""
    base = Costs(mpi_latency_s=0.0)
    return np.stack([actor_cpu_seconds(tr, base.replace(**{f: 1.0})) for f in FITTED],
                    axis=1)


def fit_costs(rows: list[dict], traces: dict[Config, Trace], split: str,
              measured_apart: Costs | None = None) -> Costs:
    """Non-negative least squares of the fit set's CPU seconds per rank on the model's
    (times the run's contention factor), each run weighted by 1 / its seconds (relative
    errors count). ``measured_apart``: CPU costs measured by a probe of their own, not
    fitted (the page accounting's per file page): the CPU they give each rank is taken
    off before the fit, and they stay in the costs returned."""
    from scipy.optimize import nnls

    base = measured_apart or Costs(mpi_latency_s=0.0)
    a, b = [], []
    for row in rows:
        if row["config"].role(split) != "fit":
            continue
        tr = traces[row["config"]]
        scale = row["epochs"] * row["cpu_contention_factor"]
        feats = cpu_features(tr) * scale
        known = actor_cpu_seconds(tr, base) * scale
        for actor, cpu in zip(tr.actors, row["cpu_s_per_rank"], strict=True):
            a.append(feats[actor.index] / cpu)
            b.append(1.0 - known[actor.index] / cpu)
    coef, _ = nnls(np.array(a), np.array(b))
    return base.replace(**dict(zip(FITTED, map(float, coef), strict=True)))


def evaluate(row: dict, tr: Trace, costs: Costs) -> dict[str, Any]:
    """The model's CPU seconds per rank and loop seconds for ``row``'s epochs under
    ``costs``, and the errors: CPU (summed over ranks) and throughput (records per loop
    second; + means the model is faster than measured), against the median repeat and
    (``throughput_best``) the fastest one."""
    e = row["epochs"]
    costs = costs.replace(cpu_contention_factor=row["cpu_contention_factor"])
    by_rank = {a.rank: v for a, v in zip(tr.actors, actor_cpu_seconds(tr, costs), strict=True)}
    cpu = [by_rank[k] * e for k in sorted(by_rank)]
    loop = epoch_time(tr, costs).extra["traced_seconds"] * e
    return {"model_cpu_s_per_rank": cpu, "model_loop_s": loop,
            "cpu_error": sum(cpu) / sum(row["cpu_s_per_rank"]) - 1,
            "throughput_error": row["loop_s"] / loop - 1,
            "throughput_best_error": row["loop_best_s"] / loop - 1}


def error_summary(rows: list[dict]) -> dict[str, Any]:
    """Median and max absolute error of throughput and CPU per role, and per strategy
    within each role."""
    out: dict[str, Any] = {}
    for role in ("fit", "held-out"):
        mine = [r for r in rows if r["role"] == role]
        groups = {"all": mine, **{s: [r for r in mine if r["strategy"] == s]
                                  for s in STRATEGIES}}
        out[role] = {name: {"runs": len(g), **{f"{k}_{stat}": fn(abs(r[f"{k}_error"])
                                                                   for r in g)
                                              for k in ("throughput", "throughput_best",
                                                        "cpu")
                                              for stat, fn in (("median", statistics.median),
                                                               ("max", max))}}
                     for name, g in groups.items() if g}
    return out


def held_out_somewhere(cfg: Config) -> bool:
    """Whether some split holds ``cfg`` out (every configuration but the 1-rank runs of
    the fit databases and the databases measured for one split only)."""
    return any(cfg.role(split) == "held-out" for split in SPLITS)


def fit(res: Path, dbs: dict[str, Path], args: argparse.Namespace,
        measured_apart: Costs | None = None) -> dict:
    """Measure (probe, interleaved repeats), then per split fit on its fit set and
    evaluate every run (``measured_apart``: see :func:`fit_costs`). With
    ``args.rerun_held_out`` (a folder), the configurations some split holds out are
    measured again there, ``args.rerun_repeats`` interleaved repeats each with the epochs
    of their probe runs in ``res``, and their rows are those runs (the other rows, the
    contention factor and the ping-pong stay ``res``'s)."""
    cfgs = time_configs(args.quick, sizes=True)
    traces = epoch_traces(dbs, cfgs, Path(args.trace_cache) if args.trace_cache else None)
    epochs = choose_epochs(res, dbs, cfgs, traces, args.target)
    runs, passes = measure(res, dbs, cfgs, traces, epochs, args.repeats)
    stats = {c: measured(got) for c, got in runs.items() if got}
    contention = corun(res, dbs, traces, epochs,
                       {c: m["cpu_s_per_rank"][0] for c, m in stats.items() if c.ranks == 1})
    rerun: dict[str, Any] = {}
    if args.rerun_held_out:
        folder = Path(args.rerun_held_out)
        folder.mkdir(parents=True, exist_ok=True)
        again = {c: e for c, e in epochs.items() if held_out_somewhere(c)}
        got_again, rerun_passes = measure(folder, dbs, list(again), traces, again,
                                          args.rerun_repeats)
        stats.update({c: measured(got) for c, got in got_again.items() if got})
        rerun = {"folder": str(folder), "repeats": args.rerun_repeats,
                 "passes": rerun_passes, "configs": len(again)}
    # the cursor wait the measured runs had (kept from their session: re-evaluating them
    # must not take a later policy's figures)
    pingpong = pingpong_run(res / "pingpong.json", ["chain", "blocking"])
    cores = os.cpu_count() or 1
    rows = [{"config": c, "db": c.db, "strategy": c.strategy, "ranks": c.ranks,
             "nodes": c.ranks, "slot_asked": c.batches_per_slot, "epochs": epochs[c],
             "iterations": epochs[c] * traces[c].epoch_iterations,
             "model_batches_per_slot": traces[c].batches_per_slot,
             # a rank on every core of the host: the neighbours' contention applies
             "cpu_contention_factor": contention["factor"] if c.ranks >= cores else 1.0,
             **m}
            for c, m in stats.items()]
    splits = {}
    for split, (fits, held) in SPLITS.items():
        costs = fit_costs(rows, traces, split, measured_apart).replace(
            **pingpong["model_costs"])
        models = [{"db": r["db"], "strategy": r["strategy"], "ranks": r["ranks"],
                   "slot_asked": r["slot_asked"], "role": r["config"].role(split),
                   **evaluate(r, traces[r["config"]], costs)} for r in rows]
        splits[split] = {"fit": fits, "held-out": held, "costs": dataclasses.asdict(costs),
                         "models": models, "errors": error_summary(models)}
    for r in rows:
        r.pop("config")
    return {"fitted": list(FITTED), "target_loop_s": args.target, "passes": passes,
            "rerun_held_out": rerun,
            "measured_apart": {k: v for k, v in dataclasses.asdict(
                measured_apart or Costs()).items() if k in MEASURED_APART},
            "contention": contention, "pingpong": pingpong, "runs": rows,
            "splits": splits}


def cold_run(res: Path, dbs: dict[str, Path], cfg: Config, per_epoch: int) -> dict | None:
    """``cfg`` for :data:`IO_EPOCHS` epochs from storage (``--direct``, 128 KiB
    read-around on faults)."""
    batch = bench_read.SHAPES[cfg.db][2]
    return run_bench(res / cfg.file("cold", IO_EPOCHS), cfg.ranks, dbs[cfg.db],
                     cfg.strategy, "--batch-size", str(batch), "--iters",
                     str(per_epoch * IO_EPOCHS), "--simulate-nodes", str(cfg.ranks),
                     "--batches-per-slot", "0", "--transfer", "spans", "--direct",
                     "--direct-read-around", "128")


def fit_io(rows: list[dict]) -> dict[str, float]:
    """``fs_latency_s`` and ``fs_node_bandwidth_bps`` by non-negative least squares of
    the 1-rank runs' I/O seconds on their reads and bytes (each run weighted by 1 / its
    seconds)."""
    from scipy.optimize import nnls

    a, b = [], []
    for r in rows:
        if r["ranks"] != 1:
            continue
        for reads, nbytes, secs in zip(r["reads"], r["bytes"], r["io_s"], strict=True):
            if secs > 0:
                a.append([reads / secs, nbytes / secs])
                b.append(1.0)
    (lat, per_byte), _ = nnls(np.array(a), np.array(b))
    return {"fs_latency_s": float(lat),
            "fs_node_bandwidth_bps": float(1 / per_byte) if per_byte > 0 else float("inf")}


def io(res: Path, dbs: dict[str, Path], args: argparse.Namespace, cpu: Costs,
       contention: float) -> dict:
    """The cold runs (see the module docstring), the fitted I/O costs and, per run, the
    model against them (``cpu``: the fitted CPU costs; ``contention``: the host's factor,
    for the runs with a rank on every core)."""
    cfgs = [c for c in time_configs(args.quick) if not c.batches_per_slot]
    traces = epoch_traces(dbs, cfgs, Path(args.trace_cache) if args.trace_cache else None)
    print(f"cold runs: load average {os.getloadavg()}", flush=True)
    rows = []
    for c in cfgs:
        got = cold_run(res, dbs, c, traces[c].epoch_iterations)
        if got is None or any(p.get("direct_io") is None for p in got["per_rank"]):
            continue
        per = sorted(got["per_rank"], key=lambda p: p["rank"])
        rows.append({"config": c, "db": c.db, "strategy": c.strategy, "ranks": c.ranks,
                     "epochs": IO_EPOCHS, "loop_s": got["totals"]["loop_seconds"],
                     "reads": [p["direct_io"]["reads"] for p in per],
                     "bytes": [p["direct_io"]["bytes"] for p in per],
                     "io_s": [p["direct_io"]["seconds"] for p in per],
                     "cpu_s": [p["cpu_seconds"]["loop"] for p in per],
                     "loadavg": got.get("loadavg")})
    fitted = fit_io(rows)
    costs = cpu.replace(**IO_READS, **fitted)
    cores = os.cpu_count() or 1
    for r in rows:
        tr = traces[r.pop("config")]
        run_costs = costs if r["ranks"] < cores else \
            costs.replace(cpu_contention_factor=contention)
        m = epoch_time(tr, run_costs)
        steps = step_costs(tr, run_costs)[0]
        io_s = np.zeros(len(tr.actors))
        for st, sc in zip(tr.steps, steps, strict=True):
            io_s[st.actor] += sc.io_sync + sc.chain_io + sc.io_async
        e = r["epochs"]
        requests = (m.requests["sync"] + m.requests["async"]) * e
        nbytes = sum(m.node_fs_bytes) * e
        r.update({"model_requests": requests, "model_bytes": nbytes,
                  "model_io_s": [float(v) * e for v in io_s],
                  "model_loop_s": m.seconds * e,
                  "requests_error": requests / max(sum(r["reads"]), 1) - 1,
                  "bytes_error": nbytes / max(sum(r["bytes"]), 1) - 1,
                  "io_error": float(io_s.sum()) * e / max(sum(r["io_s"]), 1e-9) - 1,
                  "throughput_error": r["loop_s"] / (m.seconds * e) - 1})
    summary = {}
    for role, mine in (("fit", [r for r in rows if r["ranks"] == 1]),
                       ("held-out", [r for r in rows if r["ranks"] != 1])):
        summary[role] = {k: {"median": statistics.median(abs(r[f"{k}_error"]) for r in mine),
                             "max": max(abs(r[f"{k}_error"]) for r in mine)}
                         for k in ("requests", "bytes", "io", "throughput") if mine}
    for role, errs in summary.items():
        print(f"  cold {role:9s} " + "  ".join(f"{k} median {v['median']:6.1%} max "
                                              f"{v['max']:6.1%}" for k, v in errs.items()),
              flush=True)
    print(f"  fitted: {fitted}", flush=True)
    return {"epochs": IO_EPOCHS, "reads_as": IO_READS, "fitted": fitted, "runs": rows,
            "errors": summary}


def copy_probe(dbs: dict[str, tuple[Path, int]], passes: int = 5) -> dict[str, Any]:
    """The consumer's copy alone, per database (name -> (path, batch)): every record's
    value copied ``batch`` at a time into one reused buffer, the overflow headers checked
    in the same pass (:func:`~lmdbio.io.gather.copy_spans_by_batch`, the kernel ``bench
    read``'s consumers run), in key order over a warm page cache; one pass first (it maps
    the pages: page-table work a long run pays once), then ``passes`` timed passes, CPU
    seconds (``process_time``), the fastest kept. Per database: seconds per byte and per
    record, and the page accounting's CPU per page of the file per read
    (:func:`account_probe`). Measurements apart from the fit: what the copy costs by
    record size, and the accounting the fit then takes as known."""
    from lmdbio.io.gather import copy_spans_by_batch
    from lmdbio.lmdb.database import Database

    out: dict[str, Any] = {"loadavg_before": os.getloadavg(), "passes": passes,
                           "started_utc": time.strftime("%H:%M:%S", time.gmtime())}
    for name, (path, batch) in dbs.items():
        db = Database(path)
        table = db.record_table()
        starts = np.ascontiguousarray(table.val_off, np.int64)
        lengths = np.ascontiguousarray(table.val_len, np.int64)
        buf = np.empty(int(lengths.max()) * batch, np.uint8)
        copied = copy_spans_by_batch(db, starts, lengths, batch, buf, check=True)
        cpu = []
        for _ in range(passes):
            t0 = time.process_time()
            copy_spans_by_batch(db, starts, lengths, batch, buf, check=True)
            cpu.append(time.process_time() - t0)
        best = min(cpu)
        out[name] = {"records": int(lengths.size), "record_bytes": float(lengths.mean()),
                     "batch": batch, "bytes": copied, "cpu_s": cpu,
                     "s_per_byte": best / copied, "s_per_record": best / lengths.size}
        db.close()
        out[name]["account_s_per_file_page"] = account_probe(path)
        print(f"copy {name:15s} {lengths.mean():9.0f} B  {best / copied * 1e9:6.3f} ns/B  "
              f"{best / lengths.size * 1e6:7.2f} us/record; page accounting "
              f"{out[name]['account_s_per_file_page'] * 1e9:.2f} ns per file page per read",
              flush=True)
    out["loadavg_after"] = os.getloadavg()
    return out


def account_probe(path: Path, reads: int = 200) -> float:
    """CPU seconds per page of the file of one read's page accounting, as ``bench
    read``'s reader does it at every read (:meth:`lmdbio.reader.ReadSession.read_group`:
    the touched-page bitmap cleared, then ``account_records`` over a read of 8 records,
    which scans the bitmaps of the whole file): the fastest of 3 rounds of ``reads``."""
    from lmdbio.kernel_cache import kernel_module
    from lmdbio.lmdb.database import Database

    account_records = kernel_module("lmdbio.lmdb").account_records
    db = Database(path)
    table = db.record_table()
    n = db.file_size // db.psize
    touched, own, total_touched, total_own = (np.zeros(n, np.uint8) for _ in range(4))
    args = (np.ascontiguousarray(table.leaf_pg[:8]), np.ascontiguousarray(table.val_off[:8]),
            np.ascontiguousarray(table.val_len[:8]), db.psize)
    account_records(touched, own, total_touched, total_own, *args)
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(reads):
            touched[:] = 0
            account_records(touched, own, total_touched, total_own, *args)
        best = min(best, (time.process_time() - t0) / reads)
    db.close()
    return best / n


def pages(res: Path, dbs: dict[str, Path], quick: bool) -> list[dict]:
    rows = []
    plan = [("cifar", "1", (1, 2, 4) if quick else (1, 2, 4, 8)), ("imagenet", "1", (2,))]
    for name, slot, counts in plan:
        batch = bench_read.SHAPES[name][2]
        for r in counts:
            nodes = max(1, r // 2)
            iters = 12 if quick else 40
            for s in STRATEGIES:
                got = run_bench(res / f"pages-{name}-{s}-r{r}-s{slot}.json", r, dbs[name],
                                s, "--batch-size", str(batch), "--iters", str(iters),
                                "--simulate-nodes", str(nodes), "--batches-per-slot",
                                slot, "--transfer", "spans")
                if got is None:
                    continue
                tr = trace(dbs[name], s, r, nodes, batch, iterations=iters,
                           batches_per_slot=int(slot))
                rows.extend(page_rows(got, tr, name, s, r, nodes))
    return rows


def page_rows(got: dict, tr: Trace, name: str, s: str, r: int, nodes: int) -> list[dict]:
    """Per reading rank of one run, its measured pages against the trace's."""
    model = {p["rank"]: p for p in tr.page_totals()}
    rows = []
    for m in got["per_rank"]:
        if not m["reader"]:
            continue
        p = model.get(m["rank"])
        row = {"db": name, "strategy": s, "ranks": r, "nodes": nodes,
               "batches_per_slot": got["batches_per_slot"],
               "model_batches_per_slot": tr.batches_per_slot, "rank": m["rank"]}
        for k in ("pages_touched", "own_pages", "extra_pages"):
            row[f"measured_{k}"] = m[k]
            row[f"model_{k}"] = p[k] if p else None
        t, mt = row["measured_pages_touched"], row["model_pages_touched"] or 0
        e, me = row["measured_extra_pages"], row["model_extra_pages"] or 0
        row["touched_error"] = abs(mt - t) / max(t, 1)
        row["extra_error"] = abs(me - e) / max(e, 1)
        rows.append(row)
    return rows


def print_errors(f: dict) -> None:
    for split, got in f["splits"].items():
        print(f"split {split}: fit on {got['fit']}; held out {got['held-out']}")
        for role, groups in got["errors"].items():
            for name, g in groups.items():
                print(f"  {role:9s} {name:13s} runs {g['runs']:2d}  throughput median "
                      f"{g['throughput_median']:6.1%} max {g['throughput_max']:6.1%} "
                      f"(fastest repeat: {g['throughput_best_median']:6.1%}, "
                      f"{g['throughput_best_max']:6.1%})   CPU median {g['cpu_median']:6.1%} "
                      f"max {g['cpu_max']:6.1%}", flush=True)


def write_fitted(res: Path, f: dict) -> None:
    """The first split's fitted CPU costs, for bench/scale_project.py."""
    import yaml

    split = next(iter(SPLITS))
    costs = f["splits"][split]["costs"]
    (res / "fitted-costs.yaml").write_text(yaml.safe_dump(
        {"source": "bench/scale_calibrate.py: NNLS on the loop CPU seconds per rank of "
                   f"warm bench read runs, {SPLITS[split][0]}, medians of up to "
                   f"{max(r['repeats'] for r in f['runs'])} interleaved repeats",
         # this host's, not a cluster's: kept beside the costs, not in them
         "host_mpi_latency_s": costs["mpi_latency_s"],
         "host_poll_overshoot_s": costs["poll_overshoot_s"],
         "host_cpu_contention_factor": f["contention"]["factor"],
         # bench read's page accounting (a training job does not count pages)
         "host_cpu_account_s_per_file_page": costs["cpu_account_s_per_file_page"],
         # the fitted costs, and the ring's per slot (measured apart: a job has a ring)
         "costs": {k: costs[k] for k in (*FITTED, "handoff_s_per_slot")}},
        sort_keys=False))


def measured_apart_costs(result: dict, dbs: dict[str, Path]) -> Costs | None:
    """The CPU costs of :data:`MEASURED_APART` from the probes in ``result`` (the page
    accounting: the median over the calibration databases of ``copy``; the ring's per
    slot: ``ring``), None when neither probe ran."""
    probed, ring = result.get("copy", {}), result.get("ring", {})
    if not probed and not ring:
        return None
    known: dict[str, float] = {}
    if probed:
        known["cpu_account_s_per_file_page"] = float(np.median(
            [probed[d]["account_s_per_file_page"] for d in dbs if d in probed]))
    if ring:
        known["handoff_s_per_slot"] = float(ring["handoff_s_per_slot"])
    return Costs(mpi_latency_s=0.0).replace(**known)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="pages,fit")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", type=float, default=1.5,
                        help="seconds of loop each measured run should reach")
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--out", default=str(RESULTS / "scale"))
    parser.add_argument("--trace-cache", default=None,
                        help="folder keeping the traces of the measured configurations")
    parser.add_argument("--rerun-held-out", default=None, metavar="DIR",
                        help="fit: measure the configurations some split holds out again "
                             "into DIR (their rows are then those runs), kept as fit_rerun "
                             "beside the fit (fitted-costs.yaml stays the fit's)")
    parser.add_argument("--rerun-repeats", type=int, default=5,
                        help="interleaved repeats of each configuration rerun")
    args = parser.parse_args()
    res = Path(args.out)
    (res / "runs").mkdir(parents=True, exist_ok=True)
    dbs = databases(Path(args.data))
    out_file = res / "calibration.json"
    result = json.loads(out_file.read_text()) if out_file.exists() else {}
    only = set(args.only.split(","))
    if "copy" in only:  # first: the fit takes the accounting it measures as known
        from bench import scale_project

        probe_dbs = {name: (path, batch_of(name)) for name, path in dbs.items()}
        for name in scale_project.SHAPES:  # the projection's, at its 512-rank batch
            probe_dbs[f"scale-{name}"] = (scale_project.generate(Path(args.data), name),
                                          scale_project.GLOBAL_BATCH // 512)
        result["copy"] = copy_probe(probe_dbs)
        write_json(out_file, result, default=float)
    if "ring" in only:  # before the fit too: it takes the ring's per-slot cost as known
        from bench import ring_handoff

        probe = ring_handoff.run(res / "ring-handoff.json", list(ring_handoff.DATABASES),
                                 Path(args.data))
        result["ring"] = {"file": "ring-handoff.json",
                          "handoff_s_per_slot": ring_handoff.handoff_s_per_slot(probe),
                          **{k: v["fit"] for k, v in probe.items()
                             if isinstance(v, dict) and "fit" in v}}
        write_json(out_file, result, default=float)
    if "fit" in only:
        # a rerun of the held-out configurations is kept beside the fit, not instead of it
        key = "fit_rerun" if args.rerun_held_out else "fit"
        result[key] = fit(res / "runs", dbs, args, measured_apart_costs(result, dbs))
        print_errors(result[key])
        if key == "fit":
            write_fitted(res, result["fit"])
        write_json(out_file, result, default=float)
    if "io" in only:
        fitted = result.get("fit", {}).get("splits", {}).get(next(iter(SPLITS)), {})
        cpu = Costs(mpi_latency_s=0.0).replace(**{
            k: v for k, v in fitted.get("costs", {}).items() if not k.startswith("fs_")})
        factor = result.get("fit", {}).get("contention", {}).get("factor", 1.0)
        result["io"] = io(res / "runs", dbs, args, cpu, factor)
        write_json(out_file, result, default=float)
    if "pages" in only:
        rows = pages(res, dbs, args.quick)
        result["pages"] = {
            "rows": rows,
            "touched_error_max": max((r["touched_error"] for r in rows), default=None),
            "extra_error_max": max((r["extra_error"] for r in rows), default=None),
            "runs": len({(r["db"], r["strategy"], r["ranks"], r["batches_per_slot"])
                         for r in rows})}
        print(f"pages: {result['pages']['runs']} runs, max error touched "
              f"{result['pages']['touched_error_max']:.3%}, extra "
              f"{result['pages']['extra_error_max']:.3%}", flush=True)
    write_json(out_file, result, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
