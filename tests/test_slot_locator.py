"""A reader's slot locating without MPI or a ring (:class:`lmdbio.slot_locator.SlotLocator`,
what :class:`~lmdbio.reader.ReadSession` and the scale tracer both run): every strategy's
records of every slot, worker after worker, are the ones the plan gives."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bench.lmdbgen import write_db
from lmdbio.io.gather import gather_refs
from lmdbio.lmdb import Database
from lmdbio.plan.epoch import plan_epoch
from lmdbio.plan.strategies import STRATEGIES, IterationStats, ReaderContext
from lmdbio.slot_locator import SlotLocator, slot_groups
from tests.fuzz_lmdb import random_items


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("slots")
    write_db(path, random_items(150, (10, 6000), seed=3))
    return path


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("per_slot", [1, 3])
@pytest.mark.parametrize("grouped", [True, False], ids=["slot-groups", "ungrouped"])
def test_each_slot_holds_the_plans_records_worker_after_worker(
        database: Path, name: str, per_slot: int, grouped: bool) -> None:
    """Slots of one or three iterations; plans laid out in slot groups (a walking
    strategy's slot is one run: one fetch) or not (it fetches iteration by iteration and
    reorders)."""
    cls = STRATEGIES[name]
    workers = 3 if cls.shared else 1  # a node's workers, or the rank itself
    per_slot = per_slot if cls.shared else 1
    with Database(database) as db:
        truth = [v for _, v in db.items()]
        strategy = cls(ReaderContext(db, None, 0, 1, advise=True))
        strategy.setup()
        plan = plan_epoch(len(db), workers, 4, "pad", scheme=cls.scheme,
                          group=per_slot if cls.walks_slots and grouped else 1,
                          node_consumers=(workers,))
        locator = SlotLocator(strategy, rank=0, first_consumer=0, node_consumers=workers,
                              batches_per_slot=per_slot)
        locator.epoch_stop = plan.iterations
        strategy.begin_epoch(plan)
        for first, count in slot_groups(0, plan.iterations, per_slot):
            ids, pad, sizes = locator.share(plan, first, count)
            refs = locator.fetch_group(plan, first, count, ids, IterationStats(first))
            locator.read_ahead(plan, first + count)
            # worker after worker, each its batches back to back
            want = [plan.records(i, w) for w in range(workers)
                    for i in range(first, first + count)]
            np.testing.assert_array_equal(ids, np.concatenate(want))
            assert sizes.tolist() == [sum(plan.records(i, w).size
                                          for i in range(first, first + count))
                                      for w in range(workers)]
            assert pad.shape == ids.shape
            buf, offsets = gather_refs(db, refs)
            got = [bytes(buf[a:b]) for a, b in itertools.pairwise(offsets.tolist())]
            assert got == [truth[i] for i in ids.tolist()], (name, first)
        strategy.close()
