"""LMDBIO-LMM: one reader per node, sharing what it reads with the node's workers.

The reader still finds its records by walking: each iteration it walks from where it
stopped, past the records of the readers before it, to its node's range (branch and leaf
pages only), then collects its own. What LMM removes is the per-worker reading: workers
get their records from node shared memory (:mod:`lmdbio.shm`).
"""

from __future__ import annotations

import numpy as np

from lmdbio.lmdb import RecordRefs
from lmdbio.plan.epoch import EpochPlan
from lmdbio.plan.strategies.base import IterationStats, Timer, WalkingStrategy


class Lmm(WalkingStrategy):
    """One reader per node; each reader walks to its own range (LMDBIO-LMM)."""

    name = "lmm"
    summary = ("LMDBIO-LMM: one reader per node walks to its node's records and shares "
               "them through node shared memory")
    walks_slots = True

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats, iterations: int = 1) -> RecordRefs:
        if ids.size == 0:
            return RecordRefs.empty(0)
        with Timer(stats, "walk"):
            self.position = self.walk_to(self.cursor, int(ids[0]), self.position)
            refs, _, _ = self.db.walk_collect(self.cursor, ids.size, wrap=True)
            self.position = (int(ids[-1]) + 1) % len(self.db)
        return refs
