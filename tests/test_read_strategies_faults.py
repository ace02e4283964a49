"""Read strategies when things go wrong: a crashing rank, a changed database under a saved
leaf directory. (Cursors between ranks and the symmetric-mapping fallback are checked in
test_read_strategies.py, on its launches.)"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import lmdb
import numpy as np
import pytest
from engine_helpers import commit_more, open_indexed, read_all_records
from mpi_harness import CLI_RUNS_SCRIPT, CLI_SCRIPT, run_mpi

from bench.lmdbgen import random_items, write_db
from lmdbio.lmdb import Database
from lmdbio.plan.strategies import sidecar_path

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """301 records of 100..5000 random bytes (inline and overflow values)."""
    path = tmp_path_factory.mktemp("readf") / "small"
    return path, write_db(path, random_items(301, (100, 5000), seed=21), commit_every=60)


def crc(k: bytes, v: bytes) -> int:
    return zlib.crc32(v, zlib.crc32(k))


def _run(path: Path, nranks: int, cases: list[dict], timeout: float = 90,
         check: bool = True):
    spec = json.dumps({"path": str(path), "cases": cases})
    return run_mpi(nranks, "read_epochs.py", [spec], timeout=timeout, check=check)


@pytest.mark.parametrize(("nranks", "nodes", "strategy", "bad"), [
    (4, 2, "dm-spec", 2),  # the reader of the second node, in the middle of the chain
    (2, 0, "indexed", 1),  # a dedicated worker while its reader fills the ring
])
@pytest.mark.mpiexec
def test_a_rank_that_raises_ends_the_job(small, nranks, nodes, strategy, bad) -> None:
    """The failing rank aborts the job: nobody waits for the cursor, the ring or a
    collective until a timeout (the sessions' timeouts are far beyond the harness's)."""
    path, _ = small
    case = {"strategy": strategy, "nodes": nodes, "batch": 4, "timeout": 600.0,
            "fail": {"rank": bad, "iteration": 3}}
    run = _run(path, nranks, [case], timeout=60, check=False)
    assert run.returncode != 0, run.output()
    assert f"injected failure on rank {bad}" in run.stderr, run.output()
    assert "aborting the MPI job" in run.stderr, run.output()
    assert not any(run.results.values()), "no rank may have finished the case"


@pytest.mark.parametrize(("strategy", "extra"), [
    ("indexed", []),
    ("dm-spec", ["--no-symmetric"]),  # (a symmetric mapping refuses files of two sizes)
    ("naive-stride", []),
])
@pytest.mark.mpiexec
def test_readers_of_different_snapshots_stop_the_job_naming_them(tmp_path, strategy,
                                                                 extra) -> None:
    """Ranks that opened the database on either side of a commit (here: each simulated
    node reads its own copy, the second one commit ahead) all stop in their setup
    exchange, before any record is read, naming each reading rank's snapshot."""
    items = random_items(200, 3072, seed=8)
    for node in (0, 1):
        path = tmp_path / f"db-node{node}"
        write_db(path, items, commit_every=50)
        if node == 1:
            with lmdb.open(str(path), map_size=1 << 26) as env, env.begin(write=True) as txn:
                txn.put(b"zzz-late", b"v" * 10)
    argv = ["bench", "read", str(tmp_path / "db-node{node}"), "--strategy", strategy,
            "--batch-size", "4", "--iters", "3", "--simulate-nodes", "2", "--timeout", "600",
            "--json", str(tmp_path / "out.json"), *extra]
    run = run_mpi(4, CLI_SCRIPT, argv, timeout=60, check=False)
    assert run.returncode != 0, run.output()
    assert "the reading ranks opened different snapshots" in run.stderr, run.output()
    assert "200 records" in run.stderr and "201 records" in run.stderr, run.output()
    assert not (tmp_path / "out.json").exists()


@pytest.mark.mpiexec
@pytest.mark.parametrize("strategy", ["indexed", "dm-spec"])
def test_a_main_database_of_named_databases_only_is_refused(tmp_path, strategy) -> None:
    """A file whose main database holds only named databases: reading the main one stops
    with the names (its records are LMDB's descriptors, not data); ``--subdb`` reads one."""
    path = tmp_path / "db"
    items = random_items(50, 200, seed=4)
    write_db(path, [], subdbs={b"train": items, b"val": random_items(7, 20, seed=5)})
    argv = ["bench", "read", str(path), "--strategy", strategy, "--batch-size", "5",
            "--iters", "5", "--simulate-nodes", "2"]
    # one job: the named database read, then the main one refused (which ends the job)
    runs = [[*argv, "--subdb", "train", "--json", str(tmp_path / "out.json")],
            [*argv, "--json", str(tmp_path / "refused.json")]]
    run = run_mpi(2, CLI_RUNS_SCRIPT, [json.dumps(runs)], timeout=90, check=False)
    assert run.returncode != 0, run.output()
    assert "holds only named databases (b'train', b'val')" in run.stderr, run.output()
    assert not (tmp_path / "refused.json").exists()
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["records_in_database"] == 50 and got["subdb"] == "train"
    ids = sorted(i for r in got["per_rank"] for i in r["records"])
    assert ids == list(range(50))


# --------------------------------------------------------------------------- sidecar




def test_indexed_sidecar_is_reused_and_rebuilt_when_the_database_changes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "db"
    items = write_db(path, random_items(400, (50, 3000), seed=4), commit_every=100)
    db, s = open_indexed(path)
    first_sidecar = sidecar_path(db)
    assert s.source == "built" and first_sidecar.exists()
    assert read_all_records(db) == items
    db.close()

    db, s = open_indexed(path)
    assert s.source == "sidecar" and sidecar_path(db) == first_sidecar
    assert read_all_records(db) == items
    db.close()
    # kept for the forged sidecar below: the rebuild removes the stale snapshot's folder
    with np.load(first_sidecar) as z:
        old_leaves, old_first = z["leaves"], z["first"]

    # a writer adds and overwrites records: another snapshot, so another directory
    items = commit_more(path, items)
    db, s = open_indexed(path)
    assert s.source == "built" and sidecar_path(db) != first_sidecar
    assert not first_sidecar.exists()  # the stale snapshot's sidecar is gone
    assert len(db) == len(items) and read_all_records(db) == items
    changed = sidecar_path(db)
    db.close()

    # a damaged sidecar, and one under the right name with another database's directory
    for damage in ("garbage", "wrong"):
        if damage == "garbage":
            changed.write_bytes(b"not an npz file")
        else:
            leaves = old_leaves
            first = np.round(old_first * (len(items) / old_first[-1])).astype(np.int64)
            np.savez(changed.with_suffix(".tmp.npz"), leaves=leaves, first=first)
            changed.with_suffix(".tmp.npz").replace(changed)
        caplog.clear()
        db, s = open_indexed(path)
        assert s.source == "built", damage
        assert read_all_records(db) == items
        db.close()
    assert "does not match the database" in caplog.text


def test_a_page_named_as_a_leaf_that_is_not_one_stops_the_count(small) -> None:
    """The leaf directory's count takes the leaves its branch pages name without reading
    them first: a page that is not a leaf (here the root branch page, as a corrupt parent
    would name it) is refused by number before its header is taken for a count."""
    from lmdbio.errors import LmdbFormatError
    from lmdbio.plan.strategies.indexed import count_records_collectively

    path, _ = small
    with Database(path) as db:
        leaves = db.tree_levels()[0][-1]
        first = count_records_collectively(db, leaves, None, 0, 1)
        assert first[-1] == len(db)
        bad = leaves.copy()
        bad[len(bad) // 2] = db.db.root
        with pytest.raises(LmdbFormatError) as refused:
            count_records_collectively(db, bad, None, 0, 1)
        assert refused.value.page == db.db.root
