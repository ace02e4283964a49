"""An example Caffe-style trainer: softmax regression (or a one-hidden-layer MLP) by SGD.

Run under MPI, on every rank, with a job configuration::

    lmdbio launch -n 4 --simulate-nodes 2 configs/quickstart.yaml -- \\
        python -m loaders.caffe_trainer configs/quickstart.yaml

Reader ranks (dedicated mode) read and never train; the workers compute gradients on their
batches and average them with an allreduce over the workers' communicator, as Caffe's
data-parallel solvers do. Padding records (policy ``pad``) are masked out of the loss.
Worker 0 prints the loss of every epoch and a summary at the end.

The summary's share of time in the loader is steady state: it leaves out each worker's first
batch of the run (which waits for the readers to start; its time is reported apart) and
counts the wall time of every later ``next()`` on the loader's iterator: waiting for a
batch, and in colocated mode reading it, plus decoding where that is not done ahead.
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


def softmax_loss(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray
                 ) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the unmasked rows and its gradient w.r.t. the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = max(int(mask.sum()), 1)
    rows = np.arange(labels.shape[0])
    loss = float(-(np.log(p[rows, labels] + 1e-12) * mask).sum() / n)
    grad = p
    grad[rows, labels] -= 1.0
    grad *= mask[:, None] / n
    return loss, grad


def summarize(ranks: list[dict], losses: list[float]) -> dict:
    """The job's figures from every rank's ``loader.summary()`` and its own clock (the
    whole run, the first batch, then steady state: the loader's share is the mean over the
    workers of the time in ``next()`` over the time since their second ``next()`` began)."""
    workers = [s for s in ranks if s["worker"]]
    elapsed = max((s["run_seconds"] for s in workers), default=0.0)
    timed = [s for s in workers if s["first_batch_seconds"] is not None]
    samples = sum(s["samples"] for s in workers)
    mb = sum(s["bytes"] for s in workers) / 1e6
    steady_seconds = max((s["steady_seconds"] for s in timed), default=0.0)
    steady_samples = sum(s["steady_samples"] for s in timed)
    fractions = [s["loader_seconds"] / s["steady_seconds"] for s in timed
                 if s["steady_seconds"] > 0]
    n = max(len(timed), 1)
    return {
        "workers": len(workers), "samples": samples, "seconds": elapsed,
        "samples_per_second": samples / elapsed if elapsed else 0.0,
        "megabytes_per_second": mb / elapsed if elapsed else 0.0,
        "first_batch_seconds": max((s["first_batch_seconds"] for s in timed), default=None),
        "steady_samples": steady_samples, "steady_seconds": steady_seconds,
        "steady_samples_per_second": steady_samples / steady_seconds
        if steady_seconds else 0.0,
        # steady state: after each worker's first batch; the wall time of next()
        "mean_seconds_waiting_for_data": sum(s["loader_seconds"] for s in timed) / n,
        "waiting_fraction": sum(fractions) / len(fractions) if fractions else 0.0,
        "losses": losses,
    }


def summary_line(s: dict) -> str:
    """The summary worker 0 prints."""
    losses = s["losses"]
    if not losses:
        return "[trainer] no worker"
    first = s["first_batch_seconds"]
    return (f"[trainer] {s['samples']} samples in {s['seconds']:.2f} s: "
            f"{s['samples_per_second']:.0f} samples/s, {s['megabytes_per_second']:.2f} MB/s; "
            f"steady state (after each worker's first batch, which waits for the readers to "
            f"start and came after {first or 0.0:.2f} s): "
            f"{s['steady_samples_per_second']:.0f} samples/s, "
            f"{100 * s['waiting_fraction']:.1f}% of the time in the loader (waiting, "
            f"reading, decoding); loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def main(argv: list[str] | None = None) -> int:
    """Train on every rank of the job; world rank 0 prints (and writes) the summary."""
    args = parse_args(argv)

    start_mpi()

    with abort_on_error(), open_loader(args.config, args.overrides) as loader:
        rank0 = loader.is_worker and loader.comm.Get_rank() == 0
        state = TrainerState(t_start=time.perf_counter())
        losses = []
        for epoch in loader.epochs():  # cfg.epochs, cut at cfg.max_iterations (max_iter)
            total, count = train_epoch(loader, state, args)
            if loader.is_worker:
                mean = epoch_loss(loader.comm, total, count)
                losses.append(mean)
                if rank0:
                    print(f"[trainer] epoch {epoch}: mean loss {mean:.4f}", flush=True)
        mine = state.clock_figures(time.perf_counter())
        summaries = loader.topo.world.gather({**loader.summary(), **mine}, root=0)
        every_loss = loader.topo.world.gather(losses, root=0)
        if loader.topo.rank == 0:
            assert summaries is not None and every_loss is not None  # gathered at the root
            losses = next((x for x in every_loss if x), [])
            report(loader, summaries, losses, args.summary_json)
        if losses and rank0 and len(losses) > 1 and not losses[-1] < losses[0]:
            print("[trainer] warning: the loss did not go down", file=sys.stderr)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The trainer's command line (``sys.argv`` when ``argv`` is None)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--hidden", type=int, default=0, help="hidden units (0: linear)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--summary-json", default=None)
    return parser.parse_args(argv)


@dataclass
class TrainerState:
    """A worker's network (made on its first batch, when the input size is known) and its
    clock: the first batch apart, then steady state (see the module's docstring)."""

    t_start: float
    params: list[np.ndarray] = field(default_factory=list)
    first_batch: float | None = None
    steady_from: float | None = None  #: when the second next() began
    loader_seconds: float = 0.0
    steady_samples: int = 0

    def time_next(self, t0: float, t1: float, batch: Any) -> None:
        """Account one ``next()`` that ran from ``t0`` to ``t1`` and gave ``batch`` (None
        at the end of an epoch)."""
        if self.first_batch is None:
            if batch is not None:  # the run's first batch: reported apart
                self.first_batch = t1 - self.t_start
        else:  # steady state
            self.steady_from = t0 if self.steady_from is None else self.steady_from
            self.loader_seconds += t1 - t0
            self.steady_samples += 0 if batch is None else len(batch)

    def clock_figures(self, t_end: float) -> dict[str, Any]:
        """This rank's clock at ``t_end``, as :func:`summarize` reads it."""
        return {"run_seconds": t_end - self.t_start,
                "first_batch_seconds": self.first_batch, "loader_seconds": self.loader_seconds,
                "steady_samples": self.steady_samples,
                "steady_seconds": 0.0 if self.steady_from is None else t_end - self.steady_from}


def initial_params(comm: Any, n_in: int, hidden: int, classes: int) -> list[np.ndarray]:
    """Small random weights of the ``n_in [-> hidden] -> classes`` network, worker 0's
    broadcast to every worker so that all start from the same network."""
    rng = np.random.default_rng(0)
    dims = [n_in] + ([hidden] if hidden else []) + [classes]
    params = [rng.normal(0, 0.01, (a, b)).astype(np.float32)
              for a, b in itertools.pairwise(dims)]
    return [comm.bcast(p, root=0) for p in params]


def gradients(params: list[np.ndarray], x: np.ndarray, y: np.ndarray,
              mask: np.ndarray) -> tuple[float, list[np.ndarray]]:
    """The masked softmax loss of a batch and its gradient for every weight matrix
    (backpropagation through the ReLU layers)."""
    acts = [x]
    for w in params[:-1]:
        acts.append(np.maximum(acts[-1] @ w, 0))
    loss, g = softmax_loss(acts[-1] @ params[-1], y, mask)
    grads = []
    for i in range(len(params) - 1, -1, -1):
        grads.append(acts[i].T @ g)
        if i:
            g = (g @ params[i].T) * (acts[i] > 0)
    grads.reverse()
    return loss, grads


def train_epoch(loader: Any, state: TrainerState,
                args: argparse.Namespace) -> tuple[float, int]:
    """One epoch of data-parallel SGD (gradients averaged by allreduce over the workers);
    returns this worker's summed batch losses and batch count. Dedicated readers read here
    and train nothing."""
    from mpi4py import MPI

    comm = loader.comm
    total, count = 0.0, 0
    batches = iter(loader)  # dedicated readers read here and yield nothing
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        state.time_next(t0, time.perf_counter(), batch)
        if batch is None:
            break
        x = np.asarray(batch.data, np.float32).reshape(len(batch), -1)
        y = np.asarray(batch.label, np.int64)
        mask = (~batch.padding).astype(np.float32)
        if not state.params:
            state.params = initial_params(comm, x.shape[1], args.hidden, args.classes)
        loss, grads = gradients(state.params, x, y, mask)
        for p, gr in zip(state.params, grads, strict=True):
            comm.Allreduce(MPI.IN_PLACE, gr, op=MPI.SUM)
            p -= args.lr * gr / comm.Get_size()
        total += loss
        count += 1
    return total, count


def epoch_loss(comm: Any, total: float, count: int) -> float:
    """The epoch's mean batch loss averaged over the workers (collective over ``comm``)."""
    from mpi4py import MPI

    mean: float = comm.allreduce(total / max(count, 1), op=MPI.SUM) / comm.Get_size()
    return mean


def report(loader: Any, summaries: list[dict], losses: list[float],
           summary_json: str | None) -> None:
    """World rank 0: print the job's summary and, with ``--summary-json``, write it."""
    summary = summarize(summaries, losses)
    summary.update({"ranks": loader.topo.size, "nodes": loader.topo.host_nodes,
                    "strategy": loader.cfg.readers.strategy})
    print(summary_line(summary), flush=True)
    if summary_json:
        with open(summary_json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
