"""Collective helpers of ``lmdbio.mpiutil``, tested inside every rank of one MPI job.

pytest-mpi runs this module: ``mpiexec -n 2 python -m pytest --with-mpi
tests/test_collectives.py`` (``make mpi``); every rank runs every test, so each test is a
collective and its assertions hold on each rank. Without ``--with-mpi`` (``make unit``, a
plain ``pytest``) the tests are skipped, saying so. A rank that skipped a collective shows
up as a timeout of the bounded barrier every test ends with, never as a hang.
"""

from __future__ import annotations

import pytest

from lmdbio.errors import LmdbioError
from lmdbio.mpiutil import (
    AgreementError,
    MPITimeoutError,
    agree,
    agreed,
    barrier_with_timeout,
    wait_with_timeout,
)

pytestmark = pytest.mark.mpi(min_size=2)

#: long enough for a loaded machine, short enough that a skipped collective fails the test
BOUND_S = 60.0


@pytest.fixture
def comm():
    """The world communicator; after the test, a bounded barrier (a rank that left a
    collective out fails here instead of hanging the next test)."""
    from mpi4py import MPI

    yield MPI.COMM_WORLD
    barrier_with_timeout(MPI.COMM_WORLD, BOUND_S, "end of test")


def test_agree_raises_on_every_rank_naming_the_failing_one(comm) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    with pytest.raises(AgreementError) as info:
        agree(comm, rank != 1, f"disk of rank {rank} is full", "open the database")
    assert info.value.failures == {1: "disk of rank 1 is full"}
    assert f"failed on 1 of {size} ranks ([1])" in str(info.value)
    assert "open the database" in str(info.value)


def test_agree_returns_everywhere_when_every_rank_is_fine(comm) -> None:
    agree(comm, True, "", "everyone fine")


def test_agree_names_every_failing_rank(comm) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    with pytest.raises(AgreementError) as info:
        agree(comm, False, f"rank {rank} says no")
    assert info.value.failures == {r: f"rank {r} says no" for r in range(size)}


def test_agreed_chains_the_local_exception_on_the_rank_that_had_it(comm) -> None:
    rank = comm.Get_rank()
    with pytest.raises(AgreementError) as info, agreed(comm, "allocate the ring"):
        if rank == 1:
            raise MemoryError(f"no room on rank {rank}")
    assert info.value.failures == {1: "MemoryError: no room on rank 1"}
    cause = info.value.__cause__
    assert (type(cause) is MemoryError) if rank == 1 else cause is None


def test_agree_refuses_comm_null(comm) -> None:
    from mpi4py import MPI

    with pytest.raises(LmdbioError, match="COMM_NULL"):
        agree(MPI.COMM_NULL, True)


def test_wait_with_timeout_gives_back_the_pending_request(comm) -> None:
    """Rank 0 waits for a message that rank 1 sends only after rank 0 timed out: the
    timeout carries the request, which completes later with the message. The order is
    forced by messages, not by sleeps, so a busy machine cannot change the outcome."""
    rank = comm.Get_rank()
    if rank == 0:
        req = comm.irecv(source=1, tag=7)
        with pytest.raises(MPITimeoutError) as info:
            wait_with_timeout(req, 0.05, "message from rank 1")
        assert info.value.request is req
        comm.send("timed out", dest=1, tag=6)
        assert wait_with_timeout(req, BOUND_S, "message from rank 1") == {"payload": 42}
    elif rank == 1:
        assert comm.recv(source=0, tag=6) == "timed out"
        comm.send({"payload": 42}, dest=0, tag=7)


def test_barrier_with_timeout_times_out_then_completes(comm) -> None:
    """Rank 1 joins the barrier only after rank 0 told it that its first wait timed out;
    rank 0's second wait on the same request then completes."""
    rank = comm.Get_rank()
    if rank == 0:
        with pytest.raises(MPITimeoutError) as info:
            barrier_with_timeout(comm, 0.05, "late barrier")
        comm.send("go", dest=1, tag=8)
        wait_with_timeout(info.value.request, BOUND_S, "late barrier, second wait")
    else:
        if rank == 1:
            assert comm.recv(source=0, tag=8) == "go"
        barrier_with_timeout(comm, BOUND_S, "late barrier")


def test_topology_on_the_real_node_has_one_reader_and_the_rest_workers(comm) -> None:
    """Every rank of this job is on this host: one node, its first rank the reader (the
    dedicated default), every other rank a worker; the communicators have those sizes."""
    from lmdbio.topology import Topology

    size = comm.Get_size()
    topo = Topology.build(comm, simulate_nodes=0)
    try:
        assert topo.node.Get_size() == size
        assert topo.node.allgather(comm.Get_rank()) == list(range(size))
        assert list(topo.node_readers) == [0]
        assert list(topo.node_workers) == list(range(1, size))
    finally:
        topo.close()


def test_auto_roles_on_a_small_node_make_every_rank_a_worker(comm) -> None:
    """``mode="auto"`` on a node of fewer than 8 ranks: colocated, the first rank reads and
    every rank trains (a dedicated reader would idle a large share of the node)."""
    from lmdbio.topology import Topology

    size = comm.Get_size()
    assert size < 8
    topo = Topology.build(comm, simulate_nodes=0, mode="auto")
    try:
        assert topo.mode == "colocated" and topo.requested_mode == "auto"
        assert list(topo.node_readers) == [0]
        assert list(topo.node_workers) == list(range(size))
        assert topo.workers.Get_size() == size
    finally:
        topo.close()
