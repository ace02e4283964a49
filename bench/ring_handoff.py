"""The node ring's hand-off alone: CPU per ring slot and per record, by slot size.

The scaling model charges a node-level strategy's ring a cost per slot
(``handoff_s_per_slot``, :mod:`lmdbio.scale.costs`). A fit on ``bench read`` runs whose
slots hold 222-4,000 records cannot tell that cost from one per record (a slot of 80
records, imagenet's, pays it 25-50 times as often per record), so this probe measures it
apart, as ``bench/scale_calibrate.py --only copy`` measures the page accounting.

One process is the node's reader and its only consumer (``mpiexec -n 1``; a colocated
node, as every rank of the calibration's 1- and 2-rank runs is: one rank per simulated
node); ``--ranks 2`` runs two such nodes at once, as the 2-rank runs do. Its slots go
through the ring all the same, as a node of several workers hands them over (a lone rank
hands its own slots of spans to itself in process: the model charges the hand-off only
to nodes of several ranks).

It opens a real :class:`~lmdbio.reader.ReadSession` on a calibration database (node-level strategy
``lmm``, records handed over by reference, page accounting on: ``bench read``'s
settings), then, for each slot size N of :data:`SLOT_RECORDS`, hands ``slots`` slots of N
records (the database's first N, their real spans) through the session's ring
as the session does (``ReadSession._publish_group``, by reference: acquire the slot, mark
the values' pages, write the spans, labels and key spans, the one worker's part, publish)
and takes each back as ``bench read``'s consumer does (:meth:`ReadSession.receive` with
the value check deferred, then ``release``). No record is walked, located or copied
(except in the copy measurement below): the cost is the ring's and the slot's bookkeeping.

CPU seconds (``process_time``) per slot: the whole cycle, timed around all the slots of a
size at once (``rounds`` interleaved rounds over the sizes, the fastest kept, the median
beside it), and its phases (each timed per slot in a separate pass, the timers' own cost
included). A least-squares line over the sizes gives the per-slot intercept and the
per-record slope (:func:`fit_line`).

Run: .venv/bin/python -m bench.ring_handoff OUT.json [--dbs cifar,imagenet] [--slots 400]
     [--ranks 1] (starts ``mpiexec -n RANKS`` itself; ``--worker`` is what each rank runs)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import BENCH_DATA, BIN, MPI_ENV, write_json

#: records per slot measured: an empty slot, a few, imagenet's 80, the 48 KB database's
#: 222, and the 2,000-4,000 of cifar's and mnist's slots
SLOT_RECORDS = (0, 1, 4, 16, 80, 222, 1000, 2000, 4000)
#: the phases of one slot's hand-off, in order
PHASES = ("acquire", "fill", "publish", "receive", "release")
#: the calibration databases (bench/read.py's and bench/scale_calibrate.py's 48 KB one)
DATABASES = ("cifar", "mnist", "imagenet", "size-48k")
#: per database, the consumer's batch and the batches per slot of its calibration runs
#: (bench/scale_calibrate.py, ``--batches-per-slot 0``: what the job chose), at which the
#: consumer's copy is measured in the cycle too
RUN_SLOTS = {"cifar": (32, 64), "mnist": (64, 64), "imagenet": (4, 20), "size-48k": (8, 31)}


def open_session(path: str, max_records: int) -> Any:
    """A 1-rank :class:`~lmdbio.reader.ReadSession` on ``path`` as ``bench read`` opens
    one (strategy lmm, colocated, record spans, page accounting on) whose ring slots hold
    up to ``max_records`` records (batches of 4, ``max_records / 4`` per slot)."""
    from lmdbio.config import load_config
    from lmdbio.mpiutil import start_mpi
    from lmdbio.reader import ReadSession
    from lmdbio.run_plan import ReadTuning, RunPlan
    from lmdbio.topology import Topology

    MPI = start_mpi()
    nodes = MPI.COMM_WORLD.Get_size()  # one rank per simulated node, as the calibration's
    topo = Topology.build(MPI.COMM_WORLD, simulate_nodes=nodes, mode="colocated")
    cfg = load_config({
        "dataset": {"path": path},
        "batch": {"size": 4, "last": "drop"},
        "readers": {"strategy": "lmm", "mode": "colocated", "prefetch_depth": 4,
                    "batches_per_slot": max(1, max_records // 4), "transfer": "spans"},
        "topology": {"simulate_nodes": nodes},
    })
    run_plan = RunPlan.resolve(cfg, topo, purpose="bench", tuning=ReadTuning(accounting=True))
    session = ReadSession(path, topo, run_plan)
    # through the ring, as on a node of several workers (the model's only hand-off): a lone
    # rank's own slots of spans no longer take it (ReadSession.hands_to_itself)
    session.alone_on_ring = False
    return session


def slot_cycle(session: Any, refs: Any, labels: np.ndarray, parts: np.ndarray,
               flags: int, copy_batch: int = 0) -> Callable[[int, Callable[[], None]], None]:
    """One slot's hand-off through ``session``'s ring, as a function of the slot's
    iteration and a callback run between the phases (a timer, or nothing); with
    ``copy_batch``, the consumer also copies the slot's records into its own buffer
    ``copy_batch`` records at a time before it releases the slot, as ``bench read``'s
    consumer does (:class:`bench.kinds.read.BatchCopy`)."""
    from bench.kinds.read import BatchCopy

    assert session.ring is not None and session.by_reference
    own = BatchCopy()
    ring, accounting, psize = session.ring, session.db.accounting, session.db.psize
    key_spans = (refs.key_off, refs.key_len)

    def cycle(iteration: int, mark: Callable[[], None]) -> None:
        w = ring.acquire_slot(0, iteration)
        mark()
        accounting.mark_values(refs, psize)
        w.set_spans(refs.val_off, refs.val_len, labels, key_spans=key_spans)
        w.set_parts(parts)
        mark()
        w.publish(codec="none", flags=flags)
        mark()
        got = session.receive(defer_value_check=True)
        if copy_batch:
            own.gather_batches(got, copy_batch)
        mark()
        got.release()
        mark()

    return cycle


def measure_db(path: str, slots: int, rounds: int, run_slot: tuple[int, int]
               ) -> dict[str, Any]:
    """Every slot size of :data:`SLOT_RECORDS` on the database at ``path`` (see the module
    docstring): per size the CPU seconds per slot of each round, the fastest, the median,
    and the phases' shares; and at the slot of the database's calibration runs
    (``run_slot``: batch, batches per slot) the cycle with the consumer's copy against
    the cycle without it, as CPU seconds per byte copied."""
    from lmdbio.ring_setup import SLOT_BATCHES_SHIFT

    session = open_session(path, max(*SLOT_RECORDS, run_slot[0] * run_slot[1]))
    table = session.db.record_table()
    n = len(session.db)
    cycles = {}
    for size in SLOT_RECORDS:
        idx = np.arange(size) % n
        refs = table.refs(idx)
        batches = max(1, size // 4)
        cycles[size] = slot_cycle(session, refs, idx.astype(np.int64),
                                  np.array([size], np.int64),
                                  batches << SLOT_BATCHES_SHIFT if batches > 1 else 0)
    seq = 0

    def nothing() -> None:
        return None

    for size in SLOT_RECORDS:  # warm: the kernels loaded, the ring's pages mapped
        for _ in range(20):
            cycles[size](seq, nothing)
            seq += 1
    totals: dict[int, list[float]] = {s: [] for s in SLOT_RECORDS}
    for _ in range(rounds):
        for size in SLOT_RECORDS:
            t0 = time.process_time()
            for _ in range(slots):
                cycles[size](seq, nothing)
                seq += 1
            totals[size].append((time.process_time() - t0) / slots)
    phases: dict[int, dict[str, float]] = {}
    for size in SLOT_RECORDS:
        spent = np.zeros(len(PHASES))
        clock = [0.0, 0]

        def mark(spent: np.ndarray = spent, clock: list = clock) -> None:
            now = time.process_time()
            spent[clock[1]] += now - clock[0]
            clock[0], clock[1] = now, (clock[1] + 1) % len(PHASES)

        for _ in range(slots):
            clock[0] = time.process_time()
            cycles[size](seq, mark)
            seq += 1
        phases[size] = {p: float(v / slots) for p, v in zip(PHASES, spent, strict=True)}
    copy = copy_in_cycle(session, table, run_slot, slots, rounds, seq)
    psize = session.db.psize
    session.stop()
    session.close()
    return {"records": n, "record_bytes": float(np.mean(table.val_len)),
            "pages_per_record": float(np.mean((table.val_len + psize - 1) // psize)),
            "sizes": [{"records_per_slot": s, "cpu_s_per_slot": min(totals[s]),
                       "cpu_s_per_slot_median": statistics.median(totals[s]),
                       "cpu_s_per_slot_rounds": totals[s], "phases_s": phases[s]}
                      for s in SLOT_RECORDS], "copy": copy}


def copy_in_cycle(session: Any, table: Any, run_slot: tuple[int, int], slots: int,
                  rounds: int, seq: int) -> dict[str, Any]:
    """The consumer's copy inside the slot cycle (see :func:`measure_db`): slots of the
    calibration runs' size, the cycle with and without the copy interleaved ``rounds``
    times (fewer slots when a slot is large: about 2.4 GB copied per round), the fastest
    of each kept."""
    from lmdbio.ring_setup import SLOT_BATCHES_SHIFT

    batch, per_slot = run_slot
    size = batch * per_slot
    idx = np.arange(size) % len(session.db)
    refs = table.refs(idx)
    slot_bytes = int(refs.val_len.sum())
    count = max(10, min(slots, int(2.4e9 // max(slot_bytes, 1))))
    args = (session, refs, idx.astype(np.int64), np.array([size], np.int64),
            per_slot << SLOT_BATCHES_SHIFT)
    cycles = {"without": slot_cycle(*args), "with": slot_cycle(*args, copy_batch=batch)}
    best = {k: float("inf") for k in cycles}

    def nothing() -> None:
        return None

    for cycle in cycles.values():  # warm: the buffer grown, the pages mapped
        for _ in range(3):
            cycle(seq, nothing)
            seq += 1
    for _ in range(rounds):
        for name, cycle in cycles.items():
            t0 = time.process_time()
            for _ in range(count):
                cycle(seq, nothing)
                seq += 1
            best[name] = min(best[name], (time.process_time() - t0) / count)
    return {"batch": batch, "records_per_slot": size, "bytes_per_slot": slot_bytes,
            "slots": count, "cpu_s_per_slot_without": best["without"],
            "cpu_s_per_slot_with": best["with"],
            "s_per_byte": (best["with"] - best["without"]) / max(slot_bytes, 1)}


def fit_line(sizes: list[dict[str, Any]], key: str = "cpu_s_per_slot") -> dict[str, float]:
    """Least squares of CPU seconds per slot on records per slot: ``intercept_s`` (the
    slot's own cost) and ``slope_s_per_record``, with the largest relative residual."""
    x = np.array([s["records_per_slot"] for s in sizes], float)
    y = np.array([s[key] for s in sizes], float)
    slope, intercept = np.polyfit(x, y, 1)
    fitted = intercept + slope * x
    return {"intercept_s": float(intercept), "slope_s_per_record": float(slope),
            "worst_residual": float(np.max(np.abs(y - fitted) / y))}


def worker(out: Path, dbs: list[str], data: Path, slots: int, rounds: int) -> None:
    """Each rank's side (under ``mpiexec -n R``, every rank its own simulated node and
    ring, all measuring at once as the calibration's R-rank runs read): every database;
    rank 0 writes ``out`` with its own figures at the top and every other rank's under
    ``other_ranks``."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    result: dict[str, Any] = {"slots": slots, "rounds": rounds, "ranks": world.Get_size(),
                              "loadavg_before": os.getloadavg(),
                              "started_utc": time.strftime("%H:%M:%S", time.gmtime())}
    for name in dbs:
        got = measure_db(str(data / f"read-{name}"), slots, rounds, RUN_SLOTS[name])
        got["fit"] = fit_line(got["sizes"])
        got["fit_median"] = fit_line(got["sizes"], "cpu_s_per_slot_median")
        result[name] = got
    result["loadavg_after"] = os.getloadavg()
    result["ended_utc"] = time.strftime("%H:%M:%S", time.gmtime())
    everyone = world.gather(result, root=0)
    if everyone is not None:  # rank 0
        result["other_ranks"] = everyone[1:]
        write_json(out, result, default=float)


def run(out: Path, dbs: list[str], data: Path = BENCH_DATA, slots: int = 400,
        rounds: int = 3, ranks: int = 1) -> dict[str, Any]:
    """The probe under ``mpiexec -n ranks`` into ``out`` (kept: reused if there)."""
    if not out.exists():
        cmd = [str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "python"), "-m",
               "bench.ring_handoff",
               str(out), "--worker", "--dbs", ",".join(dbs), "--data", str(data),
               "--slots", str(slots), "--rounds", str(rounds)]
        subprocess.run(cmd, env=dict(os.environ, **MPI_ENV), check=True, timeout=600)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def handoff_s_per_slot(probe: dict[str, Any]) -> float:
    """The model's ``handoff_s_per_slot`` from a probe result: the median over its
    databases of the fitted per-slot intercept (the fastest rounds')."""
    return float(statistics.median(v["fit"]["intercept_s"] for v in probe.values()
                                   if isinstance(v, dict) and "fit" in v))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--dbs", default=",".join(DATABASES))
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--slots", type=int, default=400, help="slots per size and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=1,
                        help="ranks measuring at once, each its own simulated node (2: as "
                             "the calibration's 2-rank runs)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    dbs = args.dbs.split(",")
    if args.worker:
        worker(Path(args.out), dbs, Path(args.data), args.slots, args.rounds)
        return 0
    data = run(Path(args.out), dbs, Path(args.data), args.slots, args.rounds, args.ranks)
    for name in dbs:
        got = data[name]
        fit = got["fit"]
        print(f"{name:9s} {got['record_bytes']:8.0f} B/record: per slot "
              f"{fit['intercept_s'] * 1e6:6.1f} us + {fit['slope_s_per_record'] * 1e9:6.1f} ns "
              f"per record (worst residual {fit['worst_residual']:.0%}); the consumer's copy "
              f"in the cycle {got['copy']['s_per_byte'] * 1e9:.3f} ns/B at "
              f"{got['copy']['records_per_slot']} records a slot", flush=True)
        for s in got["sizes"]:
            ph = "  ".join(f"{p} {v * 1e6:6.1f}" for p, v in s["phases_s"].items())
            print(f"   {s['records_per_slot']:5d} records: {s['cpu_s_per_slot'] * 1e6:7.1f} us "
                  f"(median {s['cpu_s_per_slot_median'] * 1e6:7.1f})  phases, us: {ph}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
