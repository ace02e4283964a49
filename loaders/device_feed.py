"""Host-to-device copies for a GPU worker: pinned staging ring, a stream of its own, events.

``xp.asarray(batch)`` copies from pageable memory: the driver stages the bytes through a
pinned bounce buffer of its own, synchronously, on the current stream (the trainer's), so
the copy of batch ``i + 1`` cannot overlap the trainer's step ``i``. :class:`DeviceFeed`
owns, per GPU worker:

- a ring of ``depth`` pinned (page-locked) host buffers (``cupy.cuda.alloc_pinned_memory``),
  grown to the largest batch seen and never beyond ``max_nbytes`` each;
- a CUDA stream of its own (``cupy.cuda.Stream(non_blocking=True)``), which does not
  synchronize with the legacy default stream the trainer usually runs on;
- one event per buffer, recorded on that stream after the buffer's copies.

:meth:`DeviceFeed.submit` copies the host arrays of one batch into a free pinned buffer (one
``memcpy`` per array, on the CPU), enqueues their host-to-device copies on the feed's stream
(``ndarray.set(view, stream=...)``, asynchronous from pinned memory), records the buffer's
event and returns a :class:`DeviceBatch`. A buffer is written again only once its event has
completed (``event.done``, else ``event.synchronize()``: a wait on that one copy, never a
device-wide synchronize). :meth:`DeviceBatch.arrays` hands the device arrays to the
consumer's current stream with ``stream.wait_event(event)``: the consumer's later kernels
run after the copy, and the host does not wait at all.

Double buffering follows: the trainer's step ``i`` is queued on its stream and the host comes
back for batch ``i + 1`` at once; that batch's copy runs on the feed's stream while step
``i`` runs.

Memory reuse across the two streams (cupy's pool is per stream): the device arrays are
allocated on the feed's stream, and before each batch's copies the feed's stream waits on an
event recorded on the consumer's stream when the previous batch was handed over or
:meth:`DeviceBatch.release`\\ d (e.g. after a transform consumed the raw pixels). The feed
keeps the previous batch's arrays alive until that wait is enqueued, so memory the consumer
freed can only be rewritten after the consumer's work queued before that point. The
contract for a consumer: a device array it drops before asking for the next batch is not
read by work it queues after asking (the usual ``for batch in loader: step(batch)``).

Everything here runs against ``cupy`` or the numpy stand-in of ``tests/fake_gpu.py``; none
of it has been measured on a GPU yet (see ``bench/gpu.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.errors import LmdbioError

#: pinned buffers per worker: the batch the trainer is handed, the one being copied, one
#: being filled on the host
DEFAULT_DEPTH = 3
#: every array inside a pinned buffer starts at a multiple of this (DMA-friendly)
ALIGN = 256


class DeviceFeedError(LmdbioError):
    """A :class:`DeviceFeed` was misused (closed, wrong input, batch over its limit)."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _Slot:
    """One pinned buffer of the ring and the event of its last copies."""

    __slots__ = ("event", "memory", "nbytes", "view")

    def __init__(self) -> None:
        self.memory: Any = None  # the pinned allocation (keeps it alive)
        self.view: np.ndarray = np.empty(0, np.uint8)  # uint8 view over it
        self.event: Any = None  # recorded after this buffer's copies; None: never used
        self.nbytes = 0


class DeviceBatch:
    """The device arrays of one :meth:`DeviceFeed.submit`, ready once its event is."""

    def __init__(self, feed: DeviceFeed, arrays: list[Any], event: Any) -> None:
        self._feed = feed
        self._arrays = arrays
        self.event = event
        self._handed = False

    @property
    def done(self) -> bool:
        """Whether the copies completed (never blocks)."""
        return bool(self.event.done)

    def arrays(self, *, wait: str = "stream") -> list[Any]:
        """The device arrays, in the order submitted.

        ``wait="stream"`` (default): the consumer's current stream waits on the copy's
        event (a device-side wait; the host goes on). ``"host"``: the host blocks until the
        copy completed (``event.synchronize()``). ``"none"``: the caller orders it."""
        if wait == "stream":
            self._feed._current_stream().wait_event(self.event)
        elif wait == "host":
            self.event.synchronize()
        elif wait != "none":
            raise DeviceFeedError(f"DeviceBatch.arrays: wait must be stream, host or none, "
                                  f"not {wait!r}")
        if not self._handed:
            self._handed = True
            self._feed._consumer_mark()
        return list(self._arrays)

    def release(self) -> None:
        """Say that the consumer's work reading these arrays is queued (e.g. a transform
        that made new arrays of them): memory freed so far may be reused by the feed after
        that work."""
        self._feed._consumer_mark()


class DeviceFeed:
    """A GPU worker's pinned staging ring and copy stream (see the module docstring).

    ``cp``: the ``cupy`` module (or the stand-in). ``depth``: pinned buffers in the ring
    (at least 2 for copies to overlap the host's filling of the next one). ``max_nbytes``:
    the most one buffer may hold (0: no limit); the ring then holds at most ``depth *
    max_nbytes`` pinned bytes.
    """

    def __init__(self, cp: Any, depth: int = DEFAULT_DEPTH, max_nbytes: int = 0) -> None:
        if int(depth) < 1:
            raise DeviceFeedError(f"DeviceFeed depth must be at least 1, not {depth}")
        if int(max_nbytes) < 0:
            raise DeviceFeedError(f"DeviceFeed max_nbytes must be >= 0, not {max_nbytes}")
        self.cp = cp
        self.depth = int(depth)
        self.max_nbytes = int(max_nbytes)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._slots = [_Slot() for _ in range(self.depth)]
        self._next = 0
        self._consumer_event: Any = None  # recorded on the consumer's stream
        self._retained: list[Any] = []  # the previous batch's arrays (see the docstring)
        self._closed = False
        #: batches submitted, bytes copied, times a buffer's copy was still pending when
        #: the host wanted to refill it (the host then waited on that one event)
        self.submitted = 0
        self.bytes_copied = 0
        self.waits = 0

    # -------------------------------------------------------------- introspection
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pinned_nbytes(self) -> int:
        """Pinned host bytes the ring holds now."""
        return sum(s.nbytes for s in self._slots)

    def _current_stream(self) -> Any:
        return self.cp.cuda.get_current_stream()

    def _consumer_mark(self) -> None:
        self._consumer_event = self._current_stream().record()

    # -------------------------------------------------------------- the copy
    def _slot_for(self, nbytes: int) -> _Slot:
        slot = self._slots[self._next]
        self._next = (self._next + 1) % self.depth
        if slot.event is not None and not slot.event.done:
            self.waits += 1
            slot.event.synchronize()  # that buffer's copies only
        if slot.nbytes < nbytes:
            slot.memory = None
            slot.view = np.empty(0, np.uint8)
            slot.nbytes = 0
            size = _aligned(nbytes + nbytes // 4)  # room for a slightly larger batch
            if self.max_nbytes:
                size = min(size, _aligned(self.max_nbytes))
            slot.memory = self.cp.cuda.alloc_pinned_memory(size)
            slot.view = np.frombuffer(slot.memory, np.uint8, size)
            slot.nbytes = size
        return slot

    def submit(self, *arrays: np.ndarray) -> DeviceBatch:
        """Enqueue the host-to-device copies of ``arrays`` (numpy arrays of one batch) via
        a free pinned buffer; the :class:`DeviceBatch` gives the device arrays."""
        if self._closed:
            raise DeviceFeedError("DeviceFeed.submit after close()")
        if not arrays:
            raise DeviceFeedError("DeviceFeed.submit needs at least one array")
        hosts = []
        for a in arrays:
            if not isinstance(a, np.ndarray):
                raise DeviceFeedError(f"DeviceFeed.submit takes numpy (host) arrays, not "
                                      f"{type(a).__module__}.{type(a).__name__}")
            if a.dtype.hasobject or a.dtype.kind not in "biufc":
                raise DeviceFeedError(f"DeviceFeed.submit: dtype {a.dtype} cannot be copied "
                                      "to a device")
            hosts.append(a)
        starts = []
        total = 0
        for a in hosts:
            starts.append(total)
            total = _aligned(total + a.nbytes)
        if self.max_nbytes and total > self.max_nbytes:
            raise DeviceFeedError(f"DeviceFeed: a batch of {total} bytes exceeds max_nbytes "
                                  f"{self.max_nbytes} per pinned buffer")
        slot = self._slot_for(max(total, ALIGN))
        cp = self.cp
        views = []
        for a, start in zip(hosts, starts, strict=True):
            view = slot.view[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
            np.copyto(view, a, casting="no")  # the one CPU copy (any layout in)
            views.append(view)
        stream = self.stream
        if self._consumer_event is not None:
            stream.wait_event(self._consumer_event)
        self._retained = []  # freed only now: their reuse is ordered after the wait
        out = []
        with stream:
            for view in views:
                dev = cp.empty(view.shape, view.dtype)
                dev.set(view, stream=stream)
                out.append(dev)
        event = cp.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        slot.event = event
        self._retained = list(out)
        self.submitted += 1
        self.bytes_copied += sum(a.nbytes for a in hosts)
        return DeviceBatch(self, out, event)

    def to_device(self, *arrays: np.ndarray) -> list[Any]:
        """``submit(*arrays).arrays()``: device arrays ordered on the consumer's stream."""
        return self.submit(*arrays).arrays()

    # -------------------------------------------------------------- lifecycle
    def synchronize(self) -> None:
        """Wait for every copy enqueued so far (the feed's stream only)."""
        if not self._closed:
            self.stream.synchronize()

    def close(self) -> None:
        """Wait for the copies in flight, then free the pinned buffers (returned to cupy's
        pinned pool, whose unused blocks are then released) and the retained arrays.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.stream.synchronize()
        for slot in self._slots:
            slot.memory = slot.event = None
            slot.view = np.empty(0, np.uint8)
            slot.nbytes = 0
        self._retained = []
        self._consumer_event = None
        pool = getattr(self.cp, "get_default_pinned_memory_pool", None)
        if pool is not None:
            pool().free_all_blocks()

    def __enter__(self) -> DeviceFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
