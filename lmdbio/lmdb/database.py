"""``Database``: a read-only snapshot of one LMDB tree, read through a memory mapping.

Opening parses and validates both meta pages, picks the live one (larger txnid), and
resolves the main database or a named sub-database. Nothing else is read until asked:
the leaf list (branch pages only), the leaf directory (leaf headers only) and the record
table (leaf pages only) are built lazily by compiled kernels and cached. Values are handed
out as zero-copy ``memoryview`` slices of the mapping.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.lmdb import format as fmt_mod
from lmdbio.lmdb.accounting import PageAccounting
from lmdbio.lmdb.format import F_SUBDATA, MDB_DUPSORT, DbRecord, Meta, PageLayout
from lmdbio.lmdb.pin import SnapshotPin


@dataclass(frozen=True)
class SnapshotId:
    """What identifies one snapshot of one file: cursors from another snapshot are refused."""

    format_version: int
    txnid: int
    root: int
    file_size: int


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
        return cls(
            start,
            np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int64),
            np.empty(n, np.int32), np.empty(n, np.int64), np.empty(n, np.int64),
            np.empty(n, np.int32), np.empty(n, np.uint16),
        )

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
        return cls(*np.empty((6, n), np.int64))  # one allocation, six rows

    @classmethod
    def concat(cls, parts: list[RecordRefs]) -> RecordRefs:
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
        return RecordRefs(self.val_off[:n], self.val_len[:n], self.leaf_pg[:n],
                          self.ovf_pages[:n], self.key_off[:n], self.key_len[:n])

    @property
    def nbytes(self) -> int:
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


def _resolve_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "data.mdb"
    if not p.exists():
        raise LmdbioError(f"{p}: no such LMDB file (expected a directory holding data.mdb "
                          "or the data.mdb file itself)")
    return p


def _past_the_end(meta_page: int, last_pg: int, file_size: int, psize: int) -> str:
    """What is wrong with a file shorter than its meta page says (the error's text)."""
    pages = file_size // psize
    holds = f"pages 0..{pages - 1}" if pages else "no whole page"
    spare = file_size - pages * psize
    size = f"{file_size} bytes: {pages} page(s) of {psize} bytes" + \
        (f" and {spare} byte(s) of a page cut short" if spare else "")
    return (f"truncated file: meta page {meta_page} says the database ends at page {last_pg}, "
            f"but the file holds only {holds} ({size}), so page {last_pg} is past its end; "
            "the file was likely cut short (a copy or a write that did not finish): copy it "
            "again from its source")


class Database:
    """A read-only snapshot of an LMDB database (the main one or a named sub-database).

    Args:
        path: an LMDB directory or its ``data.mdb`` file.
        subdb: name of a named sub-database (``str`` or ``bytes``); ``None`` for the main one.
        pin_snapshot: hold a py-lmdb read transaction for the database's lifetime, so a live
            writer cannot recycle the pages being read (needs a lock file; where one cannot be
            opened, ``stat()["snapshot_pinned"]`` is False and says why).
        accounting: keep a bitmap of the pages touched by walks, seeks and gathers.
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
        self.path = _resolve_file(path)
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
            self.meta = self._read_meta()
            self.layout: PageLayout = fmt_mod.LAYOUTS[self.meta.version]
            self.psize = self.meta.psize
            self.fmt = self.layout.as_array(self.psize)
            self.last_pg = min(self.meta.last_pg, self.file_size // self.psize - 1)
            if self.meta.last_pg >= self.file_size // self.psize:
                raise LmdbFormatError(self.path, _past_the_end(
                    self.meta.page, self.meta.last_pg, self.file_size, self.psize))
            self.accounting = PageAccounting(self.file_size // self.psize, enabled=accounting)
            self.subdb_name = subdb.encode() if isinstance(subdb, str) else subdb
            self.db = self._resolve_db(self.subdb_name)
            self.accounting.reset()  # resolving a named database read the main tree
            if pin_snapshot:
                self._pin()
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, Database._release, self._mmap,
                                               self._pin_obj)
        except BaseException:
            self.close()
            raise
        #: a node's O_DIRECT page cache (:class:`lmdbio.io.direct.NodeCache`): when set,
        #: walks and seeks charge the branch and leaf pages they read to it and values are
        #: gathered from it (``lmdbio bench read --direct``; needs accounting)
        self.node_cache: Any = None
        #: whether page faults on the mapping read around the faulting page (the kernel's
        #: default); False once the mapping is advised ``MADV_RANDOM`` (LMDB's
        #: ``MDB_NORDAHEAD``). Readers then also ask ahead for single pages (leaves), which
        #: with read-around would break up the kernel's own larger reads.
        self.read_around = True
        self._leaves: np.ndarray | None = None
        self._nbranches = 0
        self._leaf_first: np.ndarray | None = None
        self._table: RecordTable | None = None

    # ----------------------------------------------------------------- opening
    def _read_meta(self) -> Meta:
        head = self.mv[:256]
        version = fmt_mod.sniff_version(head)
        if version is None:
            raise LmdbFormatError(self.path, "not an LMDB data file: meta page 0 has no "
                                  "0xBEEFC0DE magic with data format version 1 or 3", page=0)
        layout = fmt_mod.LAYOUTS[version]
        if len(head) < layout.header_size + 160:
            raise LmdbFormatError(self.path, f"file is {self.file_size} bytes, too short to "
                                  "hold a meta page", page=0)
        psize = struct.unpack_from("<I", head, layout.header_size + 24)[0]
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            raise LmdbFormatError(self.path, f"page size {psize} in meta page 0 is not a power "
                                  "of two between 512 and 65536", page=0)
        metas: list[Meta] = []
        problems = []
        for page in (0, 1):
            m = fmt_mod.parse_meta(self.mv, page, psize, version)
            if isinstance(m, str):
                problems.append(f"meta page {page}: {m}")
            else:
                metas.append(m)
        if not metas:
            raise LmdbFormatError(self.path, "; ".join(problems), page=0)
        live = max(metas, key=lambda m: (m.txnid, -m.page))
        if live.psize != psize:
            raise LmdbFormatError(self.path, f"meta page {live.page} gives page size "
                                  f"{live.psize}, meta page 0 gives {psize}", page=live.page)
        return live

    def _check_db(self, db: DbRecord, what: str) -> DbRecord:
        if db.empty:
            return db
        if db.root < 2 or db.root > self.meta.last_pg:
            raise LmdbFormatError(self.path, f"{what}: root page {db.root} outside the "
                                  f"snapshot (pages 2..{self.meta.last_pg})", page=self.meta.page)
        if db.depth < 1 or db.depth > fmt_mod.MAX_DEPTH:
            raise LmdbFormatError(self.path, f"{what}: depth {db.depth} (expected 1..32)",
                                  page=self.meta.page)
        most = (self.meta.last_pg + 1) * (self.psize // 2)
        if db.entries > most or max(db.branch_pages, db.leaf_pages,
                                    db.overflow_pages) > self.meta.last_pg:
            raise LmdbFormatError(self.path, f"{what}: {db.entries} entries / page counts "
                                  f"({db.branch_pages}, {db.leaf_pages}, {db.overflow_pages}) "
                                  f"cannot fit in {self.meta.last_pg + 1} pages",
                                  page=self.meta.page)
        if db.flags & MDB_DUPSORT:
            raise LmdbioError(f"{self.path}: {what} is a DUPSORT database "
                              f"(flags {', '.join(db.flag_names())}); lmdbio refuses DUPSORT "
                              "databases rather than iterate them differently from py-lmdb")
        return db

    def _resolve_db(self, name: bytes | None) -> DbRecord:
        main = self._check_db(self.meta.main_db, "main database")
        if name is None:
            return main
        found = self._find_subdb_record(main, name)
        if found is None:
            known = ", ".join(repr(n) for n in self._list_subdbs(main)) or "none"
            raise LmdbioError(f"{self.path}: no named database {name!r} (named databases: "
                              f"{known})")
        return self._check_db(found, f"named database {name!r}")

    def _subdb_key(self, name: bytes) -> bytes:
        # LMDB 1.0 stores the trailing NUL of a named database's key; 0.9 does not
        return name + b"\0" if self.meta.version == 3 else name

    def _main_table(self, main: DbRecord) -> RecordTable:
        if main.empty:
            return RecordTable.empty(0)
        return self._build_table(main)

    def _list_subdbs(self, main: DbRecord) -> list[bytes]:
        table = self._main_table(main)
        names = []
        for i in np.flatnonzero(table.node_flags & F_SUBDATA):
            k = bytes(self.mv[table.key_off[i]:table.key_off[i] + table.key_len[i]])
            names.append(k[:-1] if self.meta.version == 3 and k.endswith(b"\0") else k)
        return names

    def _find_subdb_record(self, main: DbRecord, name: bytes) -> DbRecord | None:
        table = self._main_table(main)
        want = self._subdb_key(name)
        for i in np.flatnonzero(table.node_flags & F_SUBDATA):
            k = bytes(self.mv[table.key_off[i]:table.key_off[i] + table.key_len[i]])
            if k == want:
                if table.val_len[i] != 48 or table.ovf_pages[i]:
                    raise LmdbFormatError(self.path, f"named database {name!r}: record is "
                                          f"{table.val_len[i]} bytes (expected 48)",
                                          page=int(table.leaf_pg[i]))
                return DbRecord.parse(self.mv, int(table.val_off[i]))
        return None

    def _pin(self, txnid: int | None = None) -> None:
        self._pin_obj = SnapshotPin(self.path, self.meta.txnid if txnid is None else txnid)

    def pin_snapshot(self, txnid: int | None = None) -> None:
        """Pin this snapshot now (:class:`~lmdbio.lmdb.pin.SnapshotPin`) if it is not
        pinned yet: for a database opened with ``pin_snapshot=False`` whose owner decides
        later, with others, which process pins (one per host and file). The pin checks
        that it holds the txnid opened here, or ``txnid``: the snapshot other processes
        opened, which this one pins for them."""
        self._check_open()
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
        from lmdbio.io import _libc
        from lmdbio.io.prefetch import MADV_RANDOM

        if self.buf.shape[0]:
            _libc.madvise(self.buf.ctypes.data, self.buf.shape[0], advice)
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

    def _check_open(self) -> None:
        if self._closed:
            raise LmdbioError(f"{self.path}: database is closed")

    # ----------------------------------------------------------------- kernels
    def _raise(self, code: int, page: int) -> None:
        from lmdbio.lmdb.kernels import error_message

        raise LmdbFormatError(self.path, error_message(code), page=int(page))

    def _walk(self, db: DbRecord) -> tuple[np.ndarray, int]:
        from lmdbio.lmdb import kernels as k

        leaves = np.empty(self.meta.last_pg + 1, np.int64)
        code, page, nleaves, nbranches = k.walk_tree(
            self.buf, self.fmt, db.root, db.depth, self.meta.last_pg, leaves,
            self.accounting.touched, self.accounting.enabled)
        if code:
            self._raise(code, page)
        return leaves[:nleaves].copy(), int(nbranches)

    def _build_table(self, db: DbRecord, leaves: np.ndarray | None = None,
                     nrecords: int | None = None) -> RecordTable:
        from lmdbio.lmdb import kernels as k

        if leaves is None:
            leaves, _ = self._walk(db)
        if nrecords is None:
            counts = np.empty(leaves.shape[0], np.int64)
            code, page = k.count_leaf_records(self.buf, self.fmt, leaves, counts,
                                              self.accounting.touched, False)
            if code:
                self._raise(code, page)
            nrecords = int(counts.sum())
        t = RecordTable.empty(nrecords)
        code, page, _n = k.leaf_records(
            self.buf, self.fmt, leaves, self.meta.last_pg, bool(db.flags & MDB_DUPSORT),
            t.leaf_pg, t.slot, t.key_off, t.key_len, t.val_off, t.val_len, t.ovf_pages,
            t.node_flags, self.accounting.touched, self.accounting.enabled)
        if code:
            self._raise(code, page)
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
        self._check_open()
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
        from lmdbio.lmdb import kernels as k

        self._check_open()
        code, n = k.check_page(self.buf, self.fmt, int(pg), self.meta.last_pg)
        if code:
            self._raise(code, pg)
        return int(n)

    def branch_children(self, pg: int) -> np.ndarray:
        """Child page numbers of branch page ``pg``, in key order. Reads that page only (and
        does not mark it in the accounting: callers ask about pages a walk already read)."""
        from lmdbio.lmdb import kernels as k

        self._check_open()
        out = np.empty(self.psize // 2, np.int64)
        code, n = k.branch_children(self.buf, self.fmt, int(pg), self.meta.last_pg, out)
        if code:
            self._raise(code, pg)
        return out[:n].copy()

    def tree_levels(self, record: DbRecord | None = None
                    ) -> tuple[list[np.ndarray], np.ndarray]:
        """``(levels, parents)``: the pages of a tree level by level from its root, each
        level in key order (the last: its leaves), and each leaf's parent page (empty for
        a tree of one page). Parses the branch pages only (marked in the accounting); the
        leaves are named by their parents, not read. ``record``: the tree (default: this
        database's), its root, depth and counts checked as :meth:`_check_db` does. Raises
        :class:`~lmdbio.errors.LmdbFormatError` for a page named twice (a cycle or a
        shared subtree: the levels could otherwise grow without bound) or a page that is
        not a branch page where the depth says one is."""
        from lmdbio.lmdb.kernels import E_CYCLE

        self._check_open()
        record = self.db if record is None else record
        if record.empty:
            return [np.empty(0, np.int64)], np.empty(0, np.int64)
        levels = [np.array([record.root], np.int64)]
        parents = np.empty(0, np.int64)
        seen = 1
        for _ in range(record.depth - 1):
            level = levels[-1]
            if self.accounting.enabled:
                self.accounting.touched[level] = 1
            kids = [self.branch_children(int(pg)) for pg in level.tolist()]
            parents = np.repeat(level, [k.size for k in kids])
            nxt = np.concatenate(kids)
            seen += nxt.size
            if seen > self.meta.last_pg + 1 or np.unique(nxt).size != nxt.size:
                self._raise(E_CYCLE, int(level[0]))
            levels.append(nxt)
        return levels, parents

    def _checked_leaves(self, leaves: np.ndarray) -> np.ndarray:
        """``leaves`` as int64 page numbers, every one inside the snapshot and the file and
        flagged a leaf page; raises :class:`~lmdbio.errors.LmdbFormatError` naming the
        first that is not."""
        from lmdbio.lmdb.kernels import E_PAGE_KIND, E_PAGE_RANGE

        leaves = np.ascontiguousarray(leaves, dtype=np.int64)
        outside = np.flatnonzero((leaves < 2) | (leaves > self.meta.last_pg)
                                 | ((leaves + 1) * self.psize > self.buf.shape[0]))
        if outside.size:
            self._raise(E_PAGE_RANGE, leaves[outside[0]])
        flags = self.buf[leaves * self.psize + self.layout.flags_off]
        if leaves.size and not (flags & 0x02).all():
            self._raise(E_PAGE_KIND, leaves[np.flatnonzero(~flags & 0x02)[0]])
        return leaves

    def free_list(self) -> tuple[np.ndarray, np.ndarray]:
        """``(free, own)``: the pages LMDB's free-page database lists as free in this
        snapshot, and that database's own pages (branch, leaf and overflow), each sorted.

        Neither holds a record of this snapshot: between the values, which LMDB writes in
        key order, they are what a reader cannot place from the main tree alone. Reads
        the free database's pages (a leaf or a few on most files; marked in the
        accounting as any page read). Raises
        :class:`~lmdbio.errors.LmdbFormatError` naming the page for a record that is not
        a page list or lists a page outside the snapshot."""
        self._check_open()
        fdb = self.meta.free_db
        empty = np.empty(0, np.int64)
        if fdb.empty:
            return empty, empty
        levels, _ = self.tree_levels(self._check_db(fdb, "free-page database"))
        t = self._build_table(fdb, self._checked_leaves(levels[-1]))
        own = list(levels)
        free = []
        last = self.meta.last_pg
        for j in range(len(t)):  # one record per commit that freed pages still listed
            off, n, ovf = int(t.val_off[j]), int(t.val_len[j]), int(t.ovf_pages[j])
            page = off // self.psize  # its leaf, or the first page of its overflow run
            if ovf:
                own.append(np.arange(page, page + ovf, dtype=np.int64))
                if self.accounting.enabled:
                    self.accounting.touched[page:page + ovf] = 1
            ids = self.buf[off:off + n // 8 * 8].copy().view("<u8").astype(np.int64)
            count = int(ids[0]) if ids.size else -1
            if not 0 <= count < ids.size:
                raise LmdbFormatError(self.path, f"free-page record of {n} bytes does not "
                                      f"hold a page list (count {count})", page=page)
            pages = ids[1:count + 1]
            if pages.size and (pages.min() < 2 or pages.max() > last):
                raise LmdbFormatError(self.path, f"free-page record lists a page outside "
                                      f"2..{last}", page=page)
            free.append(pages)
        return (np.unique(np.concatenate(free)) if free else empty,
                np.unique(np.concatenate(own)))

    def leaf_value_runs(self, leaves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(first, counts)``, one entry per record on leaf pages ``leaves`` in key order:
        the first page and length of its overflow run, or its leaf page and 0 for a value
        stored inline (the compiled record table of those leaves). Reads those leaf pages
        (marked in the accounting) and no overflow page; raises
        :class:`~lmdbio.errors.LmdbFormatError` naming a page that is outside the snapshot
        or not a leaf."""
        self._check_open()
        t = self._build_table(self.db, self._checked_leaves(leaves))
        return t.val_off // self.psize, t.ovf_pages.copy()

    def leaf_directory(self) -> np.ndarray:
        """``first[j]`` = index of the first record on leaf ``j``; ``first[-1]`` = total.

        Reads branch pages and leaf headers only (no values, no overflow pages).
        """
        if self._leaf_first is None:
            from lmdbio.lmdb import kernels as k

            leaves = self.leaves()
            counts = np.empty(leaves.shape[0], np.int64)
            code, page = k.count_leaf_records(self.buf, self.fmt, leaves, counts,
                                              self.accounting.touched, self.accounting.enabled)
            if code:
                self._raise(code, page)
            first = np.zeros(leaves.shape[0] + 1, np.int64)
            np.cumsum(counts, out=first[1:])
            if first[-1] != self.db.entries:
                raise LmdbFormatError(
                    self.path, f"the tree holds {first[-1]} records but the meta page says "
                    f"{self.db.entries}", page=self.db.root)
            self._leaf_first = first
        return self._leaf_first

    def record_table(self, start: int = 0, stop: int | None = None) -> RecordTable:
        """The record table for records ``start .. stop - 1`` (key order).

        The full table is built once and cached; a range of a database whose full table is
        not built yet reads only the leaf pages covering the range.
        """
        self._check_open()
        n = len(self)
        stop = n if stop is None else min(stop, n)
        start = max(0, min(start, stop))
        if self._table is not None:
            return self._table.subset(start, stop)
        if start == 0 and stop == n:
            first = self.leaf_directory()
            self._table = self._build_table(self.db, self.leaves(), int(first[-1]))
            return self._table
        first = self.leaf_directory()
        j0 = int(np.searchsorted(first, start, side="right")) - 1
        j1 = int(np.searchsorted(first, stop, side="left"))
        leaves = self.leaves()[j0:j1]
        t = self._build_table(self.db, leaves, int(first[j1] - first[j0]))
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
        from lmdbio.lmdb.cursor import Cursor

        self._check_open()
        return Cursor(self)

    def cursor_from_bytes(self, data: bytes):
        """Rebuild a cursor serialized by :meth:`Cursor.to_bytes` (same snapshot only)."""
        from lmdbio.lmdb.cursor import Cursor

        self._check_open()
        return Cursor.from_bytes(self, data)

    def gather(
        self,
        indices: np.ndarray | range | slice,
        out: np.ndarray | None = None,
        prefix: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Copy the values of records ``indices`` back to back into one buffer.

        Returns ``(buffer, offsets)`` where value ``t`` is ``buffer[offsets[t]:offsets[t+1]]``.
        ``prefix`` copies only the first ``prefix`` bytes of each value (later overflow pages
        are not touched). ``out`` may be a preallocated ``uint8`` array (e.g. a shared-memory
        slot); it must be large enough.
        """
        from lmdbio.lmdb import kernels as k

        t = self.record_table()
        idx = self._indices(indices)
        limit = -1 if prefix is None else int(prefix)
        code, page = k.check_overflow_headers(self.buf, self.fmt, t.val_off, t.ovf_pages, idx,
                                              self.accounting.touched, False)
        if code:
            self._raise(code, page)
        need = int(k.gather_lengths(t.val_len, idx, limit))
        if out is None:
            out = np.empty(need, np.uint8)
        elif out.shape[0] < need:
            raise LmdbioError(f"gather: output buffer holds {out.shape[0]} bytes, "
                              f"{need} needed for {idx.shape[0]} records")
        offsets = np.empty(idx.shape[0] + 1, np.int64)
        k.gather(self.buf, self.fmt, t.val_off, t.val_len, idx, out, offsets,
                 self.accounting.touched, self.accounting.enabled, limit)
        return out, offsets

    def _indices(self, indices: np.ndarray | range | slice) -> np.ndarray:
        n = len(self)
        if isinstance(indices, slice):
            indices = range(*indices.indices(n))
        if isinstance(indices, range):
            idx = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
        else:
            idx = np.ascontiguousarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"record index out of range 0..{n - 1}")
        return idx

    # ----------------------------------------------------------------- record references
    def walk_collect(self, cursor, n: int, wrap: bool = False) -> tuple[RecordRefs, int, bool]:
        """Advance ``cursor`` over ``n`` records (compiled), collecting where their values are.

        Reads branch and leaf pages only. Returns ``(refs, wraps, at_end)``: ``wraps`` counts
        how often the walk wrapped around to the first record (``wrap=True``), ``at_end`` is
        set when it stopped at the end of the tree instead.
        """
        from lmdbio.lmdb import kernels as k

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
        from lmdbio.lmdb import kernels as k

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
            self._raise(code, page)
        if self.node_cache is not None:
            self.node_cache.load_touched(self.accounting.touched)
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
        from lmdbio.lmdb import kernels as k

        idx = self._indices(indices)
        refs = RecordRefs.empty(idx.shape[0])
        code, page = k.locate(self.buf, self.fmt, self.leaves(), self.leaf_directory(),
                              self.meta.last_pg, idx, refs.val_off, refs.val_len, refs.leaf_pg,
                              refs.ovf_pages, refs.key_off, refs.key_len,
                              self.accounting.touched, self.accounting.enabled)
        if code:
            self._raise(code, page)
        if self.node_cache is not None:
            self.node_cache.load_touched(self.accounting.touched)
        return refs

    def gather_refs(self, refs: RecordRefs, out: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Copy the values ``refs`` point at back to back into one buffer (see :meth:`gather`).
        """
        from lmdbio.lmdb import kernels as k

        every = np.arange(len(refs), dtype=np.int64)
        buf = self.buf
        if self.node_cache is not None and len(refs):
            self.node_cache.load_pages(refs.value_pages(self.psize))
            buf = self.node_cache.buf
        code, page = k.check_overflow_headers(buf, self.fmt, refs.val_off, refs.ovf_pages,
                                              every, self.accounting.touched, False)
        if code:
            self._raise(code, page)
        need = refs.nbytes
        if out is None:
            out = np.empty(need, np.uint8)
        elif out.shape[0] < need:
            raise LmdbioError(f"gather: output buffer holds {out.shape[0]} bytes, "
                              f"{need} needed for {len(refs)} records")
        offsets = np.empty(len(refs) + 1, np.int64)
        k.gather_ranges(buf, refs.val_off, refs.val_len, out, offsets, self.psize,
                        self.accounting.touched, self.accounting.enabled)
        return out, offsets

    def mark_pages(self, pages: np.ndarray) -> None:
        """With accounting on, mark ``pages`` (page numbers inside this snapshot, as the
        validating kernels give them) touched: pages read earlier, outside the accounting,
        that an iteration uses as if it had read them itself."""
        if self.accounting.enabled and pages.size:
            self.accounting.touched[pages] = 1

    def mark_values(self, refs: RecordRefs) -> None:
        """With accounting on, mark every page of ``refs``' values touched without reading
        them: a reader that hands out their spans counts the pages its node's workers read
        from the mapping (the node's I/O is the same as if the reader had copied them)."""
        from lmdbio.lmdb import kernels as k

        if self.accounting.enabled:
            k.mark_values(self.accounting.touched, refs.val_off, refs.val_len, self.psize)

    def check_value_spans(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Check the overflow page header of every value span handed to this rank (what
        :meth:`gather_batch` checks before copying), spans already known to lie inside the
        mapping: a corrupt file raises :class:`~lmdbio.errors.LmdbFormatError` naming the
        page, before any value is decoded. The consumer checks, not the reader that hands
        the spans out: the header shares its cache line and page with the value's first
        bytes, which the consumer reads next, while the reader would read every value's
        page for this check alone (measured in docs/reading.md, tenth session)."""
        from lmdbio.lmdb import kernels as k

        code, page = k.check_value_spans(self.buf, self.fmt, starts, lengths)
        if code:
            self._raise(code, page)

    def copy_spans_by_batch(self, starts: np.ndarray, lengths: np.ndarray, batch: int,
                            out: np.ndarray, *, check: bool) -> int:
        """Copy the value spans ``(starts, lengths)`` of the mapping (known to lie inside
        it) ``batch`` at a time into ``out``, each batch from ``out[0]`` on, as a consumer
        takes the batches of a slot one after another; with ``check`` each overflow value's
        page header is checked (as :meth:`check_value_spans`) in the same pass, just
        before its bytes are copied. Returns the bytes copied over all batches, or -1 when
        ``out`` is too small for one batch (nothing is checked or copied past the span that
        did not fit; call again with a larger ``out``). Raises
        :class:`~lmdbio.errors.LmdbFormatError` naming the page of a bad header."""
        from lmdbio.lmdb import kernels as k

        if batch < 1:
            raise LmdbioError(f"copy_spans_by_batch: batch must be at least 1, got {batch}")
        code, value = k.gather_each_batch(self.buf, self.fmt, starts, lengths, int(batch),
                                          out, bool(check))
        if code < 0:
            return -1
        if code:
            self._raise(code, value)
        return int(value)

    def gather_batch(self, refs: RecordRefs, payload: np.ndarray, offsets: np.ndarray,
                     keys: np.ndarray, key_offsets: np.ndarray) -> tuple[int, int]:
        """Values and keys of ``refs`` in one compiled pass: the values back to back into
        ``payload`` and the keys into ``keys``, with their offset tables (``len(refs) + 1``
        entries each) - what :meth:`gather_refs` and :meth:`keys_of` give, written straight
        into caller buffers (a ring slot). Returns ``(payload_bytes, key_bytes)``.

        Not for node O_DIRECT caches (use :meth:`gather_refs`, which loads the pages first).
        """
        from lmdbio.lmdb import kernels as k

        if self.node_cache is not None:
            raise LmdbioError(f"{self.path}: gather_batch reads the mapping; with a node "
                              "O_DIRECT cache use gather_refs")
        n = len(refs)
        if offsets.shape[0] < n + 1 or key_offsets.shape[0] < n + 1:
            raise LmdbioError(f"gather: offset tables hold {offsets.shape[0]} and "
                              f"{key_offsets.shape[0]} entries, {n + 1} needed")
        acc = self.accounting
        code, page, nbytes, kbytes = k.gather_batch(
            self.buf, self.fmt, refs.val_off, refs.val_len, refs.ovf_pages, refs.key_off,
            refs.key_len, payload, offsets, keys, key_offsets, acc.touched, acc.enabled)
        if code == k.E_COUNT and page < 0:
            what, have, need = ("values", payload.shape[0], nbytes) if page == -1 else \
                ("keys", keys.shape[0], kbytes)
            raise LmdbioError(f"gather: the output buffer for the {what} holds {have} bytes, "
                              f"{need} needed for {n} records")
        if code:
            self._raise(code, page)
        return int(nbytes), int(kbytes)

    def keys_of(self, refs: RecordRefs) -> tuple[np.ndarray, np.ndarray]:
        """The keys of ``refs`` packed as ``(offsets, bytes)`` (the slot format)."""
        from lmdbio.lmdb import kernels as k

        out = np.empty(int(refs.key_len.sum()), np.uint8)
        offsets = np.empty(len(refs) + 1, np.int64)
        k.gather_ranges(self.buf, refs.key_off, refs.key_len, out, offsets, self.psize,
                        self.accounting.touched, False)
        return offsets, out

    # ----------------------------------------------------------------- reporting
    def subdatabases(self) -> list[bytes]:
        """Names of the named sub-databases in this file's main database."""
        return self._list_subdbs(self.meta.main_db)

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

    def __repr__(self) -> str:
        name = "" if self.subdb_name is None else f", subdb={self.subdb_name!r}"
        return f"<lmdbio.Database {str(self.path)!r}{name} entries={len(self)}>"

    # convenience for cursors
    def _key_sort(self, key: bytes):
        """Sort key implementing the database's comparator for ``key``."""
        if self.db.flags & 0x08:  # INTEGERKEY: native unsigned integers
            return int.from_bytes(key, "little")
        if self.db.flags & 0x02:  # REVERSEKEY: compare from the last byte
            return key[::-1]
        return key

