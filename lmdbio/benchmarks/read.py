"""``mpiexec -n R lmdbio bench read PATH --strategy S``: parallel reading, measured.

Every rank builds the topology (``--simulate-nodes K`` splits the world into K groups of
consecutive ranks acting as nodes), the readers run the strategy for ``--iters`` iterations
and the consumers receive their batches (through node shared memory for the node-level
strategies). Rank 0 writes one JSON document: per iteration the missed and redundant
speculative pages summed over readers; per rank the global record indices it received in
delivery order, pages touched, pages holding its own records, extra pages, bytes and a time
breakdown; totals. ``--pylmdb`` adds, for the naive strategies, the same access pattern
through py-lmdb cursors (what Caffe and DALI run) as the wall-clock baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory or data.mdb")
    parser.add_argument("--strategy", default="dm-spec",
                        choices=["naive-stride", "naive-contig", "lmm", "dm-serial", "dm-spec",
                                 "indexed"])
    parser.add_argument("--batch-size", type=int, default=64, help="records per consumer")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--simulate-nodes", type=int, default=0)
    parser.add_argument("--mode", choices=["dedicated", "colocated"], default="dedicated")
    parser.add_argument("--shuffle", nargs="?", const="global", default="none",
                        choices=["none", "global", "block"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last", choices=["pad", "drop", "partial"], default="pad")
    parser.add_argument("--prefetch-depth", type=int, default=4)
    parser.add_argument("--no-symmetric", action="store_true",
                        help="do not map symmetrically (cursors travel as page numbers)")
    parser.add_argument("--pylmdb", action="store_true",
                        help="naive strategies: also time py-lmdb running the same pattern")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", metavar="OUT", default=None)


def _schedule(plan_iters: int, iters: int) -> list[tuple[int, int]]:
    """(epoch, iteration) pairs for ``iters`` iterations, wrapping into new epochs."""
    out = []
    e = i = 0
    while len(out) < iters and plan_iters > 0:
        out.append((e, i))
        i += 1
        if i == plan_iters:
            e, i = e + 1, 0
    return out


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    from mpi4py import MPI

    from lmdbio.mpiutil import abort_on_error
    from lmdbio.reader import ReadOptions, ReadSession
    from lmdbio.topology import Topology

    world = MPI.COMM_WORLD
    with abort_on_error():
        topo = Topology.build(world, simulate_nodes=args.simulate_nodes, mode=args.mode)
        opts = ReadOptions(strategy=args.strategy, batch_size=args.batch_size,
                           last=args.last, shuffle=args.shuffle, seed=args.seed,
                           prefetch_depth=args.prefetch_depth, timeout=args.timeout,
                           symmetric=not args.no_symmetric)
        world.Barrier()
        t_start = time.perf_counter()
        session = ReadSession(args.path, topo, opts)
        plan = session.begin_epoch(0)
        schedule = _schedule(plan.iterations, args.iters)
        records: list[int] = []
        padding: list[bool] = []
        delivered_bytes = 0
        consumer_wait = 0.0
        consumes = (not session.shared) or topo.is_worker
        pending = 0
        for epoch, it in schedule:
            if epoch != session.epoch:
                session.begin_epoch(epoch)
            if session.reads:
                session.read_iteration(it)
                pending += 1
            # a colocated reader consumes as it goes; dedicated workers drain below
            if consumes and (session.reads or not session.shared):
                t0 = time.perf_counter()
                got = session.receive(timeout=args.timeout)
                consumer_wait += time.perf_counter() - t0
                assert got is not None
                records.extend(got.ids.tolist())
                padding.extend(got.padding.tolist())
                delivered_bytes += int(got.offsets[-1])
                got.release()
        if session.reads:
            session.stop()
        if consumes and session.shared and not session.reads:
            while True:
                t0 = time.perf_counter()
                got = session.receive(timeout=args.timeout)
                consumer_wait += time.perf_counter() - t0
                if got is None:
                    break
                records.extend(got.ids.tolist())
                padding.extend(got.padding.tolist())
                delivered_bytes += int(got.offsets[-1])
                got.release()
        elapsed = time.perf_counter() - t_start
        baseline = None
        if args.pylmdb and not session.shared:
            from lmdbio.plan.pylmdb_baseline import run_pattern

            world.Barrier()
            baseline = run_pattern(args.path, session, schedule)
        totals = session.totals
        mine = {
            "rank": topo.rank,
            "node": topo.node_index,
            "reader": session.reads,
            "worker": consumes,
            "records": records,
            "padding": padding,
            "pages_touched": int(np.count_nonzero(totals.touched)),
            "own_pages": int(np.count_nonzero(totals.own)),
            "extra_pages": int(np.count_nonzero(totals.touched & ~totals.own.astype(bool))),
            "bytes_delivered": delivered_bytes,
            "bytes_read": int(sum(s["bytes"] for s in totals.iterations)),
            "seconds": {
                "total": elapsed,
                "setup": totals.setup_seconds,
                "consumer_wait": consumer_wait,
                **{k: float(sum(s["seconds"][k] for s in totals.iterations))
                   for k in ("prefetch", "wait_cursor", "walk", "copy")},
            },
            "iterations": [{k: s[k] for k in ("iteration", "missed_pages", "redundant_pages",
                                              "prefetched_pages", "pages_touched",
                                              "extra_pages")} for s in totals.iterations],
            "symmetric": totals.symmetric,
            "symmetric_attempts": totals.symmetric_attempts,
            "pylmdb_seconds": baseline,
        }
        n_records = len(session.db)
        session.close()
        everyone = world.gather(mine, root=0)
    if topo.rank != 0:
        return None
    return summarize(args, everyone, n_records, topo)


def summarize(args: argparse.Namespace, ranks: list[dict], n_records: int, topo) -> dict:
    iters: dict[int, dict] = {}
    for r in ranks:
        for k, s in enumerate(r["iterations"]):
            d = iters.setdefault(k, {"iteration": k, "missed_pages": 0, "redundant_pages": 0,
                                     "prefetched_pages": 0})
            for f in ("missed_pages", "redundant_pages", "prefetched_pages"):
                d[f] += s[f]
    wall = max(r["seconds"]["total"] for r in ranks)
    delivered = sum(len(r["records"]) for r in ranks)
    nbytes = sum(r["bytes_delivered"] for r in ranks)
    readers = [r for r in ranks if r["reader"]]
    baseline = [r["pylmdb_seconds"] for r in ranks if r["pylmdb_seconds"] is not None]
    return {
        "benchmark": "read",
        "path": args.path,
        "strategy": args.strategy,
        "ranks": topo.size,
        "nodes": topo.n_nodes,
        "batch_size": args.batch_size,
        "shuffle": args.shuffle,
        "seed": args.seed,
        "last": args.last,
        "records_in_database": n_records,
        "iterations": [iters[k] for k in sorted(iters)],
        "per_rank": [{k: v for k, v in r.items() if k != "iterations"} for r in ranks],
        "totals": {
            "records_delivered": delivered,
            "seconds": wall,
            "records_per_second": delivered / wall if wall else 0.0,
            "bytes_per_second": nbytes / wall if wall else 0.0,
            "extra_pages": sum(r["extra_pages"] for r in readers),
            "needed_pages": sum(r["own_pages"] for r in readers),
            "pages_touched": sum(r["pages_touched"] for r in readers),
            "symmetric_mapping_attempts": max((r["symmetric_attempts"] for r in readers),
                                              default=0),
            "symmetric_mapping": all(r["symmetric"] for r in readers)
            if args.strategy.startswith("dm") else None,
            "pylmdb_seconds": max(baseline) if baseline else None,
        },
    }


def main(args: argparse.Namespace) -> int:
    result = run(args)
    if result is not None:
        text = json.dumps(result, indent=1, default=lambda o: o.tolist()
                          if isinstance(o, np.ndarray) else str(o))
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        else:
            print(text)
    return 0
