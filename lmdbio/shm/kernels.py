"""XXH64 (the xxHash 64-bit algorithm, seed chaining) as numba kernels, for slot checksums.

zlib's crc32 runs at about 1-2 GB/s on the project's machines, slower than copying the batch;
XXH64 here runs several times faster (see docs/shm.md) and catches the same corruptions a
checksum is for (stray writes, overwrites, torn slots). The output equals the reference
XXH64 (tests check the published vectors). Imported lazily: only a ring that uses
``checksum="xxh64"`` compiles it (cached in ``NUMBA_CACHE_DIR``).
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["part_hash_at", "xxh64"]

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


@nb.njit(inline="always")
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@nb.njit(inline="always")
def _round(acc: np.uint64, lane: np.uint64) -> np.uint64:
    return _rotl(acc + lane * _P2, 31) * _P1


@nb.njit(inline="always")
def _merge(h: np.uint64, v: np.uint64) -> np.uint64:
    return (h ^ _round(np.uint64(0), v)) * _P1 + _P4


@nb.njit(inline="always")
def _le(data: np.ndarray, i: int, nbytes: int) -> np.uint64:
    k = np.uint64(0)
    for b in range(nbytes):
        k |= np.uint64(data[i + b]) << np.uint64(8 * b)
    return k


@nb.njit(nogil=True, cache=True)
def xxh64(data: np.ndarray, seed: np.uint64) -> np.uint64:
    """XXH64 of a 1-D uint8 array (any alignment) with ``seed``."""
    n = data.size
    s = np.uint64(seed)
    i = 0
    if n >= 32:
        v1 = s + _P1 + _P2
        v2 = s + _P2
        v3 = s
        v4 = s - _P1
        stop = (n // 32) * 32
        w = data[:stop].view(np.uint64)  # x86/arm64 load unaligned words
        for j in range(0, w.size, 4):
            v1 = _round(v1, w[j])
            v2 = _round(v2, w[j + 1])
            v3 = _round(v3, w[j + 2])
            v4 = _round(v4, w[j + 3])
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(h, v1)
        h = _merge(h, v2)
        h = _merge(h, v3)
        h = _merge(h, v4)
        i = stop
    else:
        h = s + _P5
    h += np.uint64(n)
    while i + 8 <= n:
        h ^= _round(np.uint64(0), _le(data, i, 8))
        h = _rotl(h, 27) * _P1 + _P4
        i += 8
    if i + 4 <= n:
        h ^= _le(data, i, 4) * _P1
        h = _rotl(h, 23) * _P2 + _P3
        i += 4
    while i < n:
        h ^= np.uint64(data[i]) * _P5
        h = _rotl(h, 11) * _P1
        i += 1
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


@nb.njit(nogil=True, cache=True)
def part_hash_at(payload: np.ndarray, offsets: np.ndarray, labels: np.ndarray,
                 key_offsets: np.ndarray, keys: np.ndarray, first: int, count: int,
                 bs: int, be: int, ks: int, ke: int) -> np.uint64:
    """XXH64 over the five byte ranges a worker reads, each seeded with the previous hash:
    payload ``[bs, be)``, the part's entries of the offset, label and key-offset tables
    (records ``[first, first + count)``) and keys ``[ks, ke)``, given the slot's whole
    sections as bytes (sliced here: a call costs the caller no views)."""
    h = xxh64(payload[bs:be], np.uint64(0))
    h = xxh64(offsets[first * 8:(first + count + 1) * 8], h)
    h = xxh64(labels[first * 8:(first + count) * 8], h)
    h = xxh64(key_offsets[first * 8:(first + count + 1) * 8], h)
    return xxh64(keys[ks:ke], h)
