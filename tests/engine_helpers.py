"""Small helpers over lmdbio's own engine shared by test modules (not an oracle: the
oracles are py-lmdb and the hand-written readers in the tests)."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np

from lmdbio.io.gather import gather_keys, gather_refs
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
    buf, offs = gather_refs(db, refs)
    koffs, kdata = gather_keys(db, refs)
    return [(bytes(kdata[koffs[i]:koffs[i + 1]]), bytes(buf[offs[i]:offs[i + 1]]))
            for i in range(len(db))]


def commit_more(path: Path, items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A writer's commit to ``path`` (py-lmdb): records 380-449 of the usual random set,
    new keys and overwrites alike, so the file has another snapshot; returns ``items``
    updated as the file now holds them, in key order."""
    from bench.lmdbgen import random_items

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


def check_cursor_hand_off(got: dict[int, list[dict]], crc: np.ndarray) -> None:
    """What tests/mpi/read_cursor.py's ranks 0 and 1 emitted (``got[rank]``, their outputs
    of the cursor case): for the symmetric and the private mapping, rank 1 read through the
    cursor bytes rank 0 sent exactly the records rank 0 positioned them at, and rank 0 the
    one rank 1 advanced to, every value's CRC-32 ``crc[record]``; the bytes carry addresses
    with the symmetric mapping only, and a private mapping elsewhere refuses them."""
    pos = np.cumsum([0, 1, 100, 77, 3])  # read_cursor.py's STEPS, summed
    for kind in ("symmetric", "private"):
        r0 = next(o for o in got[0] if o["kind"] == kind)
        r1 = next(o for o in got[1] if o["kind"] == kind)
        assert r0["symmetric"] == r1["symmetric"] == (kind == "symmetric")
        assert r0["has_address"] == r1["has_address"] == (kind == "symmetric")
        assert [s[0] for s in r0["seen"][:-1]] == pos.tolist()
        assert r1["seen"][:-1] == r0["seen"][:-1]
        assert r0["seen"][-1] == r1["seen"][-1] == [int(pos[-1]) + 5, int(crc[pos[-1] + 5])]
        assert all(c == crc[i] for i, c in r0["seen"])
    mismatch = next(o for o in got[1] if o["kind"] == "mismatch")
    assert "mapped at" in mismatch["refused"]  # address cursors need the same mapping


def check_symmetric_mapping(readers: list[dict], expect: str, what: object = None) -> None:
    """The readers' mappings of a run (tests/mpi/read_epochs.py's ``symmetric`` and
    ``symmetric_attempts``): ``"symmetric"``, all at one address; ``"fallback"``, every
    attempt failed on some reader and all fell back to private mappings; ``"off"``, not
    asked for (``ReadTuning.symmetric`` false), no attempt made."""
    from lmdbio.io.symmap import DEFAULT_MAX_ATTEMPTS

    assert readers, what
    if expect == "symmetric":
        assert all(r["symmetric"] and r["symmetric_attempts"] >= 1 for r in readers), what
    elif expect == "fallback":
        assert all(not r["symmetric"] for r in readers), what
        assert all(r["symmetric_attempts"] == DEFAULT_MAX_ATTEMPTS for r in readers), what
    elif expect == "off":
        assert all(not r["symmetric"] and r["symmetric_attempts"] == 0 for r in readers), what
    else:
        raise ValueError(f"expect: symmetric, fallback or off, got {expect!r}")
