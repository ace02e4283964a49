"""Epoch order: which global record indices each consumer rank gets, batch by batch.

Pure functions of (number of records, consumers, batch size, last-batch policy, shuffle
mode, seed, epoch): every rank computes the same plan without communication, and the plan
for a given seed and world size never changes.

Iteration ``i`` consumes the slice ``order[i*G:(i+1)*G]`` of the epoch order, where
``G = batch * consumers`` is the global batch; consumer ``c`` gets the ``c``-th run of
``batch`` records in that slice, so the records of one node's consumers (consecutive
consumer numbers) are contiguous in the order — what lets a node's reader fetch them as
one range in sequential order. The last, incomplete global batch follows ``last``:

- ``drop``: dropped; every record of the dropped tail is reported in ``dropped``.
- ``pad``: filled by wrapping around to the start of the order, so every consumer gets the
  same number of full batches; the padding is flagged in ``padding``.
- ``partial``: split as evenly as possible; every consumer still gets the same number of
  batches, the last ones shorter (possibly empty when fewer records than consumers remain).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAST_POLICIES = ("pad", "drop", "partial")
SHUFFLE_MODES = ("none", "global", "block")


@dataclass(frozen=True)
class EpochPlan:
    """The delivery order of one epoch.

    ``order`` is the epoch's permutation of record indices (identity when not shuffled).
    ``batches[i][c]`` is the array of global record indices consumer ``c`` gets in
    iteration ``i``; ``padding[i][c]`` flags the ones that repeat a record as padding.
    """

    n_records: int
    consumers: int
    batch: int
    last: str
    order: np.ndarray
    iterations: int
    dropped: np.ndarray

    def slice_bounds(self, iteration: int) -> tuple[int, int]:
        """``[lo, hi)`` positions of iteration ``iteration`` in the (padded) order."""
        g = self.batch * self.consumers
        lo = iteration * g
        if self.last == "partial":
            return lo, min(lo + g, self.n_records)
        return lo, lo + g

    def positions(self, iteration: int, consumer: int) -> tuple[int, int]:
        """``[lo, hi)`` positions in the (padded) order for one consumer and iteration."""
        lo, hi = self.slice_bounds(iteration)
        if self.last != "partial" or hi - lo == self.batch * self.consumers:
            start = lo + consumer * self.batch
            return start, start + self.batch
        # partial last batch: split the remainder as evenly as possible, in order
        n = hi - lo
        base, extra = divmod(n, self.consumers)
        start = lo + consumer * base + min(consumer, extra)
        return start, start + base + (1 if consumer < extra else 0)

    def records(self, iteration: int, consumer: int) -> np.ndarray:
        """Global record indices for one consumer in one iteration (padding included)."""
        lo, hi = self.positions(iteration, consumer)
        return self.order[np.arange(lo, hi) % max(self.n_records, 1)] if self.n_records \
            else np.empty(0, np.int64)

    def padding(self, iteration: int, consumer: int) -> np.ndarray:
        """True for the entries of :meth:`records` that are padding (wrapped around)."""
        lo, hi = self.positions(iteration, consumer)
        return np.arange(lo, hi) >= self.n_records

    def consumer_records(self, consumer: int) -> np.ndarray:
        """Everything one consumer gets this epoch, in delivery order."""
        parts = [self.records(i, consumer) for i in range(self.iterations)]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def group_range(self, iteration: int, first: int, count: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` covered by consumers ``first .. first+count-1``
        (a node's workers) in one iteration: contiguous by construction."""
        lo = self.positions(iteration, first)[0]
        hi = self.positions(iteration, first + count - 1)[1]
        return lo, hi


def iterations_per_epoch(n_records: int, consumers: int, batch: int, last: str) -> int:
    """Number of batches every consumer gets in one epoch."""
    g = batch * consumers
    if last == "drop":
        return n_records // g
    return -(-n_records // g)


def permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """A full permutation of ``range(n)`` seeded by ``(seed, epoch)``."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def block_order(leaf_first: np.ndarray, seed: int, epoch: int, block_leaves: int = 8,
                window: int = 1024) -> np.ndarray:
    """A page-aware random order: shuffle runs of ``block_leaves`` consecutive leaf pages,
    then shuffle records within consecutive windows of ``window`` records.

    Consecutive records stay within a few pages of each other, so reads stay mostly
    sequential while the order is random at the scale of blocks (FFCV's QUASI_RANDOM idea,
    here computed identically on every rank so it works distributed).
    """
    rng = np.random.default_rng([seed, epoch, 1])
    nleaves = leaf_first.shape[0] - 1
    n = int(leaf_first[-1])
    starts = leaf_first[:-1:block_leaves] if nleaves else np.empty(0, np.int64)
    ends = np.append(starts[1:], n)
    blocks = rng.permutation(starts.shape[0])
    order = np.concatenate([np.arange(starts[b], ends[b]) for b in blocks]) if n \
        else np.empty(0, np.int64)
    for lo in range(0, n, window):
        seg = order[lo:lo + window]
        order[lo:lo + window] = seg[rng.permutation(seg.shape[0])]
    return order.astype(np.int64)


def plan_epoch(
    n_records: int,
    consumers: int,
    batch: int,
    last: str = "pad",
    shuffle: str = "none",
    seed: int = 0,
    epoch: int = 0,
    leaf_first: np.ndarray | None = None,
    block_leaves: int = 8,
    window: int = 1024,
) -> EpochPlan:
    """The plan of one epoch (see the module docstring for the semantics)."""
    if consumers < 1 or batch < 1:
        raise ValueError("consumers and batch must be >= 1")
    if last not in LAST_POLICIES:
        raise ValueError(f"last must be one of {LAST_POLICIES}, not {last!r}")
    if shuffle == "none":
        order = np.arange(n_records, dtype=np.int64)
    elif shuffle == "global":
        order = permutation(n_records, seed, epoch)
    elif shuffle == "block":
        if leaf_first is None:
            raise ValueError("block shuffle needs the leaf directory (strategy indexed)")
        order = block_order(leaf_first, seed, epoch, block_leaves, window)
    else:
        raise ValueError(f"shuffle must be one of {SHUFFLE_MODES}, not {shuffle!r}")
    iters = iterations_per_epoch(n_records, consumers, batch, last)
    g = batch * consumers
    dropped = order[iters * g:] if last == "drop" else np.empty(0, np.int64)
    return EpochPlan(n_records, consumers, batch, last, order, iters, dropped)
