"""Record tables and record references: where records of an LMDB tree live in the file.

A :class:`RecordTable` holds the per-record arrays of a run of records in key order (what
the compiled kernels build from leaf pages); :class:`RecordRefs` holds where some records'
values and keys are (what walks and locates collect, what gathers copy from);
:class:`LocatedRecords` keeps the refs of records located once, for the next epoch. All are
plain arrays of file offsets: nothing here reads the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module


@dataclass
class RecordTable:
    """Per-record arrays for records ``start .. start + len - 1`` of the tree, in key order.

    ``val_off`` is the value's byte offset in the file, ``ovf_pages`` the length of its
    overflow run (0 when the value is stored inline in the leaf page).
    """

    start: int
    leaf_pg: np.ndarray
    slot: np.ndarray
    key_off: np.ndarray
    key_len: np.ndarray
    val_off: np.ndarray
    val_len: np.ndarray
    ovf_pages: np.ndarray
    node_flags: np.ndarray

    def __len__(self) -> int:
        return int(self.leaf_pg.shape[0])

    @classmethod
    def empty(cls, n: int, start: int = 0) -> RecordTable:
        """A table of ``n`` records starting at record ``start``, its arrays unfilled (for a
        kernel to write)."""
        return cls(
            start,
            np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int64),
            np.empty(n, np.int32), np.empty(n, np.int64), np.empty(n, np.int64),
            np.empty(n, np.int32), np.empty(n, np.uint16),
        )

    def refs(self, rows: np.ndarray | None = None) -> RecordRefs:
        """Its records (or those at positions ``rows``) as :class:`RecordRefs`, every
        field int64, as a locate gives them."""
        pick = slice(None) if rows is None else rows
        return RecordRefs(*(np.asarray(getattr(self, f)[pick], np.int64)
                            for f in RecordRefs._FIELDS))

    def subset(self, lo: int, hi: int) -> RecordTable:
        """Records ``lo .. hi - 1`` of this table (global indices ``start + lo ...``)."""
        return RecordTable(
            self.start + lo, *(a[lo:hi] for a in (
                self.leaf_pg, self.slot, self.key_off, self.key_len, self.val_off,
                self.val_len, self.ovf_pages, self.node_flags)))


@dataclass
class RecordRefs:
    """Where some records live: value offset and length, leaf page, overflow run length,
    key offset and length (offsets are file offsets)."""

    val_off: np.ndarray
    val_len: np.ndarray
    leaf_pg: np.ndarray
    ovf_pages: np.ndarray
    key_off: np.ndarray
    key_len: np.ndarray

    @classmethod
    def empty(cls, n: int) -> RecordRefs:
        """References to ``n`` records, unfilled (for a kernel to write)."""
        return cls(*np.empty((6, n), np.int64))  # one allocation, six rows

    @classmethod
    def concat(cls, parts: list[RecordRefs]) -> RecordRefs:
        """The records of ``parts``, one after another."""
        if not parts:
            return cls.empty(0)
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls._FIELDS))

    def __len__(self) -> int:
        return int(self.val_off.shape[0])

    _FIELDS = ("val_off", "val_len", "leaf_pg", "ovf_pages", "key_off", "key_len")

    def take(self, indices: np.ndarray) -> RecordRefs:
        """The records at positions ``indices`` (a whole-array selection)."""
        return RecordRefs(*(getattr(self, f)[indices] for f in self._FIELDS))

    def head(self, n: int) -> RecordRefs:
        """The first ``n`` records (views, no copy)."""
        return RecordRefs(self.val_off[:n], self.val_len[:n], self.leaf_pg[:n],
                          self.ovf_pages[:n], self.key_off[:n], self.key_len[:n])

    @property
    def nbytes(self) -> int:
        """The bytes of all the values together."""
        return int(self.val_len.sum())

    def pages(self, psize: int) -> np.ndarray:
        """Distinct pages holding these records: their leaf pages and every value page."""
        return np.union1d(self.leaf_pg, self.value_pages(psize))

    def value_page_runs(self, psize: int) -> tuple[np.ndarray, np.ndarray]:
        """``(first, counts)``: the pages each value's bytes cover, as one run per record
        (overlapping for values that share a page; :func:`lmdbio.io.prefetch.
        advise_page_ranges` merges them); an empty value stands for the page of the byte
        before it, in its leaf (:func:`lmdbio.lmdb.kernels.value_page_span`)."""
        start = np.maximum(self.val_off - (self.val_len <= 0), 0)
        first = start // psize
        return first, (start + np.maximum(self.val_len, 1) - 1) // psize - first + 1

    def value_pages(self, psize: int) -> np.ndarray:
        """Distinct pages covered by the values' bytes."""
        if not len(self):
            return np.empty(0, np.int64)
        first, counts = self.value_page_runs(psize)
        # every page of every value without a Python loop: ramps restarting at each value
        ramp = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return np.unique(np.repeat(first, counts) + ramp)


def record_indices(indices: np.ndarray | range | slice, n: int) -> np.ndarray:
    """``indices`` (a slice, a range or an array-like) as an int64 array of record indices of
    a tree of ``n`` records; raises ``IndexError`` for one outside ``0 .. n - 1``."""
    if isinstance(indices, slice):
        indices = range(*indices.indices(n))
    if isinstance(indices, range):
        idx = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
    else:
        idx = np.ascontiguousarray(indices, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"record index out of range 0..{n - 1}")
    return idx


#: the most memory a :class:`LocatedRecords` may take (48 bytes and a flag per record:
#: about 11 million records); a larger database locates every record each time
LOCATED_RECORDS_MAX_BYTES = 512 << 20


class LocatedRecords:
    """Where the records of one snapshot are, kept as they are located: a random-access
    reader's record table, filled lazily.

    A shuffled epoch asks for every record again in another order; locating a record reads
    its leaf page (a binary search in the leaf directory, then one in the page: 0.1-0.3 us a
    record, most of it cache misses). Records located once are taken from here instead:
    one row of six int64 per record, so that a record's refs are one cache line (a
    field-major table took six misses a record: 330 against ~60 us for a slot of 2,880
    shuffled CIFAR-like records). Valid for one snapshot only: the offsets point into that
    snapshot's pages, which LMDB does not reuse while the snapshot is held.
    """

    def __init__(self, n: int) -> None:
        #: one row per record, one column per :class:`RecordRefs` field
        self.rows = np.empty((n, len(RecordRefs._FIELDS)), np.int64)
        self.known = np.zeros(n, np.bool_)

    @staticmethod
    def fits(n: int) -> bool:
        """Whether a table of ``n`` records stays within :data:`LOCATED_RECORDS_MAX_BYTES`."""
        return n * (6 * 8 + 1) <= LOCATED_RECORDS_MAX_BYTES

    def lookup(self, ids: np.ndarray) -> RecordRefs | None:
        """The records ``ids`` (int64 record indices in range, checked by the caller) when
        every one was located before; ``None`` otherwise."""
        take_rows = kernel_module("lmdbio.lmdb").take_rows

        if not ids.size:
            return None
        out = np.empty((self.rows.shape[1], ids.shape[0]), np.int64)
        if take_rows(self.rows, self.known, read_only(ids), out) >= 0:
            return None
        return RecordRefs(*out)

    def add(self, ids: np.ndarray, refs: RecordRefs) -> None:
        """Remember where records ``ids`` are (``refs``, as a locate gave them)."""
        for col, f in enumerate(RecordRefs._FIELDS):
            self.rows[ids, col] = getattr(refs, f)
        self.known[ids] = True
