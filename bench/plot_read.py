"""Figures and a summary table from bench/read.py's results (bench/results/read/*.json).

Writes docs/figures/read-pages-<db>.png (pages per rank and per node versus ranks, every
strategy: the paper's Fig. 10 and what it leaves out), docs/figures/read-estimator-<db>.png
(dm-spec missed and redundant pages per iteration) and docs/figures/read-throughput.png, and
prints the tables docs/reading.md quotes (markdown).
Run: .venv/bin/python -m bench.plot_read [--results bench/results/read]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.common import REPO, RESULTS
from bench.read import STRATEGIES

MARKERS = {s: "osv^Dxp*"[i % 8] for i, s in enumerate(STRATEGIES)}


def load(res: Path, pattern: str) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(res.glob(pattern))}


def readers(d: dict) -> list[dict]:
    return [r for r in d["per_rank"] if r["reader"]]


def pages_figure(res: Path, db: str, figs: Path) -> list[str]:
    runs = load(res, f"pages-{db}-*.json")
    if not runs:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    table: dict[str, dict[int, str]] = {}
    for s in STRATEGIES:
        pts = []
        for d in runs.values():
            if d["strategy"] != s:
                continue
            rd = readers(d)
            t = d["totals"]
            extra = sum(r["extra_pages"] for r in rd) / len(rd)
            touched = sum(r["pages_touched"] for r in rd) / len(rd)
            own = sum(r["own_pages"] for r in rd) / len(rd)
            # I/O if no two ranks shared a page cache, over the pages the job needs
            amp_rank = t["pages_touched"] / max(t["own_pages_union"], 1)
            amp_node = t["node_pages_touched"] / max(t["own_pages_union"], 1)
            pts.append((d["ranks"], d["nodes"], extra, touched, own, amp_rank, amp_node))
        pts.sort()
        if not pts:
            continue
        x = [p[0] for p in pts]
        axes[0].plot(x, [p[2] for p in pts], marker=MARKERS[s], label=s)
        axes[1].plot(x, [p[5] for p in pts], marker=MARKERS[s], label=s)
        axes[2].plot(x, [p[6] for p in pts], marker=MARKERS[s], label=s)
        table[s] = {p[0]: f"{p[2]:.0f} / {p[5]:.2f} / {p[6]:.2f}" for p in pts}
    titles = ["extra pages per reading rank\n(touched, not holding its records)",
              "pages touched, summed over ranks,\nper page the job needs",
              "pages touched per node (union),\nsummed over nodes, per page needed"]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (nodes = ranks / 2)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Pages read per rank and per node, generated {db}-like database "
                 "(one simulated node = a reader and a worker)", fontsize=11)
    fig.tight_layout()
    fig.savefig(figs / f"read-pages-{db}.png", dpi=110)
    plt.close(fig)
    ranks = sorted({r for row in table.values() for r in row})
    rows = ["| strategy | " + " | ".join(f"{r} ranks" for r in ranks) + " |",
            "|---|" + "---|" * len(ranks)]
    rows += [f"| {s} | " + " | ".join(table[s].get(r, "-") for r in ranks) + " |"
             for s in STRATEGIES if s in table]
    return [f"### Pages, {db}", "", "Each cell: extra pages per reading rank / pages touched "
            "summed over ranks per page needed / per node (union) summed over nodes per page "
            "needed.", "", *rows, ""]


def estimator_figure(res: Path, db: str, figs: Path) -> list[str]:
    p = res / f"estimator-{db}.json"
    if not p.exists():
        return []
    d = json.loads(p.read_text())
    its = d["iterations"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    x = [i["iteration"] for i in its]
    ax.plot(x, [i["missed_pages"] for i in its], label="missed value pages", lw=1)
    ax.plot(x, [i["redundant_pages"] for i in its], label="redundant pages", lw=1)
    ax.plot(x, [i["missed_walk_pages"] for i in its], label="walk pages not prefetched",
            lw=1, alpha=0.6)
    ax.set_xlabel("iteration (all epochs; the estimate restarts with each epoch)")
    ax.set_ylabel("pages, summed over readers")
    ax.set_title(f"dm-spec on the generated {db}-like database: {d['readers']} readers, "
                 f"{d['ranks']} ranks, batch {d['batch_size']} per consumer", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(figs / f"read-estimator-{db}.png", dpi=110)
    plt.close(fig)
    plan_iters = _plan_iterations(d)
    after = [i for k, i in enumerate(its) if (k % plan_iters) >= 2] if plan_iters else its[2:]
    needed = sum(i["own_pages"] for i in after)
    miss = sum(i["missed_pages"] for i in after)
    red = sum(i["redundant_pages"] for i in after)
    walk = sum(i["missed_walk_pages"] for i in after)
    early = [(i["missed_pages"], i["redundant_pages"]) for i in its[:4]]
    return [f"### dm-spec estimate, {db}", "",
            f"{len(its)} iterations ({plan_iters} per epoch). "
            f"Iterations 0-3 (missed, redundant): {early}. From the third iteration of "
            f"each epoch on: {miss} missed value pages, {walk} walk pages outside the "
            f"prefetched range, {red} redundant pages for {needed} pages needed "
            f"(redundant = {100 * red / max(needed, 1):.2f} %, missed = "
            f"{100 * miss / max(needed, 1):.2f} %); iterations with a miss: "
            f"{sum(1 for i in after if i['missed_pages'])} of {len(after)}.", ""]


def _plan_iterations(d: dict) -> int:
    from lmdbio.plan.epoch import iterations_per_epoch

    consumers = sum(1 for r in d["per_rank"] if r["worker"])
    return iterations_per_epoch(d["records_in_database"], consumers, d["batch_size"], d["last"])


def throughput_figure(res: Path, figs: Path) -> list[str]:
    runs = load(res, "throughput-*.json")
    if not runs:
        return []
    dbs = [db for db in ("cifar", "mnist", "imagenet")
           if any(k.startswith(f"throughput-{db}-") for k in runs)]
    fig, axes = plt.subplots(1, len(dbs), figsize=(5 * len(dbs), 4.2), squeeze=False)
    rows = ["| db | strategy | cache | steady records/s | steady MB/s | x naive-stride | "
            "/ sequential read | py-lmdb records/s, same pattern | resident pages / needed |",
            "|---|---|---|---|---|---|---|---|---|"]
    for ax, db in zip(axes[0], dbs, strict=True):
        for k, cache in enumerate(("warm", "cold", "coldrandom")):
            base = runs.get(f"throughput-{db}-naive-stride-{cache}")
            base_rps = base["totals"]["steady"]["records_per_second"] if base else None
            vals = []
            for s in STRATEGIES:
                d = runs.get(f"throughput-{db}-{s}-{cache}")
                if d is None:
                    vals.append(0.0)
                    continue
                t = d["totals"]
                rps = t["steady"]["records_per_second"]
                vals.append(rps)
                ratio = f"{rps / base_rps:.2f}" if base_rps else "-"
                seq = t.get("ratio_to_sequential")
                py = t.get("pylmdb_records_per_second")
                res_pages = t.get("resident_pages")
                amp = f"{res_pages / max(t['own_pages_union'], 1):.2f}" \
                    if res_pages is not None else "-"
                rows.append(f"| {db} | {s} | {cache} | {rps:,.0f} | "
                            f"{t['steady']['bytes_per_second'] / 1e6:,.1f} | {ratio} | "
                            f"{seq:.3f} | {'-' if py is None else f'{py:,.0f}'} | {amp} |"
                            .replace("| None |", "| - |"))
            xs = [i + (k - 1) * 0.27 for i in range(len(STRATEGIES))]
            ax.bar(xs, vals, width=0.27, label={"coldrandom": "cold, no read-around"}
                   .get(cache, cache))
        ax.set_xticks(range(len(STRATEGIES)), STRATEGIES, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("records/s delivered (steady state)")
        ax.set_title(f"{db}-like (generated), 8 ranks, 4 simulated nodes", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(figs / "read-throughput.png", dpi=110)
    plt.close(fig)
    return ["### Throughput", "", *rows, ""]


def production_table(res: Path) -> list[str]:
    runs = load(res, "production-*.json")
    if not runs:
        return []
    rows = ["| db | strategy | steady records/s | x naive-stride | py-lmdb records/s, same "
            "pattern | load average before/after |", "|---|---|---|---|---|---|"]
    for db in ("cifar", "mnist"):
        base = runs.get(f"production-{db}-naive-stride")
        base_rps = base["totals"]["steady"]["records_per_second"] if base else None
        for s in STRATEGIES:
            d = runs.get(f"production-{db}-{s}")
            if d is None:
                continue
            t = d["totals"]
            rps = t["steady"]["records_per_second"]
            py = t.get("pylmdb_records_per_second")
            load_avg = d.get("loadavg") or [float("nan")] * 2
            rows.append(f"| {db} | {s} | {rps:,.0f} | "
                        f"{rps / base_rps:.2f} | {'-' if py is None else f'{py:,.0f}'} | "
                        f"{load_avg[0]:.1f} / {load_avg[1]:.1f} |" if base_rps else "")
    return ["### Throughput without page accounting (warm)", "", *rows, ""]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", default=str(RESULTS / "read"))
    parser.add_argument("--figures", default=str(REPO / "docs" / "figures"))
    args = parser.parse_args()
    res, figs = Path(args.results), Path(args.figures)
    figs.mkdir(parents=True, exist_ok=True)
    out: list[str] = []
    for db in ("cifar", "mnist", "imagenet"):
        out += pages_figure(res, db, figs)
    for db in ("cifar", "imagenet"):
        out += estimator_figure(res, db, figs)
    out += throughput_figure(res, figs)
    out += production_table(res)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
