"""lmdbio.io.direct: a node's O_DIRECT page cache, in one process (MPI.COMM_SELF)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from lmdbio.errors import LmdbioError
from lmdbio.io.direct import NodeCache, page_runs
from lmdbio.mpiutil import start_mpi


def test_page_runs() -> None:
    starts, lengths = page_runs(np.array([2, 3, 4, 9, 11, 12], np.int64))
    assert starts.tolist() == [2, 9, 11] and lengths.tolist() == [3, 1, 2]
    assert page_runs(np.empty(0, np.int64))[0].size == 0


@pytest.fixture
def file_of_pages(tmp_path: Path) -> tuple[Path, bytes]:
    data = np.random.default_rng(4).integers(0, 256, 40 * 4096, np.uint8).tobytes()
    path = tmp_path / "data.mdb"
    path.write_bytes(data)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("the test directory's file system refuses O_DIRECT")
    return path, data


def test_pages_arrive_once_in_runs(file_of_pages: tuple[Path, bytes]) -> None:
    MPI = start_mpi()  # a singleton that leaves no segment in /dev/shm

    path, data = file_of_pages
    cache = NodeCache(MPI.COMM_SELF, path, 4096)
    try:
        assert cache.present_count() == 0
        assert cache.load_pages(np.array([3, 4, 5, 8], np.int64)) == 4
        assert cache.reads == 2  # one pread per run of consecutive pages
        assert cache.load_pages(np.array([4, 5, 6], np.int64)) == 1  # only the new page
        assert cache.load_runs(np.array([10], np.int64), np.array([5], np.int64)) == 5
        touched = np.zeros(40, np.uint8)
        touched[[20, 21]] = 1
        assert cache.load_touched(touched) == 2 and cache.reads == 6  # a page per read
        for p in (3, 4, 5, 6, 8, 10, 14, 20, 21):
            assert bytes(cache.buf[p * 4096:(p + 1) * 4096]) == data[p * 4096:(p + 1) * 4096]
        assert cache.present_count() == 12
        assert cache.stats()["bytes"] == 12 * 4096
        cache.clear()
        assert cache.present_count() == 0
    finally:
        cache.close()


def test_refuses_what_it_cannot_read(file_of_pages: tuple[Path, bytes], tmp_path: Path
                                     ) -> None:
    MPI = start_mpi()  # a singleton that leaves no segment in /dev/shm

    path, _ = file_of_pages
    with pytest.raises(LmdbioError, match="multiple of 4096"):
        NodeCache(MPI.COMM_SELF, path, 2048)
    with pytest.raises(LmdbioError, match="O_DIRECT"):
        NodeCache(MPI.COMM_SELF, tmp_path / "missing.mdb", 4096)
    if Path("/dev/shm").is_dir():  # tmpfs refuses O_DIRECT
        shm = Path("/dev/shm") / f"lmdbio-test-{os.getpid()}.mdb"
        shm.write_bytes(b"\0" * 8192)
        try:
            try:
                NodeCache(MPI.COMM_SELF, shm, 4096).close()  # some kernels accept it
            except LmdbioError as exc:
                assert "O_DIRECT" in str(exc) and str(shm) in str(exc)
        finally:
            shm.unlink()


def test_a_cache_that_cannot_fit_is_refused_by_name(tmp_path: Path) -> None:
    from lmdbio.io.direct import _shared_memory_shortfall

    assert _shared_memory_shortfall(1, "x.mdb", str(tmp_path)) is None
    why = _shared_memory_shortfall(1 << 62, "x.mdb", str(tmp_path))
    assert why is not None and "x.mdb" in why and "bytes free" in why
    assert _shared_memory_shortfall(1 << 62, "x.mdb", str(tmp_path / "absent")) is None
