"""Thin ctypes bindings to the libc memory calls Python's ``mmap`` module does not expose.

Python's :mod:`mmap` cannot map at a chosen address, and its ``madvise`` needs an ``mmap``
object; lmdbio needs ``mmap(addr, ..., MAP_FIXED_NOREPLACE)`` for symmetric mappings and
``mincore`` to measure the page cache. Every wrapper raises :class:`OSError` with ``errno``
set, never returns the C error sentinel.
"""

from __future__ import annotations

import ctypes
import mmap as _mmap
import os

import numpy as np

__all__ = [
    "MAP_ANONYMOUS",
    "MAP_FIXED_NOREPLACE",
    "MAP_PRIVATE",
    "MAP_SHARED",
    "OS_PAGE_SIZE",
    "PROT_NONE",
    "PROT_READ",
    "madvise",
    "mincore",
    "mmap",
    "munmap",
]

OS_PAGE_SIZE: int = _mmap.PAGESIZE
PROT_NONE: int = 0
PROT_READ: int = _mmap.PROT_READ
MAP_SHARED: int = _mmap.MAP_SHARED
MAP_PRIVATE: int = _mmap.MAP_PRIVATE
MAP_ANONYMOUS: int = getattr(_mmap, "MAP_ANONYMOUS", 0x20)
#: Linux >= 4.17: map exactly at ``addr`` or fail with EEXIST; older kernels ignore the flag
#: and treat ``addr`` as a hint (the caller must compare the returned address).
MAP_FIXED_NOREPLACE: int = 0x100000

_libc = ctypes.CDLL(None, use_errno=True)
# mmap64 takes a 64-bit offset on every glibc target; musl >= 1.2.4 dropped the alias but its
# off_t is 64-bit anyway.
_mmap_fn = getattr(_libc, "mmap64", None) or _libc.mmap
_mmap_fn.restype = ctypes.c_void_p
_mmap_fn.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int64,
]
_munmap_fn = _libc.munmap
_munmap_fn.restype = ctypes.c_int
_munmap_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_madvise_fn = _libc.madvise
_madvise_fn.restype = ctypes.c_int
_madvise_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_mincore_fn = _libc.mincore
_mincore_fn.restype = ctypes.c_int
_mincore_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

_MAP_FAILED = ctypes.c_void_p(-1).value


def _oserror(call: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{call}: {os.strerror(err)}")


def mmap(addr: int, length: int, prot: int, flags: int, fd: int, offset: int = 0) -> int:
    """``mmap(2)``; returns the address of the new mapping (may differ from ``addr``)."""
    ptr = _mmap_fn(addr or None, length, prot, flags, fd, offset)
    if ptr is None or ptr == _MAP_FAILED:
        raise _oserror(f"mmap(addr={addr:#x}, length={length})")
    return int(ptr)


def munmap(addr: int, length: int) -> None:
    """``munmap(2)``."""
    if _munmap_fn(addr, length) != 0:
        raise _oserror(f"munmap(addr={addr:#x}, length={length})")


def madvise(addr: int, length: int, advice: int) -> None:
    """``madvise(2)``; ``addr`` must be OS-page aligned."""
    if _madvise_fn(addr, length, advice) != 0:
        raise _oserror(f"madvise(addr={addr:#x}, length={length}, advice={advice})")


def mincore(addr: int, length: int) -> np.ndarray:
    """``mincore(2)``: a bool per OS page of ``[addr, addr+length)``, True = resident.

    ``addr`` must be OS-page aligned and the whole range mapped.
    """
    n = (length + OS_PAGE_SIZE - 1) // OS_PAGE_SIZE
    vec = np.zeros(max(n, 1), dtype=np.uint8)
    if n and _mincore_fn(addr, length, vec.ctypes.data) != 0:
        raise _oserror(f"mincore(addr={addr:#x}, length={length})")
    return (vec[:n] & 1).astype(bool)
