"""TOC as a numcodecs codec (``codec_id = "lmdbio_toc"``), so zarr and friends can store
chunks TOC-compressed. Importing this module registers the codec with numcodecs' registry
when numcodecs is installed; without numcodecs the class still works on its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.numcodecs_base import as_input, copy_out, refuse_object_out
from lmdbio.codecs.toc.matrix import Buffer, TocMatrix, as_memoryview, compress

__all__ = ["TocCodec", "register"]


def _codec_base() -> type:
    try:
        from numcodecs.abc import Codec
    except ImportError:  # numcodecs is optional
        return object
    return Codec


class TocCodec(_codec_base()):  # type: ignore[misc]
    """TOC as a numcodecs codec (zarr, etc.): chunks are compressed as 2-D matrices.

    A chunk of shape ``(n0, n1, ...)`` is compressed as the ``n0 x (n1*...)`` matrix (a 1-D
    chunk as one row), in the chunk's memory order (a Fortran-ordered chunk as its
    transpose), as numcodecs compresses a buffer's bytes; ``decode`` returns the flat array
    of the chunk's dtype, which zarr reshapes. Values of other kinds (complex, datetime) and
    raw buffers (``bytes``, ``bytearray``) are compressed as their bytes. An object array
    raises :class:`TypeError` (:class:`~lmdbio.errors.CodecTypeError`): its memory holds
    references, so a round trip would hand back dangling pointers. ``verify`` controls the
    CRC check on decode.
    """

    codec_id = "lmdbio_toc"

    def __init__(self, verify: bool = True) -> None:
        self.verify = bool(verify)

    def encode(self, buf: Any) -> bytes:
        """The TOC bytes of the chunk ``buf`` (see the class docstring)."""
        arr = as_input(buf, "TOC codec")
        if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous:
            arr = arr.T  # its memory order: numcodecs' codecs work on the buffer's bytes
        arr = np.ascontiguousarray(arr)
        if arr.dtype.kind not in "fiub":
            arr = arr.reshape(-1).view(np.uint8)
        mat = arr.reshape(1, -1) if arr.ndim <= 1 else \
            arr.reshape(arr.shape[0], int(np.prod(arr.shape[1:], dtype=np.int64)))
        return compress(mat)

    def decode(self, buf: Any, out: Any = None, xp: Any = None) -> Any:
        """The chunk's values, flat (``out``, any buffer of the chunk's byte size, is filled
        and returned when given; ``xp`` an array module to return the values in)."""
        refuse_object_out(out, "TOC codec")
        dense = TocMatrix.from_bytes(as_memoryview(_to_buffer(buf)), verify=self.verify)
        flat = dense.to_dense().reshape(-1)
        if out is not None:
            return copy_out(flat, out, "TOC decode")
        if xp is not None and xp is not np:
            return xp.asarray(flat)
        return flat

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "verify": self.verify}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TocCodec:
        cfg = {k: v for k, v in config.items() if k != "id"}
        return cls(**cfg)

    def __repr__(self) -> str:
        return f"TocCodec(verify={self.verify})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TocCodec) and other.verify == self.verify

    def __hash__(self) -> int:
        return hash((self.codec_id, self.verify))


def _to_buffer(buf: Any) -> Buffer:
    if isinstance(buf, bytes | bytearray | memoryview | np.ndarray):
        return buf
    return memoryview(buf)


def register() -> None:
    """Register :class:`TocCodec` with numcodecs (nothing when it is not installed)."""
    try:
        from numcodecs.registry import register_codec
    except ImportError:
        return
    register_codec(TocCodec)


register()
