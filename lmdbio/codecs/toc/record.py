"""One LMDB value of ``--layout toc``: a mini-batch (header + labels + TOC bytes), as
:func:`encode_batch_value` writes it and :func:`split_batch_value` and
:func:`decode_batch_value` read it."""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.toc.format import DTYPES, FIXED_HEADER, dtype_code, get_varint
from lmdbio.codecs.toc.matrix import Buffer, TocMatrix, as_memoryview, compress
from lmdbio.errors import CodecError

__all__ = ["BATCH_MAGIC", "decode_batch_value", "encode_batch_value", "split_batch_value"]


#: magic of a batch value
BATCH_MAGIC = b"TOCB"
_BATCH_VERSION = 1
_BATCH_HEADER = 16


def encode_batch_value(matrix: Any, labels: np.ndarray | None) -> bytes:
    """One LMDB value holding a mini-batch and its labels.

    Layout (little-endian, 16-byte header so the labels are 8-byte aligned)::

        0  b"TOCB"      magic
        4  u8           version (1)
        5  u8           label dtype code (TOC dtype codes; 255 = no labels)
        6  u16          reserved (0)
        8  u32          rows
        12 u32          label columns per row (1 for a vector of labels, 0 without labels)
        16 rows * label columns * itemsize   labels, row-major, raw
        .. TOC bytes of the matrix (see lmdbio.codecs.toc.format)
    """
    toc = compress(matrix)
    n_rows = _toc_rows(toc)
    if labels is None:
        code, width, raw = 255, 0, b""
    else:
        lab = np.asarray(labels)
        if lab.ndim not in (1, 2) or lab.shape[0] != n_rows:
            raise ValueError(f"labels of shape {lab.shape} for a batch of {n_rows} rows")
        code = dtype_code(lab.dtype)
        width = 1 if lab.ndim == 1 else lab.shape[1]
        raw = np.ascontiguousarray(lab, dtype=lab.dtype.newbyteorder("<")).tobytes()
    header = (BATCH_MAGIC + bytes([_BATCH_VERSION, code, 0, 0]) + n_rows.to_bytes(4, "little")
              + width.to_bytes(4, "little"))
    return header + raw + toc


def _toc_rows(toc: bytes) -> int:
    return get_varint(memoryview(toc), FIXED_HEADER, "rows")[0]


def split_batch_value(value: Buffer) -> tuple[memoryview, np.ndarray]:
    """``(TOC bytes, labels)`` of a batch value without parsing the TOC part.

    The TOC bytes are a view into ``value``; the labels are a copy of shape ``(rows,)`` or
    ``(rows, k)`` (``(rows, 0)`` float64 when the batch was written without labels).
    """
    mv = as_memoryview(value)
    if len(mv) < _BATCH_HEADER:
        raise CodecError(f"TOC batch value is {len(mv)} bytes, shorter than its 16-byte header")
    if bytes(mv[:4]) != BATCH_MAGIC:
        raise CodecError(
            f"not a TOC batch value: magic {bytes(mv[:4])!r}, expected {BATCH_MAGIC!r}")
    if mv[4] != _BATCH_VERSION:
        raise CodecError(f"TOC batch value version {mv[4]} is not supported")
    code = mv[5]
    n_rows = int.from_bytes(mv[8:12], "little")
    width = int.from_bytes(mv[12:16], "little")
    if code == 255:
        if width != 0:
            raise CodecError("TOC batch value: label width set but no label dtype")
        dt = np.dtype(np.float64)
    elif code in DTYPES:
        dt = DTYPES[code]
    else:
        raise CodecError(f"TOC batch value: unknown label dtype code {code} at byte 5")
    nlab = n_rows * width * dt.itemsize
    if _BATCH_HEADER + nlab > len(mv):
        raise CodecError(f"TOC batch value truncated: {n_rows}x{width} labels need {nlab} bytes, "
                         f"{len(mv) - _BATCH_HEADER} present")
    labels = np.frombuffer(mv[_BATCH_HEADER:_BATCH_HEADER + nlab], dt).astype(
        dt.newbyteorder("="), copy=True)
    labels = labels.reshape(n_rows) if width == 1 else labels.reshape(n_rows, width)
    return mv[_BATCH_HEADER + nlab:], labels


def decode_batch_value(value: Buffer, *, verify: bool = True) -> tuple[TocMatrix, np.ndarray]:
    """Inverse of :func:`encode_batch_value`: ``(TocMatrix, labels)``, both owning their data
    (``value`` may be a zero-copy view into an LMDB map that goes away after the call)."""
    toc, labels = split_batch_value(value)
    matrix = TocMatrix.from_bytes(toc, verify=verify)
    if matrix.shape[0] != labels.shape[0]:
        raise CodecError(f"TOC batch value: {labels.shape[0]} labels for a "
                         f"{matrix.shape[0]}-row matrix")
    return matrix, labels
