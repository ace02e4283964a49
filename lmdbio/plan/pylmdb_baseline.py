"""What users have today, timed: a rank's access pattern through py-lmdb (the C library).

``naive-stride`` is BVLC Caffe / Caffe-MPI's data layer: one cursor per rank that steps with
``MDB_NEXT`` over every record and copies the value of every ``ranks``-th one
(``Datum.ParseFromString(cursor->value())``), starting over with ``MDB_FIRST`` at the end.
``naive-contig`` is DALI's Caffe reader: the shard's first record is reached by
``MDB_FIRST`` followed by ``MDB_NEXT`` one record at a time (``SeekByIndex``), then the
records are read in order, and a shard that wraps around seeks again.

:func:`run_pattern` replays the exact records a :class:`~lmdbio.reader.ReadSession` of a
naive strategy delivered (its epoch plans and the benchmark's schedule) and returns the
seconds it took. Skipped records cost one ``MDB_NEXT`` each and their values are not
touched (``mdb_cursor_get`` only computes the address of an overflow value); kept values
are copied, as the frameworks do. The stepping loop runs in Python around py-lmdb's C
calls (about 0.1 us per record on top of LMDB's own cost): the baseline is what a Python
data loader built on py-lmdb pays, and within a small factor of the C++ frameworks.
"""

from __future__ import annotations

import os
import time
from collections import deque
from itertools import islice
from typing import Any

import numpy as np

from lmdbio.errors import ConfigError
from lmdbio.plan.strategies import STRATEGIES


def _open(path: str | os.PathLike):
    import lmdb

    p = os.fspath(path)
    subdir = os.path.isdir(p)
    return lmdb.open(p, subdir=subdir, readonly=True, lock=False, readahead=True,
                     max_readers=1024, max_dbs=0)


class _Walker:
    """A py-lmdb cursor that knows its record number, stepping as Caffe and DALI do."""

    def __init__(self, txn: Any, n: int) -> None:
        self.cur = txn.cursor()
        self.n = n
        self.pos = 0
        self.cur.first()

    def skip(self, k: int) -> None:
        """``k`` times ``MDB_NEXT`` (``MDB_FIRST`` when it runs off the end); no value read.

        ``iternext`` yields the current record before each step; ``islice`` consumes it
        at C speed and ``deque(maxlen=0)`` discards the (not copied) items.
        """
        while k > 0:
            room = self.n - self.pos  # records from here to the end, this one included
            if k < room:
                it = self.cur.iternext(keys=False, values=False)
                deque(islice(it, k), maxlen=0)
                self.cur.next()  # iternext stops on the k-th record; step past it
                self.pos += k
                return
            self.cur.first()  # wrap: Caffe's SeekToFirst at the end of the database
            k -= room
            self.pos = 0

    def read(self) -> bytes:
        """Copy the current value and step (``MDB_GET_CURRENT`` + ``MDB_NEXT``)."""
        v = self.cur.value()
        self.pos += 1
        if self.pos == self.n:
            self.cur.first()
            self.pos = 0
        else:
            self.cur.next()
        return v

    def seek_by_walking(self, index: int) -> None:
        """DALI's ``SeekByIndex``: ``MDB_FIRST`` then ``MDB_NEXT`` ``index`` times."""
        self.cur.first()
        self.pos = 0
        self.skip(index)


def run_pattern(path: str | os.PathLike, session: Any, schedule: list[tuple[int, int]],
                collect: list[bytes] | None = None) -> float:
    """Seconds py-lmdb takes to deliver this rank's records of ``schedule``.

    ``session`` is the rank's :class:`~lmdbio.reader.ReadSession` (its strategy must be a
    naive one: their patterns are what Caffe and DALI run); ``schedule`` the ``(epoch,
    iteration)`` pairs the benchmark ran. Returns the wall-clock seconds of the replay (the
    environment is opened before the clock starts). With ``collect``, the copied values
    are appended to it (for tests; the timing then includes the appends).
    """
    if session.cls.shared:
        naive = " and ".join(name for name, cls in STRATEGIES.items() if not cls.shared)
        raise ConfigError(f"the py-lmdb baseline replays {naive} (every rank reads for "
                          f"itself), not {session.cls.name!r}")
    if getattr(session.db, "subdb_name", None):
        raise ConfigError("the py-lmdb baseline reads the main database only, not the named "
                          f"database {session.db.subdb_name!r}")
    rank = session.topo.rank
    plans: dict[int, Any] = {}
    wanted = []
    for epoch, it in schedule:
        if epoch not in plans:
            plans[epoch] = session.plan_for(epoch)
        wanted.append(plans[epoch].records(it, rank))
    env = _open(session.db.path)
    try:
        with env.begin(buffers=False) as txn:
            n = int(txn.stat()["entries"])
            if n != len(session.db):
                raise ConfigError(f"{session.db.path}: py-lmdb sees {n} records, the "
                                  f"session {len(session.db)}")
            t0 = time.perf_counter()
            walker = _Walker(txn, n)
            kept = 0
            for ids in wanted:
                if session.cls.scheme == "stride":
                    kept += _stride(walker, ids, collect)
                else:
                    kept += _contig(walker, ids, collect)
            seconds = time.perf_counter() - t0
    finally:
        env.close()
    if kept != sum(int(w.size) for w in wanted):  # pragma: no cover - a bug in this module
        raise RuntimeError(f"py-lmdb baseline copied {kept} values for "
                           f"{sum(int(w.size) for w in wanted)} records")
    return seconds


def _stride(walker: _Walker, ids: np.ndarray, collect: list[bytes] | None) -> int:
    """Every record from the current position to the last one kept: skipped ones are
    stepped over, kept ones copied (Caffe's ``while (Skip()) Next();``)."""
    copied = 0
    for i in ids.tolist():
        walker.skip((i - walker.pos) % walker.n)
        value = walker.read()
        if collect is not None:
            collect.append(value)
        copied += 1
    return copied


def _contig(walker: _Walker, ids: np.ndarray, collect: list[bytes] | None) -> int:
    """Runs of consecutive records; a run that does not start where the cursor is (a new
    shard, or the wrap to the shard's start) is reached by walking from the first record."""
    copied = 0
    for i in ids.tolist():
        if i != walker.pos:
            walker.seek_by_walking(i)
        value = walker.read()
        if collect is not None:
            collect.append(value)
        copied += 1
    return copied
