"""``Database``: a read-only snapshot of one LMDB tree, read through a memory mapping.

Opening parses and validates both meta pages, picks the live one (larger txnid), and
resolves the main database or a named sub-database. Nothing else is read until asked:
the leaf list (branch pages only), the leaf directory (leaf headers only) and the record
table (leaf pages only) are built lazily by compiled kernels and cached. Values are handed
out as zero-copy ``memoryview`` slices of the mapping.

Around it: opening checks in :mod:`lmdbio.lmdb.snapshot` and :mod:`lmdbio.lmdb.subdb`,
record tables and references in :mod:`lmdbio.lmdb.records`, the free list in
:mod:`lmdbio.lmdb.free_pages`; copying values into batch buffers in :mod:`lmdbio.io.gather`
and the page accounting (with a node's O_DIRECT cache) in :mod:`lmdbio.io.accounting`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Iterator
from typing import Any, NoReturn

import numpy as np

from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.io import libc
from lmdbio.io.accounting import PageAccounting
from lmdbio.io.prefetch import MADV_RANDOM
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module
from lmdbio.lmdb import format as fmt_mod
from lmdbio.lmdb.cursor import Cursor
from lmdbio.lmdb.format import MDB_DUPSORT, DbRecord, PageLayout
from lmdbio.lmdb.pin import SnapshotPin
from lmdbio.lmdb.records import RecordRefs, RecordTable, record_indices
from lmdbio.lmdb.snapshot import (
    SnapshotId,
    past_the_end,
    read_live_meta,
    resolve_file,
)
from lmdbio.lmdb.subdb import list_subdb_names, resolve_tree


class Database:
    """A read-only snapshot of an LMDB database (the main one or a named sub-database).

    Args:
        path: an LMDB directory or its ``data.mdb`` file.
        subdb: name of a named sub-database (``str`` or ``bytes``); ``None`` for the main one.
        pin_snapshot: hold a py-lmdb read transaction for the database's lifetime, so a live
            writer cannot recycle the pages being read (needs a lock file; where one cannot be
            opened, ``stat()["snapshot_pinned"]`` is False and says why).
        accounting: keep a bitmap of the pages touched by walks, seeks and gathers
            (:class:`~lmdbio.io.accounting.PageAccounting`).
        buffer: an existing read-only mapping of the file (a numpy ``uint8`` array, e.g. from
            :func:`lmdbio.io.symmap.map_symmetric`); by default the file is mapped here.
        address: the virtual address of ``buffer`` when it is a symmetric mapping (cursors then
            serialize raw page addresses).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        subdb: str | bytes | None = None,
        *,
        pin_snapshot: bool = True,
        accounting: bool = False,
        buffer: np.ndarray | None = None,
        address: int | None = None,
    ) -> None:
        self.path = resolve_file(path)
        self._mmap: mmap.mmap | None = None
        self._pin_obj: SnapshotPin | None = None
        if buffer is None:
            size = self.path.stat().st_size
            if size == 0:
                raise LmdbFormatError(self.path, "empty file (0 bytes): not an LMDB data file")
            with open(self.path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            buffer = np.frombuffer(self._mmap, dtype=np.uint8)
        self.buf: np.ndarray = buffer
        self.mv = buffer.data.cast("B") if buffer.ndim == 1 else buffer.data
        self.address = address
        self.file_size = int(buffer.shape[0])
        self._closed = False
        self._finalizer = weakref.finalize(self, Database._release, self._mmap, None)
        try:
            self.meta = read_live_meta(self.mv, self.path, self.file_size)
            self.layout: PageLayout = fmt_mod.LAYOUTS[self.meta.version]
            self.psize = self.meta.psize
            self.fmt = self.layout.as_array(self.psize)
            self.last_pg = min(self.meta.last_pg, self.file_size // self.psize - 1)
            if self.meta.last_pg >= self.file_size // self.psize:
                raise LmdbFormatError(self.path, past_the_end(
                    self.meta.page, self.meta.last_pg, self.file_size, self.psize))
            self.accounting = PageAccounting(self.file_size // self.psize, enabled=accounting)
            self.subdb_name = subdb.encode() if isinstance(subdb, str) else subdb
            self.db = resolve_tree(self, self.subdb_name)
            self.accounting.reset()  # resolving a named database read the main tree
            if pin_snapshot:
                self._pin()
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, Database._release, self._mmap,
                                               self._pin_obj)
        except BaseException:
            self.close()
            raise
        #: whether page faults on the mapping read around the faulting page (the kernel's
        #: default); False once the mapping is advised ``MADV_RANDOM`` (LMDB's
        #: ``MDB_NORDAHEAD``). Readers then also ask ahead for single pages (leaves), which
        #: with read-around would break up the kernel's own larger reads.
        self.read_around = True
        self._leaves: np.ndarray | None = None
        self._nbranches = 0
        self._leaf_first: np.ndarray | None = None
        self._table: RecordTable | None = None

    def _pin(self, txnid: int | None = None) -> None:
        self._pin_obj = SnapshotPin(self.path, self.meta.txnid if txnid is None else txnid)

    def pin_snapshot(self, txnid: int | None = None) -> None:
        """Pin this snapshot now (:class:`~lmdbio.lmdb.pin.SnapshotPin`) if it is not
        pinned yet: for a database opened with ``pin_snapshot=False`` whose owner decides
        later, with others, which process pins (one per host and file). The pin checks
        that it holds the txnid opened here, or ``txnid``: the snapshot other processes
        opened, which this one pins for them."""
        self.check_open()
        if self._pin_obj is not None:
            return
        self._pin(txnid)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, Database._release, self._mmap,
                                           self._pin_obj)

    # ----------------------------------------------------------------- lifecycle
    @staticmethod
    def _release(mm: mmap.mmap | None, pin: Any) -> None:
        if pin is not None:
            pin.close()
        if mm is not None:
            # with views still exported the mapping goes away with the last of them
            with contextlib.suppress(BufferError):
                mm.close()

    def advise_access(self, advice: int) -> None:
        """``madvise`` the whole mapping with ``advice`` (``MADV_RANDOM``: page faults read
        just their page, LMDB's ``MDB_NORDAHEAD``; ``MADV_NORMAL`` / ``MADV_SEQUENTIAL``:
        the kernel reads around them) and record whether faults now read around
        (:attr:`read_around`). Raises ``OSError`` if the kernel refuses."""
        if self.buf.shape[0]:
            libc.madvise(self.buf.ctypes.data, self.buf.shape[0], advice)
        self.read_around = advice != MADV_RANDOM

    def close(self) -> None:
        """Release the snapshot pin and the mapping (views handed out keep it alive)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._finalizer.detach()
        self._table = None
        self._leaves = None
        pin, self._pin_obj = self._pin_obj, None
        mm = self._mmap
        self._mmap = None
        self.mv.release()
        self.buf = np.empty(0, np.uint8)
        Database._release(mm, pin)

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_open(self) -> None:
        """Raise :class:`~lmdbio.errors.LmdbioError` once the database is closed."""
        if self._closed:
            raise LmdbioError(f"{self.path}: database is closed")

    # ----------------------------------------------------------------- kernels
    def raise_format_error(self, code: int, page: int) -> NoReturn:
        """Raise :class:`~lmdbio.errors.LmdbFormatError` for error ``code`` of a compiled
        kernel (:mod:`lmdbio.lmdb.kernels`) at page ``page`` of this file."""
        message = kernel_module("lmdbio.lmdb").error_message(code)
        raise LmdbFormatError(self.path, message, page=int(page))

    def _walk(self, db: DbRecord) -> tuple[np.ndarray, int]:
        k = kernel_module("lmdbio.lmdb")

        leaves = np.empty(self.meta.last_pg + 1, np.int64)
        code, page, nleaves, nbranches = k.walk_tree(
            self.buf, self.fmt, db.root, db.depth, self.meta.last_pg, leaves,
            self.accounting.touched, self.accounting.enabled)
        if code:
            self.raise_format_error(code, page)
        return leaves[:nleaves].copy(), int(nbranches)

    def build_table(self, db: DbRecord, leaves: np.ndarray | None = None,
                    nrecords: int | None = None) -> RecordTable:
        """The record table of tree ``db`` (this database's, the main one or the free-page
        database) over its leaf pages ``leaves`` (default: all, from a walk of the tree),
        ``nrecords`` records (default: counted from the leaf headers). Reads those leaf
        pages (marked in the accounting); not cached (:meth:`record_table` caches)."""
        k = kernel_module("lmdbio.lmdb")

        if leaves is None:
            leaves, _ = self._walk(db)
        if nrecords is None:
            counts = np.empty(leaves.shape[0], np.int64)
            code, page = k.count_leaf_records(self.buf, self.fmt, leaves, counts,
                                              self.accounting.touched, False)
            if code:
                self.raise_format_error(code, page)
            nrecords = int(counts.sum())
        t = RecordTable.empty(nrecords)
        code, page, found = k.leaf_records(
            self.buf, self.fmt, leaves, self.meta.last_pg, bool(db.flags & MDB_DUPSORT),
            t.leaf_pg, t.slot, t.key_off, t.key_len, t.val_off, t.val_len, t.ovf_pages,
            t.node_flags, self.accounting.touched, self.accounting.enabled)
        if code:
            self.raise_format_error(code, page)
        if found != nrecords:  # fewer than counted: the table's last rows would be unset
            raise LmdbFormatError(self.path, f"leaf pages {int(leaves[0])}.."
                                  f"{int(leaves[-1])} hold {found} records, {nrecords} "
                                  "were counted", page=int(leaves[-1]))
        return t

    # ----------------------------------------------------------------- structure
    @property
    def snapshot(self) -> SnapshotId:
        """The identity of the snapshot this database reads."""
        return SnapshotId(self.meta.version, self.meta.txnid, self.db.root, self.file_size)

    def leaves(self) -> np.ndarray:
        """Leaf page numbers in key order (cached): walks the tree, reading every branch
        page and every leaf's header (each is checked to be a leaf; marked in the
        accounting). :meth:`tree_levels` names the leaves from the branch pages alone."""
        self.check_open()
        if self._leaves is None:
            if self.db.empty:
                self._leaves = np.empty(0, np.int64)
            else:
                self._leaves, self._nbranches = self._walk(self.db)
        return self._leaves

    def inline_value_limit(self) -> int | None:
        """An upper bound of every value's size when the tree has no overflow pages, from
        the format alone (nothing read): LMDB moves a value to overflow pages when its
        leaf node (8-byte header, key, value) exceeds about half a page less the page
        header, so an inline value is smaller than ``(psize - page header) // 2``. ``None``
        when the tree has overflow pages (values of any size) or sorted duplicates."""
        if self.db.overflow_pages or self.db.flags & MDB_DUPSORT:
            return None
        return (self.psize - self.layout.header_size) // 2

    def page_entries(self, pg: int) -> int:
        """The number of nodes on branch or leaf page ``pg`` (records on a leaf). Reads that
        page's header only, unaccounted, as :meth:`branch_children`."""
        k = kernel_module("lmdbio.lmdb")

        self.check_open()
        code, n = k.check_page(self.buf, self.fmt, int(pg), self.meta.last_pg)
        if code:
            self.raise_format_error(code, pg)
        return int(n)

    def branch_children(self, pg: int) -> np.ndarray:
        """Child page numbers of branch page ``pg``, in key order. Reads that page only (and
        does not mark it in the accounting: callers ask about pages a walk already read)."""
        k = kernel_module("lmdbio.lmdb")

        self.check_open()
        out = np.empty(self.psize // 2, np.int64)
        code, n = k.branch_children(self.buf, self.fmt, int(pg), self.meta.last_pg, out)
        if code:
            self.raise_format_error(code, pg)
        return out[:n].copy()

    def tree_levels(self, record: DbRecord | None = None
                    ) -> tuple[list[np.ndarray], np.ndarray]:
        """``(levels, parents)``: the pages of a tree level by level from its root, each
        level in key order (the last: its leaves), and each leaf's parent page (empty for
        a tree of one page). Parses the branch pages only (marked in the accounting); the
        leaves are named by their parents, not read. ``record``: the tree (default: this
        database's), its root, depth and counts checked as
        :func:`~lmdbio.lmdb.snapshot.check_db_record` does. Raises
        :class:`~lmdbio.errors.LmdbFormatError` for a page named twice (a cycle or a
        shared subtree: the levels could otherwise grow without bound) or a page that is
        not a branch page where the depth says one is."""
        cycle_error = kernel_module("lmdbio.lmdb").E_CYCLE

        self.check_open()
        record = self.db if record is None else record
        if record.empty:
            return [np.empty(0, np.int64)], np.empty(0, np.int64)
        levels = [np.array([record.root], np.int64)]
        parents = np.empty(0, np.int64)
        seen = 1
        for _ in range(record.depth - 1):
            level = levels[-1]
            self.accounting.mark_pages(level)
            kids = [self.branch_children(int(pg)) for pg in level.tolist()]
            parents = np.repeat(level, [k.size for k in kids])
            nxt = np.concatenate(kids)
            seen += nxt.size
            if seen > self.meta.last_pg + 1 or np.unique(nxt).size != nxt.size:
                self.raise_format_error(cycle_error, int(level[0]))
            levels.append(nxt)
        return levels, parents

    def checked_leaves(self, leaves: np.ndarray) -> np.ndarray:
        """``leaves`` as int64 page numbers, every one inside the snapshot and the file and
        flagged a leaf page; raises :class:`~lmdbio.errors.LmdbFormatError` naming the
        first that is not."""
        k = kernel_module("lmdbio.lmdb")
        leaves = np.ascontiguousarray(leaves, dtype=np.int64)
        outside = np.flatnonzero((leaves < 2) | (leaves > self.meta.last_pg)
                                 | ((leaves + 1) * self.psize > self.buf.shape[0]))
        if outside.size:
            self.raise_format_error(k.E_PAGE_RANGE, leaves[outside[0]])
        flags = self.buf[leaves * self.psize + self.layout.flags_off]
        if leaves.size and not (flags & 0x02).all():
            self.raise_format_error(k.E_PAGE_KIND, leaves[np.flatnonzero(~flags & 0x02)[0]])
        return leaves

    def leaf_value_runs(self, leaves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(first, counts)``, one entry per record on leaf pages ``leaves`` in key order:
        the first page and length of its overflow run, or its leaf page and 0 for a value
        stored inline (the compiled record table of those leaves). Reads those leaf pages
        (marked in the accounting) and no overflow page; raises
        :class:`~lmdbio.errors.LmdbFormatError` naming a page that is outside the snapshot
        or not a leaf."""
        self.check_open()
        t = self.build_table(self.db, self.checked_leaves(leaves))
        return t.val_off // self.psize, t.ovf_pages.copy()

    def leaf_directory(self) -> np.ndarray:
        """``first[j]`` = index of the first record on leaf ``j``; ``first[-1]`` = total.

        Reads branch pages and leaf headers only (no values, no overflow pages).
        """
        if self._leaf_first is None:
            k = kernel_module("lmdbio.lmdb")

            leaves = self.leaves()
            counts = np.empty(leaves.shape[0], np.int64)
            code, page = k.count_leaf_records(self.buf, self.fmt, leaves, counts,
                                              self.accounting.touched, self.accounting.enabled)
            if code:
                self.raise_format_error(code, page)
            first = np.zeros(leaves.shape[0] + 1, np.int64)
            np.cumsum(counts, out=first[1:])
            if first[-1] != self.db.entries:
                raise LmdbFormatError(
                    self.path, f"the tree holds {first[-1]} records but the meta page says "
                    f"{self.db.entries}", page=self.db.root)
            self._leaf_first = first
        return self._leaf_first

    @property
    def has_leaf_directory(self) -> bool:
        """Whether the leaf directory is at hand (built, or adopted with
        :meth:`set_leaf_directory`): :meth:`locate` then reads one leaf per record."""
        return self._leaf_first is not None

    def record_table(self, start: int = 0, stop: int | None = None) -> RecordTable:
        """The record table for records ``start .. stop - 1`` (key order).

        The full table is built once and cached; a range of a database whose full table is
        not built yet reads only the leaf pages covering the range.
        """
        self.check_open()
        n = len(self)
        stop = n if stop is None else min(stop, n)
        start = max(0, min(start, stop))
        if self._table is not None:
            return self._table.subset(start, stop)
        if start == 0 and stop == n:
            first = self.leaf_directory()
            self._table = self.build_table(self.db, self.leaves(), int(first[-1]))
            return self._table
        first = self.leaf_directory()
        j0 = int(np.searchsorted(first, start, side="right")) - 1
        j1 = int(np.searchsorted(first, stop, side="left"))
        leaves = self.leaves()[j0:j1]
        t = self.build_table(self.db, leaves, int(first[j1] - first[j0]))
        t.start = int(first[j0])
        return t.subset(start - int(first[j0]), stop - int(first[j0]))

    # ----------------------------------------------------------------- records
    def __len__(self) -> int:
        return int(self.db.entries)

    def key(self, i: int) -> bytes:
        """Key of record ``i`` (key order)."""
        t = self.record_table()
        return bytes(self.mv[t.key_off[i]:t.key_off[i] + t.key_len[i]])

    def value(self, i: int) -> memoryview:
        """Zero-copy value of record ``i``."""
        t = self.record_table()
        return self.mv[t.val_off[i]:t.val_off[i] + t.val_len[i]]

    def items(self) -> Iterator[tuple[bytes, memoryview]]:
        """``(key, value)`` in key order; values are zero-copy views into the mapping."""
        t = self.record_table()
        mv = self.mv
        ko, kl, vo, vl = (a.tolist() for a in (t.key_off, t.key_len, t.val_off, t.val_len))
        for i in range(len(ko)):
            yield bytes(mv[ko[i]:ko[i] + kl[i]]), mv[vo[i]:vo[i] + vl[i]]

    def keys(self) -> Iterator[bytes]:
        for k, _ in self.items():
            yield k

    def __iter__(self) -> Iterator[bytes]:
        return self.keys()

    def get(self, key: bytes, default: Any = None) -> memoryview | Any:
        """Zero-copy value stored under ``key`` (a tree search), or ``default``."""
        cur = self.cursor()
        if cur.set_key(key):
            return cur.value()
        return default

    def __contains__(self, key: bytes) -> bool:
        return self.cursor().set_key(key)

    def cursor(self):
        """A new :class:`lmdbio.lmdb.cursor.Cursor`, unpositioned."""
        self.check_open()
        return Cursor(self)

    def cursor_from_bytes(self, data: bytes):
        """Rebuild a cursor serialized by :meth:`Cursor.to_bytes` (same snapshot only)."""
        self.check_open()
        return Cursor.from_bytes(self, data)

    # ----------------------------------------------------------------- record references
    def walk_collect(self, cursor, n: int, wrap: bool = False) -> tuple[RecordRefs, int, bool]:
        """Advance ``cursor`` over ``n`` records (compiled), collecting where their values are.

        Reads branch and leaf pages only. Returns ``(refs, wraps, at_end)``: ``wraps`` counts
        how often the walk wrapped around to the first record (``wrap=True``), ``at_end`` is
        set when it stopped at the end of the tree instead.
        """
        k = kernel_module("lmdbio.lmdb")

        refs = RecordRefs.empty(n)
        got, wraps, at_end = self._advance(
            cursor, wrap, lambda pg, slot: k.walk_collect(
                self.buf, self.fmt, pg, slot, self.db.depth, self.meta.last_pg, n, wrap,
                self.db.root, refs.val_off, refs.val_len, refs.leaf_pg, refs.ovf_pages,
                refs.key_off, refs.key_len, self.accounting.touched, self.accounting.enabled))
        return refs.head(got), wraps, at_end

    def walk_skip(self, cursor, n: int, wrap: bool = False) -> tuple[int, int, bool]:
        """Advance ``cursor`` over ``n`` records (compiled) without collecting them: leaf by
        leaf from the leaves' record counts, reading the branch and leaf pages
        :meth:`walk_collect` reads but parsing no node. Returns ``(passed, wraps,
        at_end)``, as :meth:`walk_collect` returns its ``wraps`` and ``at_end``."""
        k = kernel_module("lmdbio.lmdb")

        return self._advance(
            cursor, wrap, lambda pg, slot: k.walk_skip(
                self.buf, self.fmt, pg, slot, self.db.depth, self.meta.last_pg, n, wrap,
                self.db.root, self.accounting.touched, self.accounting.enabled))

    def _advance(self, cursor, wrap: bool, kernel) -> tuple[int, int, bool]:
        """Run a cursor-moving ``kernel(stack_pg, stack_slot)`` (returning ``(code, page,
        records, wraps, at_end)``) on ``cursor``'s stack, positioning an unpositioned
        cursor first; raises on a bad page, updates the cursor. ``(records, wraps,
        at_end)``; nothing moves on an empty database or past the end without ``wrap``."""
        if not cursor.initialized and not cursor.first():
            return 0, 0, True
        if cursor.eof and (not wrap or not cursor.first()):
            return 0, 0, True
        stack_pg = np.array([p for p, _ in cursor.stack], np.int64)
        stack_slot = np.array([s for _, s in cursor.stack], np.int64)
        code, page, got, wraps, at_end = kernel(stack_pg, stack_slot)
        if code:
            self.raise_format_error(code, page)
        self.accounting.fill_node_cache()
        cursor.stack = [[int(p), int(s)] for p, s in zip(stack_pg, stack_slot, strict=False)]
        if at_end:
            cursor.eof = True
        return int(got), int(wraps), bool(at_end)

    def set_leaf_directory(self, leaves: np.ndarray, first: np.ndarray) -> None:
        """Adopt a leaf directory built elsewhere (collectively, or loaded from a sidecar)."""
        if first.shape[0] != leaves.shape[0] + 1 or int(first[-1]) != len(self):
            raise LmdbioError(f"{self.path}: leaf directory does not match this snapshot "
                              f"({leaves.shape[0]} leaves, {int(first[-1])} records; the "
                              f"database has {len(self)} records)")
        self._leaves = np.ascontiguousarray(leaves, np.int64)
        self._leaf_first = np.ascontiguousarray(first, np.int64)

    def locate(self, indices: np.ndarray) -> RecordRefs:
        """Where records ``indices`` are, through the leaf directory (one leaf read each)."""
        k = kernel_module("lmdbio.lmdb")

        idx = record_indices(indices, len(self))
        refs = RecordRefs.empty(idx.shape[0])
        code, page = k.locate(self.buf, self.fmt, self.leaves(), self.leaf_directory(),
                              self.meta.last_pg, read_only(idx), refs.val_off, refs.val_len,
                              refs.leaf_pg, refs.ovf_pages, refs.key_off, refs.key_len,
                              self.accounting.touched, self.accounting.enabled)
        if code:
            self.raise_format_error(code, page)
        self.accounting.fill_node_cache()
        return refs

    # ----------------------------------------------------------------- reporting
    def subdatabases(self) -> list[bytes]:
        """Names of the named sub-databases in this file's main database."""
        return list_subdb_names(self, self.meta.main_db)

    def stat(self) -> dict[str, Any]:
        """Statistics as py-lmdb's ``stat()`` gives them, plus format and snapshot facts."""
        db = self.db
        pinned, pin_state = (False, "not requested") if self._pin_obj is None \
            else self._pin_obj.status()
        return {
            "psize": self.psize,
            "depth": db.depth,
            "branch_pages": db.branch_pages,
            "leaf_pages": db.leaf_pages,
            "overflow_pages": db.overflow_pages,
            "entries": db.entries,
            "format_version": self.meta.version,
            "txnid": self.meta.txnid,
            "last_pgno": self.meta.last_pg,
            "map_size": self.meta.mapsize,
            "file_size": self.file_size,
            "root": None if db.empty else db.root,
            "flags": db.flag_names(),
            "live_meta_page": self.meta.page,
            "subdb": None if self.subdb_name is None else self.subdb_name.decode("latin-1"),
            "snapshot_pinned": pinned,
            "snapshot_pin": pin_state,
        }

    @property
    def where(self) -> str:
        """The file, and the named database when one is read: what an error names."""
        name = self.subdb_name
        return f"{self.path}" if name is None else f"{self.path} (database {name!r})"

    def __repr__(self) -> str:
        name = "" if self.subdb_name is None else f", subdb={self.subdb_name!r}"
        return f"<lmdbio.Database {str(self.path)!r}{name} entries={len(self)}>"

    def sort_key(self, key: bytes) -> int | bytes:
        """Sort key implementing the database's comparator for ``key`` (for cursor seeks)."""
        if self.db.flags & 0x08:  # INTEGERKEY: native unsigned integers
            return int.from_bytes(key, "little")
        if self.db.flags & 0x02:  # REVERSEKEY: compare from the last byte
            return key[::-1]
        return key

