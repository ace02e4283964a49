"""The binary layout of one batch slot, and the code that writes and validates it.

Nothing here imports MPI: a slot is just a ``numpy.uint8`` array (in the ring, a page-aligned
piece of the node's MPI-3 shared window), so the whole format can be tested in-process.

One slot, every section aligned to 64 bytes and the payload to a 4 KiB page::

    header        HEADER_DTYPE (128 bytes): magic, version, slot, seq, epoch, iteration,
                  first_sample, n_records, payload_bytes, key_bytes, n_parts, flags,
                  checksum kind, header_crc, codec name
    parts         n_parts x PART_DTYPE: per worker (first record, record count, payload byte
                  range, key byte range, checksum of everything that worker reads)
    offsets       (max_records + 1) int64: record i is payload[offsets[i]:offsets[i+1]]
    labels        max_records int64
    key_offsets   (max_records + 1) int64 into the key area (keys are kept for traceability)
    keys          key_capacity bytes
    payload       payload_capacity bytes (variable-size records, packed)

Records are variable-size; capacities are set when the ring is created, and a batch that does
not fit raises :class:`~lmdbio.shm.errors.SlotCapacityError` naming the needed and available
sizes. :func:`payload_bytes_for` gives the tight bound for a dataset: the sum of its
``batch_size`` largest records, which no batch of any order can exceed.

Two payload modes:

* raw (default): ``offsets`` index the payload; worker ``w`` reads the bytes
  ``offsets[first_w] : offsets[first_w + count_w]``.
* part-encoded (:data:`FLAG_PART_ENCODED`, set by :meth:`SlotWriter.write_part_blobs`): the
  reader encoded each worker's records into one blob with a batch codec (header ``codec``
  names it); part ``w``'s byte range is that blob, and ``offsets`` are in decoded coordinates
  (worker-relative after rebasing), so a worker decodes its blob, then slices records.
* by reference (:data:`FLAG_SPANS`, set by :meth:`SlotWriter.set_spans`): the records stay in
  a file every worker has mapped (the database); the payload holds each record's start
  offset in it (8 bytes), ``offsets`` the lengths as running sums, so part ``w``'s payload
  range is its ``8 * count_w`` bytes of starts. No record byte is copied into the slot.
  With :data:`FLAG_KEY_SPANS` the keys are by reference too, in the same form: the key area
  holds each key's start in the file, ``key_offsets`` the key lengths as running sums, and
  part ``w``'s key range is its ``8 * count_w`` bytes of starts (a slot's key area then
  needs 8 bytes per record, not room for LMDB's longest key).

Checksums: the header and part table are always covered by ``header_crc`` (crc32, a few
hundred bytes); with checksums on, each part additionally carries a 64-bit checksum of exactly
the bytes its worker reads (payload range, offsets, labels, key offsets, key bytes), so every
worker verifies only its own share and the whole batch is hashed once on each side. Kinds:
XXH64 (default; numba kernel in :mod:`lmdbio.shm._hash`, several GB/s) or crc32
(``zlib.crc32``, no compilation, about 1-2 GB/s). No Python loop per record either way.
"""

from __future__ import annotations

import itertools
import operator
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from lmdbio.errors import ConfigError
from lmdbio.shm.errors import RingError, SlotCapacityError, SlotCorruptError

__all__ = [
    "CHECKSUM_CRC32",
    "CHECKSUM_NONE",
    "CHECKSUM_XXH64",
    "FLAG_KEY_SPANS",
    "FLAG_LAST_IN_EPOCH",
    "FLAG_PADDED",
    "FLAG_PART_ENCODED",
    "FLAG_SPANS",
    "HEADER_DTYPE",
    "MAGIC",
    "PART_DTYPE",
    "VERSION",
    "DeviceBatch",
    "SlotBuffers",
    "SlotLayout",
    "SlotView",
    "SlotWriter",
    "checksum_kind",
    "payload_bytes_for",
    "read_slot",
]

#: b"LMDBIOSL" read as a little-endian uint64: the first 8 bytes of every written slot
MAGIC = int.from_bytes(b"LMDBIOSL", "little")
#: slot format version
VERSION = 1
#: section alignment inside a slot (a cache line)
ALIGN = 64
#: payload and slot alignment (a page: DMA, ``hostRegister`` and huge copies like it)
PAGE = 4096

#: this batch is the last one of its epoch
FLAG_LAST_IN_EPOCH = 1 << 0
#: this batch holds padding records (e.g. a padded last batch)
FLAG_PADDED = 1 << 1
#: each part's payload range is one blob encoded with the header's codec
FLAG_PART_ENCODED = 1 << 2
#: the payload holds each record's span in a file the workers map (8-byte little-endian
#: offsets; lengths from the offset table) instead of its bytes: :meth:`SlotWriter.set_spans`
FLAG_SPANS = 1 << 3
#: the key area holds each key's span in that file the same way (8-byte offsets; lengths
#: from the key offset table): :meth:`SlotWriter.set_spans` with ``key_spans``
FLAG_KEY_SPANS = 1 << 4
#: flag bits that lmdbio defines; bits 16..31 are free for the caller
_RESERVED_FLAGS = FLAG_PART_ENCODED | FLAG_SPANS | FLAG_KEY_SPANS

CHECKSUM_NONE = 0
CHECKSUM_CRC32 = 1
CHECKSUM_XXH64 = 2
_CHECKSUM_NAMES = {"none": CHECKSUM_NONE, "crc32": CHECKSUM_CRC32, "xxh64": CHECKSUM_XXH64}

HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<u4"),
        ("slot", "<u4"),
        ("seq", "<i8"),
        ("epoch", "<i8"),
        ("iteration", "<i8"),
        ("first_sample", "<i8"),
        ("n_records", "<i8"),
        ("payload_bytes", "<i8"),
        ("key_bytes", "<i8"),
        ("n_parts", "<u4"),
        ("flags", "<u4"),
        ("checksum", "<u4"),
        ("header_crc", "<u4"),
        ("codec", "S16"),
    ]
)

PART_DTYPE = np.dtype(
    [
        ("first", "<i8"),
        ("count", "<i8"),
        ("byte_start", "<i8"),
        ("byte_end", "<i8"),
        ("key_start", "<i8"),
        ("key_end", "<i8"),
        ("checksum", "<u8"),
    ]
)

#: the same layouts as ``struct`` formats: packing and unpacking a header this way costs about
#: a microsecond, an order of magnitude less than numpy structured-field access
_HEADER = struct.Struct("<QIIqqqqqqqIIII16s")
_PART = struct.Struct("<qqqqqqQ")
_CRC_AT = HEADER_DTYPE.fields["header_crc"][1]
assert _HEADER.size == HEADER_DTYPE.itemsize and _PART.size == PART_DTYPE.itemsize

_I64_MAX = np.iinfo(np.int64).max


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _as_count(name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"batch ring: {name} must be an integer, got {value!r}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"batch ring: {name} must be an integer, got {value!r}") from None
    if n < minimum:
        raise ConfigError(f"batch ring: {name} must be >= {minimum}, got {n}")
    return n


def payload_bytes_for(sizes: Any, batch_size: int) -> int:
    """Bytes a slot needs so that *any* batch of ``batch_size`` records fits.

    ``sizes`` are the record sizes of the dataset (e.g. the value lengths of the page
    engine's record table). The bound is the sum of the ``batch_size`` largest sizes, which
    holds for every order (shuffled or not) and is usually far below ``max * batch_size``.
    ``O(len(sizes))`` with ``numpy.partition``. Add room for a codec's worst case yourself.
    """
    arr = np.asarray(sizes)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ConfigError(
            f"payload_bytes_for needs a 1-D integer array of record sizes, got shape "
            f"{arr.shape} dtype {arr.dtype}"
        )
    b = _as_count("batch_size", batch_size, 1)
    if arr.size == 0:
        return 0
    if arr.min() < 0:
        raise ConfigError("payload_bytes_for: record sizes must be >= 0")
    arr = arr.astype(np.int64, copy=False)
    if b >= arr.size:
        return int(arr.sum())
    return int(np.partition(arr, arr.size - b)[arr.size - b :].sum())


@dataclass(frozen=True)
class SlotLayout:
    """Capacities of one slot and the byte offset of every section in it.

    ``n_parts`` is the number of workers a batch is divided among, ``max_records`` the most
    records of one batch, ``payload_capacity`` / ``key_capacity`` the payload and key bytes.
    """

    n_parts: int
    max_records: int
    payload_capacity: int
    key_capacity: int = 0

    def __post_init__(self) -> None:
        n_parts = _as_count("n_parts (workers)", self.n_parts, 1)
        max_records = _as_count("max_records", self.max_records, 1)
        payload = _as_count("payload_bytes", self.payload_capacity, 0)
        keys = _as_count("key_bytes", self.key_capacity, 0)
        offs = {}
        pos = _round_up(HEADER_DTYPE.itemsize, ALIGN)
        for name, nbytes in (
            ("parts", n_parts * PART_DTYPE.itemsize),
            ("offsets", (max_records + 1) * 8),
            ("labels", max_records * 8),
            ("key_offsets", (max_records + 1) * 8),
            ("keys", keys),
        ):
            offs[name] = pos
            pos = _round_up(pos + nbytes, ALIGN)
        offs["payload"] = _round_up(pos, PAGE)
        size = _round_up(offs["payload"] + payload, PAGE)
        if size > _I64_MAX // 1024:
            raise ConfigError(f"batch ring: a slot of {size} bytes is too large")
        for name, value in (
            ("n_parts", n_parts),
            ("max_records", max_records),
            ("payload_capacity", payload),
            ("key_capacity", keys),
            ("_offsets", offs),
            ("slot_size", size),
        ):
            object.__setattr__(self, name, value)

    #: bytes of one slot (a multiple of :data:`PAGE`), computed from the capacities
    slot_size: int = field(init=False, default=0)

    def offset(self, section: str) -> int:
        """Byte offset of ``section`` ("parts", "offsets", "labels", "key_offsets", "keys",
        "payload") from the start of the slot."""
        return self._offsets[section]  # type: ignore[attr-defined]

    def window_bytes(self, slots: int) -> int:
        """Size of a window holding ``slots`` slots of this layout."""
        return _as_count("slots", slots, 1) * self.slot_size


class SlotBuffers:
    """Typed numpy views (no copies) of the sections of one slot in ``mem``."""

    __slots__ = (
        "header",
        "key_offsets",
        "key_offsets_bytes",
        "keys",
        "labels",
        "labels_bytes",
        "layout",
        "mem",
        "offsets",
        "offsets_bytes",
        "parts",
        "payload",
    )

    def __init__(self, layout: SlotLayout, mem: np.ndarray) -> None:
        if mem.dtype != np.uint8 or mem.ndim != 1 or mem.size < layout.slot_size:
            raise RingError(
                f"slot memory must be a 1-D uint8 array of >= {layout.slot_size} bytes, "
                f"got {mem.dtype} shape {mem.shape}"
            )
        lo = layout
        n = lo.max_records
        self.layout = lo
        self.mem = mem
        self.header = mem[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)
        p = lo.offset("parts")
        self.parts = mem[p : p + lo.n_parts * PART_DTYPE.itemsize].view(PART_DTYPE)
        p = lo.offset("offsets")
        self.offsets = mem[p : p + (n + 1) * 8].view("<i8")
        p = lo.offset("labels")
        self.labels = mem[p : p + n * 8].view("<i8")
        p = lo.offset("key_offsets")
        self.key_offsets = mem[p : p + (n + 1) * 8].view("<i8")
        p = lo.offset("keys")
        self.keys = mem[p : p + lo.key_capacity]
        p = lo.offset("payload")
        self.payload = mem[p : p + lo.payload_capacity]
        # the int64 tables as bytes (what the checksum reads), made once per slot
        self.offsets_bytes = self.offsets.view(np.uint8)
        self.labels_bytes = self.labels.view(np.uint8)
        self.key_offsets_bytes = self.key_offsets.view(np.uint8)


def _int_array(name: str, values: Any, owner: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise RingError(f"{owner.where}: {name} must be a 1-D integer array, got shape "
                        f"{arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _check_offsets(name: str, offs: np.ndarray, owner: Any) -> None:
    if offs.size == 0:
        raise RingError(f"{owner.where}: {name} needs n_records + 1 entries, got an empty array")
    if offs[0] != 0:
        raise RingError(f"{owner.where}: {name}[0] must be 0, got {int(offs[0])}")
    if offs.size > 1 and bool((offs[1:] < offs[:-1]).any()):
        i = int(np.flatnonzero(offs[1:] < offs[:-1])[0])
        raise RingError(
            f"{owner.where}: {name} must not decrease, but {name}[{i + 1}] = "
            f"{int(offs[i + 1])} < {name}[{i}] = {int(offs[i])}"
        )


def checksum_kind(value: bool | str | int | None) -> int:
    """The checksum kind for ``value``: ``True`` / ``"xxh64"`` -> XXH64, ``"crc32"``,
    ``False`` / ``None`` / ``"none"`` -> none; a kind number passes through."""
    if value is True:
        return CHECKSUM_XXH64
    if value is False or value is None:
        return CHECKSUM_NONE
    if isinstance(value, str):
        if value.lower() in _CHECKSUM_NAMES:
            return _CHECKSUM_NAMES[value.lower()]
    elif isinstance(value, int) and value in _CHECKSUM_NAMES.values():
        return value
    raise ConfigError(f"batch ring: checksum must be True, False, 'xxh64', 'crc32' or 'none', "
                      f"got {value!r}")


def _part_checksum(kind: int, bufs: SlotBuffers, first: int, count: int, bs: int, be: int,
                   ks: int, ke: int) -> int:
    """Checksum of the bytes part ``[first, first + count)`` reads (see the module doc)."""
    if kind == CHECKSUM_XXH64:
        from lmdbio.shm._hash import part_hash_at

        return int(part_hash_at(bufs.payload, bufs.offsets_bytes, bufs.labels_bytes,
                                bufs.key_offsets_bytes, bufs.keys, first, count, bs, be, ks,
                                ke))
    pieces = (bufs.payload[bs:be], bufs.offsets[first : first + count + 1],
              bufs.labels[first : first + count], bufs.key_offsets[first : first + count + 1],
              bufs.keys[ks:ke])
    crc = 0
    for p in pieces:
        crc = zlib.crc32(p, crc)
    return crc


def _header_crc(header: Any, parts: Any) -> int:
    """crc32 of the header bytes (``header_crc`` counted as zero) and the part table bytes."""
    hb = memoryview(header).cast("B")
    crc = zlib.crc32(hb[:_CRC_AT])
    crc = zlib.crc32(b"\0\0\0\0", crc)
    crc = zlib.crc32(hb[_CRC_AT + 4 : _HEADER.size], crc)
    return zlib.crc32(parts, crc)


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
        checksum: bool | str = True,
        on_publish: Callable[[SlotWriter], None] | None = None,
    ) -> None:
        self._bufs: SlotBuffers | None = bufs
        self.layout = bufs.layout
        self.slot = int(slot)
        self.seq = int(seq)
        self.epoch = int(epoch)
        self.iteration = int(iteration)
        self.checksum = checksum_kind(checksum)
        self._on_publish = on_publish
        self._n: int | None = None
        self._decoded = False
        self._key_bytes = 0
        self._counts: np.ndarray | None = None
        self._blob_ranges: np.ndarray | None = None
        self._spans = False
        self._key_spans = False
        self._published = False
        #: payload bytes of the sealed batch (0 before :meth:`seal`)
        self.payload_bytes = 0

    # ------------------------------------------------------------------ helpers
    @property
    def where(self) -> str:
        """``"slot S (sequence Q, epoch E, iteration I)"`` for error messages."""
        return (f"slot {self.slot} (sequence {self.seq}, epoch {self.epoch}, iteration "
                f"{self.iteration})")

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
        offs = _int_array("offsets", offsets, self)
        _check_offsets("offsets", offs, self)
        n = offs.size - 1
        if n > self.layout.max_records:
            raise SlotCapacityError("records", n, self.layout.max_records, self.where)
        if not decoded and offs[-1] > self.capacity:
            raise SlotCapacityError("payload bytes", int(offs[-1]), self.capacity, self.where)
        if labels is None:
            lab = None
        else:
            lab = _int_array("labels", labels, self)
            if lab.size != n:
                raise RingError(f"{self.where}: {lab.size} labels for {n} records")
        bufs.offsets[: n + 1] = offs
        if lab is None:
            bufs.labels[:n] = -1
        else:
            bufs.labels[:n] = lab
        self._set_keys(bufs, keys, n)
        self._n = n
        self._decoded = bool(decoded)
        self._counts = None
        self._blob_ranges = None
        self._spans = False
        self._key_spans = False

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
        bufs.payload[: 8 * n] = st.astype("<i8").view(np.uint8)
        if key_spans is not None:
            bufs.key_offsets[0] = 0
            np.cumsum(kln, out=bufs.key_offsets[1 : n + 1])
            bufs.keys[: 8 * n] = kst.astype("<i8").view(np.uint8)
            self._key_bytes = 8 * n
            self._key_spans = True
        self._decoded = False
        self._spans = True

    def _span_arrays(self, what_starts: str, what_lengths: str, starts: Any, lengths: Any
                     ) -> tuple[np.ndarray, np.ndarray]:
        st = _int_array(what_starts, starts, self)
        ln = _int_array(what_lengths, lengths, self)
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
        lab = _int_array("labels", labels, self)
        if lab.size != n:
            raise RingError(f"{self.where}: {lab.size} labels for {n} records")
        bufs.labels[:n] = lab
        self._n = n
        self._key_bytes = int(key_bytes)
        self._decoded = False
        self._counts = None
        self._blob_ranges = None
        self._spans = False
        self._key_spans = False

    def _set_keys(self, bufs: SlotBuffers, keys: Any, n: int) -> None:
        if keys is None:
            bufs.key_offsets[: n + 1] = 0
            self._key_bytes = 0
            return
        if isinstance(keys, tuple) and len(keys) == 2 and not isinstance(keys[0], bytes):
            koffs = _int_array("key_offsets", keys[0], self)
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
        _check_offsets("key_offsets", koffs, self)
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
        src = np.frombuffer(payload, dtype=np.uint8) if not isinstance(payload, np.ndarray) \
            else payload.reshape(-1).view(np.uint8)
        self.set_records(offsets, labels, keys)
        total = int(self._live().offsets[self._n])  # type: ignore[index]
        if total > src.size:
            raise RingError(f"{self.where}: offsets reach byte {total} but the payload has "
                            f"only {src.size} bytes")
        self._live().payload[:total] = src[:total]

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
            c = _int_array("counts", counts, self)
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
        if self._n is None or not self._decoded:
            raise RingError(f"{self.where}: call set_records(..., decoded=True) before "
                            "write_part_blobs")
        if self._counts is None:
            self.set_parts()
        p = self.layout.n_parts
        if len(blobs) != p:
            raise RingError(f"{self.where}: {len(blobs)} blobs for {p} worker parts")
        arrays = [np.frombuffer(b, dtype=np.uint8) if not isinstance(b, np.ndarray)
                  else b.reshape(-1).view(np.uint8) for b in blobs]
        sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=p)
        ends = np.cumsum(sizes)
        total = int(ends[-1])
        if total > self.capacity:
            raise SlotCapacityError("payload bytes", total, self.capacity, self.where)
        starts = ends - sizes
        for a, s in zip(arrays, starts.tolist(), strict=True):
            bufs.payload[s : s + a.size] = a
        self._blob_ranges = np.stack([starts, ends], axis=1)

    # ------------------------------------------------------------------ sealing
    def seal(self, codec: str = "none", flags: int = 0, first_sample: int = 0) -> None:
        """Write the part table, checksums and header. :meth:`publish` calls this; use it
        directly only without a ring (tests, files)."""
        bufs = self._live()
        if self._n is None:
            raise RingError(f"{self.where}: nothing to publish (call write or set_records)")
        try:
            codec_b = codec.encode("ascii")
        except (AttributeError, UnicodeEncodeError):
            raise RingError(f"{self.where}: codec must be an ASCII str, got {codec!r}") from None
        if len(codec_b) > 16:
            raise RingError(f"{self.where}: codec name {codec!r} is longer than 16 bytes")
        flags = operator.index(flags)
        if not 0 <= flags < 2**32:
            raise RingError(f"{self.where}: flags must fit in 32 bits, got {flags}")
        if flags & _RESERVED_FLAGS:
            raise RingError(f"{self.where}: flags FLAG_PART_ENCODED, FLAG_SPANS and "
                            "FLAG_KEY_SPANS are set by write_part_blobs and set_spans")
        if self._counts is None:
            self.set_parts()
        n = self._n
        counts = self._counts
        lasts = np.cumsum(counts)
        firsts = lasts - counts
        offs, koffs = bufs.offsets, bufs.key_offsets
        if self._blob_ranges is not None:
            if codec == "none":
                raise RingError(f"{self.where}: part-encoded payloads need a codec name")
            starts, ends = self._blob_ranges[:, 0], self._blob_ranges[:, 1]
            payload_bytes = int(ends[-1])
            flags |= FLAG_PART_ENCODED
        elif self._spans:
            starts, ends = 8 * firsts, 8 * lasts
            payload_bytes = 8 * n
            flags |= FLAG_SPANS
            if self._key_spans:
                flags |= FLAG_KEY_SPANS
        elif self._decoded:
            raise RingError(f"{self.where}: records were set with decoded=True but no part "
                            "blobs were written (write_part_blobs)")
        else:
            starts, ends = offs[firsts], offs[lasts]
            payload_bytes = int(offs[n])
            if payload_bytes > self.capacity:
                raise SlotCapacityError("payload bytes", payload_bytes, self.capacity, self.where)
        kstarts, kends = (8 * firsts, 8 * lasts) if self._key_spans else \
            (koffs[firsts], koffs[lasts])
        rows = zip(firsts.tolist(), counts.tolist(), starts.tolist(), ends.tolist(),
                   kstarts.tolist(), kends.tolist(), strict=True)
        packed = []
        for first, count, bs, be, ks, ke in rows:
            h = _part_checksum(self.checksum, bufs, first, count, bs, be, ks, ke) \
                if self.checksum else 0
            packed.append(_PART.pack(first, count, bs, be, ks, ke, h))
        parts_b = b"".join(packed)
        try:
            hb = _HEADER.pack(MAGIC, VERSION, self.slot, self.seq, self.epoch, self.iteration,
                              operator.index(first_sample), n, payload_bytes, self._key_bytes,
                              self.layout.n_parts, flags,
                              self.checksum, 0, codec_b)
        except struct.error as exc:
            raise RingError(f"{self.where}: a header field is out of range ({exc})") from None
        self.payload_bytes = payload_bytes
        crc = _header_crc(hb, parts_b).to_bytes(4, "little")
        hb = hb[:_CRC_AT] + crc + hb[_CRC_AT + 4 :]
        mem, po = bufs.mem, self.layout.offset("parts")
        mem[po : po + len(parts_b)] = np.frombuffer(parts_b, dtype=np.uint8)
        mem[: len(hb)] = np.frombuffer(hb, dtype=np.uint8)

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
        """Record ``i`` of this part (a read-only view; raw slots only)."""
        if self.encoded:
            raise RingError(f"ring slot {self.slot}: records of a {self.codec!r}-encoded part "
                            "are only addressable after decoding")
        if self.by_reference:
            raise RingError(f"ring slot {self.slot}: the records of a by-reference part are "
                            "in the mapped file (see spans), not in the slot")
        if not -self.count <= i < self.count:
            raise IndexError(f"record {i} of a part with {self.count} records")
        i %= self.count
        offs = self.offsets
        return self.payload[offs[i] : offs[i + 1]]

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


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


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
    lo = bufs.layout
    mem = bufs.mem
    epoch = iteration = -1

    def fail(what: str) -> SlotCorruptError:
        return SlotCorruptError(what, slot=slot, seq=seq, epoch=epoch, iteration=iteration,
                                part=part)

    # one snapshot of the header and part table (a few hundred bytes): every check and the
    # crc see the same bytes
    hb = mem[: _HEADER.size].tobytes()
    (magic, version, h_slot, h_seq, h_epoch, h_iter, first_sample, n, payload_bytes,
     key_bytes, n_parts, flags, kind, stored, codec) = _HEADER.unpack(hb)
    if magic != MAGIC:
        raise fail(f"bad magic 0x{magic:016x} (expected 0x{MAGIC:016x}): the slot was never "
                   "written or was overwritten")
    if version != VERSION:
        raise fail(f"slot format version {version}, this lmdbio reads {VERSION}")
    po = lo.offset("parts")
    pb = mem[po : po + lo.n_parts * _PART.size].tobytes()
    computed = _header_crc(hb, pb)
    if stored != computed:
        raise fail(f"header checksum mismatch (stored 0x{stored:08x}, computed "
                   f"0x{computed:08x}): the header or part table was modified")
    epoch, iteration = h_epoch, h_iter
    if h_slot != slot or h_seq != seq:
        raise fail(f"header names slot {h_slot} sequence {h_seq}: the slot was overwritten "
                   "before it was released")
    if not 0 <= n <= lo.max_records:
        raise fail(f"record count {n} outside 0..{lo.max_records}")
    if not 0 <= payload_bytes <= lo.payload_capacity:
        raise fail(f"payload size {payload_bytes} outside 0..{lo.payload_capacity}")
    if not 0 <= key_bytes <= lo.key_capacity:
        raise fail(f"key size {key_bytes} outside 0..{lo.key_capacity}")
    if n_parts != lo.n_parts:
        raise fail(f"{n_parts} parts, the ring has {lo.n_parts} workers")
    if not 0 <= part < lo.n_parts:
        raise fail(f"part index outside 0..{lo.n_parts - 1}")
    first, count, bs, be, ks, ke, stored_sum = _PART.unpack_from(pb, part * _PART.size)
    if first < 0 or count < 0 or first + count > n:
        raise fail(f"records {first}..{first + count} outside the batch's {n}")
    if not 0 <= bs <= be <= payload_bytes:
        raise fail(f"payload range {bs}..{be} outside 0..{payload_bytes}")
    if not 0 <= ks <= ke <= key_bytes:
        raise fail(f"key range {ks}..{ke} outside 0..{key_bytes}")
    offs = bufs.offsets[first : first + count + 1].copy()
    koffs = bufs.key_offsets[first : first + count + 1].copy()
    encoded = bool(flags & FLAG_PART_ENCODED)
    spans = bool(flags & FLAG_SPANS)
    key_spans = bool(flags & FLAG_KEY_SPANS)
    if spans and (encoded or bs != 8 * first or be != 8 * (first + count)
                  or payload_bytes != 8 * n):
        raise fail(f"a span table of records {first}..{first + count} must lie at payload "
                   f"bytes {8 * first}..{8 * (first + count)} (part range {bs}..{be}, "
                   f"payload {payload_bytes} bytes for {n} records)")
    if key_spans and (not spans or ks != 8 * first or ke != 8 * (first + count)
                      or key_bytes != 8 * n):
        raise fail(f"a key span table of records {first}..{first + count} must lie at key "
                   f"bytes {8 * first}..{8 * (first + count)} of a by-reference slot (part "
                   f"key range {ks}..{ke}, {key_bytes} key bytes for {n} records)")
    if count and bool((offs[1:] < offs[:-1]).any()):
        raise fail("record offsets decrease")
    if count and bool((koffs[1:] < koffs[:-1]).any()):
        raise fail("key offsets decrease")
    o0, o1 = int(offs[0]), int(offs[-1])
    if not encoded and not spans and (o0 != bs or o1 != be):
        raise fail(f"record offsets {o0}..{o1} do not match the part's payload range "
                   f"{bs}..{be}")
    if not key_spans and (int(koffs[0]) != ks or int(koffs[-1]) != ke):
        raise fail(f"key offsets {int(koffs[0])}..{int(koffs[-1])} do not match the part's "
                   f"key range {ks}..{ke}")
    if kind not in _CHECKSUM_NAMES.values():
        raise fail(f"unknown checksum kind {kind}")
    def check() -> None:
        h = _part_checksum(kind, bufs, first, count, bs, be, ks, ke)
        if h != stored_sum:
            raise fail(f"checksum mismatch (stored 0x{stored_sum:x}, computed 0x{h:x}): "
                       "the batch was corrupted in shared memory")

    deferred = None
    if verify and kind != CHECKSUM_NONE:
        if defer:
            deferred = check
        else:
            check()
    offs -= o0
    koffs -= koffs[0] if key_spans else ks
    return SlotView(
        slot=slot,
        seq=seq,
        epoch=epoch,
        iteration=iteration,
        first_sample=first_sample,
        batch_records=n,
        flags=flags,
        codec=codec.rstrip(b"\0").decode("ascii", "replace"),
        part=part,
        first=first,
        count=count,
        payload=_readonly(bufs.payload[bs:be]),
        offsets=offs,
        labels=_readonly(bufs.labels[first : first + count]),
        key_offsets=koffs,
        key_data=_readonly(bufs.keys[ks:ke]),
        release=release,
        pin=pin,
        verify=deferred,
    )
