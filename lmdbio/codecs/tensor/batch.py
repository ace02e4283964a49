"""Batches of tensor records decoded in one pass: :func:`decode_tensor_batch` checks every
header with one vectorized comparison and gathers the data with one compiled call
(:mod:`.kernels`, imported on first use) into an ``(N, *shape)`` array."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lmdbio.codecs.record_batch import KeySource, as_spans, as_u8, key_of
from lmdbio.codecs.tensor.format import (
    FIXED,
    FLAG_LABEL,
    MAGIC,
    VERSION,
    dtype_code,
    header_size,
    read_tensor_header,
)
from lmdbio.errors import CodecError, RecordError

__all__ = ["TensorBatch", "decode_tensor_batch"]


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
    from lmdbio.codecs.tensor import kernels as k

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
        ref[4], ref[5], ref[6] = VERSION, dtype_code(ref_dtype), ndim
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
