"""Run read sessions case after case and emit, per rank and case, what it delivered.

argv[1]: JSON ``{"path": ..., "cases": [case, ...]}``; a case holds ``strategy``, and
optionally ``shuffle`` (none), ``last`` (pad), ``batch`` (4), ``seed`` (0), ``nodes``
(simulated nodes, 0 = the real ones), ``mode`` (dedicated), ``symmetric`` (true), ``iters``
(default: one epoch and two more iterations, to cross the wrap-around into the next epoch),
``direct`` (every node reads into its own O_DIRECT cache), ``per_slot`` (batches per ring
slot: the node-level strategies read slot by slot, as ``--batches-per-slot``), ``fail``
(``{"rank": R, "iteration": I}``: that rank raises inside its loop, as a crashing rank
would), ``path`` (another database), ``env`` (variables set during the case, e.g. the
symmetric-mapping failure hook ``LMDBIO_SYMMAP_FAIL_RANK``); a case ``{"kind": "cursor"}``
runs tests/mpi/read_cursor.py's exchange instead (two ranks or more). The loop is the one
``lmdbio bench read`` runs: readers read every scheduled iteration, colocated consumers
receive as they go, dedicated workers drain their ring.

Per case every rank emits: its consumer number (``None`` if it consumes nothing), the
``(epoch, iteration)`` of every batch received, the record ids and padding flags in delivery
order, a CRC-32 of key + value of every record received (the test compares them with what
was written), and the reader's accounting.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import zlib

import numpy as np
from _result import emit
from mpi4py import MPI

from lmdbio.config import load_config
from lmdbio.mpiutil import abort_on_error
from lmdbio.reader import ReadSession
from lmdbio.run_plan import ReadTuning, RunPlan
from lmdbio.topology import Topology

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
world = MPI.COMM_WORLD


def schedule(plan_iters: int, iters: int) -> list[tuple[int, int]]:
    out, e, i = [], 0, 0
    while len(out) < iters and plan_iters > 0:
        out.append((e, i))
        i += 1
        if i == plan_iters:
            e, i = e + 1, 0
    return out


def slots(sched: list[tuple[int, int]], per_slot: int) -> list[tuple[int, int, int]]:
    """The ring slots of ``sched``, as ``lmdbio bench read`` makes them."""
    from lmdbio.plan.epoch import schedule_slots

    return schedule_slots(sched, per_slot)


def random_read_flag(buf) -> bool | None:
    """Whether the kernel marks the mapping holding ``buf`` for random reads (``rr`` in
    its ``/proc/self/smaps`` VmFlags: ``MADV_RANDOM``), None if not found."""
    addr = buf.ctypes.data if buf.shape[0] else None
    if addr is None:
        return None
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0] if line.strip() else ""
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                return "rr" in line.split()[1:]
    return None


def record_crcs(got) -> list[int]:
    keys = got.keys()
    payload, offs = got.payload, got.offsets
    return [zlib.crc32(values, zlib.crc32(k)) for k, values in
            zip(keys, (bytes(payload[offs[j]:offs[j + 1]]) for j in range(len(keys))),
                strict=True)]


def run_case(path: str, index: int, case: dict, topo: Topology) -> None:
    if case.get("kind") == "cursor":
        import read_cursor

        read_cursor.main(case.get("path", path), {"case": index})
        return
    saved = {k: os.environ.get(k) for k in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    try:
        _run_case(case.get("path", path), index, case, topo)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_case(path: str, index: int, case: dict, topo: Topology) -> None:
    # records per consumer (batch), one batch per slot and copied records unless the case
    # says otherwise, as a bench plan counts them
    cfg = load_config({
        "dataset": {"path": path},
        "batch": {"size": case.get("batch", 4), "last": case.get("last", "pad")},
        "readers": {"strategy": case["strategy"], "prefetch_depth": case.get("depth", 3),
                    "batches_per_slot": case.get("per_slot", 1), "transfer": "copy"},
        "shuffle": {"mode": case.get("shuffle", "none"), "seed": case.get("seed", 0)},
    })
    tuning = ReadTuning(timeout=case.get("timeout", 60.0),
                        symmetric=case.get("symmetric", True),
                        direct_io=case.get("direct", False))
    run_plan = RunPlan.resolve(cfg, topo, purpose="bench", tuning=tuning)
    fail = case.get("fail")
    session = ReadSession(path, topo, run_plan)
    plan = session.begin_epoch(0)
    sched = schedule(plan.iterations, case.get("iters", plan.iterations + 2))
    consumes = (not session.shared) or topo.is_worker
    got_batches: list[list[int]] = []
    ids: list[int] = []
    pads: list[bool] = []
    crcs: list[int] = []

    plans = {}

    def take(got) -> None:
        # a slot may carry several batches of this consumer, back to back
        if got.epoch not in plans:
            plans[got.epoch] = session.plan_for(got.epoch)
        consumer = topo.worker_rank if session.shared else topo.rank
        its = range(got.iteration, got.iteration + got.batches)
        sizes = [int(plans[got.epoch].sizes[i, consumer]) for i in its]
        assert sum(sizes) == got.ids.size, (sizes, got.ids.size)
        got_batches.extend([int(got.epoch), i, n] for i, n in zip(its, sizes, strict=True))
        ids.extend(got.ids.tolist())
        pads.extend(got.padding.tolist())
        crcs.extend(record_crcs(got))
        got.release()

    for n, (epoch, it, count) in enumerate(slots(sched, session.batches_per_slot)):
        if fail and fail["rank"] == topo.rank and fail["iteration"] == n:
            raise RuntimeError(f"injected failure on rank {topo.rank} at iteration {n}")
        if epoch != session.epoch:
            session.begin_epoch(epoch)
        if session.reads:
            session.read_group(it, count)
        if consumes and (session.reads or not session.shared):
            got = session.receive(timeout=run_plan.timeout)
            assert got is not None
            take(got)
            del got  # its arrays are views into the ring
    if session.reads:
        session.stop()
    if consumes and session.shared and not session.reads:
        while (got := session.receive(timeout=run_plan.timeout)) is not None:
            take(got)
        del got
    t = session.totals
    consumer = (topo.worker_rank if session.shared else topo.rank) if consumes else None
    emit({
        "case": index,
        "consumer": consumer,
        "consumers": session.consumers,
        "plan_group": session.plan_group,
        "read_around": bool(session.db.read_around),
        "random_read_flag": random_read_flag(session.db.buf) if session.reads else None,
        "consumers_per_node": list(session.consumers_per_node),
        "reader": bool(session.reads),
        "node": topo.node_index,
        "hostname": topo.hostname,
        "local_rank": topo.local_rank,
        "simulated": topo.simulated,
        "pinned": session.db.stat()["snapshot_pinned"],
        "batches": got_batches,
        "ids": ids,
        "padding": pads,
        "crcs": crcs,
        "pages_touched": int(np.count_nonzero(t.touched)),
        "own_pages": int(np.count_nonzero(t.own)),
        "extra_pages": int(np.count_nonzero(t.touched & ~t.own.astype(bool))),
        "iterations": [{k: s[k] for k in ("missed_pages", "missed_walk_pages", "redundant_pages",
                                          "prefetched_pages", "pages_touched", "own_pages",
                                          "extra_pages", "records")} for s in t.iterations],
        "symmetric": t.symmetric,
        "symmetric_attempts": t.symmetric_attempts,
        "source": getattr(session.strategy, "source", None) if session.reads else None,
        "n_records": len(session.db),
        "direct_io": session.node_cache.stats() if session.node_cache is not None else None,
        "node_pages": session.node_cache.present_count()
        if session.node_cache is not None else None,
    })
    session.close()


def main() -> None:
    spec = json.loads(sys.argv[1])
    topos: dict[tuple[int, str], Topology] = {}
    with abort_on_error():
        for index, case in enumerate(spec["cases"]):
            key = (case.get("nodes", 0), case.get("mode", "dedicated"))
            if key not in topos:
                topos[key] = Topology.build(world, simulate_nodes=key[0], mode=key[1])
            run_case(spec["path"], index, case, topos[key])
        for topo in topos.values():
            topo.close()
        world.Barrier()


main()
