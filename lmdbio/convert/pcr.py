"""``lmdbio convert SRC DST --layout pcr``: Progressive Compressed Records.

Sources:

* a folder of images, labels from sub-folder names (``SRC/<class>/<file>``; classes sorted by
  name get labels 0, 1, ...; files directly in SRC get label -1). Keys are the relative paths.
* an LMDB of Caffe ``Datum`` records (encoded JPEG/PNG bytes, or raw CHW uint8 pixels in
  Caffe's BGR order). Keys and labels are kept.
* a ``.npy`` array (axis 0 = items): stored as byte-plane progressive tensors
  (:mod:`lmdbio.codecs.progressive_tensor`), labels from ``--labels FILE.npy``.

Images become progressive JPEGs: JPEG sources losslessly (DCT-domain transcoding with
``--jpeg-tool``), everything else at ``--quality``. Every ``--group-size`` items form one
value (layout in :mod:`lmdbio.codecs.pcr`) under the key ``%08d`` (group number). The
``lmdbio.json`` sidecar records the layout, number of scan groups, classes and tool used.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.codecs import pcr
from lmdbio.convert.writer import write_dataset_meta, write_records
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
    quality = int(getattr(args, "quality", 90))
    tool_req = getattr(args, "jpeg_tool", "auto")
    workers = max(1, int(getattr(args, "workers", 1) or 1))
    classes: list[str] = []
    if _is_lmdb(srcp):
        source_kind = "caffe-datum-lmdb"
        lsrc = _LmdbSource(srcp)
        entries: list[tuple[bytes, Any]] = [(k, None) for k in lsrc.keys]

        def load(entry: tuple[bytes, Any]) -> tuple[bytes | np.ndarray, int]:
            return _datum_image(entry[0], lsrc.get(entry[0]))
    elif srcp.is_dir():
        source_kind = "image-folder"
        items, classes = _folder_items(srcp)
        entries = [(key, (label, path)) for key, label, path in items]

        def load(entry: tuple[bytes, Any]) -> tuple[bytes | np.ndarray, int]:
            label, path = entry[1]
            return path.read_bytes(), label
    else:
        raise LmdbioError(f"{src}: expected an image folder, an LMDB of Caffe Datums or a .npy")
    if getattr(args, "shuffle_seed", None) is not None:
        order = np.random.default_rng(args.shuffle_seed).permutation(len(entries))
        entries = [entries[i] for i in order]
    tool = None
    stats = {"lossless": 0, "reencoded": 0, "source_bytes": 0, "pcr_image_bytes": 0,
             "n_groups": 0}

    def one(entry: tuple[bytes, Any]) -> tuple[bytes, int, bool, int]:
        nonlocal tool
        data, label = load(entry)
        if isinstance(data, np.ndarray):
            return pcr.encode_progressive(data, quality), label, False, data.nbytes
        if pcr.is_jpeg(data) and tool is None:
            tool = pcr.resolve_tool(tool_req)
        try:
            jpeg, lossless = pcr.to_progressive(data, quality, tool or tool_req)
        except CodecError as exc:
            raise CodecError(f"{src}: item {entry[0]!r}: {exc}") from exc
        return jpeg, label, lossless, len(data)

    def records() -> Iterator[tuple[bytes, bytes]]:
        with ThreadPoolExecutor(workers) as pool:
            for gi, a in enumerate(range(0, len(entries), group)):
                chunk = entries[a:a + group]
                done = list(pool.map(one, chunk))
                jpegs = [d[0] for d in done]
                value = pcr.encode_pcr_images(jpegs, [d[1] for d in done], [e[0] for e in chunk])
                hdr = pcr.parse_header(value)
                stats["n_groups"] = max(stats["n_groups"], hdr.n_groups)
                stats["lossless"] += sum(d[2] for d in done)
                stats["reencoded"] += sum(not d[2] for d in done)
                stats["source_bytes"] += sum(d[3] for d in done)
                stats["pcr_image_bytes"] += sum(len(j) for j in jpegs)
                yield b"%08d" % gi, value

    try:
        if not entries:
            raise LmdbioError(f"{src}: no records")
        summary = write_records(dst, records(), meta=None,
                                format_version=getattr(args, "format_version", 1),
                                overwrite=getattr(args, "overwrite", False))
    finally:
        if source_kind == "caffe-datum-lmdb":
            lsrc.close()
    meta = {"layout": "pcr", "kind": "jpeg", "source": os.path.abspath(src),
            "source_kind": source_kind, "classes": classes, "group_size": group,
            "items": len(entries), "scan_groups": stats["n_groups"], "quality": quality,
            "jpeg_tool": tool, "lossless_items": stats["lossless"],
            "reencoded_items": stats["reencoded"], "records": summary["records"],
            "format_version": getattr(args, "format_version", 1),
            "value_format": "LPCR v1 (see lmdbio.codecs.pcr)"}
    write_dataset_meta(dst, meta)
    return {**summary, "items": len(entries), "scan_groups": stats["n_groups"],
            "jpeg_tool": tool, "lossless_items": stats["lossless"],
            "reencoded_items": stats["reencoded"], "source_bytes": stats["source_bytes"],
            "pcr_image_bytes": stats["pcr_image_bytes"]}


def _convert_tensor(src: Path, dst: str, args: argparse.Namespace, group: int) -> dict[str, Any]:
    from lmdbio.codecs import progressive_tensor

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

    summary = write_records(dst, records(), meta=None,
                            format_version=getattr(args, "format_version", 1),
                            overwrite=getattr(args, "overwrite", False))
    meta = {"layout": "pcr", "kind": "tensor", "source": os.path.abspath(src),
            "dtype": x.dtype.str, "item_shape": list(x.shape[1:]), "items": int(x.shape[0]),
            "group_size": group, "scan_groups": x.dtype.itemsize, "records": summary["records"],
            "format_version": getattr(args, "format_version", 1),
            "value_format": "LPCR v1 kind 2 (see lmdbio.codecs.progressive_tensor)"}
    write_dataset_meta(dst, meta)
    return {**summary, "items": int(x.shape[0]), "scan_groups": x.dtype.itemsize}
