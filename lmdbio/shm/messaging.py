"""The batch ring's control plane: its small MPI messages, credits, timeouts and aborts.

* :class:`ControlChannel` - one rank's end of the node's control messages (READY, RELEASED,
  STOP, ABORT; 32 bytes each): one persistent ``Irecv``, non-blocking sends, a polling
  :meth:`~ControlChannel.wait` with a timeout, and abort propagation (an ABORT, with its
  reason, to every other rank; a received ABORT raises
  :class:`~lmdbio.shm.errors.RingAbortedError`).
* :class:`SlotCredits` - the reader's account of which workers still hold each slot.
* :class:`SlotInbox` - a worker's received READY/STOP messages and the sequence it expects.

The protocol these carry is described in :mod:`lmdbio.shm.ring`, which composes them with the
shared window of :mod:`lmdbio.shm.window`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.shm.errors import RingAbortedError, RingError, RingTimeoutError

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

__all__ = [
    "ABORT",
    "ABORT_GRACE",
    "READY",
    "RELEASED",
    "STOP",
    "ControlChannel",
    "SlotCredits",
    "SlotInbox",
]

log = logging.getLogger("lmdbio.shm")

#: how long an aborting rank waits for its ABORT messages to leave, and a receiver for the
#: reason text that follows an ABORT
ABORT_GRACE = 1.0
#: longest reason text sent with ABORT
_REASON_MAX = 2000

_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))

#: control message kinds: a message is ``(kind, slot, seq, extra)`` as four int64
READY, RELEASED, STOP, ABORT = 1, 2, 3, 4
KIND_NAMES = {READY: "READY", RELEASED: "RELEASED", STOP: "STOP", ABORT: "ABORT"}
_TAG_CTRL, _TAG_REASON = 1, 2

#: ``handler(kind, slot, seq, source)`` for a READY, RELEASED or STOP message
MessageHandler = Callable[[int, int, int, int], None]


class ControlChannel:
    """One rank's end of the ring's control messages over ``comm`` (see the module doc).

    ``handler`` gets every READY, RELEASED and STOP message; ABORT is handled here.
    ``role`` names this rank in timeout messages; ``fanout`` (the number of workers) bounds
    how many finished sends pile up before they are collected. Waits spin ``spin`` seconds,
    then sleep from 20 us doubling to ``max_sleep``; ``timeout`` is the default limit.
    """

    def __init__(self, MPI: Any, comm: MPI.Intracomm, handler: MessageHandler, *, role: str,
                 fanout: int, timeout: float, max_sleep: float, spin: float) -> None:
        self._MPI = MPI
        self._comm = comm
        self._handler = handler
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.role = role
        self._fanout = max(1, fanout)
        self.timeout = timeout
        self._max_sleep = max_sleep
        self._spin = spin
        self._ctrl = np.zeros(4, dtype=np.int64)
        self._status = MPI.Status()
        self._req: Any = None
        self._sends: list[tuple[Any, Any]] = []
        #: this rank's abort reason (``None`` while not aborted)
        self.abort_reason: str | None = None
        #: the error a peer's ABORT raised here (``None`` if none arrived)
        self.aborted_by: RingAbortedError | None = None
        #: whether the ring this channel serves was closed
        self.closed = False

    def start(self) -> None:
        """Post the persistent receive of control messages."""
        self._req = self._comm.Recv_init(self._ctrl, self._MPI.ANY_SOURCE, _TAG_CTRL)
        self._req.Start()

    # ------------------------------------------------------------------ messages
    def send(self, kind: int, slot: int, seq: int, dest: int, extra: int = 0) -> None:
        """Send a control message to node rank ``dest`` (non-blocking)."""
        buf = np.array([kind, slot, seq, extra], dtype=np.int64)
        self._sends.append((self._comm.Isend(buf, dest, _TAG_CTRL), buf))
        if len(self._sends) > 4 * self._fanout:
            self.sends_done()

    def sends_done(self) -> bool:
        """Collect finished sends; whether every send has left."""
        self._sends = [(r, b) for r, b in self._sends if not r.Test()]
        return not self._sends

    def pump(self) -> None:
        """Process every control message that has arrived (never blocks)."""
        req, ctrl = self._req, self._ctrl
        while req.Test(self._status):
            kind, slot, seq, extra = ctrl.tolist()
            src = self._status.Get_source()
            req.Start()
            if kind in (READY, RELEASED, STOP):
                self._handler(kind, slot, seq, src)
            elif kind == ABORT:  # slot carries the rank where the failure began
                reason = self._recv_reason(src, extra)
                origin = slot if 0 <= slot < self.size else src
                self.aborted_by = RingAbortedError(origin, reason, self.rank)
                raise self.aborted_by
            else:
                raise RingError(f"node rank {self.rank}: unknown control message kind {kind} "
                                f"from node rank {src}")

    def _recv_reason(self, src: int, n: int) -> str:
        if n <= 0:
            return "(no reason given)"
        deadline = time.monotonic() + ABORT_GRACE
        while not self._comm.Iprobe(src, _TAG_REASON):
            if time.monotonic() > deadline:
                return "(reason not received)"
            time.sleep(1e-4)
        data = bytearray(n)
        self._comm.Recv([data, self._MPI.BYTE], src, _TAG_REASON)
        return data.decode("utf-8", "replace")

    def stop_receiving(self) -> None:
        """Cancel and free the persistent receive (a no-op once done)."""
        if self._req is not None:
            req, self._req = self._req, None
            req.Cancel()
            req.Wait()
            req.Free()

    # ------------------------------------------------------------------ waiting
    def check_usable(self) -> None:
        """Raise the peer's :class:`RingAbortedError`, or :class:`RingError` if this rank
        aborted or the ring is closed."""
        if self.aborted_by is not None:
            raise self.aborted_by
        if self.abort_reason is not None:
            raise RingError(f"node rank {self.rank}: the batch ring was aborted "
                            f"({self.abort_reason})")
        if self.closed:
            raise RingError(f"node rank {self.rank}: the batch ring is closed")

    def wait(self, ready: Callable[[], bool], timeout: float | None,
             what: Callable[[], str]) -> float:
        """Pump messages until ``ready()``; returns the seconds waited.

        First ``spin`` seconds of ``Test`` + ``sched_yield`` (hands the core to a peer that
        shares it, returns at once otherwise), then sleeps doubling from 20 us to
        ``max_sleep``: a long wait costs a few hundred wake-ups per second, not a core.
        Raises :class:`RingTimeoutError` saying ``what()`` it waited for after ``timeout``
        seconds (default :attr:`timeout`).
        """
        self.check_usable()
        self.pump()
        if ready():
            return 0.0
        limit = self.timeout if timeout is None else float(timeout)
        t0 = time.perf_counter()
        deadline = t0 + limit
        spin_until = t0 + self._spin
        sleep = 2e-5
        while True:
            self.pump()
            if ready():
                return time.perf_counter() - t0
            now = time.perf_counter()
            if now >= deadline:
                raise RingTimeoutError(
                    f"node rank {self.rank} ({self.role}) waited {limit:g} s for {what()}"
                )
            if now < spin_until:
                _yield()
                continue
            time.sleep(min(sleep, deadline - now))
            sleep = min(sleep * 2, self._max_sleep)

    # ------------------------------------------------------------------ abort
    def abort(self, reason: str, grace: float = ABORT_GRACE) -> None:
        """Mark this rank aborted with ``reason`` and tell every other rank (ABORT, then the
        reason text) unless a peer's ABORT is why; wait at most ``grace`` seconds for the
        messages to leave and stop receiving. Never raises: a dying MPI must not mask the
        original error."""
        self.abort_reason = reason
        try:
            if self.aborted_by is None:
                raw = reason.encode("utf-8", "replace")[:_REASON_MAX]
                for dest in range(self.size):
                    if dest != self.rank:
                        self.send(ABORT, self.rank, -1, dest, len(raw))
                        self._sends.append(
                            (self._comm.Isend([raw, self._MPI.BYTE], dest, _TAG_REASON), raw))
            deadline = time.monotonic() + grace
            while not self.sends_done() and time.monotonic() < deadline:
                time.sleep(1e-4)
            self.stop_receiving()
        except Exception as exc:
            log.debug("node rank %d: while aborting the batch ring: %s", self.rank, exc)


class SlotCredits:
    """Reader: which workers still hold each of ``slots`` slots, and which batch each holds.

    A slot is free when every worker in ``workers`` (node ranks, in part order) released the
    batch last published in it.
    """

    def __init__(self, slots: int, workers: Sequence[int]) -> None:
        self._index = {r: i for i, r in enumerate(workers)}
        self.workers = tuple(workers)
        # per slot, a bit mask of the workers that still hold it (bit i: workers[i])
        self._holders = [0] * slots
        self._all_workers = (1 << len(self.workers)) - 1
        self._slot_seq = [-1] * slots

    def grant(self, slot: int, seq: int) -> None:
        """Batch ``seq`` was published in ``slot``: every worker holds it now."""
        self._slot_seq[slot] = seq
        self._holders[slot] = self._all_workers

    def release(self, slot: int, seq: int, worker: int) -> bool:
        """Node rank ``worker`` released batch ``seq`` of ``slot``; ``False`` (and nothing
        changes) if it does not hold that batch."""
        w = self._index.get(worker)
        if w is None or not 0 <= slot < len(self._holders) or \
                self._slot_seq[slot] != seq or not self._holders[slot] >> w & 1:
            return False
        self._holders[slot] &= ~(1 << w)
        return True

    def is_free(self, slot: int) -> bool:
        """Whether every worker released ``slot``."""
        return not self._holders[slot]

    def holders(self, slot: int) -> list[int]:
        """The node ranks that still hold ``slot``."""
        return [r for i, r in enumerate(self.workers) if self._holders[slot] >> i & 1]

    @property
    def in_flight(self) -> int:
        """Slots some worker still holds."""
        return sum(1 for m in self._holders if m)

    def forget_sequences(self) -> None:
        """Forget which batch each slot carried (a new window holds none)."""
        self._slot_seq = [-1] * len(self._slot_seq)


class SlotInbox:
    """Worker: the READY/STOP messages received and not yet taken, in order, and the
    sequence number expected next."""

    def __init__(self) -> None:
        self.messages: deque[tuple[int, int, int]] = deque()
        #: the sequence number of the next batch this worker takes
        self.expect = 0
        #: whether STOP was taken (no more batches come)
        self.stop_seen = False
