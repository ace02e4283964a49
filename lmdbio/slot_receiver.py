"""The worker side of a node's ring: each slot received, checked and handed over as a batch.

A node-level strategy's reader (:class:`lmdbio.reader.ReadSession`) publishes slots into
the node's ring; each of the node's workers takes the next one with
:meth:`SlotReceiver.receive` and gets a :class:`Delivered`: the slot's record ids and
padding flags, and its records either copied into the slot (bounds and bytes) or as spans
of the database file (by reference). Receiving is where a slot is checked before any of it
is read: an encoded slot's checksum before it is decoded with the node's ring codec, a
by-reference slot's spans against this rank's mapping of the file (a span outside it is a
:class:`~lmdbio.shm.SlotCorruptError`), and, unless the consumer defers it to the pass
that reads them, the overflow page headers of its values.

It is cut from :class:`~lmdbio.reader.ReadSession`, which holds one where the rank has a
node ring and delegates ``poll``/``receive`` to it: receiving needs only the ring, the
rank's database and the ring codec, none of the reading side. Its work is a few numpy
calls per slot, none per record.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.io.gather import check_value_spans, copy_spans_by_batch
from lmdbio.kernel_cache import kernel_module
from lmdbio.ring_setup import SLOT_BATCHES_SHIFT
from lmdbio.shm import SlotCorruptError

if TYPE_CHECKING:
    from lmdbio.codecs.registry import RingCodec
    from lmdbio.lmdb import Database
    from lmdbio.shm import BatchRing

__all__ = ["Delivered", "SlotReceiver", "outside_mapping", "spans_outside"]

#: the page bitmap of a gather that accounts no page
_NO_PAGES = np.zeros(1, np.uint8)


def spans_outside(starts: np.ndarray, lengths: np.ndarray, size: int) -> bool:
    """Whether a span ``starts[i] .. starts[i] + lengths[i]`` lies outside a mapping of
    ``size`` bytes. ``lengths > size - starts``, not ``starts + lengths > size``: the sum
    of two corrupt int64 values can wrap around to a small one (with no negative start or
    length it also refuses a start past the end)."""
    return bool(starts.size) and (int(starts.min()) < 0 or int(lengths.min()) < 0
                                  or bool((lengths > size - starts).any()))


def outside_mapping(db: Database, starts: np.ndarray, lengths: np.ndarray, what: str
                    ) -> str | None:
    """What is wrong with the ``what`` (record or key) spans ``starts``/``lengths`` of
    ``db``'s mapping, naming the file; None when every one lies inside it."""
    size = db.buf.shape[0]
    if not spans_outside(starts, lengths, size):
        return None
    return f"a {what} span lies outside the {size}-byte mapping of {db.path}"


@dataclass
class Delivered:
    """A batch as a consumer receives it: record ids, keys, values (one buffer + offsets)."""

    epoch: int
    iteration: int
    ids: np.ndarray
    padding: np.ndarray
    payload: np.ndarray
    offsets: np.ndarray
    key_offsets: np.ndarray
    key_data: np.ndarray
    view: Any = None  # the ring slot view to release, when shared
    #: consecutive iterations in this delivery, from ``iteration`` on (a ring slot may
    #: carry several batches of each worker, back to back)
    batches: int = 1
    #: by-reference delivery (``RunPlan.transfer="spans"``): record ``i`` is
    #: ``payload[offsets[i]:offsets[i] + lengths[i]]`` of the database mapping; None when
    #: ``offsets`` are the ``n + 1`` bounds of records copied into ``payload``
    lengths: np.ndarray | None = None
    #: keys by reference (spans slots): key ``i`` is
    #: ``key_data[key_offsets[i]:key_offsets[i] + key_lengths[i]]`` of the database mapping;
    #: None when ``key_offsets`` are the ``n + 1`` bounds of keys copied into ``key_data``
    key_lengths: np.ndarray | None = None
    #: by-reference delivery: the database whose mapping the spans are of (None when the
    #: records were copied into the slot: the reader checked them as it copied)
    database: Database | None = None
    #: whether the overflow page headers of a by-reference delivery's values were checked:
    #: False after ``receive(defer_value_check=True)`` until :meth:`check_values` or a copy
    #: that checks in the same pass (:meth:`copy_batches`)
    values_checked: bool = True
    #: cumulative value lengths of a by-reference delivery (:meth:`value_bytes`), made once
    _cumulative_lengths: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def of_spans(cls, db: Database, epoch: int, iteration: int, ids: np.ndarray,
                 padding: np.ndarray, starts: np.ndarray, lengths: np.ndarray, *,
                 keys: tuple[np.ndarray, np.ndarray, np.ndarray | None], batches: int = 1,
                 view: Any = None) -> Delivered:
        """A by-reference delivery: records ``starts``/``lengths`` of ``db``'s mapping
        (checked against it), keys as ``(offsets, data, lengths)`` (spans of the mapping,
        or with lengths None the bounds and bytes a slot carried), the values' overflow
        page headers still to check."""
        key_offsets, key_data, key_lengths = keys
        return cls(epoch, iteration, ids, padding, payload=db.buf, offsets=starts,
                   key_offsets=key_offsets, key_data=key_data, view=view, batches=batches,
                   lengths=lengths, key_lengths=key_lengths, database=db,
                   values_checked=False)

    def keys(self) -> list[bytes]:
        """The batch's keys as bytes (for logs and checks, not for hot paths)."""
        ko, kd = self.packed_keys()
        data = kd.tobytes()
        return [data[a:b] for a, b in itertools.pairwise(ko.tolist())]

    def packed_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """The keys as ``(n + 1 bounds, bytes)``, copies that outlive :meth:`release`:
        those the slot carried, or, for keys by reference, gathered from the database
        mapping with one compiled copy."""
        if self.key_lengths is None:
            return np.array(self.key_offsets, np.int64), np.array(self.key_data, np.uint8)
        gather_ranges = kernel_module("lmdbio.lmdb").gather_ranges

        starts = np.ascontiguousarray(self.key_offsets, np.int64)
        lengths = np.ascontiguousarray(self.key_lengths, np.int64)
        data = np.empty(int(lengths.sum()), np.uint8)
        bounds = np.empty(starts.shape[0] + 1, np.int64)
        # spans the worker checked against its mapping (SlotReceiver.receive)
        gather_ranges(self.key_data, starts, lengths, data, bounds, 1, _NO_PAGES, False)
        return bounds, data

    def verify(self) -> None:
        """Verify the slot checksum of a batch received with ``defer_verify`` (raises
        :class:`~lmdbio.shm.SlotCorruptError`); a no-op otherwise."""
        if self.view is not None:
            self.view.verify()

    def check_values(self) -> None:
        """Check the overflow page headers of a by-reference batch received with
        ``defer_value_check`` (raises :class:`~lmdbio.errors.LmdbFormatError` naming the
        page); a no-op otherwise or once done."""
        if not self.values_checked:
            assert self.lengths is not None and self.database is not None
            check_value_spans(self.database, self.offsets, self.lengths)
            self.values_checked = True

    def check_value_rows(self, a: int, b: int) -> None:
        """:meth:`check_values` for records ``a .. b - 1`` only: a consumer that reads
        the slot batch by batch checks each batch's headers just before it reads the values
        (the header shares its cache line with the value's first bytes). A no-op once the
        whole delivery is checked."""
        if not self.values_checked:
            assert self.lengths is not None and self.database is not None
            check_value_spans(self.database, self.offsets[a:b], self.lengths[a:b])

    def value_bytes(self, a: int, b: int) -> int:
        """The value bytes of records ``a .. b - 1``: from cumulative lengths made once per
        delivery, so that a consumer taking a slot batch by batch pays no numpy reduction
        per batch."""
        if self.lengths is None:  # records copied back to back: their bounds
            return int(self.offsets[b] - self.offsets[a])
        cum = self._cumulative()
        return int(cum[b] - cum[a])

    def value_bytes_at(self, bounds: np.ndarray) -> np.ndarray:
        """The value bytes of records ``0 .. bounds[i] - 1`` for each record index in
        ``bounds``: their differences are the bytes of the records in between (a slot's
        batches, all in one call)."""
        if self.lengths is None:
            offsets = np.asarray(self.offsets)
            return offsets[bounds] - offsets[0]
        return self._cumulative()[bounds]

    def _cumulative(self) -> np.ndarray:
        """The ``n + 1`` cumulative value lengths of a by-reference delivery, made once."""
        cum = self._cumulative_lengths
        if cum is None:
            assert self.lengths is not None  # by reference only
            cum = np.zeros(self.lengths.shape[0] + 1, np.int64)
            np.cumsum(self.lengths, out=cum[1:])
            self._cumulative_lengths = cum
        return cum

    def header_format(self) -> np.ndarray | None:
        """The database's page format (:attr:`Database.fmt`) while the overflow page headers
        of this by-reference delivery are still to be checked, for a compiled consumer that
        checks them as it reads the values (see :meth:`check_value_rows`); ``None`` once
        checked, or for values the slot carries."""
        if self.values_checked or self.lengths is None or self.database is None:
            return None
        return self.database.fmt

    def copy_batches(self, out: np.ndarray, batch: int) -> int:
        """Copy a by-reference delivery's values ``batch`` records at a time into ``out``,
        each batch from ``out[0]`` on (a consumer taking the slot's batches one after
        another into memory the size of one batch), checking the overflow page headers
        still to be checked in the same pass (:func:`~lmdbio.io.gather.copy_spans_by_batch`).
        Returns the bytes copied, or -1 when ``out`` is too small for one batch (call again
        with a larger one)."""
        if self.lengths is None or self.database is None:
            raise LmdbioError("copy_batches: the records were copied into the slot; read "
                              "them from payload")
        nbytes = copy_spans_by_batch(self.database, self.offsets, self.lengths, batch, out,
                                                   check=not self.values_checked)
        if nbytes >= 0:
            self.values_checked = True
        return nbytes

    def release(self) -> None:
        if self.view is not None:
            self.view.release()
            self.view = None


class SlotReceiver:
    """One worker rank's end of its node's ring: ``ring`` (created, :mod:`lmdbio.ring_setup`),
    ``db`` (this rank's database, whose mapping by-reference slots point into) and
    ``ring_codec`` (the node's, for encoded slots; None where records travel as they
    are)."""

    def __init__(self, ring: BatchRing, db: Database, ring_codec: RingCodec | None) -> None:
        self.ring, self.db, self.ring_codec = ring, db, ring_codec

    def poll(self) -> bool:
        """Whether :meth:`receive` would return at once (never blocks)."""
        return self.ring.poll()

    def receive(self, timeout: float | None = None, *, defer_verify: bool = False,
                defer_value_check: bool = False) -> Delivered | None:
        """The next batch for this rank (None when the reader stopped).

        ``defer_verify``: the slot checksum is left to :meth:`Delivered.verify` (call it
        before reading the records, e.g. on a decoding thread); encoded slots are verified
        here, before they are decoded. Records delivered by reference: their spans are
        checked against this rank's mapping here, and their values' overflow page headers
        too unless ``defer_value_check`` leaves them to :meth:`Delivered.check_values` or
        to a copy that checks them in the same pass (:meth:`Delivered.copy_batches`)."""
        view = self.ring.next_slot(timeout=timeout, defer_verify=defer_verify)
        if view is None:
            return None
        if view.encoded:
            view.verify()
        labels = np.asarray(view.labels)
        pad = labels < 0
        ids = np.where(pad, -labels - 1, labels)
        payload = view.payload
        if view.encoded:
            assert self.ring_codec is not None  # the node's reader encodes with it alone
            payload = self.ring_codec.decode_part(payload, int(view.count))
        batches = max(int(view.flags) >> SLOT_BATCHES_SHIFT & 0xFFFF, 1)
        if view.by_reference:
            starts, lengths = self._checked_spans(view, *view.spans, "record")
            keys = (view.key_offsets, view.key_data, None)
            if view.keys_by_reference:
                key_offsets, key_lengths = self._checked_spans(view, *view.key_spans, "key")
                keys = (key_offsets, self.db.buf, key_lengths)
            got = Delivered.of_spans(self.db, view.epoch, view.iteration, ids, pad, starts,
                                     lengths, keys=keys, batches=batches, view=view)
            if not defer_value_check:
                try:  # a corrupt file fails here, naming the page, as a copying reader would
                    got.check_values()
                except LmdbioError:
                    got.release()
                    raise
            return got
        return Delivered(view.epoch, view.iteration, ids, pad, payload=payload,
                         offsets=view.offsets, key_offsets=view.key_offsets,
                         key_data=view.key_data, view=view, batches=batches)

    def _checked_spans(self, view: Any, starts: np.ndarray, lengths: np.ndarray, what: str
                       ) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of a by-reference slot, checked against this rank's
        mapping of the file: a span outside it raises
        :class:`~lmdbio.shm.SlotCorruptError` (and releases the slot) before any read."""
        wrong = outside_mapping(self.db, starts, lengths, what)
        if wrong is not None:
            view.release()
            raise SlotCorruptError(wrong, slot=view.slot, seq=view.seq,
                                   epoch=view.epoch, iteration=view.iteration, part=view.part)
        return starts, lengths
