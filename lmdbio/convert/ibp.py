"""``lmdbio convert SRC DST --layout ibp``: rows packed with IBP, a group of rows per record.

Sources: a ``.npy`` file (N x ...), a ``.npz`` file (``--array-key``, default the first of
``data``/``X``/``x``/``features``/the only array; labels from ``--label-key``, default
``labels``/``y``/``target`` when present), or a bundled data set: ``sklearn:digits``,
``sklearn:breast_cancer``, ``sklearn:wine``, ``sklearn:iris``, ``sklearn:diabetes`` (with
their targets) and ``skimage:lfw`` (scikit-image's ``lfw_subset``: 200 25x25 images, the
first 100 faces -- label 1 -- and 100 non-faces -- label 0, as its documentation says).
Bundled sets are converted to float32 unless ``--dtype`` says otherwise; files keep their
dtype.

The model is fitted once (``--sample`` fraction, ``--clusters``), then every record holds
``--rows-per-record`` rows as one condensed frame (see :mod:`lmdbio.codecs.ibp.packed`, with
a CRC-32 unless ``--no-checksum``) plus their labels. Keys are ``%010d`` record numbers.
The model is stored base64-encoded in the ``lmdbio.json`` sidecar (``meta["ibp"]["model"]``),
read back with :func:`~lmdbio.codecs.ibp.format.load_model`.

The record's bytes are declared in :mod:`lmdbio.codecs.ibp.format` (with the parser and
the decoder readers use); this module only makes records.
"""

from __future__ import annotations

import argparse
import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.codecs import ibp
from lmdbio.codecs.ibp.format import KEY_FORMAT, encode_record
from lmdbio.convert.writer import write_records
from lmdbio.dataset_meta import write_dataset_meta
from lmdbio.errors import LmdbioError

BUNDLED = ("sklearn:digits", "sklearn:breast_cancer", "sklearn:wine", "sklearn:iris",
           "sklearn:diabetes", "skimage:lfw")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ibp layout."""
    parser.add_argument("--chunk-bytes", type=int, choices=(4, 8), default=4,
                        help="IBP chunk size in bytes (default 4)")
    parser.add_argument("--rows-per-record", type=int, default=256,
                        help="rows packed into one LMDB value (default 256)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="fixed invariance threshold T (default: search)")
    parser.add_argument("--search", choices=("auto", "global", "column"), default="auto",
                        help="mask search (default auto)")
    parser.add_argument("--sample", type=float, default=None,
                        help="fit on this random fraction of the rows (default all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample and clustering")
    parser.add_argument("--clusters", type=int, default=1,
                        help="masks fitted by Hamming k-means (default 1)")
    parser.add_argument("--dtype", default=None,
                        help="cast rows to this dtype first (default: float32 for bundled "
                             "sets, the file's dtype otherwise)")
    parser.add_argument("--array-key", default=None, help=".npz: array holding the rows")
    parser.add_argument("--label-key", default=None, help=".npz: array holding the labels")
    parser.add_argument("--no-checksum", action="store_true",
                        help="do not add a CRC-32 to every record")


# ------------------------------------------------------------------------------------------
# sources


def load_source(src: str, array_key: str | None = None,
                label_key: str | None = None) -> tuple[np.ndarray, np.ndarray | None, str]:
    """(rows, labels or None, description) of a source name or file."""
    if src.startswith("sklearn:"):
        import sklearn.datasets as ds

        name = src.split(":", 1)[1]
        loaders = {"digits": ds.load_digits, "breast_cancer": ds.load_breast_cancer,
                   "wine": ds.load_wine, "iris": ds.load_iris, "diabetes": ds.load_diabetes}
        if name not in loaders:
            raise LmdbioError(f"{src}: unknown scikit-learn data set; known: "
                              f"{', '.join('sklearn:' + k for k in loaders)}")
        bunch = loaders[name]()
        return np.asarray(bunch.data), np.asarray(bunch.target), f"scikit-learn load_{name}()"
    if src.startswith("skimage:"):
        name = src.split(":", 1)[1]
        if name != "lfw":
            raise LmdbioError(f"{src}: unknown scikit-image data set; known: skimage:lfw")
        from skimage import data as skdata

        faces = np.asarray(skdata.lfw_subset())
        labels = np.r_[np.ones(100, np.int64), np.zeros(len(faces) - 100, np.int64)]
        return faces, labels, "scikit-image lfw_subset() (100 faces then 100 non-faces)"
    path = Path(src)
    if not path.exists():
        raise LmdbioError(f"{src}: no such file (and not one of {', '.join(BUNDLED)})")
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise LmdbioError(f"{src}: not a readable .npy file ({exc})") from None
        return arr, None, f"{path.name}"
    if path.suffix == ".npz":
        try:
            npz = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise LmdbioError(f"{src}: not a readable .npz file ({exc})") from None
        with npz:
            keys = list(npz.keys())
            if array_key is None:
                cands = [k for k in ("data", "X", "x", "features") if k in keys]
                if not cands and len(keys) == 1:
                    cands = keys
                if not cands:
                    raise LmdbioError(f"{src}: pick the rows with --array-key (arrays: "
                                      f"{', '.join(keys)})")
                array_key = cands[0]
            if array_key not in keys:
                raise LmdbioError(f"{src}: no array {array_key!r} (arrays: {', '.join(keys)})")
            rows = npz[array_key]
            labels = None
            if label_key is None:
                found = [k for k in ("labels", "y", "target") if k in keys and k != array_key]
                label_key = found[0] if found else None
            elif label_key not in keys:
                raise LmdbioError(f"{src}: no array {label_key!r} (arrays: {', '.join(keys)})")
            if label_key is not None:
                labels = npz[label_key]
        return rows, labels, f"{path.name}[{array_key}]"
    raise LmdbioError(f"{src}: expected a .npy or .npz file or one of {', '.join(BUNDLED)}")


# ------------------------------------------------------------------------------------------
# records


def iter_records(path: str | os.PathLike) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every record, in key order (py-lmdb until the page engine lands)."""
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    try:
        with env.begin(buffers=False) as txn:
            yield from txn.cursor()
    finally:
        env.close()


# ------------------------------------------------------------------------------------------
# conversion


def convert(src: str, dst: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fit, pack and write; return a summary (ratio counts what the records store)."""
    rows, labels, description = checked_rows(src, args)
    per = int(args.rows_per_record)
    if per < 1:
        raise LmdbioError("--rows-per-record must be at least 1")
    model = fit_model(rows, args)
    checksum = not getattr(args, "no_checksum", False)
    nrows = len(rows)
    stats = {"payload": 0, "frames": 0, "compressed": 0}
    raw_bytes = nrows * model.row_bytes
    meta = dataset_meta(src, description, model, labels, nrows, per, checksum)
    summary = write_records(dst, packed_records(rows, labels, model, per, checksum, stats),
                            meta=None, format_version=args.format_version,
                            total=-(-nrows // per), overwrite=args.overwrite)
    meta["ibp"].update({
        "raw_bytes": raw_bytes,
        "payload_bytes": stats["payload"],
        "frame_bytes": stats["frames"],
        "compressed_rows": stats["compressed"],
        "ratio": raw_bytes / stats["payload"] if stats["payload"] else None,
    })
    write_dataset_meta(dst, {**meta, "records": summary["records"],
                             "format_version": args.format_version})
    return {**summary, "rows": nrows, "raw_bytes": raw_bytes,
            "payload_bytes": stats["payload"], "frame_bytes": stats["frames"],
            "ratio": meta["ibp"]["ratio"], "record_ratio": raw_bytes / summary["value_bytes"]
            if summary["value_bytes"] else None, "chunk_bytes": model.chunk_bytes,
            "clusters": model.nclusters, "search": model.search, "model_id": model.model_id.hex()}


def checked_rows(src: str, args: argparse.Namespace
                 ) -> tuple[np.ndarray, np.ndarray | None, str]:
    """``(rows, labels, description)`` of ``src`` (:func:`load_source`), rows cast to
    ``--dtype`` (float32 for the sklearn/skimage sets by default), labels one per row."""
    rows, labels, description = load_source(src, getattr(args, "array_key", None),
                                            getattr(args, "label_key", None))
    want = getattr(args, "dtype", None)
    if want is None and (src.startswith("sklearn:") or src.startswith("skimage:")):
        want = "float32"
    if want is not None:
        try:
            rows = rows.astype(np.dtype(want))
        except TypeError as exc:
            raise LmdbioError(f"--dtype {want}: {exc}") from None
    if rows.ndim < 2:
        raise LmdbioError(f"{src}: rows must be an array of shape (N, ...), got {rows.shape}")
    if labels is not None and labels.shape[:1] != rows.shape[:1]:
        raise LmdbioError(f"{src}: {len(labels)} labels for {len(rows)} rows")
    if labels is not None:
        labels = np.ascontiguousarray(labels.reshape(len(rows)))
    return rows, labels, description


def fit_model(rows: np.ndarray, args: argparse.Namespace) -> Any:
    """The IBP model of ``rows``: one fit, or ``--clusters`` of them."""
    chunk = int(args.chunk_bytes)
    clusters = int(getattr(args, "clusters", 1) or 1)
    if clusters > 1:
        return ibp.fit_clusters(rows, clusters, chunk, sample=args.sample, seed=args.seed)
    return ibp.fit(rows, chunk, args.threshold, args.sample, search=args.search,
                   seed=args.seed)


def packed_records(rows: np.ndarray, labels: np.ndarray | None, model: Any, per: int,
                   checksum: bool, stats: dict[str, int]) -> Iterator[tuple[bytes, bytes]]:
    """The records: ``per`` rows each, packed by ``model`` (condensed), keyed
    :data:`KEY_FORMAT`; ``stats`` counts payload and frame bytes and compressed rows."""
    for r, start in enumerate(range(0, len(rows), per)):
        block = rows[start:start + per]
        packed = model.compress(block, "condensed")
        stats["payload"] += packed.nbytes
        stats["compressed"] += packed.ncompressed
        frame = packed.to_bytes(checksum)
        stats["frames"] += len(frame)
        lab = None if labels is None else labels[start:start + per]
        yield KEY_FORMAT % r, encode_record(frame, lab, len(block))


def dataset_meta(src: str, description: str, model: Any, labels: np.ndarray | None,
                 nrows: int, per: int, checksum: bool) -> dict[str, Any]:
    """The sidecar's description of the dataset, with the model (base64) under ``"ibp"``;
    the sizes known once written are added by :func:`convert`."""
    model_bytes = model.to_bytes()
    return {
        "layout": "ibp",
        "source": src,
        "description": description,
        "rows": nrows,
        "row_shape": list(model.row_shape),
        "dtype": model.dtype.str,
        "rows_per_record": per,
        "key_format": KEY_FORMAT.decode(),
        "labels": None if labels is None else {"dtype": labels.dtype.str},
        "ibp": {
            "model": base64.b64encode(model_bytes).decode("ascii"),
            "model_id": model.model_id.hex(),
            "model_bytes": len(model_bytes),
            "chunk_bytes": model.chunk_bytes,
            "clusters": model.nclusters,
            "search": model.search,
            "threshold": None if np.isnan(model.threshold) else model.threshold,
            "packed_layout": "condensed",
            "checksum": checksum,
        },
    }
