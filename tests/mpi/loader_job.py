"""Run the loader under mpiexec and emit what every rank received (tests/test_service.py).

Usage: loader_job.py DB [--set key=value ...] [--resume-at K] [--epochs E] [--break-at K]
                     [--stop K]
Each rank emits, per epoch, the record ids, padding flags, keys (hex) and labels it got, in
order. With --break-at K the trainer leaves epoch 0 after K batches (then goes on with
``set_epoch(1)`` as usual). With --resume-at K the job runs epoch 0 once in full, takes the
state after K batches, then opens a second loader that loads that state and emits what it
delivers. --stop K stops the last epoch after K batches (``set_epoch(e, stop_iteration=K)``,
as a trainer at its last iteration does; with --resume-at, epoch 0, and the resumed run
takes the stop from the state). Reading ranks emit the slot groups they read (``reads``).
--step S sleeps S seconds per batch on workers (a trainer's step);
--cases JSON runs several of these argument lists in turn in one job (one start-up);
--no-epoch-look-ahead turns off decoding the next epoch's first slot ahead (for comparison);
--await-next-epoch makes it certain instead: at each epoch's last batch but the final
epoch's, a worker waits until its reader has published the next epoch's first slot (so the
test does not depend on a trainer's sleep being long enough on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import time
import zlib

import numpy as np
from mpi4py import MPI

import loaders
from lmdbio.mpiutil import abort_on_error
from tests.mpi._result import emit


def consume(loader, epochs, state_at=None, break_at=None, step=0.0, stop=None):
    out, state = [], None
    for epoch in range(epochs):
        loader.set_epoch(epoch, stop if epoch == epochs - 1 else None)
        for k, batch in enumerate(loader):
            if epoch == 0 and k == break_at:
                break
            out.append({"epoch": epoch, "iteration": batch.iteration,
                        "batch_epoch": batch.epoch,
                        "ids": batch.ids.tolist(), "padding": batch.padding.tolist(),
                        "keys": [key.hex() for key in batch.keys],
                        "labels": [int(x) for x in batch.label.tolist()],
                        # what each record decoded to, compared with py-lmdb's by the test
                        "pixels": [zlib.crc32(np.ascontiguousarray(row, np.float32))
                                   for row in batch.data]})
            if state_at is not None and k + 1 == state_at:
                state = loader.state_dict()
            if step:
                time.sleep(step)
    return out, state


def await_next_epoch(loader, epochs: int, seconds: float = 60.0) -> None:
    """Make ``loader``'s epoch look-ahead find the next epoch's first slot published: wait
    (sleeping, bounded by ``seconds``) until the ring holds a slot before it looks."""
    look_ahead = loader.prefetcher.look_ahead_epoch

    def waited():
        if loader.epoch + 1 < epochs:
            deadline = time.monotonic() + seconds
            while not loader.session.poll():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no slot of epoch {loader.epoch + 1} published in "
                                       f"{seconds:g} s")
                time.sleep(0.005)
        look_ahead()

    loader.prefetcher.look_ahead_epoch = waited


def record_reads(session):
    """The ``[epoch, first iteration, batches]`` of every slot group ``session`` reads."""
    reads = []
    session.on_read_group.append(
        lambda first, count: reads.append([session.epoch, int(first), int(count)]))
    return reads


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--resume-at", type=int, default=None)
    p.add_argument("--break-at", type=int, default=None)
    p.add_argument("--step", type=float, default=0.0)
    p.add_argument("--no-epoch-look-ahead", action="store_true")
    p.add_argument("--await-next-epoch", action="store_true")
    p.add_argument("--stop", type=int, default=None)
    p.add_argument("--cases", default=None, metavar="JSON",
                   help="a JSON list of argument lists (without DB): run each in turn in "
                   "this job, each emitting its result with its index as 'case'")
    return p


def run_case(args: argparse.Namespace) -> dict:
    """One loading job as the arguments say; what this rank emits for it."""
    # dedicated unless a case says otherwise: the cases were written for the roles that
    # were the default before readers.mode: auto (which makes nodes of < 8 ranks colocated)
    cfg = {"dataset": {"path": args.db, "layout": "caffe-datum"}, "metrics": {"every": 0},
           "readers": {"mode": "dedicated"}}
    world = MPI.COMM_WORLD
    with loaders.open(cfg, args.overrides) as loader:
        if args.no_epoch_look_ahead:
            loader.prefetcher.look_ahead_epoch = lambda: None
        elif args.await_next_epoch and loader.is_worker:
            await_next_epoch(loader, args.epochs)
        reads = record_reads(loader.session)
        got, state = consume(loader, args.epochs if args.resume_at is None else 1,
                             args.resume_at, args.break_at, args.step, args.stop)
        role = {"worker": loader.is_worker, "reader": loader.session.reads,
                "node": loader.topo.node_index, "iterations": len(loader),
                "epochs_decoded_ahead": loader.metrics.epochs_decoded_ahead,
                "hands_to_itself": loader.session.hands_to_itself, "reads": reads,
                "populated": loader.session.totals.populated}
    if args.resume_at is None:
        return {**role, "batches": got}
    # every rank resumes from the state a worker saved (dedicated readers have none)
    states = world.allgather(state)
    state = next(s for s in states if s is not None)
    with loaders.open(cfg, args.overrides) as loader:
        loader.load_state_dict(state)
        resumed, _ = consume(loader, 1)
    return {**role, "batches": got, "resumed": resumed, "state": state}


def main() -> None:
    p = parser()
    args = p.parse_args()
    with abort_on_error():
        if args.cases is None:
            emit(run_case(args))
            return
        # several jobs' cases in one mpiexec run: the start-up (interpreters, imports,
        # compiled kernels) is paid once, not once per case
        for k, case in enumerate(json.loads(args.cases)):
            emit({**run_case(p.parse_args([args.db, *case])), "case": k})


if __name__ == "__main__":
    main()
