"""The IBP model (mask and bit values per chunk column) and how it is fitted.

A row of any fixed-size dtype is viewed as ``n`` chunks of ``C`` = 4 or 8 bytes (``W`` = 32
or 64 bits), zero-padded at the end when its size is not a multiple of ``C`` (decompression
strips the padding). Chunk ``j`` is compressible iff ``(x & mask[j]) == bitval[j]``; it then
stores only its ``W - popcount(mask[j])`` free bits. A model may hold ``k`` masks (clustered
compression); every packed row then carries the id of the mask it used.

Fitting (:func:`fit`) counts, per chunk column and bit, how many rows have the bit set (from
per-byte histograms, one pass over the data) and builds candidate masks:

* ``search="global"``: the authors' rule -- bit invariant-1 if count > T*N, invariant-0 if
  count < (1-T)*N -- for T = 0.70, 0.75, ... 0.95, keeping the T whose saving
  ``sum(max(0, saved_bits - n))`` (one participation bit charged per chunk) is largest;
* ``search="column"``: per column, the best mask among the nested prefixes of its bits ordered
  by agreement (exact, from a histogram of first-mismatch ranks), refined on the rows that end
  up compressed, and again with a Wilson lower bound on each prefix's match rate (smaller
  masks where the evidence is thin, which helps sampled fits);
* ``search="auto"`` (default): the candidates of both plus a finer global grid, keeping the one
  whose stored layout (word-rounded rows, raw fallback) is smallest.

A fixed ``threshold`` uses the authors' rule for that T alone.
"""

from __future__ import annotations

import hashlib
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.errors import CodecError
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module

if TYPE_CHECKING:
    from lmdbio.codecs.ibp.packed import IBPPacked

MODEL_MAGIC = b"IBPM"
MODEL_VERSION = 1
#: thresholds of the authors' sweep (their loop: 0.70 to 1.0 step 0.05; 1.0 never masks a bit)
PAPER_THRESHOLDS = (0.70, 0.75, 0.80, 0.85, 0.90, 0.95)
#: the finer grid ``search="auto"`` adds
AUTO_THRESHOLDS = tuple(round(0.5 + 0.025 * i, 3) for i in range(20))
SEARCHES = ("auto", "global", "column", "fixed", "clustered")
_ALLOWED_KINDS = set("biufcmMV")
_MAX_CLUSTERS = 65535

# model header: magic, version, chunk_bytes, search code, ndim, nchunks, nclusters, row_bytes,
# threshold, dtype string length
_MODEL_HEAD = struct.Struct("<4sBBBBIIQdH")


def _words_dtype(chunk_bytes: int) -> np.dtype:
    return np.dtype("<u4") if chunk_bytes == 4 else np.dtype("<u8")


def check_chunk_bytes(chunk_bytes: int) -> int:
    """``chunk_bytes`` as an int; a CodecError unless it is 4 or 8."""
    if chunk_bytes not in (4, 8):
        raise CodecError(f"IBP chunk_bytes must be 4 or 8, not {chunk_bytes!r}")
    return int(chunk_bytes)


def popcount(a: np.ndarray) -> np.ndarray:
    """The number of set bits of every element of ``a``, as int64."""
    return np.bitwise_count(a.astype(np.uint64)).astype(np.int64)


@dataclass(eq=False)
class IBPModel:
    """Masks and bit values of one data set (``k`` x ``n`` words each), plus the row type.

    Attributes are read-only by convention; derived tables (popcounts, free-bit masks, deposit
    runs) are computed once in ``__post_init__`` for the decoders.
    """

    dtype: np.dtype
    row_shape: tuple[int, ...]
    chunk_bytes: int
    masks: np.ndarray  # (k, n) uint32/uint64
    bitvals: np.ndarray  # (k, n)
    threshold: float = float("nan")
    search: str = "fixed"
    # derived
    row_bytes: int = field(init=False)
    nchunks: int = field(init=False)
    width: int = field(init=False)
    meta_words: int = field(init=False)
    pcs: np.ndarray = field(init=False, repr=False)
    pcs64: np.ndarray = field(init=False, repr=False)
    masks64: np.ndarray = field(init=False, repr=False)
    bitvals64: np.ndarray = field(init=False, repr=False)
    frees64: np.ndarray = field(init=False, repr=False)
    _bytes: bytes | None = field(init=False, default=None, repr=False)
    _id: bytes | None = field(init=False, default=None, repr=False)
    _runs: tuple[np.ndarray, ...] | None = field(init=False, default=None, repr=False)
    _pairs: tuple[np.ndarray, ...] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype)
        if self.dtype.kind not in _ALLOWED_KINDS or self.dtype.itemsize == 0 or (
                self.dtype.fields is not None):
            raise CodecError(f"IBP handles fixed-size plain dtypes, not {self.dtype}")
        self.row_shape = tuple(int(s) for s in self.row_shape)
        if any(s < 0 for s in self.row_shape):
            raise CodecError(f"IBP row shape {self.row_shape} has a negative dimension")
        self.chunk_bytes = check_chunk_bytes(self.chunk_bytes)
        self.row_bytes = int(math.prod(self.row_shape)) * self.dtype.itemsize
        if self.row_bytes == 0:
            raise CodecError("IBP rows must hold at least one byte")
        self.nchunks = -(-self.row_bytes // self.chunk_bytes)
        self.width = 8 * self.chunk_bytes
        self.meta_words = -(-self.nchunks // self.width)
        wd = _words_dtype(self.chunk_bytes)
        for given in (self.masks, self.bitvals):
            g = np.asarray(given)
            if g.dtype.kind not in "ui" or (g.size and (g.min() < 0 or (
                    self.chunk_bytes == 4 and int(g.max()) > 0xFFFFFFFF))):
                raise CodecError(f"IBP masks and bitvals must be unsigned {self.width}-bit "
                                 f"integers")
        masks = np.array(self.masks, dtype=wd)  # own copies: they are made read-only below
        bitvals = np.array(self.bitvals, dtype=wd)
        if masks.ndim == 1:
            masks = masks[None, :]
            bitvals = bitvals[None, :]
        if masks.shape != bitvals.shape or masks.ndim != 2 or masks.shape[1] != self.nchunks:
            raise CodecError(f"IBP masks/bitvals must be (k, {self.nchunks}); got "
                             f"{masks.shape} and {bitvals.shape}")
        if not 1 <= masks.shape[0] <= _MAX_CLUSTERS:
            raise CodecError(f"IBP model needs 1..{_MAX_CLUSTERS} masks, not {masks.shape[0]}")
        if np.any(bitvals & ~masks):
            raise CodecError("IBP bitval has bits outside its mask")
        self.masks, self.bitvals = masks, bitvals
        self.masks.flags.writeable = False
        self.bitvals.flags.writeable = False
        self.pcs = popcount(masks)
        self.pcs64 = self.pcs.astype(np.uint64)
        self.masks64 = masks.astype(np.uint64)
        self.bitvals64 = bitvals.astype(np.uint64)
        allw = np.uint64((1 << self.width) - 1)
        self.frees64 = (~self.masks64) & allw

    # ---------------------------------------------------------------- properties
    @property
    def nclusters(self) -> int:
        """Number of masks (1 unless the model was fitted with clusters)."""
        return int(self.masks.shape[0])

    @property
    def padded_bytes(self) -> int:
        """Bytes of a row once padded to whole chunks (the in-place slot size)."""
        return self.nchunks * self.chunk_bytes

    @property
    def words_dtype(self) -> np.dtype:
        """Little-endian unsigned integer of one chunk."""
        return _words_dtype(self.chunk_bytes)

    @property
    def cluster_id_bytes(self) -> int:
        """Bytes of the per-row cluster id in packed payloads (0 for one mask)."""
        k = self.nclusters
        return 0 if k == 1 else (1 if k <= 256 else 2)

    @property
    def metadata_nbytes(self) -> int:
        """Bytes of the masks and bit values (what lives in GPU memory)."""
        return 2 * self.masks.size * self.chunk_bytes

    @property
    def model_id(self) -> bytes:
        """8 bytes identifying this model; packed payloads carry it."""
        if self._id is None:
            self._id = hashlib.blake2b(self.to_bytes(), digest_size=8).digest()
        return self._id

    def invariant_fraction(self) -> float:
        """Fraction of the row's bits the (first) mask declares invariant."""
        return float(self.pcs[0].sum()) / (self.nchunks * self.width)

    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Deposit tables for the array-API decoder: per mask, column and run of consecutive
        free bits (highest run first, padded with empty runs): the run's lowest bit, its bit
        mask before shifting, and its shift inside the extracted value. Shapes (k, n, R)."""
        if self._runs is None:
            self._runs = _build_runs(self.frees64, self.width)
        return self._runs  # type: ignore[return-value]

    def pair_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tables of the CPU decoder for 32-bit chunks, decoded two at a time: for every mask,
        chunk pair (2p, 2p+1) and participation pattern t (bit 0: chunk 2p compressed, bit 1:
        chunk 2p+1), the pair's 64-bit free mask and bit values (chunk 2p in the high half; a
        raw chunk has all 32 bits free) and its total bit count. Shapes (k, n // 2, 4); empty
        for 64-bit chunks."""
        if self._pairs is None:
            k, n = self.masks.shape
            npairs = n // 2 if self.width == 32 else 0
            shape = (k, npairs, 4)
            fm = np.zeros(shape, np.uint64)
            bv = np.zeros(shape, np.uint64)
            kb = np.zeros(shape, np.uint64)
            m = 2 * npairs
            fr = self.frees64[:, :m].reshape(k, npairs, 2)
            bt = self.bitvals64[:, :m].reshape(k, npairs, 2)
            pc = self.pcs64[:, :m].reshape(k, npairs, 2)
            raw = np.uint64(0xFFFFFFFF)
            for t in range(4):
                halves = []
                for h in (0, 1):
                    part = (t >> h) & 1
                    halves.append((fr[..., h] if part else raw,
                                   bt[..., h] if part else np.uint64(0),
                                   np.uint64(32) - pc[..., h] if part else np.uint64(32)))
                (f0, b0, k0), (f1, b1, k1) = halves
                fm[..., t] = (f0 << np.uint64(32)) | f1
                bv[..., t] = (b0 << np.uint64(32)) | b1
                kb[..., t] = k0 + k1
            self._pairs = (fm, bv, kb)
        return self._pairs  # type: ignore[return-value]

    # ---------------------------------------------------------------- rows
    def rows_as_words(self, rows: Any) -> np.ndarray:
        """``rows`` as a C-contiguous (N, n) array of chunk words (padded with zero bytes)."""
        arr = np.asarray(rows)
        if arr.dtype != self.dtype:
            raise CodecError(f"IBP model is for {self.dtype} rows, got {arr.dtype}")
        if arr.ndim < 1 or tuple(arr.shape[1:]) != self.row_shape:
            raise CodecError(f"IBP model is for rows of shape {self.row_shape}, got an array "
                             f"of shape {arr.shape}")
        return _as_words(arr, self.row_bytes, self.nchunks, self.chunk_bytes)

    def words_as_rows(self, words: np.ndarray, xp: Any = np) -> Any:
        """Inverse of :meth:`rows_as_words` (strips the padding), on ``xp``'s device."""
        nrows = words.shape[0]
        b = words.view(xp.uint8).reshape(nrows, self.padded_bytes)
        if self.row_bytes != self.padded_bytes:
            b = xp.ascontiguousarray(b[:, :self.row_bytes])
        return b.view(self.dtype).reshape((nrows, *self.row_shape))

    # ---------------------------------------------------------------- codec
    def compress(self, rows: Any, layout: str = "inplace") -> IBPPacked:
        """Pack ``rows`` (N x row_shape of the model's dtype) in the ``"inplace"`` layout (fixed
        stride, one bit per row says compressed or raw) or the ``"condensed"`` one (rows back
        to back, one length per row)."""
        from lmdbio.codecs.ibp.packed import compress

        return compress(self, rows, layout)

    def decompress(self, packed: IBPPacked, xp: Any = np, method: str = "auto",
                   parallel: bool = False, out: Any = None) -> Any:
        """The exact original rows of ``packed``, as an array of ``xp`` (numpy or cupy).

        ``method``: ``"kernel"`` (numba on CPU, the CUDA kernel on a GPU), ``"xp"`` (whole-array
        code on ``xp``), ``"mirror"`` (the CPU model of the CUDA kernel, numpy only) or
        ``"auto"`` (the kernel of ``xp``'s device). ``parallel`` decodes shares of the rows on
        a pool of threads, one per numba thread (the CPU kernel releases the GIL). ``out``: a
        preallocated array of the rows (CPU kernel only) to decode into, e.g. a batch buffer
        in shared memory; it is returned.
        """
        from lmdbio.codecs.ibp.packed import decompress

        return decompress(self, packed, xp=xp, method=method, parallel=parallel, out=out)

    # ---------------------------------------------------------------- serialization
    def to_bytes(self) -> bytes:
        """Self-describing bytes (little-endian, CRC-32 protected); see :meth:`from_bytes`."""
        if self._bytes is not None:
            return self._bytes
        dt = self.dtype.str.encode("ascii")
        head = _MODEL_HEAD.pack(MODEL_MAGIC, MODEL_VERSION, self.chunk_bytes,
                                SEARCHES.index(self.search), len(self.row_shape), self.nchunks,
                                self.nclusters, self.row_bytes, float(self.threshold), len(dt))
        shape = struct.pack(f"<{len(self.row_shape)}Q", *self.row_shape)
        body = head + dt + shape
        body += b"\0" * (-len(body) % 8)
        body += self.masks.tobytes() + self.bitvals.tobytes()
        self._bytes = body + struct.pack("<I", zlib.crc32(body))
        return self._bytes

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> IBPModel:
        """Parse :meth:`to_bytes` output; any inconsistency raises :class:`CodecError`."""
        buf = bytes(data)
        if len(buf) < _MODEL_HEAD.size + 4:
            raise CodecError(f"IBP model: {len(buf)} bytes is too short for a model")
        (magic, version, chunk_bytes, search, ndim, nchunks, nclusters, row_bytes, threshold,
         dtlen) = _MODEL_HEAD.unpack_from(buf)
        if magic != MODEL_MAGIC:
            raise CodecError(f"IBP model: bad magic {magic!r} (expected {MODEL_MAGIC!r})")
        if version != MODEL_VERSION:
            raise CodecError(f"IBP model: unsupported version {version}")
        (crc,) = struct.unpack_from("<I", buf, len(buf) - 4)
        if zlib.crc32(buf[:-4]) != crc:
            raise CodecError("IBP model: checksum mismatch (corrupt model bytes)")
        if chunk_bytes not in (4, 8) or search >= len(SEARCHES) or not (
                1 <= nclusters <= _MAX_CLUSTERS):
            raise CodecError(f"IBP model: bad header (chunk {chunk_bytes}, search {search}, "
                             f"clusters {nclusters})")
        pos = _MODEL_HEAD.size
        shape_end = pos + dtlen + 8 * ndim
        data_start = shape_end + (-shape_end % 8)
        expected = data_start + 2 * nclusters * nchunks * chunk_bytes + 4
        if len(buf) != expected:
            raise CodecError(f"IBP model: {len(buf)} bytes, header implies {expected}")
        try:
            dtype = np.dtype(buf[pos:pos + dtlen].decode("ascii"))
        except (UnicodeDecodeError, TypeError, ValueError) as exc:
            raise CodecError(f"IBP model: bad dtype string ({exc})") from None
        row_shape = struct.unpack_from(f"<{ndim}Q", buf, pos + dtlen)
        wd = _words_dtype(chunk_bytes)
        k_n = nclusters * nchunks
        masks = np.frombuffer(buf, wd, k_n, data_start).reshape(nclusters, nchunks)
        bitvals = np.frombuffer(buf, wd, k_n, data_start + k_n * chunk_bytes)
        if dtype.itemsize and math.prod(row_shape) > (1 << 40) // max(dtype.itemsize, 1):
            raise CodecError(f"IBP model: implausible row shape {row_shape}")
        model = cls(dtype, row_shape, chunk_bytes, masks, bitvals.reshape(nclusters, nchunks),
                    threshold, SEARCHES[search])
        if model.row_bytes != row_bytes or model.nchunks != nchunks:
            raise CodecError(f"IBP model: row of {row_bytes} bytes / {nchunks} chunks does not "
                             f"match dtype {dtype} x {row_shape}")
        return model

    def __repr__(self) -> str:
        return (f"IBPModel(dtype={self.dtype}, row_shape={self.row_shape}, "
                f"chunk_bytes={self.chunk_bytes}, clusters={self.nclusters}, "
                f"search={self.search!r}, threshold={self.threshold:.3f}, "
                f"invariant={self.invariant_fraction():.1%})")


# ------------------------------------------------------------------------------------------
# helpers


def _as_words(arr: np.ndarray, row_bytes: int, nchunks: int, chunk_bytes: int) -> np.ndarray:
    nrows = arr.shape[0]
    wd = _words_dtype(chunk_bytes)
    arr = np.ascontiguousarray(arr)
    raw = arr.reshape(nrows, -1).view(np.uint8) if arr.size else np.zeros((nrows, row_bytes),
                                                                            np.uint8)
    raw = raw.reshape(nrows, row_bytes)
    padded = nchunks * chunk_bytes
    if padded != row_bytes:
        out = np.zeros((nrows, padded), np.uint8)
        out[:, :row_bytes] = raw
        raw = out
    return raw.view(wd).reshape(nrows, nchunks)


def _build_runs(frees: np.ndarray, width: int) -> tuple[np.ndarray, ...]:
    k, n = frees.shape
    lists: list[list[list[tuple[int, int, int]]]] = []
    rmax = 1
    for c in range(k):
        row = []
        for j in range(n):
            f = int(frees[c, j])
            runs = []
            rem = bin(f).count("1")
            while f:
                hb = f.bit_length() - 1
                below = ~f & ((1 << hb) - 1)
                lo = below.bit_length()
                ln = hb - lo + 1
                rem -= ln
                runs.append((lo, ln, rem))
                f &= (1 << lo) - 1
            rmax = max(rmax, len(runs))
            row.append(runs)
        lists.append(row)
    lo_a = np.zeros((k, n, rmax), np.uint64)
    mask_a = np.zeros((k, n, rmax), np.uint64)
    sh_a = np.zeros((k, n, rmax), np.uint64)
    for c in range(k):
        for j in range(n):
            for r, (lo, ln, sh) in enumerate(lists[c][j]):
                lo_a[c, j, r] = lo
                mask_a[c, j, r] = (1 << ln) - 1
                sh_a[c, j, r] = sh
    return lo_a, mask_a, sh_a, np.asarray(rmax)


def rows_to_words(rows: Any, chunk_bytes: int) -> tuple[np.ndarray, np.dtype, tuple[int, ...]]:
    """(N, n) chunk words of ``rows`` plus their dtype and row shape (for fitting)."""
    arr = np.asarray(rows)
    if arr.ndim < 2:
        raise CodecError(f"IBP needs an array of rows (N, ...); got shape {arr.shape}")
    if arr.dtype.kind not in _ALLOWED_KINDS or arr.dtype.fields is not None:
        raise CodecError(f"IBP handles fixed-size plain dtypes, not {arr.dtype}")
    row_shape = tuple(arr.shape[1:])
    row_bytes = int(math.prod(row_shape)) * arr.dtype.itemsize
    if row_bytes == 0:
        raise CodecError("IBP rows must hold at least one byte")
    nchunks = -(-row_bytes // chunk_bytes)
    return _as_words(arr, row_bytes, nchunks, chunk_bytes), arr.dtype, row_shape


def bit_counts(words: np.ndarray, chunk_bytes: int) -> np.ndarray:
    """(n, W) counts of rows with bit b of chunk j set (``words``: N x n chunk words)."""
    kernels = kernel_module("lmdbio.codecs.ibp")

    words = np.ascontiguousarray(words)
    counts = np.zeros((1, 8 * chunk_bytes, words.shape[1]), np.int64)
    kernels.bit_count_rows(words, np.zeros(0, np.int64), counts)
    return counts[0].T.copy()


def threshold_mask(counts: np.ndarray, nrows: int, threshold: float,
                   width: int) -> tuple[np.ndarray, np.ndarray]:
    """The authors' rule: invariant-1 if count > T*N, invariant-0 if count < (1-T)*N."""
    ones = counts > threshold * nrows
    zeros = counts < (1.0 - threshold) * nrows
    weights = (np.uint64(1) << np.arange(width, dtype=np.uint64))
    mask = ((ones | zeros).astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    bitval = (ones.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    return mask, bitval


def row_plan(words: np.ndarray, masks64: np.ndarray, bitvals64: np.ndarray, pcs: np.ndarray,
            meta_words: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, ``(stored words, saving in bits, cluster id)`` under the masks
    ``masks64``/``bitvals64``: each row takes the cluster that stores it in the fewest words
    (compiled: :func:`lmdbio.codecs.ibp.kernels.plan_rows`)."""
    kernels = kernel_module("lmdbio.codecs.ibp")

    nrows = words.shape[0]
    rw = np.empty(nrows, np.int64)
    saved = np.empty(nrows, np.int64)
    cid = np.empty(nrows, np.int64)
    kernels.plan_rows(read_only(words), masks64, bitvals64, pcs, meta_words, width, rw, saved,
                      cid)
    return rw, saved, cid


def _column_candidate(words: np.ndarray, select: np.ndarray, width: int,
                      z: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per column, the nested-prefix mask that saves most bits on the selected rows; with
    ``z`` > 0 the match rate of each prefix is its Wilson lower bound (smaller masks where the
    evidence for a bigger one is thin)."""
    kernels = kernel_module("lmdbio.codecs.ibp")

    sel_words = words[select] if not select.all() else words
    nsel = sel_words.shape[0]
    n = words.shape[1]
    if nsel == 0:
        return np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    counts = bit_counts(np.ascontiguousarray(sel_words), width // 8)
    agree = np.maximum(counts, nsel - counts)
    majority_bits = counts * 2 > nsel
    # order bits by agreement (descending), ties: higher bit first
    key = agree * (2 * width) + np.arange(width)[None, :]
    order = np.argsort(-key, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(width)[None, :].repeat(n, 0), axis=1)
    weights = np.uint64(1) << np.arange(width, dtype=np.uint64)
    majority = (majority_bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    hist = np.zeros((n, width + 1), np.int64)
    kernels.mismatch_histogram(np.ascontiguousarray(sel_words), np.ones(nsel, np.bool_),
                               majority, rank.astype(np.int64), hist)
    at_least = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]  # rows with first mismatch >= p
    p = np.arange(width + 1)
    score = p[None, :] * _lower_bound(at_least, nsel, z)
    best = np.argmax(score, axis=1)  # first maximum: the smallest mask among ties
    prefix = np.bitwise_or.accumulate(weights[order], axis=1)  # prefix[j, p-1]
    mask = np.where(best > 0, prefix[np.arange(n), np.maximum(best - 1, 0)], np.uint64(0))
    return mask.astype(np.uint64), (majority & mask).astype(np.uint64)


#: confidence levels (in standard deviations) of the column search's candidates
COLUMN_Z = (0.0, 1.0)


def _lower_bound(count: np.ndarray, total: int, z: float) -> np.ndarray:
    """Wilson lower confidence bound of ``count / total``, times ``total``."""
    if z <= 0:
        return count.astype(np.float64)
    phat = count / total
    z2n = z * z / total
    centre = phat + z2n / 2
    spread = z * np.sqrt(phat * (1 - phat) / total + z2n / (4 * total))
    return total * (centre - spread) / (1 + z2n)


@dataclass
class _Candidate:
    mask: np.ndarray
    bitval: np.ndarray
    search: str
    threshold: float
    words: int = 0
    paper_saving: int = 0


def _evaluate(words: np.ndarray, cand: _Candidate, meta_words: int, width: int) -> _Candidate:
    """Fill in the candidate's stored size (words) and the authors' objective."""
    pcs = popcount(cand.mask)[None, :]
    rw, saved, _ = row_plan(words, cand.mask[None, :], cand.bitval[None, :], pcs, meta_words,
                         width)
    cand.words = int(rw.sum())
    cand.paper_saving = int(np.maximum(saved - words.shape[1], 0).sum())
    return cand


def fit(rows: Any, chunk_bytes: int = 4, threshold: float | None = None,
        sample: float | None = None, *, search: str = "auto", seed: int = 0,
        refine: int = 2) -> IBPModel:
    """Fit an :class:`IBPModel` to ``rows`` (an array N x ...; any fixed-size dtype).

    ``threshold``: use the authors' rule for that T (0.5 < T <= 1) instead of searching.
    ``sample``: fraction (0, 1] of rows drawn at random (``seed``) to fit on; the paper finds
    1-10% enough. ``search``: ``"auto"``, ``"global"`` (the authors' sweep and objective) or
    ``"column"`` (see the module docstring). ``refine``: rounds of the column search restricted
    to the rows it compresses.
    """
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    if search not in ("auto", "global", "column"):
        raise CodecError(f"IBP search must be auto, global or column, not {search!r}")
    words, dtype, row_shape = rows_to_words(rows, chunk_bytes)
    words = sample_rows(words, sample, seed)
    nrows, n = words.shape
    width = 8 * chunk_bytes
    meta_words = -(-n // width)
    if nrows == 0:
        raise CodecError("IBP cannot fit a model on zero rows")
    if threshold is not None:
        if not 0.5 < float(threshold) <= 1.0:
            raise CodecError(f"IBP threshold must be in (0.5, 1], not {threshold}")
        counts = bit_counts(words, chunk_bytes)
        mask, bitval = threshold_mask(counts, nrows, float(threshold), width)
        return IBPModel(dtype, row_shape, chunk_bytes, mask, bitval, float(threshold), "fixed")
    best = search_mask(words, width, meta_words, search, refine)
    return IBPModel(dtype, row_shape, chunk_bytes, best.mask, best.bitval, best.threshold,
                    best.search)


def sample_rows(words: np.ndarray, sample: float | None, seed: int) -> np.ndarray:
    """``words``, or a seeded random fraction ``sample`` of its rows."""
    if sample is None:
        return words
    frac = float(sample)
    if not 0.0 < frac <= 1.0:
        raise CodecError(f"IBP sample must be a fraction in (0, 1], not {sample}")
    nrows = words.shape[0]
    count = max(1, round(frac * nrows)) if nrows else 0
    if count >= nrows:
        return words
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(nrows, size=count, replace=False))
    return np.ascontiguousarray(words[idx])


def search_mask(words: np.ndarray, width: int, meta_words: int, search: str,
                refine: int) -> _Candidate:
    """The best mask candidate for ``words`` found by the ``search`` strategy."""
    nrows, n = words.shape
    cands: list[_Candidate] = []
    if search in ("auto", "global"):
        counts = bit_counts(words, width // 8)
        grid: Sequence[float] = PAPER_THRESHOLDS
        if search == "auto":
            grid = sorted(set(PAPER_THRESHOLDS) | set(AUTO_THRESHOLDS))
        for t in grid:
            m, b = threshold_mask(counts, nrows, t, width)
            cands.append(_evaluate(words, _Candidate(m, b, "global", t), meta_words, width))
        if search == "global":
            # the authors keep the first threshold with the largest saving
            best = max(cands, key=lambda c: (c.paper_saving, -c.threshold))
            return best
    for z in COLUMN_Z:
        select = np.ones(nrows, np.bool_)
        for _ in range(1 + max(0, refine)):
            m, b = _column_candidate(words, select, width, z)
            cand = _evaluate(words, _Candidate(m, b, "column", float("nan")), meta_words, width)
            cands.append(cand)
            pcs = popcount(m)[None, :]
            rw, _, _ = row_plan(words, m[None, :], b[None, :], pcs, meta_words, width)
            new_select = rw < n
            if not new_select.any() or np.array_equal(new_select, select):
                break
            select = new_select
    return min(cands, key=lambda c: c.words)


def model_from_bits(dtype: Any, row_shape: Sequence[int], chunk_bytes: int, masks: Any,
                    bitvals: Any, search: str = "clustered") -> IBPModel:
    """Build a model from explicit masks (used by clustering and tests)."""
    return IBPModel(np.dtype(dtype), tuple(row_shape), chunk_bytes, np.asarray(masks),
                    np.asarray(bitvals), float("nan"), search)
