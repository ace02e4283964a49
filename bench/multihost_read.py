"""``lmdbio bench read`` on namespaced hosts: page traffic, link traffic and time per host.

The first measurement where nodes do not share a page cache path *and* talk over a network:
N hosts made by tests/multihost.py (network namespaces on a bridge, each with its own host
name and /dev/shm), each node reading through its own O_DIRECT cache (``--direct``), the
links optionally shaped like a cluster's (``--rate``: ``tc tbf``; ``--delay``: ``tc netem``,
where the kernel has it). For each
strategy one ``mpiexec`` run of ``lmdbio bench read`` on 2 ranks per host (a reader and a
worker, dedicated), then per host: the bytes its node read from the file (direct I/O), the
pages its ranks touched, the bytes it sent and received on its link, and the run's time.

Needs root (namespaces). The database is generated (CIFAR-like: 3,072 B records committed
1,000 at a time, as Caffe's converter does) unless ``--db`` names one::

    python bench/multihost_read.py --hosts 2 --rate 1gbit --delay 100us --json out.json

Numbers from a 2-core machine with other jobs are indicative only (±30% or worse).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from multihost import Hosts, make_hosts, unavailable  # noqa: E402

STRATEGIES = ("naive-stride", "lmm", "dm-spec", "indexed")


def make_db(path: Path, records: int) -> None:
    """A CIFAR-like database of ``records`` random 3,072 B values (tests/lmdbgen.py)."""
    from lmdbgen import random_items, write_db

    write_db(path, random_items(records, 3072, seed=5), commit_every=1000)


def bench_env(hosts: Hosts) -> dict[str, str]:
    """mpiexec's environment: the hosts' settings, root allowed, no one-host mapping."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRTE_", "OMPI_"))}
    env.update(hosts.mpi_env())
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_sm_backing_directory="/dev/shm",
               OMPI_MCA_osc_sm_backing_directory="/dev/shm")
    env.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
    env["PYTHONPATH"] = str(REPO)
    return env


def run_one(h: Hosts, db: Path, strategy: str, args: argparse.Namespace, out: Path) -> dict:
    """One ``lmdbio bench read`` run; its per-host figures."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    argv = [str(mpiexec), "-n", str(2 * len(h.names)),
            *h.mpiexec_args(ranks_per_host=2, map_by="slot",
                            export=("NUMBA_CACHE_DIR", "PYTHONPATH")),
            sys.executable, "-m", "lmdbio.cli", "bench", "read", str(db),
            "--strategy", strategy, "--direct", "--batch-size", str(args.batch),
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
    per_host = {}
    ranks = doc["per_rank"]
    for i, name in enumerate(h.names):
        mine = [r for r in ranks if r["node"] == i]
        node = next(n for n in doc["totals"]["per_node"] if n["node"] == i)
        direct = [r.get("direct_io") or {} for r in mine]
        per_host[name] = {
            "direct_bytes": sum(d.get("bytes", 0) for d in direct),
            "pages_touched": node["pages_touched"],
            "extra_pages": node["extra_pages"],
            "link_tx_bytes": after[name][0] - before[name][0],
            "link_rx_bytes": after[name][1] - before[name][1],
        }
    return {"strategy": strategy, "wall_seconds": wall,
            "loop_seconds": doc["totals"]["loop_seconds"],
            "records_per_second": doc["totals"]["loop_records_per_second"],
            "direct_io": doc["totals"].get("direct_io"), "hosts": per_host}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2, help="2 to 4 hosts")
    parser.add_argument("--rate", default=None, help="link rate (tc tbf), e.g. 1gbit")
    parser.add_argument("--delay", default=None, help="link delay (tc netem), e.g. 100us")
    parser.add_argument("--db", default=None, help="database (default: generate one)")
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"multihost_read: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="lmdbio-mhbench-") as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "cifar"
        if not args.db:
            make_db(db, args.records)
        hosts = make_hosts(args.hosts, slots=2)
        try:
            if args.rate or args.delay:
                hosts.shape(args.rate, args.delay)
            results = [run_one(hosts, db, s, args, Path(tmp) / f"{s}.json")
                       for s in args.strategies.split(",")]
        finally:
            hosts.close()
    doc = {"hosts": args.hosts, "rate": args.rate, "delay": args.delay, "batch": args.batch,
           "iters": args.iters, "records": args.records if not args.db else None,
           "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'strategy':13s} {'host':4s} {'direct MiB':>10s} {'pages':>7s} {'extra':>6s} "
          f"{'tx KiB':>8s} {'rx KiB':>8s} {'loop s':>7s} {'rec/s':>8s}")
    for r in results:
        for name, v in r["hosts"].items():
            print(f"{r['strategy']:13s} {name:4s} {v['direct_bytes'] / 2**20:10.2f} "
                  f"{v['pages_touched']:7d} {v['extra_pages']:6d} "
                  f"{v['link_tx_bytes'] / 1024:8.1f} {v['link_rx_bytes'] / 1024:8.1f} "
                  f"{r['loop_seconds']:7.2f} {r['records_per_second']:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
