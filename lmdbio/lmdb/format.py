"""LMDB's on-disk format: constants, the two page-header layouts and the meta page.

Everything here is pure Python and validates what it reads. Byte offsets are for 64-bit
little-endian builds (the only ones that write the files we read). ``docs/lmdb-format.md``
describes the format in prose.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = 0xBEEFC0DE
P_INVALID = 0xFFFFFFFFFFFFFFFF

# page flags
P_BRANCH = 0x01
P_LEAF = 0x02
P_OVERFLOW = 0x04
P_META = 0x08
P_LEAF2 = 0x20
P_SUBP = 0x40

# node flags
F_BIGDATA = 0x01
F_SUBDATA = 0x02
F_DUPDATA = 0x04

# database flags (md_flags)
DB_FLAGS = {
    0x02: "REVERSEKEY",
    0x04: "DUPSORT",
    0x08: "INTEGERKEY",
    0x10: "DUPFIXED",
    0x20: "INTEGERDUP",
    0x40: "REVERSEDUP",
}
MDB_DUPSORT = 0x04

MAX_DEPTH = 32  # LMDB's CURSOR_STACK

_DB = struct.Struct("<IHHQQQQQ")  # MDB_db: pad, flags, depth, branch, leaf, overflow, entries, root


@dataclass(frozen=True)
class PageLayout:
    """Where the fields of a page header live in one data format version."""

    version: int
    header_size: int  # PAGEHDRSZ
    flags_off: int
    lower_off: int
    upper_off: int
    ptr_base: int  # added to mp_ptrs[i] to get an offset from the page start
    lower_base: int  # subtracted from mp_lower before >> 1 gives the node count
    pad_key: bool  # node data starts after the key padded to even length
    bigdata_size: int  # bytes an F_BIGDATA node's data holds

    def as_array(self, psize: int) -> np.ndarray:
        """The layout as the int64 parameter vector the compiled kernels take."""
        return np.array(
            [psize, self.header_size, self.flags_off, self.lower_off, self.upper_off,
             self.ptr_base, self.lower_base, int(self.pad_key), self.bigdata_size],
            dtype=np.int64,
        )


V1 = PageLayout(1, 16, 10, 12, 14, 0, 16, False, 8)
V3 = PageLayout(3, 24, 18, 20, 22, 24, 0, True, 24)
LAYOUTS = {1: V1, 3: V3}


@dataclass(frozen=True)
class DbRecord:
    """An ``MDB_db`` structure: the root and statistics of one B+tree."""

    pad: int
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int

    @classmethod
    def parse(cls, data: bytes | memoryview, offset: int = 0) -> DbRecord:
        return cls(*_DB.unpack_from(data, offset))

    @property
    def empty(self) -> bool:
        return self.root == P_INVALID

    def flag_names(self) -> list[str]:
        return [name for bit, name in DB_FLAGS.items() if self.flags & bit]


@dataclass(frozen=True)
class Meta:
    """One of the two meta pages."""

    page: int
    version: int
    address: int
    mapsize: int
    free_db: DbRecord
    main_db: DbRecord
    last_pg: int
    txnid: int

    @property
    def psize(self) -> int:
        return self.free_db.pad


def _meta_offset(version: int) -> int:
    return LAYOUTS[version].header_size


def sniff_version(head: bytes | memoryview) -> int | None:
    """The data format version of meta page 0 held in ``head``, or None if not LMDB."""
    for version in (1, 3):
        off = _meta_offset(version)
        if len(head) >= off + 8:
            magic, ver = struct.unpack_from("<II", head, off)
            if magic == MAGIC and ver == version:
                return version
    return None


def parse_meta(buf: bytes | memoryview, page: int, psize: int, version: int) -> Meta | str:
    """Parse meta page ``page`` (0 or 1); return a :class:`Meta` or the reason it is bad."""
    layout = LAYOUTS[version]
    base = page * psize
    if len(buf) < base + layout.header_size + 160:
        return "file too short to hold this meta page"
    pgno = struct.unpack_from("<Q", buf, base)[0]
    flags = struct.unpack_from("<H", buf, base + layout.flags_off)[0]
    if pgno != page:
        return f"page header says page {pgno}"
    if not flags & P_META:
        return f"not flagged as a meta page (flags 0x{flags:x})"
    off = base + layout.header_size
    magic, ver, address, mapsize = struct.unpack_from("<IIQQ", buf, off)
    if magic != MAGIC:
        return f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})"
    if ver != version:
        return f"data format version {ver} (expected {version})"
    free_db = DbRecord.parse(buf, off + 24)
    main_db = DbRecord.parse(buf, off + 72)
    last_pg, txnid = struct.unpack_from("<QQ", buf, off + 120)
    return Meta(page, ver, address, mapsize, free_db, main_db, last_pg, txnid)
