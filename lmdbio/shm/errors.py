"""The exceptions of the batch ring; all are :class:`~lmdbio.errors.LmdbioError`."""

from __future__ import annotations

from lmdbio.errors import LmdbioError

__all__ = [
    "RingAbortedError",
    "RingError",
    "RingTimeoutError",
    "SlotCapacityError",
    "SlotCorruptError",
]


class RingError(LmdbioError):
    """The batch ring was used against its protocol (wrong role, wrong order, closed ring)."""


class SlotCapacityError(RingError):
    """A batch does not fit into a ring slot.

    ``what`` is the area that overflowed (``"payload bytes"``, ``"records"``, ``"key bytes"``),
    ``needed`` and ``available`` are in the unit of that area.
    """

    def __init__(self, what: str, needed: int, available: int, where: str = "") -> None:
        self.what = what
        self.needed = int(needed)
        self.available = int(available)
        hint = {
            "payload bytes": "payload_bytes (e.g. from lmdbio.shm.payload_bytes_for(sizes, batch))",
            "records": "max_records",
            "key bytes": "key_bytes",
        }.get(what, what)
        prefix = f"{where}: " if where else ""
        super().__init__(
            f"{prefix}batch needs {self.needed} {what} but a ring slot holds {self.available}; "
            f"create the ring with a larger {hint}, or grow it with BatchRing.resize between "
            "batches"
        )


class SlotCorruptError(RingError):
    """A slot failed validation on a worker (bad magic, sequence, bounds or checksum).

    Carries ``slot``, ``seq``, ``epoch``, ``iteration`` and ``part`` (``-1`` where unknown) so
    the report names the batch. The ring has already released the slot when this is raised,
    so the caller may skip the batch and call ``next_slot`` again.
    """

    def __init__(
        self,
        what: str,
        *,
        slot: int,
        seq: int,
        epoch: int = -1,
        iteration: int = -1,
        part: int = -1,
    ) -> None:
        self.what = what
        self.slot = int(slot)
        self.seq = int(seq)
        self.epoch = int(epoch)
        self.iteration = int(iteration)
        self.part = int(part)
        super().__init__(
            f"ring slot {self.slot} (sequence {self.seq}, epoch {self.epoch}, iteration "
            f"{self.iteration}, part {self.part}): {what}"
        )


class RingTimeoutError(RingError):
    """A ring operation waited longer than its timeout; the message says what for."""


class RingAbortedError(RingError):
    """Another rank of the node aborted the ring (it raised, was signalled or exited).

    ``source`` is that rank in the node communicator, ``reason`` its message.
    """

    def __init__(self, source: int, reason: str, me: int) -> None:
        self.source = int(source)
        self.reason = reason
        super().__init__(
            f"node rank {me}: the batch ring was aborted by node rank {self.source}: {reason}"
        )
