"""The py-lmdb baseline replays exactly the records the naive strategies deliver."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.lmdbgen import random_items, write_db
from lmdbio.errors import ConfigError
from lmdbio.lmdb import Database
from lmdbio.plan.epoch import plan_epoch
from lmdbio.plan.pylmdb_baseline import run_pattern
from lmdbio.plan.strategies import STRATEGIES


def _session(db: Database, name: str, rank: int, ranks: int, batch: int, last: str):
    cls = STRATEGIES[name]
    return SimpleNamespace(
        cls=cls, db=db, topo=SimpleNamespace(rank=rank),
        plan_for=lambda epoch: plan_epoch(len(db), ranks, batch, last, scheme=cls.scheme,
                                          epoch=epoch))


@pytest.mark.parametrize("name", ["naive-stride", "naive-contig"])
@pytest.mark.parametrize("last", ["pad", "partial"])
def test_replay_copies_the_planned_records(tmp_path: Path, name: str, last: str) -> None:
    items = write_db(tmp_path / "db", random_items(157, (10, 4000), seed=2), commit_every=40)
    with Database(tmp_path / "db") as db:
        for rank in range(3):
            s = _session(db, name, rank, 3, 7, last)
            iters = s.plan_for(0).iterations
            schedule = [(k // iters, k % iters) for k in range(iters * 2 + 3)]  # wraps twice
            got: list[bytes] = []
            seconds = run_pattern(db.path, s, schedule, collect=got)
            want = [items[i][1] for e, it in schedule
                    for i in s.plan_for(e).records(it, rank).tolist()]
            assert got == want and seconds > 0


def test_replay_refuses_other_strategies(tmp_path: Path) -> None:
    write_db(tmp_path / "db", random_items(10, 100))
    with Database(tmp_path / "db") as db, pytest.raises(ConfigError, match="replays naive"):
        run_pattern(db.path, _session(db, "indexed", 0, 1, 2, "pad"), [(0, 0)])
