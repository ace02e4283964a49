"""The service figure set: lmdbio end to end against each rank reading its own records.

Databases (generated here, under build/bench-data/; random pixels, not real images, and
said so in the results): Caffe Datum records written with py-lmdb, 1,000 per commit as
Caffe's ``convert_imageset`` does, keys ``%08d``, labels drawn at random.
  cifar     20,000 Datums of 3x32x32 uint8 (3,085 B: one overflow page each)
  imagenet     600 Datums of 3x224x224 uint8 (150,541 B: 37 overflow pages each)

Per database, at 4 ranks on 2 simulated nodes and 8 ranks on 4 simulated nodes, interleaved
``--repeat`` times (so that the load of the machine falls on every variant alike):
  lmdbio dedicated  ``lmdbio run``: one reader per node (``indexed``, global shuffle) feeds
                    the node's other ranks, the workers, through the node's shared ring
  lmdbio dedicated, records copied into the ring (``readers.transfer=copy``; the default,
                    ``auto``, hands Datum and tensor records out as spans of the database
                    file, which workers decode from their own mapping)
  lmdbio dedicated, copied, slot checksums off (``--slot-checksum none``)
  lmdbio dedicated, copied, one batch per ring slot (``readers.batches_per_slot=1``: the ring as it
                    was before slots carried several batches; the others use the default)
  lmdbio colocated  every rank is a worker; the first of each node also reads ahead
  baseline          ``python -m lmdbio.pylmdb_per_rank``: every rank reads its
                    DistributedSampler share with py-lmdb and decodes record by record,
                    stacks and converts the batch to float32 (lmdbio's output type)
  baseline, uint8   the same without the float32 conversion (``--uint8``), for reference
Every worker and every baseline rank gets the same number of batches of the same size
(``--batches`` of ``batch`` records; the global batch of lmdbio is that times its workers).
Figures are steady state (after ``--warmup`` batches per rank) from each side's own JSON;
startup (interpreter, imports, opening, first batch) is reported apart.

Then the stall experiment: workers sleep ``S`` per batch (``--step-seconds``, the trainer's
compute) for two meanings of "a step as long as reading a batch": ``lmdbio_period``, the
steady time per batch lmdbio needed without a step in the same configuration and mode, and
``baseline_read``, the time a baseline rank needed to read and decode a batch itself.
Reported: the share of time workers spent inside the loader's iterator (waiting for the
ring, decoding, converting), the share spent receiving slots (blocked on the ring, then
validating them) and the share blocked on the ring alone, for lmdbio in both modes, and
the baseline's share of time getting batches (it reads synchronously).

Writes bench/results/service.json; docs/service.md has the numbers and what they mean.
Run: .venv/bin/python -m bench.service [--repeat 3] [--only cifar] [--ranks 8]
     .venv/bin/python -m bench.service --stall-only bench/results/service.json
(from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import BENCH_DATA, BIN, MPI_ENV, REPO, RESULTS, write_json

DATASETS: dict[str, dict[str, Any]] = {
    "cifar": {"records": 20_000, "shape": (3, 32, 32), "batch": 128, "batches": 600,
              "classes": 10, "seed": 1},
    "imagenet": {"records": 600, "shape": (3, 224, 224), "batch": 32, "batches": 600,
                 "classes": 1000, "seed": 2},
}


def generate(data: Path, name: str, spec: dict[str, Any]) -> Path:
    """The database ``name`` under ``data`` (written once; rewritten if its recorded
    parameters differ)."""
    from lmdbio.codecs.datum import datum_from_array, encode_datum
    from lmdbio.convert.writer import write_records
    from lmdbio.dataset_meta import read_dataset_meta

    d = data / f"service-{name}"
    meta = {"layout": "caffe-datum", "generated": "random uniform uint8 pixels (not images)",
            "shape": list(spec["shape"]), "seed": spec["seed"], "classes": spec["classes"]}
    if (d / "data.mdb").exists():
        have = read_dataset_meta(d)
        if have.get("records") == spec["records"] and all(have.get(k) == v
                                                          for k, v in meta.items()):
            return d
    rng = np.random.default_rng(spec["seed"])

    def records():
        for i in range(spec["records"]):
            img = rng.integers(0, 256, spec["shape"], dtype=np.uint8)
            label = int(rng.integers(0, spec["classes"]))
            yield b"%08d" % i, encode_datum(datum_from_array(img, label))

    print(f"generating {d}: {spec['records']} Datums of {spec['shape']} random pixels",
          flush=True)
    write_records(d, records(), meta=meta, overwrite=True)
    return d


def write_config(data: Path, name: str, db: Path) -> Path:
    """The job configuration of ``name`` (batch size, mode, epochs come as overrides)."""
    cfg = data / f"service-{name}.yaml"
    cfg.write_text(
        f"# generated by bench/service.py\n"
        f"dataset: {{path: {db.resolve()}, layout: caffe-datum}}\n"
        "batch: {size: 64, last: pad}\n"
        "readers: {strategy: indexed, mode: dedicated, prefetch_depth: 4}\n"
        "shuffle: {mode: global, seed: 0}\n"
        "epochs: 1\n"
        "metrics: {every: 0}\n")
    return cfg


def mpirun(ranks: int, argv: list[str], out: Path, timeout: float) -> dict[str, Any] | None:
    """Run ``argv`` under ``mpiexec -n ranks``; the JSON it wrote to ``out``."""
    out.unlink(missing_ok=True)
    cmd = [str(BIN / "mpiexec"), "-n", str(ranks), *argv]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=dict(os.environ, **MPI_ENV), capture_output=True, text=True,
                          timeout=timeout)
    took = time.perf_counter() - t0
    if proc.returncode or not out.exists():
        print(f"FAILED ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}"
              f"{proc.stderr[-3000:]}", flush=True)
        return None
    result = json.loads(out.read_text())
    result["command"] = " ".join(["mpiexec", "-n", str(ranks)] + [
        a.replace(str(BIN) + "/", "").replace(str(REPO) + "/", "") for a in argv])
    result["launch_seconds"] = took
    return result


def epochs_for(records: int, global_batch: int, batches: int) -> int:
    """Epochs so that every worker gets at least ``batches`` batches (policy ``pad``)."""
    per_epoch = -(-records // global_batch)
    return -(-batches // per_epoch)


def run_lmdbio(tmp: Path, cfg: Path, spec: dict[str, Any], ranks: int, mode: str,
               checksum: str, step: float, warmup: int, timeout: float,
               per_slot: int = 0, transfer: str = "auto") -> dict | None:
    nodes = ranks // 2
    workers = nodes if mode == "dedicated" else ranks
    global_batch = spec["batch"] * workers
    epochs = epochs_for(spec["records"], global_batch, spec["batches"])
    out = tmp / "lmdbio.json"
    argv = [str(BIN / "lmdbio"), "run", str(cfg), "--set", f"batch.size={global_batch}",
            "--set", f"readers.mode={mode}", "--set", f"topology.simulate_nodes={nodes}",
            "--set", f"epochs={epochs}", "--set", f"readers.batches_per_slot={per_slot}",
            "--set", f"readers.transfer={transfer}",
            "--slot-checksum", checksum, "--warmup", str(warmup),
            "--metrics-json", str(out)]
    if step:
        argv += ["--step-seconds", f"{step:.6f}"]
    r = mpirun(ranks, argv, out, timeout)
    if r is None:
        return None
    t = r["totals"]
    st = t["steady"]
    worker_ranks = [p for p in r["per_rank"] if p["worker"]]
    return {
        "command": r["command"], "ranks": ranks, "nodes": nodes, "mode": mode,
        "slot_checksum": checksum, "batches_per_slot": per_slot or "auto",
        "transfer": transfer,
        "consuming_ranks": len(worker_ranks),
        "batch_per_rank": spec["batch"], "batches_per_rank": worker_ranks[0]["batches"],
        "step_seconds": step,
        "samples_per_second": st["samples_per_second"],
        "samples_per_second_per_consuming_rank": st["samples_per_second_per_worker"],
        "seconds_per_batch": st["seconds_per_batch_mean"],
        "waiting_fraction": st["loader_fraction_mean"],
        "waiting_fraction_max": st["loader_fraction_max"],
        "receive_fraction": st["stall_fraction_mean"],
        "blocked_fraction": st["blocked_fraction_mean"],
        "blocked_fraction_max": st["blocked_fraction_max"],
        "cpu_microseconds_per_sample": st["cpu_microseconds_per_sample"],
        "whole_run_samples_per_second": t["samples_per_second"],
        "startup": t.get("startup"), "launch_seconds": r["launch_seconds"],
    }


def run_baseline(tmp: Path, db: Path, spec: dict[str, Any], ranks: int, batches: int,
                 step: float, warmup: int, timeout: float, uint8: bool = False
                 ) -> dict | None:
    out = tmp / "baseline.json"
    argv = [str(BIN / "python"), "-m", "lmdbio.pylmdb_per_rank", str(db),
            "--batch-size", str(spec["batch"]), "--batches", str(batches),
            "--warmup", str(warmup), "--json", str(out)] + (["--uint8"] if uint8 else [])
    if step:
        argv += ["--step-seconds", f"{step:.6f}"]
    r = mpirun(ranks, argv, out, timeout)
    if r is None:
        return None
    t = r["totals"]
    st = t["steady"]
    return {
        "command": r["command"], "ranks": ranks, "mode": "baseline",
        "consuming_ranks": ranks, "batch_per_rank": spec["batch"], "batches_per_rank": batches,
        "parser": t["parser"], "float32": t["float32"], "step_seconds": step,
        "samples_per_second": st["samples_per_second"],
        "samples_per_second_per_consuming_rank": st["samples_per_second_per_rank"],
        "seconds_per_batch": st["seconds_per_batch_mean"],
        "waiting_fraction": st["loader_fraction_mean"],
        "waiting_fraction_max": st["loader_fraction_max"],
        "cpu_microseconds_per_sample": st["cpu_microseconds_per_sample"],
        "whole_run_samples_per_second": t["samples_per_second"],
        "startup": {"to_open": t.get("to_open_max"), "open_seconds": t["open_seconds_max"]},
        "launch_seconds": r["launch_seconds"],
    }


def median_of(runs: list[dict]) -> dict[str, Any]:
    """The run list summarized: medians of the numeric figures, plus every run."""
    runs = [r for r in runs if r]
    if not runs:
        return {"runs": []}
    keys = ("samples_per_second", "samples_per_second_per_consuming_rank", "seconds_per_batch",
            "waiting_fraction", "cpu_microseconds_per_sample", "whole_run_samples_per_second")
    med = {k: statistics.median(r[k] for r in runs) for k in keys if k in runs[0]}
    med["samples_per_second_range"] = [min(r["samples_per_second"] for r in runs),
                                       max(r["samples_per_second"] for r in runs)]
    fixed = {k: v for k, v in runs[0].items() if k not in keys and k not in
             ("startup", "launch_seconds", "waiting_fraction_max", "ring_wait_fraction",
              "receive_fraction", "blocked_fraction", "blocked_fraction_max")}
    startup = [r["startup"] for r in runs if r.get("startup")]
    if startup:
        med["startup"] = {k: statistics.median(s[k] for s in startup if s.get(k) is not None)
                          for k in startup[0] if any(s.get(k) is not None for s in startup)}
    return {**fixed, **med, "runs": runs}


def ratio(a: dict, b: dict, key: str) -> float | None:
    return a[key] / b[key] if a.get(key) and b.get(key) else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", default="cifar,imagenet")
    parser.add_argument("--ranks", default="4,8")
    parser.add_argument("--no-stall", action="store_true", help="skip the stall experiment")
    parser.add_argument("--markdown", metavar="JSON", default=None,
                        help="print the tables of docs/service.md from a service.json and exit")
    parser.add_argument("--stall-only", metavar="JSON", default=None,
                        help="run only the stall experiment, taking the steps from the "
                        "throughput figures of this earlier service.json (kept in the output)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--batches", type=int, default=None,
                        help="batches per consuming rank (default: per data set, long enough "
                        "that the steady window is several seconds, not the ranks' startup)")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    tmp = out / "service-tmp"
    tmp.mkdir(exist_ok=True)
    rank_counts = [int(x) for x in args.ranks.split(",")]
    results: dict[str, Any] = {
        "machine": {"cores": len(os.sched_getaffinity(0)),
                    "load_average_at_start": os.getloadavg()},
        "data": "generated: random uniform uint8 pixels in Caffe Datums (not images)",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "datasets": {}}
    earlier = json.loads(Path(args.stall_only).read_text()) if args.stall_only else None
    if earlier is not None:
        results = {**earlier, "stall_rerun": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "load_average_at_stall_rerun": os.getloadavg()}
    for name in args.only.split(","):
        spec = dict(DATASETS[name])
        if args.batches:
            spec["batches"] = args.batches
        db = generate(data, name, spec)
        cfg = write_config(data, name, db)
        if earlier is not None:
            for key, summary in results["datasets"][name]["configs"].items():
                ranks = int(key.split("_")[0])
                if ranks in rank_counts:
                    summary["stall"] = stall_runs(tmp, cfg, db, spec, ranks, summary, args)
                    write_json(out / "service.json", results)
            continue
        entry: dict[str, Any] = {"records": spec["records"], "shape": list(spec["shape"]),
                                 "file_bytes": int((db / "data.mdb").stat().st_size),
                                 "configs": {}}
        results["datasets"][name] = entry
        for ranks in rank_counts:
            variants: dict[str, list] = {"dedicated": [], "dedicated_copy": [],
                                         "dedicated_no_checksum": [],
                                         "dedicated_one_per_slot": [], "colocated": [],
                                         "baseline": [], "baseline_uint8": []}
            for rep in range(args.repeat):
                print(f"[{name} {ranks} ranks, repeat {rep + 1}/{args.repeat}]", flush=True)
                for key, mode, ck, per_slot, transfer in (
                        ("dedicated", "dedicated", "xxh64", 0, "auto"),
                        ("dedicated_copy", "dedicated", "xxh64", 0, "copy"),
                        ("dedicated_no_checksum", "dedicated", "none", 0, "copy"),
                        ("dedicated_one_per_slot", "dedicated", "xxh64", 1, "copy"),
                        ("colocated", "colocated", "xxh64", 0, "auto")):
                    r = run_lmdbio(tmp, cfg, spec, ranks, mode, ck, 0.0, args.warmup,
                                   args.timeout, per_slot, transfer)
                    variants[key].append(r)
                    _say(key, r)
                batches = next((r["batches_per_rank"] for r in variants["dedicated"] if r),
                               spec["batches"])
                r = run_baseline(tmp, db, spec, ranks, batches, 0.0, args.warmup, args.timeout)
                variants["baseline"].append(r)
                _say("baseline", r)
                r = run_baseline(tmp, db, spec, ranks, batches, 0.0, args.warmup, args.timeout,
                                 uint8=True)
                variants["baseline_uint8"].append(r)
                _say("baseline, uint8 batches", r)
            summary = {k: median_of(v) for k, v in variants.items()}
            base = summary["baseline"]
            summary["ratios_vs_baseline"] = {
                k: {"total": ratio(summary[k], base, "samples_per_second"),
                    "per_consuming_rank": ratio(summary[k], base,
                                                "samples_per_second_per_consuming_rank"),
                    "cpu_per_sample": ratio(summary[k], base, "cpu_microseconds_per_sample")}
                for k in ("dedicated", "dedicated_copy", "dedicated_no_checksum",
                          "dedicated_one_per_slot", "colocated")}
            entry["configs"][f"{ranks}_ranks"] = summary
            if not args.no_stall:
                entry["configs"][f"{ranks}_ranks"]["stall"] = stall_runs(
                    tmp, cfg, db, spec, ranks, summary, args)
            write_json(out / "service.json", results)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(out / "service.json", results)
    print(f"wrote {out / 'service.json'}", flush=True)
    return 0


def stall_runs(tmp: Path, cfg: Path, db: Path, spec: dict[str, Any], ranks: int,
               summary: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Workers sleep a step per batch; the share of time they wait for data, per mode.

    Two steps "as long as reading a batch": ``lmdbio_period``, lmdbio's own steady time per
    batch in that mode without a step (the strict one: the loader must keep its full rate
    while the trainer computes), and ``baseline_read``, the time a baseline rank needs to
    read and decode a batch itself (what the trainer's step is compared with when reading
    is done in the training loop). The baseline runs with the same steps.
    """
    stall: dict[str, Any] = {}
    reps = max(1, min(args.repeat, 2))
    batches = summary["dedicated"].get("batches_per_rank", spec["batches"])
    read = summary["baseline"].get("seconds_per_batch")
    base_at_read: list = []
    for key, mode in (("dedicated", "dedicated"), ("colocated", "colocated")):
        for kind, step in (("lmdbio_period", summary[key].get("seconds_per_batch")),
                           ("baseline_read", read)):
            if not step:
                continue
            runs, base_runs = [], []
            for _ in range(reps):
                r = run_lmdbio(tmp, cfg, spec, ranks, mode, "xxh64", step, args.warmup,
                               args.timeout)
                runs.append(r)
                _say(f"{key} step {1e3 * step:.1f} ms", r)
                if kind == "baseline_read" and len(base_at_read) >= reps:
                    continue  # the baseline at this step was run for the other mode
                b = run_baseline(tmp, db, spec, ranks, batches, step, args.warmup,
                                 args.timeout)
                (base_at_read if kind == "baseline_read" else base_runs).append(b)
                _say(f"baseline step {1e3 * step:.1f} ms", b)
            stall.setdefault(kind, {})[key] = {
                "step_seconds": step, "lmdbio": median_of(runs),
                "baseline": median_of(base_at_read if kind == "baseline_read" else base_runs)}
    return stall


def markdown(results: dict[str, Any]) -> str:
    """The result tables (medians over the repeats) as Markdown."""
    names = {"dedicated": "lmdbio dedicated",
             "dedicated_copy": "lmdbio dedicated, records copied into the ring",
             "dedicated_no_checksum": "lmdbio dedicated, copied, no slot checksum",
             "dedicated_one_per_slot": "lmdbio dedicated, copied, one batch per slot (before)",
             "colocated": "lmdbio colocated",
             "baseline": "baseline (py-lmdb per rank, float32)",
             "baseline_uint8": "baseline, uint8 batches"}
    lines = []
    for name, entry in results["datasets"].items():
        for key, c in entry["configs"].items():
            ranks = key.split("_")[0]
            lines += [f"\n**{name}, {ranks} ranks on {int(ranks) // 2} simulated nodes** "
                      f"(batch {c['baseline']['batch_per_rank']} per consuming rank, "
                      f"{c['dedicated']['batches_per_rank']} batches each; medians of "
                      f"{len(c['baseline']['runs'])})\n",
                      "| variant | consuming ranks | samples/s (min-max) | per consuming rank | "
                      "CPU µs/sample | vs baseline: total | per consuming rank | CPU |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|"]
            base = c["baseline"]
            for v, label in names.items():
                r = c.get(v)
                if not r or "samples_per_second" not in r:
                    continue
                rat = "| | | |" if v.startswith("baseline") else (
                    f"| {r['samples_per_second'] / base['samples_per_second']:.2f}x "
                    f"| {r['samples_per_second_per_consuming_rank'] / base['samples_per_second_per_consuming_rank']:.2f}x "  # noqa: E501
                    f"| {r['cpu_microseconds_per_sample'] / base['cpu_microseconds_per_sample']:.2f}x |")  # noqa: E501
                sps = [x["samples_per_second"] for x in r["runs"] if x]
                lo, hi = min(sps), max(sps)
                lines.append(f"| {label} | {r['consuming_ranks']} "
                             f"| {r['samples_per_second']:,.0f} ({lo:,.0f}-{hi:,.0f}) "
                             f"| {r['samples_per_second_per_consuming_rank']:,.0f} "
                             f"| {r['cpu_microseconds_per_sample']:.1f} {rat}")
    lines += ["\n**Waiting for data with a training step** (medians; in the loader = time "
              "inside the loader's iterator (receiving, validating, decoding, converting); "
              "receiving = receiving slots (blocked on the ring, then validating the slot; "
              "its checksum too unless decoded ahead); blocked = blocked on the node ring "
              "alone, nothing to do but wait for the reader (mean over workers / worst "
              "worker); older result files lack it)\n",
              "| data | ranks | step | length | lmdbio mode | in the loader | receiving | "
              "blocked | baseline getting batches |", "|---|---:|---|---:|---|---:|---:|---:|---:|"]
    for name, entry in results["datasets"].items():
        for key, c in entry["configs"].items():
            stall = c.get("stall", {})
            if any("lmdbio" in v for v in stall.values()):  # one step kind (older files)
                stall = {"lmdbio_period": stall}
            for kind, modes in stall.items():
                for mode, st_ in modes.items():
                    lm, bl = st_["lmdbio"], st_["baseline"]
                    runs = [r for r in lm["runs"] if r]
                    recv = statistics.median(r.get("receive_fraction",
                                                   r.get("ring_wait_fraction", 0.0))
                                             for r in runs)
                    blocked = "-"
                    if all("blocked_fraction" in r for r in runs):
                        b = statistics.median(r["blocked_fraction"] for r in runs)
                        bmax = statistics.median(r["blocked_fraction_max"] for r in runs)
                        blocked = f"{100 * b:.1f}% / {100 * bmax:.1f}%"
                    lines.append(
                        f"| {name} | {key.split('_')[0]} | {kind} "
                        f"| {1e3 * st_['step_seconds']:.1f} ms | {mode} "
                        f"| {100 * lm['waiting_fraction']:.1f}% | {100 * recv:.1f}% "
                        f"| {blocked} | {100 * bl['waiting_fraction']:.1f}% |")
    lines += ["\n**Startup** (medians, slowest rank; not in the figures above)\n",
              "| data | ranks | variant | interpreter + imports | opening | first batch |",
              "|---|---:|---|---:|---:|---:|"]
    for name, entry in results["datasets"].items():
        for key, c in entry["configs"].items():
            for v in ("dedicated", "colocated", "baseline"):
                st_ = c[v].get("startup") or {}
                first = f"{st_['to_first_batch']:.2f} s" if "to_first_batch" in st_ else "-"
                imports = f"{st_['to_open']:.2f} s" if st_.get("to_open") else "-"
                lines.append(f"| {name} | {key.split('_')[0]} | {names[v]} | {imports} "
                             f"| {st_.get('open_seconds', 0):.2f} s | {first} |")
    return "\n".join(lines)


def _say(what: str, r: dict | None) -> None:
    if r is None:
        print(f"  {what}: failed", flush=True)
        return
    print(f"  {what:28s} {r['samples_per_second']:9.0f} samples/s "
          f"({r['samples_per_second_per_consuming_rank']:8.0f} per consuming rank, "
          f"{r['consuming_ranks']}), {r['cpu_microseconds_per_sample']:6.1f} CPU us/sample, "
          f"waiting {100 * r['waiting_fraction']:5.1f}%", flush=True)


if __name__ == "__main__":
    sys.exit(main())
