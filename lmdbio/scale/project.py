"""Project every strategy of a job: trace each one over the database, then time it.

:func:`project` is what ``lmdbio plan-scale`` runs; :func:`sensitivity` reruns the model
(not the traces: the page sets do not depend on the costs) with each uncertain cost at
the ends of its range, one at a time, giving the range of outcomes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmdbio.errors import ConfigError
from lmdbio.plan.strategies import STRATEGIES
from lmdbio.scale.costs import Costs
from lmdbio.scale.model import EpochResult, epoch_time
from lmdbio.scale.trace import Trace, trace

#: every registered strategy, in registry order
ALL_STRATEGIES = tuple(STRATEGIES)


@dataclass(frozen=True)
class Job:
    """The job projected: ranks on nodes, every rank a consumer of ``batch`` records per
    iteration (the global batch is ``batch * ranks``)."""

    ranks: int
    nodes: int
    batch: int
    #: iterations traced (None: one epoch); the model scales them to one epoch
    iterations: int | None = None
    #: batches per ring slot of the node-level strategies (0: a job's default)
    batches_per_slot: int = 0

    def __post_init__(self) -> None:
        for name in ("ranks", "nodes", "batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.nodes > self.ranks:
            raise ConfigError(f"nodes ({self.nodes}) must not exceed ranks ({self.ranks}): "
                              "every node runs at least one rank")
        if self.iterations is not None and self.iterations < 1:
            raise ConfigError(f"iterations must be >= 1, got {self.iterations}")
        if self.batches_per_slot < 0:
            raise ConfigError(f"batches_per_slot must be >= 0, got {self.batches_per_slot}")


def traces(path: str | Path, job: Job, strategies: tuple[str, ...] = ALL_STRATEGIES
           ) -> dict[str, Trace]:
    """One trace per strategy (see :func:`lmdbio.scale.trace.trace`)."""
    from lmdbio.plan.strategies import strategy_class

    for s in strategies:
        strategy_class(s)  # unknown names: a ConfigError listing the known ones
    return {s: trace(path, s, job.ranks, job.nodes, job.batch, iterations=job.iterations,
                     batches_per_slot=job.batches_per_slot) for s in strategies}


def project(path: str | Path, job: Job, costs: Costs,
            strategies: tuple[str, ...] = ALL_STRATEGIES) -> dict[str, Any]:
    """The JSON-able projection of ``job`` on the database at ``path`` under ``costs``:
    the database's shape, and per strategy its :class:`EpochResult` (pages per reading
    rank, bytes per node from the file system, epoch seconds, samples/s, breakdown)."""
    t0 = time.perf_counter()
    tr = traces(path, job, strategies)
    results = {s: epoch_time(t, costs) for s, t in tr.items()}
    any_t = next(iter(tr.values()))
    return {
        "database": {"path": any_t.path, "records": any_t.n_records,
                     "page_size": any_t.psize, "pages": any_t.n_pages,
                     "file_bytes_per_record": any_t.record_bytes},
        "job": {"ranks": job.ranks, "nodes": job.nodes, "batch_per_rank": job.batch,
                "global_batch": job.batch * job.ranks, "iterations_traced":
                any_t.iterations, "epoch_iterations": any_t.epoch_iterations},
        "costs": costs.as_dict(),
        "strategies": {s: summarize(r) for s, r in results.items()},
        "model_seconds": time.perf_counter() - t0,
    }


def summarize(r: EpochResult) -> dict[str, Any]:
    """The figures of one strategy's projection (pages summed and per rank)."""
    extra = [p["extra_pages"] for p in r.pages]
    own = [p["own_pages"] for p in r.pages]
    return {
        "epoch_seconds": r.seconds,
        "samples_per_second": r.samples_per_second,
        "breakdown_seconds": r.breakdown,
        "readers": len(r.pages),
        "extra_pages_total": int(sum(extra)),
        "extra_pages_per_reader_max": int(max(extra, default=0)),
        "own_pages_total": int(sum(own)),
        "fs_bytes_total": int(sum(r.node_fs_bytes)),
        "fs_bytes_per_node": r.node_fs_bytes,
        "requests": r.requests,
        "speculative": r.speculative,
        "scaled_from_traced": r.scale,
        "batches_per_slot": r.extra["batches_per_slot"],
        "pages_per_reader": r.pages,
    }


def sensitivity(tr: dict[str, Trace], costs: Costs,
                ranges: dict[str, tuple[float, float]]) -> dict[str, dict[str, Any]]:
    """Per strategy, its samples/s under ``costs`` and the lowest and highest when each
    cost of ``ranges`` is set to either end of its range (one at a time), with the cost
    that moved it most."""
    out: dict[str, dict[str, Any]] = {}
    for s, t in tr.items():
        base = epoch_time(t, costs).samples_per_second
        lo, hi, by = base, base, {}
        for name, (a, b) in ranges.items():
            vals = [epoch_time(t, costs.replace(**{name: v})).samples_per_second
                    for v in (a, b)]
            by[name] = (min(vals), max(vals))
            lo, hi = min(lo, *vals), max(hi, *vals)
        widest = max(by, key=lambda k: by[k][1] - by[k][0]) if by else None
        out[s] = {"samples_per_second": base, "low": lo, "high": hi, "widest": widest,
                  "by_cost": by}
    return out
