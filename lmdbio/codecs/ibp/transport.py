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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def fit_transport_model(db: Database, options: dict[str, Any]) -> Any:
    """Fit the IBP model on up to ``SAMPLE_RECORDS`` records spread over the database."""
    n = len(db)
    if n == 0:
        raise ConfigError("codec ibp: the database is empty")
    idx = np.unique(np.linspace(0, n - 1, min(n, SAMPLE_RECORDS)).astype(np.int64))
    refs = db.locate(idx) if db.has_leaf_directory else None
    sizes = np.unique(db.record_table().val_len if refs is None else refs.val_len)
    if sizes.size != 1:
        raise ConfigError(f"codec ibp compresses fixed-size records; {db.path} holds "
                          f"values of {sizes.size} sizes ({sizes.min()}..{sizes.max()})")
    buf, _ = gather(db, idx) if refs is None else gather_refs(db, refs)
    rows = buf.reshape(idx.size, int(sizes[0]))
    chunk = int(options.get("chunk_bytes", 4))
    return fit(rows, chunk_bytes=chunk, threshold=options.get("threshold"))


def compress_parts(model: Any, payload: np.ndarray, offsets: np.ndarray,
                   counts: np.ndarray) -> list[np.ndarray]:
    """One IBP frame per worker part of a gathered batch (rows of one size)."""
    n = offsets.shape[0] - 1
    size = int(offsets[1] - offsets[0]) if n else 0
    if n and int(offsets[-1]) != n * size:
        raise ConfigError("codec ibp: a batch holds records of different sizes")
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


def decompress_part(model: Any, blob: np.ndarray, count: int, xp: Any = np) -> np.ndarray:
    """The rows of one worker part, as one contiguous uint8 buffer."""
    rows = decompress_from(model, blob, nrows=count, xp=xp)
    return rows.reshape(-1).view(np.uint8) if xp is np else rows.reshape(-1)
