"""lmdbio.io.symmap: symmetric mappings under mpiexec, the fallback, and single-process maps."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from mpi_harness import run_mpi

from lmdbio.errors import LmdbioError
from lmdbio.io import libc
from lmdbio.io.symmap import (
    SAFE_HIGH,
    SAFE_LOW,
    MappingInUseError,
    map_file,
)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A generated file of random bytes, not a multiple of the page size, made read-only."""
    path = tmp_path_factory.mktemp("symmap") / "generated.bin"
    data = np.random.default_rng(7).integers(0, 256, 3 * 1024 * 1024 + 123, np.uint8).tobytes()
    path.write_bytes(data)
    path.chmod(0o444)
    return path, data


# --------------------------------------------------------------------------- MPI


def _case(run, rank: int, case: int) -> dict:
    return next(o for o in run.results[rank] if o["case"] == case)


def _check_same_data(run, n: int, case: int, data: bytes) -> None:
    digest = hashlib.sha256(data).hexdigest()
    for rank in range(n):
        r = _case(run, rank, case)
        assert r["sha256"] == digest and r["length"] == len(data), r
        assert r["samples_ok"] and r["close_refused_with_view"] and r["closed"], r


def _check_symmetric(run, n: int, case: int, data: bytes, attempts: int | None) -> None:
    _check_same_data(run, n, case, data)
    addresses = {_case(run, r, case)["address"] for r in range(n)}
    assert len(addresses) == 1
    (address,) = addresses
    assert address >= SAFE_LOW and address + len(data) <= SAFE_HIGH
    assert address % (2 << 20) == 0
    for rank in range(n):
        r = _case(run, rank, case)
        assert r["symmetric"] is True
        assert r["attempts"] >= 1 if attempts is None else r["attempts"] == attempts
        assert r["pointer_decodes"]  # rank 0's raw pointer means the same byte everywhere


@pytest.mark.mpiexec
def test_symmetric_mapping_one_rank(data_file) -> None:
    path, data = data_file
    run = run_mpi(1, "symmap_check.py", [json.dumps([{"path": str(path)}])], timeout=60)
    _check_symmetric(run, 1, 0, data, None)


@pytest.mark.mpiexec
def test_symmetric_mapping_two_ranks_and_bad_inputs(data_file, tmp_path: Path) -> None:
    path, data = data_file
    (tmp_path / "m0").symlink_to(path)  # rank 1 has no file
    (tmp_path / "d0").write_bytes(b"x" * 8192)
    (tmp_path / "d1").write_bytes(b"x" * 4096)
    cases = [
        {"path": str(path), "kwargs": {"seed": 2}},
        {"path": str(tmp_path / "m{rank}")},
        {"path": str(tmp_path / "d{rank}")},
        {"path": str(path), "kwargs": {"length": len(data) + 1}},
        {"path": str(path), "kwargs": {"seed": 5}},  # still in step after the errors
    ]
    run = run_mpi(2, "symmap_check.py", [json.dumps(cases)], timeout=60)
    _check_symmetric(run, 2, 0, data, None)
    _check_symmetric(run, 2, 4, data, None)
    for rank in range(2):
        err = _case(run, rank, 1)["error"]
        assert err.startswith("LmdbioError") and "rank 1:" in err and "cannot open" in err
        assert "different (file size, length)" in _case(run, rank, 2)["error"]
        assert "cannot map" in _case(run, rank, 3)["error"]


@pytest.mark.mpiexec
def test_four_ranks_retry_and_fallback(data_file) -> None:
    path, data = data_file
    p = str(path)
    cases = [
        {"path": p, "kwargs": {"seed": 4, "fail_ranks": []}},
        # ranks 0 and 2 collide on the first two addresses: the third attempt succeeds
        {"path": p, "kwargs": {"seed": 3, "fail_ranks": [0, 2], "fail_attempts": 2}},
        # LMDBIO_SYMMAP_FAIL_RANK=2 (environment): every attempt fails -> fallback
        {"path": p, "kwargs": {"max_attempts": 3}},
    ]
    run = run_mpi(
        4,
        "symmap_check.py",
        [json.dumps(cases)],
        env={"LMDBIO_SYMMAP_FAIL_RANK": "2"},
        timeout=60,
    )
    _check_symmetric(run, 4, 0, data, 1)
    _check_symmetric(run, 4, 1, data, 3)
    _check_same_data(run, 4, 2, data)  # the fallback still reads the right bytes
    for rank in range(4):
        r = _case(run, rank, 2)
        assert r["symmetric"] is False and r["attempts"] == 3
    assert "falling back to kernel-chosen addresses" in run.stderr
    assert "rank 2:" in run.stderr and "File exists" in run.stderr  # names the failing rank


# --------------------------------------------------------------------------- single process


def test_map_file_reads_the_file(data_file) -> None:
    path, data = data_file
    assert not os.access(path, os.W_OK) or os.geteuid() == 0  # read-only (root ignores modes)
    with map_file(path) as m:
        assert m.symmetric is False and m.attempts == 0
        assert m.length == m.file_size == len(data)
        arr = m.array
        assert arr.dtype == np.uint8 and not arr.flags.writeable
        assert arr.tobytes() == data
        with pytest.raises(ValueError):
            arr[0] = 1  # a write would fault on PROT_READ memory: numpy refuses it first
        assert bytes(m.view(100, 50)) == data[100:150]
        assert m.pointer(10) == m.address + 10 and m.offset(m.address + 10) == 10
        with pytest.raises(LmdbioError):
            m.view(len(data) - 10, 11)
        with pytest.raises(LmdbioError):
            m.pointer(len(data))
        with pytest.raises(LmdbioError):
            m.offset(m.address - 1)
        del arr


def test_map_file_partial_length_and_directory(tmp_path: Path, data_file) -> None:
    _path, data = data_file
    env = tmp_path / "env"
    env.mkdir()
    (env / "data.mdb").write_bytes(data[:10000])
    with map_file(env, length=4096) as m:  # an LMDB directory maps its data.mdb
        assert m.path.endswith("data.mdb") and m.length == 4096 and m.file_size == 10000
        assert m.array.tobytes() == data[:4096]


def test_map_file_errors(tmp_path: Path, data_file) -> None:
    path, data = data_file
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(LmdbioError, match="empty"):
        map_file(empty)
    with pytest.raises(LmdbioError, match="only"):
        map_file(path, length=len(data) + 1)
    with pytest.raises(LmdbioError, match="positive"):
        map_file(path, length=0)
    with pytest.raises(LmdbioError, match="cannot open"):
        map_file(tmp_path / "missing")
    with pytest.raises(LmdbioError, match="not a regular file"):
        map_file(tmp_path)


def test_map_file_at_fixed_address_and_collision(data_file) -> None:
    path, data = data_file
    address = SAFE_LOW + 0x1234 * (2 << 20)
    with map_file(path, address=address) as m:
        assert m.address == address and m.array[:64].tobytes() == data[:64]
        with pytest.raises(LmdbioError, match=f"cannot map at {address:#x}"):
            map_file(path, address=address)  # taken: MAP_FIXED_NOREPLACE refuses


def test_close_is_safe_and_guards_live_views(data_file) -> None:
    path, _ = data_file
    m = map_file(path)
    view = m.view(0, 10)  # a derived view keeps the whole mapping alive
    with pytest.raises(MappingInUseError):
        m.close()
    assert not m.closed and int(view[0]) == path.read_bytes()[0]
    del view
    m.close()
    m.close()
    assert m.closed
    with pytest.raises(LmdbioError, match="closed"):
        _ = m.array


def test_mapping_is_unmapped_when_garbage(data_file) -> None:
    path, _ = data_file
    m = map_file(path)
    address, length = m.address, m.length
    del m
    # the range is free again: an anonymous fixed mapping there succeeds
    got = libc.mmap(
        address,
        length,
        libc.PROT_NONE,
        libc.MAP_PRIVATE | libc.MAP_ANONYMOUS | libc.MAP_FIXED_NOREPLACE,
        -1,
    )
    assert got == address
    libc.munmap(got, length)


def test_views_keep_mapping_alive(data_file) -> None:
    path, data = data_file
    view = map_file(path).view(5, 20)  # the Mapping object itself is dropped at once
    assert view.tobytes() == data[5:25]
