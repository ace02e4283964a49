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
import os
import sys

from lmdbio.commands import progress

#: the trainer command after ``--`` arrives in ``args.extra_args`` (see lmdbio.cli)
ACCEPTS_EXTRA_ARGS = True

USAGE = "lmdbio launch -n N [options] CONFIG [-- COMMAND [ARG ...]]"

DESCRIPTION = """\
Start the ranks of a job with mpiexec and wait for them. COMMAND, after --, is what every
rank runs, usually your trainer (python train.py CONFIG); without one every rank runs
lmdbio run CONFIG, a loading job without a model. Every rank finds CONFIG's absolute path
in LMDBIO_CONFIG, and with --simulate-nodes K the number of simulated nodes in
LMDBIO_SIMULATE_NODES (lmdbio run and loaders.open read it). The Open MPI settings a
one-host job needs are applied; the MPI flavour (Open MPI or MPICH) is the one mpi4py
uses unless --mpi says otherwise.

On a terminal, the ranks are told to draw their progress bar (LMDBIO_PROGRESS=1).

Exit status: the job's; non-zero when a host is lost (Open MPI's own mpiexec exits 0
then); 130 on Ctrl-C."""

EXAMPLES = """\
lmdbio launch -n 4 --simulate-nodes 2 configs/quickstart.yaml -- \\
    python -m loaders.caffe_trainer configs/quickstart.yaml
lmdbio launch -n 8 --hosts node1:4,node2:4 JOB.yaml -- python train.py
lmdbio launch -n 4 JOB.yaml             # every rank runs: lmdbio run JOB.yaml
lmdbio launch -n 4 --dry-run JOB.yaml -- python train.py  # print the line"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from launch.mpirun import add_arguments as add_launch_arguments

    add_launch_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from launch.mpirun import run

    command = list(getattr(args, "extra_args", None) or [])
    if command and command[0] == "--":  # argparse keeps it in some argument orders
        command = command[1:]
    if progress.ENV not in os.environ and progress.wanted(stream=sys.stderr):
        # the ranks' stderr is a pipe; what it carries ends on this terminal
        os.environ[progress.ENV] = "1"
    return run(args, command)
