"""Generators of LMDB databases for tests and benchmarks, written with py-lmdb.

Every generator returns the expected ``[(key, value), ...]`` in key order so tests can
compare lmdbio's reading with what was written as well as with py-lmdb's own reading.
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import numpy as np

NODEMAX_4K = 2038  # largest inline node (8-byte header + key + value) on a 4 KiB page


def write_db(path: str | os.PathLike, items, *, version: int = 1, commit_every: int = 1000,
             map_size: int = 1 << 28, subdbs: dict | None = None, flags: dict | None = None):
    """Write ``items`` (iterable of (key, value), ``commit_every`` a transaction) into a new
    environment at ``path``; a value of ``None`` deletes the key. Returns the main
    database's records, sorted."""
    kw = {"lib_version": 1} if version == 3 else {}
    env = lmdb.open(str(path), map_size=map_size, max_dbs=8 if subdbs else 0, **kw)
    items = list(items)
    final: dict[bytes, bytes] = {}
    for i in range(0, max(len(items), 1), commit_every):
        with env.begin(write=True) as txn:
            for k, v in items[i:i + commit_every]:
                if v is None:
                    txn.delete(k)
                    final.pop(k, None)
                else:
                    txn.put(k, v)
                    final[k] = v
    for name, sub_items in (subdbs or {}).items():
        db = env.open_db(name, **(flags or {}).get(name, {}))
        with env.begin(write=True, db=db) as txn:
            for k, v in sub_items:
                txn.put(k, v)
    env.close()
    return sorted(final.items())


def read_pylmdb(path: str | os.PathLike, subdb: bytes | None = None) -> list[tuple[bytes, bytes]]:
    """Every (key, value) as py-lmdb (the C library) reads it."""
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=8)
    try:
        db = env.open_db(subdb, create=False) if subdb else None
        with env.begin(db=db) as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def random_items(n: int, value_size, seed: int = 0, key_fmt: str = "%08d") -> list:
    """``n`` records with keys ``key_fmt % i`` and random values of ``value_size`` bytes
    (an int, or a (lo, hi) range)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        size = value_size if isinstance(value_size, int) else int(rng.integers(*value_size))
        out.append(((key_fmt % i).encode(), rng.integers(0, 256, size, dtype=np.uint8).tobytes()))
    return out


def uneven_key_items(n: int, value_size: int = 3072, seed: int = 0, *,
                     random_values: bool = True) -> list:
    """``n`` records under keys of 9 to 120 bytes, ``%08d_`` and a filler of random length
    (a Caffe index and a file name of any length), so that leaves hold uneven record
    counts; values of ``value_size`` random bytes (or zeros)."""
    rng = np.random.default_rng(seed)
    return [((b"%08d_" % i) + b"x" * int(rng.integers(0, 112)),
             rng.integers(0, 256, value_size, dtype=np.uint8).tobytes() if random_values
             else bytes(value_size)) for i in range(n)]


def tiny_datum_items(n: int, seed: int) -> list[tuple[bytes, bytes]]:
    """``n`` Caffe Datums of random 1x4x4 uint8 images, labels 0..2, keys ``%08d``: the
    smallest data set a command-line test runs a job on."""
    from lmdbio.codecs.datum import datum_from_array, encode_datum

    rng = np.random.default_rng(seed)
    return [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (1, 4, 4), dtype=np.uint8), i % 3))) for i in range(n)]


def churn_db(path: str | os.PathLike, commits: int = 2000, seed: int = 1, version: int = 1):
    """Thousands of small commits with inserts, overwrites and deletes (free-list reuse);
    returns the final contents in key order."""
    rng = np.random.default_rng(seed)
    kw = {"lib_version": 1} if version == 3 else {}
    env = lmdb.open(str(path), map_size=1 << 28, **kw)
    truth: dict[bytes, bytes] = {}
    for c in range(commits):
        with env.begin(write=True) as txn:
            for _ in range(int(rng.integers(1, 6))):
                key = b"k%05d" % int(rng.integers(0, 3000))
                op = rng.random()
                if op < 0.25 and key in truth:
                    txn.delete(key)
                    del truth[key]
                else:
                    size = int(rng.choice([10, 300, 2100, 5000]))
                    val = bytes([c % 251]) * size
                    txn.put(key, val)
                    truth[key] = val
    env.close()
    return sorted(truth.items())


def ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
