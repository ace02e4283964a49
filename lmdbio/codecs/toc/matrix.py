"""TOC, tuple-oriented compression: the compressed matrix that ML operations read compressed.

TOC (Li et al., "Tuple-oriented Compression for Large-scale Mini-batch Stochastic Gradient
Descent") compresses a matrix in three layers:

1. *sparse encoding*: each row becomes its non-zero ``(column, value)`` pairs, columns
   ascending;
2. *logical encoding*: an LZW-style prefix tree over pairs, shared by the rows of the batch,
   whose nodes never span two rows; a row becomes a short list of node indices ("codes");
   only the first tree layer (the distinct pairs) and the codes are stored;
3. *physical encoding*: value indexing (each distinct value stored once) and bit packing.

:class:`TocMatrix` rebuilds the tree once from those bytes and then computes ``A·v``,
``v·A``, ``A·M``, ``M·A`` and the sparse-safe element-wise ``A*c`` and ``A**p`` without
decompressing (Theorems 1-4 of the paper): work is proportional to tree nodes plus codes,
which is below the number of non-zeros when rows share subsequences.

Exactness. Values are stored bit-exactly in the input dtype (float16/32/64, integers, bool),
so ``to_dense()`` returns the input, dtype included. A cell counts as zero only when all its
bits are zero: ``-0.0`` and NaN are stored pairs, so they survive the round trip. Operations
compute in float64 and differ from the dense product only by summation order: each result
entry is the same products, grouped along tree paths (the tests require
``|toc - dense| <= 1e-10 * sum|terms|`` and the same NaN positions). Like ``scipy.sparse``,
structural zeros are never multiplied, so ``0 * inf`` or ``0 * nan`` in the *operand* do not
produce NaN as a dense product would.

Corrupt input. The payload ends with a CRC-32; the header is bounds-checked against the
payload length, and the compiled parser checks every index it reads. Any inconsistency raises
:class:`lmdbio.errors.CodecError`.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from lmdbio.codecs.toc.format import (
    CRC_BYTES,
    DTYPES,
    FLAG_COLUMN_COUNTS,
    KERNEL_ERRORS,
    MAX_DIM,
    SECTION_NAMES,
    UINT_OF_SIZE,
    bit_width,
    dtype_code,
    header_bytes,
    packed_size,
    parse_header,
    section_sizes,
)
from lmdbio.errors import CodecError
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module

__all__ = ["MAX_NNZ", "Buffer", "TocMatrix", "as_memoryview", "compress", "decompress", "stats"]


#: dtype code -> (stored little-endian dtype, native dtype; the same object when they agree)
_DTYPE_PAIRS = {code: (dt, dt if dt.isnative else dt.newbyteorder("="))
                for code, dt in DTYPES.items()}

#: status of ``kernels.decode_payload`` for a header that ``parse_header`` explains
_HEADER_ERROR = 10

#: stored pairs of one batch: node numbers (pairs + codes) must stay below 2**31
MAX_NNZ = 1 << 30

Buffer = bytes | bytearray | memoryview | np.ndarray


# ---------------------------------------------------------------------------------------------
# compression


def _pairs_of(matrix: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int], np.dtype]:
    """Sparse encoding: ``(indptr, cols, value bits, shape, dtype)`` of a dense or sparse input."""
    k = kernel_module("lmdbio.codecs.toc")
    if hasattr(matrix, "tocsr") and hasattr(matrix, "nnz"):  # scipy.sparse
        csr = matrix.tocsr()
        if csr.ndim != 2:
            raise ValueError(f"TOC compresses 2-D matrices, got a {csr.ndim}-D sparse array")
        dtype = np.dtype(csr.dtype)
        dtype_code(dtype)
        if not csr.has_canonical_format:
            csr = csr.copy()
            csr.sum_duplicates()
        _check_shape(csr.shape)
        data = np.ascontiguousarray(csr.data, dtype=dtype.newbyteorder("<"))
        # widened to uint64: one compiled specialisation serves every dtype
        bits = data.view(UINT_OF_SIZE[dtype.itemsize]).astype(np.uint64)
        indptr, cols, vbits = k.csr_pairs(
            np.ascontiguousarray(csr.indptr, dtype=np.int64),
            np.ascontiguousarray(csr.indices, dtype=np.int64), bits)
        return indptr, cols, vbits, csr.shape, dtype
    arr = np.asarray(matrix)
    if arr.ndim != 2:
        raise ValueError(f"TOC compresses 2-D matrices, got shape {arr.shape}")
    dtype = np.dtype(arr.dtype)
    dtype_code(dtype)
    _check_shape(arr.shape)
    arr = np.ascontiguousarray(arr, dtype=dtype.newbyteorder("<"))
    bits = arr.view(UINT_OF_SIZE[dtype.itemsize])
    if bits.dtype != np.uint64:  # one compiled specialisation serves every dtype
        bits = bits.astype(np.uint64)
    indptr, cols, vbits = k.dense_pairs(bits)
    return indptr, cols, vbits, arr.shape, dtype


def _check_shape(shape: tuple[int, ...]) -> None:
    if shape[0] > MAX_DIM or shape[1] > MAX_DIM:
        raise ValueError(f"TOC matrices have fewer than 2**31 rows and columns, got {shape}")


def compress(matrix: Any) -> bytes:
    """Compress a 2-D numpy array or a ``scipy.sparse`` matrix into TOC bytes.

    Zeros are cells whose bits are all zero (explicit ``+0.0`` entries of a sparse input are
    dropped, ``-0.0`` is kept); duplicate entries of a non-canonical sparse input are summed,
    as scipy does. The dtype is recorded so :meth:`TocMatrix.to_dense` returns it.
    """
    k = kernel_module("lmdbio.codecs.toc")
    indptr, cols, vbits, shape, dtype = _pairs_of(matrix)
    if cols.size > MAX_NNZ:
        raise ValueError(f"TOC batches hold at most 2**30 non-zeros, got {cols.size}")
    pair_col, pair_vidx, values_bits, row_len, codes, _n_nodes = k.lzw_encode(indptr, cols, vbits)
    values = values_bits.astype(UINT_OF_SIZE[dtype.itemsize]).view(dtype.newbyteorder("<"))
    return _assemble(dtype, shape, pair_col, pair_vidx, values, row_len, codes)


def _assemble(dtype: np.dtype, shape: tuple[int, int], pair_col: np.ndarray,
              pair_vidx: np.ndarray, values: np.ndarray, row_len: np.ndarray,
              codes: np.ndarray) -> bytes:
    """Physical encoding: header, five sections, CRC (layout in ``format``)."""
    k = kernel_module("lmdbio.codecs.toc")
    n_rows, n_cols = shape
    n_first = pair_col.size
    # first-layer columns (sorted): explicit indices or per-column counts, whichever is smaller
    col_w = bit_width(pair_col.max()) if n_first else 0
    col_counts = np.bincount(pair_col, minlength=n_cols).astype(np.int32) if n_first else None
    flags = 0
    col_entries = pair_col
    if col_counts is not None:
        cnt_w = bit_width(col_counts.max())
        if packed_size(n_cols, cnt_w) < packed_size(n_first, col_w):
            flags, col_w, col_entries = FLAG_COLUMN_COUNTS, cnt_w, col_counts
    widths = (
        col_w,
        bit_width(values.size - 1) if values.size else 0,
        bit_width(row_len.max()) if row_len.size else 0,
    )
    counts = (n_rows, n_cols, n_first, values.size, codes.size)
    head = header_bytes(dtype, flags, widths, counts)
    sizes = section_sizes(dtype, flags, widths, counts)
    code_bytes = packed_size(int(k.code_widths_total(row_len, n_first)), 1)
    out = np.zeros(len(head) + sum(sizes) + code_bytes + CRC_BYTES, np.uint8)
    out[: len(head)] = np.frombuffer(bytes(head), np.uint8)
    pos = len(head)
    pos = k.pack_bits(col_entries, widths[0], out, pos)
    pos = k.pack_bits(pair_vidx, widths[1], out, pos)
    raw = np.ascontiguousarray(values, dtype=dtype.newbyteorder("<")).view(np.uint8)
    out[pos: pos + raw.size] = raw
    pos += raw.size
    pos = k.pack_bits(row_len, widths[2], out, pos)
    pos = k.pack_codes(codes, row_len, n_first, out, pos)
    assert pos == out.size - CRC_BYTES
    out[pos:] = np.frombuffer(zlib.crc32(out[:pos]).to_bytes(4, "little"), np.uint8)
    return out.tobytes()


# ---------------------------------------------------------------------------------------------
# the compressed matrix


def as_memoryview(buf: Buffer) -> memoryview:
    """``buf`` as a flat byte memoryview, without a copy where it is contiguous."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            buf = np.ascontiguousarray(buf)
        return memoryview(buf.view(np.uint8).reshape(-1))
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    return mv


_F64 = np.dtype(np.float64)


def _result_dtype(a: np.dtype, b: np.dtype) -> np.dtype:
    if b == _F64:  # the common case, without numpy's promotion machinery
        return _F64
    dt = np.result_type(a, b)
    return dt if dt.kind == "f" else _F64


class TocMatrix:
    """A TOC-compressed matrix that computes without decompressing.

    Build it with :meth:`from_bytes` (or :meth:`from_matrix`). Parsing validates the bytes and
    rebuilds the prefix tree once (one compiled call), keeping only the nodes a result can
    depend on; every operation is then one compiled scan of the tree and the codes. The
    matrix operations ``A·M`` / ``M·A`` compile the tree once more, on first use, into a
    schedule that keeps partial rows only for nodes used at least twice.

    Attributes: ``shape``, ``dtype`` (the input's), ``nbytes`` (compressed size), ``nnz``
    (stored cells), ``n_first`` (distinct pairs), ``n_values`` (distinct values), ``n_codes``.
    """

    __slots__ = ("_off", "_payload", "_pval", "_sched", "_store", "_values", "dtype", "nbytes",
                 "nnz", "shape")

    #: numpy defers ``ndarray @ TocMatrix`` to :meth:`__rmatmul__`
    __array_ufunc__ = None

    def __init__(self) -> None:  # use from_bytes / from_matrix
        self.shape: tuple[int, int] = (0, 0)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, buf: Buffer, *, verify: bool = True) -> TocMatrix:
        """Parse TOC bytes (``bytes``, ``memoryview``, uint8 array); copies what it keeps.

        ``verify=False`` skips the CRC-32 (the structure is still fully bounds-checked, so bad
        bytes can give wrong numbers but never an out-of-bounds access).
        """
        mv = as_memoryview(buf)
        n = len(mv)
        if verify and (n < CRC_BYTES or zlib.crc32(mv[: n - CRC_BYTES])
                       != int.from_bytes(mv[n - CRC_BYTES:], "little")):
            parse_header(mv, verify=True)  # raises, naming what is wrong
            raise CodecError("corrupt TOC payload")  # pragma: no cover - parse_header raised
        raw = np.frombuffer(mv, np.uint8)
        meta, store = kernel_module("lmdbio.codecs.toc").decode_payload(read_only(raw))
        h = meta.tolist()
        if h[0]:
            if h[0] == _HEADER_ERROR:
                parse_header(mv, verify=False)  # raises with the details
                raise CodecError(f"corrupt TOC header ({n} bytes)")  # pragma: no cover
            raise CodecError(f"corrupt TOC payload: {SECTION_NAMES[h[1]]}: "
                             f"{KERNEL_ERRORS[h[0]]} (at index {h[2]})")
        stored, native = _DTYPE_PAIRS[h[3]]
        self = cls.__new__(cls)
        self.shape = (h[5], h[6])
        self.dtype = native
        self.nbytes = n
        self.nnz = h[12]
        self._store = store
        self._off = meta[16:24]
        values = raw[h[13]:h[14]].view(stored)
        self._values = values.astype(native) if stored is not native else values.copy()
        with np.errstate(invalid="ignore"):  # a signalling NaN payload widens quietly
            self._pval = self._values.astype(np.float64)[store[h[17]:h[18]]]
        self._sched = None
        self._payload = (bytes(mv), None)
        return self

    @classmethod
    def from_matrix(cls, matrix: Any) -> TocMatrix:
        """Compress ``matrix`` and parse the result (see :func:`compress`)."""
        return cls.from_bytes(compress(matrix), verify=False)

    # -- structure ----------------------------------------------------------------------------
    def _part(self, i: int) -> np.ndarray:
        return self._store[self._off[i]:self._off[i + 1]]

    @property
    def n_first(self) -> int:
        """Distinct ``(column, value)`` pairs: the first layer of the prefix tree."""
        return int(self._off[1] - self._off[0])

    @property
    def n_values(self) -> int:
        """Distinct values (value indexing)."""
        return int(self._values.size)

    @property
    def n_codes(self) -> int:
        """Tree-node references of all rows together."""
        return int(self._off[4] - self._off[3])

    @property
    def n_live_nodes(self) -> int:
        """Tree nodes a result can depend on (each costs one multiply-add per operation)."""
        return int(self._off[5] - self._off[4] + self._off[7] - self._off[6])

    @property
    def n_shared_nodes(self) -> int:
        """Live nodes used at least twice: those whose partial rows ``A·M`` / ``M·A`` keep."""
        return int(self._schedule()[1])

    def _schedule(self) -> tuple[np.ndarray, int]:
        if self._sched is None:
            self._sched = kernel_module("lmdbio.codecs.toc").schedule_of(self._store, self._off, 2)
        return self._sched

    def __repr__(self) -> str:
        return (f"TocMatrix(shape={self.shape}, dtype={self.dtype}, nnz={self.nnz}, "
                f"pairs={self.n_first}, codes={self.n_codes}, nbytes={self.nbytes})")

    # -- operations ---------------------------------------------------------------------------
    def matvec(self, v: Any) -> np.ndarray:
        """``A·v`` for a vector of length ``shape[1]``."""
        v = np.asarray(v)
        if v.shape != (self.shape[1],):
            raise ValueError(f"matvec: vector of shape {v.shape}, expected ({self.shape[1]},)")
        out = kernel_module("lmdbio.codecs.toc").matvec(self._store, self._off, self._pval, _f64(v))
        return out.astype(_result_dtype(self.dtype, v.dtype), copy=False)

    def rmatvec(self, v: Any) -> np.ndarray:
        """``v·A`` for a vector of length ``shape[0]``."""
        v = np.asarray(v)
        if v.shape != (self.shape[0],):
            raise ValueError(f"rmatvec: vector of shape {v.shape}, expected ({self.shape[0]},)")
        rmatvec = kernel_module("lmdbio.codecs.toc").rmatvec
        out = rmatvec(self._store, self._off, self._pval, _f64(v), self.shape[1])
        return out.astype(_result_dtype(self.dtype, v.dtype), copy=False)

    def matmat(self, M: Any) -> np.ndarray:
        """``A·M`` for a matrix of shape ``(shape[1], p)``."""
        M = np.asarray(M)
        if M.ndim != 2 or M.shape[0] != self.shape[1]:
            raise ValueError(f"matmat: matrix of shape {M.shape}, expected ({self.shape[1]}, p)")
        sched, n_shared = self._schedule()
        matmat = kernel_module("lmdbio.codecs.toc").matmat
        out = matmat(self._store, self._off, sched, n_shared, self._pval, _f64(M))
        return out.astype(_result_dtype(self.dtype, M.dtype), copy=False)

    def rmatmat(self, M: Any) -> np.ndarray:
        """``M·A`` for a matrix of shape ``(p, shape[0])``."""
        M = np.asarray(M)
        if M.ndim != 2 or M.shape[1] != self.shape[0]:
            raise ValueError(f"rmatmat: matrix of shape {M.shape}, expected (p, {self.shape[0]})")
        sched, n_shared = self._schedule()
        rmatmat_t = kernel_module("lmdbio.codecs.toc").rmatmat_t
        out_t = rmatmat_t(self._store, self._off, sched, n_shared, self._pval, _f64(M.T),
                          self.shape[1])
        return np.ascontiguousarray(out_t.T, dtype=_result_dtype(self.dtype, M.dtype))

    def __matmul__(self, other: Any) -> np.ndarray:
        other = np.asarray(other)
        return self.matvec(other) if other.ndim == 1 else self.matmat(other)

    def __rmatmul__(self, other: Any) -> np.ndarray:
        other = np.asarray(other)
        return self.rmatvec(other) if other.ndim == 1 else self.rmatmat(other)

    # -- sparse-safe element-wise operations: rewrite the first layer only --------------------
    def scale(self, c: float) -> TocMatrix:
        """``A * c`` element-wise on the stored cells (numpy's dtype rules); structural zeros
        stay ``+0``. ``c`` must be finite (``0 * inf`` is NaN: not sparse-safe)."""
        if not np.isfinite(c):
            raise ValueError(f"scale: {c} is not finite, and A*{c} would not be sparse-safe")
        return self._with_values(self._values * c)

    def power(self, p: float) -> TocMatrix:
        """``A ** p`` element-wise; ``p`` must be > 0 so that zeros stay zero."""
        if not p > 0:
            raise ValueError(f"power: exponent {p} must be > 0 to keep zeros zero")
        return self._with_values(self._values ** p)

    def _with_values(self, values: np.ndarray) -> TocMatrix:
        values = np.asarray(values)
        dtype_code(values.dtype)
        new = TocMatrix.__new__(TocMatrix)
        for name in TocMatrix.__slots__:
            setattr(new, name, getattr(self, name))
        new._values = values
        new.dtype = values.dtype
        new._pval = values.astype(np.float64)[self._part(1)]
        # same header and sections; only the value section changes size with the item size
        new.nbytes = self.nbytes + values.size * (values.dtype.itemsize - self.dtype.itemsize)
        new._payload = (None, self)  # serialized by to_bytes, on demand
        return new

    # -- decoding -----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The TOC bytes of this matrix (after ``scale``/``power``: with the new values)."""
        data, source = self._payload
        if data is not None:
            return data
        sp_bytes = source.to_bytes()
        sh = parse_header(memoryview(sp_bytes), verify=False)
        values = self._values
        if values.dtype == source.dtype:
            s3, e3 = sh.sections[2]
            body = bytearray(sp_bytes[: len(sp_bytes) - CRC_BYTES])
            body[s3:e3] = values.astype(values.dtype.newbyteorder("<")).tobytes()
            data = bytes(body + zlib.crc32(body).to_bytes(4, "little"))
        else:
            raw = np.frombuffer(sp_bytes, np.uint8)
            k = kernel_module("lmdbio.codecs.toc")
            (s4, e4), (s5, e5) = sh.sections[3], sh.sections[4]
            row_len = _unpack(k, raw, s4, e4, sh.n_rows, sh.rowlen_w, "row lengths")
            _status, _where, codes = k.unpack_codes(raw, s5, e5, row_len, sh.n_first,
                                                    sh.n_codes)
            data = _assemble(values.dtype, self.shape, self._part(0), self._part(1), values,
                             row_len, codes)
        self._payload = (data, None)
        return data

    def to_csr(self) -> Any:
        """The matrix as ``scipy.sparse.csr_matrix`` with the stored pairs (sorted, exact)."""
        import scipy.sparse as sp

        expand = kernel_module("lmdbio.codecs.toc").expand
        indptr, indices, pids = expand(self._store, self._off, self.nnz)
        data = self._values[self._part(1)[pids]] if pids.size else np.zeros(0, self.dtype)
        return sp.csr_matrix((data, indices, indptr), shape=self.shape)

    def to_dense(self) -> np.ndarray:
        """The matrix as a dense array of the input dtype, bit-exact."""
        out = np.zeros(self.shape, self.dtype)
        if self.nnz:
            ubits = UINT_OF_SIZE[self.dtype.itemsize]
            expand_dense = kernel_module("lmdbio.codecs.toc").expand_dense
            expand_dense(self._store, self._off, self._values.view(ubits), out.view(ubits))
        return out

    def toarray(self) -> np.ndarray:
        """Alias of :meth:`to_dense` (scipy's name)."""
        return self.to_dense()


def _f64(a: np.ndarray) -> np.ndarray:
    if a.dtype == _F64 and a.flags.c_contiguous:
        return a
    if a.dtype.kind not in "fiub":
        raise TypeError(f"TOC operations take real operands, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float64)


def _unpack(k: Any, raw: np.ndarray, start: int, stop: int, count: int, width: int,
            what: str) -> np.ndarray:
    status, vals = k.unpack_bits(raw, start, stop, count, width)
    if status:
        raise CodecError(f"corrupt TOC payload: {what} (bytes {start}..{stop}): "
                         f"{KERNEL_ERRORS[status]}")
    return vals


def decompress(buf: Buffer, *, verify: bool = True) -> np.ndarray:
    """Dense array of TOC bytes (shortcut for ``TocMatrix.from_bytes(buf).to_dense()``)."""
    return TocMatrix.from_bytes(buf, verify=verify).to_dense()


def stats(m: TocMatrix) -> dict[str, Any]:
    """Sizes of the parts of a compressed matrix (for benchmarks and the docs)."""
    return {"shape": list(m.shape), "nnz": m.nnz, "pairs": m.n_first, "values": m.n_values,
            "codes": m.n_codes, "live_nodes": m.n_live_nodes, "shared_nodes": m.n_shared_nodes,
            "nbytes": m.nbytes}
