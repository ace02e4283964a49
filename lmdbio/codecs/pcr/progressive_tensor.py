"""Progressive numeric tensors: byte planes, most significant first (PCR beyond images).

A group of N same-shaped items (rows of a feature matrix, small tensors) is stored as a PCR
value of kind 2 (header layout in :mod:`lmdbio.codecs.pcr.format`): after the header come W byte
planes (W = itemsize), plane 1 holding the most significant byte of every element of every
item, plane 2 the next byte, and so on. Reading the first ``k`` planes (a prefix of the
value, :func:`lmdbio.codecs.pcr.pcr_prefix_bytes`) gives the data at reduced precision;
reading all W planes gives it exactly.

What ``k`` planes hold, IEEE floats being sign | exponent | mantissa from the top:

=========  ==================================================================================
float32    k=1: sign + 7 of 8 exponent bits; k=2: sign + exponent + 7 mantissa bits (exactly
           bfloat16); k=3: 15 mantissa bits; k=4: exact
float64    k=1: sign + 7 of 11 exponent bits; k=2: full exponent + 4 mantissa bits; k=3: 12
           bits; ... k=8 exact
float16    k=1: sign + exponent + 2 mantissa bits; k=2 exact
integers   the top 8k bits (two's complement for signed)
=========  ==================================================================================

Missing low bits are filled with the midpoint of the interval the prefix leaves (a 1 followed
by zeros), which halves the worst-case error of plain truncation and removes its bias, except
where that would be wrong: floats whose exponent is not complete yet (zero fill), zeros and
subnormals (exponent field 0: zero fill, so exact zeros stay 0.0), infinities and NaNs
(exponent all ones: left as read). ``fill="zero"`` gives plain truncation everywhere.
Everything is whole-array numpy (one pass per plane). The codec is
:class:`lmdbio.codecs.pcr.codec.ProgressiveTensorCodec`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmdbio.codecs.pcr.format import (
    KIND_TENSOR,
    TENSOR_HEAD,
    PCRHeader,
    build_header,
    parse_header,
)
from lmdbio.errors import CodecError

_EXP_BITS = {2: 5, 4: 8, 8: 11}  # float itemsize -> exponent bits


def _check_dtype(dtype: np.dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind not in "fiub" or dtype.itemsize not in (1, 2, 4, 8):
        raise CodecError(f"byte-plane tensors support float16/32/64 and integers, not {dtype}")
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def to_planes(x: np.ndarray) -> np.ndarray:
    """``(W, x.size)`` uint8 planes of ``x``, plane 0 = most significant byte."""
    dtype = _check_dtype(x.dtype)
    a = np.ascontiguousarray(x, dtype=dtype).reshape(-1)
    b = a.view(np.uint8).reshape(a.shape[0], dtype.itemsize)  # little-endian bytes
    return np.ascontiguousarray(b[:, ::-1].T)


def from_planes(planes: np.ndarray, dtype: Any, fill: str = "mid") -> np.ndarray:
    """Rebuild a flat array of ``dtype`` from its first ``k`` planes (``planes`` is
    ``(k, M)`` uint8, most significant first). See the module docstring for ``fill``."""
    dtype = _check_dtype(dtype)
    w = dtype.itemsize
    k = planes.shape[0]
    if not 1 <= k <= w:
        raise CodecError(f"{k} planes for a {w}-byte dtype")
    m = planes.shape[1]
    native = dtype.newbyteorder("=")
    b = np.zeros((m, w), np.uint8)
    for p in range(k):  # little-endian byte w-1-p is plane p (big-endian hosts: byte p)
        b[:, (w - 1 - p) if sys.byteorder == "little" else p] = planes[p]
    out = b.view(native).reshape(m)
    if k == w or fill == "zero":
        return out
    if fill != "mid":
        raise CodecError(f"fill must be 'mid' or 'zero', not {fill!r}")
    u = out.view(np.dtype(f"u{w}"))
    bit = np.array(1, u.dtype) << np.array(8 * (w - k) - 1, u.dtype)
    if dtype.kind == "f":
        e = _EXP_BITS[w]
        if 8 * k < 1 + e:
            return out  # exponent incomplete: truncation (zero fill)
        mbits = 8 * w - 1 - e
        exp = (u >> np.array(mbits, u.dtype)) & np.array((1 << e) - 1, u.dtype)
        ok = (exp != 0) & (exp != (1 << e) - 1)
        u[ok] |= bit
    else:
        u |= bit
    return out


def encode_planes_value(items: np.ndarray, labels: Sequence[int] | np.ndarray | None = None,
                        keys: Sequence[bytes] | None = None) -> bytes:
    """One PCR value of kind 2 holding the N items ``items[0] ... items[N-1]``."""
    a = np.asarray(items)
    if a.ndim < 1 or a.shape[0] < 1:
        raise CodecError("need at least one item (axis 0 indexes items)")
    dtype = _check_dtype(a.dtype)
    n = a.shape[0]
    planes = to_planes(a)
    w = dtype.itemsize
    labels = np.zeros(n, np.int64) if labels is None else np.asarray(labels, np.int64)
    keys = [b"%d" % i for i in range(n)] if keys is None else list(keys)
    shape = a.shape[1:]
    middle = (TENSOR_HEAD.pack(dtype.str.encode("ascii"), len(shape), 0)
              + np.array(shape, "<u8").tobytes())
    header = build_header(KIND_TENSOR, [planes.shape[1]] * w, labels, keys,
                              middle=middle)
    return header + planes.tobytes()


def decode_planes_value(value_prefix: bytes | memoryview | np.ndarray, k: int,
                        header: PCRHeader | None = None, fill: str = "mid") -> np.ndarray:
    """The items of a kind-2 PCR value at the precision of its first ``k`` planes, as an array
    ``(N, *item_shape)`` of the stored dtype. ``value_prefix`` needs at least
    ``pcr_prefix_bytes(value, k)`` bytes."""
    buf = value_prefix if isinstance(value_prefix, np.ndarray) else \
        np.frombuffer(value_prefix, np.uint8)
    hdr = header or parse_header(buf)
    if hdr.kind != KIND_TENSOR or hdr.dtype is None:
        raise CodecError("PCR value does not hold a byte-plane tensor")
    w = hdr.dtype.itemsize
    if hdr.n_groups != w:
        raise CodecError(f"PCR tensor value: {hdr.n_groups} groups for a {w}-byte dtype")
    m = hdr.n_items * int(np.prod(hdr.item_shape, dtype=np.int64))
    ends = hdr.group_end.astype(np.int64)
    if not np.array_equal(np.diff(np.concatenate(([hdr.header_bytes], ends))),
                          np.full(w, m)):
        raise CodecError(f"PCR tensor value: planes are not {m} bytes each")
    kk = max(1, min(int(k), w))
    need = int(ends[kk - 1])
    if buf.shape[0] < need:
        raise CodecError(f"PCR tensor prefix has {buf.shape[0]} bytes; {kk} planes need {need}")
    planes = buf[hdr.header_bytes:need].reshape(kk, m)
    return from_planes(planes, hdr.dtype, fill).reshape((hdr.n_items, *hdr.item_shape))
