"""Packed IBP batches: the two layouts, their serialized frame, compression and decompression.

Row layout (the authors'): participation bitmap first -- ``ceil(n/8)`` bytes rounded up to
whole chunks, i.e. ``ceil(n/W)`` words, bit ``j`` of the row = bit ``j % W`` of word
``j // W`` (LSB first, 1 = chunk compressed) -- then the bit stream: for each chunk in order
its free bits (compressed) or all ``W`` bits (not), MSB to LSB, packed MSB-first into
successive little-endian words. A row is stored compressed only when that takes fewer words
than the raw row; otherwise it is stored raw.

* in-place layout: row ``i`` at word ``i * n`` (fixed stride, the slot is zero past the
  compressed prefix); one bit per row (LSB-first bytes) says compressed (1) or raw (0). What
  is transferred is the bitmask plus each row's prefix.
* condensed layout: rows back to back; one length per row, in words (``n`` = raw), as uint8,
  uint16 or uint32 -- the smallest that holds ``n``. Offsets are the lengths' prefix sums, so
  rows decode in parallel (on the GPU) and a decoder can check every row's size against its
  participation bits.

Clustered models add one cluster id per row (uint8 up to 256 masks, else uint16).

Frame (what :meth:`IBPPacked.to_bytes`, :func:`~lmdbio.codecs.ibp.compress_into` and the LMDB
records hold), little-endian::

    0  "IBPP"   4  version u8   5  layout u8 (0 in-place, 1 condensed)   6  chunk bytes u8
    7  flags u8 (bit 0: CRC-32 present)   8  nrows u64   16  nchunks u32   20  nclusters u16
    22 length bytes u8 (condensed)   23 0   24 model id (8 bytes)   32 data bytes u64
    40 nbytes u64 (stored/transferred bytes, see IBPPacked.nbytes)   48 crc32 u32   52 0 u32
    56 bitmask (in-place) or lengths (condensed), cluster ids, zero padding to 8, data

The CRC covers the header (with its CRC field zero) and everything after it.
"""

from __future__ import annotations

import functools
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel, row_plan
from lmdbio.errors import CodecError
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module

FRAME_MAGIC = b"IBPP"
FRAME_VERSION = 1
FLAG_CRC = 1
LAYOUTS = ("inplace", "condensed")
HEAD = struct.Struct("<4sBBBBQIHBB8sQQII")
assert HEAD.size == 56


def length_bytes(nchunks: int) -> int:
    """Width of a condensed row length: the smallest of 1, 2, 4 bytes that holds ``n``."""
    return 1 if nchunks <= 0xFF else (2 if nchunks <= 0xFFFF else 4)


def _cid_bytes(nclusters: int) -> int:
    return 0 if nclusters == 1 else (1 if nclusters <= 256 else 2)


def _uint(nbytes: int) -> np.dtype:
    return np.dtype({1: "u1", 2: "<u2", 4: "<u4"}[nbytes])


def section_layout(layout: str, nrows: int, nchunks: int,
                   nclusters: int) -> tuple[int, int, int, int]:
    """(bitmask-or-lengths bytes, cluster-id bytes, padding, data offset) of a frame."""
    first = -(-nrows // 8) if layout == "inplace" else nrows * length_bytes(nchunks)
    cids = nrows * _cid_bytes(nclusters)
    end = HEAD.size + first + cids
    pad = -end % 8
    return first, cids, pad, end + pad


def max_frame_nbytes(model: IBPModel, nrows: int, layout: str = "condensed") -> int:
    """Largest frame :func:`compress_into` can write for ``nrows`` rows (every row raw)."""
    _check_layout(layout)
    *_, data_off = section_layout(layout, nrows, model.nchunks, model.nclusters)
    return data_off + nrows * model.padded_bytes


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise CodecError(f"IBP layout must be 'inplace' or 'condensed', not {layout!r}")


@dataclass(eq=False)
class IBPPacked:
    """A packed batch of rows. ``data`` is the data section (uint8); ``bitmask`` (in-place) or
    ``lengths`` (condensed) and ``cluster_ids`` are the per-row metadata."""

    layout: str
    nrows: int
    nchunks: int
    chunk_bytes: int
    nclusters: int
    model_id: bytes
    data: np.ndarray
    bitmask: np.ndarray | None = None
    lengths: np.ndarray | None = None
    cluster_ids: np.ndarray | None = None
    nbytes: int = 0
    """Bytes that are stored (condensed) or transferred (in-place: the bitmask, cluster ids and
    every row's prefix -- not the unused tail of the slots); excludes the fixed header."""
    _valid: bool = False

    @property
    def ncompressed(self) -> int:
        """Rows stored compressed (the others are raw)."""
        if self.layout == "inplace":
            assert self.bitmask is not None
            return int(np.bitwise_count(self.bitmask).sum())
        assert self.lengths is not None
        return int(np.count_nonzero(self.lengths < self.nchunks))

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the rows once padded to whole chunks."""
        return self.nrows * self.nchunks * self.chunk_bytes

    def data_words(self) -> np.ndarray:
        """The data section as little-endian chunk words (aligned; copied if it is not)."""
        wd = np.dtype("<u4") if self.chunk_bytes == 4 else np.dtype("<u8")
        words = self.data.view(wd)
        if not words.flags.aligned:  # numba wants aligned arrays
            words = self.data.copy().view(wd)
        return words

    def row_offsets(self) -> np.ndarray:
        """Word offset of every row (int64)."""
        if self.layout == "inplace":
            return np.arange(self.nrows, dtype=np.int64) * self.nchunks
        assert self.lengths is not None
        off = np.zeros(self.nrows, np.int64)
        np.cumsum(self.lengths[:-1], dtype=np.int64, out=off[1:])
        return off

    def validate_rows(self) -> None:
        """Check the per-row metadata: condensed lengths within the raw row and adding up to
        the data section, cluster ids below the number of masks. Idempotent."""
        if self._valid:
            return
        if self.cluster_ids is not None and self.cluster_ids.size:
            cid = self.cluster_ids
            if int(cid.max()) >= self.nclusters:
                bad = int(np.argmax(cid >= self.nclusters))
                raise CodecError(f"IBP frame: row {bad}: cluster id {int(cid[bad])} >= "
                                 f"{self.nclusters}")
        if self.lengths is not None:
            lengths = self.lengths
            if lengths.size and int(lengths.max()) > self.nchunks:
                bad = int(np.argmax(lengths > self.nchunks))
                raise CodecError(f"IBP frame: row {bad}: length {int(lengths[bad])} words "
                                 f"exceeds the raw row ({self.nchunks})")
            total = int(lengths.sum(dtype=np.int64)) * self.chunk_bytes
            if total != self.data.nbytes:
                raise CodecError(f"IBP frame: row lengths add up to {total} bytes, data "
                                 f"section has {self.data.nbytes}")
        self._valid = True

    # ------------------------------------------------------------- serialization
    def frame_nbytes(self) -> int:
        """Length of :meth:`to_bytes`."""
        *_, data_off = section_layout(self.layout, self.nrows, self.nchunks, self.nclusters)
        return data_off + self.data.nbytes

    def to_bytes(self, checksum: bool = True) -> bytes:
        """The frame described in the module docstring."""
        out = np.empty(self.frame_nbytes(), np.uint8)
        self.write_into(out, checksum)
        return out.tobytes()

    def write_into(self, out: np.ndarray, checksum: bool = True) -> int:
        """Write the frame into the uint8 array ``out``; return its length."""
        first, cids, pad, data_off = section_layout(self.layout, self.nrows, self.nchunks,
                                                    self.nclusters)
        total = data_off + self.data.nbytes
        if out.nbytes < total:
            raise CodecError(f"IBP frame needs {total} bytes, buffer has {out.nbytes}")
        pos = HEAD.size
        meta = self.bitmask if self.layout == "inplace" else self.lengths
        assert meta is not None
        out[pos:pos + first] = meta.view(np.uint8).reshape(-1)
        pos += first
        if cids:
            assert self.cluster_ids is not None
            out[pos:pos + cids] = self.cluster_ids.view(np.uint8).reshape(-1)
            pos += cids
        out[pos:pos + pad] = 0
        out[data_off:total] = self.data
        _write_header(out, self, checksum, total)
        return total

    @classmethod
    def from_bytes(cls, buf: Any, *, exact: bool = True, validate: bool = True) -> IBPPacked:
        """Parse a frame (zero-copy views into ``buf``) and check its structure: header,
        section sizes, CRC and (``validate``) :meth:`validate_rows`. ``exact=False`` accepts
        trailing bytes (a frame at the start of a larger buffer). Decoding validates rows
        itself, so the hot path parses with ``validate=False``."""
        arr = _frame_bytes(buf)
        h = _read_frame_header(arr)
        first, cids, _, data_off = section_layout(h.layout, h.nrows, h.nchunks, h.nclusters)
        total = data_off + h.data_nbytes
        _check_data_section(arr.nbytes, h, total, exact)
        frame = arr[:total]
        _check_crc(frame, h.flags, h.crc)
        pos = HEAD.size
        meta = frame[pos:pos + first]
        pos += first
        cid_arr = None
        if cids:
            cid_arr = frame[pos:pos + cids].view(_uint(_cid_bytes(h.nclusters)))
        data = frame[data_off:total]
        packed = cls(h.layout, int(h.nrows), int(h.nchunks), int(h.chunk_bytes),
                     int(h.nclusters), bytes(h.model_id), data, cluster_ids=cid_arr,
                     nbytes=int(h.nbytes))
        _attach_row_meta(packed, meta, h, first + cids)
        if validate:
            packed.validate_rows()
        return packed

    def __repr__(self) -> str:
        return (f"IBPPacked(layout={self.layout!r}, nrows={self.nrows}, nchunks={self.nchunks},"
                f" chunk_bytes={self.chunk_bytes}, nbytes={self.nbytes}, "
                f"compressed={self.ncompressed})")


class _FrameHeader(NamedTuple):
    """The fields of a frame's header (:data:`HEAD`) that parsing needs, ``layout`` by
    name."""

    layout: str
    chunk_bytes: int
    flags: int
    nrows: int
    nchunks: int
    nclusters: int
    lbytes: int
    model_id: bytes
    data_nbytes: int
    nbytes: int
    crc: int


def _frame_bytes(buf: Any) -> np.ndarray:
    """``buf`` as a flat uint8 array, without a copy."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, np.ndarray) else buf
    return np.frombuffer(mv, np.uint8) if not isinstance(mv, np.ndarray) else mv.view(
        np.uint8).reshape(-1)


def _read_frame_header(arr: np.ndarray) -> _FrameHeader:
    """The header at the start of ``arr``, its fields checked on their own and against
    the buffer's size; :class:`~lmdbio.errors.CodecError` names the first bad one."""
    if arr.nbytes < HEAD.size:
        raise CodecError(f"IBP frame: {arr.nbytes} bytes is shorter than its "
                         f"{HEAD.size}-byte header")
    (magic, version, layout_code, chunk_bytes, flags, nrows, nchunks, nclusters, lbytes,
     res0, model_id, data_nbytes, nbytes, crc, res1) = HEAD.unpack_from(arr)
    if magic != FRAME_MAGIC:
        raise CodecError(f"IBP frame: bad magic {magic!r} (expected {FRAME_MAGIC!r})")
    if version != FRAME_VERSION:
        raise CodecError(f"IBP frame: unsupported version {version}")
    if layout_code > 1 or chunk_bytes not in (4, 8) or flags & ~FLAG_CRC or res0 or res1:
        raise CodecError(f"IBP frame: bad header (layout {layout_code}, chunk {chunk_bytes},"
                         f" flags {flags:#x})")
    if nclusters < 1 or nchunks < 1:
        raise CodecError(f"IBP frame: bad header ({nchunks} chunks, {nclusters} clusters)")
    layout = LAYOUTS[layout_code]
    want_lb = 0 if layout == "inplace" else length_bytes(nchunks)
    if lbytes != want_lb:
        raise CodecError(f"IBP frame: length width {lbytes}, expected {want_lb}")
    if nrows > 8 * arr.nbytes:
        raise CodecError(f"IBP frame: {nrows} rows cannot fit in {arr.nbytes} bytes")
    return _FrameHeader(layout, chunk_bytes, flags, nrows, nchunks, nclusters, lbytes,
                        model_id, data_nbytes, nbytes, crc)


def _check_data_section(available: int, h: _FrameHeader, total: int, exact: bool) -> None:
    """Check that the buffer (``available`` bytes) holds the ``total`` bytes the header
    implies (exactly, with ``exact``) and that the data section is whole words, of the
    in-place layout's size where it has one."""
    if available < total or (exact and available != total):
        raise CodecError(f"IBP frame: {available} bytes, header implies {total}")
    if h.data_nbytes % h.chunk_bytes:
        raise CodecError(f"IBP frame: data section of {h.data_nbytes} bytes is not whole "
                         f"{h.chunk_bytes}-byte words")
    if h.layout == "inplace" and h.data_nbytes != h.nrows * h.nchunks * h.chunk_bytes:
        raise CodecError(f"IBP frame: in-place data of {h.data_nbytes} bytes, expected "
                         f"{h.nrows} x {h.nchunks * h.chunk_bytes}")


def _check_crc(frame: np.ndarray, flags: int, crc: int) -> None:
    """Check the frame's CRC-32 (computed with the header's CRC field zeroed) when the
    checksum flag is set; refuse a CRC without the flag."""
    if not flags & FLAG_CRC and crc:
        raise CodecError("IBP frame: checksum field set without the checksum flag")
    if flags & FLAG_CRC:
        head = bytearray(frame[:HEAD.size].tobytes())
        head[48:52] = b"\0\0\0\0"
        got = zlib.crc32(frame[HEAD.size:], zlib.crc32(head))
        if got != crc:
            raise CodecError("IBP frame: checksum mismatch (corrupt payload)")


def _attach_row_meta(packed: IBPPacked, meta: np.ndarray, h: _FrameHeader,
                     before_data: int) -> None:
    """Give ``packed`` its per-row section (the in-place layout's bitmask, the condensed
    one's lengths) and check it and ``nbytes`` against the frame's content
    (``before_data``: bytes of the row and cluster sections)."""
    content = before_data + h.data_nbytes
    if h.layout == "inplace":
        packed.bitmask = meta
        if h.nrows % 8 and meta.size and int(meta[-1]) >> (h.nrows % 8):
            raise CodecError("IBP frame: bitmask has bits set past the last row")
        if h.nbytes > content:
            raise CodecError(f"IBP frame: nbytes {h.nbytes} exceeds the frame's content")
    else:
        packed.lengths = meta.view(_uint(h.lbytes))
        if h.nbytes != content:
            raise CodecError(f"IBP frame: nbytes {h.nbytes} != {content}")


def _write_header(out: np.ndarray, p: IBPPacked, checksum: bool, total: int) -> None:
    lb = 0 if p.layout == "inplace" else length_bytes(p.nchunks)
    flags = FLAG_CRC if checksum else 0
    HEAD.pack_into(out, 0, FRAME_MAGIC, FRAME_VERSION, LAYOUTS.index(p.layout), p.chunk_bytes,
                   flags, p.nrows, p.nchunks, p.nclusters, lb, 0, p.model_id,
                   total - section_layout(p.layout, p.nrows, p.nchunks, p.nclusters)[3],
                   p.nbytes, 0, 0)
    if checksum:
        crc = zlib.crc32(out[HEAD.size:total], zlib.crc32(out[:HEAD.size]))
        struct.pack_into("<I", out, 48, crc)


# -------------------------------------------------------------------------------------------
# compression


def _plan_model(model: IBPModel, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rw, _, cid = row_plan(words, model.masks64, model.bitvals64, model.pcs, model.meta_words,
                          model.width)
    return rw, cid


def _encode(model: IBPModel, words: np.ndarray, rw: np.ndarray, cid: np.ndarray,
            row_off: np.ndarray, out_words: np.ndarray) -> None:
    kernels = kernel_module("lmdbio.codecs.ibp")

    kernels.encode_rows(read_only(words), model.masks64, model.bitvals64, model.frees64,
                        model.pcs64, cid, rw, row_off, model.meta_words, model.width, out_words)


def compress(model: IBPModel, rows: Any, layout: str = "inplace") -> IBPPacked:
    """Pack ``rows`` with ``model`` (see :meth:`IBPModel.compress`)."""
    _check_layout(layout)
    words = model.rows_as_words(rows)
    nrows, n = words.shape
    rw, cid = _plan_model(model, words)
    comp = rw < n
    c = model.chunk_bytes
    cid_dt = _uint(_cid_bytes(model.nclusters)) if model.nclusters > 1 else None
    cids = cid.astype(cid_dt) if cid_dt is not None else None
    cid_nbytes = 0 if cids is None else cids.nbytes
    if layout == "inplace":
        row_off = np.arange(nrows, dtype=np.int64) * n
        out = np.zeros(nrows * n, model.words_dtype)
        _encode(model, words, rw, cid, row_off, out)
        bitmask = np.packbits(comp, bitorder="little")
        return IBPPacked(layout, nrows, n, c, model.nclusters, model.model_id,
                         out.view(np.uint8), bitmask=bitmask, cluster_ids=cids,
                         nbytes=int(bitmask.nbytes + cid_nbytes + rw.sum() * c), _valid=True)
    row_off = np.zeros(nrows, np.int64)
    np.cumsum(rw[:-1], out=row_off[1:])
    out = np.empty(int(rw.sum()), model.words_dtype)
    _encode(model, words, rw, cid, row_off, out)
    lengths = rw.astype(_uint(length_bytes(n)))
    return IBPPacked(layout, nrows, n, c, model.nclusters, model.model_id, out.view(np.uint8),
                     lengths=lengths, cluster_ids=cids,
                     nbytes=int(lengths.nbytes + cid_nbytes + out.nbytes), _valid=True)


def compress_frame_into(model: IBPModel, rows: Any, out: np.ndarray, layout: str = "condensed",
                        checksum: bool = False) -> int:
    """Compress ``rows`` straight into the uint8 array ``out`` as a frame; return its length.
    Raises :class:`CodecError` when ``out`` is too small (see :func:`max_frame_nbytes`)."""
    _check_layout(layout)
    words = model.rows_as_words(rows)
    nrows, n = words.shape
    rw, cid = _plan_model(model, words)
    c = model.chunk_bytes
    first, cids_n, pad, data_off = section_layout(layout, nrows, n, model.nclusters)
    if layout == "inplace":
        data_nbytes = nrows * n * c
        row_off = np.arange(nrows, dtype=np.int64) * n
    else:
        data_nbytes = int(rw.sum()) * c
        row_off = np.zeros(nrows, np.int64)
        np.cumsum(rw[:-1], out=row_off[1:])
    total = data_off + data_nbytes
    if out.nbytes < total:
        raise CodecError(f"IBP: the packed batch needs {total} bytes, the buffer has "
                         f"{out.nbytes}")
    comp = rw < n
    pos = HEAD.size
    if layout == "inplace":
        out[pos:pos + first] = np.packbits(comp, bitorder="little")
    else:
        out[pos:pos + first] = rw.astype(_uint(length_bytes(n))).view(np.uint8)
    pos += first
    if cids_n:
        out[pos:pos + cids_n] = cid.astype(_uint(_cid_bytes(model.nclusters))).view(np.uint8)
        pos += cids_n
    out[pos:pos + pad] = 0
    region = out[data_off:total]
    if layout == "inplace":
        region[:] = 0
    target = region.view(model.words_dtype)
    aligned = bool(target.flags.aligned)
    if not aligned:
        target = np.zeros(data_nbytes // c, model.words_dtype)
    _encode(model, words, rw, cid, row_off, target)
    if not aligned:
        region[:] = target.view(np.uint8)
    if layout == "inplace":
        nbytes = first + cids_n + int(rw.sum()) * c
    else:
        nbytes = first + cids_n + data_nbytes
    header = IBPPacked(layout, nrows, n, c, model.nclusters, model.model_id, region,
                       nbytes=nbytes)
    _write_header(out, header, checksum, total)
    return total


# -------------------------------------------------------------------------------------------
# decompression


def _is_numpy(xp: Any) -> bool:
    return xp is np or getattr(xp, "__name__", "") == "numpy"


def check_compatible(model: IBPModel, packed: IBPPacked) -> None:
    """Raise :class:`CodecError` unless ``packed`` was made by ``model``."""
    if packed.model_id != model.model_id:
        raise CodecError(f"IBP payload was packed with model {packed.model_id.hex()}, not "
                         f"{model.model_id.hex()}")
    if packed.nchunks != model.nchunks or packed.chunk_bytes != model.chunk_bytes or (
            packed.nclusters != model.nclusters):
        raise CodecError("IBP payload shape does not match the model")


def raise_decode_error(code: int, row: int) -> None:
    """Turn a kernel's error code into a :class:`CodecError`."""
    ERRORS = kernel_module("lmdbio.codecs.ibp").ERRORS

    raise CodecError(f"IBP payload: row {row}: {ERRORS.get(code, f'error {code}')}")


_NO_U8 = read_only(np.zeros(0, np.uint8))
_NO_I32 = read_only(np.zeros(0, np.int32))
_NO_U16 = read_only(np.zeros(0, np.uint16))


def decode_words_cpu(model: IBPModel, packed: IBPPacked, parallel: bool = False,
                     out: np.ndarray | None = None) -> np.ndarray:
    """Decode to (N, n) chunk words with the fast numba kernel (which validates every row),
    into ``out`` when given (an (N, n) array of the words dtype)."""
    kernels = kernel_module("lmdbio.codecs.ibp")

    if out is None:
        out = np.empty((packed.nrows, model.nchunks), model.words_dtype)
    inplace = packed.layout == "inplace"
    lengths = packed.lengths.astype(np.int32) if packed.lengths is not None else _NO_I32
    cids = (packed.cluster_ids.astype(np.uint16) if packed.cluster_ids is not None
            else _NO_U16)
    pfm, pbv, pk = model.pair_tables()
    args = (read_only(packed.data_words()), inplace,
            read_only(packed.bitmask) if inplace else _NO_U8, read_only(lengths), read_only(cids),
            model.nclusters, model.frees64, model.bitvals64, model.pcs64, pfm, pbv, pk,
            model.meta_words)
    kern = kernels.decode_rows32 if model.width == 32 else kernels.decode_rows64
    if parallel:
        packed.validate_rows()  # row offsets come from the lengths
        code, row = decode_shares_threaded(kern, args, packed.row_offsets(), out,
                                           decode_threads())
    else:
        code, row = kern(*args, out)
    if code:
        raise_decode_error(int(code), int(row))
    return out


#: the kernels' error code for rows that end before the data section does (``ERRORS[3]``
#: of :mod:`lmdbio.codecs.ibp.kernels`)
CODE_ROWS_END_EARLY = 3
#: a thread's share of rows starts at a multiple of this: the in-place layout's bitmask
#: holds 8 rows a byte, so a share's bitmask is a slice of whole bytes
SHARE_ROW_ALIGN = 8


def decode_threads() -> int:
    """How many threads ``parallel=True`` decodes on: ``NUMBA_NUM_THREADS`` when set, else
    one per core this process may run on (numba's own thread count, read without importing
    numba here: only kernel modules import it)."""
    configured = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if configured:
        return max(1, int(configured))
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@functools.cache
def decode_pool(threads: int, pid: int) -> ThreadPoolExecutor:
    """The pool of ``threads`` threads that ``parallel=True`` decodes on in process ``pid``
    (``os.getpid()``), started at its first use and kept for the process (a decode then pays
    no thread start-up). Keyed by the process: a child forked after a decode inherits the
    pool without its threads, and must start its own."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ibp-decode")


def row_shares(nrows: int, parts: int) -> list[tuple[int, int]]:
    """``nrows`` rows cut into at most ``parts`` near-equal ``[start, end)`` shares, each
    start a multiple of :data:`SHARE_ROW_ALIGN`."""
    size = -(-nrows // max(1, parts))
    size = max(SHARE_ROW_ALIGN, -(-size // SHARE_ROW_ALIGN) * SHARE_ROW_ALIGN)
    return [(start, min(start + size, nrows)) for start in range(0, nrows, size)]


def decode_share(kern: Any, args: tuple[Any, ...], row_off: np.ndarray, out: np.ndarray,
                 start: int, end: int) -> tuple[int, int]:
    """Decode rows ``start:end`` with the serial kernel ``kern`` (``args`` as
    :func:`decode_words_cpu` builds them for all rows); returns its ``(code, row)`` with
    ``row`` counted from the first row of the batch.

    The share's words run from its first row to the end of the data section, as for the
    whole batch, so that every row is checked exactly as the whole-batch call checks it
    (a stream running past its row reads on into the next one and fails the length
    check). The price: the kernel's check that the rows end where the data section ends
    (code 3) fails for every share but the last."""
    words, inplace, bitmask, lengths, cids, *tables = args
    code, row = kern(words[int(row_off[start]):] if start else words, inplace,
                     bitmask[start // SHARE_ROW_ALIGN:] if inplace else bitmask,
                     lengths[start:end] if lengths.size else lengths,
                     cids[start:end] if cids.size else cids, *tables, out[start:end])
    return int(code), start + int(row) if code else -1


def decode_shares_threaded(kern: Any, args: tuple[Any, ...], row_off: np.ndarray,
                           out: np.ndarray, threads: int) -> tuple[int, int]:
    """Decode every row into ``out`` as ``kern(*args, out)`` does, in :func:`row_shares` on
    ``threads`` threads of :func:`decode_pool` (the kernels are ``nogil``); returns the same
    ``(code, row)``: that of the first share with an error (its first bad row, the lowest
    of the batch), or ``(0, -1)``. ``row_off``: the word offset of every row."""
    shares = row_shares(out.shape[0], threads)
    if len(shares) <= 1:
        code, row = kern(*args, out)
        return int(code), int(row)
    results = list(decode_pool(threads, os.getpid()).map(
        lambda share: decode_share(kern, args, row_off, out, *share), shares))
    last = len(results) - 1
    for index, (code, row) in enumerate(results):
        if code and not (code == CODE_ROWS_END_EARLY and index < last):
            return code, row
    return 0, -1


def decode_words_mirror(model: IBPModel, packed: IBPPacked, addr0: int = 0) -> np.ndarray:
    """Decode with the CPU model of the CUDA kernel (``addr0``: device address mod 128).

    The model writes 64-bit words whatever the chunk width (a 32-bit chunk's value fits in
    the low half), narrowed to the words dtype at the end: one compiled specialisation of
    the model serves both widths, where a uint32 ``out`` would compile a second (the model
    checks the GPU algorithm where there is no GPU; it is no production decoder, so the
    copy costs nothing that matters)."""
    kernels = kernel_module("lmdbio.codecs.ibp")

    packed.validate_rows()
    out = np.empty((packed.nrows, model.nchunks), np.uint64)
    inplace = packed.layout == "inplace"
    code, row = kernels.decode_rows_mirror(
        read_only(np.ascontiguousarray(packed.data)), int(addr0),
        inplace, read_only(packed.bitmask) if inplace else _NO_U8,
        read_only(packed.lengths.astype(np.int32)) if packed.lengths is not None else _NO_I32,
        packed.row_offsets() * model.chunk_bytes,
        read_only(packed.cluster_ids.astype(np.uint16)) if packed.cluster_ids is not None
        else _NO_U16,
        model.nclusters, model.masks64, model.bitvals64, model.pcs, model.meta_words,
        model.width, out)
    if code:
        raise_decode_error(int(code), int(row))
    return out.astype(model.words_dtype, copy=False)


def _out_words(model: IBPModel, nrows: int, out: np.ndarray) -> np.ndarray | None:
    """``out`` (rows of the model) seen as (N, n) words, or None when rows are padded."""
    if not isinstance(out, np.ndarray) or out.dtype != model.dtype or out.shape != (
            nrows, *model.row_shape) or not out.flags.c_contiguous or not out.flags.writeable:
        raise CodecError(f"IBP out must be a writable C-contiguous {model.dtype} array of shape "
                         f"{(nrows, *model.row_shape)}")
    if model.row_bytes != model.padded_bytes:
        return None
    words = out.reshape(-1).view(np.uint8).view(model.words_dtype)
    return words.reshape(nrows, model.nchunks) if words.flags.aligned else None


def decompress(model: IBPModel, packed: IBPPacked, xp: Any = np, method: str = "auto",
               parallel: bool = False, out: Any = None) -> Any:
    """See :meth:`IBPModel.decompress`."""
    check_compatible(model, packed)
    if method not in ("auto", "kernel", "xp", "mirror"):
        raise CodecError(f"IBP decompress method must be auto, kernel, xp or mirror, not "
                         f"{method!r}")
    if out is not None:
        if not _is_numpy(xp) or method not in ("auto", "kernel"):
            raise CodecError("IBP out= is supported by the CPU kernel (xp=numpy) only")
        target = _out_words(model, packed.nrows, out)
        if target is not None:
            decode_words_cpu(model, packed, parallel, target)
        else:
            out[...] = model.words_as_rows(decode_words_cpu(model, packed, parallel), np)
        return out
    if _is_numpy(xp):
        if method in ("auto", "kernel"):
            words = decode_words_cpu(model, packed, parallel)
        elif method == "mirror":
            words = decode_words_mirror(model, packed)
        else:
            from lmdbio.codecs.ibp.xpdecode import decode_words_xp

            packed.validate_rows()
            words = decode_words_xp(model, packed, np)
        return model.words_as_rows(words, np)
    if method == "mirror":
        raise CodecError("the mirror decoder runs on the CPU only (xp=numpy)")
    packed.validate_rows()
    if method == "xp":
        from lmdbio.codecs.ibp.xpdecode import decode_words_xp

        words = decode_words_xp(model, packed, xp)
    else:
        from lmdbio.codecs.ibp.cuda import decode_words_cuda

        words = decode_words_cuda(model, packed, xp)
    return model.words_as_rows(words, xp)
