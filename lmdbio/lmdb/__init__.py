"""lmdbio's read-only LMDB page engine.

``Database`` parses meta, branch, leaf and overflow pages of LMDB data format v1 (LMDB 0.9,
what Caffe writes) and v3 (LMDB 1.0) straight from a memory mapping; ``Cursor`` walks the
tree and serializes to bytes so that it can be handed to another rank; the compiled kernels
in :mod:`lmdbio.lmdb.kernels` build record tables and gather batches without per-record
Python.
"""

from lmdbio.lmdb.accounting import PageAccounting
from lmdbio.lmdb.cursor import Cursor
from lmdbio.lmdb.database import Database, RecordRefs, RecordTable, SnapshotId

__all__ = ["Cursor", "Database", "PageAccounting", "RecordRefs", "RecordTable", "SnapshotId"]
