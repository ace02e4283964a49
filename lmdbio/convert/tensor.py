"""``lmdbio convert SRC DST --layout tensor``: write lmdbio tensor records (see
:mod:`lmdbio.codecs.tensor`), keys ``%08d`` in write order.

Sources are those of the ``caffe-datum`` converter (a bundled data set name, a folder of
class subfolders of images, a ``.npy``/``.npz`` file). Records keep the source's dtype (or
``--dtype``) and are stored as images ``(C, H, W)`` -- RGB from image files and bundled
photographs (no Caffe BGR reordering: this is lmdbio's own layout), as given for arrays --
or as rows ``(F,)``. Each record carries its int64 label. Metadata (layout, shape, dtype,
label names, provenance) goes in the ``lmdbio.json`` sidecar.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from lmdbio.codecs.tensor import DTYPE_CODES, encode_tensor
from lmdbio.convert.sources import Sample, add_source_arguments, iter_samples, open_source
from lmdbio.convert.writer import write_records
from lmdbio.dataset_meta import write_dataset_meta
from lmdbio.errors import LmdbioError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default=None,
                        help="cast records to this dtype (e.g. float32); default: keep the "
                             "source's")
    add_source_arguments(parser)


def _to_record(sample: Sample, arr: np.ndarray) -> np.ndarray:
    if sample.layout == "row":
        return arr.reshape(-1)
    if sample.layout == "chw":
        return arr[None] if arr.ndim == 2 else arr
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def convert(src: str, dst: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    source = open_source(src, args)
    cast = None
    if getattr(args, "dtype", None):
        try:
            cast = np.dtype(args.dtype)
        except TypeError:
            raise LmdbioError(f"--dtype {args.dtype!r} is not a numpy dtype") from None
        if cast.newbyteorder("<") not in [d.newbyteorder("<") for d in DTYPE_CODES.values()]:
            raise LmdbioError(f"--dtype {cast} cannot be stored in a tensor record")
    state: dict[str, Any] = {"shapes": set(), "dtypes": set(), "max_err": 0.0}

    def records():
        for i, sample, arr in iter_samples(source):
            rec = _to_record(sample, arr)
            if cast is not None and rec.dtype != cast:
                new = rec.astype(cast)
                if rec.dtype.kind in "fiu" and cast.kind in "fiu":
                    diff = np.abs(new.astype(np.float64) - rec.astype(np.float64))
                    state["max_err"] = max(state["max_err"], float(np.max(diff, initial=0.0)))
                rec = new
            state["shapes"].add(tuple(int(x) for x in rec.shape))
            state["dtypes"].add(str(rec.dtype))
            yield f"{i:08d}".encode(), encode_tensor(rec, sample.label)

    summary = write_records(dst, records(), meta=None, format_version=args.format_version,
                            total=len(source.samples),
                            overwrite=args.overwrite)
    shapes, dtypes = state["shapes"], state["dtypes"]
    channel_order = None
    if source.kind == "image":
        gray = shapes and all(len(sh) == 3 and sh[0] == 1 for sh in shapes)
        channel_order = "gray" if gray else "rgb" if source.from_image_files else "as-given"
    meta: dict[str, Any] = {
        "layout": "tensor",
        "source": src,
        "provenance": source.provenance,
        "label_names": source.label_names,
        "num_classes": len(source.label_names),
        "kind": source.kind,
        "channel_order": channel_order,
        "key_format": "%08d",
        "shape": list(next(iter(shapes))) if len(shapes) == 1 else None,
        "shapes_vary": len(shapes) > 1,
        "dtype": next(iter(dtypes)) if len(dtypes) == 1 else None,
        "cast_max_abs_error": state["max_err"],
    }
    write_dataset_meta(dst, {**meta, "records": summary["records"],
                             "format_version": args.format_version})
    summary.update({
        "layout": "tensor", "source": src, "shape": meta["shape"], "dtype": meta["dtype"],
        "cast_max_abs_error": state["max_err"], "provenance": source.provenance,
        "seconds": round(time.perf_counter() - t0, 3),
    })
    return summary
