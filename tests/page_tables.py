"""Tests' view of a process's page tables: which pages of a mapping are mapped now
(``/proc/self/pagemap``), and a skip mark for hosts that cannot populate a mapping."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from lmdbio.io import libc
from lmdbio.io.prefetch import MADV_POPULATE_READ, OS_PAGE_SIZE

__all__ = ["in_page_tables", "needs_populate"]


def in_page_tables(addr: int, pages: int) -> np.ndarray:
    """Whether each OS page of ``[addr, addr + pages * OS_PAGE_SIZE)`` is mapped in this
    process's page tables now (``/proc/self/pagemap``'s present bit; no privilege needed
    for it)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // OS_PAGE_SIZE * 8)
        entries = np.frombuffer(f.read(pages * 8), np.uint64)
    return (entries >> np.uint64(63)).astype(bool)


def why_no_populate() -> str | None:
    """Why ``MADV_POPULATE_READ`` (Linux 5.14+) or the page-table check cannot run here;
    None where both can."""
    m = mmap.mmap(-1, OS_PAGE_SIZE)
    a = np.frombuffer(m, np.uint8)
    try:
        libc.madvise(a.ctypes.data, OS_PAGE_SIZE, MADV_POPULATE_READ)
        present = bool(in_page_tables(a.ctypes.data, 1)[0])
    except OSError as exc:
        return f"populating a mapping or reading /proc/self/pagemap refused: {exc}"
    finally:
        del a
        m.close()
    return None if present else "/proc/self/pagemap shows no present pages"


_WHY = why_no_populate()
#: skips a test on a host that cannot populate a mapping or show its page tables
needs_populate = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))
