"""Shared fixtures: where the reference test data lives, and generated databases."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TESTDATA = REPO.parent / "shared" / "testdata"


@pytest.fixture(scope="session")
def shared_testdata() -> Path:
    """``../shared/testdata`` (files written by Caffe and others); skip where it is absent."""
    if not SHARED_TESTDATA.is_dir():
        pytest.skip("../shared/testdata is not present")
    return SHARED_TESTDATA


@pytest.fixture(scope="module")
def ibp_rows_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database of 40 IBP-able tensor rows (tests.engine_helpers.ibp_rows), once a module."""
    from bench.lmdbgen import write_db
    from tests.engine_helpers import ibp_rows

    path = tmp_path_factory.mktemp("ibp-rows")
    write_db(path, ibp_rows(40))
    return path


@pytest.fixture(scope="module")
def one_rank_topology() -> Iterator[Any]:
    """The topology of this process alone (MPI as a singleton: no mpiexec), once a module,
    for tests of one rank's reader and worker."""
    from lmdbio.topology import Topology

    with Topology.build() as topo:
        yield topo


def shared_lmdbs() -> list[Path]:
    """Every LMDB directory under ``../shared/testdata/lmdb`` (empty where absent)."""
    root = SHARED_TESTDATA / "lmdb"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "data.mdb").exists())


def _private_cache() -> None:
    """The suite's sidecar cache (``LMDBIO_CACHE``: indexed runs' leaf directories) is a
    folder of this run's own, removed at exit: tests neither read a user's
    ``~/.cache/lmdbio`` nor leave files in it. The MPI jobs tests start inherit it."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="lmdbio-test-cache-")
    os.environ["LMDBIO_CACHE"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


_private_cache()


def _record_kernel_compiles() -> None:
    """Record every numba compile of this test process when ``make kernel-signatures``
    asks (see tests/precompile_kernels.py)."""
    from tests import precompile_kernels

    folder = os.environ.get(precompile_kernels.RECORD_ENV)
    if folder:
        precompile_kernels.record_compiles(folder)


_record_kernel_compiles()

if os.environ.get("LMDBIO_TEST_FAKE_GPU") == "1":
    # the run a GPU host gives (workers.device: auto finds a device), minus the device:
    # see tests/fake_gpu.py
    from tests import fake_gpu

    sys.modules["cupy"] = fake_gpu.make_module()


def _real_gpu() -> str | None:
    """None when cupy finds a real device, else why not (for the ``gpu`` marker's skip)."""
    if os.environ.get("LMDBIO_TEST_FAKE_GPU") == "1":
        return "the cupy stand-in is installed (LMDBIO_TEST_FAKE_GPU=1)"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
        return "cupy finds no device"
    except Exception as exc:  # no cupy, no driver
        return f"no usable GPU ({type(exc).__name__}: {exc})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Test files that start mpiexec jobs run first; tests marked ``gpu`` run wherever cupy
    finds a device, and are skipped (saying why) elsewhere."""
    _mpi_files_first(items)
    _skip_gpu_tests_without_a_device(items)


def _mpi_files_first(items: list[pytest.Item]) -> None:
    """Put the files holding mpiexec tests first (each file's tests stay together and in
    order). Their jobs are long and mostly wait, so when ``make test`` hands files to
    pytest-xdist workers (``--dist loadfile``) the short unit tests fill the cores around
    them and the session does not end on one long job while the other cores idle."""
    has_jobs = {item.path for item in items if item.get_closest_marker("mpiexec")}
    items.sort(key=lambda item: item.path not in has_jobs)  # stable: order kept otherwise


def _skip_gpu_tests_without_a_device(items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    why = _real_gpu()
    if why is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {why}"))
