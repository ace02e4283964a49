"""BTables: the sparse, labelled binary table format of Framed's ``clj-btable``/``btable-py``.

Byte layout (every integer and double big-endian), byte-for-byte what the original Java
writer produces:

====================  =========================================================================
``int32``             version, always 0
``int32``             L = length of the label string in UTF-16 code units
``L x uint16``        the labels joined by U+001F, as UTF-16 code units (a character outside the
                      Basic Multilingual Plane takes two units, a surrogate pair, and counts 2)
rows until EOF        ``int32 nnz`` then ``nnz x (int32 column, float64 value)``
====================  =========================================================================

Only values ``!= 0.0`` are stored (so ``-0.0`` is dropped and NaN is kept), columns ascending.
The number of columns is the number of labels. An empty label string reads as one empty
label (as ``"".split(sep)`` does in the reference readers), so a table must have at least one
label.

Parsing is compiled (:mod:`lmdbio.codecs.btable.kernels`): one pass over the row headers to
count rows and non-zeros, one pass to fill CSR arrays and validate every column. Malformed
input raises :class:`BTableError` (a :class:`~lmdbio.errors.CodecError`) naming the file, the
row and the byte offset; nothing is read out of bounds and nothing loops without progress.

``iter_blocks``/``iter_rows`` stream a file in chunks (default 16 MiB), never holding more than
one chunk plus one row; :class:`BTableWriter` streams the other way. ``export_lmdb`` writes a
BTable from an LMDB of sparse row records (``lmdbio convert FILE.btable DST --layout btable``
builds such an LMDB; see :mod:`lmdbio.convert.btable`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

import numpy as np

from lmdbio.codecs.btable import rows as row_format
from lmdbio.dataset_meta import read_dataset_meta
from lmdbio.errors import CodecError

VERSION = 0
#: separator of the labels (ASCII unit separator)
SEP = "\x1f"
#: default chunk size of streaming reads
CHUNK_BYTES = 16 << 20

__all__ = [
    "BTableError", "BTableWriter", "export_lmdb", "info", "iter_blocks", "iter_rows", "read",
    "read_labels", "write",
]


def _scipy_sparse() -> ModuleType:
    """:mod:`scipy.sparse`, imported on first use: ``lmdbio --help`` imports this module
    and must not load SciPy."""
    import scipy.sparse as sp

    return sp


class BTableError(CodecError):
    """A BTable file (or the data handed to the writer) is malformed.

    Attributes ``path``, ``row`` (0-based, ``None`` for the header) and ``offset`` (byte offset
    in the file, ``None`` when not applicable) say where; ``what`` says what was expected.
    """

    def __init__(self, path: object, what: str, *, row: int | None = None,
                 offset: int | None = None) -> None:
        self.path = str(path)
        self.row = row
        self.offset = offset
        self.what = what
        where = self.path
        if row is not None:
            where += f", row {row}"
        if offset is not None:
            where += f", byte offset {offset}"
        super().__init__(f"{where}: {what}")


# ---------------------------------------------------------------------------------- header
def _parse_header(head: bytes | memoryview, path: object, file_size: int) -> tuple[list[str], int]:
    """Labels and the offset of the first row from the first bytes of a file."""
    if file_size < 8 or len(head) < 8:
        raise BTableError(path, f"file has {file_size} bytes; a BTable header needs 8 "
                          "(int32 version, int32 label length)", offset=0)
    version = int.from_bytes(head[0:4], "big", signed=True)
    if version != VERSION:
        raise BTableError(path, f"unsupported version {version} (expected {VERSION})", offset=0)
    n_units = int.from_bytes(head[4:8], "big", signed=True)
    if n_units < 0:
        raise BTableError(path, f"negative label length {n_units}", offset=4)
    end = 8 + 2 * n_units
    if end > file_size:
        raise BTableError(path, f"label length {n_units} UTF-16 code units ({2 * n_units} "
                          f"bytes) runs past the end of the file ({file_size} bytes)", offset=4)
    if len(head) < end:
        raise BTableError(path, "label bytes not available", offset=8)
    raw = bytes(head[8:end])
    try:
        text = raw.decode("utf-16-be")
    except UnicodeDecodeError as exc:
        raise BTableError(path, f"labels are not valid UTF-16 ({exc.reason} at code unit "
                          f"{exc.start // 2})", offset=8 + exc.start) from None
    return text.split(SEP), end


def _read_header(f: BinaryIO, path: object, file_size: int) -> tuple[list[str], int]:
    head = f.read(8)
    if len(head) == 8:
        n_units = int.from_bytes(head[4:8], "big", signed=True)
        if n_units > 0 and 8 + 2 * n_units <= file_size:
            head += f.read(2 * n_units)
    return _parse_header(head, path, file_size)


def read_labels(path: str | os.PathLike) -> list[str]:
    """The labels (column names) of a BTable, reading only its header."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        return _read_header(f, path, size)[0]


def _raise_status(path: object, st: int, row: int, offset: int, bad: int, n_cols: int,
                  file_size: int) -> None:
    if st == row_format.E_NEG_COUNT:
        what = f"negative non-zero count {bad}"
    elif st == row_format.E_TRUNCATED and file_size - offset < 4:
        what = f"row truncated: {file_size - offset} trailing byte(s), an int32 count needs 4"
    elif st == row_format.E_TRUNCATED:
        what = (f"row truncated: {bad} non-zeros need {4 + 12 * bad} bytes from here, the "
                f"file ends {file_size - offset} bytes later")
    elif st == row_format.E_COL_NEG:
        what = f"negative column index {bad}"
    elif st == row_format.E_COL_RANGE:
        what = f"column index {bad} out of range (the table has {n_cols} labels)"
    elif st == row_format.E_COL_ORDER:
        what = f"column {bad} is smaller than the previous one (columns must ascend)"
    elif st == row_format.E_COL_DUP:
        what = f"duplicate column {bad}"
    else:  # pragma: no cover - kernels return only the codes above
        what = f"status {st}"
    raise BTableError(path, what, row=row, offset=offset)


def _decode_chunk(buf: np.ndarray, start: int, final: bool, n_cols: int, path: object,
                  row0: int, base: int, file_size: int):
    """Decode the complete rows of ``buf[start:]``; returns (csr arrays..., end offset)."""
    st, n_rows, nnz, end, off, bad = row_format.scan_btable_rows(buf, start, final)
    if st != row_format.OK:  # the failing row is the one after the n_rows complete ones
        _raise_status(path, st, row0 + n_rows, base + off, bad, n_cols, file_size)
    st, row, off, bad, indptr, indices, data = row_format.decode_btable_rows(
        buf, start, n_rows, nnz, n_cols)
    if st != row_format.OK:
        _raise_status(path, st, row0 + row, base + off, bad, n_cols, file_size)
    return indptr, indices, data, end


# ------------------------------------------------------------------------------------ read
def read(path: str | os.PathLike) -> tuple[list[str], Any]:
    """Read a whole BTable: ``(labels, scipy.sparse.csr_matrix of float64)``.

    The matrix has ``len(labels)`` columns; explicit entries are exactly the stored ones (NaN
    included). Raises :class:`BTableError` on a malformed file.
    """
    sp = _scipy_sparse()

    buf = np.fromfile(path, dtype=np.uint8)
    labels, start = _parse_header(memoryview(buf)[:8 + 2 * max(0, _label_units(buf))],
                                  path, buf.shape[0])
    n_cols = len(labels)
    indptr, indices, data, _ = _decode_chunk(buf, start, True, n_cols, path, 0, 0, buf.shape[0])
    m = sp.csr_matrix((data, indices, indptr), shape=(indptr.shape[0] - 1, n_cols))
    return labels, m


def _label_units(buf: np.ndarray) -> int:
    if buf.shape[0] < 8:
        return 0
    n = int.from_bytes(buf[4:8].tobytes(), "big", signed=True)
    return n if 8 + 2 * n <= buf.shape[0] else 0


def info(path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    """Labels, row count and non-zero count of a BTable, streaming (only row headers are
    walked; columns are not validated)."""
    size = os.path.getsize(path)
    rows = nnz = 0
    with open(path, "rb") as f:
        labels, start = _read_header(f, path, size)
        carry = b""
        pos = start
        while True:
            chunk = f.read(chunk_bytes)
            final = not chunk
            buf = np.frombuffer(carry + chunk, np.uint8)
            st, n, z, end, off, bad = row_format.scan_btable_rows(buf, 0, final)
            if st != row_format.OK:
                _raise_status(path, st, rows + n, pos + off, bad, len(labels), size)
            rows += n
            nnz += z
            if final:
                break
            carry = bytes(buf[end:])
            pos += end
    return {"labels": labels, "rows": rows, "nnz": nnz, "bytes": size}


def iter_blocks(path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Any]:
    """Stream a BTable as CSR blocks of consecutive rows (``scipy.sparse.csr_matrix``).

    Reads ``chunk_bytes`` at a time; a row longer than a chunk grows the read until it is
    complete. Memory stays at about one chunk (plus the longest row) whatever the file size.
    """
    sp = _scipy_sparse()

    if chunk_bytes < 16:
        raise ValueError("chunk_bytes must be at least 16")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        labels, start = _read_header(f, path, size)
        n_cols = len(labels)
        carry = b""
        pos = start  # file offset of carry[0]
        row0 = 0
        want = chunk_bytes
        while True:
            chunk = f.read(want)
            final = len(chunk) < want
            data_buf = np.frombuffer(carry + chunk, np.uint8)
            indptr, indices, data, end = _decode_chunk(data_buf, 0, final, n_cols, path, row0,
                                                       pos, size)
            n = indptr.shape[0] - 1
            if n:
                yield sp.csr_matrix((data, indices, indptr), shape=(n, n_cols))
                want = chunk_bytes
            elif not final:
                want *= 2  # one row is longer than the chunk: read more before decoding
            row0 += n
            carry = bytes(data_buf[end:])
            pos += end
            if final:
                return


def iter_rows(path: str | os.PathLike,
              chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Stream a BTable row by row as ``(columns int32, values float64)`` array views.

    Parsing is per chunk (compiled); each row is handed out as views of its chunk's arrays.
    For bulk work prefer :func:`iter_blocks`, which skips the per-row Python step.
    """
    for block in iter_blocks(path, chunk_bytes):
        ptr = block.indptr.tolist()
        ind, dat = block.indices, block.data
        for r in range(len(ptr) - 1):
            yield ind[ptr[r]:ptr[r + 1]], dat[ptr[r]:ptr[r + 1]]


# ----------------------------------------------------------------------------------- write
def _encode_labels(labels: Sequence[str], path: object) -> bytes:
    labels = list(labels)
    if not labels:
        raise BTableError(path, "a BTable needs at least one label (an empty label string "
                          "reads back as one empty label)")
    for i, lab in enumerate(labels):
        if not isinstance(lab, str):
            raise BTableError(path, f"label {i} is {type(lab).__name__}, not str")
        if SEP in lab:
            raise BTableError(path, f"label {i} ({lab!r}) contains the separator U+001F")
    text = SEP.join(labels)
    try:
        raw = text.encode("utf-16-be")
    except UnicodeEncodeError as exc:
        raise BTableError(path, f"labels are not encodable as UTF-16 ({exc.reason} at "
                          f"character {exc.start})") from None
    n_units = len(raw) // 2
    if n_units > 2**31 - 1:
        raise BTableError(path, "label string longer than 2**31 - 1 UTF-16 code units")
    return (VERSION.to_bytes(4, "big", signed=True) + n_units.to_bytes(4, "big", signed=True)
            + raw)


def _canonical_csr(matrix: Any, n_cols: int | None, path: object):
    """CSR with sorted unique columns and only entries != 0.0 (NaN kept, -0.0 dropped)."""
    sp = _scipy_sparse()

    if sp.issparse(matrix):
        m = sp.csr_matrix(matrix, dtype=np.float64)
        if not m.has_canonical_format:
            m = m.copy()
            m.sum_duplicates()
    else:
        a = np.asarray(matrix, dtype=np.float64)
        if a.ndim != 2:
            raise BTableError(path, f"rows must form a 2-D array, got {a.ndim}-D")
        mask = a != 0.0  # NaN != 0.0 is True: NaN is kept, -0.0 dropped
        indptr = np.zeros(a.shape[0] + 1, np.int64)
        np.cumsum(mask.sum(axis=1), out=indptr[1:])
        cols = np.nonzero(mask)[1].astype(np.int32)  # row-major: columns ascend in each row
        m = sp.csr_matrix((a[mask], cols, indptr), shape=a.shape)
    if n_cols is not None and m.shape[1] != n_cols:
        raise BTableError(path, f"matrix has {m.shape[1]} columns but there are {n_cols} labels")
    keep = m.data != 0.0
    if not keep.all():
        kept = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
        indptr = kept[m.indptr]
        m = sp.csr_matrix((m.data[keep], m.indices[keep], indptr), shape=m.shape)
    return m


class BTableWriter:
    """Streaming BTable writer: ``with BTableWriter(path, labels) as w: w.write_rows(block)``.

    ``write_rows`` takes a CSR block (any scipy sparse matrix) or a dense 2-D array with
    ``len(labels)`` columns; entries == 0.0 are dropped (NaN kept). The output is written as it
    comes, so tables larger than memory can be produced block by block.
    """

    def __init__(self, path: str | os.PathLike, labels: Sequence[str]) -> None:
        self.path = Path(path)
        header = _encode_labels(labels, self.path)
        self.n_cols = len(list(labels))
        if self.n_cols > 2**31 - 1:
            raise BTableError(self.path, "more columns than an int32 column index can address")
        self.rows = 0
        self.nnz = 0
        self._f: BinaryIO | None = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._f.write(header)

    def write_rows(self, block: Any) -> None:
        """Append the rows of ``block``."""
        if self._f is None:
            raise BTableError(self.path, "writer is closed")
        m = _canonical_csr(block, self.n_cols, self.path)
        self._f.write(memoryview(row_format.encode_btable_rows(m.indptr, m.indices, m.data)))
        self.rows += m.shape[0]
        self.nnz += m.nnz

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> BTableWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write(path: str | os.PathLike, labels: Sequence[str], matrix: Any,
          chunk_rows: int = 1 << 16) -> dict[str, int]:
    """Write ``matrix`` (scipy sparse or dense 2-D array-like) with ``labels`` as a BTable.

    Rows are encoded ``chunk_rows`` at a time to bound the temporary buffer. Returns
    ``{"rows", "nnz", "bytes"}``.
    """
    sp = _scipy_sparse()

    m = matrix if sp.issparse(matrix) else np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise BTableError(path, f"rows must form a 2-D array, got {m.ndim}-D")
    if sp.issparse(m):
        m = m.tocsr()
    with BTableWriter(path, labels) as w:
        for a in range(0, max(m.shape[0], 1), chunk_rows):
            w.write_rows(m[a:a + chunk_rows])
        rows, nnz = w.rows, w.nnz
    return {"rows": rows, "nnz": nnz, "bytes": os.path.getsize(path)}


# ------------------------------------------------------------------------ LMDB <-> BTable
def export_lmdb(src_lmdb: str | os.PathLike, dst_btable: str | os.PathLike,
                batch: int = 4096) -> dict[str, int]:
    """Write the rows of an LMDB made by ``--layout btable`` (one sparse row record per key, in
    key order) back into a BTable file, with the labels of its ``lmdbio.json`` sidecar."""
    meta = read_dataset_meta(src_lmdb)
    if meta.get("layout") != "btable" or "labels" not in meta:
        raise CodecError(f"{src_lmdb}: not an LMDB of layout 'btable' (its lmdbio.json has no "
                         "labels)")
    labels = list(meta["labels"])
    n_cols = len(labels)
    with BTableWriter(dst_btable, labels) as w:
        for keys, values in _iter_lmdb_batches(src_lmdb, batch):
            lengths = np.fromiter((len(v) for v in values), np.int64, len(values))
            offsets = np.zeros(len(values), np.int64)
            np.cumsum(lengths[:-1], out=offsets[1:])
            buf = np.frombuffer(b"".join(values), np.uint8)
            w.write_rows(row_format.decode_row_records(buf, offsets, lengths, n_cols, keys))
        rows, nnz = w.rows, w.nnz
    return {"rows": rows, "nnz": nnz, "bytes": os.path.getsize(dst_btable)}


def _iter_lmdb_batches(path: str | os.PathLike,
                       batch: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """(keys, values) of an LMDB in key order, ``batch`` records at a time (py-lmdb; the one
    place to switch to the page engine)."""
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False, subdir=Path(path).is_dir())
    try:
        with env.begin(buffers=False) as txn:
            keys: list[bytes] = []
            values: list[bytes] = []
            for k, v in txn.cursor():
                keys.append(k)
                values.append(v)
                if len(keys) >= batch:
                    yield keys, values
                    keys, values = [], []
            if keys:
                yield keys, values
    finally:
        env.close()

