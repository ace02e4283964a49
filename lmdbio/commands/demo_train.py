"""The trainer of ``lmdbio demo`` (``make run``): a one-hidden-layer network trained by SGD
through the loader, timed the way a user asks "is the loader my bottleneck?".

Run on every rank of an MPI job (``lmdbio launch ... -- python -m lmdbio.commands.demo_train
CONFIG``). Workers compute the softmax loss and its gradients on their batch (the loss of
:mod:`loaders.caffe_trainer`; padding records masked out), average the gradients with one
allreduce per step (data-parallel SGD, as Caffe's solvers), and update; dedicated readers
read and train nothing.

Every worker times each step in three parts: inside the loader's iterator (``next``:
waiting for the batch, and in colocated mode reading it, plus decoding where it is not
done ahead), computing, and averaging the gradients. The figures are steady state: after
``--warmup`` batches per worker, which carry one-off costs (the readers starting, compiled
kernels loaded, first page faults); how long the first batch took is reported apart.
World rank 0 prints the loss of every epoch and one summary line, and writes the figures
(``--summary-json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmdbio.mpiutil import abort_on_error, start_mpi
from loaders import open as open_loader
from loaders.caffe_trainer import softmax_loss


def main(argv: list[str] | None = None) -> int:
    """Train through the loader on every rank; world rank 0 reports the figures."""
    args = parse_args(argv)

    start_mpi()

    with abort_on_error(), open_loader(args.config, args.overrides) as loader:
        opened = time.perf_counter()
        mine: dict[str, Any] = {"worker": loader.is_worker, "first_batch_seconds": None}
        losses: list[float] = []
        if not loader.is_worker:  # a dedicated reader: reads the node's batches
            for _ in loader.epochs():
                for _ in loader:
                    pass
        else:
            state = TrainState()
            for _ in loader.epochs():
                losses.append(train_epoch(loader, state, args, opened, len(losses) + 1))
            mine.update(first_batch_seconds=state.first_batch_seconds,
                        **state.figures(args.warmup))
        mine["seconds"] = time.perf_counter() - opened
        everyone = loader.topo.world.gather(mine, root=0)
        every_loss = loader.topo.world.gather(losses, root=0)
        if loader.topo.rank == 0:
            assert everyone is not None and every_loss is not None
            report(summarize(everyone, next((x for x in every_loss if x), [])),
                   args.summary_json)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The trainer's command line (``sys.argv`` when ``argv`` is None)."""
    parser = argparse.ArgumentParser(prog="python -m lmdbio.commands.demo_train",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("config", help="YAML job configuration")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE", help="override a configuration value")
    parser.add_argument("--hidden", type=int, default=128, help="hidden units")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    parser.add_argument("--classes", type=int, default=10, help="classes of the labels")
    parser.add_argument("--warmup", type=int, default=5,
                        help="batches per worker left out of the steady-state figures")
    parser.add_argument("--summary-json", default=None, metavar="OUT",
                        help="write the figures to OUT (world rank 0)")
    return parser.parse_args(argv)


@dataclass
class TrainState:
    """A worker's network (made on the first batch, when the input size is known), its
    gradient buffer, and what its steps took so far."""

    params: list[np.ndarray] = field(default_factory=list)
    flat: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    steps: int = 0
    samples: int = 0
    steady_samples: int = 0
    spent: dict[str, float] = field(
        default_factory=lambda: {"loader": 0.0, "compute": 0.0, "allreduce": 0.0})
    first_batch_seconds: float | None = None

    def figures(self, warmup: int) -> dict[str, Any]:
        """This worker's totals and steady-state figures (after ``warmup`` steps)."""
        seconds = sum(self.spent.values())
        return {
            "steps": self.steps, "samples": self.samples,
            "steady_steps": max(self.steps - warmup, 0),
            "steady_samples": self.steady_samples, "steady_seconds": seconds,
            **{f"{k}_seconds": v for k, v in self.spent.items()},
            "loader_fraction": self.spent["loader"] / seconds if seconds else 0.0,
        }


def initial_params(n_in: int, hidden: int, classes: int) -> list[np.ndarray]:
    """He-initialized weights of the ``n_in -> hidden -> classes`` network; the same seed
    on every worker, so that every worker starts from the same network."""
    rng = np.random.default_rng(0)
    dims = [n_in, hidden, classes]
    return [(rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
            for a, b in itertools.pairwise(dims)]


def gradients(params: list[np.ndarray], x: np.ndarray, y: np.ndarray,
              mask: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """``(loss, grad0, grad1)``: the masked softmax loss of the batch and its gradients
    with respect to both weight matrices (padding records have ``mask`` 0)."""
    hidden = np.maximum(x @ params[0], 0)
    loss, g = softmax_loss(hidden @ params[1], y, mask)
    g1 = hidden.T @ g
    g0 = x.T @ ((g @ params[1].T) * (hidden > 0))
    return loss, g0, g1


def train_epoch(loader: Any, state: TrainState, args: argparse.Namespace, opened: float,
                number: int) -> float:
    """Epoch ``number`` (from 1) of data-parallel SGD over the loader's batches, each step
    timed in three parts (loader, compute, allreduce); returns the epoch's loss averaged
    over workers (printed by the workers' rank 0)."""
    from mpi4py import MPI

    comm = loader.comm
    workers = comm.Get_size()
    batches = iter(loader)
    total, count = 0.0, 0
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        t1 = time.perf_counter()
        if batch is None:
            break
        if state.first_batch_seconds is None:
            state.first_batch_seconds = t1 - opened
        x = np.asarray(batch.data, np.float32).reshape(len(batch), -1)
        y = np.asarray(batch.label, np.int64)
        mask = (~np.asarray(batch.padding)).astype(np.float32)
        if not state.params:
            state.params = initial_params(x.shape[1], args.hidden, args.classes)
            state.flat = np.empty(sum(p.size for p in state.params), np.float32)
        params, flat = state.params, state.flat
        loss, g0, g1 = gradients(params, x, y, mask)
        flat[:g0.size] = g0.ravel()
        flat[g0.size:] = g1.ravel()
        t2 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        t3 = time.perf_counter()
        params[0] -= args.lr / workers * flat[:g0.size].reshape(g0.shape)
        params[1] -= args.lr / workers * flat[g0.size:].reshape(g1.shape)
        t4 = time.perf_counter()
        state.steps += 1
        state.samples += len(batch)
        if state.steps > args.warmup:
            state.spent["loader"] += t1 - t0
            state.spent["compute"] += (t2 - t1) + (t4 - t3)
            state.spent["allreduce"] += t3 - t2
            state.steady_samples += len(batch)
        total += loss
        count += 1
    mean: float = comm.allreduce(total / max(count, 1), op=MPI.SUM) / workers
    if comm.Get_rank() == 0:
        print(f"[train] epoch {number}: mean loss {mean:.4f}", flush=True)
    return mean


def report(summary: dict[str, Any], summary_json: str | None) -> None:
    """Print the summary line and, with ``--summary-json``, write the figures."""
    print(summary_line(summary), flush=True)
    if summary_json:
        with open(summary_json, "w") as f:
            json.dump(summary, f, indent=2)


def summarize(ranks: list[dict[str, Any]], losses: list[float]) -> dict[str, Any]:
    """The job's figures from every rank's (world rank 0)."""
    workers = [r for r in ranks if r["worker"]]
    n = max(len(workers), 1)
    steady_seconds = max((w["steady_seconds"] for w in workers), default=0.0)
    steps = sum(w["steady_steps"] for w in workers)
    out: dict[str, Any] = {
        "workers": len(workers), "ranks": len(ranks), "losses": losses,
        "samples": sum(w["samples"] for w in workers),
        "seconds": max(r["seconds"] for r in ranks),
        "steady_samples": sum(w["steady_samples"] for w in workers),
        "steady_seconds": steady_seconds,
        "first_batch_seconds": max((w["first_batch_seconds"] or 0.0 for w in workers),
                                   default=0.0),
        "loader_fraction_mean": sum(w["loader_fraction"] for w in workers) / n,
        "loader_fraction_max": max((w["loader_fraction"] for w in workers), default=0.0),
    }
    for part in ("loader", "compute", "allreduce"):
        out[f"{part}_ms_per_step"] = 1e3 * sum(w[f"{part}_seconds"] for w in workers) / \
            max(steps, 1)
    out["samples_per_second"] = out["samples"] / out["seconds"] if out["seconds"] else 0.0
    out["steady_samples_per_second"] = out["steady_samples"] / steady_seconds \
        if steady_seconds else 0.0
    return out


def summary_line(s: dict[str, Any]) -> str:
    losses = s["losses"]
    loss = f"; loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else ""
    return (f"[train] {s['samples']} samples to {s['workers']} workers in {s['seconds']:.1f} s"
            f"{loss}. Steady state: {s['steady_samples_per_second']:,.0f} samples/s; a step: "
            f"{s['compute_ms_per_step']:.2f} ms computing, {s['allreduce_ms_per_step']:.2f} ms "
            f"averaging gradients, {s['loader_ms_per_step']:.2f} ms in the loader, so "
            f"{100 * s['loader_fraction_mean']:.1f}% of the time in the loader (waiting, "
            f"reading, decoding). The first batch came {s['first_batch_seconds']:.2f} s after "
            "the loader opened (the readers starting: left out above).")


if __name__ == "__main__":
    sys.exit(main())
