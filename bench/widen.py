"""Widening uint8 pixels into float32 batches: ordinary against streaming stores.

What a worker does with every raw Caffe Datum batch when the transform is the identity
(``loaders.decode.uniform_datums_float32``), timed with its own code: records gathered from
a packed buffer of generated Datums (random pixels) into a float32 batch taken in turn from
``buffers`` reused arrays (the loader's buffer pool keeps two alive: the batch the trainer
holds and the one decoded ahead), by ``procs`` processes at once (the workers of a host share
its last-level cache and memory bandwidth). Each case runs both store kinds, interleaved,
``--repeat`` times; the figure is microseconds per image (median over processes and
repeats) and the ratio ordinary / streaming (above 1: streaming is faster).

Shapes: ``imagenet`` 32 x 3x224x224 (19.3 MB per batch: the service benchmark's ImageNet-like
worker batch) and ``cifar`` 128 x 3x32x32 (1.6 MB: below
``loaders.stores.MIN_BYTES``, where the loader keeps ordinary stores by default). Each process
fixes the store kind (``loaders.stores.set_policy``); the loader's default, ``auto``, times
both on the job's own batches (``LMDBIO_STREAMING_STORES``, ``loaders.stores``).

Writes bench/results/widen.json.
Run: .venv/bin/python -m bench.widen [--repeat 2] [--seconds 3]   (from the repository root)
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

from bench.common import NUMBA_CACHE, RESULTS, write_json

SHAPES = {"imagenet": ((3, 224, 224), 32, 600), "cifar": ((3, 32, 32), 128, 20_000)}
#: (shape, buffers per process, processes): 4 processes of 2 buffers is the service
#: benchmark's 8-rank host (4 workers, each holding a batch and decoding the next)
CASES = [("imagenet", 2, 1), ("imagenet", 2, 2), ("imagenet", 4, 2), ("imagenet", 2, 4),
         ("cifar", 2, 2), ("cifar", 2, 4)]


def child(shape_name: str, buffers: int, streaming: bool, seconds: float, seed: int) -> None:
    """One process: time ``uniform_datums_float32`` for ``seconds``; prints JSON."""
    import numpy as np

    import loaders.decode as dec
    import loaders.stores as stores
    from lmdbio.codecs.datum import datum_from_array, encode_datum
    from lmdbio.codecs.record_batch import pack_values

    shape, batch, records = SHAPES[shape_name]
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (records, *shape), dtype=np.uint8)
    buf, offsets, _ = pack_values([encode_datum(datum_from_array(p, i % 1000))
                                   for i, p in enumerate(pixels)])
    lengths = np.diff(np.r_[offsets, buf.size]).astype(np.int64)
    starts = np.asarray(offsets, np.int64)
    outs = [np.empty((batch, *shape), np.float32) for _ in range(buffers)]
    turn = [0]

    def alloc(s: tuple[int, ...], dt: Any) -> np.ndarray:
        turn[0] += 1
        return outs[turn[0] % buffers]

    stores.set_policy("always" if streaming else "never")
    ids = rng.integers(0, records, batch)
    got = dec.uniform_datums_float32(buf, starts[ids], alloc, lengths[ids])  # compile
    assert got is not None and np.array_equal(got[0], pixels[ids].astype(np.float32))
    for o in outs:  # every output page touched once before timing
        o.fill(0)
    spent, images, t0 = 0.0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ids = rng.choice(records, batch, replace=False)  # records in random order
        a = time.perf_counter()
        dec.uniform_datums_float32(buf, starts[ids], alloc, lengths[ids])
        spent += time.perf_counter() - a
        images += batch
    print(json.dumps({"us_per_image": 1e6 * spent / images, "images": images}))


def run_case(shape: str, buffers: int, procs: int, streaming: bool, seconds: float
             ) -> list[float]:
    """``procs`` children at once; their microseconds per image."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(NUMBA_CACHE)}
    cmd = [sys.executable, "-m", "bench.widen", "--child", shape, str(buffers), str(int(streaming)),
           str(seconds)]
    children = [subprocess.Popen([*cmd, str(k)], stdout=subprocess.PIPE, text=True, env=env)
                for k in range(procs)]
    out = []
    for c in children:
        text, _ = c.communicate(timeout=300)
        if c.returncode:
            raise SystemExit(f"child failed: {' '.join(cmd)}")
        out.append(json.loads(text.strip().splitlines()[-1])["us_per_image"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        shape, buffers, streaming, seconds, seed = args.child
        child(shape, int(buffers), bool(int(streaming)), float(seconds), int(seed))
        return 0
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "cpus": len(os.sched_getaffinity(0)),
                               "load_average": os.getloadavg(), "cases": []}
    for shape, buffers, procs in CASES:
        times: dict[str, list[float]] = {"ordinary": [], "streaming": []}
        for _ in range(args.repeat):
            for kind in ("ordinary", "streaming"):
                times[kind] += run_case(shape, buffers, procs, kind == "streaming",
                                        args.seconds)
        med = {k: statistics.median(v) for k, v in times.items()}
        case = {"shape": shape, "batch": SHAPES[shape][1], "image": SHAPES[shape][0],
                "buffers_per_process": buffers, "processes": procs,
                "us_per_image": med, "runs_us_per_image": times,
                "ratio_ordinary_over_streaming": med["ordinary"] / med["streaming"]}
        results["cases"].append(case)
        print(f"{shape:8} buffers {buffers} processes {procs}: ordinary "
              f"{med['ordinary']:.1f} us/image, streaming {med['streaming']:.1f} "
              f"({case['ratio_ordinary_over_streaming']:.2f}x)", flush=True)
    write_json(Path(args.out) / "widen.json", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
