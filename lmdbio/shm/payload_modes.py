"""The three ways a slot carries its records' bytes, one class each behind :class:`PayloadMode`.

* :class:`CopiedRecords` - the records' bytes are copied (or gathered) into the payload;
  ``offsets`` index it and part ``w``'s payload range is ``offsets[first_w] :
  offsets[first_w + count_w]``.
* :class:`EncodedParts` - each worker's records are one blob encoded with a batch codec
  (:data:`~lmdbio.shm.layout.FLAG_PART_ENCODED`; the header's ``codec`` names it); part
  ``w``'s payload range is its blob and ``offsets`` are in decoded coordinates.
* :class:`RecordSpans` - the records stay in a file every worker maps; the payload holds
  each record's 8-byte start in it (:data:`~lmdbio.shm.layout.FLAG_SPANS`), optionally the
  keys too (:data:`~lmdbio.shm.layout.FLAG_KEY_SPANS`).

A mode answers three questions: how the writer lays the sealed payload out among the parts
(:meth:`PayloadMode.part_ranges`), what a worker checks of its part before trusting it
(:meth:`PayloadMode.part_problem`) and how a worker gets a record back
(:meth:`PayloadMode.record`). :class:`~lmdbio.shm.writer.SlotWriter` holds one mode per
batch; :func:`mode_for_flags` gives a reader the mode a sealed slot names. MPI-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from lmdbio.shm.errors import RingError, SlotCapacityError
from lmdbio.shm.layout import FLAG_KEY_SPANS, FLAG_PART_ENCODED, FLAG_SPANS, SlotBuffers

if TYPE_CHECKING:  # pragma: no cover
    from lmdbio.shm.view import SlotView

__all__ = [
    "CopiedRecords",
    "EncodedParts",
    "PartRanges",
    "PayloadMode",
    "RecordSpans",
    "mode_for_flags",
]


class PartRanges(NamedTuple):
    """Where every worker part's bytes lie in a sealed slot, and the flags naming the mode.

    ``starts``/``ends`` are the parts' payload byte ranges, ``key_starts``/``key_ends`` their
    key byte ranges (one entry per part), ``payload_bytes`` the payload's used size.
    """

    starts: np.ndarray
    ends: np.ndarray
    key_starts: np.ndarray
    key_ends: np.ndarray
    payload_bytes: int
    flags: int


class PayloadMode(Protocol):
    """How a slot's payload holds the records: written by the reader, read by the workers."""

    #: whether the key area holds key spans in the mapped file instead of key bytes
    keys_by_reference: bool

    def part_ranges(self, bufs: SlotBuffers, firsts: np.ndarray, lasts: np.ndarray, n: int,
                    codec: str, where: str) -> PartRanges:
        """Writer, at seal: each part's payload and key byte ranges for records
        ``[firsts[w], lasts[w])``; raises :class:`RingError` if the batch cannot be sealed
        in this mode (``where`` names the slot)."""
        ...

    def part_problem(self, header: dict[str, Any], part: dict[str, Any]) -> str | None:
        """Reader: why ``part`` (a part table entry of the slot ``header``) does not fit
        this mode's layout, or ``None``; checked before the offset tables are read."""
        ...

    def offsets_problem(self, first_offset: int, last_offset: int, part: dict[str, Any]
                        ) -> str | None:
        """Reader: why the part's record offsets ``first_offset..last_offset`` disagree with
        its payload range, or ``None``."""
        ...

    def record(self, view: SlotView, i: int) -> np.ndarray:
        """Reader: record ``i`` of ``view`` as bytes of the slot (a read-only view), or
        :class:`RingError` where this mode keeps the record's bytes elsewhere."""
        ...


def _copied_key_ranges(bufs: SlotBuffers, firsts: np.ndarray, lasts: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Each part's key byte range when the key area holds the key bytes."""
    return bufs.key_offsets[firsts], bufs.key_offsets[lasts]


def _key_span_problem(header: dict[str, Any], part: dict[str, Any], spans: bool) -> str | None:
    """Why a slot that flags key spans has its part's key span table out of place (or
    flags key spans without record spans), or ``None``."""
    if not header["flags"] & FLAG_KEY_SPANS:
        return None
    n, key_bytes = header["n_records"], header["key_bytes"]
    first, count = part["first"], part["count"]
    ks, ke = part["key_start"], part["key_end"]
    if spans and ks == 8 * first and ke == 8 * (first + count) and key_bytes == 8 * n:
        return None
    return (f"a key span table of records {first}..{first + count} must lie at key "
            f"bytes {8 * first}..{8 * (first + count)} of a by-reference slot (part "
            f"key range {ks}..{ke}, {key_bytes} key bytes for {n} records)")


class CopiedRecords:
    """The records' bytes are in the payload, packed; ``offsets`` index them."""

    keys_by_reference = False

    @staticmethod
    def copy_payload(bufs: SlotBuffers, source: Any, total: int, where: str) -> None:
        """Copy the first ``total`` bytes of ``source`` (any C-contiguous buffer) into the
        slot's payload; the caller has checked ``total`` against the capacity."""
        src = np.frombuffer(source, dtype=np.uint8) if not isinstance(source, np.ndarray) \
            else source.reshape(-1).view(np.uint8)
        if total > src.size:
            raise RingError(f"{where}: offsets reach byte {total} but the payload has "
                            f"only {src.size} bytes")
        bufs.payload[:total] = src[:total]

    def part_ranges(self, bufs: SlotBuffers, firsts: np.ndarray, lasts: np.ndarray, n: int,
                    codec: str, where: str) -> PartRanges:
        payload_bytes = int(bufs.offsets[n])
        capacity = bufs.layout.payload_capacity
        if payload_bytes > capacity:
            raise SlotCapacityError("payload bytes", payload_bytes, capacity, where)
        return PartRanges(bufs.offsets[firsts], bufs.offsets[lasts],
                          *_copied_key_ranges(bufs, firsts, lasts), payload_bytes, 0)

    def part_problem(self, header: dict[str, Any], part: dict[str, Any]) -> str | None:
        return _key_span_problem(header, part, spans=False)

    def offsets_problem(self, first_offset: int, last_offset: int, part: dict[str, Any]
                        ) -> str | None:
        bs, be = part["byte_start"], part["byte_end"]
        if first_offset == bs and last_offset == be:
            return None
        return (f"record offsets {first_offset}..{last_offset} do not match the part's "
                f"payload range {bs}..{be}")

    def record(self, view: SlotView, i: int) -> np.ndarray:
        if not -view.count <= i < view.count:
            raise IndexError(f"record {i} of a part with {view.count} records")
        i %= view.count
        offs = view.offsets
        return view.payload[offs[i] : offs[i + 1]]


class EncodedParts:
    """Each part's payload range is one blob of its records encoded with the batch codec.

    ``blob_ranges`` (``(parts, 2)`` start/end payload bytes) is ``None`` until the blobs are
    written (:meth:`store`).
    """

    keys_by_reference = False

    def __init__(self, blob_ranges: np.ndarray | None = None) -> None:
        self.blob_ranges = blob_ranges

    @classmethod
    def store(cls, bufs: SlotBuffers, blobs: Sequence[Any], where: str) -> EncodedParts:
        """Pack one blob per worker part (in part order) into the payload; the mode that
        describes them."""
        p = bufs.layout.n_parts
        if len(blobs) != p:
            raise RingError(f"{where}: {len(blobs)} blobs for {p} worker parts")
        arrays = [np.frombuffer(b, dtype=np.uint8) if not isinstance(b, np.ndarray)
                  else b.reshape(-1).view(np.uint8) for b in blobs]
        sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=p)
        ends = np.cumsum(sizes)
        total = int(ends[-1])
        if total > bufs.layout.payload_capacity:
            raise SlotCapacityError("payload bytes", total, bufs.layout.payload_capacity,
                                    where)
        starts = ends - sizes
        for a, s in zip(arrays, starts.tolist(), strict=True):
            bufs.payload[s : s + a.size] = a
        return cls(np.stack([starts, ends], axis=1))

    def part_ranges(self, bufs: SlotBuffers, firsts: np.ndarray, lasts: np.ndarray, n: int,
                    codec: str, where: str) -> PartRanges:
        if self.blob_ranges is None:
            raise RingError(f"{where}: records were set with decoded=True but no part "
                            "blobs were written (write_part_blobs)")
        if codec == "none":
            raise RingError(f"{where}: part-encoded payloads need a codec name")
        starts, ends = self.blob_ranges[:, 0], self.blob_ranges[:, 1]
        return PartRanges(starts, ends, *_copied_key_ranges(bufs, firsts, lasts),
                          int(ends[-1]), FLAG_PART_ENCODED)

    def part_problem(self, header: dict[str, Any], part: dict[str, Any]) -> str | None:
        return _key_span_problem(header, part, spans=False)

    def offsets_problem(self, first_offset: int, last_offset: int, part: dict[str, Any]
                        ) -> str | None:
        return None  # offsets are in decoded coordinates

    def record(self, view: SlotView, i: int) -> np.ndarray:
        raise RingError(f"ring slot {view.slot}: records of a {view.codec!r}-encoded part "
                        "are only addressable after decoding")


class RecordSpans:
    """The payload holds each record's start in a file every worker maps (8 bytes each),
    ``offsets`` the lengths as running sums; with ``key_spans`` the key area holds the
    keys' starts the same way."""

    def __init__(self, key_spans: bool = False) -> None:
        self.keys_by_reference = key_spans

    @classmethod
    def store(cls, bufs: SlotBuffers, starts: np.ndarray,
              key_spans: tuple[np.ndarray, np.ndarray] | None) -> RecordSpans:
        """Write the record starts (and the key starts and lengths) into the slot; the
        caller has checked the sizes. Returns the mode that describes them."""
        n = starts.size
        bufs.payload[: 8 * n] = starts.astype("<i8").view(np.uint8)
        if key_spans is not None:
            key_starts, key_lengths = key_spans
            bufs.key_offsets[0] = 0
            np.cumsum(key_lengths, out=bufs.key_offsets[1 : n + 1])
            bufs.keys[: 8 * n] = key_starts.astype("<i8").view(np.uint8)
        return cls(key_spans is not None)

    def part_ranges(self, bufs: SlotBuffers, firsts: np.ndarray, lasts: np.ndarray, n: int,
                    codec: str, where: str) -> PartRanges:
        flags = FLAG_SPANS
        key_starts, key_ends = _copied_key_ranges(bufs, firsts, lasts)
        if self.keys_by_reference:
            flags |= FLAG_KEY_SPANS
            key_starts, key_ends = 8 * firsts, 8 * lasts
        return PartRanges(8 * firsts, 8 * lasts, key_starts, key_ends, 8 * n, flags)

    def part_problem(self, header: dict[str, Any], part: dict[str, Any]) -> str | None:
        n, payload_bytes = header["n_records"], header["payload_bytes"]
        first, count = part["first"], part["count"]
        bs, be = part["byte_start"], part["byte_end"]
        if header["flags"] & FLAG_PART_ENCODED or bs != 8 * first or \
                be != 8 * (first + count) or payload_bytes != 8 * n:
            return (f"a span table of records {first}..{first + count} must lie at payload "
                    f"bytes {8 * first}..{8 * (first + count)} (part range {bs}..{be}, "
                    f"payload {payload_bytes} bytes for {n} records)")
        return _key_span_problem(header, part, spans=True)

    def offsets_problem(self, first_offset: int, last_offset: int, part: dict[str, Any]
                        ) -> str | None:
        return None  # offsets are running sums of the records' lengths in the file

    def record(self, view: SlotView, i: int) -> np.ndarray:
        raise RingError(f"ring slot {view.slot}: the records of a by-reference part are "
                        "in the mapped file (see spans), not in the slot")


#: the modes a reader meets, made once (a reader only asks them, never changes them)
_COPIED, _ENCODED = CopiedRecords(), EncodedParts()
_SPANS, _SPANS_AND_KEY_SPANS = RecordSpans(key_spans=False), RecordSpans(key_spans=True)


def mode_for_flags(flags: int) -> PayloadMode:
    """The payload mode a sealed slot's header ``flags`` name (spans win over encoded
    parts, whose combination :meth:`RecordSpans.part_problem` then reports)."""
    if flags & FLAG_SPANS:
        return _SPANS_AND_KEY_SPANS if flags & FLAG_KEY_SPANS else _SPANS
    if flags & FLAG_PART_ENCODED:
        return _ENCODED
    return _COPIED
