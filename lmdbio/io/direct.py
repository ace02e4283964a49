"""A node's own cache of the database file, filled with ``O_DIRECT`` reads.

On one host every simulated node shares one page cache, so the I/O that node-level reading
saves on a cluster (each node reading its share once, instead of every rank reading what it
walks through) cannot show up as time. :class:`NodeCache` gives every (simulated) node a
private copy of the file's pages in node shared memory, filled page run by page run with
``pread`` on a file descriptor opened with ``O_DIRECT``: every page a node needs for the
first time is read from storage, never from the host's page cache, and the node's ranks
share what any of them has read (as the ranks of a real node share its page cache). It is
the emulation of the reference's direct-I/O variant used by ``lmdbio bench read --direct``.

How the page engine uses it (:class:`lmdbio.lmdb.Database` with ``node_cache`` set):

* branch and leaf pages are parsed where the walk or seek finds them (the ordinary
  mapping) and every one the node did not hold yet is then read into the node cache with
  its own ``pread`` (a walk cannot batch them: each leaf leads to the next), on the same
  code path, so a DM reader pays that I/O before it sends the cursor on;
* values are gathered from the node cache, after one ``pread`` per run of consecutive
  pages the node lacks (a reader knows every value's page run from its leaf node);
* dm-spec's speculative prefetch reads its estimated page ranges into the node cache.

What is read is counted (``reads``, ``pages``, ``bytes``, ``seconds``); the present-page
bitmap is the node's real I/O footprint since it was last emptied (``lmdbio bench read
--direct`` empties it after the setup and at every new epoch).
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.io.prefetch import _open_direct

_ALIGN = 4096


def page_runs(pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, lengths)`` of the runs of consecutive page numbers in sorted ``pages``."""
    if pages.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    cut = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = pages[np.r_[0, cut]]
    ends = pages[np.r_[cut - 1, pages.size - 1]] + 1
    return starts.astype(np.int64), (ends - starts).astype(np.int64)


def _shared_memory_shortfall(nbytes: int, path: str, shm: str = "/dev/shm") -> str | None:
    """Why ``nbytes`` of node shared memory cannot be had (None if they can, or if the host
    has no ``/dev/shm`` to ask): a whole copy of the file per node must fit in memory."""
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if nbytes <= free:
        return None
    return (f"{path}: a node's O_DIRECT page cache holds the whole file ({nbytes:,} bytes) "
            f"in node shared memory, but {shm} has {free:,} bytes free; use a smaller "
            f"database or fewer simulated nodes per host")


class NodeCache:
    """One node's copy of a file's pages (see the module docstring).

    Collective over ``node`` (the ranks of one node, real or simulated): construct and
    :meth:`close` on every rank of it. ``psize`` must be a multiple of 4096 (the O_DIRECT
    alignment); LMDB's default page size is 4096.
    """

    def __init__(self, node: Any, path: str | os.PathLike[str], psize: int) -> None:
        from mpi4py import MPI

        from lmdbio.mpiutil import agree

        self.path = str(path)
        self.psize = int(psize)
        self.reads = 0
        self.pages = 0
        self.seconds = 0.0
        self._fd = -1
        self._win = None
        error = None
        try:
            if self.psize % _ALIGN:
                raise LmdbioError(f"{self.path}: page size {self.psize} is not a multiple of "
                                  f"{_ALIGN} bytes; O_DIRECT reads need aligned pages")
            try:
                self._fd = _open_direct(self.path)
            except OSError as exc:
                why = "the file system refuses O_DIRECT" if exc.errno in (
                    errno.EINVAL, errno.EOPNOTSUPP) else exc.strerror
                raise LmdbioError(f"{self.path}: cannot open with O_DIRECT ({why})") from exc
            self.size = os.fstat(self._fd).st_size
            self.npages = self.size // self.psize
        except Exception as exc:  # agreed on below: no rank waits in the allocation
            error = str(exc)
        agree(node, error is None, error or "", "opening the file for O_DIRECT reads")
        # the data, one byte per page (present), and alignment slack, on the node's first rank
        nbytes = self.npages * self.psize + self.npages + _ALIGN
        error = _shared_memory_shortfall(nbytes, self.path) if node.Get_rank() == 0 else None
        agree(node, error is None, error or "", "sizing the node's page cache")
        self._win = MPI.Win.Allocate_shared(nbytes if node.Get_rank() == 0 else 0, 1,
                                            comm=node)
        mem, _ = self._win.Shared_query(0)
        raw = np.frombuffer(mem, np.uint8)
        skip = (-raw.ctypes.data) % _ALIGN
        self.buf = raw[skip:skip + self.npages * self.psize]
        self.present = raw[skip + self.npages * self.psize:
                           skip + self.npages * self.psize + self.npages]
        self.node = node
        self.clear()

    def clear(self) -> None:
        """Collective over the node: forget every page (the node's cache starts cold)."""
        self.node.Barrier()
        if self.node.Get_rank() == 0:
            self.present[:] = 0
        self.node.Barrier()

    def forget(self) -> None:
        """Mark every page absent, on one rank (not collective): the next use of a page
        reads it again. Safe while other ranks of the node read: the bytes stay valid, a
        page is at worst read twice."""
        self.present[:] = 0

    # ------------------------------------------------------------------ reading
    def _read_run(self, start: int, count: int) -> None:
        lo, hi = start * self.psize, (start + count) * self.psize
        view = memoryview(self.buf[lo:hi])
        done = 0
        while done < hi - lo:
            got = os.preadv(self._fd, [view[done:]], lo + done)
            if got <= 0:
                raise LmdbioError(f"{self.path}: O_DIRECT read of pages {start}..."
                                  f"{start + count - 1} ended at byte {lo + done} "
                                  f"(file truncated?)")
            done += got
        self.reads += 1
        self.pages += count

    def load_runs(self, starts: np.ndarray, lengths: np.ndarray) -> int:
        """Read the pages of runs ``(starts[i], lengths[i])`` the node does not hold yet, one
        ``pread`` per run of missing consecutive pages. Returns the pages read."""
        keep = lengths > 0
        first, count = starts[keep].astype(np.int64), lengths[keep].astype(np.int64)
        # every page of every run without a Python loop: ramps restarting at each run
        ramp = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
        return self.load_pages(np.unique(np.repeat(first, count) + ramp))

    def load_pages(self, pages: np.ndarray, *, one_by_one: bool = False) -> int:
        """Read the pages of ``pages`` (sorted, distinct) the node lacks: one ``pread`` per
        run of consecutive missing pages, or per page with ``one_by_one``."""
        pages = pages[(pages >= 0) & (pages < self.npages)]
        missing = pages[self.present[pages] == 0]
        if missing.size == 0:
            return 0
        t0 = time.perf_counter()
        if one_by_one:
            starts, lengths = missing, np.ones(missing.size, np.int64)
        else:
            starts, lengths = page_runs(missing)
        for s, n in zip(starts.tolist(), lengths.tolist(), strict=True):
            self._read_run(s, n)
            self.present[s:s + n] = 1
        self.seconds += time.perf_counter() - t0
        return int(missing.size)

    def load_touched(self, touched: np.ndarray) -> int:
        """Read the pages marked in an accounting bitmap that the node lacks, one ``pread``
        each (the branch and leaf pages of a walk or seek)."""
        n = min(touched.shape[0], self.npages)
        new = np.flatnonzero(touched[:n].astype(bool) & (self.present[:n] == 0))
        return self.load_pages(new, one_by_one=True)

    def stats(self) -> dict[str, float | int]:
        """What this rank read: ``reads`` (pread calls), ``pages``, ``bytes``, ``seconds``."""
        return {"reads": self.reads, "pages": self.pages, "bytes": self.pages * self.psize,
                "seconds": self.seconds}

    def present_count(self) -> int:
        """Pages of the file this node holds (its I/O footprint so far)."""
        return int(np.count_nonzero(self.present))

    def close(self) -> None:
        """Collective over the node: free the shared memory and the file descriptor."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._win is not None:
            self.buf = self.present = None  # type: ignore[assignment]
            self._win.Free()
            self._win = None
