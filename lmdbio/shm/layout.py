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

Three payload modes, one class each in :mod:`lmdbio.shm.payload_modes`:

* copied (default): ``offsets`` index the payload; worker ``w`` reads the bytes
  ``offsets[first_w] : offsets[first_w + count_w]``.
* part-encoded (:data:`FLAG_PART_ENCODED`, set by ``SlotWriter.write_part_blobs``): the
  reader encoded each worker's records into one blob with a batch codec (header ``codec``
  names it); part ``w``'s byte range is that blob, and ``offsets`` are in decoded coordinates
  (worker-relative after rebasing), so a worker decodes its blob, then slices records.
* by reference (:data:`FLAG_SPANS`, set by ``SlotWriter.set_spans``): the records stay in
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
XXH64 (default; numba kernel in :mod:`lmdbio.shm.kernels`, several GB/s) or crc32
(``zlib.crc32``, no compilation, about 1-2 GB/s). No Python loop per record either way.

The slot's writer is :class:`lmdbio.shm.writer.SlotWriter`, its reader
:func:`lmdbio.shm.view.read_slot` (a :class:`lmdbio.shm.view.SlotView` per worker part).
"""

from __future__ import annotations

import operator
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from lmdbio.errors import ConfigError
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module
from lmdbio.shm.errors import RingError

__all__ = [
    "CHECKSUM_CRC32",
    "CHECKSUM_KINDS",
    "CHECKSUM_NAMES",
    "CHECKSUM_NONE",
    "CHECKSUM_XXH64",
    "FLAG_KEY_SPANS",
    "FLAG_LAST_IN_EPOCH",
    "FLAG_PADDED",
    "FLAG_PART_ENCODED",
    "FLAG_SPANS",
    "HEADER",
    "HEADER_CRC_AT",
    "HEADER_DTYPE",
    "MAGIC",
    "MODE_FLAGS",
    "PART",
    "PART_DTYPE",
    "VERSION",
    "PackedFormat",
    "SlotBuffers",
    "SlotChecksum",
    "SlotLayout",
    "as_int64_array",
    "check_offset_table",
    "checksum_kind",
    "header_crc",
    "part_checksum",
    "payload_bytes_for",
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
#: offsets; lengths from the offset table) instead of its bytes: ``SlotWriter.set_spans``
FLAG_SPANS = 1 << 3
#: the key area holds each key's span in that file the same way (8-byte offsets; lengths
#: from the key offset table): ``SlotWriter.set_spans`` with ``key_spans``
FLAG_KEY_SPANS = 1 << 4
#: the flag bits that name a slot's payload mode (set by the writer's mode, never by the
#: caller); bits 16..31 are free for the caller
MODE_FLAGS = FLAG_PART_ENCODED | FLAG_SPANS | FLAG_KEY_SPANS

CHECKSUM_NONE = 0
CHECKSUM_CRC32 = 1
CHECKSUM_XXH64 = 2
#: the slot checksums by name (``readers.checksum`` of a job): the one declaration
SlotChecksum = Literal["xxh64", "crc32", "none"]
#: the kind a slot header names, by checksum name (in :data:`SlotChecksum`'s order)
CHECKSUM_NAMES: dict[str, int] = dict(zip(
    get_args(SlotChecksum), (CHECKSUM_XXH64, CHECKSUM_CRC32, CHECKSUM_NONE), strict=True))
#: every checksum kind a slot header may name
CHECKSUM_KINDS = frozenset(CHECKSUM_NAMES.values())

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


#: ``struct`` codes of little-endian integer fields, by numpy kind and size
_STRUCT_CODES = {("i", 1): "b", ("i", 2): "h", ("i", 4): "i", ("i", 8): "q",
                 ("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q"}


class PackedFormat:
    """A packed little-endian structured dtype read and written with ``struct``.

    The ``struct`` format is derived from the dtype (the one declaration of the layout):
    packing or unpacking a header this way costs about a microsecond, an order of magnitude
    less than numpy structured-field access. Fields are given and returned by name.
    """

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.names: tuple[str, ...] = tuple(dtype.names or ())
        codes = []
        for name in self.names:
            ftype = dtype.fields[name][0]  # type: ignore[index]
            if ftype.byteorder == ">":
                raise TypeError(f"field {name!r}: big-endian fields are not supported")
            code = f"{ftype.itemsize}s" if ftype.kind == "S" else \
                _STRUCT_CODES.get((ftype.kind, ftype.itemsize))
            if code is None:
                raise TypeError(f"field {name!r}: no struct code for {ftype}")
            codes.append(code)
        self.struct = struct.Struct("<" + "".join(codes))
        if self.struct.size != dtype.itemsize:
            raise TypeError(f"{dtype} has padding: it is not a packed layout")
        #: bytes of one record
        self.size = self.struct.size
        self._values_of = operator.itemgetter(*self.names)

    def offset(self, name: str) -> int:
        """Byte offset of field ``name`` in a record."""
        return int(self.dtype.fields[name][1])  # type: ignore[index]

    def unpack(self, buffer: Any, offset: int = 0) -> dict[str, Any]:
        """The fields of the record at ``offset`` of ``buffer``, by name."""
        return dict(zip(self.names, self.struct.unpack_from(buffer, offset), strict=True))

    def pack(self, fields: Mapping[str, Any]) -> bytes:
        """One record of ``fields`` (every field, by name); raises ``struct.error`` on a
        value out of its field's range."""
        return self.struct.pack(*self._values_of(fields))


#: :data:`HEADER_DTYPE` packed with ``struct`` (the read and seal fast path)
HEADER = PackedFormat(HEADER_DTYPE)
#: :data:`PART_DTYPE` packed with ``struct``
PART = PackedFormat(PART_DTYPE)
#: byte offset of ``header_crc`` in the header
HEADER_CRC_AT = HEADER.offset("header_crc")

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


def as_int64_array(name: str, values: Any, where: str) -> np.ndarray:
    """``values`` as a 1-D int64 array; :class:`RingError` (naming ``where`` and ``name``)
    when it is not a 1-D integer array."""
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise RingError(f"{where}: {name} must be a 1-D integer array, got shape "
                        f"{arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def check_offset_table(name: str, offs: np.ndarray, where: str) -> None:
    """Raise :class:`RingError` unless ``offs`` is an offset table: not empty, starting at
    0, never decreasing."""
    if offs.size == 0:
        raise RingError(f"{where}: {name} needs n_records + 1 entries, got an empty array")
    if offs[0] != 0:
        raise RingError(f"{where}: {name}[0] must be 0, got {int(offs[0])}")
    if offs.size > 1 and bool((offs[1:] < offs[:-1]).any()):
        i = int(np.flatnonzero(offs[1:] < offs[:-1])[0])
        raise RingError(
            f"{where}: {name} must not decrease, but {name}[{i + 1}] = "
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
        if value.lower() in CHECKSUM_NAMES:
            return CHECKSUM_NAMES[value.lower()]
    elif isinstance(value, int) and value in CHECKSUM_KINDS:
        return value
    names = ", ".join(repr(n) for n in CHECKSUM_NAMES)
    raise ConfigError(f"batch ring: checksum must be True, False or one of {names}, "
                      f"got {value!r}")


def part_checksum(kind: int, bufs: SlotBuffers, first: int, count: int, bs: int, be: int,
                  ks: int, ke: int) -> int:
    """Checksum of the bytes part ``[first, first + count)`` reads (see the module doc)."""
    if kind == CHECKSUM_XXH64:
        part_hash_at = kernel_module("lmdbio.shm").part_hash_at
        return int(part_hash_at(read_only(bufs.payload), read_only(bufs.offsets_bytes),
                                read_only(bufs.labels_bytes),
                                read_only(bufs.key_offsets_bytes), read_only(bufs.keys),
                                first, count, bs, be, ks, ke))
    pieces = (bufs.payload[bs:be], bufs.offsets[first : first + count + 1],
              bufs.labels[first : first + count], bufs.key_offsets[first : first + count + 1],
              bufs.keys[ks:ke])
    crc = 0
    for p in pieces:
        crc = zlib.crc32(p, crc)
    return crc


def header_crc(header: Any, parts: Any) -> int:
    """crc32 of the header bytes (``header_crc`` counted as zero) and the part table bytes."""
    hb = memoryview(header).cast("B")
    crc = zlib.crc32(hb[:HEADER_CRC_AT])
    crc = zlib.crc32(b"\0\0\0\0", crc)
    crc = zlib.crc32(hb[HEADER_CRC_AT + 4 : HEADER.size], crc)
    return zlib.crc32(parts, crc)
