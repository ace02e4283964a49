"""The row encodings of BTables: the BTable file body and the sparse row record of
``--layout btable``, through compiled kernels (:mod:`.kernels`).

Two byte formats live here:

* The BTable file body (big-endian): rows of ``int32 nnz`` then ``nnz x (int32 column,
  float64 value)``. :func:`scan_btable_rows` walks the row headers (O(rows)) to count rows and
  non-zeros, :func:`decode_btable_rows` fills CSR arrays and validates every column,
  :func:`encode_btable_rows` writes CSR arrays back. They run over a ``uint8`` buffer in one
  compiled pass each, never per value in Python.
* The sparse row record stored as one LMDB value per row by ``--layout btable`` (little-endian,
  so a reader can view it with ``numpy.frombuffer`` without a copy)::

      offset 0              uint32  nnz
      offset 4              uint32  n_cols   (width of the table)
      offset 8              int32   columns[nnz]   (ascending, each < n_cols)
      offset 8 + 4*nnz      4 zero bytes when nnz is odd (so the values are 8-byte aligned
                            relative to the start of the record)
      offset 8 + 8*ceil(nnz/2)  float64 values[nnz]   (non-zero, NaN allowed)

  :data:`ROW_HEAD` is the head (``nnz``, ``n_cols``), :func:`read_row_head` and
  :func:`row_columns` read one record's (compiled code reads the same offsets);
  :func:`encode_row_records` / :func:`decode_row_records` convert between CSR blocks and
  batches of such records; :class:`lmdbio.codecs.btable.codec.SparseRowCodec` is the
  numcodecs-style codec of one record.

Kernels return a status code plus the row and byte offset of the first problem instead of
raising inside compiled code; the callers turn that into a :class:`lmdbio.errors.CodecError`
naming the file, the row and the offset.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from lmdbio.errors import CodecError
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module

# ---- status codes shared by the kernels and their callers -------------------------------------
OK = 0
E_NEG_COUNT = 1  # a row's nnz is negative
E_TRUNCATED = 2  # a row runs past the end of the data
E_COL_NEG = 3  # a column index is negative
E_COL_RANGE = 4  # a column index is >= the number of columns
E_COL_ORDER = 5  # columns not strictly ascending (unsorted)
E_COL_DUP = 6  # the same column twice in one row
E_ZERO = 7  # a stored value is 0.0 or -0.0 (row records only; BTables tolerate it)
E_LENGTH = 8  # a row record's length does not match its nnz

STATUS_TEXT = {
    E_NEG_COUNT: "negative non-zero count",
    E_TRUNCATED: "row runs past the end of the data",
    E_COL_NEG: "negative column index",
    E_COL_RANGE: "column index out of range",
    E_COL_ORDER: "columns not in ascending order",
    E_COL_DUP: "duplicate column",
    E_ZERO: "stored value is zero",
    E_LENGTH: "record length does not match its non-zero count",
}


#: the head of a sparse row record: nnz, n_cols (little-endian uint32 each)
ROW_HEAD = struct.Struct("<II")


def record_nbytes(nnz: np.ndarray | int) -> np.ndarray | int:
    """Bytes of a sparse row record with ``nnz`` non-zeros (vectorised over arrays)."""
    return ROW_HEAD.size + 8 * ((nnz + 1) // 2) + 8 * nnz


def read_row_head(value: Any) -> tuple[int, int]:
    """``(nnz, n_cols)`` of one sparse row record as stored, not checked (the decoders
    check the whole record). Raises :class:`~lmdbio.errors.CodecError` when ``value`` is
    shorter than :data:`ROW_HEAD`."""
    if len(value) < ROW_HEAD.size:
        raise CodecError(f"sparse row record: {len(value)} bytes, its head needs "
                         f"{ROW_HEAD.size}")
    nnz, n_cols = ROW_HEAD.unpack_from(value, 0)
    return nnz, n_cols


def row_columns(value: Any, nnz: int) -> np.ndarray:
    """The ``nnz`` column indices (int32) of one sparse row record: a view into ``value``."""
    return np.frombuffer(value, "<i4", count=nnz, offset=ROW_HEAD.size)


# ---- BTable body ---------------------------------------------------------------------------------
def scan_btable_rows(buf: np.ndarray, start: int,
                     final: bool) -> tuple[int, int, int, int, int, int]:
    """Walk the row headers of a BTable body in ``buf`` from ``start``.

    Returns ``(status, n_rows, nnz, end, err_offset, bad_value)``; ``end`` is the offset after
    the last complete row. With ``final=False`` a row cut by the end of ``buf`` is not an error
    (more data will follow: streaming reads), with ``final=True`` it is ``E_TRUNCATED``.
    """
    scan = kernel_module("lmdbio.codecs.btable").scan
    st, rows, nnz, end, off, bad = scan(read_only(buf), np.int64(start), bool(final))
    return int(st), int(rows), int(nnz), int(end), int(off), int(bad)


def decode_btable_rows(
    buf: np.ndarray, start: int, n_rows: int, nnz: int, n_cols: int
) -> tuple[int, int, int, int, np.ndarray, np.ndarray, np.ndarray]:
    """Decode ``n_rows`` rows (counted by :func:`scan_btable_rows`) into CSR arrays.

    Returns ``(status, row, offset, bad, indptr int64, indices int32, data float64)``.
    """
    indptr = np.empty(n_rows + 1, np.int64)
    indices = np.empty(nnz, np.int32)
    bits = np.empty(nnz, np.uint64)
    decode = kernel_module("lmdbio.codecs.btable").decode
    st, row, off, bad = decode(read_only(buf), np.int64(start), np.int64(n_rows),
                               np.int64(n_cols), indptr, indices, bits)
    return int(st), int(row), int(off), int(bad), indptr, indices, bits.view(np.float64)


def encode_btable_rows(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray) -> np.ndarray:
    """The BTable bytes of the CSR rows ``indptr/indices/data`` (no zero filtering here)."""
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    n_rows = indptr.shape[0] - 1
    nnz = int(indptr[-1] - indptr[0]) if n_rows >= 0 else 0
    if indptr[0] != 0:
        indptr = indptr - indptr[0]
    out = np.empty(4 * n_rows + 12 * nnz, np.uint8)
    bits = np.ascontiguousarray(data, dtype=np.float64).view(np.uint64)
    encode = kernel_module("lmdbio.codecs.btable").encode
    end = encode(indptr, np.ascontiguousarray(indices, dtype=np.int32), bits, out, np.int64(0))
    assert end == out.shape[0]
    return out


# ---- sparse row records (LMDB values of --layout btable) ---------------------------------------
def encode_row_records(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n_cols: int
) -> tuple[np.ndarray, np.ndarray]:
    """Encode every row of a CSR block as one sparse row record, back to back.

    Returns ``(buffer, offsets)`` with ``offsets`` of length ``n_rows + 1``: record ``r`` is
    ``buffer[offsets[r]:offsets[r + 1]]``. Values must already be non-zero and columns sorted.
    """
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    if indptr.shape[0] and indptr[0] != 0:
        indptr = indptr - indptr[0]
    nnz = np.diff(indptr)
    offsets = np.zeros(indptr.shape[0], np.int64)
    np.cumsum(record_nbytes(nnz), out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.uint8)
    bits = np.ascontiguousarray(data, dtype=np.float64).view(np.uint64)
    encode_records = kernel_module("lmdbio.codecs.btable").encode_records
    encode_records(indptr, np.ascontiguousarray(indices, dtype=np.int32), bits,
                   np.int64(n_cols), out, offsets[:-1])
    return out, offsets


def decode_row_records(
    buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, n_cols: int,
    keys: list[bytes] | None = None,
):
    """Decode row records found at ``offsets``/``lengths`` of ``buf`` into a CSR matrix.

    ``buf`` is a ``uint8`` array (for instance the buffer of a page-engine gather); ``keys``
    (optional) only serve to name the bad record in an error. Raises
    :class:`~lmdbio.errors.CodecError` on a malformed record.
    """
    import scipy.sparse as sp

    buf = np.asarray(buf, dtype=np.uint8)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = offsets.shape[0]
    size = buf.shape[0]
    # ``lengths > size - offsets``: ``offsets + lengths`` of corrupt values can wrap around
    # (with no negative offset or length it also refuses an offset past the end)
    if n and (int(offsets.min()) < 0 or int(lengths.min()) < 0
              or bool((lengths > size - offsets).any())):
        raise CodecError("row records: an offset/length points outside the buffer")
    k = kernel_module("lmdbio.codecs.btable").decode_records
    indptr = np.empty(n + 1, np.int64)
    empty_i = np.empty(0, np.int32)
    empty_b = np.empty(0, np.uint64)
    st, r, off, bad = k(buf, offsets, lengths, np.int64(n_cols), indptr, empty_i, empty_b, True)
    if st == OK:
        nnz = int(indptr[-1])
        indices = np.empty(nnz, np.int32)
        bits = np.empty(nnz, np.uint64)
        st, r, off, bad = k(buf, offsets, lengths, np.int64(n_cols), indptr, indices, bits,
                            False)
    if st != OK:
        name = f"key {keys[r]!r}" if keys is not None else f"record {r}"
        raise CodecError(f"sparse row record ({name}), byte {off}: {STATUS_TEXT[st]} "
                         f"(value {bad}, table width {n_cols})")
    return sp.csr_matrix((bits.view(np.float64), indices, indptr), shape=(n, n_cols))


def rows_to_dense_tensor(
    values: list[bytes | memoryview], n_cols: int, dtype: Any = np.float32,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Decode a batch of sparse row records (e.g. LMDB values) into a dense ``(n, n_cols)``
    array of ``dtype`` (``out`` is filled in place when given)."""
    lengths = np.fromiter((len(v) for v in values), np.int64, len(values))
    offsets = np.zeros(len(values), np.int64)
    if len(values) > 1:
        np.cumsum(lengths[:-1], out=offsets[1:])
    buf = np.frombuffer(b"".join(values), np.uint8)
    m = decode_row_records(buf, offsets, lengths, n_cols)
    if out is None:
        out = np.zeros((len(values), n_cols), dtype)
    else:
        if out.shape != (len(values), n_cols):
            raise CodecError(f"out has shape {out.shape}, expected {(len(values), n_cols)}")
        out[...] = 0
    rows = np.repeat(np.arange(len(values)), np.diff(m.indptr))
    out[rows, m.indices] = m.data
    return out
