"""What ``lmdbio inspect`` reports about a database, as a plain dictionary.

Beyond py-lmdb's statistics it measures how closely the file's page order follows key
order: speculative prefetch of page ranges only works when consecutive records sit on
increasing pages.

It also says what the records are (:func:`describe_records`), from a sample of them spread
over the whole database: Caffe ``Datum`` records (shape ``CxHxW``, raw pixels or encoded
images and their format from the files' magic bytes, float data), lmdbio's own layouts
(tensor, TOC, IBP, PCR, BTable sparse rows: recognized by their magic bytes or record
structure, and checked against the ``lmdbio.json`` sidecar where there is one), a few
common foreign values (bare image files, NumPy ``.npy`` arrays, Python pickles, which are
never unpickled), otherwise "unknown binary" with the typical size. Labels found in the
sample are counted (a histogram of the sample, not of the database).
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from lmdbio.codecs.btable.rows import read_row_head, record_nbytes, row_columns
from lmdbio.codecs.datum import decode_datum
from lmdbio.codecs.ibp import format as ibp_format
from lmdbio.codecs.pcr import FIXED as PCR_FIXED
from lmdbio.codecs.pcr import KIND_JPEG
from lmdbio.codecs.pcr import MAGIC as PCR_MAGIC
from lmdbio.codecs.pcr import unpack_fixed as unpack_pcr_fixed
from lmdbio.codecs.tensor import MAGIC as TENSOR_MAGIC
from lmdbio.codecs.tensor import read_tensor_header
from lmdbio.codecs.toc import BATCH_MAGIC, split_batch_value
from lmdbio.dataset_meta import read_dataset_meta
from lmdbio.errors import CodecError
from lmdbio.lmdb.database import Database

#: records sampled by default to say what the records are
SAMPLE_RECORDS = 64
#: distinct labels listed one by one in a description (more: their range)
_LABELS_LISTED = 12

#: magic bytes of encoded image files -> format name
IMAGE_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
)


def image_format(data: bytes | memoryview) -> str | None:
    """The format of an encoded image from its first bytes (None: not an image file)."""
    head = bytes(data[:12])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    for magic, name in IMAGE_MAGIC:
        if head.startswith(magic):
            return name
    return None


def _sizes(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"min": 0, "mean": 0.0, "median": 0.0, "p95": 0.0, "max": 0, "total": 0}
    return {
        "min": int(values.min()),
        "mean": float(values.mean()),
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
        "max": int(values.max()),
        "total": int(values.sum()),
    }


def increasing_fraction(pages: np.ndarray) -> float | None:
    """Fraction of consecutive pairs whose page numbers increase (None for < 2 pages)."""
    if pages.size < 2:
        return None
    return float(np.mean(np.diff(pages) > 0))


def free_pages(db: Database) -> dict[str, int]:
    """Records and total page numbers held by the free list (FREE_DBI) of the snapshot."""
    free = db.meta.free_db
    if free.empty:
        return {"records": 0, "pages": 0}
    table = db.build_table(free)
    total = 0
    for off, length in zip(table.val_off.tolist(), table.val_len.tolist(), strict=False):
        if length >= 8:
            total += int.from_bytes(db.mv[off:off + 8], "little")
    return {"records": len(table), "pages": total}


def inspect_database(path: str, subdb: str | bytes | None = None,
                     sample: int = SAMPLE_RECORDS) -> dict[str, Any]:
    """Everything ``lmdbio inspect`` prints, for the database at ``path``; ``records`` says
    what the records are, from ``sample`` of them (:func:`describe_records`)."""
    with Database(path, subdb=subdb, pin_snapshot=False) as db:
        st = db.stat()
        table = db.record_table()
        leaves = db.leaves()
        runs = table.ovf_pages > 0
        ovf_start = (table.val_off[runs] - db.layout.header_size) // db.psize
        try:  # the sidecar describes the main database only
            sidecar = read_dataset_meta(db.path) if subdb is None else {}
        except Exception:
            sidecar = {}
        return {
            "path": str(db.path),
            "records": describe_records(db, sample, sidecar),
            "format_version": st["format_version"],
            "page_size": st["psize"],
            "entries": st["entries"],
            "depth": st["depth"],
            "txnid": st["txnid"],
            "live_meta_page": st["live_meta_page"],
            "flags": st["flags"],
            "pages": {
                "branch": st["branch_pages"],
                "leaf": st["leaf_pages"],
                "overflow": st["overflow_pages"],
                "last_page": st["last_pgno"],
                "in_file": st["file_size"] // st["psize"],
            },
            "free_list": free_pages(db),
            "named_databases": [n.decode("utf-8", "replace") for n in db.subdatabases()],
            "key_bytes": _sizes(table.key_len.astype(np.int64)),
            "value_bytes": _sizes(table.val_len),
            "records_inline": int(np.count_nonzero(~runs)),
            "records_overflow": int(np.count_nonzero(runs)),
            "file_order": {
                "leaf_pages_increasing": increasing_fraction(leaves),
                "overflow_runs_increasing": increasing_fraction(ovf_start),
                "comment": "fraction of consecutive pages (in key order) whose page numbers "
                           "increase: 1.0 means the file is laid out in key order",
            },
        }


# ------------------------------------------------------------------------------ record types


def sample_indices(n: int, sample: int = SAMPLE_RECORDS) -> np.ndarray:
    """``sample`` record indices spread evenly over ``n`` records (first and last included)."""
    if n <= 0 or sample <= 0:
        return np.empty(0, np.int64)
    return np.unique(np.linspace(0, n - 1, min(sample, n)).round().astype(np.int64))


def _labels(labels: list[int]) -> dict[str, Any]:
    """The label part of a description: a histogram of the sampled labels."""
    if not labels:
        return {}
    counts = Counter(int(x) for x in labels)
    return {"label_histogram": {str(k): counts[k] for k in sorted(counts)}}


def label_text(histogram: dict[str, int] | None) -> str:
    """A sample's label histogram in one line: every label and its count, or the range
    where there are many."""
    if not histogram:
        return ""
    keys = sorted(histogram, key=lambda k: int(k))
    total = sum(histogram.values())
    if len(keys) <= _LABELS_LISTED:
        return ", ".join(f"{k}: {histogram[k]}" for k in keys)
    return f"{len(keys)} distinct labels in {total} sampled, {keys[0]}..{keys[-1]}"


def _shape_text(shapes: Counter) -> tuple[Any, str]:
    """``(shape or None, text)``: one shape, or how they vary."""
    if len(shapes) == 1:
        shape = next(iter(shapes))
        return list(shape), "x".join(str(d) for d in shape)
    common = shapes.most_common(1)[0][0]
    return None, (f"{len(shapes)} shapes, e.g. {'x'.join(str(d) for d in common)} "
                  f"({shapes[common]} of {sum(shapes.values())})")


def _datum(values: list[memoryview]) -> dict[str, Any] | None:
    shapes: Counter = Counter()
    formats: Counter = Counter()
    labels: list[int] = []
    kinds: set[str] = set()
    for v in values:
        try:
            d = decode_datum(v)
        except (CodecError, ValueError):
            return None
        c, h, w = d.shape
        data = d.data if d.data is not None else b""
        floats = d.float_data.shape[0] if d.float_data is not None else 0
        fmt = image_format(data) if len(data) else None
        if d.encoded or (fmt is not None and c * h * w != len(data)):
            if fmt is None:
                return None  # encoded, yet no image file we know
            kinds.add("encoded")
            formats[fmt] += 1
            shapes[_encoded_shape(data, (c, h, w))] += 1
        elif len(data) and c * h * w == len(data):
            kinds.add("raw uint8")
            shapes[(c, h, w)] += 1
        elif not len(data) and floats and c * h * w == floats:
            kinds.add("raw float32 (float_data)")
            shapes[(c, h, w)] += 1
        else:
            return None  # not what a Datum of pixels looks like
        if d.label is not None:
            labels.append(d.label)
    shape, shape_text = _shape_text(shapes)
    if formats:
        fmt_text = "/".join(sorted(formats))
        what = f"encoded {fmt_text} images" if kinds == {"encoded"} else \
            f"encoded {fmt_text} images and raw pixels mixed"
    else:
        what = " and ".join(sorted(kinds))
        what = "raw uint8 pixels" if what == "raw uint8" else what
    out: dict[str, Any] = {
        "type": "caffe-datum", "shape": shape, "shapes": len(shapes),
        "encoded": bool(formats), "encoded_format": "/".join(sorted(formats)) or None,
        "description": f"Caffe Datum, {shape_text} "
                       f"(CxHxW{', once decoded' if formats else ''}), {what}",
        **_labels(labels),
    }
    return out


def _encoded_shape(data: bytes | memoryview, stored: tuple[int, int, int]
                   ) -> tuple[int, ...] | tuple[str]:
    """(C, H, W) an encoded image decodes to, as Caffe's data layer decodes it (from the
    image header; Pillow is an optional dependency: without it, the Datum's own fields)."""
    try:
        from PIL import Image
    except ImportError:
        return stored if all(stored) else ("?",)
    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            channels = 1 if im.mode in ("1", "L", "LA", "I", "F") or \
                im.mode.startswith("I;") else 3
            return (channels, int(im.height), int(im.width))
    except Exception:
        return ("?",)


def _tensor(values: list[memoryview]) -> dict[str, Any] | None:
    if not all(bytes(v[:4]) == TENSOR_MAGIC for v in values):
        return None
    shapes: Counter = Counter()
    dtypes: Counter = Counter()
    labels: list[int] = []
    for v in values:
        try:
            h = read_tensor_header(v)
        except Exception:
            return None
        shapes[h.shape] += 1
        dtypes[str(h.dtype)] += 1
        if h.label is not None:
            labels.append(h.label)
    shape, shape_text = _shape_text(shapes)
    dtype = "/".join(sorted(dtypes))
    return {"type": "tensor", "shape": shape, "dtype": dtype,
            "description": f"lmdbio tensor records, {shape_text} {dtype}",
            **_labels(labels)}


def _toc(values: list[memoryview]) -> dict[str, Any] | None:
    if not all(bytes(v[:4]) == BATCH_MAGIC for v in values):
        return None
    rows: list[int] = []
    labels: list[int] = []
    for v in values:
        try:
            _, lab = split_batch_value(v)
        except Exception:
            return None
        rows.append(int(lab.shape[0]))
        if lab.ndim == 1 and lab.dtype.kind in "iub":
            labels.extend(int(x) for x in lab.tolist())
    return {"type": "toc", "rows_per_record": int(np.median(rows)),
            "description": f"lmdbio TOC mini-batches (TOC-compressed tables), "
                           f"{int(np.median(rows))} rows per record typical",
            **_labels(labels)}


def _ibp(values: list[memoryview]) -> dict[str, Any] | None:
    if not all(bytes(v[:4]) == ibp_format.RECORD_MAGIC for v in values):
        return None
    rows: list[int] = []
    labels: list[int] = []
    for v in values:
        try:
            layout = ibp_format.parse_record(v)
        except CodecError:
            return None
        rows.append(layout.nrows)
        lab = ibp_format.record_labels(v, layout)
        if lab is not None and lab.dtype.kind in "iub":
            labels.extend(int(x) for x in lab.tolist())
    return {"type": "ibp", "rows_per_record": int(np.median(rows)),
            "description": f"lmdbio IBP records (IBP-compressed rows), {int(np.median(rows))} "
                           "rows per record typical",
            **_labels(labels)}


def _pcr(values: list[memoryview]) -> dict[str, Any] | None:
    if not all(bytes(v[:4]) == PCR_MAGIC for v in values):
        return None
    items: list[int] = []
    groups: set[int] = set()
    kinds: set[int] = set()
    labels: list[int] = []
    for v in values:
        try:
            head = unpack_pcr_fixed(v)
        except CodecError:
            return None
        kind, g, n = head.kind, head.n_groups, head.n_items
        items.append(n)
        groups.add(g)
        kinds.add(kind)
        at = PCR_FIXED + 8 * g
        if kind == KIND_JPEG and len(v) >= at + 8 * n:
            labels.extend(int(x) for x in np.frombuffer(v, "<i8", count=n, offset=at).tolist())
    what = "progressive JPEG images" if kinds == {KIND_JPEG} else "byte-plane tensors" \
        if KIND_JPEG not in kinds else "images and tensors"
    return {"type": "pcr", "items_per_record": int(np.median(items)),
            "scan_groups": sorted(groups),
            "description": f"lmdbio PCR records (Progressive Compressed Records: {what}), "
                           f"{int(np.median(items))} items per record typical, "
                           f"{max(groups)} scan groups",
            **_labels(labels)}


def _btable_rows(values: list[memoryview]) -> dict[str, Any] | None:
    widths: set[int] = set()
    nnz: list[int] = []
    for v in values:
        try:
            k, cols = read_row_head(v)
        except CodecError:
            return None
        if len(v) != record_nbytes(k) or (k and cols == 0):
            return None
        c = row_columns(v, k)
        if k and (c.min() < 0 or c.max() >= cols or np.any(np.diff(c) <= 0)):
            return None
        widths.add(cols)
        nnz.append(k)
    if len(widths) != 1:
        return None
    cols = widths.pop()
    return {"type": "btable", "columns": cols, "nnz_per_row": float(np.mean(nnz)),
            "description": f"lmdbio BTable sparse rows (one table row per record), {cols} "
                           f"columns, {float(np.mean(nnz)):.1f} non-zeros per row in the "
                           "sample"}


def _foreign(values: list[memoryview]) -> dict[str, Any] | None:
    """Values that are common outside lmdbio: image files, .npy arrays, pickles."""
    formats = [image_format(v) for v in values]
    if all(formats):
        names = "/".join(sorted(set(formats)))  # type: ignore[arg-type]
        return {"type": "image-files", "encoded_format": names,
                "description": f"bare {names} image files (one encoded image per value, no "
                               "Caffe Datum around it)"}
    if all(bytes(v[:6]) == b"\x93NUMPY" for v in values):
        return {"type": "npy", "description": "NumPy .npy arrays (one per value)"}
    if all(len(v) >= 2 and v[0] == 0x80 and 2 <= v[1] <= 5 for v in values):
        protocols = sorted({int(v[1]) for v in values})
        return {"type": "pickle",
                "description": f"Python pickles (protocol {'/'.join(map(str, protocols))}; "
                               "not unpickled: unpickling runs code)"}
    return None


#: recognizers in the order they are tried: lmdbio's layouts have magic bytes or an exact
#: structure; a Datum is a protobuf message, tried after them
_RECOGNIZERS: dict[str, Callable[[list[memoryview]], dict[str, Any] | None]] = {
    "tensor": _tensor, "toc": _toc, "ibp": _ibp, "pcr": _pcr, "caffe-datum": _datum,
    "btable": _btable_rows, "foreign": _foreign,
}


def describe_records(db: Database, sample: int = SAMPLE_RECORDS,
                     sidecar: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the records of ``db`` are, from ``sample`` records spread over the database.

    ``type`` is one of caffe-datum, tensor, toc, ibp, pcr, btable, image-files, npy, pickle,
    unknown (or empty); ``description`` says it in one line; ``sampled`` how many records
    were looked at; ``sidecar_layout`` the layout the ``lmdbio.json`` beside the database
    names, if any (a mismatch is said in ``description``)."""
    n = len(db)
    claimed = (sidecar or {}).get("layout")
    if n == 0:
        return {"type": "empty", "sampled": 0, "description": "no records",
                "sidecar_layout": claimed}
    idx = sample_indices(n, sample)
    table = db.record_table()
    values = [db.mv[int(o):int(o) + int(ln)] for o, ln in
              zip(table.val_off[idx].tolist(), table.val_len[idx].tolist(), strict=True)]
    sizes = np.array([len(v) for v in values])
    found: dict[str, Any] | None = None
    order = list(_RECOGNIZERS)
    if claimed in _RECOGNIZERS:  # what the sidecar says is tried first
        order.remove(claimed)
        order.insert(0, claimed)
    for name in order:
        found = _RECOGNIZERS[name](values)
        if found is not None:
            break
    if found is None:
        found = {"type": "unknown",
                 "description": f"unknown binary, {int(np.median(sizes))} bytes typical "
                                f"({int(sizes.min())}-{int(sizes.max())} in the sample)"}
    found["sampled"] = int(idx.shape[0])
    found["value_bytes_typical"] = int(np.median(sizes))
    found["sidecar_layout"] = claimed
    if claimed and claimed != found["type"]:
        found["description"] += f" (but lmdbio.json says layout {claimed!r})"
    return found
