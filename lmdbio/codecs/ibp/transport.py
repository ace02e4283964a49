"""IBP batches in transport: between a node's reader and its workers, through shared memory
(``codec: {name: ibp}``).

The reader fits an IBP model once on a sample of the records' raw bytes
(:func:`fit_transport_model`; records must all have one size: tensor records, raw Datums of
one shape), shares it with the node's workers, then compresses each worker's part of every
slot separately (:func:`compress_parts`), so each worker decompresses only its own part
(:func:`decompress_part`). Less data sits in node shared memory and, on GPU workers, crosses
PCIe.

Underneath, one frame goes straight into a preallocated slot (a numpy view over the shared
window) with :func:`compress_into`, and workers call :func:`decompress_from` on the slot, on
their own device (``xp`` = numpy or cupy). Slots are sized with :func:`max_packed_nbytes`.

The reader reaches all of this through the batch codec registry: :class:`IBPRingCodec` is the
``ring`` of codec ``ibp`` (:class:`~lmdbio.codecs.registry.RingTransport`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel, fit
from lmdbio.codecs.ibp.packed import (
    IBPPacked,
    compress_frame_into,
    decompress,
    max_frame_nbytes,
)
from lmdbio.errors import CodecError, ConfigError
from lmdbio.io.gather import gather, gather_refs

if TYPE_CHECKING:
    from lmdbio.lmdb import Database

#: records the transport model is fitted on, spread over the database
SAMPLE_RECORDS = 2048


def as_uint8(buffer: Any) -> np.ndarray:
    """An IBP frame (a C-contiguous array or any buffer) as flat uint8, without a copy."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise CodecError("IBP buffer must be C-contiguous")
        return buffer.reshape(-1).view(np.uint8)
    return np.frombuffer(buffer, np.uint8)


def max_packed_nbytes(model: IBPModel, nrows: int, layout: str = "condensed") -> int:
    """Bytes a slot needs to hold any batch of ``nrows`` rows (all rows raw, plus header)."""
    return max_frame_nbytes(model, nrows, layout)


def compress_into(model: IBPModel, rows: Any, out_buffer: Any, layout: str = "condensed",
                  checksum: bool = False) -> int:
    """Compress ``rows`` into ``out_buffer`` (writable, e.g. a numpy view over shared memory)
    as one frame; return the bytes written. ``layout``: ``"condensed"`` (fewest bytes) or
    ``"inplace"``. ``checksum`` adds a CRC-32 (not needed within one host)."""
    out = as_uint8(out_buffer)
    if not out.flags.writeable:
        raise CodecError("IBP compress_into needs a writable buffer")
    return compress_frame_into(model, rows, out, layout, checksum)


def decompress_from(model: IBPModel, buffer: Any, nrows: int | None = None, xp: Any = np,
                    method: str = "auto", out: Any = None) -> Any:
    """Rows of the frame at the start of ``buffer`` (trailing slot bytes are ignored), decoded
    with ``xp``. ``nrows``, when given, must match the frame; ``out`` (CPU only) receives the
    rows without an extra allocation."""
    packed = IBPPacked.from_bytes(as_uint8(buffer), exact=False, validate=False)
    if nrows is not None and packed.nrows != nrows:
        raise CodecError(f"IBP frame holds {packed.nrows} rows, expected {nrows}")
    return decompress(model, packed, xp=xp, method=method, out=out)


def fit_transport_model(db: Database, options: dict[str, Any]) -> IBPModel:
    """Fit the IBP model on up to ``SAMPLE_RECORDS`` records spread over the database
    (every value must have one size: a :class:`~lmdbio.errors.ConfigError` naming two
    keys of different sizes otherwise)."""
    n = len(db)
    if n == 0:
        raise ConfigError(f"codec ibp: {db.where} holds no records; the transport "
                          "model is fitted on a sample of its records (fixed-size values)")
    idx = np.unique(np.linspace(0, n - 1, min(n, SAMPLE_RECORDS)).astype(np.int64))
    refs = db.locate(idx) if db.has_leaf_directory else None
    where = db.record_table() if refs is None else refs
    sizes = np.unique(where.val_len)
    if sizes.size != 1:
        lens = where.val_len
        other = int(np.flatnonzero(lens != lens[0])[0])
        a, b = (bytes(db.mv[o:o + k]) for o, k in ((int(where.key_off[i]),
                                                     int(where.key_len[i])) for i in (0, other)))
        raise ConfigError(f"codec ibp compresses fixed-size records (every value of one "
                          f"size); {db.where} holds values of {sizes.size} sizes "
                          f"({sizes.min()}..{sizes.max()} bytes): key {a!r} holds "
                          f"{int(lens[0])} bytes, key {b!r} {int(lens[other])}")
    buf, _ = gather(db, idx) if refs is None else gather_refs(db, refs)
    rows = buf.reshape(idx.size, int(sizes[0]))
    chunk = int(options.get("chunk_bytes", 4))
    return fit(rows, chunk_bytes=chunk, threshold=options.get("threshold"))


def compress_parts(model: IBPModel, payload: np.ndarray, offsets: np.ndarray,
                   counts: np.ndarray, *, keys: tuple[np.ndarray, np.ndarray] | None = None,
                   where: str = "the database") -> list[np.ndarray]:
    """One IBP frame per worker part of a gathered batch: records bounded by ``offsets``
    in ``payload``, ``counts`` per part, every one of the model's row size. A record of
    another size raises a :class:`~lmdbio.errors.ConfigError` naming it: its key (from
    ``keys``, the batch's key bounds and bytes, when given) and ``where`` (the file)."""
    n = offsets.shape[0] - 1
    size = int(model.row_bytes)
    # every record, not only the first and the total: sizes that differ but add up would
    # otherwise be cut into rows silently (one whole-array pass per slot); the bounds
    # start at 0 (the reader gathers the batch into its own buffer)
    if n and bool((np.diff(offsets) != size).any()):
        raise ConfigError(_size_refusal(offsets, size, keys, where))
    rows = payload[:n * size].reshape(n, size) if n else payload[:0].reshape(0, 0)
    blobs = []
    start = 0
    for c in counts.tolist():
        part = rows[start:start + c]
        out = np.empty(max_packed_nbytes(model, c), np.uint8)
        used = compress_into(model, part, out)
        blobs.append(out[:used])
        start += c
    return blobs


def _size_refusal(offsets: np.ndarray, size: int, keys: tuple[np.ndarray, np.ndarray] | None,
                  where: str) -> str:
    """Why :func:`compress_parts` refuses a batch: its first record not of ``size`` bytes,
    named by its key when ``keys`` are given, else by its place in the batch."""
    lens = np.diff(offsets)
    bad = np.flatnonzero(lens != size)
    i = int(bad[0])  # compress_parts calls this only when a record is off
    if keys is not None:
        bounds, data = keys
        name = f"key {bytes(data[int(bounds[i]):int(bounds[i + 1])])!r}"
    else:
        name = f"record {i} of the batch"
    return (f"codec ibp compresses fixed-size records: {name} in {where} holds "
            f"{int(lens[i])} bytes, the transport model's rows {size} (the values it was "
            "fitted on)")


def decompress_part(model: IBPModel, blob: np.ndarray, count: int, xp: Any = np
                    ) -> np.ndarray:
    """The rows of one worker part, as one contiguous uint8 buffer."""
    rows = decompress_from(model, blob, nrows=count, xp=xp)
    return rows.reshape(-1).view(np.uint8) if xp is np else rows.reshape(-1)


class IBPRingCodec:
    """IBP as a node ring's batch codec: the ``ring`` of the registry's codec ``ibp``.

    Instances are :class:`~lmdbio.codecs.registry.RingCodec` (one fitted model: the
    reader encodes one frame per worker part, each worker decodes its own); the class is
    its :class:`~lmdbio.codecs.registry.RingTransport` (:meth:`fit` on the reader,
    :meth:`from_bytes` on every rank of the node)."""

    #: how the reader's waits and errors name it
    title: ClassVar[str] = "IBP"
    #: slot bytes per part beyond the rows' worst case (its frame's header)
    PART_HEADER_BYTES: ClassVar[int] = 4096

    def __init__(self, model: IBPModel) -> None:
        self.model = model

    @classmethod
    def fit(cls, db: Database, options: dict[str, Any]) -> IBPRingCodec:
        """Fit the model on a sample of ``db``'s records (:func:`fit_transport_model`)."""
        return cls(fit_transport_model(db, options))

    @classmethod
    def from_bytes(cls, blob: bytes) -> IBPRingCodec:
        """The codec whose :meth:`to_bytes` gave ``blob``."""
        return cls(IBPModel.from_bytes(blob))

    def to_bytes(self) -> bytes:
        """The model's bytes, as the reader sends them to its node's workers."""
        return self.model.to_bytes()

    def slot_bytes(self, rows: int, parts: int, raw_bytes: int) -> int:
        """Payload bytes of a slot of ``rows`` rows in ``parts`` frames: every row raw,
        every frame's header, and one row's share of ``raw_bytes`` (the rows unencoded)."""
        return (max_packed_nbytes(self.model, rows) + parts * self.PART_HEADER_BYTES
                + raw_bytes // max(rows, 1))

    def encode_parts(self, payload: np.ndarray, offsets: np.ndarray, counts: np.ndarray, *,
                     keys: tuple[np.ndarray, np.ndarray] | None = None,
                     where: str = "the database") -> list[np.ndarray]:
        """One frame per worker part (:func:`compress_parts`)."""
        return compress_parts(self.model, payload, offsets, counts, keys=keys, where=where)

    def decode_part(self, blob: np.ndarray, count: int) -> np.ndarray:
        """One worker part's ``count`` rows as one uint8 buffer (:func:`decompress_part`)."""
        return decompress_part(self.model, blob, count)
