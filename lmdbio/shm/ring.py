"""The node's batch ring: K slots in one MPI-3 shared window, control by small MPI messages.

One reader rank per node fills slots; the node's worker ranks read their part of each slot in
place. The data never moves through MPI; only 32-byte control messages do:

* ``READY(slot, seq)``    reader -> every worker, after the slot was sealed and fenced;
* ``RELEASED(slot, seq)`` worker -> reader, when the worker is done with its part;
* ``STOP``                reader -> every worker, after the last slot;
* ``ABORT(reason)``       any rank -> every other rank, when it raises, is signalled or exits
  without closing, so that nobody waits for a peer that will never answer.

Slot ``seq % K`` carries batch number ``seq``. The reader may publish batch ``seq`` only when
every worker released batch ``seq - K``: it runs at most K batches ahead (the prefetch depth)
and then waits; it can never overwrite a slot that a worker still reads. Every rank keeps one
persistent ``Irecv`` posted and waits by polling ``Test`` with a growing sleep (no spinning
on shared flags, and it lets SIGINT/SIGTERM handlers run); every wait has a timeout that
raises :class:`~lmdbio.shm.errors.RingTimeoutError` saying what was waited for.

Memory ordering follows the MPI-3 unified model: all ranks hold a ``Lock_all`` epoch,
the writer calls ``Win.Sync`` before sending ``READY``, the worker calls ``Win.Sync`` after
receiving it (and before sending ``RELEASED``), the reader after the release.

Cleanup: :meth:`BatchRing.close` (collective) frees the window; on an exception inside
``with ring:``, on SIGINT/SIGTERM (through :func:`lmdbio.mpiutil.on_shutdown`) and at
interpreter exit without ``close`` the ring *aborts*: it tells its peers, drops its views and
unlinks a backing file if the MPI library left one with a name (Open MPI 5 does not: it
unlinks the file once every rank mapped it). It never calls a collective on those paths,
because the peers may not be there to match it; the memory goes back to the OS when the
processes exit. ``close`` frees the window only when no rank of the node still holds numpy
views into it (a collective check), so a stale view can never point at unmapped memory.

Structure: :class:`BatchRing` composes the window (:class:`~lmdbio.shm.window.SharedWindow`:
allocation, mapping, ``Win.Sync``, freeing) with the control plane
(:mod:`lmdbio.shm.messaging`: the messages, the reader's credits, the workers' inbox, waits
with timeouts, abort propagation); the slots' contents are :mod:`lmdbio.shm.writer`'s and
:mod:`lmdbio.shm.view`'s.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lmdbio.errors import ConfigError
from lmdbio.mpiutil import on_shutdown, remove_shutdown
from lmdbio.shm.errors import RingError, SlotCorruptError
from lmdbio.shm.layout import SlotBuffers, SlotLayout, checksum_kind
from lmdbio.shm.messaging import (
    ABORT_GRACE,
    KIND_NAMES,
    READY,
    RELEASED,
    STOP,
    ControlChannel,
    SlotCredits,
    SlotInbox,
)
from lmdbio.shm.view import SlotView, read_slot
from lmdbio.shm.window import SharedWindow
from lmdbio.shm.writer import SlotWriter

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

__all__ = ["DEFAULT_TIMEOUT", "BatchRing", "RingStats"]

log = logging.getLogger("lmdbio.shm")

#: seconds any ring operation waits by default before raising RingTimeoutError
DEFAULT_TIMEOUT = 300.0


@dataclass
class RingStats:
    """Counters of one rank's use of the ring (all ranks keep their own)."""

    #: slots published (reader)
    published: int = 0
    #: payload bytes published (reader)
    bytes_published: int = 0
    #: seconds the reader waited for a free slot: the workers were behind (reader stall)
    reader_wait_s: float = 0.0
    #: acquisitions that had to wait at all (reader)
    reader_waits: int = 0
    #: slots received (worker)
    consumed: int = 0
    #: seconds the worker waited for the next slot: the reader was behind (worker stall)
    worker_wait_s: float = 0.0
    #: slots whose validation failed (worker)
    corrupt: int = 0
    #: most slots published and not yet released at once (reader)
    max_in_flight: int = 0

    def as_dict(self) -> dict[str, float]:
        """The counters as a plain dict (for JSON metrics)."""
        return asdict(self)


class BatchRing:
    """K batch slots in node shared memory, written by one reader rank, read by the workers.

    Build it with :meth:`create` (collective over the node communicator). Reader side::

        with BatchRing.create(node, 0, slots=4, payload_bytes=cap, max_records=b) as ring:
            for it, (payload, offsets, labels) in enumerate(batches):
                w = ring.acquire_slot(epoch, it)     # waits while K slots are in use
                w.write(payload, offsets, labels)
                w.publish()
            # leaving the block sends STOP and frees the window (collective)

    Worker side (the same ``with`` around it)::

        for view in ring.iter_slots():               # None/STOP ends the loop
            use(view.payload, view.offsets, view.labels)   # zero-copy, read-only

    A rank is the reader, a worker, or both (``colocated``, e.g. a single-rank node).
    """

    #: what the reader passed as ``reader_info`` to :meth:`create`
    reader_info: Any

    def __init__(self) -> None:  # use create()
        raise TypeError("use BatchRing.create(node_comm, ...) (a collective call)")

    # ================================================================== construction
    @classmethod
    def create(
        cls,
        node_comm: MPI.Intracomm,
        reader_rank: int = 0,
        *,
        slots: int = 2,
        payload_bytes: int | None = None,
        max_records: int | None = None,
        key_bytes: int | None = None,
        workers: Sequence[int] | None = None,
        colocated: bool = False,
        checksum: bool | str = True,
        timeout: float = DEFAULT_TIMEOUT,
        max_sleep: float = 1e-3,
        spin: float = 2e-4,
        reader_info: Any = None,
    ) -> BatchRing:
        """Collective over ``node_comm`` (ranks that share memory): allocate the ring.

        ``reader_rank`` and ``slots`` (K, the prefetch depth) must be the same on every rank.
        The sizes and roles are taken from the reader (other ranks may pass ``None``):
        ``payload_bytes`` per slot (see :func:`~lmdbio.shm.payload_bytes_for`),
        ``max_records`` per batch, ``key_bytes`` per batch (default ``64 * max_records``;
        0 to keep no keys), ``workers`` (node ranks that consume, in part order; default:
        every rank but the reader, or all ranks with ``colocated``, or the reader alone on a
        single-rank node) and ``checksum`` (per worker part: ``True``/``"xxh64"``,
        ``"crc32"`` or ``False``; a colocated reader's own part is neither checksummed nor
        verified: it is written and read by the same process).
        ``reader_info``: a small picklable value of the reader's that every rank gets as
        :attr:`reader_info` in the same exchange (the caller's own setting, such as its slot
        size: one collective less).
        ``timeout`` (seconds) bounds every wait of this rank unless a call gives its own;
        waits poll ``Test`` (with ``sched_yield``) for ``spin`` seconds, then sleep from 20 us
        doubling up to ``max_sleep``.

        The window is ``MPI.Win.Allocate_shared`` with the whole ring on the reader and 0
        bytes elsewhere; every rank maps the reader's segment (``Shared_query``) as one numpy
        ``uint8`` array. Raises :class:`~lmdbio.errors.ConfigError` (bad sizes) or
        :class:`RingError` on every rank alike.
        """
        from mpi4py import MPI

        if not isinstance(node_comm, MPI.Intracomm) or node_comm == MPI.COMM_NULL:
            raise ConfigError(f"BatchRing.create needs an intracommunicator, got {node_comm!r}")
        cfg: tuple[Any, ...] | str | None = None
        if not isinstance(reader_rank, bool) and reader_rank == node_comm.Get_rank():
            cfg = cls._reader_config(node_comm.Get_size(), reader_rank, slots, payload_bytes,
                                     max_records, key_bytes, workers, colocated, checksum,
                                     reader_info)
        reader, k, agreed = _agree_on_config(node_comm, reader_rank, slots, cfg)
        n_parts, max_rec, cap, kcap, wtuple, kind, info = agreed
        layout = SlotLayout(n_parts, max_rec, cap, kcap)

        self = object.__new__(cls)
        self.reader_info = info
        self._init_state(MPI, node_comm.Dup(), k, reader, wtuple, kind,
                         float(timeout), float(max_sleep), float(spin))
        self._open_window(MPI, layout, k, reader)
        return self

    @staticmethod
    def _reader_config(size: int, reader: int, slots: int, payload_bytes: int | None,
                       max_records: int | None, key_bytes: int | None,
                       workers: Sequence[int] | None, colocated: bool,
                       checksum: bool | str, info: Any) -> tuple[Any, ...] | str:
        """The reader's ``(parts, max_records, payload capacity, key capacity, workers,
        checksum kind, reader_info)`` for :meth:`create`, or the reason it refuses them (a
        string every rank then raises as :class:`~lmdbio.errors.ConfigError`)."""
        try:
            if payload_bytes is None or max_records is None:
                raise ConfigError("the reader must give payload_bytes and max_records")
            if workers is None:
                if colocated or size == 1:
                    wlist = list(range(size))
                else:
                    wlist = [r for r in range(size) if r != reader]
            else:
                wlist = [int(w) for w in workers]
                if not wlist or len(set(wlist)) != len(wlist) or \
                        not all(0 <= w < size for w in wlist):
                    raise ConfigError(f"workers must be distinct node ranks in 0..{size - 1},"
                                      f" got {list(workers)}")
            pickle.dumps(info)  # sent with the configuration: refuse it here, not in the
            # collective (the other ranks would wait there for a reader that raised)
            kb = 64 * int(max_records) if key_bytes is None else key_bytes
            layout = SlotLayout(len(wlist), max_records, payload_bytes, kb)
            layout.window_bytes(max(int(slots), 1))
            return (layout.n_parts, layout.max_records, layout.payload_capacity,
                    layout.key_capacity, tuple(wlist), checksum_kind(checksum), info)
        except Exception as exc:  # every rank raises it after the exchange
            return f"{type(exc).__name__}: {exc}"

    def _init_state(self, MPI: Any, comm: MPI.Intracomm, k: int, reader: int,
                    workers: tuple[int, ...], checksum: int, timeout: float, max_sleep: float,
                    spin: float) -> None:
        self._MPI = MPI
        self._comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.slots = k
        self.reader_rank = reader
        self.workers = workers
        self.is_reader = self.rank == reader
        self.is_worker = self.rank in workers
        self.worker_index = workers.index(self.rank) if self.is_worker else -1
        self.checksum = checksum
        self.stats = RingStats()
        self._channel = ControlChannel(
            MPI, comm, self._on_message, role="reader" if self.is_reader else "worker",
            fanout=len(workers), timeout=timeout, max_sleep=max_sleep, spin=spin)
        self._window: SharedWindow
        # reader
        self._credits = SlotCredits(k, workers)
        self._next_seq = 0
        self._writer: SlotWriter | None = None
        self._stopped = False
        # worker
        self._inbox = SlotInbox()
        self._held: dict[int, SlotView] = {}
        self._shutdown_cb: Callable[[str], None] | None = None

    def _open_window(self, MPI: Any, layout: SlotLayout, k: int, reader: int) -> None:
        """Collective: allocate the shared window of ``k`` slots on the reader (freeing the
        ring's communicator if that fails), then start the channel and register the
        shutdown hook, so that a ring is only ever half-made inside :meth:`create`."""
        try:
            self._window = SharedWindow.allocate(MPI, self._comm, layout, k, reader)
        except BaseException:
            self._comm.Free()
            raise
        self._channel.start()
        self._shutdown_cb = self._on_shutdown
        on_shutdown(self._shutdown_cb)

    # ================================================================== messages
    def _on_message(self, kind: int, slot: int, seq: int, src: int) -> None:
        """A READY, STOP or RELEASED message from node rank ``src`` (see the module doc)."""
        if kind == RELEASED:
            if not self.is_reader or not self._credits.release(slot, seq, src):
                raise RingError(f"node rank {self.rank}: node rank {src} released slot {slot} "
                                f"sequence {seq}, which it does not hold")
            return
        if src != self.reader_rank or not self.is_worker:
            raise RingError(f"node rank {self.rank}: unexpected {KIND_NAMES[kind]} from "
                            f"node rank {src}")
        self._inbox.messages.append((kind, slot, seq))

    def _require(self, reader: bool) -> None:
        if reader and not self.is_reader:
            raise RingError(f"node rank {self.rank} is not the ring's reader "
                            f"(node rank {self.reader_rank})")
        if not reader and not self.is_worker:
            raise RingError(f"node rank {self.rank} is not a worker of the ring "
                            f"(workers: node ranks {list(self.workers)})")

    @property
    def timeout(self) -> float:
        """Seconds every wait of this rank lasts at most unless a call gives its own."""
        return self._channel.timeout

    @property
    def layout(self) -> SlotLayout:
        """The capacities and section offsets of every slot."""
        return self._window.layout

    def slot_buffers(self, slot: int) -> SlotBuffers:
        """The typed views of slot ``slot`` in the window (for tests and tools that inspect
        a slot; drop them before :meth:`close`)."""
        return self._window.buffers[slot]

    # ================================================================== reader side
    @property
    def in_flight(self) -> int:
        """Slots published and not yet released by every worker (as known to the reader)."""
        self._require(True)
        if self._channel.abort_reason is None and not self._channel.closed:
            self._channel.pump()
        return self._credits.in_flight

    def wait_released(self, *, timeout: float | None = None) -> float:
        """Reader: wait until the workers released every published slot (e.g. to time whole
        round trips); returns the seconds waited."""
        self._require(True)
        return self._channel.wait(lambda: self._credits.in_flight == 0, timeout,
                                  lambda: "final releases")

    def acquire_slot(self, epoch: int, iteration: int, *,
                     timeout: float | None = None) -> SlotWriter:
        """Reader: the next slot to fill, for batch (``epoch``, ``iteration``).

        Waits (at most ``timeout`` s, default the ring's) until every worker released the
        batch that used this slot K batches ago. Fill the returned :class:`SlotWriter` and
        ``publish()`` it before acquiring the next slot.
        """
        self._require(True)
        self._channel.check_usable()
        if self._stopped:
            raise RingError("acquire_slot after stop(): the workers were told there is no more")
        if self._writer is not None and self._writer.is_open:
            raise RingError(f"acquire_slot while {self._writer.where} is still unpublished; "
                            "publish() or discard() it first")
        self._writer = None  # a discarded writer gives its slot back unpublished
        seq = self._next_seq
        slot = seq % self.slots
        credits = self._credits

        def what() -> str:
            return (f"workers {credits.holders(slot)} to release slot {slot} (sequence "
                    f"{seq - self.slots}) before writing epoch {epoch} iteration {iteration}")

        waited = self._channel.wait(lambda: credits.is_free(slot), timeout, what)
        if waited:
            self.stats.reader_waits += 1
            self.stats.reader_wait_s += waited
        self._window.sync()  # the workers' reads of this slot happen before our writes
        w = SlotWriter(self._window.buffers[slot], slot=slot, seq=seq, epoch=epoch,
                       iteration=iteration, checksum=self.checksum, on_publish=self._publish,
                       own_part=self.worker_index)
        self._writer = w
        return w

    def _publish(self, w: SlotWriter) -> None:
        if w is not self._writer:
            raise RingError(f"{w.where} does not belong to this ring's open slot")
        self._writer = None
        self._channel.check_usable()
        self._window.sync()  # the slot's contents are visible before READY arrives
        slot, seq = w.slot, w.seq
        self._credits.grant(slot, seq)
        for r in self.workers:
            self._channel.send(READY, slot, seq, r)
        self._next_seq = seq + 1
        st = self.stats
        st.published += 1
        st.bytes_published += w.payload_bytes
        st.max_in_flight = max(st.max_in_flight, self._credits.in_flight)
        self._channel.pump()  # collect releases (and aborts) that arrived meanwhile

    def stop(self) -> None:
        """Reader: tell every worker that no more slots come (``next_slot`` returns None).

        Idempotent; an acquired but unpublished slot is discarded.
        """
        self._require(True)
        self._channel.check_usable()
        if self._stopped:
            return
        if self._writer is not None:
            self._writer.discard()
            self._writer = None
        self._stopped = True
        for r in self.workers:
            self._channel.send(STOP, -1, self._next_seq, r)

    # ================================================================== worker side
    def next_slot(self, *, timeout: float | None = None,
                  defer_verify: bool = False) -> SlotView | None:
        """Worker: wait for the next published slot and return this worker's part of it.

        With ``defer_verify`` the part's checksum is verified only when the caller calls
        ``view.verify()`` (e.g. on a decoding thread, before reading the payload).

        Returns ``None`` once the reader stopped (and on every later call). Raises
        :class:`SlotCorruptError` if validation fails (the slot is then already released,
        so the caller may skip the batch), :class:`RingTimeoutError` after ``timeout``
        seconds and :class:`RingAbortedError` if a peer aborted. Release every view
        (``view.release()`` or ``with view:``); a worker can hold at most K at once.
        """
        self._require(False)
        self._channel.check_usable()
        inbox = self._inbox
        if inbox.stop_seen:
            return None
        if len(self._held) >= self.slots:
            raise RingError(f"node rank {self.rank} holds all {self.slots} ring slots "
                            f"(sequences {sorted(self._held)}); release one before next_slot")
        self.stats.worker_wait_s += self._channel.wait(
            lambda: bool(inbox.messages), timeout,
            lambda: f"slot sequence {inbox.expect} from the reader (node rank "
                    f"{self.reader_rank})",
        )
        kind, slot, seq = inbox.messages.popleft()
        if kind == STOP:
            inbox.stop_seen = True
            return None
        if seq != inbox.expect or slot != seq % self.slots:
            raise RingError(f"node rank {self.rank}: got slot {slot} sequence {seq}, expected "
                            f"sequence {inbox.expect} in slot {inbox.expect % self.slots}")
        inbox.expect += 1
        self._window.sync()  # see everything the reader wrote before READY
        try:
            # a colocated reader's own part never left this process: nothing to verify
            view = read_slot(self._window.buffers[slot], part=self.worker_index, slot=slot,
                             seq=seq, verify=bool(self.checksum) and not self.is_reader,
                             release=self._release_view,
                             pin=self._window.pin, defer=defer_verify)
        except SlotCorruptError:
            self.stats.corrupt += 1
            self._channel.send(RELEASED, slot, seq, self.reader_rank)
            raise
        self._held[seq] = view
        self.stats.consumed += 1
        return view

    def _release_view(self, view: SlotView) -> None:
        if self._held.pop(view.seq, None) is None or self._channel.abort_reason is not None \
                or self._channel.closed:
            return
        self._window.sync()  # our reads of the slot complete before the reader may write
        self._channel.send(RELEASED, view.slot, view.seq, self.reader_rank)

    def poll(self) -> bool:
        """Worker: whether :meth:`next_slot` would return without waiting (a published slot
        or STOP has arrived). Never blocks; lets a worker take the next batch early only
        when it is already there."""
        self._require(False)
        self._channel.check_usable()
        if self._inbox.stop_seen:
            return True
        self._channel.pump()
        return bool(self._inbox.messages)

    def iter_slots(self, *, timeout: float | None = None) -> Iterator[SlotView]:
        """Worker: yield this worker's part of every slot until STOP.

        Each view is released when the next one is requested (or when the loop ends), so
        the loop body must copy what it keeps beyond one iteration.
        """
        view: SlotView | None = None
        try:
            while True:
                if view is not None:
                    view.release()
                    view = None
                view = self.next_slot(timeout=timeout)
                if view is None:
                    return
                yield view
        finally:
            if view is not None:
                view.release()

    def __iter__(self) -> Iterator[SlotView]:
        return self.iter_slots()

    # ================================================================== regrow
    def resize(
        self,
        payload_bytes: int | None = None,
        max_records: int | None = None,
        key_bytes: int | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Collective: replace the window by one with new slot capacities (between epochs).

        Every rank of the node calls it at the same point of the stream: after the workers
        consumed and released every published slot, before the reader acquires the next.
        The reader's arguments count (``None`` keeps a capacity); the slot count, workers and
        the sequence numbering stay. Raises :class:`RingError` on every rank alike (and keeps
        the old window) if a worker still holds views or has not consumed every slot.
        """
        self._channel.check_usable()
        self._check_drained()
        if self.is_reader:  # the last RELEASED messages may still be on their way
            self._channel.wait(lambda: self._credits.in_flight == 0, timeout,
                               lambda: "the last releases before resizing")
        layout = self._agreed_layout(payload_bytes, max_records, key_bytes)
        self._window.free(strict=True)
        self._window = SharedWindow.allocate(self._MPI, self._comm, layout, self.slots,
                                             self.reader_rank)
        self._credits.forget_sequences()

    def _check_drained(self) -> None:
        """Collective: raise :class:`RingError` on every rank alike unless every published
        slot was consumed and no rank holds a view or an open writer."""
        open_writer = self._writer is not None and self._writer.is_open
        state = (self._next_seq if self.is_reader else -1,
                 self._inbox.expect if self.is_worker else -1,
                 len(self._held) + open_writer, self._stopped)
        states = self._comm.allgather(state)
        next_seq = states[self.reader_rank][0]
        problems = []
        for r, (_, expect, held, _) in enumerate(states):
            if held:
                problems.append(f"node rank {r} still holds {held} slot(s)")
            if r in self.workers and expect != next_seq:
                problems.append(f"worker node rank {r} consumed up to sequence {expect - 1}, "
                                f"the reader published up to {next_seq - 1}")
        if states[self.reader_rank][3]:
            problems.append("the reader already sent STOP")
        if problems:
            raise RingError("resize needs a drained ring: " + "; ".join(problems))

    def _agreed_layout(self, payload_bytes: int | None, max_records: int | None,
                       key_bytes: int | None) -> SlotLayout:
        """Collective: the slot layout of the reader's new capacities (``None`` keeps one);
        :class:`~lmdbio.errors.ConfigError` on every rank alike if the reader refuses them."""
        cfg: tuple[int, int, int] | str | None = None
        if self.is_reader:
            lo = self.layout
            try:
                new = SlotLayout(lo.n_parts,
                                 lo.max_records if max_records is None else max_records,
                                 lo.payload_capacity if payload_bytes is None else payload_bytes,
                                 lo.key_capacity if key_bytes is None else key_bytes)
                new.window_bytes(self.slots)
                cfg = (new.max_records, new.payload_capacity, new.key_capacity)
            except ConfigError as exc:
                cfg = str(exc)
        cfg = self._comm.bcast(cfg, root=self.reader_rank)
        if isinstance(cfg, str):
            raise ConfigError(f"BatchRing.resize (node rank {self.reader_rank}): {cfg}")
        assert cfg is not None
        return SlotLayout(self.layout.n_parts, *cfg)

    # ================================================================== teardown
    def _drain_for_close(self) -> bool:
        inbox = self._inbox
        if self.is_worker:
            while inbox.messages:
                kind, slot, seq = inbox.messages.popleft()
                if kind == STOP:
                    inbox.stop_seen = True
                else:  # published but not consumed: give it back unread
                    inbox.expect = seq + 1
                    self._channel.send(RELEASED, slot, seq, self.reader_rank)
            if not inbox.stop_seen:
                return False
        return not (self.is_reader and self._credits.in_flight)

    def close(self, *, timeout: float | None = None) -> None:
        """Collective: stop (reader), give back unconsumed slots, free the window.

        Every rank of the node must call it (``with ring:`` does). Workers release the views
        they still hold and return unread the slots published after they stopped reading.
        If some rank still holds numpy views into the window, no rank frees it (it stays
        mapped until MPI finalizes) and a warning says so. If anything fails, the ring
        aborts (see :meth:`abort`) and the error propagates.
        """
        channel = self._channel
        if channel.closed or channel.abort_reason is not None:
            return
        try:
            if self.is_reader:
                self.stop()
            for v in list(self._held.values()):
                v.release()
            channel.wait(self._drain_for_close, timeout,
                         lambda: "the node to finish the ring (reader: all releases; worker: "
                         "STOP)")
            channel.wait(channel.sends_done, timeout, lambda: "control messages to be delivered")
            channel.stop_receiving()
            self._window.free(strict=False)
            self._comm.Free()
        except BaseException as exc:
            self.abort(f"close failed: {type(exc).__name__}: {exc}")
            raise
        channel.closed = True
        self._forget_shutdown()

    def _forget_shutdown(self) -> None:
        if self._shutdown_cb is not None:
            remove_shutdown(self._shutdown_cb)
            self._shutdown_cb = None

    def abort(self, reason: str, *, grace: float = ABORT_GRACE) -> None:
        """Local, never collective: tell every other rank of the node, drop this rank's use
        of the window and unlink a named backing file. Idempotent.

        Peers waiting in the ring raise :class:`RingAbortedError` with ``reason``. A rank
        that aborts because a peer's ABORT reached it sends nothing (the rank where the
        failure began told everyone). ``grace`` bounds the wait for those messages to leave.
        The window memory returns to the OS when the processes exit.
        """
        if self._channel.closed or self._channel.abort_reason is not None:
            return
        self._channel.abort(reason, grace)
        for v in list(self._held.values()):
            v.release()
        self._held.clear()
        if self._writer is not None:
            self._writer.discard()
            self._writer = None
        alive = self._window.drop()
        self._forget_shutdown()
        log.warning("node rank %d: batch ring aborted (%s); its memory returns to the OS when "
                    "the process exits (%d numpy views still alive)", self.rank, reason, alive)

    def _on_shutdown(self, reason: str) -> None:
        if reason == "exit":
            reason = "the process exited without closing the ring"
        # on a signal the process is about to die (and may be SIGKILLed soon): be quick
        grace = 0.2 if reason.startswith("signal:") else ABORT_GRACE
        self.abort(f"node rank {self.rank}: {reason}", grace=grace)

    @property
    def address(self) -> int:
        """Virtual address of the window in this process (0 once freed)."""
        return self._window.address

    @property
    def backing_file(self) -> str | None:
        """The reader's named backing file of the window, if the MPI library left one
        (``None`` elsewhere, and once the window is freed)."""
        return self._window.backing_file

    @property
    def nbytes(self) -> int:
        """Size of the window: ``slots * layout.slot_size``."""
        return self.slots * self.layout.slot_size

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` completed."""
        return self._channel.closed

    def check_usable(self) -> None:
        """Raise what using the ring now would: a peer's :class:`RingAbortedError`, or
        :class:`RingError` when this rank aborted it (a signal's shutdown) or it is closed.
        For a rank whose slots bypass the ring (it is their only reader and worker) and
        that must stop where the ring would have."""
        self._channel.check_usable()

    @property
    def aborted(self) -> str | None:
        """The abort reason, or ``None`` if the ring was not aborted."""
        return self._channel.abort_reason

    def __enter__(self) -> BatchRing:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif exc is not None and exc is self._channel.aborted_by:
            self.abort(str(exc))
        else:
            self.abort(f"node rank {self.rank} raised {exc_type.__name__}: {exc}")

    def __repr__(self) -> str:
        role = "reader+worker" if self.is_reader and self.is_worker else \
            "reader" if self.is_reader else "worker" if self.is_worker else "idle"
        dead = self._channel.abort_reason
        state = "closed" if self.closed else f"aborted ({dead})" if dead else "open"
        return (f"BatchRing(node rank {self.rank}/{self.size}, {role}, {self.slots} slots of "
                f"{self.layout.slot_size} bytes, {state})")


def _agree_on_config(node_comm: MPI.Intracomm, reader_rank: int, slots: int,
                     cfg: tuple[Any, ...] | str | None) -> tuple[int, int, tuple[Any, ...]]:
    """Collective: ``(reader, slots, the reader's configuration)`` for :meth:`BatchRing.create`.

    One exchange: every rank's (reader_rank, slots), which must agree before anyone takes the
    reader's word, and the reader's sizes and roles (``cfg``, or why it refuses them); every
    rank raises :class:`~lmdbio.errors.ConfigError` alike on a bad configuration.
    """
    gathered = node_comm.allgather((reader_rank, slots, cfg))
    if any(g[:2] != gathered[0][:2] for g in gathered):
        raise ConfigError(
            "BatchRing.create: reader_rank and slots must be equal on every rank, got "
            + ", ".join(f"node rank {r}: {g[:2]}" for r, g in enumerate(gathered))
        )
    try:
        reader = int(reader_rank)
        k = int(slots)
        if isinstance(reader_rank, bool) or isinstance(slots, bool):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"BatchRing.create: reader_rank and slots must be integers, got "
                          f"{reader_rank!r}, {slots!r}") from None
    size = node_comm.Get_size()
    if not 0 <= reader < size:
        raise ConfigError(f"BatchRing.create: reader_rank {reader} outside the node's "
                          f"{size} ranks")
    if k < 1:
        raise ConfigError(f"BatchRing.create: slots (prefetch depth) must be >= 1, got {k}")
    # the reader decided sizes and roles; everyone raises alike on a bad config
    agreed = gathered[reader][2]
    if agreed is None:  # reader_rank given in a form that names no rank (e.g. "0")
        raise ConfigError(f"BatchRing.create: reader_rank must be an integer node rank, "
                          f"got {reader_rank!r}")
    if isinstance(agreed, str):
        raise ConfigError(f"BatchRing.create (node rank {reader}, the reader): {agreed}")
    return reader, k, agreed
