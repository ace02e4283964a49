"""``lmdbio launch -n N [--per-node P] [--hostfile F | --hosts H:S,...] [--simulate-nodes K]
[--mpi M] [--mpi-arg ARG ...] CONFIG -- COMMAND...``: build the ``mpiexec`` line for a job
and run it (or print it, ``--dry-run``).

Open MPI and MPICH/Hydra lines are supported; the flavour defaults to the MPI library the
installed mpi4py loads. A job on several hosts (``--hosts`` or ``--hostfile``) exits
non-zero when a host is lost (Open MPI's own ``mpiexec`` exits 0 then). The ranks get
``LMDBIO_CONFIG=CONFIG`` (absolute path) and, with ``--simulate-nodes``,
``LMDBIO_SIMULATE_NODES``. Without a command after ``--`` each rank
runs ``python -m lmdbio.cli run CONFIG``. Same as the ``lmdbio-mpirun`` script.
"""

from __future__ import annotations

import argparse

#: the trainer command after ``--`` arrives in ``args.extra_args`` (see lmdbio.cli)
ACCEPTS_EXTRA_ARGS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from launch.mpirun import add_arguments as add_launch_arguments

    add_launch_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from launch.mpirun import run

    command = list(getattr(args, "extra_args", None) or [])
    if command and command[0] == "--":  # argparse keeps it in some argument orders
        command = command[1:]
    return run(args, command)
