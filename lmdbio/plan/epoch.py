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

Slot groups (``blocked`` scheme, ``group`` D > 1 with the consumers per node): a node ring
carries D consecutive batches of every worker per slot. Iterations ``gD .. gD + d - 1``
then take the positions ``[gD*G, (gD + d)*G)`` (``d`` = D, or what is left at the end)
and every node a contiguous block of them, its iterations one after the other: a reader
that walks to its records (LMM, the DM chains) reaches a whole slot with one walk and one
cursor hand-off instead of D. Within one iteration a node's records stay contiguous. The
delivery order then depends on D as well (docs/reading.md, "Slot groups"). A run that
stops inside a group (``split``) has that group laid out as two, cut where it stops, so
that a node's records before the stop are still one run (the order of the iterations
before the stop then depends on it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

#: what becomes of an epoch's last, incomplete global batch (``batch.last``; see above)
LastBatch = Literal["pad", "drop", "partial"]
#: the epoch orders (``shuffle.mode``; see :func:`plan_epoch`)
ShuffleMode = Literal["none", "global", "block"]
#: the last-batch policies, from :data:`LastBatch` (the one declaration)
LAST_POLICIES: tuple[str, ...] = get_args(LastBatch)
#: the shuffle modes, from :data:`ShuffleMode` (the one declaration)
SHUFFLE_MODES: tuple[str, ...] = get_args(ShuffleMode)


@dataclass(frozen=True)
class EpochPlan:
    """The delivery order of one epoch.

    ``table[i, c, :sizes[i, c]]`` are the global record indices consumer ``c`` gets in
    iteration ``i``; ``pad[i, c, k]`` flags entries that repeat a record as padding.
    ``order`` is the epoch's permutation of record indices (identity when not shuffled).
    """

    n_records: int
    consumers: int
    batch: int
    last: str
    scheme: str
    order: np.ndarray
    table: np.ndarray
    sizes: np.ndarray
    pad: np.ndarray
    dropped: np.ndarray
    #: iterations per slot group (1: plain ``blocked`` order); groups start at iteration 0
    group: int = 1
    #: an iteration where a slot group is cut in two (the run stops there), or 0
    split: int = 0

    @property
    def iterations(self) -> int:
        return int(self.table.shape[0])

    def records(self, iteration: int, consumer: int) -> np.ndarray:
        """Global record indices for one consumer in one iteration (padding included)."""
        return self.table[iteration, consumer, :self.sizes[iteration, consumer]]

    def padding(self, iteration: int, consumer: int) -> np.ndarray:
        """True for the entries of :meth:`records` that are padding (wrapped around)."""
        return self.pad[iteration, consumer, :self.sizes[iteration, consumer]]

    def consumer_records(self, consumer: int) -> np.ndarray:
        """Everything one consumer gets this epoch, in delivery order."""
        parts = [self.records(i, consumer) for i in range(self.iterations)]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def group_records(self, iteration: int, first: int, count: int) -> np.ndarray:
        """Records of consumers ``first .. first+count-1`` (a node's workers) in one
        iteration, consumer after consumer."""
        return self._group(self.table, iteration, first, count)

    def group_padding(self, iteration: int, first: int, count: int) -> np.ndarray:
        """:meth:`padding` of :meth:`group_records`' entries."""
        return self._group(self.pad, iteration, first, count)

    def _group(self, arr: np.ndarray, iteration: int, first: int, count: int) -> np.ndarray:
        rows = arr[iteration, first:first + count]
        sizes = self.sizes[iteration, first:first + count]
        if bool((sizes == arr.shape[2]).all()):  # full batches: one contiguous block
            view = rows.reshape(-1)  # a view of the plan: read-only
            view.flags.writeable = False
            return view
        parts = [rows[k, :sizes[k]] for k in range(rows.shape[0])]
        return np.concatenate(parts) if parts else np.empty(0, arr.dtype)

    def slot_records(self, iteration: int, iterations: int, first: int, count: int,
                     *, worker_major: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Records and padding flags of consumers ``first .. first+count-1`` over iterations
        ``iteration .. iteration+iterations-1``: iteration after iteration (each as
        :meth:`group_records`), or with ``worker_major`` consumer after consumer (each
        consumer's batches back to back, as a node ring's slot holds them). One slice of
        the plan when every batch is full, whatever the number of batches."""
        its = slice(iteration, iteration + iterations)
        cons = slice(first, first + count)
        if bool((self.sizes[its, cons] == self.table.shape[2]).all()):
            rows, pad = self.table[its, cons], self.pad[its, cons]
            if worker_major:
                rows, pad = rows.transpose(1, 0, 2), pad.transpose(1, 0, 2)
            rows, pad = rows.reshape(-1), pad.reshape(-1)
            rows.flags.writeable = pad.flags.writeable = False  # may be views of the plan
            return rows, pad
        pairs = [(i, c) for c in range(first, first + count)
                 for i in range(iteration, iteration + iterations)] if worker_major else \
            [(i, c) for i in range(iteration, iteration + iterations)
             for c in range(first, first + count)]
        if not pairs:
            return np.empty(0, self.table.dtype), np.empty(0, bool)
        return (np.concatenate([self.records(i, c) for i, c in pairs]),
                np.concatenate([self.padding(i, c) for i, c in pairs]))

    def group_sizes(self, iteration: int, first: int, count: int) -> np.ndarray:
        return self.sizes[iteration, first:first + count].copy()

    def contiguous_slot(self, first: int, count: int) -> bool:
        """Whether iterations ``first .. first + count - 1`` lie in one slot group, so that
        every node's records of them are one contiguous run of the order."""
        g = self.group
        return count == 1 or (g > 1 and self._group_of(first) == self._group_of(first + count - 1)
                              and first + count <= self.iterations)

    def _group_of(self, iteration: int) -> tuple[int, bool]:
        """The slot group of ``iteration``: its number, and whether it is the part after
        :attr:`split` of a group cut there."""
        g = iteration // self.group
        return g, bool(self.split) and g == self.split // self.group and iteration >= self.split


def iterations_per_epoch(n_records: int, consumers: int, batch: int, last: str) -> int:
    """Number of batches every consumer gets in one epoch."""
    g = batch * consumers
    if last == "drop":
        return n_records // g
    return -(-n_records // g)


def scheme_iterations(n_records: int, consumers: int, batch: int, last: str,
                      scheme: str) -> int:
    """Iterations of one epoch under ``scheme`` (:func:`plan_epoch`'s ``iterations``,
    without planning it)."""
    if scheme == "blocked":
        return iterations_per_epoch(n_records, consumers, batch, last)
    per = _shard_size(n_records, consumers, last)
    return -(-per // batch) if last != "drop" else per // batch


def iteration_schedule(plan_iters: int, iters: int) -> list[tuple[int, int]]:
    """``(epoch, iteration)`` pairs of a run of ``iters`` iterations over epochs of
    ``plan_iters`` iterations each, wrapping into new epochs (empty when an epoch has no
    iteration): the order in which ``lmdbio bench read`` and the scaling tracer step."""
    out = []
    e = i = 0
    while len(out) < iters and plan_iters > 0:
        out.append((e, i))
        i += 1
        if i == plan_iters:
            e, i = e + 1, 0
    return out


def slot_groups(start: int, end: int, per_slot: int) -> list[tuple[int, int]]:
    """The ``(first iteration, batches)`` of the slots that carry iterations ``start ..
    end - 1``: the epoch's runs of ``per_slot`` iterations from iteration 0 on (the slot
    groups of the epoch plan), the last one shorter; an epoch resumed inside a run starts
    with the rest of that run. Readers and workers derive the same runs from the same
    arguments; iteration ``i`` travels in slot ``i // per_slot - start // per_slot``."""
    per = max(per_slot, 1)
    starts = [start, *range(start // per * per + per, end, per)] if start < end else []
    return [(i, slot_length(i, end, per)) for i in starts]


def slot_length(iteration: int, end: int, per_slot: int) -> int:
    """Batches in the slot that starts at ``iteration`` (:func:`slot_groups`): up to the
    next multiple of ``per_slot``, or to ``end``."""
    per = max(per_slot, 1)
    return min(per - iteration % per, end - iteration)


def schedule_slots(schedule: list[tuple[int, int]],
                   per_slot: int) -> list[tuple[int, int, int]]:
    """``(epoch, first iteration, batches)`` of the ring slots that carry ``schedule``
    (every epoch's iterations from 0 on): each epoch's
    :func:`slot_groups`, the last one cut where the schedule ends."""
    ends: dict[int, int] = {}
    for epoch, it in schedule:
        ends[epoch] = it + 1
    return [(epoch, first, count) for epoch, end in ends.items()
            for first, count in slot_groups(0, end, per_slot)]


def job_epochs(epochs: int, max_iterations: int, epoch_iterations: int, *,
               epoch: int = 0, iteration: int = 0, done: int = 0) -> list[tuple[int, int]]:
    """``(epoch, stop_iteration)`` of every epoch a job runs: ``epochs`` of them, or fewer
    when ``max_iterations`` (counted across epochs, as Caffe's solver ``max_iter``; 0: no
    limit) ends the job first, in which case the last one stops inside itself (``stop``
    as :meth:`loaders.Loader.set_epoch` takes it; 0: the epoch runs whole). An epoch of
    no iterations cannot bring the limit nearer, so it never shortens the job.

    A resumed job starts at batch ``iteration`` of epoch ``epoch``, ``done`` iterations of
    it having run before that batch (epochs cut by an earlier, smaller limit count what
    they ran): the list is then the rest of the job, empty when the limit is reached."""
    if min(epochs, max_iterations, epoch_iterations, epoch, iteration, done) < 0:
        raise ValueError(f"job_epochs: negative count (epochs={epochs}, max_iterations="
                         f"{max_iterations}, epoch_iterations={epoch_iterations}, epoch="
                         f"{epoch}, iteration={iteration}, done={done})")
    limited = bool(max_iterations and epoch_iterations)
    out: list[tuple[int, int]] = []
    for e in range(epoch, epochs):
        start = iteration if e == epoch else 0
        stop = 0
        if limited:
            left = max_iterations - done
            if left <= 0:
                break
            if start + left < epoch_iterations:
                stop = start + left
        out.append((e, stop))
        if stop:
            break
        done += epoch_iterations - start
    return out


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


SCHEMES = ("blocked", "stride", "shard")


def _shard_size(n_records: int, consumers: int, last: str) -> int:
    """Records in each consumer's contiguous shard (``shard`` scheme): ``ceil(N/C)``, the
    last shards padded at their own end; under ``drop`` ``floor(N/C)``, so that every shard
    is full and the remainder is what is dropped (never padding)."""
    if last == "drop":
        return n_records // consumers
    return -(-n_records // consumers)


def _grouped_positions(consumers: int, batch: int, iters: int, group: int,
                       node_consumers: tuple[int, ...], split: int = 0) -> np.ndarray:
    """``blocked`` positions by slot group (module docstring): iteration ``i`` is batch
    ``j = i - first`` of the group that starts at iteration ``first`` (a multiple of D, or
    ``split``, which cuts its group in two) and holds ``d`` iterations; consumer ``c``,
    the ``l``-th of a node whose consumers start at ``c0`` and number ``cn``, takes
    ``[first*G + d*B*c0 + j*B*cn + l*B, ... + B)``."""
    g = batch * consumers
    c0 = np.repeat(np.cumsum((0, *node_consumers))[:-1], node_consumers)
    cn = np.repeat(np.asarray(node_consumers, np.int64), node_consumers)
    it = np.arange(iters)
    first = it // group * group
    end = np.minimum(first + group, iters)
    if split:
        cut = first == split // group * group
        end = np.where(cut & (it < split), split, end)
        first = np.where(cut & (it >= split), split, first)
    d = end - first
    j = it - first
    c = np.arange(consumers)
    start = (first * g)[:, None] + (d * batch)[:, None] * c0[None, :] + \
        (j * batch)[:, None] * cn[None, :] + ((c - c0) * batch)[None, :]
    return start[:, :, None] + np.arange(batch)[None, None, :]


def _positions(n_records: int, consumers: int, batch: int, last: str, scheme: str,
               iters: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions in the epoch order for every (iteration, consumer, slot), and the sizes.

    ``blocked``: iteration ``i`` takes positions ``[i*G, (i+1)*G)`` and consumer ``c`` the
    ``c``-th run of ``batch`` of them (a node's consumers are contiguous: one range per
    node). ``stride``: consumer ``c`` takes positions ``c, c+C, c+2C, ...`` (BVLC Caffe /
    Caffe-MPI). ``shard``: consumer ``c`` takes a contiguous shard of ``ceil(N/C)``
    positions (DALI's ``shard_id``); shards are padded at their own end (``floor(N/C)``
    positions under ``drop``: :func:`_shard_size`).
    """
    g = batch * consumers
    i = np.arange(iters, dtype=np.int64)[:, None, None]
    c = np.arange(consumers, dtype=np.int64)[None, :, None]
    k = np.arange(batch, dtype=np.int64)[None, None, :]
    sizes = np.full((iters, consumers), batch, np.int64)
    if scheme == "blocked":
        pos = (i * g + c * batch) + k
        if last == "partial" and iters and n_records < iters * g:
            rem = n_records - (iters - 1) * g
            base, extra = divmod(rem, consumers)
            cc = np.arange(consumers)
            start = (iters - 1) * g + cc * base + np.minimum(cc, extra)
            sizes[-1] = base + (cc < extra)
            pos[-1] = start[:, None] + np.arange(batch)[None, :]
    elif scheme == "stride":
        pos = (i * g + c) + k * consumers
        if last == "partial" and iters:
            count = np.maximum(0, -(-(n_records - c[0, :, 0]) // consumers))  # per consumer
            sizes[:] = np.clip(count[None, :] - np.arange(iters)[:, None] * batch, 0, batch)
    else:  # shard
        shard = _shard_size(n_records, consumers, last)
        pos = (c * shard + i * batch) + k
        if last == "partial" and iters:
            ends = np.minimum((np.arange(consumers) + 1) * shard, n_records)
            own = np.maximum(ends - np.arange(consumers) * shard, 0)
            sizes[:] = np.clip(own[None, :] - np.arange(iters)[:, None] * batch, 0, batch)
    return pos, sizes


def _dropped(order: np.ndarray, table: np.ndarray, sizes: np.ndarray,
             pad: np.ndarray) -> np.ndarray:
    """The records of ``order`` that no consumer gets (``drop``'s tail), in epoch order."""
    delivered = np.zeros(order.shape[0], bool)
    real = (np.arange(table.shape[2])[None, None, :] < sizes[:, :, None]) & ~pad
    delivered[table[real]] = True
    return order[~delivered[order]]


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
    scheme: str = "blocked",
    group: int = 1,
    node_consumers: tuple[int, ...] | None = None,
    split: int = 0,
) -> EpochPlan:
    """The plan of one epoch (see the module docstring for the semantics).

    ``group`` > 1 with ``node_consumers`` (the consumers of each node, in consumer order,
    summing to ``consumers``) lays ``blocked`` epochs out by slot group; ignored for the
    other schemes and when the last batch is split (``partial`` with a short remainder).
    ``split``: an iteration inside a slot group where a run stops; that group is laid out
    as two, so that every node's records before it are still one run (a reader that walks
    to its records reads no other node's records the run never reads)."""
    if consumers < 1 or batch < 1:
        raise ValueError("consumers and batch must be >= 1")
    if last not in LAST_POLICIES:
        raise ValueError(f"last must be one of {LAST_POLICIES}, not {last!r}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, not {scheme!r}")
    order = _epoch_order(n_records, shuffle, seed, epoch, leaf_first, block_leaves, window)
    iters = scheme_iterations(n_records, consumers, batch, last, scheme)
    if node_consumers is not None and sum(node_consumers) != consumers:
        raise ValueError(f"node_consumers {node_consumers} do not add up to {consumers}")
    # slot groups need every batch full: not so only when ``partial`` splits the last one
    short_last = last == "partial" and iters > 0 and n_records < iters * batch * consumers
    if group > 1 and scheme == "blocked" and node_consumers is not None and not short_last:
        split = split if 0 < split < iters and split % group else 0
        pos = _grouped_positions(consumers, batch, iters, group, tuple(node_consumers), split)
        sizes = np.full((iters, consumers), batch, np.int64)
    else:
        pos, sizes = _positions(n_records, consumers, batch, last, scheme, iters)
        group, split = 1, 0
    if n_records == 0:
        table = np.zeros(pos.shape, np.int64)
        pad = np.zeros(pos.shape, bool)
        sizes[:] = 0
    else:
        table, pad = _record_table(pos, order, n_records, consumers, last, scheme,
                                   identity=shuffle == "none")
    # every record is delivered under ``pad`` and ``partial``: only ``drop`` leaves some out
    dropped = _dropped(order, table, sizes, pad) if last == "drop" else np.empty(0, np.int64)
    return EpochPlan(n_records, consumers, batch, last, scheme, order, table, sizes, pad,
                     dropped, group, split)


def _epoch_order(n_records: int, shuffle: str, seed: int, epoch: int,
                 leaf_first: np.ndarray | None, block_leaves: int, window: int) -> np.ndarray:
    """The epoch's order of the records: key order (``none``), a seeded permutation
    (``global``), or shuffled blocks of leaves (``block``, which needs ``leaf_first``)."""
    if shuffle == "none":
        return np.arange(n_records, dtype=np.int64)
    if shuffle == "global":
        return permutation(n_records, seed, epoch)
    if shuffle == "block":
        if leaf_first is None:
            raise ValueError("block shuffle needs the leaf directory (strategy indexed)")
        return block_order(leaf_first, seed, epoch, block_leaves, window)
    raise ValueError(f"shuffle must be one of {SHUFFLE_MODES}, not {shuffle!r}")


def _record_table(pos: np.ndarray, order: np.ndarray, n_records: int, consumers: int,
                  last: str, scheme: str, identity: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(table, pad)``: the record of every (iteration, consumer, slot) position of a
    non-empty epoch, and which positions are padding. Positions past the end wrap around
    to the start of the order; a shard wraps to its own start, as DALI's readers do.
    ``identity``: ``order`` is key order, so positions need no gather."""
    if scheme == "shard":
        shard = _shard_size(n_records, consumers, last)
        c = np.arange(consumers)[None, :, None]
        pad = (pos >= np.minimum((c + 1) * shard, n_records)) | (pos >= n_records)
    else:
        pad = pos >= n_records
    wraps = bool(pad.any())
    if not wraps:
        index = pos
    elif scheme != "shard" and int(pos.max()) < 2 * n_records:  # wrapped at most once
        index = np.subtract(pos, n_records, out=pos.copy(), where=pad)
    else:
        index = pos % n_records
    table = index if identity else order[index]
    if scheme == "shard" and wraps:
        c = np.broadcast_to(np.arange(consumers)[None, :, None], pos.shape)
        start = c * shard
        length = np.maximum(np.minimum((c + 1) * shard, n_records) - start, 1)
        table = np.where(pad, order[np.minimum(start + (pos - start) % length,
                                               n_records - 1)], table)
    return table, pad
