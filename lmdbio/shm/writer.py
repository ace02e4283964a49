"""The reader's side of one slot: :class:`SlotWriter` fills an acquired slot and seals it.

The writer holds one :class:`~lmdbio.shm.payload_modes.PayloadMode` per batch, chosen by how
the batch was given (copied records: :meth:`SlotWriter.write`, :meth:`~SlotWriter.set_records`,
:meth:`~SlotWriter.record_buffers`; encoded parts: :meth:`~SlotWriter.write_part_blobs`;
spans: :meth:`~SlotWriter.set_spans`); sealing asks that mode where each worker part's bytes
lie. The format is :mod:`lmdbio.shm.layout`'s. MPI-free.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lmdbio.shm.errors import RingError, SlotCapacityError
from lmdbio.shm.layout import (
    HEADER,
    HEADER_CRC_AT,
    MAGIC,
    MODE_FLAGS,
    PART,
    VERSION,
    SlotBuffers,
    as_int64_array,
    check_offset_table,
    checksum_kind,
    header_crc,
    part_checksum,
)
from lmdbio.shm.payload_modes import (
    CopiedRecords,
    EncodedParts,
    PartRanges,
    PayloadMode,
    RecordSpans,
)

__all__ = ["SlotWriter"]


class SlotWriter:
    """The reader's handle on one acquired slot: fill it, then :meth:`publish` it.

    Typical use (one copy of the payload; or fill :meth:`payload` in place, e.g. gather the
    records straight into it)::

        w = ring.acquire_slot(epoch, iteration)
        w.write(payload_bytes, offsets, labels=labels, keys=keys)
        w.publish(flags=FLAG_LAST_IN_EPOCH if last else 0)

    The batch is divided among the workers by :meth:`set_parts` (default: equal record
    counts, the first ``n % workers`` parts one record more). After ``publish`` the writer
    drops its views of the slot and cannot be used again.
    """

    def __init__(
        self,
        bufs: SlotBuffers,
        *,
        slot: int,
        seq: int,
        epoch: int,
        iteration: int,
        checksum: bool | str | int = True,
        on_publish: Callable[[SlotWriter], None] | None = None,
        own_part: int = -1,
    ) -> None:
        self._bufs: SlotBuffers | None = bufs
        self.layout = bufs.layout
        self.slot = int(slot)
        self.seq = int(seq)
        self.epoch = int(epoch)
        self.iteration = int(iteration)
        #: ``"slot S (sequence Q, epoch E, iteration I)"`` for error messages
        self.where = (f"slot {self.slot} (sequence {self.seq}, epoch {self.epoch}, iteration "
                      f"{self.iteration})")
        self.checksum = checksum_kind(checksum)
        #: the part the writing process reads itself (a colocated reader's own batch): no
        #: checksum is computed for it (0 stands in the part table), as none guards a copy
        #: that never leaves the process; -1: every part is checksummed
        self.own_part = int(own_part)
        self._on_publish = on_publish
        self._n: int | None = None
        self._key_bytes = 0
        self._counts: np.ndarray | None = None
        #: how the payload holds the records (set with the records; None before)
        self._mode: PayloadMode | None = None
        self._published = False
        #: payload bytes of the sealed batch (0 before :meth:`seal`)
        self.payload_bytes = 0

    # ------------------------------------------------------------------ helpers
    def _live(self) -> SlotBuffers:
        if self._bufs is None:
            raise RingError(f"{self.where}: the slot was already published (or discarded)")
        return self._bufs

    @property
    def capacity(self) -> int:
        """Payload bytes one slot holds."""
        return self.layout.payload_capacity

    @property
    def n_records(self) -> int | None:
        """Records set by :meth:`set_records` (``None`` before)."""
        return self._n

    # ------------------------------------------------------------------ filling
    def payload(self, nbytes: int | None = None) -> np.ndarray:
        """A writable uint8 view of the first ``nbytes`` payload bytes (all when ``None``).

        Raises :class:`SlotCapacityError` if ``nbytes`` exceeds the slot's payload capacity.
        """
        bufs = self._live()
        if nbytes is None:
            return bufs.payload
        n = operator.index(nbytes)
        if n < 0:
            raise RingError(f"{self.where}: payload size must be >= 0, got {n}")
        if n > self.capacity:
            raise SlotCapacityError("payload bytes", n, self.capacity, self.where)
        return bufs.payload[:n]

    def set_records(
        self,
        offsets: Any,
        labels: Any = None,
        keys: Sequence[bytes] | tuple[Any, Any] | None = None,
        *,
        decoded: bool = False,
    ) -> None:
        """Describe the batch: ``offsets`` (``n + 1`` ints, ``offsets[0] == 0``, not
        decreasing; record ``i`` is ``payload[offsets[i]:offsets[i+1]]``), optional
        ``labels`` (``n`` ints; ``-1`` when absent) and optional ``keys``, either a sequence
        of ``n`` bytes or a pair ``(key_offsets, key_data)`` in the same form as ``offsets``.
        The arrays are copied into the slot (whole-array copies, no loop per record).
        ``decoded=True`` for part-encoded slots (:meth:`write_part_blobs`): the offsets are in
        decoded coordinates and not bounded by the payload capacity.
        """
        bufs = self._live()
        offs = as_int64_array("offsets", offsets, self.where)
        check_offset_table("offsets", offs, self.where)
        n = offs.size - 1
        if n > self.layout.max_records:
            raise SlotCapacityError("records", n, self.layout.max_records, self.where)
        if not decoded and offs[-1] > self.capacity:
            raise SlotCapacityError("payload bytes", int(offs[-1]), self.capacity, self.where)
        if labels is None:
            lab = None
        else:
            lab = as_int64_array("labels", labels, self.where)
            if lab.size != n:
                raise RingError(f"{self.where}: {lab.size} labels for {n} records")
        bufs.offsets[: n + 1] = offs
        if lab is None:
            bufs.labels[:n] = -1
        else:
            bufs.labels[:n] = lab
        self._set_keys(bufs, keys, n)
        self._n = n
        self._counts = None
        self._mode = EncodedParts() if decoded else CopiedRecords()

    def set_spans(self, starts: Any, lengths: Any, labels: Any = None,
                  keys: Sequence[bytes] | tuple[Any, Any] | None = None, *,
                  key_spans: tuple[Any, Any] | None = None) -> None:
        """Describe the batch by reference: record ``i`` is ``lengths[i]`` bytes at offset
        ``starts[i]`` of a file every worker maps (the database), not bytes in the slot. The
        payload holds the ``n`` starts (8 bytes each); the offset table the lengths as
        running sums, as for :meth:`set_records`; labels and keys as there, or with
        ``key_spans`` = ``(key starts, key lengths)`` the keys by reference in the same file
        (:data:`FLAG_KEY_SPANS`). The part checksum then covers the spans, labels and keys
        (or key spans); the records' bytes are the file's, read through a read-only mapping.
        Workers check every span against their mapping before reading it.
        """
        bufs = self._live()
        st, ln = self._span_arrays("starts", "lengths", starts, lengths)
        n = st.size
        if key_spans is not None:
            if keys is not None:
                raise RingError(f"{self.where}: give keys or key_spans, not both")
            kst, kln = self._span_arrays("key starts", "key lengths", *key_spans)
            if kst.size != n:
                raise RingError(f"{self.where}: {kst.size} key spans for {n} records")
            if 8 * n > self.layout.key_capacity:
                raise SlotCapacityError("key bytes", 8 * n, self.layout.key_capacity,
                                        self.where)
        offs = np.zeros(n + 1, np.int64)
        np.cumsum(ln, out=offs[1:])
        self.set_records(offs, labels, keys, decoded=True)
        if 8 * n > self.capacity:
            raise SlotCapacityError("payload bytes", 8 * n, self.capacity, self.where)
        self._mode = RecordSpans.store(bufs, st, None if key_spans is None else (kst, kln))
        if key_spans is not None:
            self._key_bytes = 8 * n

    def _span_arrays(self, what_starts: str, what_lengths: str, starts: Any, lengths: Any
                     ) -> tuple[np.ndarray, np.ndarray]:
        st = as_int64_array(what_starts, starts, self.where)
        ln = as_int64_array(what_lengths, lengths, self.where)
        if ln.size != st.size:
            raise RingError(f"{self.where}: {ln.size} {what_lengths} for {st.size} "
                            f"{what_starts}")
        if st.size and (int(st.min()) < 0 or int(ln.min()) < 0):
            raise RingError(f"{self.where}: a span has a negative start or length "
                            f"({what_starts}, {what_lengths})")
        return st, ln

    def record_buffers(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Writable views ``(payload, offsets, keys, key_offsets)`` for a producer that
        writes ``n`` records into the slot itself (one compiled gather, no copies through
        :meth:`set_records`): the whole payload and key areas, and ``n + 1`` entries of each
        offset table. Then call :meth:`records_written`."""
        bufs = self._live()
        n = operator.index(n)
        if not 0 <= n <= self.layout.max_records:
            raise SlotCapacityError("records", n, self.layout.max_records, self.where)
        return bufs.payload, bufs.offsets[: n + 1], bufs.keys, bufs.key_offsets[: n + 1]

    def records_written(self, n: int, labels: Any, payload_bytes: int, key_bytes: int
                        ) -> None:
        """Describe ``n`` records written through :meth:`record_buffers` (their offset
        tables filled by the producer, from 0 to ``payload_bytes`` and ``key_bytes``) with
        their ``labels``. The ends are checked here; the workers check the tables."""
        bufs = self._live()
        n = operator.index(n)
        if not 0 <= n <= self.layout.max_records:
            raise SlotCapacityError("records", n, self.layout.max_records, self.where)
        if int(bufs.offsets[0]) != 0 or int(bufs.offsets[n]) != payload_bytes or \
                int(bufs.key_offsets[0]) != 0 or int(bufs.key_offsets[n]) != key_bytes:
            raise RingError(f"{self.where}: the offset tables written do not run from 0 to "
                            f"{payload_bytes} payload and {key_bytes} key bytes")
        if payload_bytes > self.capacity:
            raise SlotCapacityError("payload bytes", payload_bytes, self.capacity, self.where)
        if key_bytes > self.layout.key_capacity:
            raise SlotCapacityError("key bytes", key_bytes, self.layout.key_capacity,
                                    self.where)
        lab = as_int64_array("labels", labels, self.where)
        if lab.size != n:
            raise RingError(f"{self.where}: {lab.size} labels for {n} records")
        bufs.labels[:n] = lab
        self._n = n
        self._key_bytes = int(key_bytes)
        self._counts = None
        self._mode = CopiedRecords()

    def _set_keys(self, bufs: SlotBuffers, keys: Any, n: int) -> None:
        if keys is None:
            bufs.key_offsets[: n + 1] = 0
            self._key_bytes = 0
            return
        if isinstance(keys, tuple) and len(keys) == 2 and not isinstance(keys[0], bytes):
            koffs = as_int64_array("key_offsets", keys[0], self.where)
            data = np.frombuffer(keys[1], dtype=np.uint8)
        else:
            if len(keys) != n:
                raise RingError(f"{self.where}: {len(keys)} keys for {n} records")
            lens = np.fromiter(map(len, keys), dtype=np.int64, count=n)
            koffs = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lens, out=koffs[1:])
            data = np.frombuffer(b"".join(keys), dtype=np.uint8)
        if koffs.size != n + 1:
            raise RingError(f"{self.where}: {koffs.size} key offsets for {n} records "
                            f"(need {n + 1})")
        check_offset_table("key_offsets", koffs, self.where)
        total = int(koffs[-1])
        if total > data.size:
            raise RingError(f"{self.where}: key offsets reach byte {total} but only "
                            f"{data.size} key bytes were given")
        if total > self.layout.key_capacity:
            raise SlotCapacityError("key bytes", total, self.layout.key_capacity, self.where)
        bufs.key_offsets[: n + 1] = koffs
        bufs.keys[:total] = data[:total]
        self._key_bytes = total

    def write(
        self,
        payload: Any,
        offsets: Any,
        labels: Any = None,
        keys: Sequence[bytes] | tuple[Any, Any] | None = None,
    ) -> None:
        """Copy a packed batch in: ``payload`` (any C-contiguous buffer, at least
        ``offsets[-1]`` bytes) plus :meth:`set_records` arguments."""
        self.set_records(offsets, labels, keys)
        bufs = self._live()
        total = int(bufs.offsets[self._n])  # type: ignore[index]
        CopiedRecords.copy_payload(bufs, payload, total, self.where)

    def set_parts(self, counts: Any = None, *, balance: str = "records") -> None:
        """Divide the batch's records among the workers, in worker order, contiguously.

        ``counts`` (one non-negative int per worker, summing to the record count) or
        ``balance``: ``"records"`` (equal counts; what data-parallel training wants) or
        ``"bytes"`` (record boundaries nearest to equal payload bytes).
        """
        bufs = self._live()
        if self._n is None:
            raise RingError(f"{self.where}: set_records before set_parts")
        n, p = self._n, self.layout.n_parts
        if counts is not None:
            c = as_int64_array("counts", counts, self.where)
            if c.size != p or (c.size and c.min() < 0) or int(c.sum()) != n:
                raise RingError(
                    f"{self.where}: part counts must be {p} non-negative ints summing to {n}, "
                    f"got {c.tolist()}"
                )
        elif balance == "records":
            c = np.full(p, n // p, dtype=np.int64)
            c[: n % p] += 1
        elif balance == "bytes":
            offs = bufs.offsets[: n + 1]
            targets = offs[-1] * np.arange(1, p, dtype=np.float64) / p
            cuts = np.clip(np.searchsorted(offs, targets), 0, n)
            bounds = np.concatenate(([0], np.maximum.accumulate(cuts), [n]))
            c = np.diff(bounds).astype(np.int64)
        else:
            raise RingError(f"{self.where}: balance must be 'records' or 'bytes', "
                            f"got {balance!r}")
        self._counts = c

    def write_part_blobs(self, blobs: Sequence[Any]) -> None:
        """Store one encoded blob per worker part (part-encoded mode).

        Call after :meth:`set_records` (``decoded=True``: offsets in decoded coordinates) and,
        if the default split is not wanted, :meth:`set_parts`. Blob ``w`` becomes part ``w``'s
        payload range; :meth:`publish` then sets :data:`FLAG_PART_ENCODED` (give it the codec).
        """
        bufs = self._live()
        if self._n is None or not isinstance(self._mode, EncodedParts):
            raise RingError(f"{self.where}: call set_records(..., decoded=True) before "
                            "write_part_blobs")
        if self._counts is None:
            self.set_parts()
        self._mode = EncodedParts.store(bufs, blobs, self.where)

    # ------------------------------------------------------------------ sealing
    def seal(self, codec: str = "none", flags: int = 0, first_sample: int = 0) -> None:
        """Write the part table, checksums and header. :meth:`publish` calls this; use it
        directly only without a ring (tests, files)."""
        bufs = self._live()
        if self._n is None or self._mode is None:
            raise RingError(f"{self.where}: nothing to publish (call write or set_records)")
        codec_b, flags = self._checked_seal_args(codec, flags)
        if self._counts is None:
            self.set_parts()
        counts = self._counts
        assert counts is not None
        lasts = np.cumsum(counts)
        firsts = lasts - counts
        ranges = self._mode.part_ranges(bufs, firsts, lasts, self._n, codec, self.where)
        parts_b = self._part_table(bufs, firsts, counts, ranges)
        try:
            hb = HEADER.pack({
                "magic": MAGIC, "version": VERSION, "slot": self.slot, "seq": self.seq,
                "epoch": self.epoch, "iteration": self.iteration,
                "first_sample": operator.index(first_sample), "n_records": self._n,
                "payload_bytes": ranges.payload_bytes, "key_bytes": self._key_bytes,
                "n_parts": self.layout.n_parts, "flags": flags | ranges.flags,
                "checksum": self.checksum, "header_crc": 0, "codec": codec_b})
        except struct.error as exc:
            raise RingError(f"{self.where}: a header field is out of range ({exc})") from None
        self.payload_bytes = ranges.payload_bytes
        crc = header_crc(hb, parts_b).to_bytes(4, "little")
        hb = hb[:HEADER_CRC_AT] + crc + hb[HEADER_CRC_AT + 4 :]
        mem, po = bufs.mem, self.layout.offset("parts")
        mem[po : po + len(parts_b)] = np.frombuffer(parts_b, dtype=np.uint8)
        mem[: len(hb)] = np.frombuffer(hb, dtype=np.uint8)

    def _checked_seal_args(self, codec: str, flags: int) -> tuple[bytes, int]:
        """``codec`` as its header bytes and ``flags`` as an int, or :class:`RingError` if
        the name is not short ASCII or the flags are out of range or name a payload mode."""
        try:
            codec_b = codec.encode("ascii")
        except (AttributeError, UnicodeEncodeError):
            raise RingError(f"{self.where}: codec must be an ASCII str, got {codec!r}") from None
        if len(codec_b) > 16:
            raise RingError(f"{self.where}: codec name {codec!r} is longer than 16 bytes")
        flags = operator.index(flags)
        if not 0 <= flags < 2**32:
            raise RingError(f"{self.where}: flags must fit in 32 bits, got {flags}")
        if flags & MODE_FLAGS:
            raise RingError(f"{self.where}: flags FLAG_PART_ENCODED, FLAG_SPANS and "
                            "FLAG_KEY_SPANS are set by write_part_blobs and set_spans")
        return codec_b, flags

    def _part_table(self, bufs: SlotBuffers, firsts: np.ndarray, counts: np.ndarray,
                    ranges: PartRanges) -> bytes:
        """The packed part table: each part's records, byte ranges and checksum."""
        rows = zip(firsts.tolist(), counts.tolist(), ranges.starts.tolist(),
                   ranges.ends.tolist(), ranges.key_starts.tolist(), ranges.key_ends.tolist(),
                   strict=True)
        packed = []
        for part, (first, count, bs, be, ks, ke) in enumerate(rows):
            h = part_checksum(self.checksum, bufs, first, count, bs, be, ks, ke) \
                if self.checksum and part != self.own_part else 0
            # positional, in PART_DTYPE's field order (the hot loop of a seal)
            packed.append(PART.struct.pack(first, count, bs, be, ks, ke, h))
        return b"".join(packed)

    def publish(self, codec: str = "none", flags: int = 0, first_sample: int = 0) -> None:
        """Seal the slot and hand it to the workers (through the ring's callback).

        ``codec`` names the payload's codec ("none" for raw records), ``flags`` is a bit set
        (:data:`FLAG_LAST_IN_EPOCH`, :data:`FLAG_PADDED`, caller bits 16..31),
        ``first_sample`` the position of the batch's first record in the epoch order (for
        exact resume).
        """
        self.seal(codec, flags, first_sample)
        self._published = True
        cb, self._on_publish = self._on_publish, None
        self._bufs = None
        if cb is not None:
            cb(self)

    def discard(self) -> None:
        """Give up this slot without publishing it (the ring reuses it for the next batch)."""
        self._bufs = None
        self._on_publish = None

    @property
    def published(self) -> bool:
        """Whether :meth:`publish` ran."""
        return self._published

    @property
    def is_open(self) -> bool:
        """Whether the writer may still be filled (neither published nor discarded)."""
        return self._bufs is not None
