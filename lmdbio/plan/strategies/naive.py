"""What users have today: every rank walks the database record by record to its share.

``naive-stride`` is BVLC Caffe / Caffe-MPI: every rank walks every record and keeps record
``i`` when ``i % ranks == rank``. ``naive-contig`` is DALI's Caffe reader: contiguous shards,
reached by walking one record at a time from the first record. Both run their access pattern
on the page engine (so page accounting is exact); :mod:`lmdbio.plan.pylmdb_baseline` runs the
same patterns through py-lmdb as the wall-clock baseline.
"""

from __future__ import annotations

import numpy as np

from lmdbio.lmdb import RecordRefs
from lmdbio.plan.epoch import EpochPlan
from lmdbio.plan.strategies.base import IterationStats, Timer, WalkingStrategy


class NaiveStride(WalkingStrategy):
    """Walk every record; keep every ``ranks``-th (BVLC Caffe, Caffe-MPI)."""

    name = "naive-stride"
    summary = ("every reader walks the whole database and keeps record i iff "
               "i % readers == rank (BVLC Caffe's scheme; the baseline)")
    scheme = "stride"
    shared = False

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats, iterations: int = 1) -> RecordRefs:
        if ids.size == 0:
            return RecordRefs.empty(0)
        n = len(self.db)
        with Timer(stats, "walk"):
            # the walk passes every record between the previous position and the last one
            # kept (a cursor Next() per record); the ones kept are every ranks-th. Each id's
            # place along the walk counts forward from the previous id, wrapping around the
            # database: padded iterations of a database smaller than a batch go round more
            # than once (the last id is not always the farthest)
            steps = np.diff(ids, prepend=self.position) % n
            keep = np.cumsum(steps)
            refs, _, _ = self.db.walk_collect(self.cursor, int(keep[-1]) + 1, wrap=True)
            self.position = int(ids[-1] + 1) % n
        return refs.take(keep)


class NaiveContig(WalkingStrategy):
    """Contiguous shards reached by walking from the first record (DALI)."""

    name = "naive-contig"
    summary = ("each reader walks from the first record to its contiguous shard "
               "(DALI's scheme; a baseline)")
    scheme = "shard"
    shared = False

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats, iterations: int = 1) -> RecordRefs:
        if ids.size == 0:
            return RecordRefs.empty(0)
        with Timer(stats, "walk"):
            # DALI's SeekByIndex: MDB_NEXT one record at a time to the shard's start, and
            # again on wrap-around (a shard pads by restarting at its own start)
            parts = []
            bounds = np.r_[0, np.flatnonzero(np.diff(ids) != 1) + 1, ids.size]
            for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                if int(ids[lo]) != self.position:  # a new run: seek by walking from the start
                    self.cursor.first()
                    self.position = self.walk_to(self.cursor, int(ids[lo]), 0)
                refs, _, _ = self.db.walk_collect(self.cursor, hi - lo, wrap=True)
                parts.append(refs)
                self.position = (int(ids[hi - 1]) + 1) % len(self.db)
        return RecordRefs.concat(parts)
