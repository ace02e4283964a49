"""``lmdbio bench read`` on namespaced hosts: page traffic, link traffic and time per host.

The first measurement where nodes do not share a page cache path *and* talk over a network:
N hosts made by bench/multihost.py (network namespaces on a bridge, each with its own host
name and /dev/shm), each node reading through its own O_DIRECT cache (``--direct``), the
links optionally shaped like a cluster's (``--rate``: ``tc tbf``; ``--delay``: ``tc netem``,
where the kernel has it). For each strategy and read-around window one ``mpiexec`` run of
``lmdbio bench read`` on 2 ranks per host (colocated, bench read's default: both ranks
consume, the node's first also reads for the node-level strategies; every rank reads for
the naive ones), then per host: the bytes its node read from the file (direct I/O, its
ranks' ``direct_io.bytes`` summed), the pages its records occupy (``own``) and the pages
its readers touched, the bytes it sent and received on its link, and the run's time; and
beside them what :mod:`lmdbio.scale`'s page model (``lmdbio plan-scale``) says the node
reads from the file system for the same job, traced with the same strategy code.

What the direct-I/O bytes are: the caches start empty after the setup and at every epoch,
so a host reads its share once per epoch (the run is ``--epochs`` whole epochs; with
``--iters`` it may end inside one). ``--read-around 0`` reads exactly the pages touched
(as a mapping advised ``MADV_RANDOM``); ``--read-around 128`` reads every fault's aligned
128 KiB window, as the kernel's default read-around does for the strategies that fault
their pages (naive-stride, lmm; dm-spec and indexed ask for theirs and read them exactly).
On a database of 3,072 B records (each value one overflow page of its own) the strategies
differ only through read-around: the pages a node touches are its records' pages and a
few leaves. ``--value-bytes 784`` (MNIST-like, values inline in the leaves) makes the
walks themselves read other nodes' pages.

Needs root (namespaces). The database is generated (3,072 B records committed 1,000 at a
time, as Caffe's converter does) unless ``--db`` names one::

    python -m bench.multihost_read --hosts 2 --rate 1gbit --json out.json

Numbers from a 2-core machine with other jobs are indicative only (times ±30% or worse;
the byte and page counts are exact).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import NUMBA_CACHE, REPO, random_db, write_json
from bench.multihost import Hosts, make_hosts, unavailable

STRATEGIES = ("naive-stride", "lmm", "dm-spec", "indexed")
RANKS_PER_HOST = 2


def bench_env(hosts: Hosts) -> dict[str, str]:
    """mpiexec's environment: the hosts' settings, root allowed, no one-host mapping."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRTE_", "OMPI_"))}
    env.update(hosts.mpi_env())
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_sm_backing_directory="/dev/shm",
               OMPI_MCA_osc_sm_backing_directory="/dev/shm")
    env.setdefault("NUMBA_CACHE_DIR", str(NUMBA_CACHE))
    env["PYTHONPATH"] = str(REPO)
    return env


def epoch_iterations(records: int, batch: int, consumers: int) -> int:
    """Iterations of one epoch (``last: pad``, bench read's default)."""
    return math.ceil(records / (batch * consumers))


def model_node_bytes(db: Path, strategy: str, hosts: int, batch: int, per_slot: int,
                     around_kib: int) -> list[int]:
    """Bytes per node from the file system in one epoch, by lmdbio.scale's model of the same
    job (colocated, ``RANKS_PER_HOST`` ranks per node, ``per_slot`` batches per slot) with
    ``around_kib`` KiB of read-around (one page for none)."""
    from lmdbio.scale.costs import Costs
    from lmdbio.scale.model import epoch_time
    from lmdbio.scale.trace import trace

    tr = trace(db, strategy, RANKS_PER_HOST * hosts, hosts, batch,
               batches_per_slot=per_slot)
    costs = Costs(readahead_bytes=max(around_kib * 1024, tr.psize))
    return [int(b) for b in epoch_time(tr, costs).node_fs_bytes]


def run_one(h: Hosts, db: Path, strategy: str, around: int, args: argparse.Namespace,
            out: Path) -> dict:
    """One ``lmdbio bench read`` run; its per-host figures."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    argv = [str(mpiexec), "-n", str(RANKS_PER_HOST * len(h.names)),
            *h.mpiexec_args(ranks_per_host=RANKS_PER_HOST, map_by="slot",
                            export=("NUMBA_CACHE_DIR", "PYTHONPATH")),
            sys.executable, "-m", "lmdbio.cli", "bench", "read", str(db),
            "--strategy", strategy, "--mode", "colocated", "--direct",
            "--direct-read-around", str(around), "--batch-size", str(args.batch),
            "--batches-per-slot", str(args.batches_per_slot),
            "--iters", str(args.iters), "--json", str(out)]
    before = h.traffic()
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=bench_env(h), cwd=REPO, capture_output=True, text=True,
                          timeout=600, check=False)
    wall = time.monotonic() - t0
    after = h.traffic()
    if proc.returncode != 0:
        raise RuntimeError(f"{strategy}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    doc = json.loads(out.read_text())
    psize = doc["totals"]["page_size"]
    per_slot = doc["batches_per_slot"]
    model = None
    if args.model and args.whole_epochs:
        one = model_node_bytes(db, strategy, len(h.names), args.batch, per_slot, around)
        model = [b * args.whole_epochs for b in one]
    per_host = {}
    for name in h.names:
        mine = [r for r in doc["per_rank"] if r["host"] == name]
        (node_index,) = {r["node"] for r in mine}  # one node per host: the real split
        node = next(n for n in doc["totals"]["per_node"] if n["node"] == node_index)
        direct = [r.get("direct_io") or {} for r in mine]
        nbytes = sum(d.get("bytes", 0) for d in direct)
        per_host[name] = {
            "node": node_index,
            "ranks": [r["rank"] for r in mine],
            "direct_bytes": nbytes,
            "direct_reads": sum(d.get("reads", 0) for d in direct),
            "read_around_pages": max((d.get("read_around_pages", 1) for d in direct),
                                     default=1),
            "records_delivered": sum(len(r["records"]) for r in mine),
            # union over the run of the node's readers' page bitmaps
            "pages_touched": node["pages_touched"],
            "own_pages": node["own_pages"],
            "extra_pages": node["extra_pages"],
            # what the node's cache held for its last epoch
            "held_pages": node["resident_pages"],
            "direct_per_own_page": nbytes / (node["own_pages"] * psize * args.whole_epochs)
            if node["own_pages"] and args.whole_epochs else None,
            "model_bytes": model[node_index] if model else None,
            "link_tx_bytes": after[name][0] - before[name][0],
            "link_rx_bytes": after[name][1] - before[name][1],
        }
    return {"strategy": strategy, "read_around_kib": around, "wall_seconds": wall,
            "batches_per_slot": per_slot, "page_size": psize,
            "loop_seconds": doc["totals"]["loop_seconds"],
            "records_per_second": doc["totals"]["loop_records_per_second"],
            "direct_io": doc["totals"].get("direct_io"), "hosts": per_host}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2, help="2 to 4 hosts")
    parser.add_argument("--rate", default=None, help="link rate (tc tbf), e.g. 1gbit")
    parser.add_argument("--delay", default=None, help="link delay (tc netem), e.g. 100us")
    parser.add_argument("--db", default=None, help="database (default: generate one)")
    parser.add_argument("--records", type=int, default=8000)
    parser.add_argument("--value-bytes", type=int, default=3072,
                        help="value size of the generated database (3072: CIFAR-like, one "
                             "overflow page each; 784: MNIST-like, inline in the leaves)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1,
                        help="whole epochs to run (the caches empty at every epoch)")
    parser.add_argument("--iters", type=int, default=None,
                        help="iterations to run instead of --epochs (no model figures "
                             "unless a whole number of epochs)")
    parser.add_argument("--batches-per-slot", type=int, default=0,
                        help="bench read's --batches-per-slot (0: a job's default)")
    parser.add_argument("--read-around", default="0,128",
                        help="KiB of read-around per fault in the node caches, one run per "
                             "value (0: exactly the pages touched)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--no-model", dest="model", action="store_false",
                        help="leave out the scaling model's figures")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"multihost_read: {why}", file=sys.stderr)
        return 2
    arounds = [int(a) for a in args.read_around.split(",")]
    with tempfile.TemporaryDirectory(prefix="lmdbio-mhbench-") as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "db"
        if not args.db:
            random_db(db, args.records, args.value_bytes, seed=5, map_size=1 << 28)
        from lmdbio.lmdb import Database

        with Database(db) as d:
            n_records, file_bytes = len(d), d.file_size
        per_epoch = epoch_iterations(n_records, args.batch, RANKS_PER_HOST * args.hosts)
        if args.iters is None:
            args.iters = args.epochs * per_epoch
        args.whole_epochs = args.iters // per_epoch if args.iters % per_epoch == 0 else 0
        hosts = make_hosts(args.hosts, slots=RANKS_PER_HOST)
        try:
            if args.rate or args.delay:
                hosts.shape(args.rate, args.delay)
            results = [run_one(hosts, db, s, a, args, Path(tmp) / f"{s}-{a}.json")
                       for s in args.strategies.split(",") for a in arounds]
        finally:
            hosts.close()
    doc = {"hosts": args.hosts, "ranks_per_host": RANKS_PER_HOST, "mode": "colocated",
           "rate": args.rate, "delay": args.delay, "batch": args.batch,
           "iters": args.iters, "epoch_iterations": per_epoch,
           "epochs": args.whole_epochs or args.iters / per_epoch,
           "records": n_records, "value_bytes": args.value_bytes if not args.db else None,
           "file_bytes": file_bytes, "results": results}
    if args.json:
        write_json(args.json, doc, indent=2)
    print(f"{n_records} records, file {file_bytes / 2**20:.2f} MiB, {args.iters} iterations "
          f"({doc['epochs']:g} epochs of {per_epoch}), {args.hosts} hosts x "
          f"{RANKS_PER_HOST} ranks, batch {args.batch}")
    print(f"{'strategy':13s} {'RA KiB':>6s} {'host':4s} {'direct MiB':>10s} {'model MiB':>9s} "
          f"{'/own':>5s} {'touched':>7s} {'own':>6s} {'extra':>6s} {'tx KiB':>8s} "
          f"{'rx KiB':>8s} {'loop s':>7s} {'rec/s':>8s}")
    for r in results:
        for name, v in r["hosts"].items():
            model = f"{v['model_bytes'] / 2**20:9.2f}" if v["model_bytes"] is not None \
                else f"{'-':>9s}"
            ratio = f"{v['direct_per_own_page']:5.2f}" if v["direct_per_own_page"] \
                else f"{'-':>5s}"
            print(f"{r['strategy']:13s} {r['read_around_kib']:6d} {name:4s} "
                  f"{v['direct_bytes'] / 2**20:10.2f} {model} {ratio} "
                  f"{v['pages_touched']:7d} {v['own_pages']:6d} {v['extra_pages']:6d} "
                  f"{v['link_tx_bytes'] / 1024:8.1f} {v['link_rx_bytes'] / 1024:8.1f} "
                  f"{r['loop_seconds']:7.2f} {r['records_per_second']:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
