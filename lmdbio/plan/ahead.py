"""Epoch plans made several epochs at a time, where they are small.

A shuffled epoch's plan (:func:`lmdbio.plan.epoch.plan_epoch`) is a seeded permutation and
a few whole-array steps: some 30 us of CPU on 600 records when the code runs warm. A loader
asks for it right after its transform kernel has written a batch, and then the same work
cost 190 us a rank and epoch (2-core VM, ImageNet-like batches of 32: the interpreter's
code and data are no longer in the caches; the first ``default_rng`` call alone took
60-100 us). On a small data set, whose epochs last a few milliseconds, that was a tenth of
what a rank spent outside the kernel. :class:`PlansAhead` makes the plans of the next
few epochs in one go, while that code is warm, as long as they hold at most
:data:`AHEAD_RECORDS` records together; on larger data sets it makes one plan at a time,
where an epoch's own work dwarfs its plan.

Plans are pure functions of the epoch (and of what the session fixed when it opened), so
a plan made ahead is the plan made on time. Their arrays are read-only: one plan object
is handed to everyone who asks for that epoch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lmdbio.plan.epoch import EpochPlan

__all__ = ["AHEAD_EPOCHS", "AHEAD_RECORDS", "PlansAhead", "epochs_ahead", "freeze"]

#: at most this many records in the plans made in one go
AHEAD_RECORDS = 1 << 15
#: and at most this many epochs
AHEAD_EPOCHS = 8


def epochs_ahead(n_records: int, records: int = AHEAD_RECORDS, most: int = AHEAD_EPOCHS
                 ) -> int:
    """How many epochs' plans to make in one go for a data set of ``n_records``: as many
    as hold ``records`` records together, between 1 and ``most``."""
    return max(1, min(most, records // max(n_records, 1)))


def freeze(plan: EpochPlan) -> EpochPlan:
    """``plan`` with its arrays read-only (it is shared by everyone who asks for it)."""
    for array in (plan.order, plan.table, plan.sizes, plan.pad, plan.dropped):
        array.flags.writeable = False
    return plan


class PlansAhead:
    """The plans ``make(epoch)`` of one session's epochs, made ``ahead`` at a time.

    :meth:`get` of an epoch not made yet makes it and the ``ahead - 1`` after it, and
    forgets every plan outside them but the epoch just before it (a worker may still ask
    for the epoch it is finishing): at most ``ahead + 1`` plans are kept."""

    def __init__(self, make: Callable[[int], EpochPlan], ahead: int) -> None:
        if ahead < 1:
            raise ValueError(f"PlansAhead needs ahead >= 1, got {ahead}")
        self.make, self.ahead = make, ahead
        self._plans: dict[int, EpochPlan] = {}
        #: plans made so far (what tests and measurements read)
        self.made = 0
        # a dedicated node's worker plans the next epoch on its decoding thread while the
        # trainer's thread may begin one
        self._lock = threading.Lock()

    def get(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` (read-only arrays). Thread-safe."""
        with self._lock:
            plan = self._plans.get(epoch)
            if plan is not None:
                return plan
            self._plans = {e: p for e, p in self._plans.items()
                           if epoch - 1 <= e < epoch + self.ahead}
            for e in range(epoch, epoch + self.ahead):
                if e not in self._plans:
                    self._plans[e] = freeze(self.make(e))
                    self.made += 1
            return self._plans[epoch]

    def __len__(self) -> int:
        return len(self._plans)
