"""Gathers: copying the values (and keys) of records of a database into batch buffers.

Each function takes the :class:`~lmdbio.lmdb.Database` whose mapping holds the records and
runs one compiled kernel of :mod:`lmdbio.lmdb.kernels` over all of them (no per-record
Python). Every overflow value's page header is checked before its bytes are copied, so a
damaged file raises :class:`~lmdbio.errors.LmdbFormatError` naming the page instead of
handing out another page's bytes. Pages copied are marked in the database's accounting;
with a node O_DIRECT cache attached to it (:attr:`lmdbio.io.accounting.PageAccounting.
node_cache`), :func:`gather_refs` reads the values' pages into the cache and copies from
there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.kernel_cache import kernel_module
from lmdbio.lmdb.records import RecordRefs, record_indices

if TYPE_CHECKING:
    from lmdbio.lmdb.database import Database


def gather(
    db: Database,
    indices: np.ndarray | range | slice,
    out: np.ndarray | None = None,
    prefix: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Copy the values of records ``indices`` of ``db`` back to back into one buffer.

    Returns ``(buffer, offsets)`` where value ``t`` is ``buffer[offsets[t]:offsets[t+1]]``.
    ``prefix`` copies only the first ``prefix`` bytes of each value (later overflow pages
    are not touched). ``out`` may be a preallocated ``uint8`` array (e.g. a shared-memory
    slot); it must be large enough.
    """
    k = kernel_module("lmdbio.lmdb")

    t = db.record_table()
    idx = record_indices(indices, len(db))
    limit = -1 if prefix is None else int(prefix)
    acc = db.accounting
    code, page = k.check_overflow_headers(db.buf, db.fmt, t.val_off, t.ovf_pages, idx,
                                          acc.touched, False)
    if code:
        db.raise_format_error(code, page)
    need = int(k.gather_lengths(t.val_len, idx, limit))
    if out is None:
        out = np.empty(need, np.uint8)
    elif out.shape[0] < need:
        raise LmdbioError(f"gather: output buffer holds {out.shape[0]} bytes, "
                          f"{need} needed for {idx.shape[0]} records")
    offsets = np.empty(idx.shape[0] + 1, np.int64)
    k.gather(db.buf, db.fmt, t.val_off, t.val_len, idx, out, offsets,
             acc.touched, acc.enabled, limit)
    return out, offsets


def gather_refs(db: Database, refs: RecordRefs, out: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Copy the values ``refs`` point at back to back into one buffer (see :func:`gather`);
    with a node O_DIRECT cache, from the cache, after reading the pages it lacks."""
    k = kernel_module("lmdbio.lmdb")

    every = np.arange(len(refs), dtype=np.int64)
    acc = db.accounting
    buf = db.buf
    if acc.node_cache is not None and len(refs):
        acc.node_cache.load_pages(refs.value_pages(db.psize))
        buf = acc.node_cache.buf
    code, page = k.check_overflow_headers(buf, db.fmt, refs.val_off, refs.ovf_pages,
                                          every, acc.touched, False)
    if code:
        db.raise_format_error(code, page)
    need = refs.nbytes
    if out is None:
        out = np.empty(need, np.uint8)
    elif out.shape[0] < need:
        raise LmdbioError(f"gather: output buffer holds {out.shape[0]} bytes, "
                          f"{need} needed for {len(refs)} records")
    offsets = np.empty(len(refs) + 1, np.int64)
    k.gather_ranges(buf, refs.val_off, refs.val_len, out, offsets, db.psize,
                    acc.touched, acc.enabled)
    return out, offsets


def gather_keys(db: Database, refs: RecordRefs) -> tuple[np.ndarray, np.ndarray]:
    """The keys of ``refs`` packed as ``(offsets, bytes)`` (the slot format); key pages are
    leaf pages, already accounted by the walk or locate that found the records."""
    k = kernel_module("lmdbio.lmdb")

    out = np.empty(int(refs.key_len.sum()), np.uint8)
    offsets = np.empty(len(refs) + 1, np.int64)
    k.gather_ranges(db.buf, refs.key_off, refs.key_len, out, offsets, db.psize,
                    db.accounting.touched, False)
    return offsets, out


def gather_batch(db: Database, refs: RecordRefs, payload: np.ndarray, offsets: np.ndarray,
                 keys: np.ndarray, key_offsets: np.ndarray) -> tuple[int, int]:
    """Values and keys of ``refs`` in one compiled pass: the values back to back into
    ``payload`` and the keys into ``keys``, with their offset tables (``len(refs) + 1``
    entries each) - what :func:`gather_refs` and :func:`gather_keys` give, written straight
    into caller buffers (a ring slot). Returns ``(payload_bytes, key_bytes)``.

    Not for node O_DIRECT caches (use :func:`gather_refs`, which loads the pages first).
    """
    k = kernel_module("lmdbio.lmdb")

    acc = db.accounting
    if acc.node_cache is not None:
        raise LmdbioError(f"{db.path}: gather_batch reads the mapping; with a node "
                          "O_DIRECT cache use gather_refs")
    n = len(refs)
    if offsets.shape[0] < n + 1 or key_offsets.shape[0] < n + 1:
        raise LmdbioError(f"gather: offset tables hold {offsets.shape[0]} and "
                          f"{key_offsets.shape[0]} entries, {n + 1} needed")
    code, page, nbytes, kbytes = k.gather_batch(
        db.buf, db.fmt, refs.val_off, refs.val_len, refs.ovf_pages, refs.key_off,
        refs.key_len, payload, offsets, keys, key_offsets, acc.touched, acc.enabled)
    if code == k.E_COUNT and page < 0:
        what, have, need = ("values", payload.shape[0], nbytes) if page == -1 else \
            ("keys", keys.shape[0], kbytes)
        raise LmdbioError(f"gather: the output buffer for the {what} holds {have} bytes, "
                          f"{need} needed for {n} records")
    if code:
        db.raise_format_error(code, page)
    return int(nbytes), int(kbytes)


def check_value_spans(db: Database, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Check the overflow page header of every value span ``(starts, lengths)`` of ``db``'s
    mapping handed to this rank (what :func:`gather_batch` checks before copying), spans
    already known to lie inside the mapping: a corrupt file raises
    :class:`~lmdbio.errors.LmdbFormatError` naming the page, before any value is decoded.
    The consumer checks, not the reader that hands the spans out: the header shares its
    cache line and page with the value's first bytes, which the consumer reads next, while
    the reader would read every value's page for this check alone (measured in
    docs/reading.md, tenth session)."""
    k = kernel_module("lmdbio.lmdb")

    code, page = k.check_value_spans(db.buf, db.fmt, starts, lengths)
    if code:
        db.raise_format_error(code, page)


def copy_spans_by_batch(db: Database, starts: np.ndarray, lengths: np.ndarray, batch: int,
                        out: np.ndarray, *, check: bool) -> int:
    """Copy the value spans ``(starts, lengths)`` of ``db``'s mapping (known to lie inside
    it) ``batch`` at a time into ``out``, each batch from ``out[0]`` on, as a consumer
    takes the batches of a slot one after another; with ``check`` each overflow value's
    page header is checked (as :func:`check_value_spans`) in the same pass, just before
    its bytes are copied. Returns the bytes copied over all batches, or -1 when ``out`` is
    too small for one batch (nothing is checked or copied past the span that did not fit;
    call again with a larger ``out``). Raises :class:`~lmdbio.errors.LmdbFormatError`
    naming the page of a bad header."""
    k = kernel_module("lmdbio.lmdb")

    if batch < 1:
        raise LmdbioError(f"copy_spans_by_batch: batch must be at least 1, got {batch}")
    code, value = k.gather_each_batch(db.buf, db.fmt, starts, lengths, int(batch),
                                      out, bool(check))
    if code < 0:
        return -1
    if code:
        db.raise_format_error(code, value)
    return int(value)
