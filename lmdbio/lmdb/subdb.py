"""Named sub-databases: records of the main tree that hold another tree's database record.

LMDB stores a named database as a record of the main tree flagged ``F_SUBDATA``, its key the
name (LMDB 1.0 with a trailing NUL, 0.9 without) and its value the 48-byte ``MDB_db``
record of that tree. Reading the names reads the main tree's leaf pages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.lmdb.format import F_SUBDATA, DbRecord
from lmdbio.lmdb.records import RecordTable
from lmdbio.lmdb.snapshot import check_db_record

if TYPE_CHECKING:
    from lmdbio.lmdb.database import Database


def subdb_key(name: bytes, version: int) -> bytes:
    """The main tree's key of named database ``name`` in data format ``version``: LMDB 1.0
    (version 3) stores the name's trailing NUL, 0.9 does not."""
    return name + b"\0" if version == 3 else name


def _main_table(db: Database, main: DbRecord) -> RecordTable:
    """The record table of main tree ``main`` (its leaf pages read)."""
    if main.empty:
        return RecordTable.empty(0)
    return db.build_table(main)


def list_subdb_names(db: Database, main: DbRecord) -> list[bytes]:
    """Names of the named databases that main tree ``main`` of ``db``'s file holds."""
    table = _main_table(db, main)
    names = []
    for i in np.flatnonzero(table.node_flags & F_SUBDATA):
        k = bytes(db.mv[table.key_off[i]:table.key_off[i] + table.key_len[i]])
        names.append(k[:-1] if db.meta.version == 3 and k.endswith(b"\0") else k)
    return names


def find_subdb_record(db: Database, main: DbRecord, name: bytes) -> DbRecord | None:
    """The database record of named database ``name`` in main tree ``main`` (unchecked), or
    ``None``; raises :class:`~lmdbio.errors.LmdbFormatError` for a record of the wrong
    size."""
    table = _main_table(db, main)
    want = subdb_key(name, db.meta.version)
    for i in np.flatnonzero(table.node_flags & F_SUBDATA):
        k = bytes(db.mv[table.key_off[i]:table.key_off[i] + table.key_len[i]])
        if k == want:
            if table.val_len[i] != 48 or table.ovf_pages[i]:
                raise LmdbFormatError(db.path, f"named database {name!r}: record is "
                                      f"{table.val_len[i]} bytes (expected 48)",
                                      page=int(table.leaf_pg[i]))
            return DbRecord.parse(db.mv, int(table.val_off[i]))
    return None


def resolve_tree(db: Database, name: bytes | None) -> DbRecord:
    """The checked database record of the tree ``db`` reads: the main database
    (``name`` None) or the named database ``name``; raises
    :class:`~lmdbio.errors.LmdbioError` naming the named databases there are when there is
    no ``name``."""
    main = check_db_record(db.meta.main_db, db.meta, db.path, "main database")
    if name is None:
        return main
    found = find_subdb_record(db, main, name)
    if found is None:
        known = ", ".join(repr(n) for n in list_subdb_names(db, main)) or "none"
        raise LmdbioError(f"{db.path}: no named database {name!r} (named databases: "
                          f"{known})")
    return check_db_record(found, db.meta, db.path, f"named database {name!r}")
