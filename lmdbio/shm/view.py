"""The workers' side of one slot: :func:`read_slot` validates it, :class:`SlotView` reads it.

A view is zero-copy and read-only, straight into the slot's memory; the slot's
:class:`~lmdbio.shm.payload_modes.PayloadMode` (named by the header's flags) says how its
records are reached. The format is :mod:`lmdbio.shm.layout`'s. MPI-free.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from lmdbio.kernel_args import read_only
from lmdbio.shm.errors import RingError, SlotCorruptError
from lmdbio.shm.layout import (
    CHECKSUM_KINDS,
    CHECKSUM_NONE,
    FLAG_KEY_SPANS,
    FLAG_LAST_IN_EPOCH,
    FLAG_PART_ENCODED,
    FLAG_SPANS,
    HEADER,
    MAGIC,
    PART,
    VERSION,
    SlotBuffers,
    header_crc,
    part_checksum,
)
from lmdbio.shm.payload_modes import PayloadMode, mode_for_flags

__all__ = ["DeviceBatch", "SlotView", "read_slot"]


class DeviceBatch(NamedTuple):
    """A worker's part of a batch on a device: payload bytes, rebased offsets, labels."""

    payload: Any
    offsets: Any
    labels: Any


class SlotView:
    """A worker's zero-copy, read-only view of its part of one published slot.

    ``payload``, ``labels`` and ``key_data`` are views straight into node shared memory;
    ``offsets`` and ``key_offsets`` are small rebased copies (``offsets[0] == 0``; record
    ``i`` is ``payload[offsets[i]:offsets[i+1]]``, or in the decoded blob for part-encoded
    slots). Valid until :meth:`release`; copy (or :meth:`to_device`) what must outlive it.
    A context manager: leaving the block releases the slot.
    """

    def __init__(
        self,
        *,
        slot: int,
        seq: int,
        epoch: int,
        iteration: int,
        first_sample: int,
        batch_records: int,
        flags: int,
        codec: str,
        part: int,
        first: int,
        count: int,
        payload: np.ndarray,
        offsets: np.ndarray,
        labels: np.ndarray,
        key_offsets: np.ndarray,
        key_data: np.ndarray,
        release: Callable[[SlotView], None] | None = None,
        pin: Callable[[Any], None] | None = None,
        verify: Callable[[], None] | None = None,
    ) -> None:
        self.slot = slot
        self.seq = seq
        self.epoch = epoch
        self.iteration = iteration
        self.first_sample = first_sample
        self.batch_records = batch_records
        self.flags = flags
        self.codec = codec
        self.part = part
        self.first = first
        self.count = count
        self._payload: np.ndarray | None = payload
        self._offsets: np.ndarray | None = offsets
        self._labels: np.ndarray | None = labels
        self._key_offsets: np.ndarray | None = key_offsets
        self._key_data: np.ndarray | None = key_data
        self._release_cb = release
        self._pin = pin
        self._verify = verify
        #: how the slot's payload holds this part's records (from ``flags``)
        self.mode = mode_for_flags(flags)
        self.released = False

    @property
    def verified(self) -> bool:
        """Whether the part's checksum was verified (or there is none to verify)."""
        return self._verify is None

    def verify(self) -> None:
        """Verify the part's checksum now, if :func:`read_slot` was asked to defer it (so
        that a worker can do it on another thread); raises :class:`SlotCorruptError` on a
        mismatch. A no-op once verified, or when the slot has no checksum."""
        check = self._verify
        if check is not None:
            self._get(self._payload)  # not after release
            check()
            self._verify = None

    def _get(self, arr: np.ndarray | None) -> np.ndarray:
        if arr is None:
            raise RingError(f"ring slot {self.slot} (sequence {self.seq}) was already "
                            "released; copy the data you keep before releasing")
        return arr

    @property
    def payload(self) -> np.ndarray:
        """This part's payload bytes (read-only uint8 view into shared memory)."""
        return self._get(self._payload)

    @property
    def offsets(self) -> np.ndarray:
        """``count + 1`` record offsets relative to :attr:`payload` (or the decoded blob)."""
        return self._get(self._offsets)

    @property
    def labels(self) -> np.ndarray:
        """``count`` int64 labels (read-only view)."""
        return self._get(self._labels)

    @property
    def key_offsets(self) -> np.ndarray:
        """``count + 1`` offsets into :attr:`key_data`."""
        return self._get(self._key_offsets)

    @property
    def key_data(self) -> np.ndarray:
        """This part's key bytes (read-only view)."""
        return self._get(self._key_data)

    @property
    def encoded(self) -> bool:
        """Whether :attr:`payload` is one blob encoded with :attr:`codec`."""
        return bool(self.flags & FLAG_PART_ENCODED)

    @property
    def by_reference(self) -> bool:
        """Whether the records are spans of a mapped file (:attr:`spans`), not payload."""
        return bool(self.flags & FLAG_SPANS)

    @property
    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of this part's records in the mapped file (by-reference
        slots only; both int64, copies)."""
        if not self.by_reference:
            raise RingError(f"ring slot {self.slot}: its records are payload bytes, not spans")
        return self.payload.view("<i8").astype(np.int64), np.diff(self.offsets)

    @property
    def keys_by_reference(self) -> bool:
        """Whether the keys are spans of the mapped file (:attr:`key_spans`), not bytes."""
        return bool(self.flags & FLAG_KEY_SPANS)

    @property
    def key_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of this part's keys in the mapped file (slots with
        :data:`FLAG_KEY_SPANS` only; both int64, copies)."""
        if not self.keys_by_reference:
            raise RingError(f"ring slot {self.slot}: its keys are bytes in the slot, not spans")
        return self.key_data.view("<i8").astype(np.int64), np.diff(self.key_offsets)

    @property
    def last_in_epoch(self) -> bool:
        """Whether the reader marked this batch as the last of its epoch."""
        return bool(self.flags & FLAG_LAST_IN_EPOCH)

    def __len__(self) -> int:
        return self.count

    def record(self, i: int) -> np.ndarray:
        """Record ``i`` of this part (a read-only view; slots of copied records only: see
        :meth:`lmdbio.shm.payload_modes.PayloadMode.record`)."""
        return self.mode.record(self, i)

    def keys(self) -> list[bytes]:
        """This part's keys as bytes (for logs and error reports, not for hot paths)."""
        if self.keys_by_reference:
            raise RingError(f"ring slot {self.slot}: the keys of this part are in the mapped "
                            "file (see key_spans), not in the slot")
        data = self.key_data.tobytes()
        ko = self.key_offsets.tolist()
        return [data[a:b] for a, b in itertools.pairwise(ko)]

    def to_device(self, xp: Any = None) -> DeviceBatch:
        """This part on ``xp``'s device: numpy (``None`` or ``numpy``: the zero-copy views) or
        cupy (the ring's window is ``hostRegister``-ed once, so the copy is a DMA out of node
        shared memory; the copy is complete when this returns, so the slot may be released).

        The cupy path is untested: no machine of this project has a GPU.
        """
        if xp is None or xp is np:
            return DeviceBatch(self.payload, self.offsets, self.labels)
        if self._pin is not None:
            self._pin(xp)
        out = DeviceBatch(xp.asarray(self.payload), xp.asarray(self.offsets),
                          xp.asarray(self.labels))
        cuda = getattr(xp, "cuda", None)
        if cuda is not None:
            cuda.get_current_stream().synchronize()
        return out

    def release(self) -> None:
        """Hand the slot back to the reader (idempotent). The views become invalid."""
        if self.released:
            return
        self.released = True
        self._payload = self._offsets = self._labels = None
        self._key_offsets = self._key_data = None
        cb, self._release_cb = self._release_cb, None
        if cb is not None:
            cb(self)

    def __enter__(self) -> SlotView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else f"{self.count} records"
        return (f"SlotView(slot={self.slot}, seq={self.seq}, epoch={self.epoch}, "
                f"iteration={self.iteration}, part={self.part}, {state})")


def read_slot(
    bufs: SlotBuffers,
    *,
    part: int,
    slot: int,
    seq: int,
    verify: bool = True,
    release: Callable[[SlotView], None] | None = None,
    pin: Callable[[Any], None] | None = None,
    defer: bool = False,
) -> SlotView:
    """Validate a published slot and return worker ``part``'s :class:`SlotView`.

    Checks (never reading outside the slot): magic and version; the header crc (always);
    that the header's slot and sequence are the ones announced; every count and range
    against the capacities and the record table; that the part's offsets do not decrease;
    with ``verify`` and a checksummed slot, the part's checksum - at once, or with
    ``defer`` when the caller calls :meth:`SlotView.verify` (before reading the payload).
    Any failure raises :class:`SlotCorruptError` naming the slot, sequence, epoch,
    iteration and part.
    """
    check = _SlotCheck(bufs, part=part, slot=slot, seq=seq)
    header, entry = check.header_and_part()
    mode = mode_for_flags(header["flags"])
    offs, koffs = check.offset_tables(header, entry, mode)
    first, count = entry["first"], entry["count"]
    bs, be, ks, ke = entry["byte_start"], entry["byte_end"], entry["key_start"], entry["key_end"]
    kind, stored_sum = header["checksum"], entry["checksum"]

    def verify_checksum() -> None:
        h = part_checksum(kind, bufs, first, count, bs, be, ks, ke)
        if h != stored_sum:
            raise check.fail(f"checksum mismatch (stored 0x{stored_sum:x}, computed 0x{h:x}): "
                             "the batch was corrupted in shared memory")

    deferred = None
    if verify and kind != CHECKSUM_NONE:
        if defer:
            deferred = verify_checksum
        else:
            verify_checksum()
    offs -= offs[0]
    koffs -= koffs[0] if mode.keys_by_reference else ks
    return SlotView(
        slot=slot, seq=seq, epoch=check.epoch, iteration=check.iteration,
        first_sample=header["first_sample"], batch_records=header["n_records"],
        flags=header["flags"], codec=header["codec"].rstrip(b"\0").decode("ascii", "replace"),
        part=part, first=first, count=count,
        payload=read_only(bufs.payload[bs:be]), offsets=offs,
        labels=read_only(bufs.labels[first : first + count]), key_offsets=koffs,
        key_data=read_only(bufs.keys[ks:ke]),
        release=release, pin=pin, verify=deferred,
    )


class _SlotCheck:
    """The validation steps of :func:`read_slot` for one part of one slot; every failure
    is a :class:`SlotCorruptError` naming the slot, sequence, part and (once the header
    crc held) epoch and iteration."""

    def __init__(self, bufs: SlotBuffers, *, part: int, slot: int, seq: int) -> None:
        self.bufs = bufs
        self.part = part
        self.slot = slot
        self.seq = seq
        self.epoch = -1
        self.iteration = -1

    def fail(self, what: str) -> SlotCorruptError:
        """The error for ``what`` went wrong."""
        return SlotCorruptError(what, slot=self.slot, seq=self.seq, epoch=self.epoch,
                                iteration=self.iteration, part=self.part)

    def header_and_part(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The checked header and this part's checked part table entry, from one snapshot
        of both (a few hundred bytes: every check and the crc see the same bytes)."""
        lo, mem = self.bufs.layout, self.bufs.mem
        hb = mem[: HEADER.size].tobytes()
        header = HEADER.unpack(hb)
        magic, version = header["magic"], header["version"]
        if magic != MAGIC:
            raise self.fail(f"bad magic 0x{magic:016x} (expected 0x{MAGIC:016x}): the slot "
                            "was never written or was overwritten")
        if version != VERSION:
            raise self.fail(f"slot format version {version}, this lmdbio reads {VERSION}")
        po = lo.offset("parts")
        pb = mem[po : po + lo.n_parts * PART.size].tobytes()
        stored, computed = header["header_crc"], header_crc(hb, pb)
        if stored != computed:
            raise self.fail(f"header checksum mismatch (stored 0x{stored:08x}, computed "
                            f"0x{computed:08x}): the header or part table was modified")
        self.epoch, self.iteration = header["epoch"], header["iteration"]
        self._check_header(header)
        entry = PART.unpack(pb, self.part * PART.size)
        self._check_part(header, entry)
        return header, entry

    def _check_header(self, h: dict[str, Any]) -> None:
        lo = self.bufs.layout
        if h["slot"] != self.slot or h["seq"] != self.seq:
            raise self.fail(f"header names slot {h['slot']} sequence {h['seq']}: the slot was "
                            "overwritten before it was released")
        n, payload_bytes, key_bytes = h["n_records"], h["payload_bytes"], h["key_bytes"]
        if not 0 <= n <= lo.max_records:
            raise self.fail(f"record count {n} outside 0..{lo.max_records}")
        if not 0 <= payload_bytes <= lo.payload_capacity:
            raise self.fail(f"payload size {payload_bytes} outside 0..{lo.payload_capacity}")
        if not 0 <= key_bytes <= lo.key_capacity:
            raise self.fail(f"key size {key_bytes} outside 0..{lo.key_capacity}")
        if h["n_parts"] != lo.n_parts:
            raise self.fail(f"{h['n_parts']} parts, the ring has {lo.n_parts} workers")
        if not 0 <= self.part < lo.n_parts:
            raise self.fail(f"part index outside 0..{lo.n_parts - 1}")

    def _check_part(self, h: dict[str, Any], p: dict[str, Any]) -> None:
        n, first, count = h["n_records"], p["first"], p["count"]
        if first < 0 or count < 0 or first + count > n:
            raise self.fail(f"records {first}..{first + count} outside the batch's {n}")
        bs, be, payload_bytes = p["byte_start"], p["byte_end"], h["payload_bytes"]
        if not 0 <= bs <= be <= payload_bytes:
            raise self.fail(f"payload range {bs}..{be} outside 0..{payload_bytes}")
        ks, ke, key_bytes = p["key_start"], p["key_end"], h["key_bytes"]
        if not 0 <= ks <= ke <= key_bytes:
            raise self.fail(f"key range {ks}..{ke} outside 0..{key_bytes}")

    def offset_tables(self, h: dict[str, Any], p: dict[str, Any], mode: PayloadMode
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the part's record and key offset tables, checked against its ranges
        and ``mode``'s layout (not yet rebased)."""
        first, count = p["first"], p["count"]
        problem = mode.part_problem(h, p)
        if problem is not None:
            raise self.fail(problem)
        offs = self.bufs.offsets[first : first + count + 1].copy()
        koffs = self.bufs.key_offsets[first : first + count + 1].copy()
        if count and bool((offs[1:] < offs[:-1]).any()):
            raise self.fail("record offsets decrease")
        if count and bool((koffs[1:] < koffs[:-1]).any()):
            raise self.fail("key offsets decrease")
        problem = mode.offsets_problem(int(offs[0]), int(offs[-1]), p)
        if problem is not None:
            raise self.fail(problem)
        ks, ke = p["key_start"], p["key_end"]
        if not mode.keys_by_reference and (int(koffs[0]) != ks or int(koffs[-1]) != ke):
            raise self.fail(f"key offsets {int(koffs[0])}..{int(koffs[-1])} do not match the "
                            f"part's key range {ks}..{ke}")
        if h["checksum"] not in CHECKSUM_KINDS:
            raise self.fail(f"unknown checksum kind {h['checksum']}")
        return offs, koffs
