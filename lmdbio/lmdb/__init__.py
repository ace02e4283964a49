"""lmdbio's read-only LMDB page engine.

``Database`` parses meta, branch, leaf and overflow pages of LMDB data format v1 (LMDB 0.9,
what Caffe writes) and v3 (LMDB 1.0) straight from a memory mapping; ``Cursor`` walks the
tree and serializes to bytes so that it can be handed to another rank; the compiled kernels
in :mod:`lmdbio.lmdb.kernels` build record tables and gather batches without per-record
Python (the gathers and the page accounting are in :mod:`lmdbio.io.gather` and
:mod:`lmdbio.io.accounting`).
"""

from lmdbio.lmdb.cursor import Cursor
from lmdbio.lmdb.database import Database
from lmdbio.lmdb.records import RecordRefs, RecordTable
from lmdbio.lmdb.snapshot import SnapshotId

__all__ = ["Cursor", "Database", "RecordRefs", "RecordTable", "SnapshotId"]
