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
from lmdbio.lmdb import Database, RecordRefs
from lmdbio.plan.epoch import plan_epoch, slot_groups
from lmdbio.plan.strategies import STRATEGIES, Indexed, IterationStats, ReaderContext
from lmdbio.slot_locator import SlotLocator
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


class _Recording:
    """A strategy stand-in with the flags of a registered one (``shared``, ``shuffles``)
    that locates any records exactly (through :class:`~lmdbio.plan.strategies.Indexed`'s
    leaf directory) and records which ids the locator asks it to fetch and to read ahead:
    what a reader of a node other than the first asks for, without the readers' MPI."""

    def __init__(self, cls: type, exact: Indexed) -> None:
        self.name, self.shared, self.shuffles = cls.name, cls.shared, cls.shuffles
        self.advising = True
        self.exact, self.db = exact, exact.db
        self.fetched: list[tuple[int, np.ndarray]] = []
        self.ahead: list[tuple[int, np.ndarray]] = []

    def fetch(self, plan, iteration: int, ids: np.ndarray, stats: IterationStats,
              iterations: int = 1) -> RecordRefs:
        self.fetched.append((iteration, ids.copy()))
        return self.exact.locate(ids)

    def read_ahead(self, plan, iteration: int, ids: np.ndarray) -> None:
        self.ahead.append((iteration, ids.copy()))


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("per_slot", [1, 3])
@pytest.mark.parametrize("grouped", [True, False], ids=["slot-groups", "ungrouped"])
def test_a_second_nodes_reader_locates_and_reads_ahead_its_own_records(
        database: Path, name: str, per_slot: int, grouped: bool) -> None:
    """Two nodes. A node-level strategy's reader of node 1 (world rank 4, a dedicated
    reader after node 0's four ranks) delivers node 1's workers, consumers 3 and 4; with
    every rank reading for itself, rank 3 delivers its own records. Each slot holds
    exactly those records, and after each slot but the epoch's last the strategy is told
    to read ahead exactly the ids it is then asked to fetch first for the next slot."""
    cls = STRATEGIES[name]
    if cls.shared:  # node 0: reader 0, consumers 0-2 (ranks 1-3); node 1: reader 4, 3-4
        node_consumers, rank, first_consumer, workers = (3, 2), 4, 3, 2
    else:  # four ranks, two per node, each its own consumer (as ReadSession sets it up)
        node_consumers, rank, first_consumer, workers = (2, 2), 3, 3, 1
        per_slot = 1
    mine = range(first_consumer, first_consumer + workers)
    with Database(database) as db:
        truth = [v for _, v in db.items()]
        exact = Indexed(ReaderContext(db, None, 0, 1, advise=False))
        exact.setup()
        strategy = _Recording(cls, exact)
        plan = plan_epoch(len(db), sum(node_consumers), 4, "pad", scheme=cls.scheme,
                          group=per_slot if cls.walks_slots and grouped else 1,
                          node_consumers=node_consumers)
        locator = SlotLocator(strategy, rank=rank, first_consumer=first_consumer,
                              node_consumers=workers, batches_per_slot=per_slot)
        locator.epoch_stop = plan.iterations
        slots = slot_groups(0, plan.iterations, per_slot)
        assert len(slots) >= 3
        fetched_first = []  # per slot, the (iteration, ids) of its first fetch
        for first, count in slots:
            asked = len(strategy.fetched)
            ids, _, sizes = locator.share(plan, first, count)
            refs = locator.fetch_group(plan, first, count, ids, IterationStats(first))
            fetched_first.append(strategy.fetched[asked])
            locator.read_ahead(plan, first + count)
            want = [plan.records(i, c) for c in mine for i in range(first, first + count)]
            np.testing.assert_array_equal(ids, np.concatenate(want))
            assert sizes.tolist() == [sum(plan.records(i, c).size
                                          for i in range(first, first + count))
                                      for c in mine]
            buf, offsets = gather_refs(db, refs)
            got = [bytes(buf[a:b]) for a, b in itertools.pairwise(offsets.tolist())]
            assert got == [truth[i] for i in ids.tolist()], (name, first)
        # each slot but the last read ahead once what the next one fetches first; the
        # last one stops at the epoch's end
        assert [it for it, _ in strategy.ahead] == [first for first, _ in slots[1:]]
        for (it, told), (want_it, want_ids) in zip(strategy.ahead, fetched_first[1:],
                                                   strict=True):
            assert it == want_it
            assert told.size
            np.testing.assert_array_equal(told, want_ids)
