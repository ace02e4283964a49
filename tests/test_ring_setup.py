"""The making of a node's ring (:mod:`lmdbio.ring_setup`), on one rank (its own reader and
worker): a batch larger than the data set refused or warned about, batches per slot as the
run plan asks or chosen from the file, the ring codec fitted by the reader and rebuilt from
its bytes."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench.lmdbgen import write_db
from lmdbio.config import load_config
from lmdbio.errors import ConfigError
from lmdbio.lmdb import Database
from lmdbio.plan.strategies import strategy_class
from lmdbio.ring_setup import (
    RingSetup,
    batch_capacity,
    check_batch_fits,
    choose_batches_per_slot,
    largest_values,
)
from lmdbio.run_plan import RunPlan
from lmdbio.topology import Topology

RECORDS = 50


@pytest.fixture(scope="module")
def db_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ring-setup")
    write_db(path, [(b"%06d" % i, bytes([i % 251]) * (100 + i)) for i in range(RECORDS)])
    return path


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    with Topology.build() as topo:
        yield topo


def _plan(path: Path, topo: Topology, **changes: Any) -> RunPlan:
    cfg = load_config({"dataset": {"path": str(path), "layout": "tensor"},
                       "batch": {"size": 4}, "readers": {"strategy": "indexed"}})
    return dataclasses.replace(RunPlan.resolve(cfg, topo), **changes)


def test_a_batch_larger_than_the_data_set(db_path: Path, topo: Topology, caplog):
    """``drop``: refused at batch.size's key, naming the file and its records; ``pad`` and
    ``partial``: one batch per epoch, said by world rank 0 only; a batch that fits: no
    word."""
    scheme = strategy_class("indexed").scheme
    with Database(db_path) as db:
        check_batch_fits(db, _plan(db_path, topo, batch_size=RECORDS), 1, scheme, 0)
        with pytest.raises(ConfigError, match=f"batch.size.*{db_path}.*holds {RECORDS} records"):
            check_batch_fits(db, _plan(db_path, topo, batch_size=RECORDS + 1, last="drop"),
                             1, scheme, 0)
        with caplog.at_level(logging.WARNING, logger="lmdbio.ring_setup"):
            check_batch_fits(db, _plan(db_path, topo, batch_size=30, last="pad"), 2, scheme, 1)
            assert not caplog.records
            check_batch_fits(db, _plan(db_path, topo, batch_size=30, last="pad"), 2, scheme, 0)
            check_batch_fits(db, _plan(db_path, topo, batch_size=30, last="partial"), 2,
                             scheme, 0)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2
        assert "30 per consuming rank x 2 ranks" in said[0] and "padded with 10" in said[0]
        assert f"one batch of {RECORDS} records (batch.last: partial)" in said[1]


def _ring(db_path: Path, topo: Topology, *, by_reference: bool = False, **changes: Any
          ) -> int:
    """Batches per slot of the ring :class:`RingSetup` makes for ``changes`` to the plan."""
    plan = _plan(db_path, topo, **changes)
    with Database(db_path) as db:
        ring = RingSetup(topo, plan, db, node_consumers=1).create_ring(
            ring_codec=None, by_reference=by_reference)
        try:
            return int(ring.reader_info)
        finally:
            ring.close()


def test_batches_per_slot_as_asked_or_chosen_from_the_file(db_path: Path, topo: Topology):
    assert _ring(db_path, topo, batches_per_slot=3) == 3
    with Database(db_path) as db:
        top = largest_values(db, None, 0, 1, 4 * 16)
    copied = choose_batches_per_slot(4, batch_capacity(top, 4))
    assert _ring(db_path, topo, batches_per_slot=0) == copied
    with Database(db_path) as db:
        per_record = db.psize * (db.meta.last_pg + 1) // RECORDS
    spans = choose_batches_per_slot(4, 4 * per_record, spans=True)
    assert spans != copied  # the two rules differ here, so the test tells them apart
    assert _ring(db_path, topo, batches_per_slot=0, by_reference=True) == spans


class _Fitted:
    """A ring codec fitted to a database: its record count travels in its bytes."""

    def __init__(self, records: int) -> None:
        self.records = records

    def to_bytes(self) -> bytes:
        return b"%d" % self.records


class _Transport:
    title: ClassVar[str] = "test"

    @classmethod
    def fit(cls, db: Database, options: dict[str, Any]) -> _Fitted:
        return _Fitted(len(db))

    @classmethod
    def from_bytes(cls, blob: bytes) -> _Fitted:
        return _Fitted(int(blob))


def test_the_ring_codec_is_fitted_by_the_reader_and_rebuilt_from_its_bytes(
        db_path: Path, topo: Topology):
    with Database(db_path) as db:
        setup = RingSetup(topo, _plan(db_path, topo), db, node_consumers=1)
        codec: Any = setup.share_codec(_Transport())  # type: ignore[arg-type]
    assert isinstance(codec, _Fitted) and codec.records == RECORDS
