"""The time of one epoch from a :class:`~lmdbio.scale.trace.Trace` and :class:`Costs`.

A small discrete-event model. Each node has one page cache, cold at the start of the
epoch: a page is read from the file system the first time any rank of the node touches it.
What a read costs depends on how the strategy reads:

* pages it faults in (the naive strategies, LMM, dm-serial; and whatever dm-spec's or
  indexed's advice missed) are synchronous requests, one per fault; with the kernel's
  read-around (``readahead_bytes``, on for the strategies that do not advise) a fault
  reads the aligned window around the page, so a walk over leaves also reads the values
  between them;
* pages it asks for ahead (dm-spec's prefetch, indexed's advice) are asynchronous runs, cut
  at ``fs_max_request_bytes``, ``fs_async_depth`` of them in flight.

Bandwidth is shared: each reading rank gets ``min(node / readers on its node, aggregate /
readers in the job)``. CPU is per record walked, skipped or located, per page touched, per
read (and per read that speculates, dm-spec; per slot a node's reader builds; and per
page of the file when the reads count pages, as ``bench read`` does), and per byte each
consumer copies and per
record it takes (plus a hand-off per slot from a
node's reader to each of its workers). Actors that do not communicate run side by side: a
node's time is the longer of its reader's path (reads, CPU, its own share of consuming
when colocated) and a worker's (hand-offs, copies). The DM chains are simulated slot by
slot: reader ``r`` starts its walk when the cursor from ``r - 1`` has arrived
(``mpi_latency_s`` plus the bytes over ``mpi_bandwidth_bps``) and it is free; the walk's
own faults are on the chain, the rest of its slot (values, collection, copies) after it.
dm-spec's prefetch starts as soon as the reader is free, before the cursor arrives; the
chain then waits for it at most one request's latency (its pages are in flight). A reader
that waits for its cursor does not see it arrive: it tests for it between sleeps that
double up to a limit (:func:`poll_delay`), so the chain moves on at the first test after
the cursor came.

Limits (docs/scaling.md): contention between ranks for caches and memory bandwidth is
one measured factor on every CPU cost (``cpu_contention_factor``), never more ranks than
cores, no jitter, one request latency whatever the file system's load, read-around as aligned
windows, and the page cache never evicts within an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lmdbio.scale.costs import Costs
from lmdbio.scale.trace import Step, Trace


@dataclass
class StepCost:
    """What one step costs its actor (seconds), and what it read from the file system."""

    io_sync: float = 0.0
    io_async: float = 0.0
    chain_io: float = 0.0
    cpu: float = 0.0
    chain_cpu: float = 0.0
    consume: float = 0.0
    message: float = 0.0
    fetched_pages: int = 0
    sync_requests: int = 0
    async_requests: int = 0
    #: the chain's pages arrive this long after the reader is free (dm-spec's prefetch)
    chain_ready: float = 0.0


@dataclass
class EpochResult:
    """The model's figures for one strategy (one epoch, or the traced iterations scaled
    to one epoch when fewer were traced)."""

    strategy: str
    ranks: int
    nodes: int
    seconds: float
    samples_per_second: float
    #: seconds on the slowest node's critical path, by kind
    breakdown: dict[str, float]
    #: per reading rank: pages touched / holding its records / extra, as bench read counts
    pages: list[dict[str, int]]
    #: bytes each node read from the file system
    node_fs_bytes: list[int]
    requests: dict[str, int]
    speculative: dict[str, int]
    scale: float
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def _runs(pages: np.ndarray) -> np.ndarray:
    """Lengths of the runs of consecutive pages in sorted ``pages``."""
    if not pages.size:
        return pages
    cut = np.flatnonzero(np.diff(pages) != 1) + 1
    return np.diff(np.r_[0, cut, pages.size])


class NodePageCache:
    """One node's page cache (cold at the epoch's start): which pages a read finds
    there, and what reading the others costs in pages and requests."""

    def __init__(self, n_pages: int) -> None:
        self.n_pages = n_pages  # the file's pages: a read-around window ends at its end
        self.resident = np.zeros(n_pages + 1, bool)

    def ask(self, pages: np.ndarray, max_pages: int) -> tuple[int, int]:
        """Asynchronous reads of ``pages``: (pages read, requests)."""
        new = pages[~self.resident[pages]] if pages.size else pages
        if not new.size:
            return 0, 0
        self.resident[new] = True
        reqs = int(np.ceil(_runs(new) / max_pages).sum())
        return int(new.size), reqs

    def fault(self, pages: np.ndarray, window: int) -> tuple[int, int]:
        """Synchronous faults on ``pages`` (each fault reads its aligned ``window``):
        (pages read, requests)."""
        new = pages[~self.resident[pages]] if pages.size else pages
        if not new.size:
            return 0, 0
        if window <= 1:
            self.resident[new] = True
            return int(new.size), int(new.size)
        starts = np.unique(new // window) * window
        # the windows are aligned, so disjoint: all of them at once
        pages_read = (starts[:, None] + np.arange(window)).ravel()
        pages_read = pages_read[pages_read < self.n_pages]
        read = int(pages_read.size - np.count_nonzero(self.resident[pages_read]))
        self.resident[pages_read] = True
        return read, int(starts.size)


def epoch_time(trace: Trace, costs: Costs) -> EpochResult:
    """The model's epoch for ``trace`` under ``costs`` (see the module docstring)."""
    costs_of, fetched = step_costs(trace, costs)
    if trace.chained and len(trace.actors) > 1:
        end, crit = _chain(trace, costs_of, costs)
    else:
        end, crit = _independent(trace, costs_of)
    return _result(trace, costs_of, fetched, end, crit)


def step_costs(trace: Trace, costs: Costs) -> tuple[list[StepCost], np.ndarray]:
    """What every step of ``trace`` costs its actor, in trace order, replaying the reads
    against one cold page cache per node; and the pages each node fetched."""
    nodes = [NodePageCache(trace.n_pages) for _ in range(trace.nodes)]
    window = max(1, int(costs.readahead_bytes) // trace.psize) if trace.read_around else 1
    max_req = max(1, int(costs.fs_max_request_bytes) // trace.psize)
    readers_on = np.zeros(trace.nodes, np.int64)
    for a in trace.actors:
        readers_on[a.node] += 1
    costs_of: list[StepCost] = []
    fetched = np.zeros(trace.nodes, np.int64)
    for step in trace.steps:
        actor = trace.actors[step.actor]
        bw = min(costs.fs_node_bandwidth_bps / readers_on[actor.node],
                 costs.fs_aggregate_bandwidth_bps / len(trace.actors))
        c = _step_io(trace, step, costs, nodes[actor.node], window, max_req, bw)
        _step_cpu(trace, step, costs, c, actor.consumers)
        fetched[actor.node] += c.fetched_pages
        costs_of.append(c)
    return costs_of, fetched


def _step_io(trace: Trace, step: Step, costs: Costs, node: NodePageCache, window: int,
             max_req: int, bw: float) -> StepCost:
    """The file-system side of one step: what it asks for ahead, the chain's own faults
    (on the DM chain's critical path), then the rest of the pages it touches."""
    psize = trace.psize
    c = StepCost()
    adv_pages, c.async_requests = node.ask(step.advised, max_req)
    chain_pages, chain_reqs = (node.fault(step.chain_pages, window)
                               if trace.chained else (0, 0))
    rest_pages, rest_reqs = node.fault(step.touched(), window)
    c.sync_requests = chain_reqs + rest_reqs
    c.fetched_pages = adv_pages + chain_pages + rest_pages
    lat = costs.fs_latency_s
    c.io_async = np.ceil(c.async_requests / costs.fs_async_depth) * lat + \
        adv_pages * psize / bw
    c.chain_io = chain_reqs * lat + chain_pages * psize / bw
    if trace.chained and step.advised.size and np.isin(step.chain_pages,
                                                       step.advised).any():
        # the walk's pages are in the prefetch's reads in flight: ready one latency
        # after the reader asked for them (when it became free), not per fault
        c.chain_ready = lat
    c.io_sync = rest_reqs * lat + rest_pages * psize / bw
    return c


def _step_cpu(trace: Trace, step: Step, costs: Costs, c: StepCost, consumers: int) -> None:
    """The CPU side of one step, into ``c``: the chain's walk, the rest of the read (per
    record, per page touched, per read, per page of the file when pages are counted, per
    speculating read, per slot of a node's ring), the cursor message, and
    the consuming (a copy per byte, a decode and a take per record, shared among the
    node's ``consumers``, plus the slot's hand-off on a node ring of several workers: a
    node of one rank hands its slots of spans to itself in process,
    :attr:`~lmdbio.reader.ReadSession.hands_to_itself`), all of it times the host's
    contention factor."""
    c.chain_cpu = step.chain_walked * costs.cpu_walk_s + \
        step.chain_skipped * costs.cpu_skip_s
    c.cpu = step.walked * costs.cpu_walk_s + step.skipped * costs.cpu_skip_s + \
        step.located * costs.cpu_locate_s + step.touched().size * costs.cpu_page_s + \
        costs.cpu_step_s + trace.n_pages * costs.cpu_account_s_per_file_page + \
        (costs.cpu_speculate_s if trace.speculates else 0.0) + \
        (costs.cpu_slot_s if trace.shared else 0.0) - c.chain_cpu
    c.message = step.messages * costs.mpi_latency_s + \
        step.message_bytes / costs.mpi_bandwidth_bps
    c.consume = (step.bytes * costs.copy_s_per_byte
                 + step.records * (costs.decode_s_per_record + costs.consume_s_per_record)
                 ) / consumers + \
        (costs.handoff_s_per_slot if trace.shared and consumers > 1 else 0.0)
    f = costs.cpu_contention_factor
    c.chain_cpu, c.cpu, c.consume = c.chain_cpu * f, c.cpu * f, c.consume * f


def actor_cpu_seconds(trace: Trace, costs: Costs) -> np.ndarray:
    """Per actor (in :attr:`Trace.actors` order), the CPU seconds of its traced steps:
    its reads' CPU and its own share of consuming, without any waiting. What a rank's
    ``cpu_seconds.loop`` in ``bench read`` measures when every node runs one rank, and,
    being linear in the CPU costs, what ``bench/scale_calibrate.py`` fits them on."""
    costs_of, _ = step_costs(trace, costs)
    out = np.zeros(len(trace.actors))
    for step, c in zip(trace.steps, costs_of, strict=True):
        out[step.actor] += c.cpu + c.chain_cpu + c.consume
    return out


def _result(trace: Trace, costs_of: list[StepCost], fetched: np.ndarray, end: float,
            crit: dict[str, float]) -> EpochResult:
    """The :class:`EpochResult` of the traced steps taking ``end`` seconds, scaled to one
    epoch when fewer iterations were traced."""
    scale = trace.epoch_iterations / max(trace.iterations, 1)
    records = sum(s.records for s in trace.steps)
    return EpochResult(
        strategy=trace.strategy, ranks=trace.ranks, nodes=trace.nodes,
        seconds=float(end * scale),
        samples_per_second=float(records / end) if end > 0 else float("inf"),
        breakdown={k: v * scale for k, v in crit.items()},
        pages=trace.page_totals(),
        node_fs_bytes=[int(f * trace.psize * scale) for f in fetched],
        requests={"sync": int(sum(c.sync_requests for c in costs_of) * scale),
                  "async": int(sum(c.async_requests for c in costs_of) * scale)},
        speculative={"prefetched": sum(s.prefetched_pages for s in trace.steps),
                     "missed": sum(s.missed_pages for s in trace.steps),
                     "redundant": sum(s.redundant_pages for s in trace.steps)},
        scale=scale,
        extra={"records_traced": records, "traced_seconds": end,
               "iterations_traced": trace.iterations,
               "epoch_iterations": trace.epoch_iterations,
               "batches_per_slot": trace.batches_per_slot})


def _independent(trace: Trace, costs_of: list[StepCost]) -> tuple[float, dict[str, float]]:
    """Actors that never wait for each other: each one's steps back to back (an asked-for
    read overlaps the previous step's CPU), its node's workers alongside."""
    per = {a.index: {"io": 0.0, "cpu": 0.0, "consume": 0.0, "messages": 0.0, "t": 0.0,
                     "overlap": 0.0} for a in trace.actors}
    for step, c in zip(trace.steps, costs_of, strict=True):
        p = per[step.actor]
        hidden = min(c.io_async, p["overlap"])
        io = c.io_sync + c.chain_io + c.chain_ready + c.io_async - hidden
        own = c.consume  # a colocated reader consumes its own share; a naive rank all
        p["io"] += io
        p["cpu"] += c.cpu + c.chain_cpu
        p["consume"] += own
        p["messages"] += c.message
        p["t"] += io + c.cpu + c.chain_cpu + own + c.message
        p["overlap"] = c.cpu + c.chain_cpu + own
    return _worst(trace, per, costs_of)


def _worst(trace: Trace, per: dict[int, dict[str, float]], costs_of: list[StepCost]
           ) -> tuple[float, dict[str, float]]:
    """The slowest actor's time against its node's other workers' (hand-offs and copies
    of their shares, in parallel with the reader)."""
    worker = {a.index: 0.0 for a in trace.actors}
    for step, c in zip(trace.steps, costs_of, strict=True):
        worker[step.actor] += c.consume
    best, crit = 0.0, {}
    for a in trace.actors:
        p = per[a.index]
        t = max(p["t"], worker[a.index] if a.consumers > 1 else 0.0)
        if t >= best:
            best = t
            crit = {"io": p["io"], "cpu": p["cpu"], "consume": p["consume"],
                    "messages": p["messages"], "wait": max(0.0, t - (p["io"] + p["cpu"]
                                                                     + p["consume"]
                                                                     + p["messages"]))}
    return best, crit


def poll_delay(waited: float, costs: Costs) -> float:
    """How long after its cursor arrived a DM reader notices it, when it had been waiting
    ``waited`` seconds for it (0 when it had not: its first test finds it).

    The reader tests the request, sleeps, tests again (:func:`lmdbio.mpiutil.
    wait_with_timeout`): the sleeps start at ``poll_first_sleep_s`` and double up to
    ``poll_max_sleep_s``, and each lasts ``poll_overshoot_s`` longer than asked. While the
    sleeps double (a handful) the cursor is noticed at the first test at or after
    ``waited``. After that the tests come every ``poll_max_sleep_s + poll_overshoot_s``,
    and where they fall against the cursor's arrival is taken as random (the sleeps vary;
    a fixed schedule made the model's chains lock onto a whole period per hop, or none):
    half a period on average."""
    if waited <= 0:
        return 0.0
    t, sleep = 0.0, costs.poll_first_sleep_s
    while sleep < costs.poll_max_sleep_s:  # the doubling sleeps
        t += sleep + costs.poll_overshoot_s
        if t >= waited:
            return t - waited
        sleep *= 2
    return (costs.poll_max_sleep_s + costs.poll_overshoot_s) / 2


def _chain(trace: Trace, costs_of: list[StepCost], costs: Costs
           ) -> tuple[float, dict[str, float]]:
    """The DM chains, slot by slot: a reader's walk waits for the cursor (noticed at its
    first test after it came: :func:`poll_delay`) and for itself."""
    n = len(trace.actors)
    free = np.zeros(n)  # when each reader has finished its previous slot
    arrive = 0.0  # when the cursor for the next reader arrives
    per = {a.index: {"io": 0.0, "cpu": 0.0, "consume": 0.0, "messages": 0.0, "t": 0.0}
           for a in trace.actors}
    by_slot: dict[int, list[tuple[Step, StepCost]]] = {}
    for step, c in zip(trace.steps, costs_of, strict=True):
        by_slot.setdefault(step.slot, []).append((step, c))
    for slot in sorted(by_slot):
        for step, c in by_slot[slot]:
            r = step.actor
            p = per[r]
            prefetch_done = free[r] + c.io_async  # asked for as soon as the reader is free
            cursor = arrive if (r > 0 or slot > 0) else 0.0
            start = max(free[r], cursor) + poll_delay(cursor - free[r], costs)
            ready = max(0.0, free[r] + c.chain_ready - start)
            chain_end = start + ready + c.chain_io + c.chain_cpu
            arrive = chain_end + c.message
            rest = max(0.0, prefetch_done - chain_end) + c.io_sync + c.cpu + c.consume
            free[r] = chain_end + rest
            p["io"] += ready + c.chain_io + c.io_sync + max(0.0, prefetch_done - chain_end)
            p["cpu"] += c.chain_cpu + c.cpu
            p["consume"] += c.consume
            p["messages"] += c.message
            p["t"] = free[r]
    return _worst(trace, per, costs_of)
