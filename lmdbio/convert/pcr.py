"""``lmdbio convert SRC DST --layout pcr``: Progressive Compressed Records.

Sources:

* a folder of images, labels from sub-folder names (``SRC/<class>/<file>``; classes sorted by
  name get labels 0, 1, ...; files directly in SRC get label -1). Keys are the relative paths.
* an LMDB of Caffe ``Datum`` records (encoded JPEG/PNG bytes, or raw CHW uint8 pixels in
  Caffe's BGR order). Keys and labels are kept.
* a ``.npy`` array (axis 0 = items): stored as byte-plane progressive tensors
  (:mod:`lmdbio.codecs.pcr.progressive_tensor`), labels from ``--labels FILE.npy``.

Images become progressive JPEGs: JPEG sources losslessly (DCT-domain transcoding with
``--jpeg-tool``), everything else at ``--quality``.

Images must fit in one batch as Caffe's data layer takes them, and the folder is checked
before anything is written (image headers only): grey and colour images mixed need
``--color`` (every image decoded with three channels when read, as Caffe's ``is_color``) or
``--gray`` (one channel), recorded in the sidecar (``decode_mode``): the stored JPEGs stay
lossless. Several sizes need ``--resize H W`` (every image resized and re-encoded at
``--quality``) or ``--keep-sizes`` (stored as they are, each cropped on its own when read with
``transform.crop_size``); without a choice the conversion stops naming the first odd image.
An LMDB source is checked as it is converted (its records are read once): the conversion
stops at the first odd record, and leaves nothing behind. Every ``--group-size`` items form one
value (layout in :mod:`lmdbio.codecs.pcr`) under the key ``%08d`` (group number). The
``lmdbio.json`` sidecar records the layout, number of scan groups, classes and tool used.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.codecs import pcr
from lmdbio.codecs.pcr import progressive_tensor
from lmdbio.convert.sources import check_image_sizes, decoded_channels
from lmdbio.convert.writer import write_records
from lmdbio.dataset_meta import write_dataset_meta
from lmdbio.errors import CodecError, LmdbioError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group-size", type=int, default=64,
                        help="images (or tensor rows) per LMDB value (default 64)")
    parser.add_argument("--quality", type=int, default=90,
                        help="JPEG quality for sources that are not JPEG already (default 90)")
    parser.add_argument("--jpeg-tool", default="auto", choices=("auto", "jpegtran", "mozjpeg"),
                        help="lossless transcoder for JPEG sources (default: jpegtran if on "
                        "PATH, else the mozjpeg-lossless-optimization wheel)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="threads transcoding in parallel")
    parser.add_argument("--shuffle-seed", type=int, default=None,
                        help="shuffle items with this seed before grouping (default: keep "
                        "source order)")
    parser.add_argument("--labels", default=None, help=".npy labels for a .npy source")
    parser.add_argument("--resize", type=int, nargs=2, metavar=("H", "W"), default=None,
                        help="resize every image to H x W (bilinear, re-encoded at --quality: "
                             "no longer lossless); one choice for images of several sizes")
    parser.add_argument("--keep-sizes", action="store_true",
                        help="images of several sizes: store each at its own size; read them "
                             "with transform.crop_size, which crops each one as Caffe does")
    colour = parser.add_mutually_exclusive_group()
    colour.add_argument("--color", action="store_true",
                        help="decode every image with 3 colour channels when read, grey ones "
                             "too (Caffe's is_color); needed for grey and colour images mixed")
    colour.add_argument("--gray", action="store_true",
                        help="decode every image as one grey channel when read")


# ------------------------------------------------------------------------------ sources
def _folder_items(src: Path) -> tuple[list[tuple[bytes, int, Path]], list[str]]:
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    label_of = {c: i for i, c in enumerate(classes)}
    items = []
    for p in sorted(src.rglob("*")):
        if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES:
            rel = p.relative_to(src)
            label = label_of[rel.parts[0]] if len(rel.parts) > 1 else -1
            items.append((rel.as_posix().encode(), label, p))
    if not items:
        raise LmdbioError(f"{src}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return items, classes


class _LmdbSource:
    """Keys of an LMDB and values fetched by key (py-lmdb; the one place to switch to the page
    engine). Only keys are held in memory; values are read group by group."""

    def __init__(self, path: Path) -> None:
        import lmdb

        self.env = lmdb.open(str(path), readonly=True, lock=False, subdir=path.is_dir())
        with self.env.begin() as txn:
            self.keys = [bytes(k) for k in txn.cursor().iternext(keys=True, values=False)]

    def get(self, key: bytes) -> bytes:
        with self.env.begin() as txn:
            v = txn.get(key)
        if v is None:
            raise LmdbioError(f"key {key!r} vanished from the source LMDB")
        return v

    def close(self) -> None:
        self.env.close()


def _varint(buf: memoryview, p: int) -> tuple[int, int]:
    v = 0
    shift = 0
    while True:
        if p >= len(buf) or shift > 63:
            raise CodecError(f"Datum: varint runs past the end (byte {p})")
        b = buf[p]
        p += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, p
        shift += 7


def parse_datum_minimal(value: bytes | memoryview) -> dict[str, Any]:
    """Minimal Caffe ``Datum`` reader (protobuf fields 1-7) used when
    :mod:`lmdbio.codecs.datum` is not available: channels, height, width, data, label,
    float_data (count only), encoded."""
    buf = memoryview(value).cast("B")
    out: dict[str, Any] = {"channels": 0, "height": 0, "width": 0, "data": b"", "label": 0,
                           "encoded": False, "float_data": 0}
    p = 0
    while p < len(buf):
        tag, p = _varint(buf, p)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            v, p = _varint(buf, p)
            name = {1: "channels", 2: "height", 3: "width", 5: "label", 7: "encoded"}.get(field)
            if name == "label" and v >= 2**63:
                v -= 2**64  # int32 stored as a 10-byte varint when negative
            if name:
                out[name] = bool(v) if name == "encoded" else v
        elif wire == 2:
            n, p = _varint(buf, p)
            if p + n > len(buf):
                raise CodecError(f"Datum: field {field} runs past the end (byte {p})")
            if field == 4:
                out["data"] = bytes(buf[p:p + n])
            elif field == 6:
                out["float_data"] += n // 4
            p += n
        elif wire == 5:
            if field == 6:
                out["float_data"] += 1
            p += 4
        elif wire == 1:
            p += 8
        else:
            raise CodecError(f"Datum: unsupported wire type {wire} (field {field}, byte {p})")
    if p != len(buf):
        raise CodecError("Datum: last field runs past the end of the value")
    return out


def _datum_fields(value: bytes) -> dict[str, Any]:
    try:
        from lmdbio.codecs.datum import decode_datum  # written by the datum codec's owner
    except ImportError:
        return parse_datum_minimal(value)
    d = decode_datum(value)
    out: dict[str, Any] = {}
    for k, default in (("channels", 0), ("height", 0), ("width", 0), ("data", b""),
                       ("label", 0), ("encoded", False)):
        v = d.get(k) if isinstance(d, dict) else getattr(d, k, None)
        out[k] = default if v is None else v
    return out


def _datum_image(key: bytes, value: bytes) -> tuple[bytes | np.ndarray, int]:
    """The encoded image bytes (or an HxW[x3] RGB array) and the label of a Datum."""
    d = _datum_fields(value)
    data = d["data"]
    data = bytes(data) if not isinstance(data, bytes | np.ndarray) else data
    if d["encoded"]:
        return bytes(data), int(d["label"])
    c, h, w = int(d["channels"]), int(d["height"]), int(d["width"])
    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if c * h * w == 0 or raw.shape[0] != c * h * w:
        raise CodecError(f"Datum {key!r}: {raw.shape[0]} data bytes for shape {c}x{h}x{w} "
                         "(float_data datums cannot become JPEG)")
    if c not in (1, 3):
        raise CodecError(f"Datum {key!r}: {c} channels; JPEG needs 1 or 3")
    img = raw.reshape(c, h, w).transpose(1, 2, 0)
    img = img[:, :, 0] if c == 1 else img[:, :, ::-1]  # Caffe stores BGR
    return np.ascontiguousarray(img), int(d["label"])


# ------------------------------------------------------------------------------ checks
_CHOICES_COLOUR = "Choose --color (every image read in colour) or --gray."


class _Shapes:
    """The (C, H, W) of every image as stored and as the loader decodes it, checked as
    records are converted (for an LMDB source, whose records are read once): the first
    image of other channels, or of another size without --resize / --keep-sizes, stops
    the conversion; what the sidecar records about sizes."""

    def __init__(self, src: str, decode_mode: str | None, keep: bool) -> None:
        self.src, self.mode, self.keep = src, decode_mode, keep
        self.first: tuple[bytes, tuple[int, int, int]] | None = None
        self.vary = False
        self.smallest: tuple[bytes, int, int] | None = None
        self.min_h = self.min_w = 0

    def add(self, key: bytes, jpeg: bytes) -> None:
        from PIL import Image

        with Image.open(io.BytesIO(jpeg)) as im:
            h, w = int(im.height), int(im.width)
            c = {"RGB": 3, "L": 1}.get(self.mode or "", decoded_channels(im.mode))
        if self.first is None:
            self.first, self.min_h, self.min_w = (key, (c, h, w)), h, w
        else:
            k0, (c0, h0, w0) = self.first
            if c != c0:
                raise LmdbioError(f"{self.src}: grey and colour images mixed: {key!r} decodes "
                                  f"to {c} channel(s), the first item {k0!r} to {c0}; Caffe's "
                                  f"data layer refuses them in one batch. {_CHOICES_COLOUR}")
            if (h, w) != (h0, w0) and not self.keep:
                raise LmdbioError(f"{self.src}: images of several sizes (height x width): "
                                  f"{key!r} is {h}x{w}, the first item {k0!r} {h0}x{w0}. "
                                  "Choose --resize H W or --keep-sizes (each image cropped "
                                  "on its own when read, as Caffe does)")
            self.vary = self.vary or (h, w) != (h0, w0)
            self.min_h, self.min_w = min(self.min_h, h), min(self.min_w, w)
        if self.smallest is None or min(h, w) < min(self.smallest[1:]):
            self.smallest = (key, h, w)

    def meta(self) -> dict[str, Any]:
        if self.first is None or self.smallest is None:
            return {"shape": None, "sizes_vary": False}
        out: dict[str, Any] = {"shape": None if self.vary else list(self.first[1]),
                               "sizes_vary": self.vary}
        if self.vary:
            out["min_size"] = [self.min_h, self.min_w]
            out["smallest_image"] = {"name": self.smallest[0].decode("utf-8", "replace"),
                                     "height": self.smallest[1], "width": self.smallest[2]}
        return out


def _resized(data: bytes | np.ndarray, size: tuple[int, int], mode: str | None,
             quality: int) -> bytes:
    """An image resized to ``size`` = (H, W) (bilinear, as ``convert_imageset``), encoded
    as progressive JPEG at ``quality``; in ``mode`` (``RGB``, ``L``) when given, else grey
    stays grey and anything else becomes RGB."""
    from PIL import Image, UnidentifiedImageError

    try:
        im = Image.fromarray(data) if isinstance(data, np.ndarray) else \
            Image.open(io.BytesIO(data))
        im.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise CodecError(f"not an image Pillow can read: {exc}") from exc
    want = mode or ("L" if decoded_channels(im.mode) == 1 else "RGB")
    if im.mode != want:
        im = im.convert(want)
    return pcr.encode_progressive(im.resize((size[1], size[0]), Image.Resampling.BILINEAR), quality)


# ------------------------------------------------------------------------------ convert
def _is_lmdb(src: Path) -> bool:
    return (src.is_dir() and (src / "data.mdb").exists()) or src.name == "data.mdb"


def convert(src: str, dst: str, args: argparse.Namespace) -> dict[str, Any]:
    """Convert ``src`` into a PCR LMDB at ``dst``; return a summary."""
    srcp = Path(src)
    group = int(getattr(args, "group_size", 64))
    if group < 1:
        raise LmdbioError("--group-size must be >= 1")
    if srcp.suffix == ".npy" and srcp.is_file():
        return _convert_tensor(srcp, dst, args, group)
    opts = _image_options(args)
    source = _open_source(srcp, src)
    if getattr(args, "shuffle_seed", None) is not None:
        order = np.random.default_rng(args.shuffle_seed).permutation(len(source.entries))
        source.entries = [source.entries[i] for i in order]
    if source.kind == "image-folder":  # every image measured before anything is written
        check_image_sizes(srcp, [(e[0].decode(), e[1][1]) for e in source.entries],
                          resized=opts.resize is not None, keep_option="--keep-sizes",
                          keep=opts.keep,
                          channels_fix=None if opts.decode_mode else _CHOICES_COLOUR)
    shapes = _Shapes(src, opts.decode_mode, opts.keep or opts.resize is not None)
    encode = _ItemEncoder(src, opts, source.load)
    stats = _PcrStats()
    try:
        if not source.entries:
            raise LmdbioError(f"{src}: no records")
        records = _pcr_records(source.entries, group, opts.workers, encode, shapes, stats)
        summary = _write_new(dst, records, -(-len(source.entries) // group), args, stats)
    finally:
        source.close()
    meta = {"layout": "pcr", "kind": "jpeg", "source": os.path.abspath(src),
            "source_kind": source.kind, "classes": source.classes, "group_size": group,
            "items": len(source.entries), "scan_groups": stats.n_groups,
            "quality": opts.quality, "jpeg_tool": encode.tool,
            "lossless_items": stats.lossless, "reencoded_items": stats.reencoded,
            "records": summary["records"], "format_version": getattr(args, "format_version", 1),
            "value_format": "LPCR v1 (see lmdbio.codecs.pcr)", "decode_mode": opts.decode_mode,
            "resize": list(opts.resize) if opts.resize else None, **shapes.meta()}
    write_dataset_meta(dst, meta)
    return {**summary, "items": len(source.entries), "scan_groups": stats.n_groups,
            "jpeg_tool": encode.tool, "lossless_items": stats.lossless,
            "reencoded_items": stats.reencoded, "source_bytes": stats.source_bytes,
            "pcr_image_bytes": stats.pcr_image_bytes, "decode_mode": opts.decode_mode,
            **shapes.meta()}


@dataclass(frozen=True)
class _ImageOptions:
    """How images are encoded: JPEG ``quality`` and tool, encoding threads, the optional
    ``resize`` (H, W), the forced ``decode_mode`` (``RGB``, ``L`` or None) and whether
    several sizes are kept (``--keep-sizes``)."""

    quality: int
    tool_request: str
    workers: int
    resize: tuple[int, int] | None
    decode_mode: str | None
    keep: bool


def _image_options(args: argparse.Namespace) -> _ImageOptions:
    """The image options of ``args`` (defaults for those absent); refuses sizes below 1."""
    quality = int(getattr(args, "quality", 90))
    tool_request = getattr(args, "jpeg_tool", "auto")
    workers = max(1, int(getattr(args, "workers", 1) or 1))
    resize: tuple[int, int] | None = None
    if getattr(args, "resize", None):
        resize = (int(args.resize[0]), int(args.resize[1]))
    if resize is not None and min(resize) < 1:
        raise LmdbioError(f"--resize {resize[0]} {resize[1]}: sizes must be >= 1")
    decode_mode = "RGB" if getattr(args, "color", False) else \
        "L" if getattr(args, "gray", False) else None
    return _ImageOptions(quality=quality, tool_request=tool_request, workers=workers,
                         resize=resize, decode_mode=decode_mode,
                         keep=bool(getattr(args, "keep_sizes", False)))


_Entry = tuple[bytes, Any]  # (key, what the source's loader needs to find the item)


@dataclass
class _ImageSource:
    """The items to convert: ``entries`` in conversion order, ``load`` giving an entry's
    image (encoded bytes or an HWC array) and label, and the class names of a folder."""

    kind: str
    entries: list[_Entry]
    load: Callable[[_Entry], tuple[bytes | np.ndarray, int]]
    classes: list[str]
    lmdb: _LmdbSource | None = None

    def close(self) -> None:
        """Close the source LMDB, if any."""
        if self.lmdb is not None:
            self.lmdb.close()


def _open_source(srcp: Path, src: str) -> _ImageSource:
    """An LMDB of Caffe Datums or an image folder at ``srcp``, listed (keys only)."""
    if _is_lmdb(srcp):
        lsrc = _LmdbSource(srcp)

        def load(entry: _Entry) -> tuple[bytes | np.ndarray, int]:
            return _datum_image(entry[0], lsrc.get(entry[0]))

        return _ImageSource("caffe-datum-lmdb", [(k, None) for k in lsrc.keys], load, [], lsrc)
    if srcp.is_dir():
        items, classes = _folder_items(srcp)

        def load_file(entry: _Entry) -> tuple[bytes | np.ndarray, int]:
            label, path = entry[1]
            return path.read_bytes(), label

        return _ImageSource("image-folder", [(key, (label, path)) for key, label, path in items],
                            load_file, classes)
    raise LmdbioError(f"{src}: expected an image folder, an LMDB of Caffe Datums or a .npy")


class _ItemEncoder:
    """Loads one item and makes it a progressive JPEG: ``(jpeg, label, lossless,
    source_bytes)``. JPEG sources are transcoded losslessly with the JPEG tool, resolved on
    the first JPEG met (``tool``, None until then); everything else is encoded at the
    quality, resized first with ``--resize``."""

    def __init__(self, src: str, opts: _ImageOptions,
                 load: Callable[[_Entry], tuple[bytes | np.ndarray, int]]) -> None:
        self.src, self.opts, self.load = src, opts, load
        self.tool: str | None = None

    def __call__(self, entry: _Entry) -> tuple[bytes, int, bool, int]:
        opts = self.opts
        data, label = self.load(entry)
        if opts.resize is not None:
            try:
                jpeg = _resized(data, opts.resize, opts.decode_mode, opts.quality)
            except CodecError as exc:
                raise CodecError(f"{self.src}: item {entry[0]!r}: {exc}") from exc
            return jpeg, label, False, len(data) if isinstance(data, bytes) else data.nbytes
        if isinstance(data, np.ndarray):
            return pcr.encode_progressive(data, opts.quality), label, False, data.nbytes
        if pcr.is_jpeg(data) and self.tool is None:
            self.tool = pcr.resolve_tool(opts.tool_request)
        try:
            jpeg, lossless = pcr.to_progressive(data, opts.quality,
                                                self.tool or opts.tool_request)
        except CodecError as exc:
            raise CodecError(f"{self.src}: item {entry[0]!r}: {exc}") from exc
        return jpeg, label, lossless, len(data)


@dataclass
class _PcrStats:
    """Running totals of a conversion; ``started`` once ``write_records`` has made DST."""

    lossless: int = 0
    reencoded: int = 0
    source_bytes: int = 0
    pcr_image_bytes: int = 0
    n_groups: int = 0
    started: bool = False

    def add_group(self, n_groups: int, done: list[tuple[bytes, int, bool, int]]) -> None:
        """Count one value's items (as :class:`_ItemEncoder` returns them) and scan groups."""
        self.n_groups = max(self.n_groups, n_groups)
        self.lossless += sum(d[2] for d in done)
        self.reencoded += sum(not d[2] for d in done)
        self.source_bytes += sum(d[3] for d in done)
        self.pcr_image_bytes += sum(len(d[0]) for d in done)


def _pcr_records(entries: list[_Entry], group: int, workers: int, encode: _ItemEncoder,
                 shapes: _Shapes, stats: _PcrStats) -> Iterator[tuple[bytes, bytes]]:
    """The PCR values, ``group`` items each under key ``%08d``, encoded on ``workers``
    threads; every image's shape is checked (``shapes``) and counted (``stats``)."""
    stats.started = True  # write_records made DST (it asks for records after that)
    with ThreadPoolExecutor(workers) as pool:
        for gi, a in enumerate(range(0, len(entries), group)):
            chunk = entries[a:a + group]
            done = list(pool.map(encode, chunk))
            jpegs = [d[0] for d in done]
            for e, j in zip(chunk, jpegs, strict=True):
                shapes.add(e[0], j)
            value = pcr.encode_pcr_images(jpegs, [d[1] for d in done], [e[0] for e in chunk])
            stats.add_group(pcr.parse_header(value).n_groups, done)
            yield b"%08d" % gi, value


def _write_new(dst: str, records: Iterator[tuple[bytes, bytes]], total: int,
               args: argparse.Namespace, stats: _PcrStats) -> dict[str, Any]:
    """:func:`write_records` into ``dst``; on failure a DST this conversion made is removed,
    so that nothing is left behind."""
    try:
        return write_records(dst, records, meta=None, total=total,
                             format_version=getattr(args, "format_version", 1),
                             overwrite=getattr(args, "overwrite", False))
    except LmdbioError:
        if stats.started:
            shutil.rmtree(dst, ignore_errors=True)
        raise


def _convert_tensor(src: Path, dst: str, args: argparse.Namespace, group: int) -> dict[str, Any]:
    x = np.load(src, mmap_mode="r")
    if x.ndim < 1 or x.shape[0] == 0:
        raise LmdbioError(f"{src}: need a non-empty array with items on axis 0")
    labels = np.zeros(x.shape[0], np.int64)
    if getattr(args, "labels", None):
        labels = np.asarray(np.load(args.labels), np.int64).reshape(-1)
        if labels.shape[0] != x.shape[0]:
            raise LmdbioError(f"{args.labels}: {labels.shape[0]} labels for {x.shape[0]} items")

    def records() -> Iterator[tuple[bytes, bytes]]:
        for gi, a in enumerate(range(0, x.shape[0], group)):
            b = min(a + group, x.shape[0])
            keys = [b"%010d" % i for i in range(a, b)]
            yield b"%08d" % gi, progressive_tensor.encode_planes_value(
                np.asarray(x[a:b]), labels[a:b], keys)

    summary = write_records(dst, records(), meta=None, total=-(-x.shape[0] // group),
                            format_version=getattr(args, "format_version", 1),
                            overwrite=getattr(args, "overwrite", False))
    meta = {"layout": "pcr", "kind": "tensor", "source": os.path.abspath(src),
            "dtype": x.dtype.str, "item_shape": list(x.shape[1:]), "items": int(x.shape[0]),
            "group_size": group, "scan_groups": x.dtype.itemsize, "records": summary["records"],
            "format_version": getattr(args, "format_version", 1),
            "value_format": "LPCR v1 kind 2 (see lmdbio.codecs.pcr.progressive_tensor)"}
    write_dataset_meta(dst, meta)
    return {**summary, "items": int(x.shape[0]), "scan_groups": x.dtype.itemsize}
