"""The per-rank py-lmdb loop users compare lmdbio with: every rank reads its own records.

Part of the package because ``lmdbio demo`` (``make run``) compares the loader with it in
the same run; the service benchmarks (bench/service.py, bench/peers.py) run it too.

This is how PyTorch (a ``Dataset`` over an LMDB with a ``DistributedSampler``) and Caffe's
per-rank data layers read: run it under ``mpiexec`` beside ``lmdbio run`` on the same
database, with the per-worker batch size and the number of batches ``lmdbio run`` delivered
per worker. Every rank

* opens the environment with py-lmdb (read-only, no lock) and lists the keys once with a
  cursor (startup, reported apart);
* per epoch, takes PyTorch's ``DistributedSampler`` order: a permutation seeded with
  ``seed + epoch``, padded by wrapping to a multiple of the world size, then
  ``indices[rank::world]`` (numpy's generator stands in for torch's: same scheme, another
  random stream), in batches of ``--batch-size`` with ``DataLoader(drop_last=True)``
  semantics (an epoch's last, partial batch is dropped: every batch is full, as lmdbio's);
* per batch, per record (what a ``Dataset.__getitem__`` does): ``txn.get(key)``, parse the
  Caffe ``Datum`` (protobuf's compiled parser for the ``caffe.proto`` message when the
  ``protobuf`` package is installed, as ``caffe_pb2.Datum().ParseFromString``; otherwise
  lmdbio's pure-Python parser), ``np.frombuffer(datum.data).reshape(C, H, W)``; then stacks
  the batch (the default collate) and converts it to float32 as a whole (lmdbio's workers
  also receive float32: Caffe's transform output), multiplied in place by ``--scale S``
  where given (the output of lmdbio's ``transform.scale``);
* with ``--step-seconds S`` sleeps ``S`` per batch (the trainer's compute) and reports the
  share of time spent getting batches (the baseline reads synchronously, in the loop).

One read transaction stays open for the whole run (cheaper than the common
``env.begin()`` per ``__getitem__``: the baseline is given its best case). Rank 0 prints and
optionally writes (``--json OUT``) a JSON document with per-rank and total figures, in
steady state (after ``--warmup`` batches per rank) and over the whole run.

Run: ``mpiexec -n 8 python -m lmdbio.pylmdb_per_rank DB --batch-size 64 --batches 300
--json out.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.codecs.datum import decode_datum
from lmdbio.commands.run import minor_page_faults, process_age
from lmdbio.mpiutil import start_mpi

#: caffe.proto's Datum, field for field (proto2)
_DATUM_FIELDS = (
    ("channels", 1, "TYPE_INT32"), ("height", 2, "TYPE_INT32"), ("width", 3, "TYPE_INT32"),
    ("data", 4, "TYPE_BYTES"), ("label", 5, "TYPE_INT32"), ("float_data", 6, "TYPE_FLOAT"),
    ("encoded", 7, "TYPE_BOOL"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory of Caffe Datum records")
    parser.add_argument("--batch-size", type=int, required=True,
                        help="records per batch per rank (lmdbio's per-worker batch)")
    parser.add_argument("--batches", type=int, required=True,
                        help="batches per rank (lmdbio's batches per worker)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2,
                        help="batches per rank left out of the steady-state figures")
    parser.add_argument("--step-seconds", type=float, default=0.0, metavar="S",
                        help="sleep S seconds per batch (the trainer's compute)")
    parser.add_argument("--parser", choices=["auto", "protobuf", "python"], default="auto",
                        help="Datum parser: protobuf's compiled one (auto when installed) or "
                        "lmdbio's pure-Python decode_datum")
    parser.add_argument("--uint8", action="store_true",
                        help="keep batches uint8 (skip the whole-batch float32 conversion)")
    parser.add_argument("--scale", type=float, default=None, metavar="S",
                        help="multiply each float32 batch by S in place (Caffe's "
                        "transform_param scale, e.g. 0.00390625): the output lmdbio's "
                        "workers deliver under transform.scale; default: no scaling")
    parser.add_argument("--json", metavar="OUT", default=None)


def protobuf_datum_class() -> type | None:
    """The ``caffe.Datum`` message class built from its descriptor (no ``protoc`` needed), or
    None without the ``protobuf`` package."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        return None
    fdp = descriptor_pb2.FileDescriptorProto(name="lmdbio_bench_caffe.proto",
                                             package="caffe", syntax="proto2")
    msg = fdp.message_type.add(name="Datum")
    F = descriptor_pb2.FieldDescriptorProto
    for name, number, kind in _DATUM_FIELDS:
        label = F.LABEL_REPEATED if name == "float_data" else F.LABEL_OPTIONAL
        msg.field.add(name=name, number=number, type=getattr(F, kind), label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe.Datum"))


def make_getitem(kind: str) -> tuple[str, Callable[[bytes], tuple[np.ndarray, int]]]:
    """The per-record decode of a PyTorch ``Dataset.__getitem__``: value -> (CHW array, label).
    """
    cls = protobuf_datum_class() if kind in ("auto", "protobuf") else None
    if kind == "protobuf" and cls is None:
        raise SystemExit("--parser protobuf: the protobuf package is not installed")
    if cls is not None:
        def getitem(value: bytes) -> tuple[np.ndarray, int]:
            d = cls()
            d.ParseFromString(value)
            return np.frombuffer(d.data, np.uint8).reshape(d.channels, d.height, d.width), \
                d.label

        import google.protobuf
        from google.protobuf.internal import api_implementation

        return (f"protobuf {google.protobuf.__version__} ({api_implementation.Type()})",
                getitem)
    def getitem_py(value: bytes) -> tuple[np.ndarray, int]:
        d = decode_datum(value)
        return np.frombuffer(d.data, np.uint8).reshape(d.channels, d.height, d.width), d.label

    return "lmdbio.codecs.datum.decode_datum (pure Python)", getitem_py


def sampler_indices(n: int, world: int, rank: int, seed: int, epoch: int) -> np.ndarray:
    """PyTorch ``DistributedSampler(shuffle=True, drop_last=False)``'s indices for a rank."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    total = -(-n // world) * world
    if total > n:
        order = np.concatenate([order, np.resize(order, total - n)])
    return order[rank:total:world]


@dataclass
class LoopRecord:
    """What one rank's batch loop measured: ``marks`` holds, per batch, the wall time after
    it, the samples so far and the seconds spent getting batches so far."""

    marks: list[tuple[float, int, float]]
    samples: int
    nbytes: int
    t_start: float
    t_end: float
    cpu_start: float
    cpu_end: float
    cpu_at_warmup: float | None
    faults_start: int


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Collective over ``COMM_WORLD``: every rank reads its batches as PyTorch would.

    Rank 0 returns ``{"totals": ..., "per_rank": [...]}`` (the JSON document); the other
    ranks return None.
    """
    import lmdb

    MPI = start_mpi()  # mpi4py's module

    age = process_age()  # interpreter start and imports, reported as startup
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    t0 = time.perf_counter()
    parser_name, getitem = make_getitem(args.parser)
    env = lmdb.open(str(args.path), readonly=True, lock=False, readahead=True,
                    subdir=Path(args.path).is_dir())
    txn = env.begin(buffers=False)
    keys = list(txn.cursor().iternext(keys=True, values=False))  # listed once, as Datasets do
    open_seconds = time.perf_counter() - t0
    loop = read_batches(world, txn, keys, getitem, args)
    txn.abort()
    env.close()
    faults = minor_page_faults() - loop.faults_start
    mine = rank_report(loop, int(args.warmup), rank, open_seconds, age, faults)
    every = world.gather(mine, root=0)
    if rank != 0:
        return None
    return {"totals": job_totals(every, args, len(keys), parser_name), "per_rank": every}


def collate(images: list[np.ndarray], uint8: bool, scale: np.float32 | None) -> np.ndarray:
    """One batch as the loop delivers it: the images stacked (PyTorch's default collate),
    converted to float32 unless ``uint8``, then multiplied by ``scale`` in place (the
    cheapest way a loop applies it) where given."""
    data = np.stack(images)
    if uint8:
        return data
    data = data.astype(np.float32)
    if scale is not None:
        data *= scale
    return data


def read_batches(world: Any, txn: Any, keys: list[bytes],
                 getitem: Callable[[bytes], tuple[np.ndarray, int]],
                 args: argparse.Namespace) -> LoopRecord:
    """The timed loop, collective over ``world`` (one barrier at its start): ``--batches``
    batches of the sampler's records, each read record by record (``txn.get`` and
    ``getitem``), stacked, made float32 unless ``--uint8``, then ``--step-seconds`` of sleep.
    """
    rank, size = world.Get_rank(), world.Get_size()
    n = len(keys)
    bs, want = int(args.batch_size), int(args.batches)
    step = float(args.step_seconds)
    scale = None if args.scale is None else np.float32(args.scale)
    samples = nbytes = 0
    in_get = 0.0
    marks: list[tuple[float, int, float]] = []
    cpu_at_warmup = None
    epoch = 0
    idx = sampler_indices(n, size, rank, args.seed, epoch)
    if bs > idx.shape[0]:
        raise SystemExit(f"--batch-size {bs} is larger than a rank's share of the {n} "
                         f"records ({idx.shape[0]} at {size} ranks)")
    pos = 0
    world.Barrier()
    t_start, cpu_start = time.perf_counter(), time.process_time()
    faults_start = minor_page_faults()
    for _ in range(want):
        tg = time.perf_counter()
        if pos + bs > idx.shape[0]:  # DataLoader(drop_last=True): full batches only
            epoch += 1
            idx, pos = sampler_indices(n, size, rank, args.seed, epoch), 0
        take = idx[pos:pos + bs].tolist()
        pos += bs
        images, labels = [], []
        for i in take:  # the Dataset, record by record
            value = txn.get(keys[i])
            nbytes += len(value)
            img, label = getitem(value)
            images.append(img)
            labels.append(label)
        data = collate(images, args.uint8, scale)
        label_arr = np.asarray(labels, np.int64)
        samples += data.shape[0]
        in_get += time.perf_counter() - tg
        del label_arr
        if step > 0:
            time.sleep(step)
        marks.append((time.perf_counter(), samples, in_get))
        if len(marks) == args.warmup:  # CPU time only where the window opens and ends
            cpu_at_warmup = time.process_time()
    t_end, cpu_end = time.perf_counter(), time.process_time()
    return LoopRecord(marks, samples, nbytes, t_start, t_end, cpu_start, cpu_end,
                      cpu_at_warmup, faults_start)


def rank_report(loop: LoopRecord, warmup: int, rank: int, open_seconds: float,
                to_open: float | None, minor_page_faults: int) -> dict[str, Any]:
    """One rank's figures over the whole loop and, after ``warmup`` batches, in steady state
    (``"steady"``: None when the loop ran no more batches than the warmup)."""
    mine: dict[str, Any] = {
        "rank": rank, "batches": len(loop.marks), "samples": loop.samples,
        "bytes": loop.nbytes, "seconds": loop.t_end - loop.t_start,
        "open_seconds": open_seconds, "cpu_seconds": loop.cpu_end - loop.cpu_start,
        "to_open": to_open, "minor_page_faults": minor_page_faults,
        "samples_per_second": (loop.samples / (loop.t_end - loop.t_start)
                               if loop.t_end > loop.t_start else 0.0),
        "steady": None,
    }
    marks, w = loop.marks, max(0, warmup)
    if len(marks) > w:
        s0 = (loop.t_start, 0, 0.0) if w == 0 else marks[w - 1]
        s1 = marks[-1]
        # the loop notes the CPU time when the warmup's last batch ends (always, if w > 0)
        cpu0 = loop.cpu_start if w == 0 or loop.cpu_at_warmup is None else loop.cpu_at_warmup
        secs = s1[0] - s0[0]
        mine["steady"] = {
            "batches": len(marks) - w, "samples": s1[1] - s0[1], "seconds": secs,
            "loader_seconds": s1[2] - s0[2], "cpu_seconds": loop.cpu_end - cpu0,
            "samples_per_second": (s1[1] - s0[1]) / secs if secs > 0 else 0.0,
            "seconds_per_batch": secs / (len(marks) - w),
            "loader_fraction": (s1[2] - s0[2]) / secs if secs > 0 else 0.0,
        }
    return mine


def job_totals(every: list[dict[str, Any]], args: argparse.Namespace, n_records: int,
               parser_name: str) -> dict[str, Any]:
    """The job's figures from every rank's :func:`rank_report`: samples summed, seconds the
    slowest rank's; ``"steady"`` only when every rank has a steady state."""
    size = len(every)
    total: dict[str, Any] = {
        "ranks": size, "consuming_ranks": size, "batch_size_per_rank": int(args.batch_size),
        "batches_per_rank": int(args.batches), "records": n_records, "parser": parser_name,
        "step_seconds": float(args.step_seconds), "float32": not args.uint8,
        "scale": None if args.uint8 or args.scale is None else float(args.scale),
        "samples": sum(r["samples"] for r in every),
        "seconds": max(r["seconds"] for r in every),
        "open_seconds_max": max(r["open_seconds"] for r in every),
        "to_open_max": max((r["to_open"] for r in every if r["to_open"] is not None),
                           default=None),
    }
    total["samples_per_second"] = total["samples"] / total["seconds"]
    total["cpu_seconds"] = sum(r["cpu_seconds"] for r in every)
    total["cpu_microseconds_per_sample"] = 1e6 * total["cpu_seconds"] / max(total["samples"], 1)
    steady = [r["steady"] for r in every]
    if all(steady):
        total["steady"] = steady_totals(steady)
    return total


def steady_totals(steady: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's steady-state figures from every rank's: throughput over the slowest rank's
    window, loader fractions averaged and at their worst."""
    size = len(steady)
    secs = max(s["seconds"] for s in steady)
    smp = sum(s["samples"] for s in steady)
    totals = {
        "samples": smp, "seconds": secs,
        "samples_per_second": smp / secs if secs > 0 else 0.0,
        "samples_per_second_per_rank": smp / secs / size if secs > 0 else 0.0,
        "seconds_per_batch_mean": sum(s["seconds_per_batch"] for s in steady) / size,
        "loader_fraction_mean": sum(s["loader_fraction"] for s in steady) / size,
        "loader_fraction_max": max(s["loader_fraction"] for s in steady),
        "cpu_seconds": sum(s["cpu_seconds"] for s in steady),
    }
    totals["cpu_microseconds_per_sample"] = 1e6 * totals["cpu_seconds"] / max(smp, 1)
    return totals


def main(args: argparse.Namespace) -> int:
    result = run(args)
    if result is None:
        return 0
    t = result["totals"]
    line = (f"[baseline] {t['ranks']} ranks: {t['samples']} samples in {t['seconds']:.2f} s "
            f"({t['samples_per_second']:.0f} samples/s)")
    if "steady" in t:
        st = t["steady"]
        line += (f"; steady state {st['samples_per_second']:.0f} samples/s "
                 f"({st['samples_per_second_per_rank']:.0f} per rank), getting batches "
                 f"{100 * st['loader_fraction_mean']:.1f}% of the time")
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    import sys

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    sys.exit(main(p.parse_args()))
