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

:func:`decode_tensor_batch` decodes a batch of records of one shape and dtype with one
vectorized header check and one compiled gather into an ``(N, *shape)`` array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lmdbio.codecs._batch import KeySource, as_spans, as_u8, key_of, pack_values
from lmdbio.codecs._numcodecs import ConfigEquality, as_input, fill_out, refuse_object_out
from lmdbio.errors import CodecError, RecordError

__all__ = [
    "DTYPE_CODES",
    "MAGIC",
    "VERSION",
    "TensorBatch",
    "TensorCodec",
    "TensorHeader",
    "decode_tensor",
    "decode_tensor_batch",
    "encode_tensor",
    "header_size",
    "pack_values",
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


def _code_of(dtype: np.dtype) -> int:
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
    code = _code_of(a.dtype)
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


@dataclass
class TensorBatch:
    """A decoded batch: ``data`` ``(N, *shape)``, ``labels`` int64 (0 where a record has no
    label), ``valid`` (False for records that failed with ``errors="mask"``; rows zeroed),
    the errors, and whether the records carry labels."""

    data: np.ndarray
    labels: np.ndarray
    valid: np.ndarray
    errors: list[RecordError]
    has_labels: bool


def decode_tensor_batch(
    buf: Any,
    offsets: Any,
    lengths: Any | None = None,
    *,
    keys: KeySource = None,
    expected: tuple[tuple[int, ...], Any] | None = None,
    out: np.ndarray | None = None,
    errors: Literal["raise", "mask"] = "raise",
) -> TensorBatch:
    """Decode tensor records of one shape and dtype into one ``(N, *shape)`` array.

    ``expected`` is ``(shape, dtype)`` every record must have (default: the first record's).
    The headers of all records are checked at once against it (byte-wise, vectorized) and the
    data copied by one compiled gather. With ``errors="raise"`` the first bad record raises
    :class:`~lmdbio.errors.RecordError` naming its key; ``"mask"`` zeroes its row instead.
    """
    from lmdbio.codecs import _record_kernels as k

    u8 = as_u8(buf)
    off, ln = as_spans(offsets, lengths)
    n = off.shape[0]
    fast = _uniform_batch(k, u8, off, ln, expected, out)
    if fast is not None:
        return fast
    bad: dict[int, str] = {}

    def explain(i: int) -> str:
        lo, m = int(off[i]), int(ln[i])
        if lo < 0 or m < 0 or lo + m > u8.shape[0]:
            return (f"tensor record: span [{lo}, {lo + m}) lies outside the {u8.shape[0]}-byte "
                "buffer")
        try:
            h = read_tensor_header(u8[lo:lo + m])
        except CodecError as exc:
            return str(exc)
        return (f"tensor record: shape {h.shape} {h.dtype}, labelled={h.label is not None} "
                f"differs from the batch's {ref_shape} {ref_dtype}, labelled={ref_has_label}")

    if expected is None:
        ref_h = None
        for i in range(n):
            lo, m = int(off[i]), int(ln[i])
            try:
                if lo < 0 or m < 0 or lo + m > u8.shape[0]:
                    raise CodecError(f"tensor record: span [{lo}, {lo + m}) lies outside the "
                                     f"{u8.shape[0]}-byte buffer")
                ref_h = read_tensor_header(u8[lo:lo + m])
                break
            except CodecError as exc:
                bad[i] = str(exc)
                if errors == "raise":
                    raise RecordError(key_of(keys, i), str(exc)) from None
        ref_shape = ref_h.shape if ref_h else ()
        ref_dtype = ref_h.dtype if ref_h else np.dtype("u1")
        ref_has_label = bool(ref_h and ref_h.label is not None)
    else:
        ref_shape = tuple(int(x) for x in expected[0])
        ref_dtype = np.dtype(expected[1])
        ref_has_label = None  # either is accepted; decided by the first good record
    ndim = len(ref_shape)
    hs = header_size(ndim)
    nbytes = math.prod(ref_shape) * ref_dtype.itemsize
    valid = np.zeros(n, bool)
    heads = np.zeros((n, hs), np.uint8)
    if n:
        k.gather_headers(u8, off, ln, hs, heads)
        ref = np.zeros(hs, np.uint8)
        ref[:4] = np.frombuffer(MAGIC, np.uint8)
        ref[4], ref[5], ref[6] = VERSION, _code_of(ref_dtype), ndim
        ref[8:10].view("<u2")[0] = hs
        ref[FIXED:FIXED + 8 * ndim].view("<u8")[:] = ref_shape
        same = np.all(heads[:, :7] == ref[:7], axis=1)
        same &= np.all(heads[:, 8:16] == ref[8:16], axis=1)
        same &= np.all(heads[:, FIXED:] == ref[FIXED:], axis=1)
        flags = heads[:, 7]
        if ref_has_label is None:
            good = np.flatnonzero(same & ((flags | FLAG_LABEL) == FLAG_LABEL) & (ln == hs + nbytes))
            ref_has_label = bool(good.size and flags[good[0]] & FLAG_LABEL)
        same &= flags == (FLAG_LABEL if ref_has_label else 0)
        same &= ln == hs + nbytes
        same &= (off >= 0) & (off <= u8.shape[0] - ln)
        valid = same
        for i in np.flatnonzero(~valid).tolist():
            if i not in bad:
                bad[i] = explain(i)
    if bad and errors == "raise":
        i = min(bad)
        raise RecordError(key_of(keys, i), bad[i])
    shape = (n, *ref_shape)
    if out is None:
        out = np.zeros(shape, ref_dtype) if bad else np.empty(shape, ref_dtype)
    else:
        if out.shape != shape or out.dtype != ref_dtype or not out.flags.c_contiguous:
            raise CodecError(f"tensor batch: out must be C-contiguous {shape} {ref_dtype}, "
                             f"got {out.shape} {out.dtype}")
        if bad:
            out[~valid] = 0
    rows = np.flatnonzero(valid)
    if rows.size and nbytes:
        flat = out.reshape(-1).view(np.uint8)
        target = flat if rows.size == n else np.empty(rows.size * nbytes, np.uint8)
        j = k.gather_rows(u8, off[rows] + hs, nbytes, target)
        if j >= 0:  # cannot happen after the span check; kept as a last line of defence
            raise RecordError(key_of(keys, int(rows[j])), "record lies outside the buffer")
        if target is not flat:
            flat.reshape(n, nbytes)[rows] = target.reshape(rows.size, nbytes)
    labels = np.ascontiguousarray(heads[:, 16:24]).view("<i8").reshape(-1).astype(np.int64)
    if not ref_has_label:
        labels[:] = 0
    labels[~valid] = 0
    errs = [RecordError(key_of(keys, i), bad[i]) for i in sorted(bad)]
    return TensorBatch(out, labels, valid, errs, bool(ref_has_label))


def _uniform_batch(k: Any, u8: np.ndarray, off: np.ndarray, ln: np.ndarray,
                   expected: tuple[tuple[int, ...], Any] | None,
                   out: np.ndarray | None) -> TensorBatch | None:
    """One compiled call for the usual batch (every header equal to the first record's, or
    to ``expected``); None sends anything else to the general path."""
    n = off.shape[0]
    if n == 0:
        return None
    lo, m = int(off[0]), int(ln[0])
    if lo < 0 or m < 0 or lo + m > u8.shape[0]:
        return None
    try:
        h = read_tensor_header(u8[lo:lo + m])
    except CodecError:
        return None
    shape, dtype = h.shape, h.dtype
    if expected is not None:
        shape, dtype = tuple(int(x) for x in expected[0]), np.dtype(expected[1])
        if (shape, dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype) != (h.shape, h.dtype):
            return None
    full = (n, *shape)
    if out is None:
        out = np.empty(full, h.dtype)
    elif out.shape != full or out.dtype != h.dtype or not out.flags.c_contiguous:
        return None
    labels = np.empty(n, np.int64)
    ref = np.ascontiguousarray(u8[lo:lo + h.header_size])
    if k.uniform_tensors(u8, off, ln, ref, h.nbytes, out.reshape(-1).view(np.uint8),
                         labels) >= 0:
        return None
    return TensorBatch(out, labels, np.ones(n, bool), [], h.label is not None)


class TensorCodec(ConfigEquality):
    """numcodecs-style codec between an array and one tensor record (``label`` optional)."""

    codec_id = "lmdbio_tensor"

    def __init__(self, label: int | None = None) -> None:
        self.label = None if label is None else int(label)

    def encode(self, buf: Any) -> bytes:
        return encode_tensor(as_input(buf, "tensor codec"), self.label)

    def decode(self, buf: Any, out: np.ndarray | None = None) -> np.ndarray:
        refuse_object_out(out, "tensor codec")
        arr, _ = decode_tensor(buf)
        if out is not None:
            return fill_out(arr, out, "tensor codec")
        return arr

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "label": self.label}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TensorCodec:
        return cls(**{k: v for k, v in config.items() if k != "id"})

    def __repr__(self) -> str:
        return f"TensorCodec(label={self.label})"


def _register() -> None:
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # numcodecs is optional
        return
    register_codec(TensorCodec)  # type: ignore[arg-type]


_register()
