"""Small helpers shared by the batch record decoders (Datum, tensor): buffer and offset
normalisation, and naming a failing record by its key."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lmdbio.errors import LmdbioError

KeySource = Sequence[bytes] | Callable[[int], bytes] | None


def as_u8(buf: Any) -> np.ndarray:
    """A 1-D uint8 view of ``buf`` (bytes, memoryview, mmap, numpy array), without copying."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise LmdbioError("record buffer must be C-contiguous")
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


def as_spans(offsets: Any, lengths: Any | None) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, lengths)`` as int64 arrays. With ``lengths=None``, ``offsets`` holds N+1
    boundaries (what :func:`lmdbio.io.gather.gather` returns)."""
    off = np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)
    if lengths is None:
        if off.shape[0] < 1:
            raise LmdbioError("offsets must hold N+1 boundaries when lengths is not given")
        return np.ascontiguousarray(off[:-1]), np.diff(off)
    ln = np.ascontiguousarray(lengths, dtype=np.int64).reshape(-1)
    if ln.shape != off.shape:
        raise LmdbioError(f"offsets ({off.shape[0]}) and lengths ({ln.shape[0]}) differ in size")
    return off, ln


def pack_values(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate byte strings into one buffer: ``(buffer, offsets, lengths)`` for the batch
    decoders (for callers holding separate values, e.g. from py-lmdb)."""
    lengths = np.fromiter((len(memoryview(v).cast("B")) for v in values), np.int64,
                          count=len(values))
    offsets = np.zeros(len(values), np.int64)
    if len(values) > 1:
        np.cumsum(lengths[:-1], out=offsets[1:])
    buf = np.frombuffer(b"".join(bytes(memoryview(v).cast("B")) for v in values), np.uint8)
    return buf, offsets, lengths


def key_of(keys: KeySource, i: int) -> bytes:
    """The key naming record ``i`` of a batch (``#i`` when the caller gave no keys)."""
    if keys is None:
        return f"#{i}".encode()
    if callable(keys):
        return bytes(keys(i))
    return bytes(keys[i])
