"""Node-local shared memory: the ring of batch slots between a node's reader and its workers.

* :class:`BatchRing` - K slots in one MPI-3 shared window per node; the reader fills slots
  (:meth:`~BatchRing.acquire_slot` -> :class:`SlotWriter` -> ``publish``), the workers read
  their part in place (:meth:`~BatchRing.next_slot` / :meth:`~BatchRing.iter_slots` ->
  :class:`SlotView`); control travels as small MPI messages.
* :mod:`lmdbio.shm.layout` - the slot format (numpy structured dtypes), MPI-free, with
  :mod:`lmdbio.shm.payload_modes` (copied records, encoded parts, spans),
  :mod:`lmdbio.shm.writer` (:class:`SlotWriter`) and :mod:`lmdbio.shm.view` (:class:`SlotView`).
* :func:`payload_bytes_for` - the slot payload size that fits any batch of a dataset.

See ``docs/shm.md`` for the protocol, the layout and the cleanup guarantees. Importing this
package does not import mpi4py; :meth:`BatchRing.create` does.
"""

from __future__ import annotations

from lmdbio.shm.errors import (
    RingAbortedError,
    RingError,
    RingTimeoutError,
    SlotCapacityError,
    SlotCorruptError,
)
from lmdbio.shm.layout import (
    CHECKSUM_CRC32,
    CHECKSUM_NONE,
    CHECKSUM_XXH64,
    FLAG_KEY_SPANS,
    FLAG_LAST_IN_EPOCH,
    FLAG_PADDED,
    FLAG_PART_ENCODED,
    FLAG_SPANS,
    SlotLayout,
    payload_bytes_for,
)
from lmdbio.shm.ring import DEFAULT_TIMEOUT, BatchRing, RingStats
from lmdbio.shm.view import DeviceBatch, SlotView
from lmdbio.shm.writer import SlotWriter

__all__ = [
    "CHECKSUM_CRC32",
    "CHECKSUM_NONE",
    "CHECKSUM_XXH64",
    "DEFAULT_TIMEOUT",
    "FLAG_KEY_SPANS",
    "FLAG_LAST_IN_EPOCH",
    "FLAG_PADDED",
    "FLAG_PART_ENCODED",
    "FLAG_SPANS",
    "BatchRing",
    "DeviceBatch",
    "RingAbortedError",
    "RingError",
    "RingStats",
    "RingTimeoutError",
    "SlotCapacityError",
    "SlotCorruptError",
    "SlotLayout",
    "SlotView",
    "SlotWriter",
    "payload_bytes_for",
]
