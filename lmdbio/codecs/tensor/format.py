"""lmdbio's tensor records: a fixed little-endian header, then the raw C-order array bytes.

Layout (version 1; all integers little-endian)::

    offset  size  field
    0       4     magic  b"LTNS"
    4       1     version (1)
    5       1     dtype code (see DTYPE_CODES)
    6       1     ndim (0..32)
    7       1     flags: bit 0 = a label is stored; bits 1-7 reserved (0)
    8       2     header size H = data offset = 24 + 8*ndim rounded up to a multiple of 16
    10      6     reserved (0)
    16      8     label (int64; 0 when absent)
    24      8*nd  shape (uint64 per dimension)
    ...           zero padding up to H
    H       ...   prod(shape) * itemsize bytes of array data, little-endian, C order

The header never depends on the key. Because ``H`` is a multiple of 16, the data of a record
that starts on a 16-byte boundary (an overflow value in an LMDB page: page start + 16) is
16-byte aligned; either way :func:`decode_tensor` returns a zero-copy view. A record must be
exactly ``H + nbytes`` long: truncation and trailing garbage are both errors.

:func:`lmdbio.codecs.tensor.batch.decode_tensor_batch` decodes a batch of records of one
shape and dtype with one vectorized header check and one compiled gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdbio.errors import CodecError

__all__ = [
    "DTYPE_CODES",
    "MAGIC",
    "VERSION",
    "TensorHeader",
    "decode_tensor",
    "dtype_code",
    "encode_tensor",
    "header_size",
    "read_tensor_header",
]

MAGIC = b"LTNS"
VERSION = 1
MAX_NDIM = 32
FIXED = 24
FLAG_LABEL = 0x01

#: dtype code -> numpy dtype (little-endian); codes are part of the on-disk format
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<u2"), 4: np.dtype("<i2"),
    5: np.dtype("<u4"), 6: np.dtype("<i4"), 7: np.dtype("<u8"), 8: np.dtype("<i8"),
    9: np.dtype("<f2"), 10: np.dtype("<f4"), 11: np.dtype("<f8"), 12: np.dtype("?"),
    13: np.dtype("<c8"), 14: np.dtype("<c16"),
}
_CODE_OF = {dt.newbyteorder("<") if dt.itemsize > 1 else dt: code
            for code, dt in DTYPE_CODES.items()}


def header_size(ndim: int) -> int:
    """Bytes before the array data for an ``ndim``-dimensional record."""
    return (FIXED + 8 * ndim + 15) // 16 * 16


def dtype_code(dtype: np.dtype) -> int:
    """The format's code of ``dtype`` (any byte order); a CodecError for an unsupported one."""
    key = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    try:
        return _CODE_OF[key]
    except KeyError:
        raise CodecError(f"tensor record: dtype {dtype} is not supported; supported: "
                         f"{', '.join(str(d) for d in DTYPE_CODES.values())}") from None


def encode_tensor(array: Any, label: int | None = None) -> bytes:
    """Serialize ``array`` (any supported dtype, any shape up to 32 dimensions) and an
    optional int64 ``label`` into one tensor record."""
    a = np.asarray(array)
    if a.ndim > MAX_NDIM:
        raise CodecError(f"tensor record: {a.ndim} dimensions, at most {MAX_NDIM}")
    code = dtype_code(a.dtype)
    dt = DTYPE_CODES[code]
    hs = header_size(a.ndim)
    head = np.zeros(hs, np.uint8)
    head[:4] = np.frombuffer(MAGIC, np.uint8)
    head[4], head[5], head[6] = VERSION, code, a.ndim
    head[7] = FLAG_LABEL if label is not None else 0
    head[8:10].view("<u2")[0] = hs
    if label is not None:
        if not -(1 << 63) <= int(label) < (1 << 63):
            raise CodecError(f"tensor record: label {label} does not fit in int64")
        head[16:24].view("<i8")[0] = int(label)
    head[FIXED:FIXED + 8 * a.ndim].view("<u8")[:] = a.shape
    data = np.ascontiguousarray(a, dtype=dt)
    return head.tobytes() + data.tobytes()


@dataclass(frozen=True)
class TensorHeader:
    """The parsed header of one tensor record."""

    dtype: np.dtype
    shape: tuple[int, ...]
    label: int | None
    header_size: int
    nbytes: int


def read_tensor_header(buf: Any) -> TensorHeader:
    """Parse and check a record's header (and that the record length matches it)."""
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    n = len(mv)
    if n < FIXED:
        raise CodecError(f"tensor record: {n} bytes, shorter than the {FIXED}-byte header")
    if bytes(mv[:4]) != MAGIC:
        raise CodecError(f"tensor record: bad magic {bytes(mv[:4])!r}, expected {MAGIC!r}")
    version, code, ndim, flags = mv[4], mv[5], mv[6], mv[7]
    if version != VERSION:
        raise CodecError(f"tensor record: version {version} is not supported (this reader "
                         f"knows {VERSION})")
    if code not in DTYPE_CODES:
        raise CodecError(f"tensor record: unknown dtype code {code}; known: "
                         f"{sorted(DTYPE_CODES)}")
    if ndim > MAX_NDIM:
        raise CodecError(f"tensor record: ndim {ndim} exceeds {MAX_NDIM}")
    if flags & ~FLAG_LABEL:
        raise CodecError(f"tensor record: reserved flag bits set (flags = {flags:#04x})")
    hs = int.from_bytes(mv[8:10], "little")
    if hs != header_size(ndim):
        raise CodecError(f"tensor record: header size {hs}, expected {header_size(ndim)} for "
                         f"ndim {ndim}")
    if any(mv[10:16]):
        raise CodecError("tensor record: reserved header bytes 10..15 are not zero")
    if n < hs:
        raise CodecError(f"tensor record: {n} bytes, shorter than its {hs}-byte header")
    if any(mv[FIXED + 8 * ndim:hs]):
        raise CodecError("tensor record: header padding is not zero")
    shape = tuple(int.from_bytes(mv[FIXED + 8 * i:FIXED + 8 * i + 8], "little")
                  for i in range(ndim))
    dt = DTYPE_CODES[code]
    nonzero = math.prod(d for d in shape if d)
    if nonzero * dt.itemsize >= 1 << 63:
        raise CodecError(f"tensor record: shape {shape} is too large for an array")
    nbytes = math.prod(shape) * dt.itemsize
    if n - hs != nbytes:
        what = "truncated" if n - hs < nbytes else "trailing bytes"
        raise CodecError(f"tensor record: {what}: shape {shape} {dt} needs {nbytes} data "
                         f"bytes, the record holds {n - hs}")
    label = int.from_bytes(mv[16:24], "little", signed=True) if flags & FLAG_LABEL else None
    return TensorHeader(dt, shape, label, hs, nbytes)


def decode_tensor(buf: Any) -> tuple[np.ndarray, int | None]:
    """``(array, label)`` from one record; the array is a zero-copy (read-only where ``buf``
    is) view of ``buf``; ``label`` is None when the record stores none."""
    h = read_tensor_header(buf)
    arr = np.frombuffer(buf, dtype=h.dtype, count=math.prod(h.shape), offset=h.header_size)
    return arr.reshape(h.shape), h.label
