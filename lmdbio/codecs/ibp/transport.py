"""What the service needs to move IBP batches through shared memory.

The reader fits a model once (:func:`lmdbio.codecs.ibp.fit`, usually on a sample), compresses
each node batch with :func:`compress_into` straight into a preallocated slot (a numpy view
over the shared window), and workers call :func:`decompress_from` on the slot, on their own
device (``xp`` = numpy or cupy). Slots are sized with :func:`max_packed_nbytes`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel
from lmdbio.codecs.ibp.packed import (
    IBPPacked,
    compress_frame_into,
    decompress,
    max_frame_nbytes,
)
from lmdbio.errors import CodecError


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
