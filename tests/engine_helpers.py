"""Small helpers over lmdbio's own engine shared by test modules (not an oracle: the
oracles are py-lmdb and the hand-written readers in the tests)."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np

from lmdbio.lmdb import Database
from lmdbio.plan.strategies.base import ReaderContext
from lmdbio.plan.strategies.indexed import Indexed


def open_indexed(path: Path) -> tuple[Database, Indexed]:
    """``path`` opened by the engine and the indexed strategy of a one-reader job, set up
    (its leaf directory built or taken from the sidecar cache)."""
    db = Database(path)
    strategy = Indexed(ReaderContext(db, None, 0, 1))
    strategy.setup()
    return db, strategy


def read_all_records(db: Database) -> list[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of ``db`` in key order, located and gathered by the engine."""
    refs = db.locate(np.arange(len(db)))
    buf, offs = db.gather_refs(refs)
    koffs, kdata = db.keys_of(refs)
    return [(bytes(kdata[koffs[i]:koffs[i + 1]]), bytes(buf[offs[i]:offs[i + 1]]))
            for i in range(len(db))]


def commit_more(path: Path, items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A writer's commit to ``path`` (py-lmdb): records 380-449 of the usual random set,
    new keys and overwrites alike, so the file has another snapshot; returns ``items``
    updated as the file now holds them, in key order."""
    from lmdbgen import random_items

    extra = random_items(450, (50, 3000), seed=9)[380:]
    env = lmdb.open(str(path), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for k, v in extra:
            txn.put(k, v)
    env.close()
    return sorted(dict(items + extra).items())


def ibp_rows(n: int) -> list[tuple[bytes, bytes]]:
    """``n`` tensor records of mostly-invariant float32 rows (what IBP compresses), keys
    ``%06d``, labels ``i % 5``."""
    from lmdbio.codecs.tensor import encode_tensor

    rng = np.random.default_rng(2)
    base = rng.normal(size=24).astype(np.float32)
    items = []
    for i in range(n):
        row = base.copy()
        row[rng.integers(0, 24, 3)] = rng.normal(size=3)
        items.append((b"%06d" % i, encode_tensor(row, i % 5)))
    return items
