"""numba kernels of :mod:`lmdbio.codecs.btable.rows` (imported on first use only).

Each returns a status code (``lmdbio.codecs.btable.rows.E_*``) plus where the problem is,
instead of raising inside compiled code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OK = 0
E_NEG_COUNT = 1
E_TRUNCATED = 2
E_COL_NEG = 3
E_COL_RANGE = 4
E_COL_ORDER = 5
E_COL_DUP = 6
E_ZERO = 7
E_LENGTH = 8


@njit(cache=True, nogil=True)
def be_i32(buf, p):
    v = (np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16) | \
        (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3])
    if v >= 2147483648:
        v -= 4294967296
    return v

@njit(cache=True, nogil=True)
def scan(buf, start, final):
    """Walk row headers from ``start``. Returns (status, n_rows, nnz, end, err_offset, bad):
    ``end`` is where the first incomplete row begins (== len when all rows are complete).
    An incomplete row is an error only when ``final`` (no more data will come)."""
    n = buf.shape[0]
    p = np.int64(start)
    rows = np.int64(0)
    nnz = np.int64(0)
    while p < n:
        if n - p < 4:
            if final:
                return E_TRUNCATED, rows, nnz, p, p, n - p
            break
        c = be_i32(buf, p)
        if c < 0:
            return E_NEG_COUNT, rows, nnz, p, p, c
        if n - p - 4 < 12 * c:
            if final:
                return E_TRUNCATED, rows, nnz, p, p, c
            break
        p += 4 + 12 * c
        rows += 1
        nnz += c
    return OK, rows, nnz, p, -1, 0

@njit(cache=True, nogil=True)
def decode(buf, start, n_rows, n_cols, indptr, indices, bits):
    """Fill CSR arrays for ``n_rows`` rows (already checked by ``scan``) from ``start``.
    Returns (status, row, byte offset, offending value)."""
    p = np.int64(start)
    k = np.int64(0)
    indptr[0] = 0
    for r in range(n_rows):
        c = be_i32(buf, p)
        p += 4
        prev = np.int64(-1)
        for _ in range(c):
            col = be_i32(buf, p)
            if col < 0:
                return E_COL_NEG, r, p, col
            if col >= n_cols:
                return E_COL_RANGE, r, p, col
            if col == prev:
                return E_COL_DUP, r, p, col
            if col < prev:
                return E_COL_ORDER, r, p, col
            prev = col
            b = np.uint64(0)
            for j in range(8):
                b = (b << np.uint64(8)) | np.uint64(buf[p + 4 + j])
            indices[k] = col
            bits[k] = b
            k += 1
            p += 12
        indptr[r + 1] = k
    return OK, -1, -1, 0

@njit(cache=True, nogil=True)
def encode(indptr, indices, bits, out, start):
    """Write rows big-endian into ``out`` from ``start``; returns the end offset."""
    p = np.int64(start)
    for r in range(indptr.shape[0] - 1):
        a = indptr[r]
        e = indptr[r + 1]
        c = np.uint32(e - a)
        out[p] = (c >> 24) & 0xFF
        out[p + 1] = (c >> 16) & 0xFF
        out[p + 2] = (c >> 8) & 0xFF
        out[p + 3] = c & 0xFF
        p += 4
        for k in range(a, e):
            col = np.uint32(indices[k])
            out[p] = (col >> 24) & 0xFF
            out[p + 1] = (col >> 16) & 0xFF
            out[p + 2] = (col >> 8) & 0xFF
            out[p + 3] = col & 0xFF
            b = bits[k]
            for j in range(8):
                out[p + 4 + j] = (b >> np.uint64(56 - 8 * j)) & np.uint64(0xFF)
            p += 12
    return p

@njit(cache=True, nogil=True)
def encode_records(indptr, indices, bits, n_cols, out, offsets):
    """Write one little-endian sparse row record per row into ``out`` at ``offsets``."""
    for r in range(indptr.shape[0] - 1):
        a = indptr[r]
        e = indptr[r + 1]
        c = e - a
        p = offsets[r]
        for j in range(4):
            out[p + j] = (np.uint32(c) >> (8 * j)) & 0xFF
            out[p + 4 + j] = (np.uint32(n_cols) >> (8 * j)) & 0xFF
        q = p + 8
        for k in range(a, e):
            col = np.uint32(indices[k])
            for j in range(4):
                out[q + j] = (col >> (8 * j)) & 0xFF
            q += 4
        if c % 2 == 1:
            for j in range(4):
                out[q + j] = 0
            q += 4
        for k in range(a, e):
            b = bits[k]
            for j in range(8):
                out[q + j] = (b >> np.uint64(8 * j)) & np.uint64(0xFF)
            q += 8
    return 0

@njit(cache=True, nogil=True)
def decode_records(buf, offsets, lengths, n_cols, indptr, indices, bits, count_only):
    """Parse row records at ``offsets``/``lengths`` of ``buf``. With ``count_only`` only
    fills ``indptr`` (after validating lengths); else fills columns and value bits too.
    Returns (status, record, byte offset within the record, offending value)."""
    k = np.int64(0)
    indptr[0] = 0
    for r in range(offsets.shape[0]):
        p = offsets[r]
        ln = lengths[r]
        if ln < 8:
            return E_LENGTH, r, 0, ln
        c = np.int64(0)
        w = np.int64(0)
        for j in range(4):
            c |= np.int64(buf[p + j]) << (8 * j)
            w |= np.int64(buf[p + 4 + j]) << (8 * j)
        if 8 + 8 * ((c + 1) // 2) + 8 * c != ln:
            return E_LENGTH, r, 0, c
        if w != n_cols:
            return E_COL_RANGE, r, 4, w
        if not count_only:
            q = p + 8
            v = p + 8 + 8 * ((c + 1) // 2)
            prev = np.int64(-1)
            for i in range(c):
                col = np.int64(0)
                for j in range(4):
                    col |= np.int64(buf[q + j]) << (8 * j)
                if col >= 2147483648:
                    col -= 4294967296
                if col < 0:
                    return E_COL_NEG, r, q - p, col
                if col >= n_cols:
                    return E_COL_RANGE, r, q - p, col
                if col == prev:
                    return E_COL_DUP, r, q - p, col
                if col < prev:
                    return E_COL_ORDER, r, q - p, col
                prev = col
                b = np.uint64(0)
                for j in range(8):
                    b |= np.uint64(buf[v + j]) << np.uint64(8 * j)
                if (b << np.uint64(1)) == np.uint64(0):
                    return E_ZERO, r, v - p, col
                indices[k + i] = col
                bits[k + i] = b
                q += 4
                v += 8
        k += c
        indptr[r + 1] = k
    return OK, -1, -1, 0
