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
from lmdbio.kernel_cache import kernel_module

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
    k = kernel_module("lmdbio.codecs.tensor")
    u8 = as_u8(buf)
    off, ln = as_spans(offsets, lengths)
    n = off.shape[0]
    fast = _uniform_batch(k, u8, off, ln, expected, out)
    if fast is not None:
        return fast
    bad: dict[int, str] = {}
    if expected is None:
        ref_shape, ref_dtype, ref_has_label = _first_record_reference(u8, off, ln, keys,
                                                                      errors, bad)
    else:
        ref_shape = tuple(int(x) for x in expected[0])
        ref_dtype = np.dtype(expected[1])
        ref_has_label = None  # either is accepted; decided by the first good record
    hs = header_size(len(ref_shape))
    nbytes = math.prod(ref_shape) * ref_dtype.itemsize
    valid = np.zeros(n, bool)
    heads = np.zeros((n, hs), np.uint8)
    if n:
        k.gather_headers(u8, off, ln, hs, heads)
        valid, ref_has_label = _matching_headers(u8, off, ln, heads, ref_shape, ref_dtype,
                                                 ref_has_label)
        for i in np.flatnonzero(~valid).tolist():
            if i not in bad:
                bad[i] = _explain_mismatch(u8, int(off[i]), int(ln[i]), ref_shape, ref_dtype,
                                           ref_has_label)
    if bad and errors == "raise":
        i = min(bad)
        raise RecordError(key_of(keys, i), bad[i])
    out = _output_array(out, (n, *ref_shape), ref_dtype, valid, bool(bad))
    _gather_data(k, u8, off, np.flatnonzero(valid), hs, nbytes, out, keys)
    labels = np.ascontiguousarray(heads[:, 16:24]).view("<i8").reshape(-1).astype(np.int64)
    if not ref_has_label:
        labels[:] = 0
    labels[~valid] = 0
    errs = [RecordError(key_of(keys, i), bad[i]) for i in sorted(bad)]
    return TensorBatch(out, labels, valid, errs, bool(ref_has_label))


def _span_error(lo: int, m: int, size: int) -> str | None:
    """Why the span ``[lo, lo + m)`` cannot be a record of a ``size``-byte buffer, or None."""
    if lo < 0 or m < 0 or lo + m > size:
        return f"tensor record: span [{lo}, {lo + m}) lies outside the {size}-byte buffer"
    return None


def _first_record_reference(
    u8: np.ndarray, off: np.ndarray, ln: np.ndarray, keys: KeySource,
    errors: Literal["raise", "mask"], bad: dict[int, str],
) -> tuple[tuple[int, ...], np.dtype[Any], bool]:
    """``(shape, dtype, labelled)`` of the first record whose header reads, which every
    record must match; the records before it are added to ``bad`` (with ``errors="raise"``
    the first one raises :class:`~lmdbio.errors.RecordError`). ``((), uint8, False)`` when
    none reads."""
    ref_h = None
    for i in range(off.shape[0]):
        lo, m = int(off[i]), int(ln[i])
        try:
            span_error = _span_error(lo, m, u8.shape[0])
            if span_error is not None:
                raise CodecError(span_error)
            ref_h = read_tensor_header(u8[lo:lo + m])
            break
        except CodecError as exc:
            bad[i] = str(exc)
            if errors == "raise":
                raise RecordError(key_of(keys, i), str(exc)) from None
    if ref_h is None:
        return (), np.dtype("u1"), False
    return ref_h.shape, ref_h.dtype, ref_h.label is not None


def _header_template(ref_shape: tuple[int, ...], ref_dtype: np.dtype[Any]) -> np.ndarray:
    """The header bytes of a record of ``ref_shape`` and ``ref_dtype`` (flags and label
    zero), to compare every record's header with byte by byte."""
    ndim = len(ref_shape)
    hs = header_size(ndim)
    ref = np.zeros(hs, np.uint8)
    ref[:4] = np.frombuffer(MAGIC, np.uint8)
    ref[4], ref[5], ref[6] = VERSION, dtype_code(ref_dtype), ndim
    ref[8:10].view("<u2")[0] = hs
    ref[FIXED:FIXED + 8 * ndim].view("<u8")[:] = ref_shape
    return ref


def _matching_headers(
    u8: np.ndarray, off: np.ndarray, ln: np.ndarray, heads: np.ndarray,
    ref_shape: tuple[int, ...], ref_dtype: np.dtype[Any], ref_has_label: bool | None,
) -> tuple[np.ndarray, bool]:
    """``(valid, labelled)``: which records' headers (``heads``, ``(N, header size)``) equal
    the reference's and whose spans hold exactly its data, compared for all records at once.
    ``ref_has_label=None`` accepts either and takes the first good record's."""
    hs = heads.shape[1]
    nbytes = math.prod(ref_shape) * ref_dtype.itemsize
    ref = _header_template(ref_shape, ref_dtype)
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
    return same, ref_has_label


def _explain_mismatch(u8: np.ndarray, lo: int, m: int, ref_shape: tuple[int, ...],
                      ref_dtype: np.dtype[Any], ref_has_label: bool) -> str:
    """Why the record ``u8[lo:lo + m]`` failed the header comparison, for its error."""
    span_error = _span_error(lo, m, u8.shape[0])
    if span_error is not None:
        return span_error
    try:
        h = read_tensor_header(u8[lo:lo + m])
    except CodecError as exc:
        return str(exc)
    return (f"tensor record: shape {h.shape} {h.dtype}, labelled={h.label is not None} "
            f"differs from the batch's {ref_shape} {ref_dtype}, labelled={ref_has_label}")


def _output_array(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype[Any],
                  valid: np.ndarray, any_bad: bool) -> np.ndarray:
    """The array to decode into: a new one, or the caller's ``out`` once checked; rows of
    bad records are zero."""
    if out is None:
        return np.zeros(shape, dtype) if any_bad else np.empty(shape, dtype)
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise CodecError(f"tensor batch: out must be C-contiguous {shape} {dtype}, "
                         f"got {out.shape} {out.dtype}")
    if any_bad:
        out[~valid] = 0
    return out


def _gather_data(k: Any, u8: np.ndarray, off: np.ndarray, rows: np.ndarray, hs: int,
                 nbytes: int, out: np.ndarray, keys: KeySource) -> None:
    """Copy the data of the records ``rows`` (after their ``hs``-byte headers) into their
    rows of ``out`` with one compiled gather (straight into ``out`` when every row is
    valid)."""
    n = out.shape[0]
    if not (rows.size and nbytes):
        return
    flat = out.reshape(-1).view(np.uint8)
    target = flat if rows.size == n else np.empty(rows.size * nbytes, np.uint8)
    j = k.gather_rows(u8, off[rows] + hs, nbytes, target)
    if j >= 0:  # cannot happen after the span check; kept as a last line of defence
        raise RecordError(key_of(keys, int(rows[j])), "record lies outside the buffer")
    if target is not flat:
        flat.reshape(n, nbytes)[rows] = target.reshape(rows.size, nbytes)


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
