"""The record table of ``indexed`` (:class:`lmdbio.lmdb.records.LocatedRecords`): records
located once are found there in later epochs, exactly as a locate finds them, and the pages
counted are those of a locate (the keys are still read from the leaves)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from bench.lmdbgen import random_items, write_db
from lmdbio.io.gather import gather_refs
from lmdbio.lmdb import Database
from lmdbio.lmdb.records import LOCATED_RECORDS_MAX_BYTES, LocatedRecords
from lmdbio.plan.epoch import plan_epoch
from lmdbio.plan.strategies import Indexed, IterationStats, ReaderContext

FIELDS = ("val_off", "val_len", "leaf_pg", "ovf_pages", "key_off", "key_len")


@pytest.fixture(scope="module", params=[(3072, "overflow"), ((40, 400), "inline")],
                ids=lambda p: p[1])
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Path:
    """700 records: values of one overflow page each, or inline ones of 40-400 bytes."""
    size, name = request.param
    path = tmp_path_factory.mktemp(f"located-{name}") / "db"
    write_db(path, random_items(700, size, seed=11), commit_every=128)
    return path


def assert_same_refs(got, want) -> None:
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)


def test_a_lookup_answers_only_when_every_record_was_located(database) -> None:
    with Database(database) as db:
        table = LocatedRecords(len(db))
        ids = np.array([5, 600, 17, 5], np.int64)
        assert table.lookup(ids) is None
        table.add(ids[:2], db.locate(ids[:2]))
        assert table.lookup(ids) is None, "records 17 was never located"
        assert table.lookup(np.empty(0, np.int64)) is None
        table.add(ids, db.locate(ids))
        assert_same_refs(table.lookup(ids), db.locate(ids))
        assert_same_refs(table.lookup(ids[::-1].copy()), db.locate(ids[::-1]))


def test_the_table_has_a_memory_bound() -> None:
    per_record = 6 * 8 + 1
    assert LocatedRecords.fits(LOCATED_RECORDS_MAX_BYTES // per_record)
    assert not LocatedRecords.fits(LOCATED_RECORDS_MAX_BYTES // per_record + 1)


def epoch_reads(db: Database, s: Indexed, epoch: int, read_ahead: bool
                ) -> tuple[list[bytes], np.ndarray]:
    """One shuffled epoch as a reader runs it: ``(values in delivery order, pages counted
    over the epoch)``."""
    plan = plan_epoch(len(db), 1, 64, shuffle="global", seed=7, epoch=epoch)
    s.begin_epoch(plan)
    pages = np.zeros(db.accounting.touched.shape[0], bool)
    values: list[bytes] = []
    for it in range(plan.iterations):
        ids = plan.records(it, 0)
        db.accounting.reset()
        refs = s.fetch(plan, it, ids, IterationStats(it))
        if read_ahead and it + 1 < plan.iterations:
            s.read_ahead(plan, it + 1, plan.records(it + 1, 0))
        buf, offsets = gather_refs(db, refs)
        values += [bytes(buf[a:b]) for a, b in itertools.pairwise(offsets.tolist())]
        pages |= db.accounting.touched.astype(bool)
    return values, np.flatnonzero(pages)


@pytest.mark.parametrize("read_ahead", [True, False], ids=["read-ahead", "fetch-only"])
def test_later_epochs_take_records_from_the_table_and_count_the_same_pages(
        database, read_ahead) -> None:
    """Epoch 0 locates every record; epoch 1 finds them in the table: no locate, the same
    values as py-lmdb's order gives, and the same pages counted (each record's leaf for its
    key, its value's pages)."""
    with Database(database) as db:
        s = Indexed(ReaderContext(db, None, 0, 1, advise=True))
        s.setup()
        db.accounting.enable()
        truth = [v for _, v in db.items()]
        values0, pages0 = epoch_reads(db, s, 0, read_ahead)
        located = []
        real_locate = db.locate
        db.locate = lambda ids: (located.append(len(ids)), real_locate(ids))[1]
        values1, pages1 = epoch_reads(db, s, 1, read_ahead)
        assert located == [], "a record located in epoch 0 was located again"
        for e, values in ((0, values0), (1, values1)):
            plan = plan_epoch(len(db), 1, 64, shuffle="global", seed=7, epoch=e)
            order = np.concatenate([plan.records(i, 0) for i in range(plan.iterations)])
            assert values == [truth[i] for i in order], f"epoch {e}"
        refs = real_locate(np.arange(len(db)))
        everything = np.union1d(np.unique(refs.leaf_pg), refs.value_pages(db.psize))
        np.testing.assert_array_equal(pages0, everything)
        np.testing.assert_array_equal(pages1, everything)
