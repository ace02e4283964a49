"""A loader's epoch schedule and resume state: pure bookkeeping, no MPI, no I/O.

:class:`EpochSchedule` says which epoch the next ``for`` loop delivers, from which batch
to which stop, where the trainer is in it, and what a saved state holds and restores.
:class:`EpochSlots` says in which slots an epoch's batches travel (runs of
``batches_per_slot`` consecutive batches, the readers' unit of work) and how many of them
a reader has published at a given point: what a worker that leaves an epoch early must
still take from the ring. :func:`batch_bounds` cuts a slot's records into its batches.

Every rank computes the same schedule from the same arguments: that is what keeps the
readers and the workers of a job in step without talking.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdbio.errors import ConfigError, LmdbioError
from lmdbio.plan.epoch import slot_groups

#: the state entries that must be the same when a state is loaded as when it was saved
RESUME_INVARIANTS = ("seed", "shuffle", "batch_size", "last", "consumers", "snapshot")


@dataclass(frozen=True)
class EpochSlots:
    """The slots that carry batches ``start .. end - 1`` of an epoch, ``per_slot``
    consecutive batches each (:func:`lmdbio.plan.epoch.slot_groups`: the epoch's runs from
    batch 0 on, so an epoch resumed inside a run starts with the rest of that run)."""

    start: int
    end: int
    per_slot: int
    groups: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, start: int, end: int, per_slot: int) -> EpochSlots:
        """The slots of batches ``start .. end - 1``, as readers and workers derive them."""
        return cls(start, end, per_slot, tuple(slot_groups(start, end, per_slot)))

    def __len__(self) -> int:
        return len(self.groups)

    def slot_of(self, iteration: int) -> int:
        """Index in :attr:`groups` of the slot carrying batch ``iteration``."""
        per = max(self.per_slot, 1)
        return iteration // per - self.start // per

    def batches_in_slot_of(self, iteration: int) -> int:
        """Batches in the slot that carries ``iteration``."""
        return self.groups[self.slot_of(iteration)][1]

    def read_ahead_limit(self, iteration: int, depth: int) -> int:
        """Slots a reader has published once batch ``iteration`` is taken, reading up to
        ``depth`` slots ahead of the one that carries it."""
        return min(len(self.groups), self.slot_of(iteration) + depth)

    def published(self, position: int, depth: int, *, shared: bool, dedicated: bool) -> int:
        """Slots of this epoch the node's reader has published (or will) for a worker
        that took the batches before ``position`` and leaves: all of them for a dedicated
        reader (it reads the epoch whatever the workers do), the colocated read-ahead at
        the last batch taken, none where every rank reads for itself."""
        if not shared:
            return 0
        if dedicated:
            return len(self.groups)
        return self.read_ahead_limit(max(position - 1, self.start), depth)


def batch_bounds(sizes: np.ndarray, worker: int, first: int, count: int,
                 records: int) -> np.ndarray:
    """Record bounds of a slot's ``count`` batches (from batch ``first``) within worker
    ``worker``'s ``records`` records of it: ``sizes`` is the epoch plan's records per
    batch and worker (``EpochPlan.sizes``)."""
    if count == 1:
        return np.array([0, records], np.int64)
    bounds = np.zeros(count + 1, np.int64)
    np.cumsum(sizes[first:first + count, worker], out=bounds[1:])
    if int(bounds[-1]) != records:
        raise LmdbioError(f"internal: a slot of {count} batches from iteration {first} "
                          f"holds {records} records for worker {worker}, the plan "
                          f"{int(bounds[-1])}")
    return bounds


def whole_first_slot_batches(iterations: int, per_slot: int) -> int:
    """Batches in the first slot of an epoch of ``iterations`` batches run whole."""
    slots = EpochSlots.of(0, iterations, per_slot)
    return slots.groups[0][1] if slots.groups else 0


def epoch_length(whole: int, stop: int) -> int:
    """Batches an epoch of ``whole`` batches delivers when stopped at ``stop`` (0: whole)."""
    return min(stop, whole) if stop else whole


def check_resumable(saved: dict[str, Any], mine: dict[str, Any],
                    keys: Sequence[str] = RESUME_INVARIANTS) -> None:
    """Raise :class:`ConfigError` where a saved state's ``keys`` differ from this job's:
    an exact resume needs the same data, order and world (a key the state lacks never
    matches)."""
    for key in keys:
        saved_value: Any = saved.get(key)
        if list(np.atleast_1d(saved_value)) != list(np.atleast_1d(mine[key])):
            raise ConfigError(f"load_state_dict: {key} was {saved.get(key)!r} when the "
                              f"state was saved but is {mine[key]!r} now; an exact "
                              "resume needs the same data, order and world")


class EpochSchedule:
    """Which epoch the next loop delivers, where it starts and stops, where the trainer is.

    ``epoch``: the epoch the next (or current) loop delivers. ``start_iteration`` and
    ``stop_iteration``: where the next loop starts and stops (0: its end).
    ``position``: batches consumed in the current epoch. ``job_base``: the job's
    iterations before the current epoch's batch 0 (each finished epoch counts its length
    or its stop), so the job's iteration is ``job_base + position``. ``resumed``:
    ``(epoch, iteration, stop)`` of a state loaded and not yet resumed. ``epoch_chosen``:
    :meth:`set_epoch` or :meth:`load` named the next epoch (leaving an epoch early then does
    not move on to the one after it).
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.start_iteration = 0
        self.stop_iteration = 0
        self.position = 0
        self.job_base = 0
        self.resumed: tuple[int, int, int] | None = None
        self.epoch_chosen = False

    def set_epoch(self, epoch: int, stop_iteration: int | None = None) -> None:
        """Choose the next loop's epoch and stop (see :meth:`loaders.loader.Loader.
        set_epoch`): the same epoch keeps its start and, with ``None``, its stop."""
        if stop_iteration is None:
            stop = self.stop_iteration if int(epoch) == self.epoch else 0
        else:
            stop = int(stop_iteration)
        if stop < 0:
            raise ConfigError(f"set_epoch: stop_iteration must be >= 0, got {stop}")
        if int(epoch) != self.epoch:
            self.start_iteration = 0
        self.epoch = int(epoch)
        self.stop_iteration = stop
        self.epoch_chosen = True

    def job(self, epochs: int, max_iterations: int, per_epoch: int) -> Iterator[int]:
        """The job's epochs, each chosen before it is yielded (see
        :meth:`loaders.loader.Loader.epochs`): ``epochs`` of ``per_epoch`` batches, the last
        stopped at ``max_iterations`` (counted across epochs, from a loaded state's
        ``job_iteration``)."""
        from lmdbio.plan.epoch import job_epochs

        epoch0, start0, stop0 = self.resumed if self.resumed is not None else (0, 0, 0)
        base = self.job_base if self.resumed is not None else 0
        schedule = job_epochs(epochs, max_iterations, per_epoch, epoch=epoch0,
                              iteration=start0, done=base + start0)
        if start0 and schedule and schedule[0][1] != stop0:
            raise ConfigError(cut_mismatch(max_iterations, per_epoch, schedule[0][1], epoch0,
                                           start0, stop0, base))
        for epoch, stop in schedule:
            self.job_base = base
            self.set_epoch(epoch, stop)
            yield epoch
            base += stop or per_epoch
            self.job_base = base

    def begin(self) -> tuple[int, int]:
        """The next loop's ``(start, stop)``, checked against each other and against a
        loaded state's stop; consumes the loaded state. Call :meth:`enter` once the epoch
        has begun."""
        start, stop = self.start_iteration, self.stop_iteration
        if 0 < stop < start:
            raise ConfigError(f"epoch {self.epoch}: stop_iteration {stop} is before the "
                              f"batch the loop starts at ({start})")
        resumed, self.resumed = self.resumed, None
        if resumed is not None and start > 0 and resumed[:2] == (self.epoch, start) \
                and resumed[2] != stop:
            raise ConfigError(f"epoch {self.epoch}: the state loaded stops this epoch at "
                              f"{resumed[2] or 'its end'}, this loop at {stop or 'its end'}: "
                              "where an epoch stops decides which records its batches "
                              "carry, so a run resumed inside it must stop where the "
                              "saved run did")
        return start, stop

    def enter(self, start: int) -> None:
        """The loop of :meth:`begin` runs from batch ``start``: the next one is unchosen."""
        self.start_iteration = self.stop_iteration = 0
        self.epoch_chosen = False
        self.position = start

    def end(self, ran: int) -> None:
        """The epoch ended after ``ran`` batches (its length or its stop): the next one."""
        self.job_base += ran
        self.epoch += 1
        self.position = 0

    def left(self, ran: int) -> None:
        """The trainer left the epoch early (it ran ``ran`` batches, as the readers see it):
        an epoch chosen since starts from its start, otherwise the next one follows."""
        if self.epoch_chosen:
            self.position = self.start_iteration
        else:
            self.end(ran)

    def state(self, stop: int) -> dict[str, int]:
        """The position part of a state: epoch, batches consumed in it, the job's
        iteration, and ``stop`` (the epoch's stop as delivered, 0: its end)."""
        return {"epoch": self.epoch, "iteration": self.position,
                "job_iteration": self.job_base + self.position, "stop_iteration": stop}

    def load(self, state: dict[str, Any], per_epoch: int) -> None:
        """Resume at ``state`` (of :meth:`state`): the next loop starts at its batch.
        A state saved before ``job_iteration`` was kept counts every earlier epoch whole
        (``per_epoch`` batches)."""
        self.epoch = int(state["epoch"])
        self.start_iteration = int(state["iteration"])
        self.stop_iteration = int(state.get("stop_iteration", 0))
        job = int(state.get("job_iteration", self.epoch * per_epoch + self.start_iteration))
        self.job_base = job - self.start_iteration
        self.resumed = (self.epoch, self.start_iteration, self.stop_iteration)
        self.epoch_chosen = True


def cut_mismatch(limit: int, per: int, stop: int, epoch: int, start: int, saved: int,
                 base: int) -> str:
    """The error of a resume whose ``max_iterations`` (``limit``) cuts the saved epoch
    elsewhere than the saved run did."""
    ends = f"inside epoch {epoch} at batch {stop}" if stop else \
        f"after epoch {epoch} whole"
    fits = f"{base + saved}" if saved else f"0 or at least {base + per}"
    return (f"max_iterations {limit} ends this job {ends}, but the state loaded was "
            f"saved at batch {start} of epoch {epoch}, in a run that stopped that "
            f"epoch {f'at batch {saved}' if saved else 'at its end'}: which records "
            "a cut epoch's batches carry depends on where it is cut, so a run resumed "
            f"inside it must cut it there too (max_iterations {fits}, or at most "
            f"{base + start} to end the job where it was saved)")
