"""Calibrate and check the scaling model (lmdbio.scale) against ``lmdbio bench read``.

Databases: bench/read.py's generators (build/bench-data/read-{cifar,imagenet,mnist}:
20,000 x 3,072 B, 1,600 x 150 KB, 60,000 x 784 B, py-lmdb, 1,000 records a commit).

Stages (``--only fit,pages``; the fit runs first):
  pages  every strategy at 1, 2, 4, 8 ranks on max(1, R/2) simulated nodes (oversubscribed
         on this host: page counts only, never speed), one batch per slot (the paper's
         regime) on cifar, and imagenet at 2 ranks: the model's pages per rank (touched,
         own, extra) against bench read's, per run and rank.
  fit    warm runs (every page in the page cache: the file system costs nothing here) of
         every strategy and database at 1 rank, the fit set, and at 2 ranks on 2 nodes,
         held out: the CPU and hand-off costs fitted by non-negative
         least squares on the 1-rank runs' loop seconds, then the model's error on the
         2-rank runs (rank counts not in the fit). One run each (the host is shared: noisy).

Output: bench/results/scale/calibration.json (and one JSON per bench read run), and
bench/results/scale/fitted-costs.yaml.

Run: .venv/bin/python -m bench.scale_calibrate [--only pages,fit] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from bench import read as bench_read
from bench.common import BENCH_DATA, RESULTS, write_json
from lmdbio.plan.strategies import STRATEGIES as _REGISTERED
from lmdbio.scale import Costs, epoch_time, trace

STRATEGIES = bench_read.STRATEGIES
#: the costs fitted (the file system's are 0 on a warm page cache)
FITTED = ("cpu_walk_s", "cpu_skip_s", "cpu_locate_s", "cpu_page_s", "cpu_step_s",
          "copy_s_per_byte", "handoff_s_per_slot")


def run_bench(out: Path, ranks: int, db: Path, strategy: str, *extra: str) -> dict | None:
    """One bench read run (bench/read.py's runner: kept in ``out``, reused if there)."""
    args = list(extra)
    return bench_read.bench(out, ranks, str(db), strategy, *args)


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
                model = {p["rank"]: p for p in tr.page_totals()}
                for m in got["per_rank"]:
                    if not m["reader"]:
                        continue
                    p = model.get(m["rank"])
                    row = {"db": name, "strategy": s, "ranks": r, "nodes": nodes,
                           "batches_per_slot": got["batches_per_slot"],
                           "model_batches_per_slot": tr.batches_per_slot,
                           "rank": m["rank"]}
                    for k in ("pages_touched", "own_pages", "extra_pages"):
                        row[f"measured_{k}"] = m[k]
                        row[f"model_{k}"] = p[k] if p else None
                    rows.append(row)
    for row in rows:
        t, mt = row["measured_pages_touched"], row["model_pages_touched"] or 0
        e, me = row["measured_extra_pages"], row["model_extra_pages"] or 0
        row["touched_error"] = abs(mt - t) / max(t, 1)
        row["extra_error"] = abs(me - e) / max(e, 1)
    return rows


def _features(tr) -> list[float]:
    """The model's seconds of ``tr`` with each fitted cost at 1 and the others 0: on one
    rank everything is on one path, so the time is linear in the costs."""
    base = Costs(mpi_latency_s=0.0)
    out = []
    for f in FITTED:
        r = epoch_time(tr, base.replace(**{f: 1.0}))
        out.append(r.extra["traced_seconds"])
    return out


def fit(res: Path, dbs: dict[str, Path], quick: bool) -> dict:
    import numpy as np
    from scipy.optimize import nnls

    repeats = 1
    configs = [(1, 1, "fit"), (2, 2, "held-out")]
    runs = []
    for name in ("cifar", "mnist", "imagenet"):
        batch = bench_read.SHAPES[name][2]
        for ranks, nodes, role in configs:
            iters = {"cifar": 200, "imagenet": 100, "mnist": 200}[name] // (2 if quick else 1)
            for s in STRATEGIES:
                loops = []
                for k in range(repeats):
                    got = run_bench(res / f"fit-{name}-{s}-r{ranks}-n{nodes}-{k}.json", ranks,
                                    dbs[name], s, "--batch-size", str(batch), "--iters",
                                    str(iters), "--simulate-nodes", str(nodes),
                                    "--batches-per-slot", "0", "--transfer", "spans")
                    if got is not None:
                        loops.append(got["totals"]["loop_seconds"])
                        per_slot = got["batches_per_slot"]
                if not loops:
                    continue
                tr = trace(dbs[name], s, ranks, nodes, batch, iterations=iters,
                           batches_per_slot=per_slot if ranks > 1 or _REGISTERED[s].shared
                           else 0)
                runs.append({"db": name, "strategy": s, "ranks": ranks, "nodes": nodes,
                             "role": role, "iterations": iters, "measured_loop_s":
                             statistics.median(loops), "measured_all": loops,
                             "features": _features(tr), "trace": tr})
    train = [r for r in runs if r["role"] == "fit"]
    a = np.array([r["features"] for r in train])
    b = np.array([r["measured_loop_s"] for r in train])
    # relative errors matter: weight each run by 1 / its time
    w = 1.0 / b
    coef, _ = nnls(a * w[:, None], b * w)
    costs = Costs(mpi_latency_s=0.0).replace(**dict(zip(FITTED, map(float, coef),
                                                        strict=True)))
    for r in runs:
        model = epoch_time(r.pop("trace"), costs).extra["traced_seconds"]
        r["model_loop_s"] = model
        r["error"] = (model - r["measured_loop_s"]) / r["measured_loop_s"]
        r.pop("features")
    held = [abs(r["error"]) for r in runs if r["role"] == "held-out"]
    fitted = [abs(r["error"]) for r in runs if r["role"] == "fit"]
    return {"costs": dataclasses.asdict(costs), "runs": runs,
            "fit_error_median": statistics.median(fitted) if fitted else None,
            "fit_error_max": max(fitted) if fitted else None,
            "held_out_error_median": statistics.median(held) if held else None,
            "held_out_error_max": max(held) if held else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="pages,fit")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--out", default=str(RESULTS / "scale"))
    args = parser.parse_args()
    res = Path(args.out)
    res.mkdir(parents=True, exist_ok=True)
    dbs = {name: bench_read.generate(Path(args.data), name) for name in bench_read.SHAPES}
    out_file = res / "calibration.json"
    result = json.loads(out_file.read_text()) if out_file.exists() else {}
    only = set(args.only.split(","))
    if "fit" in only:
        result["fit"] = fit(res, dbs, args.quick)
        f = result["fit"]
        print(f"fit: median |error| {f['fit_error_median']:.1%} (max {f['fit_error_max']:.1%})"
              f"; held out (2 ranks): median {f['held_out_error_median']:.1%} (max "
              f"{f['held_out_error_max']:.1%})", flush=True)
        import yaml

        (res / "fitted-costs.yaml").write_text(yaml.safe_dump(
            {"source": "bench/scale_calibrate.py: 1-rank warm bench read runs, NNLS",
             "costs": {k: f["costs"][k] for k in FITTED}}, sort_keys=False))
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
