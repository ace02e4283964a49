"""Opening one snapshot of an LMDB file: the file, its live meta page, checked tree records.

LMDB keeps two meta pages and writes them in turn; the live one (larger txnid) names the
snapshot a reader sees. Everything here validates what it reads from the mapping and raises
:class:`~lmdbio.errors.LmdbFormatError` naming the page, before any tree page is read.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.lmdb import format as fmt_mod
from lmdbio.lmdb.format import MDB_DUPSORT, DbRecord, Meta


@dataclass(frozen=True)
class SnapshotId:
    """What identifies one snapshot of one file: cursors from another snapshot are refused."""

    format_version: int
    txnid: int
    root: int
    file_size: int


def resolve_file(path: str | os.PathLike) -> Path:
    """The ``data.mdb`` file of an LMDB directory, or ``path`` itself when it names the file;
    raises :class:`~lmdbio.errors.LmdbioError` when there is none."""
    p = Path(path)
    if p.is_dir():
        p = p / "data.mdb"
    if not p.exists():
        raise LmdbioError(f"{p}: no such LMDB file (expected a directory holding data.mdb "
                          "or the data.mdb file itself)")
    return p


def past_the_end(meta_page: int, last_pg: int, file_size: int, psize: int) -> str:
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


def read_live_meta(mv: memoryview, path: Path, file_size: int) -> Meta:
    """The live meta page of the file mapped at ``mv`` (``file_size`` bytes): both meta pages
    parsed and validated, the one with the larger txnid chosen. Raises
    :class:`~lmdbio.errors.LmdbFormatError` for a file that is not LMDB, has no valid meta
    page, or whose meta pages disagree on the page size."""
    head = mv[:256]
    version = fmt_mod.sniff_version(head)
    if version is None:
        raise LmdbFormatError(path, "not an LMDB data file: meta page 0 has no "
                              "0xBEEFC0DE magic with data format version 1 or 3", page=0)
    layout = fmt_mod.LAYOUTS[version]
    if len(head) < layout.header_size + 160:
        raise LmdbFormatError(path, f"file is {file_size} bytes, too short to "
                              "hold a meta page", page=0)
    psize = struct.unpack_from("<I", head, layout.header_size + 24)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        raise LmdbFormatError(path, f"page size {psize} in meta page 0 is not a power "
                              "of two between 512 and 65536", page=0)
    metas: list[Meta] = []
    problems = []
    for page in (0, 1):
        m = fmt_mod.parse_meta(mv, page, psize, version)
        if isinstance(m, str):
            problems.append(f"meta page {page}: {m}")
        else:
            metas.append(m)
    if not metas:
        raise LmdbFormatError(path, "; ".join(problems), page=0)
    live = max(metas, key=lambda m: (m.txnid, -m.page))
    if live.psize != psize:
        raise LmdbFormatError(path, f"meta page {live.page} gives page size "
                              f"{live.psize}, meta page 0 gives {psize}", page=live.page)
    return live


def check_db_record(db: DbRecord, meta: Meta, path: Path, what: str) -> DbRecord:
    """``db`` (a tree's record in meta page ``meta``, named ``what`` in errors) once its
    root, depth and counts are checked to fit the snapshot; DUPSORT trees are refused
    (:class:`~lmdbio.errors.LmdbioError`), as lmdbio would iterate them differently from
    py-lmdb."""
    if db.empty:
        return db
    if db.root < 2 or db.root > meta.last_pg:
        raise LmdbFormatError(path, f"{what}: root page {db.root} outside the "
                              f"snapshot (pages 2..{meta.last_pg})", page=meta.page)
    if db.depth < 1 or db.depth > fmt_mod.MAX_DEPTH:
        raise LmdbFormatError(path, f"{what}: depth {db.depth} (expected 1..32)",
                              page=meta.page)
    most = (meta.last_pg + 1) * (meta.psize // 2)
    if db.entries > most or max(db.branch_pages, db.leaf_pages,
                                db.overflow_pages) > meta.last_pg:
        raise LmdbFormatError(path, f"{what}: {db.entries} entries / page counts "
                              f"({db.branch_pages}, {db.leaf_pages}, {db.overflow_pages}) "
                              f"cannot fit in {meta.last_pg + 1} pages",
                              page=meta.page)
    if db.flags & MDB_DUPSORT:
        raise LmdbioError(f"{path}: {what} is a DUPSORT database "
                          f"(flags {', '.join(db.flag_names())}); lmdbio refuses DUPSORT "
                          "databases rather than iterate them differently from py-lmdb")
    return db
