"""lmdbio: a distributed MPI data-loading service for training data stored in LMDB.

The page engine (``lmdbio.open``) reads unmodified LMDB files (format v1 and v3) through a
read-only memory mapping; the rest of the package builds the parallel reading strategies,
codecs and the node-local batch service on top of it.
"""

from __future__ import annotations

from lmdbio.errors import CodecError, ConfigError, LmdbFormatError, LmdbioError, RecordError
from lmdbio.kernel_cache import key_numba_cache

# before any kernel module is imported: numba's cache keyed by every kernel source (see
# lmdbio.kernel_cache: a kernel calling another module's kept a stale copy of it)
key_numba_cache()

__version__ = "0.1.0"

__all__ = [
    "CodecError",
    "ConfigError",
    "LmdbFormatError",
    "LmdbioError",
    "RecordError",
    "__version__",
    "list_databases",
    "open",
]


def open(path, subdb=None, **kwargs):
    """Open an LMDB database read-only through lmdbio's page engine.

    ``path`` is an LMDB directory or a ``data.mdb`` file; ``subdb`` names a sub-database
    (``str`` or ``bytes``). See :class:`lmdbio.lmdb.Database` for the keyword options.
    """
    from lmdbio.lmdb import Database

    return Database(path, subdb=subdb, **kwargs)


def list_databases(path) -> list[bytes]:
    """Names of the named sub-databases stored in the LMDB at ``path``."""
    from lmdbio.lmdb import Database

    with Database(path, pin_snapshot=False) as db:
        return db.subdatabases()
