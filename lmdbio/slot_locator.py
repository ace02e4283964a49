"""Which records a reader rank delivers in one ring slot, where they are, and what it asks
for ahead: the ``locate`` and ``read_ahead`` stages of a reader (:mod:`lmdbio.stages`).

A slot carries ``count`` consecutive iterations (batches) of a node's workers, each
worker's records back to back (worker-major). :class:`SlotLocator` takes this reader's
share of an epoch plan's iterations (:meth:`~SlotLocator.share`), has its strategy locate
them (:meth:`~SlotLocator.fetch_group`: one call per slot where the strategy can), and tells
the strategy what the next slot needs (:meth:`~SlotLocator.read_ahead`). It knows nothing
of rings, copies or MPI: :class:`lmdbio.reader.ReadSession` gathers and publishes what it
locates, and :mod:`lmdbio.scale.trace` runs it, the same code, for every simulated reader
of a projected job. Its work is a few calls per slot, none per record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lmdbio.lmdb import RecordRefs
from lmdbio.plan.epoch import slot_length

if TYPE_CHECKING:
    from lmdbio.plan.epoch import EpochPlan
    from lmdbio.plan.strategies import IterationStats, ReadStrategy

__all__ = ["SlotLocator"]


class SlotLocator:
    """One reading rank's locating of its slots: its share of the plan, the fetch of
    ``strategy`` (set up, over the rank's database), the read-ahead.

    ``rank``: the rank's world rank (whose own records a strategy in which every rank reads
    for itself delivers). ``first_consumer`` and ``node_consumers``: the consumer rank of
    the node's first worker and the node's number of workers, whose records the reader of
    a node-level strategy (:attr:`~lmdbio.plan.strategies.base.ReadStrategy.shared`)
    delivers. ``batches_per_slot``: iterations per ring slot (1 without a ring). Call
    :meth:`stop_epoch_at` at each epoch's start.
    """

    def __init__(self, strategy: ReadStrategy, *, rank: int, first_consumer: int,
                 node_consumers: int, batches_per_slot: int) -> None:
        self.strategy, self.rank = strategy, rank
        #: one reader reads for the node's workers (else every rank for itself)
        self.shared = strategy.shared
        self.first_consumer, self.node_consumers = first_consumer, node_consumers
        self.batches_per_slot = batches_per_slot
        #: the iteration the current epoch's run ends at: nothing after it is read ahead
        self.epoch_stop = 0

    def stop_epoch_at(self, plan: EpochPlan, stop: int) -> None:
        """Where ``plan``'s epoch ends: iteration ``stop`` where it lies inside the epoch,
        else the epoch's end (0, or at or past the end: the whole epoch)."""
        self.epoch_stop = stop if 0 < stop < plan.iterations else plan.iterations

    def share(self, plan: EpochPlan, first: int, count: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Records, padding flags and records per consuming worker that this reader
        delivers for iterations ``first .. first + count - 1``: the node's share
        (:meth:`node_share`) for a node-level strategy, else its own records (``count``
        1)."""
        if self.shared:
            return self.node_share(plan, first, count)
        ids = plan.records(first, self.rank)
        return ids, plan.padding(first, self.rank), np.array([ids.size])

    def node_share(self, plan: EpochPlan, first: int, count: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Records, padding flags and per-worker counts of iterations ``first .. first +
        count - 1`` for this node's workers, worker after worker (each worker's records in
        iteration order: a worker's part of the slot is its batches back to back)."""
        c0, nc = self.first_consumer, self.node_consumers
        if count == 1:
            return (plan.group_records(first, c0, nc), plan.group_padding(first, c0, nc),
                    plan.group_sizes(first, c0, nc))
        ids, pad = plan.slot_records(first, count, c0, nc, worker_major=True)
        return ids, pad, plan.sizes[first:first + count, c0:c0 + nc].sum(axis=0)

    def fetch_group(self, plan: EpochPlan, first: int, count: int, ids: np.ndarray,
                    stats: IterationStats) -> RecordRefs:
        """Where the records of a slot are. A random-access strategy locates them in one
        call; so does a walking one when the slot is one slot group of the plan (the node's
        records of the slot are then one run: :meth:`EpochPlan.contiguous_slot`); otherwise
        they read iteration by iteration. Records fetched in iteration order are then put
        in worker-major order."""
        if count == 1 or self.strategy.shuffles:
            return self.strategy.fetch(plan, first, ids, stats)
        c0, nc = self.first_consumer, self.node_consumers
        if plan.contiguous_slot(first, count):
            refs = self.strategy.fetch(plan, first, self.slot_run(plan, first, count), stats,
                                       iterations=count)
        else:
            acc = self.strategy.db.accounting
            slot_pages = acc.snapshot() if acc.enabled else None
            parts = []
            for i in range(first, first + count):
                # per iteration, as dm-spec's estimator reads the pages one iteration walked
                acc.reset()
                parts.append(self.strategy.fetch(plan, i, plan.group_records(i, c0, nc),
                                                 stats))
                if slot_pages is not None:
                    slot_pages |= acc.touched
            if slot_pages is not None:  # the slot's pages, as the accounting reports them
                acc.touched[:] = slot_pages
            refs = RecordRefs.concat(parts)
        if nc == 1:  # one worker: iteration-major is worker-major
            return refs
        # iteration-major (as fetched) -> worker-major (as the slot holds them)
        sizes = plan.sizes[first:first + count, c0:c0 + nc]
        start = np.zeros(sizes.size, np.int64)
        np.cumsum(sizes.reshape(-1)[:-1], out=start[1:])
        start = start.reshape(sizes.shape).T.reshape(-1)
        lens = sizes.T.reshape(-1)
        order = np.repeat(start - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        return refs.take(order)

    def slot_run(self, plan: EpochPlan, first: int, count: int) -> np.ndarray:
        """This node's records of iterations ``first .. first + count - 1``, iteration
        after iteration (one run of the order when the plan's slot group holds them)."""
        c0, nc = self.first_consumer, self.node_consumers
        if count == 1:
            return plan.group_records(first, c0, nc)
        return plan.slot_records(first, count, c0, nc)[0]

    def read_ahead(self, plan: EpochPlan, iteration: int) -> None:
        """Tell the strategy the records this reader fetches next, from ``iteration`` on
        (the whole next slot for a random-access strategy and for a walking one that
        fetches it in one call, else its first iteration), so that it can ask for their
        pages while this slot is gathered and handed off
        (:meth:`~lmdbio.plan.strategies.base.ReadStrategy.read_ahead`)."""
        if iteration >= min(plan.iterations, self.epoch_stop) or not self.strategy.advising:
            return
        if not self.shared:
            self.strategy.read_ahead(plan, iteration, plan.records(iteration, self.rank))
            return
        count = slot_length(iteration, plan.iterations, self.batches_per_slot)
        if self.strategy.shuffles:  # random access locates the whole slot in one call
            ids = self.node_share(plan, iteration, count)[0]
        else:
            if not plan.contiguous_slot(iteration, count):
                count = 1
            ids = self.slot_run(plan, iteration, count)
        self.strategy.read_ahead(plan, iteration, ids)
