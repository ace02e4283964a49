"""TOC as a numcodecs codec (``codec_id = "lmdbio_toc"``), so zarr and friends can store
chunks TOC-compressed. Importing this module registers the codec with numcodecs' registry
when numcodecs is installed; without numcodecs the class still works on its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.toc import Buffer, TocMatrix, _as_memoryview, compress
from lmdbio.errors import CodecError

__all__ = ["TocCodec"]


def _codec_base() -> type:
    try:
        from numcodecs.abc import Codec
    except ImportError:  # numcodecs is optional
        return object
    return Codec


class TocCodec(_codec_base()):  # type: ignore[misc]
    """TOC as a numcodecs codec (zarr, etc.): chunks are compressed as 2-D matrices.

    A chunk of shape ``(n0, n1, ...)`` is compressed as the ``n0 x (n1*...)`` matrix (a 1-D
    chunk as one row); ``decode`` returns the flat array of the chunk's dtype, which zarr
    reshapes. ``verify`` controls the CRC check on decode.
    """

    codec_id = "lmdbio_toc"

    def __init__(self, verify: bool = True) -> None:
        self.verify = bool(verify)

    def encode(self, buf: Any) -> bytes:
        arr = np.asarray(buf)
        if arr.dtype == object or arr.dtype.kind not in "fiub":
            arr = np.frombuffer(memoryview(buf).cast("B"), np.uint8)
        mat = arr.reshape(1, -1) if arr.ndim <= 1 else arr.reshape(arr.shape[0], -1)
        return compress(mat)

    def decode(self, buf: Any, out: Any = None, xp: Any = None) -> Any:
        dense = TocMatrix.from_bytes(_as_memoryview(_to_buffer(buf)), verify=self.verify)
        flat = dense.to_dense().reshape(-1)
        if out is not None:
            target = np.asarray(out)
            if not target.flags.c_contiguous or not target.flags.writeable:
                raise CodecError("TOC decode: out must be a writeable C-contiguous array")
            dst = target.reshape(-1).view(np.uint8)
            src = flat.view(np.uint8)
            if dst.size != src.size:
                raise CodecError(
                    f"TOC decode: out holds {dst.size} bytes, the chunk {src.size}")
            dst[...] = src
            return out
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


def _register() -> None:
    try:
        from numcodecs.registry import register_codec
    except ImportError:
        return
    register_codec(TocCodec)


_register()
