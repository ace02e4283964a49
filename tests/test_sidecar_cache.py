"""Sidecars go to lmdbio's cache directory, never into the dataset's folder.

An indexed run keeps its leaf directory (``lmdbio-index-*.npz``) for later runs. Datasets
often live on read-only or shared file systems, so the file goes to ``$LMDBIO_CACHE``
(else ``$XDG_CACHE_HOME/lmdbio``, else ``~/.cache/lmdbio``), in a folder keyed by the
snapshot identity of the database. These tests list the dataset folder before and after
indexed runs (one process, and 4 ranks under ``mpiexec``: the tests run as root here, who
writes into a 0555 folder anyway, so the listing is what proves nothing was written),
check that the cache serves the second run and that a changed database gets a new key,
and that an unusable cache (its path is a file) costs a warning, never the run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import commit_more, open_indexed, read_all_records

from bench.lmdbgen import random_items, write_db
from lmdbio.lmdb import Database
from lmdbio.plan.strategies.indexed import (
    CACHE_ENV,
    cache_root,
    legacy_sidecar_path,
    sidecar_key,
    sidecar_path,
)

pytestmark = pytest.mark.timeout(240)


def _listing(folder: Path) -> list[tuple[str, int]]:
    """Every file under ``folder`` with its size (``lock.mdb`` is LMDB's own)."""
    return sorted((str(p.relative_to(folder)), p.stat().st_size)
                  for p in folder.rglob("*") if p.is_file())




def _sidecars(folder: Path) -> list[Path]:
    return sorted(folder.rglob("lmdbio-index-*.npz"))


@pytest.fixture
def dataset(tmp_path: Path) -> Iterator[tuple[Path, list]]:
    """A 400-record database in a folder made read-only (0555) once written."""
    path = tmp_path / "db"
    items = write_db(path, random_items(400, (50, 3000), seed=4), commit_every=100)
    path.chmod(0o555)
    yield path, items
    path.chmod(0o755)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


def test_an_indexed_run_writes_nothing_into_the_dataset_folder(dataset, cache) -> None:
    path, items = dataset
    before = _listing(path)
    db, s = open_indexed(path)
    assert s.source == "built" and read_all_records(db) == items
    db.close()
    assert _listing(path) == before
    saved = _sidecars(cache)
    assert len(saved) == 1 and saved[0].parent.parent == cache / "index"
    # the temporary file of the atomic write is gone
    assert [p.name for p in saved[0].parent.iterdir()] == [saved[0].name]


def test_the_second_run_takes_the_directory_from_the_cache(dataset, cache) -> None:
    path, items = dataset
    db, s = open_indexed(path)
    first = sidecar_path(db)
    db.close()
    stamp = first.stat().st_mtime_ns
    db, s = open_indexed(path)
    assert s.source == "sidecar" and sidecar_path(db) == first
    assert first.stat().st_mtime_ns == stamp  # read, not written again
    assert read_all_records(db) == items
    db.close()


def test_a_changed_database_gets_a_new_key(dataset, cache) -> None:
    path, items = dataset
    db, _ = open_indexed(path)
    old_key, old = sidecar_key(db), sidecar_path(db)
    db.close()
    path.chmod(0o755)
    items = commit_more(path, items)
    db, s = open_indexed(path)
    assert sidecar_key(db) != old_key
    assert s.source == "built" and read_all_records(db) == items
    new = sidecar_path(db)
    db.close()
    # the stale snapshot's folder is gone; the new one is all the cache holds
    assert not old.parent.exists() and _sidecars(cache) == [new]
    db, s = open_indexed(path)
    assert s.source == "sidecar"
    db.close()


def test_a_replaced_file_with_the_same_snapshot_numbers_gets_a_new_key(
        tmp_path: Path, cache) -> None:
    """Two databases written alike (same txnid, root, size) in two folders, or one
    rewritten in place: the file's identity and modification time keep their keys
    apart."""
    a = tmp_path / "a"
    b = tmp_path / "b"
    for p in (a, b):
        write_db(p, random_items(100, 200, seed=1), commit_every=50)
    with Database(a) as da, Database(b) as dbb:
        assert da.snapshot == dbb.snapshot
        assert sidecar_key(da) != sidecar_key(dbb)
        key = sidecar_key(da)
    shutil.copyfile(b / "data.mdb", a / "data.mdb")  # in place: same inode
    os.utime(a / "data.mdb", ns=(1, 1))
    with Database(a) as da:
        assert sidecar_key(da) != key


def test_a_cache_path_that_is_a_file_warns_and_builds_in_memory(
        dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    path, items = dataset
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache would be\n")
    monkeypatch.setenv(CACHE_ENV, str(blocker))
    before = _listing(path)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            db, s = open_indexed(path)
        assert s.source == "built" and read_all_records(db) == items
        db.close()
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "not writable" in warnings[0] and CACHE_ENV in warnings[0]
        assert "in memory" in warnings[0]
    assert _listing(path) == before
    assert blocker.read_text() == "a file where the cache would be\n"


def test_the_cache_directory_follows_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == tmp_path / "home" / ".cache" / "lmdbio"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec ignores it
    assert cache_root() == tmp_path / "home" / ".cache" / "lmdbio"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "lmdbio"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_an_older_versions_sidecar_beside_the_file_is_still_read(dataset, cache) -> None:
    """A valid ``lmdbio-index-*.npz`` that an earlier version left beside ``data.mdb`` is
    used (no rebuild); nothing new is written, there or in the cache."""
    path, items = dataset
    db, _ = open_indexed(path)
    built = sidecar_path(db)
    legacy = legacy_sidecar_path(db)
    db.close()
    path.chmod(0o755)
    shutil.copyfile(built, legacy)
    shutil.rmtree(cache)
    before = _listing(path)
    db, s = open_indexed(path)
    assert s.source == "sidecar" and read_all_records(db) == items
    db.close()
    assert _listing(path) == before and not cache.exists()


@pytest.mark.mpiexec
@pytest.mark.parametrize("usable", [True, False], ids=["cache", "cache-is-a-file"])
def test_mpi_ranks_write_one_sidecar_in_the_cache(dataset, tmp_path: Path,
                                                  usable: bool) -> None:
    """4 ranks as 2 nodes (``lmdbio bench read --strategy indexed``), twice: the dataset
    folder is unchanged, one sidecar is written in the cache (no temporary file left) and
    serves the second run; with the cache path a file, both runs succeed and only one
    rank warns."""
    from mpi_harness import CLI_RUNS_SCRIPT, run_mpi

    path, _ = dataset
    cache = tmp_path / "cache"
    if not usable:
        cache.write_text("")
    before = _listing(path)
    runs = [["bench", "read", str(path), "--strategy", "indexed", "--batch-size", "8",
             "--iters", "4", "--simulate-nodes", "2", "--json", str(tmp_path / f"run{i}.json")]
            for i in range(2)]  # one after the other, in one job
    run = run_mpi(4, CLI_RUNS_SCRIPT, [json.dumps(runs)], timeout=150,
                  env={CACHE_ENV: str(cache)})
    setup = [json.loads((tmp_path / f"run{i}.json").read_text())["totals"]["setup_pages"]
             for i in range(2)]
    text = run.stdout + run.stderr
    assert text.count("not writable") == (0 if usable else 2), text  # one rank, each run
    assert _listing(path) == before
    if usable:
        files = [p for p in cache.rglob("*") if p.is_file()]
        assert len(files) == 1 and files[0].name.startswith("lmdbio-index-"), files
        assert 0 < setup[1] <= 8 < setup[0]  # the second run: only the spot check
    else:
        assert setup[1] == setup[0] > 8  # built both times
