"""Rank ``argv[1]`` raises inside ``abort_on_error``; the others wait in a barrier forever.

Without the abort the job would hang until the harness kills it. Every rank registers an
``on_shutdown`` callback that writes a marker file, to show callbacks run before the abort.
"""

import os
import sys

from mpi4py import MPI

from lmdbio.mpiutil import abort_on_error, on_shutdown

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
bad = int(sys.argv[1])
marker_dir = sys.argv[2]


@on_shutdown
def _marker(reason: str) -> None:
    with open(os.path.join(marker_dir, f"shutdown-{rank}"), "w") as f:
        f.write(reason)


@abort_on_error(comm)
def main() -> None:
    if rank == bad:
        raise RuntimeError(f"boom on rank {rank}")
    comm.Barrier()  # never completes: rank `bad` does not get here


main()
