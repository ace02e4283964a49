"""IBP dataset records: the bytes of one LMDB value of ``--layout ibp``, and the model beside them.

A record holds a group of rows packed by one :class:`~lmdbio.codecs.ibp.IBPModel` as one
condensed frame (:mod:`lmdbio.codecs.ibp.packed`, with a CRC-32 unless the converter was
told ``--no-checksum``), plus their labels. Keys are :data:`KEY_FORMAT` record numbers. The
model is stored once per dataset, base64-encoded in the ``lmdbio.json`` sidecar
(``meta["ibp"]["model"]``), read back with :func:`load_model`.

Record value, little-endian (:data:`RECORD_HEAD` is the fixed part)::

    0 "IBPR"  4 version u8 (1)  5 flags u8 (bit 0: labels)  6 label dtype length u8  7 0
    8 nrows u32  12 label dtype (ASCII numpy dtype string), zero padding to 8,
    labels (nrows x itemsize), zero padding to 8, the IBP frame

:func:`parse_record` reads and checks the header (where the labels and the frame lie),
:func:`encode_record` writes a record, :func:`decode_record` decodes one (rows and labels).
The converter (:mod:`lmdbio.convert.ibp`), the batch decoder and ``lmdbio inspect`` all
read the bytes through this module.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel
from lmdbio.codecs.ibp.packed import IBPPacked
from lmdbio.dataset_meta import read_dataset_meta
from lmdbio.errors import CodecError, LmdbioError

__all__ = [
    "FLAG_LABELS", "KEY_FORMAT", "RECORD_HEAD", "RECORD_MAGIC", "RECORD_VERSION",
    "RecordLayout", "decode_record", "encode_record", "load_model", "parse_record",
    "record_labels",
]

RECORD_MAGIC = b"IBPR"
RECORD_VERSION = 1
#: flags bit 0: the record carries one label per row
FLAG_LABELS = 1
#: the head of an IBP record: magic, version, flags, dtype name length, reserved, rows
RECORD_HEAD = struct.Struct("<4sBBBBI")
#: keys: the record number, zero-padded so key order is record order
KEY_FORMAT = b"%010d"
#: the label dtype name, the labels and the frame each start on a multiple of this
ALIGN = 8


@dataclass(frozen=True)
class RecordLayout:
    """Where the parts of one IBP record lie, from its header (:func:`parse_record`)."""

    nrows: int
    #: dtype of the labels; ``None`` for a record without labels
    label_dtype: np.dtype | None
    #: offset of the labels (``nrows * label_dtype.itemsize`` bytes; where they would be
    #: when there are none)
    labels_at: int
    #: offset of the IBP frame (it runs to the end of the record)
    frame_at: int


def _pad(n: int) -> int:
    """Zero bytes that bring ``n`` up to a multiple of :data:`ALIGN`."""
    return -n % ALIGN


def encode_record(frame: bytes, labels: np.ndarray | None, nrows: int) -> bytes:
    """One LMDB value: header, labels, the IBP frame (see the module docstring)."""
    if labels is None:
        dt = b""
        lab = b""
    else:
        labels = np.ascontiguousarray(labels)
        if labels.shape != (nrows,):
            raise LmdbioError(f"labels of shape {labels.shape} for {nrows} rows")
        dt = labels.dtype.str.encode("ascii")
        lab = labels.tobytes()
    head = RECORD_HEAD.pack(RECORD_MAGIC, RECORD_VERSION,
                            FLAG_LABELS if labels is not None else 0, len(dt), 0, nrows) + dt
    head += b"\0" * _pad(len(head))
    lab += b"\0" * _pad(len(lab))
    return head + lab + frame


def _label_dtype(buf: np.ndarray, dtlen: int) -> np.dtype:
    """The labels' dtype named after the fixed header: one plain number per row."""
    name = bytes(buf[RECORD_HEAD.size:RECORD_HEAD.size + dtlen])
    try:
        ldt = np.dtype(name.decode("ascii"))
    except (UnicodeDecodeError, TypeError, ValueError) as exc:
        raise CodecError(f"IBP record: bad label dtype ({exc})") from None
    if ldt.hasobject or ldt.itemsize == 0 or ldt.subdtype is not None \
            or ldt.fields is not None:
        raise CodecError(f"IBP record: unsupported label dtype {ldt} (labels are one "
                         "plain number per row)")
    return ldt


def parse_record(value: Any) -> RecordLayout:
    """Read and check the header of one record (bytes or a memoryview into the LMDB map):
    magic, version, flags, the label dtype and that the labels and the frame's start lie
    inside the record. Raises :class:`~lmdbio.errors.CodecError` saying what is wrong."""
    buf = np.frombuffer(value, np.uint8)
    if buf.nbytes < RECORD_HEAD.size:
        raise CodecError(f"IBP record: {buf.nbytes} bytes is too short")
    magic, version, flags, dtlen, res, nrows = RECORD_HEAD.unpack_from(buf.data)
    if magic != RECORD_MAGIC or version != RECORD_VERSION or flags > FLAG_LABELS or res:
        raise CodecError(f"IBP record: bad header (magic {magic!r}, version {version})")
    labels_at = RECORD_HEAD.size + dtlen
    labels_at += _pad(labels_at)
    frame_at = labels_at
    ldt = None
    if flags & FLAG_LABELS:
        ldt = _label_dtype(buf, dtlen)
        nlab = nrows * ldt.itemsize
        if labels_at + nlab > buf.nbytes:
            raise CodecError("IBP record: labels run past the end of the record")
        frame_at += nlab + _pad(nlab)
    elif dtlen:
        raise CodecError("IBP record: label dtype given without labels")
    if frame_at > buf.nbytes:
        raise CodecError("IBP record: truncated before its frame")
    return RecordLayout(int(nrows), ldt, labels_at, frame_at)


def record_labels(value: Any, layout: RecordLayout) -> np.ndarray | None:
    """The labels of a record parsed as ``layout``: a view into ``value`` (``None`` when
    the record has none)."""
    if layout.label_dtype is None:
        return None
    return np.frombuffer(value, layout.label_dtype, count=layout.nrows,
                         offset=layout.labels_at)


def decode_record(value: Any, model: Any, xp: Any = np,
                  method: str = "auto") -> tuple[Any, Any]:
    """(rows, labels) of one record, decoded on ``xp``'s device (labels as ``xp`` array or
    None). ``value`` may be bytes or a memoryview into the LMDB map (not copied)."""
    layout = parse_record(value)
    labels = record_labels(value, layout)
    if labels is not None:
        labels = labels.copy()  # not a view into the LMDB map
    buf = np.frombuffer(value, np.uint8)
    packed = IBPPacked.from_bytes(buf[layout.frame_at:], validate=False)  # decoding validates
    if packed.nrows != layout.nrows:
        raise CodecError(f"IBP record: frame holds {packed.nrows} rows, header says "
                         f"{layout.nrows}")
    rows = model.decompress(packed, xp=xp, method=method)
    if labels is not None and xp is not np:
        labels = xp.asarray(labels)
    return rows, labels


def load_model(path: str | os.PathLike) -> IBPModel:
    """The :class:`~lmdbio.codecs.ibp.IBPModel` stored with the IBP dataset at ``path``."""
    meta = read_dataset_meta(path)
    if meta.get("layout") != "ibp" or "ibp" not in meta:
        raise LmdbioError(f"{path}: not an IBP dataset (no ibp model in its lmdbio.json)")
    try:
        raw = base64.b64decode(meta["ibp"]["model"], validate=True)
    except (binascii.Error, KeyError, TypeError) as exc:
        raise CodecError(f"{path}: unreadable IBP model in lmdbio.json ({exc})") from None
    return IBPModel.from_bytes(raw)
