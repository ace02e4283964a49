"""TOC, tuple-oriented compression: lossless mini-batches that ML operations read compressed.

The compressed matrix and its operations are in :mod:`.matrix` (payload layout in
:mod:`.format`, compiled kernels in :mod:`.kernels`), the LMDB value of ``--layout toc`` in
:mod:`.record`, and the numcodecs codec in :mod:`.codec`. :class:`TocCodec` is imported on
first access, so that importing this package does not import numcodecs; importing it
registers ``"lmdbio_toc"`` with numcodecs' registry.
"""

from __future__ import annotations

from typing import Any

from lmdbio.codecs.toc.matrix import MAX_NNZ, Buffer, TocMatrix, compress, decompress, stats
from lmdbio.codecs.toc.record import (
    BATCH_MAGIC,
    decode_batch_value,
    encode_batch_value,
    split_batch_value,
)

__all__ = [
    "BATCH_MAGIC",
    "MAX_NNZ",
    "Buffer",
    "TocCodec",
    "TocMatrix",
    "compress",
    "decode_batch_value",
    "decompress",
    "encode_batch_value",
    "split_batch_value",
    "stats",
]


def __getattr__(name: str) -> Any:
    """:class:`TocCodec`, imported on first access (see the module docstring)."""
    if name == "TocCodec":
        from lmdbio.codecs.toc.codec import TocCodec

        return TocCodec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
