"""``agree`` / ``agreed`` with a failure on the ranks listed in argv[1] (comma-separated),
then an ``agree`` where all succeed, ``agree`` on ``COMM_NULL``, and the timeout helpers.

Emits, per rank, whether an AgreementError was raised, its failing ranks and message; a
barrier (with a timeout) follows, so a rank that skipped a collective shows up as an error.
"""

import sys

from _result import emit
from mpi4py import MPI

from lmdbio.mpiutil import AgreementError, agree, agreed, barrier_with_timeout

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
failing = {int(x) for x in sys.argv[1].split(",") if x}

out = {}
try:
    agree(comm, rank not in failing, f"disk of rank {rank} is full", "open the database")
    out["agree"] = None
except AgreementError as exc:
    out["agree"] = {"failures": {str(k): v for k, v in exc.failures.items()}, "msg": str(exc)}

try:
    with agreed(comm, "allocate the ring"):
        if rank in failing:
            raise MemoryError(f"no room on rank {rank}")
    out["agreed"] = None
except AgreementError as exc:
    out["agreed"] = {
        "failures": {str(k): v for k, v in exc.failures.items()},
        "cause": type(exc.__cause__).__name__ if exc.__cause__ else None,
    }

try:
    agree(comm, True, "", "everyone fine")
    out["agree_ok"] = None
except AgreementError as exc:
    out["agree_ok"] = str(exc)

try:
    agree(MPI.COMM_NULL, True)
    out["comm_null"] = None
except Exception as exc:
    out["comm_null"] = type(exc).__name__

barrier_with_timeout(comm, 20, "final barrier")
emit(out)

# wait_with_timeout: rank 0 waits for a message rank 1 sends only after rank 0 timed out.
if comm.Get_size() >= 2:
    from lmdbio.mpiutil import MPITimeoutError, wait_with_timeout

    timeouts = {}
    if rank == 0:
        req = comm.irecv(source=1, tag=7)
        try:
            wait_with_timeout(req, 0.3, "message from rank 1")
            timeouts["recv_timed_out"] = False
        except MPITimeoutError as exc:
            timeouts["recv_timed_out"] = exc.request is req
        comm.Barrier()
        timeouts["recv_later"] = wait_with_timeout(req, 20, "message from rank 1")
        # barrier_with_timeout: rank 1 joins only after it hears from rank 0
        try:
            barrier_with_timeout(comm, 0.3, "late barrier")
            timeouts["barrier_timed_out"] = False
        except MPITimeoutError as exc:
            timeouts["barrier_timed_out"] = True
            comm.send("go", dest=1, tag=8)
            wait_with_timeout(exc.request, 20, "late barrier, second wait")
            timeouts["barrier_completed"] = True
    else:
        comm.Barrier()
        if rank == 1:
            comm.send({"payload": 42}, dest=0, tag=7)
            comm.recv(source=0, tag=8)
        barrier_with_timeout(comm, 20, "late barrier")
    emit({"timeouts": timeouts})
