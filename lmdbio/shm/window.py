"""The node's MPI-3 shared window that holds the batch ring's slots.

:class:`SharedWindow` allocates the window (``MPI.Win.Allocate_shared``: the whole ring on
the reader, 0 bytes elsewhere), maps the reader's segment on every rank as one numpy
``uint8`` array, holds the ``Lock_all`` epoch the ring's memory ordering needs
(:meth:`~SharedWindow.sync`), page-locks it for device copies, and frees it - collectively,
and only when no rank still holds numpy views into it. It knows nothing of the slot
protocol: :class:`~lmdbio.shm.ring.BatchRing` composes it with the control messages of
:mod:`lmdbio.shm.messaging`.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.shm.cleanup import backing_file, unlink_quietly
from lmdbio.shm.errors import RingError
from lmdbio.shm.layout import SlotBuffers, SlotLayout

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

__all__ = ["SharedWindow"]

log = logging.getLogger("lmdbio.shm")


class SharedWindow:
    """``slots`` slots of ``layout`` in one node's MPI-3 shared window (see the module doc).

    Build it with :meth:`allocate` (collective). :attr:`buffers` are the typed views of every
    slot; :attr:`backing_file` is the reader's named backing file, if the MPI library left
    one (it is unlinked when the window is freed or dropped).
    """

    def __init__(self, MPI: Any, comm: MPI.Intracomm, win: Any, base: np.ndarray,
                 layout: SlotLayout, slots: int, reader_rank: int) -> None:
        """Wrap an allocated, mapped and locked window (use :meth:`allocate`)."""
        self._MPI = MPI
        self._comm = comm
        self._win: Any = win
        #: the one root array: every view derives from it (numpy points their ``.base``
        #: here), so its reference count tells whether views are alive
        self._base: np.ndarray | None = base
        self.layout = layout
        self.slots = slots
        self.is_reader = comm.Get_rank() == reader_rank
        self.buffers: list[SlotBuffers] = []
        self._pinned: tuple[Any, int] | None = None
        self.rebuild_buffers()
        self.backing_file: str | None = None
        if self.is_reader:
            self.backing_file = backing_file(base.ctypes.data)
            if self.backing_file:
                log.info("batch ring window is backed by %s; it is unlinked at close/abort",
                         self.backing_file)

    @classmethod
    def allocate(cls, MPI: Any, comm: MPI.Intracomm, layout: SlotLayout, slots: int,
                 reader_rank: int) -> SharedWindow:
        """Collective: allocate the window, map the reader's segment, start the lock epoch.

        One exchange after both steps says whether every rank allocated and mapped it (a
        rank that has mapped it has it: an MPI library may unlink its backing file then);
        if any failed, every rank raises :class:`RingError` naming each failure."""
        nbytes = layout.window_bytes(slots)
        is_reader = comm.Get_rank() == reader_rank
        win = None
        error = None
        try:
            win = MPI.Win.Allocate_shared(nbytes if is_reader else 0, 1, comm=comm)
        except MPI.Exception as exc:
            error = (f"allocating the batch ring window: MPI.Win.Allocate_shared of {nbytes} "
                     f"bytes failed ({exc}); are all ranks of the node communicator on one "
                     "shared-memory node?")
        base = None
        if win is not None:
            base, error = cls._map_reader_segment(MPI, win, reader_rank, nbytes)
        states = comm.allgather((win is not None, error))
        if any(e for _, e in states):
            if all(allocated for allocated, _ in states):
                base = None
                assert win is not None
                win.Free()  # collective: every rank holds a window to free
            detail = "; ".join(f"node rank {r}: {e}" for r, (_, e) in enumerate(states) if e)
            raise RingError(f"creating the batch ring failed: {detail}")
        assert win is not None and base is not None
        win.Lock_all(MPI.MODE_NOCHECK)
        return cls(MPI, comm, win, base, layout, slots, reader_rank)

    @staticmethod
    def _map_reader_segment(MPI: Any, win: Any, reader_rank: int, nbytes: int
                            ) -> tuple[np.ndarray | None, str | None]:
        """The reader's segment of ``win`` as one ``uint8`` array of ``nbytes``, or why
        it could not be mapped."""
        try:
            mem, _ = win.Shared_query(reader_rank)
            have = len(memoryview(mem))
            if have < nbytes:
                return None, (f"mapping the batch ring window: the reader's segment has "
                              f"{have} bytes, expected {nbytes}")
            base = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
            del mem
            return base, None
        except MPI.Exception as exc:
            return None, f"mapping the batch ring window: MPI.Win.Shared_query failed: {exc}"

    # ------------------------------------------------------------------ use
    def rebuild_buffers(self) -> None:
        """(Re)make the typed views of every slot from the mapped window."""
        lo, base = self.layout, self._base
        assert base is not None
        self.buffers = [SlotBuffers(lo, base[i * lo.slot_size : (i + 1) * lo.slot_size])
                        for i in range(self.slots)]

    def sync(self) -> None:
        """``Win.Sync``: order this rank's accesses to the window against its peers' (the
        MPI-3 unified model, inside the ``Lock_all`` epoch)."""
        self._win.Sync()

    @property
    def address(self) -> int:
        """Virtual address of the window in this process (0 once freed)."""
        return 0 if self._base is None else int(self._base.ctypes.data)

    def pin(self, xp: Any) -> None:
        """Page-lock the window for ``xp`` (cupy) once, so device copies are DMA."""
        if self._pinned is not None or self._base is None:
            return
        runtime = xp.cuda.runtime
        ptr = int(self._base.ctypes.data)
        runtime.hostRegister(ptr, int(self._base.nbytes), 0)
        self._pinned = (runtime, ptr)

    def unpin(self) -> None:
        """Undo :meth:`pin` (a no-op when not pinned)."""
        if self._pinned is not None:
            runtime, ptr = self._pinned
            self._pinned = None
            try:
                runtime.hostUnregister(ptr)
            except Exception as exc:  # pragma: no cover - GPU only
                log.warning("hostUnregister of the batch ring failed: %s", exc)

    # ------------------------------------------------------------------ teardown
    def views_alive(self) -> int:
        """Drop this window's own slot views; the numpy views into it still held elsewhere."""
        self.buffers = []
        if self._base is None:
            return 0
        return max(0, sys.getrefcount(self._base) - 2)

    def unlink_backing(self) -> None:
        """Reader: unlink the named backing file, if there is one (never raises)."""
        if self.is_reader and self.backing_file:
            unlink_quietly(self.backing_file)

    def free(self, strict: bool) -> bool:
        """Collective: free the window unless a rank still holds views into it; whether it
        was freed.

        ``strict``: raise :class:`RingError` on every rank instead (the window stays usable).
        Otherwise a rank that holds views logs a warning and the window stays mapped until
        MPI finalizes.
        """
        alive = self.views_alive()
        counts = self._comm.allgather(alive)
        if any(counts):
            holders = {r: c for r, c in enumerate(counts) if c}
            msg = (f"numpy views into the batch ring are still alive on node ranks "
                   f"{holders} (rank: views)")
            if strict:
                self.rebuild_buffers()
                raise RingError(msg + "; drop them before resizing")
            if alive:
                log.warning("node rank %d: %s; the window stays mapped until MPI finalizes",
                            self._comm.Get_rank(), msg)
            self.unlink_backing()
            return False
        self.unpin()
        self._base = None
        win, self._win = self._win, None
        win.Unlock_all()
        win.Free()
        self.unlink_backing()
        self.backing_file = None
        return True

    def drop(self) -> int:
        """Local, never collective (the abort path): drop this rank's views and page lock
        and unlink a named backing file; the memory returns to the OS when the processes
        exit. Returns the numpy views still alive elsewhere."""
        alive = self.views_alive()
        self.unpin()
        self.unlink_backing()
        return alive
