"""Cursors over a :class:`~lmdbio.lmdb.database.Database`: a stack of (page, slot) per level.

A cursor moves like LMDB's (first, last, next, prev, set_key, set_range) and can be
serialized with :meth:`Cursor.to_bytes` and rebuilt in another process with
:meth:`Database.cursor_from_bytes`. The bytes carry the snapshot identity (format, txnid,
root, file size), so a cursor from another snapshot is refused. When the database is mapped
at a symmetric address, the stack holds raw page addresses (as the reference LMDBIO-DM
sends them); otherwise page numbers.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.kernel_cache import kernel_module

if TYPE_CHECKING:
    from lmdbio.lmdb.database import Database

# magic, version, format, flags, depth, txnid, root, file size, mapping base address
_HEAD = struct.Struct("<4sBBBBQQQQ")
_LEVEL = struct.Struct("<QI")
_MAGIC = b"LMCR"
_F_INIT = 1
_F_EOF = 2
_F_ADDR = 4


class Cursor:
    """A position in a database's key order.

    ``stack`` is a list of ``[page, slot]`` from the root (level 0) to the leaf. A cursor
    that ran off either end has ``eof`` set; one never positioned has ``initialized`` False.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.stack: list[list[int]] = []
        self.initialized = False
        self.eof = False

    def copy(self) -> Cursor:
        """An independent cursor at the same position."""
        other = Cursor(self.db)
        other.stack = [list(level) for level in self.stack]
        other.initialized, other.eof = self.initialized, self.eof
        return other

    # ----------------------------------------------------------------- pages
    def _nkeys(self, pg: int) -> int:
        k = kernel_module("lmdbio.lmdb")
        code, n = k.check_page(self.db.buf, self.db.fmt, pg, self.db.meta.last_pg)
        if code:
            self.db.raise_format_error(code, pg)
        if self.db.accounting.enabled:
            self.db.accounting.touched[pg] = 1
        return int(n)

    def _child(self, pg: int, i: int) -> int:
        k = kernel_module("lmdbio.lmdb")
        child = k.branch_child(self.db.buf, self.db.fmt, pg * self.db.psize, i)
        if child < 0:
            self.db.raise_format_error(k.E_NODE, pg)
        return int(child)

    def _node_key(self, pg: int, i: int) -> bytes:
        k = kernel_module("lmdbio.lmdb")
        node = k.node_offset(self.db.buf, self.db.fmt, pg * self.db.psize, i)
        if node < 0:
            self.db.raise_format_error(k.E_NODE, pg)
        ksize = int(self.db.buf[node + 6]) | (int(self.db.buf[node + 7]) << 8)
        if node + 8 + ksize > (pg + 1) * self.db.psize:
            self.db.raise_format_error(k.E_NODE, pg)
        return bytes(self.db.mv[node + 8:node + 8 + ksize])

    def _leaf(self, pg: int, i: int) -> tuple[int, int, int, int]:
        code, ko, kl, vo, vl, _, _ = kernel_module("lmdbio.lmdb").leaf_node(
            self.db.buf, self.db.fmt, pg * self.db.psize, i, self.db.meta.last_pg, False)
        if code:
            self.db.raise_format_error(code, pg)
        return int(ko), int(kl), int(vo), int(vl)

    def _is_leaf_level(self, level: int) -> bool:
        return level == self.db.db.depth - 1

    def _descend(self, pg: int, level: int, leftmost: bool) -> bool:
        """Push pages from ``pg`` down to a leaf, always taking the first or last child."""
        while True:
            n = self._nkeys(pg)
            if n == 0:  # only an empty root leaf can have no keys
                self.stack.append([pg, 0])
                return False
            slot = 0 if leftmost else n - 1
            self.stack.append([pg, slot])
            if self._is_leaf_level(level):
                return True
            pg = self._child(pg, slot)
            level += 1

    # ----------------------------------------------------------------- moves
    def first(self) -> bool:
        """Move to the first record; False if the database is empty."""
        return self._edge(leftmost=True)

    def last(self) -> bool:
        """Move to the last record; False if the database is empty."""
        return self._edge(leftmost=False)

    def _edge(self, leftmost: bool) -> bool:
        self.stack = []
        self.initialized = True
        if self.db.db.empty:
            self.eof = True
            return False
        ok = self._descend(self.db.db.root, 0, leftmost)
        self.eof = not ok
        return ok

    def next(self) -> bool:
        """Move to the next record; False (and ``eof``) past the last one."""
        return self._step(+1)

    def prev(self) -> bool:
        """Move to the previous record; False (and ``eof``) before the first one."""
        return self._step(-1)

    def _step(self, direction: int) -> bool:
        if not self.initialized:
            return self.first() if direction > 0 else self.last()
        if self.eof:
            return False
        level = len(self.stack) - 1
        while level >= 0:
            pg, slot = self.stack[level]
            n = self._nkeys(pg)
            if 0 <= slot + direction < n:
                self.stack[level][1] = slot + direction
                del self.stack[level + 1:]
                if level == len(self.stack) - 1 and self._is_leaf_level(level):
                    return True
                child = self._child(pg, slot + direction)
                return self._descend(child, level + 1, leftmost=direction > 0)
            level -= 1
        self.eof = True
        return False

    def walk(self, n: int) -> int:
        """Advance ``n`` records, touching branch and leaf pages only (never values).

        Returns how many records it advanced (fewer than ``n`` at the end of the database).
        Leaf-at-a-time: the cost is per leaf page, not per record.
        """
        if n <= 0:
            return 0
        if not self.initialized:
            if not self.first():
                return 0
            n -= 1
            done = 1
        else:
            done = 0
        while n > 0 and not self.eof:
            leaf = self.stack[-1]
            room = self._nkeys(leaf[0]) - 1 - leaf[1]
            if room >= n:
                leaf[1] += n
                return done + n
            leaf[1] += room
            n -= room
            done += room
            if not self.next():
                return done
            n -= 1
            done += 1
        return done

    def set_range(self, key: bytes) -> bool:
        """Move to the first record whose key is >= ``key``; False if there is none."""
        self.stack = []
        self.initialized = True
        self.eof = False
        if self.db.db.empty:
            self.eof = True
            return False
        sort = self.db.sort_key
        target = sort(key)
        pg, level = self.db.db.root, 0
        while True:
            n = self._nkeys(pg)
            if self._is_leaf_level(level):
                lo, hi = 0, n
                while lo < hi:
                    mid = (lo + hi) // 2
                    ko, kl, _, _ = self._leaf(pg, mid)
                    if sort(bytes(self.db.mv[ko:ko + kl])) < target:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < n:
                    self.stack.append([pg, lo])
                    return True
                self.stack.append([pg, n - 1])
                return self.next()
            # branch: the last child whose separator is <= key (node 0 has no key)
            lo, hi = 1, n
            while lo < hi:
                mid = (lo + hi) // 2
                if sort(self._node_key(pg, mid)) <= target:
                    lo = mid + 1
                else:
                    hi = mid
            self.stack.append([pg, lo - 1])
            pg = self._child(pg, lo - 1)
            level += 1

    def set_key(self, key: bytes) -> bool:
        """Move to the record with exactly ``key``; False if there is none."""
        return self.set_range(key) and self.key() == bytes(key)

    def seek_index(self, index: int) -> bool:
        """Move to record number ``index`` in key order (uses the leaf directory)."""
        n = len(self.db)
        if not 0 <= index < n:
            self.stack, self.initialized, self.eof = [], True, True
            return False
        first = self.db.leaf_directory()
        j = int(np.searchsorted(first, index, side="right")) - 1
        pg = int(self.db.leaves()[j])
        ko, kl, _, _ = self._leaf(pg, index - int(first[j]))
        return self.set_key(bytes(self.db.mv[ko:ko + kl]))

    # ----------------------------------------------------------------- reading
    def _require(self) -> tuple[int, int]:
        if not self.initialized or self.eof or not self.stack:
            raise LmdbioError("cursor is not positioned on a record")
        return self.stack[-1][0], self.stack[-1][1]

    def key(self) -> bytes:
        pg, slot = self._require()
        ko, kl, _, _ = self._leaf(pg, slot)
        return bytes(self.db.mv[ko:ko + kl])

    def value(self) -> memoryview:
        """Zero-copy value at the cursor."""
        pg, slot = self._require()
        _, _, vo, vl = self._leaf(pg, slot)
        if self.db.accounting.enabled and vl:
            ps = self.db.psize
            self.db.accounting.touched[vo // ps:(vo + vl - 1) // ps + 1] = 1
        return self.db.mv[vo:vo + vl]

    def item(self) -> tuple[bytes, memoryview]:
        return self.key(), self.value()

    def index(self) -> int:
        """Record number of the cursor's position (uses the leaf directory)."""
        pg, slot = self._require()
        leaves = self.db.leaves()
        where = np.flatnonzero(leaves == pg)
        if where.size != 1:
            raise LmdbFormatError(self.db.path, "cursor's leaf is not in the tree", page=pg)
        return int(self.db.leaf_directory()[where[0]]) + slot

    # ----------------------------------------------------------------- (de)serialization
    def to_bytes(self) -> bytes:
        """Serialize: snapshot identity, flags and the (page, slot) stack.

        With a symmetric mapping (``db.address`` set) pages travel as raw addresses.
        """
        db = self.db
        flags = (_F_INIT if self.initialized else 0) | (_F_EOF if self.eof else 0)
        base = 0
        if db.address is not None:
            flags |= _F_ADDR
            base = int(db.address)
        snap = db.snapshot
        parts = [_HEAD.pack(_MAGIC, 1, snap.format_version, flags, len(self.stack),
                            snap.txnid, snap.root, snap.file_size, base)]
        for pg, slot in self.stack:
            ref = base + pg * db.psize if flags & _F_ADDR else pg
            parts.append(_LEVEL.pack(ref, slot))
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, db: Database, data: bytes) -> Cursor:
        """Rebuild a cursor; raises :class:`LmdbioError` if it belongs to another snapshot,
        another mapping address, or is malformed."""
        data = bytes(data)
        if len(data) < _HEAD.size:
            raise LmdbioError(f"serialized cursor is {len(data)} bytes, shorter than its header")
        magic, ver, fmt_v, flags, depth, txnid, root, size, base = _HEAD.unpack_from(data)
        if magic != _MAGIC or ver != 1:
            raise LmdbioError("not a serialized lmdbio cursor (bad magic or version)")
        snap = db.snapshot
        theirs = (fmt_v, txnid, root, size)
        ours = (snap.format_version, snap.txnid, snap.root, snap.file_size)
        if theirs != ours:
            raise LmdbioError(
                f"cursor belongs to another snapshot (format, txnid, root, file size) = "
                f"{theirs}; this database is {ours}")
        if len(data) != _HEAD.size + depth * _LEVEL.size:
            raise LmdbioError("serialized cursor has the wrong length for its depth")
        cur = cls(db)
        cur.initialized = bool(flags & _F_INIT)
        cur.eof = bool(flags & _F_EOF)
        if flags & _F_ADDR and (db.address is None or int(db.address) != base):
            raise LmdbioError(
                f"cursor carries page addresses of a mapping at 0x{base:x} but this database "
                f"is mapped at {'an unknown address' if db.address is None else hex(db.address)}"
                "; without a symmetric mapping cursors must travel as page numbers")
        stack = []
        for level in range(depth):
            ref, slot = _LEVEL.unpack_from(data, _HEAD.size + level * _LEVEL.size)
            if flags & _F_ADDR:
                off = ref - base
                if off % db.psize:
                    raise LmdbioError(f"cursor address 0x{ref:x} is not page aligned")
                ref = off // db.psize
            stack.append([int(ref), int(slot)])
        cur._validate(stack)
        cur.stack = stack
        return cur

    def _validate(self, stack: list[list[int]]) -> None:
        if not stack:
            return
        if len(stack) != self.db.db.depth or stack[0][0] != self.db.db.root:
            raise LmdbioError("serialized cursor's stack does not start at this tree's root "
                              "or has the wrong depth")
        for level, (pg, slot) in enumerate(stack):
            n = self._nkeys(pg)
            if not 0 <= slot < max(n, 1):
                raise LmdbioError(f"serialized cursor: slot {slot} on page {pg} holding {n}")
            if level + 1 < len(stack) and self._child(pg, slot) != stack[level + 1][0]:
                raise LmdbioError(f"serialized cursor: page {stack[level + 1][0]} is not the "
                                  f"child in slot {slot} of page {pg}")

    def __repr__(self) -> str:
        state = "eof" if self.eof else ("unset" if not self.initialized else "at")
        return f"<Cursor {state} stack={self.stack}>"
