"""``mpiexec -n R lmdbio bench read PATH --strategy S``: parallel reading, measured.

Every rank builds the topology (``--simulate-nodes K`` splits the world into K groups of
consecutive ranks acting as nodes), the readers run the strategy for ``--iters`` iterations
and the consumers receive their batches (through node shared memory for the node-level
strategies). Rank 0 writes one JSON document: per iteration the missed and redundant
speculative pages summed over readers; per rank the global record indices it received in
delivery order, pages touched, pages holding its own records, extra pages, bytes and a time
breakdown; totals. ``--pylmdb`` adds, for the naive strategies, the same access pattern
through py-lmdb cursors (what Caffe and DALI run) as the wall-clock baseline.

Measuring on one host: ``PATH`` may contain ``{node}``, replaced by the rank's (simulated)
node number, so that every node reads its own byte-identical copy of the database and nodes
stop sharing one page cache (``bench/read.py`` makes the copies). ``--cold`` drops the file
from the page cache after the setup, just before the first iteration (every rank drops its
page-table entries, ``MADV_DONTNEED``, then each node's first rank ``POSIX_FADV_DONTNEED``);
The eviction is not counted in the whole run's time (``seconds.drop_cache``).
``--footprint`` counts, after the last iteration, the node's file pages resident in the page
cache (``mincore``): with ``--cold`` and per-node copies, the real I/O footprint of each
node, read-around included (``--advice random`` turns read-around off, as LMDB's
``MDB_NORDAHEAD`` does). ``--sequential`` times rank 0 reading the whole file with large
``pread`` calls after the run (cold again with ``--cold``): the physical limit to compare
with. Throughput is reported three ways: over the whole run (setup included), over the
iteration loop (after a barrier that follows the setup), and in steady state (each
consumer's batches after the first ``--warmup`` ones, on its own clock). The whole run
starts after every rank has imported lmdbio and loaded its compiled kernels from numba's
cache (:func:`lmdbio.kernel_cache.load_cached_kernels`; ~3 s of 8 oversubscribed ranks on 2
cores, reported as ``load_kernels_seconds``), as it starts after ``MPI_Init``: a training
process pays both once, whatever it reads. With numba's cache empty (a fresh checkout that
never ran a kernel) nothing can be loaded and the kernels compile at their first call,
inside the timed run: ``totals.kernels_loaded_min`` is then 0 and rank 0 warns on stderr
to run the command again.

Ring slots: the node-level strategies hand batches to their workers through a ring of
slots. By default a slot holds as many consecutive batches as a training job's default
(``--batches-per-slot 0``, :func:`lmdbio.ring_setup.choose_batches_per_slot`: 4,096 records
per worker when slots carry record spans, e.g. 47 batches of 64 CIFAR-sized records (the
48 MiB decoded-output cap); 16
batches with ``--transfer copy``), which LMM and the DM chains read with one walk and one
cursor hand-off; ``--batches-per-slot 1`` reads iteration by iteration. ``iterations``
then has one entry per slot, with its first iteration and its number of ``batches``.

Transfer: by default a slot carries each record's span in the database file (as a job's
``readers.transfer: auto`` does for Caffe records) and every worker copies its batch from
its own mapping of the file into its own buffer, with the compiled gather the naive
strategies' ranks copy their records with; ``--transfer copy`` has the reader copy the
records into the slot (the worker then checks the slot checksum, reading them).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.common import write_json
from lmdbio.commands import progress
from lmdbio.commands.argtypes import (
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
)
from lmdbio.plan.epoch import iteration_schedule, schedule_slots
from lmdbio.plan.strategies import STRATEGIES

if TYPE_CHECKING:
    from lmdbio.config import JobConfig
    from lmdbio.run_plan import ReadTuning


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory or data.mdb")
    parser.add_argument("--strategy", default="dm-spec", choices=list(STRATEGIES))
    parser.add_argument("--subdb", default=None, metavar="NAME",
                        help="read the named database NAME instead of the main one")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="records per consumer")
    parser.add_argument("--iters", type=positive_int, default=10,
                        help="iterations to run (default 10: a quick check). Throughput "
                             "comparisons need several epochs: `totals.seconds` includes "
                             "the setup, which node-level strategies pay more of")
    parser.add_argument("--simulate-nodes", type=non_negative_int, default=0)
    parser.add_argument("--mode", choices=["dedicated", "colocated"], default="colocated",
                        help="node-level strategies: colocated (default: every rank consumes, "
                             "one per node also reads, as in LMDBIO-LMM, so that every "
                             "strategy has the naive strategies' consumers and batches) or "
                             "dedicated (readers only read: a training job's default "
                             "`readers.mode`; half the ranks of a 2-rank node consume)")
    parser.add_argument("--shuffle", nargs="?", const="global", default="none",
                        choices=["none", "global", "block"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--last", choices=["pad", "drop", "partial"], default="pad")
    parser.add_argument("--prefetch-depth", type=positive_int, default=4)
    parser.add_argument("--batches-per-slot", type=non_negative_int, default=0,
                        help="node-level strategies: consecutive batches per ring slot, "
                             "read as one group (default 0: chosen from the batch, as a "
                             "training job's default `readers.batches_per_slot: 0`; 1: one "
                             "batch per slot, per-iteration figures for every iteration); "
                             "the `iterations` figures are per slot, each with its first "
                             "iteration and its `batches`")
    parser.add_argument("--no-symmetric", action="store_true",
                        help="do not map symmetrically (cursors travel as page numbers)")
    parser.add_argument("--pylmdb", action="store_true",
                        help="naive strategies: also time py-lmdb running the same pattern")
    parser.add_argument("--timeout", type=positive_float, default=120.0)
    parser.add_argument("--warmup", type=non_negative_int, default=2,
                        help="batches per consumer left out of the steady-state figures")
    parser.add_argument("--cold", action="store_true",
                        help="drop the file from the page cache after the setup")
    parser.add_argument("--advice", choices=["normal", "random", "sequential"], default=None,
                        help="madvise the database mapping on every rank after the setup "
                             "(random: no read-around on page faults, as LMDB's "
                             "MDB_NORDAHEAD; default: the session's choice, read-around "
                             "off for dm-spec and indexed, which ask for their pages)")
    parser.add_argument("--no-accounting", action="store_true",
                        help="no per-iteration page accounting (as a training job runs; "
                             "page fields are then 0, except dm-spec's own estimate)")
    parser.add_argument("--no-prefetch-advice", action="store_true",
                        help="dm-spec and indexed fault their pages in as read instead of "
                             "asking the kernel for them first (MADV_WILLNEED): the A/B of "
                             "the advice")
    parser.add_argument("--direct", action="store_true",
                        help="every (simulated) node reads its pages into its own cache with "
                             "O_DIRECT reads (nodes stop sharing the host's page cache; "
                             "the caches start empty after the setup and at every epoch)")
    parser.add_argument("--direct-read-around", type=non_negative_int, default=0,
                        metavar="KIB",
                        help="with --direct: every page a rank whose mapping keeps the "
                             "kernel's read-around faults in (the naive strategies, lmm, "
                             "dm-serial; see --advice) is read with the rest of its aligned "
                             "window of KIB KiB, as the kernel's read-around would on a "
                             "node of its own (128: Linux's default read_ahead_kb, the "
                             "scaling model's readahead_bytes); default 0: exactly the pages "
                             "touched, as with read-around off")
    parser.add_argument("--transfer", choices=["copy", "spans"], default="spans",
                        help="node-level strategies: the ring slot carries each record's "
                             "span in the file and the worker reads the record from its "
                             "own mapping of it (default, as a job's `readers.transfer: "
                             "auto` for Caffe records; copy with --direct), or the reader "
                             "copies the records into the slot; either way the worker "
                             "reads every delivered byte (copying spans into its own "
                             "buffer, as naive ranks copy their records, or checking the "
                             "slot checksum)")
    parser.add_argument("--footprint", action="store_true",
                        help="count each node's resident file pages after the run (mincore)")
    parser.add_argument("--sequential", action="store_true",
                        help="rank 0 times a sequential read of the whole file after the run")
    parser.add_argument("--json", metavar="OUT", default=None, type=output_file)


class BatchCopy:
    """A consumer's own batch buffer, reused: a batch delivered as spans of the database
    mapping is copied into it, so that every consumer ends each batch with its records'
    bytes in its own memory, however they were delivered (copied records were read once
    already, by the slot checksum)."""

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)

    def gather_batches(self, got: Any, batch: int) -> int:
        """Copy a by-reference delivery one batch (``batch`` records) at a time into the
        same buffer, as a consumer takes a slot of several batches: each batch's bytes land
        in memory the size of one batch, as a naive rank's do, not in one slot-sized
        buffer; the values' overflow page headers are checked in the same pass
        (:meth:`~lmdbio.slot_receiver.Delivered.copy_batches`, one compiled call per slot).
        Returns the bytes copied."""
        step = max(int(batch), 1)
        nbytes = got.copy_batches(self.buf, step)
        if nbytes < 0:  # too small for a batch: grow to the slot's largest, copy again
            firsts = np.arange(0, got.lengths.shape[0], step)
            self.buf = np.empty(int(np.add.reduceat(got.lengths, firsts).max()), np.uint8)
            nbytes = got.copy_batches(self.buf, step)
        return nbytes


def _node_path(template: str, node: int) -> str:
    """The database of ``node``: ``{node}`` in the path is the node number."""
    return template.replace("{node}", str(node))


def _drop_from_cache(world: Any, session: Any, topo: Any, path: str) -> None:
    """Collective: evict the database file from the page cache. The kernel keeps pages that
    some process maps, so every rank first drops its own page-table entries."""
    from lmdbio.io import libc
    from lmdbio.io.prefetch import MADV_DONTNEED, drop_cache

    buf = session.db.buf
    if buf.shape[0]:
        libc.madvise(buf.ctypes.data, buf.shape[0], MADV_DONTNEED)
    world.Barrier()
    if topo.local_rank == 0:
        drop_cache(path)
    world.Barrier()


def _advise(session: Any, advice: str) -> None:
    """``madvise`` this rank's mapping of the database (read-around on page faults)."""
    from lmdbio.io import prefetch as pf

    session.db.advise_access({"normal": pf.MADV_NORMAL, "random": pf.MADV_RANDOM,
                              "sequential": pf.MADV_SEQUENTIAL}[advice])


def _sequential_read(path: str, cold: bool, direct: bool = False) -> dict[str, Any]:
    """Seconds to read the whole file front to back with 8 MiB ``pread`` calls (with
    ``O_DIRECT`` when ``direct``: the limit of the ``--direct`` runs)."""
    import mmap
    import os

    from lmdbio.io.prefetch import drop_cache
    from lmdbio.lmdb.snapshot import resolve_file

    file = str(resolve_file(path))
    if cold:
        drop_cache(file)
    buf = mmap.mmap(-1, 8 << 20)  # page aligned, as O_DIRECT needs
    mv = memoryview(buf)
    fd = os.open(file, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        t0 = time.perf_counter()
        total = 0
        while True:
            got = os.preadv(fd, [mv], total)
            if got <= 0:
                break
            total += got
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        mv.release()
        buf.close()
    return {"bytes": total, "seconds": seconds, "cold": cold, "direct": direct,
            "bytes_per_second": total / seconds if seconds else 0.0}


def bench_config(args: argparse.Namespace, path: str) -> JobConfig:
    """The measurement's flags as a job configuration, the loader's vocabulary: the
    records per consumer (``--batch-size``) are ``batch.size``, as a ``bench`` plan counts
    them; checked by :func:`~lmdbio.config.load_config`."""
    from lmdbio.config import load_config

    return load_config({
        "dataset": {"path": path, "subdb": args.subdb},
        "batch": {"size": args.batch_size, "last": args.last},
        "readers": {"strategy": args.strategy, "mode": args.mode,
                    "prefetch_depth": args.prefetch_depth,
                    "batches_per_slot": args.batches_per_slot, "transfer": args.transfer},
        "shuffle": {"mode": args.shuffle, "seed": args.seed},
        "topology": {"simulate_nodes": args.simulate_nodes},
    })


def bench_tuning(args: argparse.Namespace) -> ReadTuning:
    """The measurement's flags that a job configuration does not carry."""
    from lmdbio.run_plan import ReadTuning

    return ReadTuning(timeout=args.timeout, symmetric=not args.no_symmetric,
                      accounting=not args.no_accounting, direct_io=args.direct,
                      prefetch_advice=not args.no_prefetch_advice)


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    from lmdbio.kernel_cache import load_cached_kernels
    from lmdbio.mpiutil import abort_on_error, sleeping_barrier, start_mpi
    from lmdbio.reader import ReadSession
    from lmdbio.run_plan import RunPlan
    from lmdbio.topology import Topology

    MPI = start_mpi()  # mpi4py's module

    world = MPI.COMM_WORLD
    with abort_on_error():
        t0 = time.perf_counter()
        # before the clock, as the imports (see the module docstring)
        kernels_loaded = load_cached_kernels()
        load_kernels = time.perf_counter() - t0
        topo = Topology.build(world, simulate_nodes=args.simulate_nodes, mode=args.mode)
        path = _node_path(args.path, topo.node_index)
        run_plan = RunPlan.resolve(bench_config(args, path), topo, purpose="bench",
                                   tuning=bench_tuning(args))
        sleeping_barrier(world, args.timeout, "bench read barrier")
        t_start = time.perf_counter()
        c_start = time.process_time()
        session = ReadSession(path, topo, run_plan)
        per_epoch = session.epoch_iterations
        schedule = iteration_schedule(per_epoch, args.iters)
        # the iteration the run stops at in its last epoch, if inside it
        stops = {schedule[-1][0]: schedule[-1][1] + 1} if schedule and \
            schedule[-1][1] + 1 < per_epoch else {}
        session.begin_epoch(0, stop_iteration=stops.get(0, 0))
        records: list[np.ndarray] = []  # per delivery, in delivery order
        padding: list[np.ndarray] = []
        batch_times: list[float] = []  # one entry per delivery (a ring slot)
        batch_records: list[int] = []
        batch_bytes: list[int] = []
        batch_counts: list[int] = []  # batches in each delivery
        delivered_bytes = 0
        consumer_wait = 0.0
        consumes = (not session.shared) or topo.is_worker
        if args.advice:
            _advise(session, args.advice)
        around = 1  # pages per fault in the node's O_DIRECT cache (1: the page alone)
        # as the session would set the mapping's read-around without the node cache (and
        # lmdbio.scale's model reads faults): off for the strategies that ask for their
        # pages (dm-spec, indexed) unless --no-prefetch-advice, off with --advice random
        asks = session.cls.advises and not args.no_prefetch_advice
        if session.node_cache is not None and args.direct_read_around \
                and session.db.read_around and not asks:
            around = max(1, args.direct_read_around * 1024 // session.db.psize)
            session.node_cache.read_around_pages = around
        drop_seconds = 0.0  # the benchmark's own cache eviction: not part of the run
        drop_cpu = 0.0
        if args.cold:
            t0, c0 = time.perf_counter(), time.process_time()
            _drop_from_cache(world, session, topo, path)
            drop_seconds = time.perf_counter() - t0
            drop_cpu = time.process_time() - c0
        sleeping_barrier(world, args.timeout, "bench read barrier")
        t_loop = time.perf_counter()
        c_loop = time.process_time()

        own_copy = BatchCopy()
        # the bar of the batches delivered, drawn by the first consumer (the first worker
        # of a shared session, else rank 0) when the command asked for one
        first_consumer = consumes and (topo.worker_rank == 0 if session.shared
                                       else world.Get_rank() == 0)
        delivered = progress.bar(len(schedule), "delivered", " batches",
                                 show=first_consumer and progress.active())

        def take(got: Any) -> None:
            nonlocal delivered_bytes
            if got.lengths is not None:  # spans: the records into this consumer's memory
                nbytes = own_copy.gather_batches(got, args.batch_size)
            else:
                nbytes = int(got.offsets[-1])
            batch_times.append(time.perf_counter() - t_loop)
            # the ids as arrays, listed after the clock (copies: ring deliveries are fresh
            # arrays already, private ones and a lone ring's own slots may be views of the
            # epoch plan, not kept alive here)
            records.append(got.ids.copy())
            padding.append(got.padding.copy())
            batch_records.append(int(got.ids.size))
            batch_bytes.append(nbytes)
            batch_counts.append(int(got.batches))
            delivered_bytes += nbytes
            delivered.update(int(got.batches))
            got.release()

        for epoch, it, count in schedule_slots(schedule, session.batches_per_slot):
            if epoch != session.epoch:
                session.begin_epoch(epoch, stop_iteration=stops.get(epoch, 0))
            if session.reads:
                session.read_group(it, count)
            # a colocated reader consumes as it goes; dedicated workers drain below
            if consumes and (session.reads or not session.shared):
                t0 = time.perf_counter()
                got = session.receive(timeout=args.timeout, defer_value_check=True)
                consumer_wait += time.perf_counter() - t0
                assert got is not None
                take(got)
                del got
        if session.reads:
            session.stop()
        if consumes and session.shared and not session.reads:
            while True:
                t0 = time.perf_counter()
                got = session.receive(timeout=args.timeout, defer_value_check=True)
                consumer_wait += time.perf_counter() - t0
                if got is None:
                    break
                take(got)
            del got
        delivered.close()
        t_end = time.perf_counter()
        c_end = time.process_time()
        elapsed = t_end - t_start - drop_seconds
        delivered_ids = np.concatenate(records).tolist() if records else []
        delivered_padding = np.concatenate(padding).tolist() if padding else []
        sleeping_barrier(world, args.timeout, "bench read barrier")
        resident = None
        cache = session.node_cache
        direct = cache.stats() if cache is not None else None
        if cache is not None and topo.local_rank == 0:
            resident = cache.present_count()  # the node's O_DIRECT footprint
        elif args.footprint and topo.local_rank == 0:
            from lmdbio.io.prefetch import resident_count
            from lmdbio.lmdb.snapshot import resolve_file

            resident = resident_count(str(resolve_file(path)))
        baseline = None
        if args.pylmdb and not session.shared:
            from lmdbio.plan.pylmdb_baseline import run_pattern

            world.Barrier()
            baseline = run_pattern(path, session, schedule)
        totals = session.totals
        bits = (np.packbits(totals.touched.astype(bool)), np.packbits(totals.own.astype(bool))) \
            if session.reads and totals.touched.shape[0] > 1 else None
        mine = {
            "rank": topo.rank,
            "node": topo.node_index,
            "host": topo.hostname,
            "reader": session.reads,
            "worker": consumes,
            "records": delivered_ids,
            "padding": delivered_padding,
            "pages_touched": int(np.count_nonzero(totals.touched)),
            "own_pages": int(np.count_nonzero(totals.own)),
            "extra_pages": int(np.count_nonzero(totals.touched & ~totals.own.astype(bool))),
            # read once outside the iterations: a leaf directory, dm-spec's tree pages
            "setup_pages": int(np.count_nonzero(totals.setup)),
            "bytes_delivered": delivered_bytes,
            "bytes_read": int(sum(s["bytes"] for s in totals.iterations)),
            "seconds": {
                "total": elapsed,
                "load_kernels": load_kernels,
                "drop_cache": drop_seconds,
                "setup": totals.setup_seconds,
                "loop": t_end - t_loop,
                "consumer_wait": consumer_wait,
                **{k: float(sum(s["seconds"][k] for s in totals.iterations))
                   for k in ("prefetch", "wait_cursor", "walk", "copy")},
            },
            # this process's CPU time (user + system, every thread): with more ranks than
            # cores the ranks' summed CPU, not the loop's wall time, bounds the rate
            "cpu_seconds": {"setup": c_loop - c_start - drop_cpu, "loop": c_end - c_loop},
            "iterations": [{k: s[k] for k in ("iteration", "batches", "missed_pages",
                                              "missed_walk_pages", "redundant_pages",
                                              "prefetched_pages", "pages_touched",
                                              "own_pages", "extra_pages")}
                           for s in totals.iterations],
            "batch_seconds": batch_times,
            "batch_records": batch_records,
            "batch_bytes": batch_bytes,
            "batch_counts": batch_counts,
            "batches_per_slot": session.batches_per_slot,
            "read_around": bool(session.db.read_around),
            "spans": bool(session.by_reference),
            "kernels_loaded": kernels_loaded,
            # advice not sent: every page asked for was in the page cache already
            "resident_skips": session.strategy.resident_skips if session.reads else 0,
            "symmetric": totals.symmetric,
            "symmetric_attempts": totals.symmetric_attempts,
            # the whole mapping in the page tables when the session opened (a small file
            # warm then; --cold drops it from the cache afterwards all the same)
            "populated": totals.populated,
            "pylmdb_seconds": baseline,
            "resident_pages": resident,
            "direct_io": direct if direct is None else {**direct,
                                                        "read_around_pages": around},
        }
        n_records = len(session.db)
        psize = session.db.psize
        session.close()
        everyone = world.gather(mine, root=0)
        bitmaps = world.gather(bits, root=0)
        sequential = None
        if args.sequential:
            world.Barrier()
            if topo.rank == 0:
                sequential = _sequential_read(path, args.cold, args.direct)
    if topo.rank != 0:
        return None
    result = summarize(args, everyone, n_records, topo)
    if result["totals"]["kernels_loaded_min"] == 0:
        import sys

        print("lmdbio bench read: warning: numba's kernel cache was empty on some rank, so "
              "the kernels compiled inside the timed run; run the command again for "
              "throughput figures (totals.kernels_loaded_min == 0)", file=sys.stderr)
    _add_page_totals(result, everyone, bitmaps, psize)
    if sequential is not None:
        result["totals"]["sequential"] = sequential
        steady = result["totals"]["steady"]["bytes_per_second"]
        result["totals"]["ratio_to_sequential"] = steady / sequential["bytes_per_second"] \
            if sequential["bytes_per_second"] else None
    return result


def _steady(ranks: list[dict], warmup: int) -> dict[str, Any]:
    """Steady-state delivery: per consumer the deliveries after its first ``warmup``
    batches (whole ring slots: at least ``warmup`` batches are left out), timed on the
    consumer's own clock; the job takes as long as its slowest consumer."""
    seconds, recs, nbytes = 0.0, 0, 0
    for r in ranks:
        t = r["batch_seconds"]
        if not r["worker"]:
            continue
        counts = r.get("batch_counts") or [1] * len(t)
        w = int(np.searchsorted(np.cumsum(counts), max(warmup, 0))) + (warmup > 0) \
            if counts else 0
        if len(t) <= w:
            continue
        seconds = max(seconds, t[-1] - (t[w - 1] if w else 0.0))
        recs += sum(r["batch_records"][w:])
        nbytes += sum(r["batch_bytes"][w:])
    return {"warmup_batches": warmup, "seconds": seconds, "records": recs, "bytes": nbytes,
            "records_per_second": recs / seconds if seconds else 0.0,
            "bytes_per_second": nbytes / seconds if seconds else 0.0}


def _add_page_totals(result: dict, ranks: list[dict], bitmaps: list, psize: int) -> None:
    """Pages per node (the union over a node's readers: what one page cache holds) and over
    the job, from the readers' bitmaps; the per-node resident pages when measured."""
    per_node: dict[int, dict[str, Any]] = {}
    union_t = union_o = None
    for r, bits in zip(ranks, bitmaps, strict=True):
        node = per_node.setdefault(r["node"], {"node": r["node"], "touched": None,
                                               "own": None, "resident_pages": None})
        if r["resident_pages"] is not None:
            node["resident_pages"] = r["resident_pages"]
        if bits is None:
            continue
        t, o = bits
        node["touched"] = t if node["touched"] is None else node["touched"] | t
        node["own"] = o if node["own"] is None else node["own"] | o
        union_t = t if union_t is None else union_t | t
        union_o = o if union_o is None else union_o | o

    def count(b: np.ndarray | None) -> int:
        return int(np.unpackbits(b).sum()) if b is not None else 0

    nodes = []
    for k in sorted(per_node):
        d = per_node[k]
        touched, own = count(d["touched"]), count(d["own"])
        extra = count(d["touched"] & ~d["own"]) if d["touched"] is not None else 0
        nodes.append({"node": k, "pages_touched": touched, "own_pages": own,
                      "extra_pages": extra, "resident_pages": d["resident_pages"]})
    tot = result["totals"]
    tot["page_size"] = psize
    tot["per_node"] = nodes
    tot["node_pages_touched"] = sum(n["pages_touched"] for n in nodes)
    tot["node_extra_pages"] = sum(n["extra_pages"] for n in nodes)
    tot["pages_touched_union"] = count(union_t)
    tot["own_pages_union"] = count(union_o)
    res = [n["resident_pages"] for n in nodes if n["resident_pages"] is not None]
    tot["resident_pages"] = sum(res) if res else None


def _direct_totals(ranks: list[dict]) -> dict[str, Any]:
    """O_DIRECT reads summed over the ranks (``--direct``): calls, pages, bytes, and the
    largest time one rank spent in them."""
    stats = [r["direct_io"] for r in ranks if r["direct_io"]]
    return {"reads": sum(s["reads"] for s in stats), "pages": sum(s["pages"] for s in stats),
            "bytes": sum(s["bytes"] for s in stats),
            "max_rank_seconds": max((s["seconds"] for s in stats), default=0.0)}


def summarize(args: argparse.Namespace, ranks: list[dict], n_records: int, topo) -> dict:
    """The JSON document of the run from every rank's figures. ``iterations`` has one
    entry per read (every reader reads the same slots): ``iteration`` is the run's index of
    its first iteration (counted across epochs), ``epoch_iteration`` that iteration in its
    epoch, ``batches`` how many iterations it carried; page figures summed over readers."""
    iters: dict[int, dict] = {}
    for r in ranks:
        first = 0
        for k, s in enumerate(r["iterations"]):
            d = iters.setdefault(k, {"iteration": first, "epoch_iteration": s["iteration"],
                                     "batches": s["batches"], "missed_pages": 0,
                                     "missed_walk_pages": 0, "redundant_pages": 0,
                                     "prefetched_pages": 0, "own_pages": 0,
                                     "pages_touched": 0})
            first += s["batches"]
            for f in ("missed_pages", "missed_walk_pages", "redundant_pages",
                      "prefetched_pages", "own_pages", "pages_touched"):
                d[f] += s[f]
    wall = max(r["seconds"]["total"] for r in ranks)
    loop = max(r["seconds"]["loop"] for r in ranks)
    delivered = sum(len(r["records"]) for r in ranks)
    nbytes = sum(r["bytes_delivered"] for r in ranks)
    readers = [r for r in ranks if r["reader"]]
    baseline = [r["pylmdb_seconds"] for r in ranks if r["pylmdb_seconds"] is not None]
    hidden = ("iterations", "batch_seconds", "batch_records", "batch_bytes", "batch_counts")
    return {
        "benchmark": "read",
        "path": args.path,
        "subdb": args.subdb,
        "strategy": args.strategy,
        "ranks": topo.size,
        "nodes": topo.n_nodes,
        "mode": args.mode,
        "readers": len(readers),
        "batch_size": args.batch_size,
        "shuffle": args.shuffle,
        "seed": args.seed,
        "last": args.last,
        "cold": args.cold,
        "direct": args.direct,
        "direct_read_around_kib": args.direct_read_around if args.direct else None,
        "advice": args.advice,
        "prefetch_advice": not args.no_prefetch_advice,
        "batches_per_slot": max((r.get("batches_per_slot", 1) for r in ranks), default=1),
        # whether the readers' mappings kept the kernel's read-around (RunPlan's
        # read_around "auto": off for dm-spec and indexed; --advice sets it for every rank)
        "read_around": all(r.get("read_around", True) for r in ranks if r["reader"]),
        "accounting": not args.no_accounting,
        # how the node rings carried records: "spans" when the readers handed out spans
        "transfer": "spans" if any(r.get("spans") for r in ranks) else "copy",
        "records_in_database": n_records,
        "iterations": [iters[k] for k in sorted(iters)],
        "per_rank": [{k: v for k, v in r.items() if k not in hidden} for r in ranks],
        "totals": {
            "records_delivered": delivered,
            "seconds": wall,
            "records_per_second": delivered / wall if wall else 0.0,
            "bytes_per_second": nbytes / wall if wall else 0.0,
            "loop_seconds": loop,
            # not in `seconds`: each rank loading its compiled kernels before the clock
            "load_kernels_seconds": max(r["seconds"]["load_kernels"] for r in ranks),
            # 0 on some rank: numba's cache was empty there, and the kernels compiled at
            # their first call, inside the timed run (seconds each): run the command again
            "kernels_loaded_min": min(r.get("kernels_loaded", 0) for r in ranks),
            "loop_records_per_second": delivered / loop if loop else 0.0,
            # every rank's CPU time summed (see per_rank cpu_seconds)
            "cpu_seconds": {k: sum(r["cpu_seconds"][k] for r in ranks)
                            for k in ("setup", "loop")},
            "loop_bytes_per_second": nbytes / loop if loop else 0.0,
            "steady": _steady(ranks, args.warmup),
            "extra_pages": sum(r["extra_pages"] for r in readers),
            "setup_pages": sum(r["setup_pages"] for r in readers),
            "needed_pages": sum(r["own_pages"] for r in readers),
            "pages_touched": sum(r["pages_touched"] for r in readers),
            "symmetric_mapping_attempts": max((r["symmetric_attempts"] for r in readers),
                                              default=0),
            "symmetric_mapping": all(r["symmetric"] for r in readers)
            if STRATEGIES[args.strategy].chained else None,
            "direct_io": _direct_totals(ranks) if args.direct else None,
            "pylmdb_seconds": max(baseline) if baseline else None,
            "pylmdb_ratio": max(baseline) / loop if baseline and loop else None,
            "pylmdb_records_per_second": delivered / max(baseline)
            if baseline and max(baseline) else None,
        },
    }


def main(args: argparse.Namespace) -> int:
    result = run(args)
    if result is not None:
        def default(o: Any) -> Any:
            return o.tolist() if isinstance(o, np.ndarray) else str(o)

        if args.json:
            write_json(args.json, result, indent=1, default=default)
        else:
            print(json.dumps(result, indent=1, default=default))
    return 0
