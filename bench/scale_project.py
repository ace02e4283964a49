"""Project every strategy to 16-512 ranks on a Lustre-like file system (lmdbio.scale).

Databases (bench/lmdbgen.py's values, py-lmdb, 1,000 records a commit, as bench/read.py):
  scale-cifar     40,960 records of 3,072 B   (CIFAR10-Large-like: the paper's 3 KB)
  scale-imagenet   8,192 records of 192,000 B (ImageNet-like: the paper's ~192 KB)
The paper's job: global batch 4,096 (4096 / R per rank), 16 ranks per node, R = 16..512;
one batch per read (Caffe and LMDBIO read iteration by iteration). One epoch is traced
(10 and 2 iterations), the costs are lmdbio/scale/lustre.yaml with the fitted CPU costs
(bench/results/scale/fitted-costs.yaml when there), and each uncertain cost is moved to
both ends of its range (``ranges:``), one at a time. Beside each strategy's samples/s, what
it would be if the DM readers blocked in MPI's receive instead of polling for their cursor
(``samples_per_second_blocking_wait``; the same for the strategies without a chain).

The traces are pure functions of the database and the job, so ``--trace-cache DIR``
keeps them (one pickle per database, rank count and strategy) and a later run with other
costs only reruns the model (seconds to minutes instead of the tracing's many minutes).

Output: bench/results/scale/projection.json, docs/figures/scale-*.png.
Run: .venv/bin/python -m bench.scale_project [--ranks 16,32,...] [--dbs cifar,imagenet]
     [--fs FS.yaml] [--trace-cache build/scale-traces]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.common import BENCH_DATA, REPO, RESULTS, write_json
from bench.lmdbgen import random_items
from lmdbio.scale.costs import load_costs, load_ranges
from lmdbio.scale.model import epoch_time
from lmdbio.scale.project import ALL_STRATEGIES, Job, sensitivity, summarize
from lmdbio.scale.trace import Trace, cached_trace

SHAPES = {"cifar": (40_960, 3072), "imagenet": (8_192, 192_000)}
PER_NODE = 16
GLOBAL_BATCH = 4096


def generate(data: Path, name: str) -> Path:
    n, size = SHAPES[name]
    d = data / f"scale-{name}"
    if not (d / "data.mdb").exists():
        d.mkdir(parents=True, exist_ok=True)
        print(f"generating {d}: {n} records of {size} random bytes", flush=True)
        step = 1024  # in pieces: the values of a piece in memory at once
        import lmdb

        env = lmdb.open(str(d), map_size=1 << 34)
        for lo in range(0, n, step):
            items = random_items(min(step, n - lo), size, seed=3 + lo)
            items = [(b"%08d" % (lo + i), v) for i, (_, v) in enumerate(items)]
            for c in range(0, len(items), 1000):
                with env.begin(write=True) as txn:
                    for k, v in items[c:c + 1000]:
                        txn.put(k, v)
        env.close()
    return d


def job_traces(db: Path, job: Job, cache: Path | None) -> dict[str, Trace]:
    """Every strategy's trace of ``job`` on ``db``, kept in ``cache`` when given
    (:func:`~lmdbio.scale.trace.cached_trace`)."""
    return {s: cached_trace(cache, db, s, job.ranks, job.nodes, job.batch,
                            iterations=job.iterations,
                            batches_per_slot=job.batches_per_slot)
            for s in ALL_STRATEGIES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="16,32,64,128,256,512")
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--fs", default=str(REPO / "lmdbio" / "scale" / "lustre.yaml"))
    parser.add_argument("--out", default=str(RESULTS / "scale"))
    parser.add_argument("--dbs", default="cifar,imagenet")
    parser.add_argument("--tables", action="store_true",
                        help="print the tables of OUT/projection.json and stop")
    parser.add_argument("--trace-cache", default=None,
                        help="folder keeping the traces (a rerun with other costs skips "
                             "the tracing)")
    args = parser.parse_args()
    out = Path(args.out)
    if args.tables:
        print(tables(json.loads((out / "projection.json").read_text())))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    costs = load_costs(args.fs)
    fitted = out / "fitted-costs.yaml"
    if fitted.exists():
        costs = load_costs(fitted, costs)
    ranges = load_ranges(args.fs)
    result = {"costs": costs.as_dict(), "ranges": ranges, "fitted_costs": fitted.exists(),
              "runs": []}
    for name in args.dbs.split(","):
        db = generate(Path(args.data), name)
        for r in [int(x) for x in args.ranks.split(",")]:
            t0 = time.perf_counter()
            job = Job(r, max(1, r // PER_NODE), max(1, GLOBAL_BATCH // r), None, 1)
            tr = job_traces(db, job, Path(args.trace_cache) if args.trace_cache else None)
            traced = time.perf_counter() - t0
            res = {s: summarize(epoch_time(t, costs)) for s, t in tr.items()}
            for s, t in tr.items():
                res[s].pop("pages_per_reader")
                # the DM chains if their readers blocked in MPI's receive (no polling)
                res[s]["samples_per_second_blocking_wait"] = epoch_time(
                    t, costs.blocking_cursor_wait()).samples_per_second
            sens = sensitivity(tr, costs, ranges)
            # CPU up to 2x slower (a 2012 core): every CPU cost doubled at once
            slow = costs.replace(cpu_contention_factor=2 * costs.cpu_contention_factor)
            for s, t in tr.items():
                v = epoch_time(t, slow).samples_per_second
                sens[s]["by_cost"]["cpu_x2"] = (v, v)
                sens[s]["low"] = min(sens[s]["low"], v)
            any_t = next(iter(tr.values()))
            result["runs"].append({"db": name, "ranks": r, "nodes": job.nodes,
                                   "batch": job.batch, "records": any_t.n_records,
                                   "iterations": any_t.epoch_iterations,
                                   "strategies": res, "sensitivity": sens})
            print(f"{name} R={r}: {time.perf_counter() - t0:.1f} s (traces {traced:.1f} s)  "
                  + "  ".join(
                f"{s} {res[s]['samples_per_second']:.0f}/s x{res[s]['extra_pages_total']}"
                for s in res), flush=True)
            write_json(out / "projection.json", result, default=float)
    plot(result)
    return 0


def tables(result: dict) -> str:
    """Markdown tables of a projection, one per database: per rank count, each strategy's
    samples/s and extra pages per epoch (all readers), and the DM chains' samples/s if
    their readers blocked in MPI's receive; then dm-spec's lead over LMM and the band of
    dm-spec's samples/s over the cost ranges."""
    out = []
    for name in sorted({r["db"] for r in result["runs"]}):
        runs = [r for r in result["runs"] if r["db"] == name]
        out.append(f"{name}-like: samples/s (extra pages per epoch)\n")
        out.append("| ranks (nodes) | " + " | ".join(ALL_STRATEGIES) +
                   " | dm-serial, dm-spec if blocking | dm-spec / lmm | dm-spec band |")
        out.append("|---" * (len(ALL_STRATEGIES) + 4) + "|")
        for r in runs:
            st, sens = r["strategies"], r["sensitivity"]
            cells = [f"{st[s]['samples_per_second']:,.0f} ({st[s]['extra_pages_total']:,})"
                     for s in ALL_STRATEGIES]
            block = ", ".join(f"{st[s]['samples_per_second_blocking_wait']:,.0f}"
                              for s in ("dm-serial", "dm-spec"))
            lead = st["dm-spec"]["samples_per_second"] / st["lmm"]["samples_per_second"]
            band = f"{sens['dm-spec']['low']:,.0f}-{sens['dm-spec']['high']:,.0f}"
            out.append(f"| {r['ranks']} ({r['nodes']}) | " + " | ".join(cells) +
                       f" | {block} | {lead:.2f}x | {band} |")
        out.append("")
    return "\n".join(out)


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    figs = REPO / "docs" / "figures"
    for name in sorted({r["db"] for r in result["runs"]}):
        runs = [r for r in result["runs"] if r["db"] == name]
        ranks = [r["ranks"] for r in runs]
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for s in ALL_STRATEGIES:
            ax[0].plot(ranks, [r["strategies"][s]["extra_pages_total"] * 4096 / 2**20
                               for r in runs], marker="o", label=s)
            y = [r["sensitivity"][s]["samples_per_second"] for r in runs]
            lo = [r["sensitivity"][s]["low"] for r in runs]
            hi = [r["sensitivity"][s]["high"] for r in runs]
            ax[1].plot(ranks, y, marker="o", label=s)
            ax[1].fill_between(ranks, lo, hi, alpha=0.12)
        ax[0].set(xscale="log", xlabel="ranks (16 per node)",
                  ylabel="extra MiB read per epoch (all readers)",
                  title=f"{name}-like: extra pages (cf. paper Fig. 10)")
        ax[0].set_yscale("symlog", linthresh=1.0)
        ax[0].set_ylim(bottom=0)
        ax[1].set(xscale="log", yscale="log", xlabel="ranks (16 per node)",
                  ylabel="samples/s (band: parameter ranges)",
                  title=f"{name}-like: projected throughput (cf. Fig. 8)")
        for a in ax:
            a.set_xticks(ranks, [str(x) for x in ranks])
            a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            a.grid(alpha=0.3)
        ax[1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(figs / f"scale-{name}.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
