"""A node's own cache of the database file, filled with ``O_DIRECT`` reads.

On one host every simulated node shares one page cache, so the I/O that node-level reading
saves on a cluster (each node reading its share once, instead of every rank reading what it
walks through) cannot show up as time. :class:`NodeCache` gives every (simulated) node a
private copy of the file's pages in node shared memory, filled page run by page run with
``pread`` on a file descriptor opened with ``O_DIRECT``: every page a node needs for the
first time is read from storage, never from the host's page cache, and the node's ranks
share what any of them has read (as the ranks of a real node share its page cache). It is
the emulation of the reference's direct-I/O variant used by ``lmdbio bench read --direct``.

How the page engine uses it (a :class:`lmdbio.lmdb.Database` whose accounting has its
``node_cache`` set, :attr:`lmdbio.io.accounting.PageAccounting.node_cache`):

* branch and leaf pages are parsed where the walk or seek finds them (the ordinary
  mapping) and every one the node did not hold yet is then read into the node cache with
  its own ``pread`` (a walk cannot batch them: each leaf leads to the next), on the same
  code path, so a DM reader pays that I/O before it sends the cursor on;
* values are gathered from the node cache, after one ``pread`` per run of consecutive
  pages the node lacks (a reader knows every value's page run from its leaf node);
* dm-spec's speculative prefetch reads its estimated page ranges into the node cache.

What is read is counted (``reads``, ``pages``, ``bytes``, ``seconds``). Every epoch reads
from storage again (as when the data set is larger than a node's memory): a page is marked
present with the epoch that read it, and a rank counts it present only from its own epoch
on (:meth:`NodeCache.set_epoch`, called by every rank at its ``begin_epoch``), so ranks of
a node that read on their own (the naive strategies) each start their epoch cold whatever
the node's other ranks are doing. Marking a whole page map absent from one rank at an epoch
boundary raced with them: a rank still in the previous epoch then read its pages again, a
rank already in the next one read none of its own (naive-stride's node bytes came out
anywhere between one and two epochs' worth). A node's reads hold the node's lock (a file
``flock``-ed by its ranks), so two ranks that need the same page at once read it once.

Read-around: a node that maps the file faults pages in through the kernel's read-around
(an aligned window of ``read_ahead_kb`` on every fault of a mapping not advised
``MADV_RANDOM``), which is how the strategies that fault (the naive ones, LMM, dm-serial)
read more than they touch on databases whose values live in overflow pages. With
``read_around_pages`` > 1 (``lmdbio bench read --direct-read-around KIB``) every page a walk,
a seek or a gather faults in is read with the rest of its aligned window of that many
pages, as the scaling model (:mod:`lmdbio.scale.model`) reads a fault; pages asked for
(:meth:`NodeCache.load_runs`: dm-spec's prefetch) are read exactly. The default, 1, reads
exactly the pages touched (a mapping advised ``MADV_RANDOM``, LMDB's ``MDB_NORDAHEAD``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time
from typing import Any

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.io.prefetch import open_direct
from lmdbio.mpiutil import agree

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

        self.path = str(path)
        self.psize = int(psize)
        #: pages one fault reads (its aligned window; 1: the page alone). Set per rank.
        self.read_around_pages = 1
        #: this rank's epoch + 1: pages marked with a smaller number are absent for it
        self.generation = 1
        self.reads = 0
        self.pages = 0
        self.seconds = 0.0
        self._fd = -1
        self._win = None
        self._lock_fd = -1  # the node's lock file (flock), on a node of several ranks
        error = None
        try:
            if self.psize % _ALIGN:
                raise LmdbioError(f"{self.path}: page size {self.psize} is not a multiple of "
                                  f"{_ALIGN} bytes; O_DIRECT reads need aligned pages")
            try:
                self._fd = open_direct(self.path)
            except OSError as exc:
                why = "the file system refuses O_DIRECT" if exc.errno in (
                    errno.EINVAL, errno.EOPNOTSUPP) else exc.strerror
                raise LmdbioError(f"{self.path}: cannot open with O_DIRECT ({why})") from exc
            self.size = os.fstat(self._fd).st_size
            self.npages = self.size // self.psize
        except Exception as exc:  # agreed on below: no rank waits in the allocation
            error = str(exc)
        agree(node, error is None, error or "", "opening the file for O_DIRECT reads")
        # the data, a 32-bit generation per page (present since which epoch), and alignment
        # slack, on the node's first rank
        nbytes = self.npages * self.psize + 4 * self.npages + _ALIGN
        error = _shared_memory_shortfall(nbytes, self.path) if node.Get_rank() == 0 else None
        agree(node, error is None, error or "", "sizing the node's page cache")
        self._win = MPI.Win.Allocate_shared(nbytes if node.Get_rank() == 0 else 0, 1,
                                            comm=node)
        mem, _ = self._win.Shared_query(0)
        raw = np.frombuffer(mem, np.uint8)
        skip = (-raw.ctypes.data) % _ALIGN
        self.buf = raw[skip:skip + self.npages * self.psize]
        at = skip + self.npages * self.psize  # a multiple of 4096: aligned for uint32
        self.present = raw[at:at + 4 * self.npages].view(np.uint32)
        self.node = node
        if node.Get_size() > 1:
            self._open_lock()
        self.clear()

    def _open_lock(self) -> None:
        """Collective over the node: every rank opens the node's lock file, an empty file
        its first rank makes and removes again once all have it open (``flock`` works on
        it unlinked; nothing stays behind, whatever ends the job). A waiting rank sleeps
        in the kernel: an MPI window lock spins, and on an oversubscribed host the
        spinning ranks starve the one that holds it. Where the file cannot be made or
        opened the rank reads without the lock (a page is then at worst read twice)."""
        name = None
        if self.node.Get_rank() == 0:
            with contextlib.suppress(OSError):
                fd, name = tempfile.mkstemp(prefix="lmdbio-nodecache-", suffix=".lock")
                os.close(fd)
        name = self.node.bcast(name, root=0)
        if name is not None:
            with contextlib.suppress(OSError):
                self._lock_fd = os.open(name, os.O_RDONLY)
            self.node.Barrier()
            if self.node.Get_rank() == 0:
                with contextlib.suppress(OSError):
                    os.unlink(name)

    def clear(self) -> None:
        """Collective over the node: forget every page (the node's cache starts cold)."""
        self.node.Barrier()
        if self.node.Get_rank() == 0:
            self.present[:] = 0
        self.node.Barrier()

    def forget(self) -> None:
        """Mark every page absent, on one rank (not collective): the next use of a page
        reads it again, on every rank. Safe while other ranks of the node read: the bytes
        stay valid, a page is at worst read twice. (Epochs: :meth:`set_epoch`.)"""
        self.present[:] = 0

    def set_epoch(self, epoch: int) -> None:
        """This rank starts ``epoch`` (not collective; every rank that reads calls it at
        its own ``begin_epoch``): pages read in earlier epochs are absent for it from now
        on, pages the node's ranks read in this epoch or a later one present. A rank
        still in an earlier epoch keeps seeing what it read (and what faster ranks read
        since), so no rank's epoch reads depend on when the others change epoch."""
        self.generation = int(epoch) + 1

    def _absent(self, pages: np.ndarray) -> np.ndarray:
        """The pages of ``pages`` this rank's epoch has not read yet."""
        return pages[self.present[pages] < self.generation]

    def _mark(self, start: int, count: int) -> None:
        """Pages ``start ..`` read in this rank's epoch (a later epoch's mark stays)."""
        seg = self.present[start:start + count]
        np.maximum(seg, self.generation, out=seg)

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
        ``pread`` per run of missing consecutive pages: pages asked for, read exactly (no
        read-around). Returns the pages read."""
        keep = lengths > 0
        first, count = starts[keep].astype(np.int64), lengths[keep].astype(np.int64)
        # every page of every run without a Python loop: ramps restarting at each run
        ramp = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
        return self.load_pages(np.unique(np.repeat(first, count) + ramp), asked=True)

    def load_pages(self, pages: np.ndarray, *, one_by_one: bool = False,
                   asked: bool = False) -> int:
        """Read the pages of ``pages`` (sorted, distinct) the node lacks: one ``pread`` per
        run of consecutive missing pages, or per page with ``one_by_one``. Unless
        ``asked``, the pages are faults: with ``read_around_pages`` > 1 each missing page
        brings the missing pages of its aligned window along (one ``pread`` per run of
        them, each window on its own with ``one_by_one``). Returns the pages read.

        On a node of several ranks the reads hold the node's lock (as a page cache locks
        a page while it is read in): two ranks faulting the same page or window at once
        read it once, the second waits for it, as on a real node (the lock is the node's,
        not a page's: the node's reads are serialized)."""
        pages = pages[(pages >= 0) & (pages < self.npages)]
        if self._absent(pages).size == 0:  # all held: no lock needed (marks only grow)
            return 0
        t0 = time.perf_counter()
        if self._lock_fd < 0:
            got = self._load(pages, one_by_one, asked)
        else:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                got = self._load(pages, one_by_one, asked)
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        self.seconds += time.perf_counter() - t0
        return got

    def _load(self, pages: np.ndarray, one_by_one: bool, asked: bool) -> int:
        """:meth:`load_pages` once the node's lock is held."""
        missing = self._absent(pages)
        if missing.size == 0:  # another rank of the node read them meanwhile
            return 0
        window = 1 if asked else max(int(self.read_around_pages), 1)
        if window > 1:
            first = np.unique(missing // window) * window
            ramp = np.tile(np.arange(window, dtype=np.int64), first.size)
            around = np.repeat(first, window) + ramp
            missing = self._absent(around[around < self.npages])
        if one_by_one and window == 1:
            starts, lengths = missing, np.ones(missing.size, np.int64)
        elif one_by_one:  # a run per window: one fault, one read-around
            cut = np.flatnonzero((np.diff(missing) != 1)
                                 | (np.diff(missing // window) != 0)) + 1
            starts = missing[np.r_[0, cut]].astype(np.int64)
            lengths = np.diff(np.r_[0, cut, missing.size]).astype(np.int64)
        else:
            starts, lengths = page_runs(missing)
        for s, n in zip(starts.tolist(), lengths.tolist(), strict=True):
            self._read_run(s, n)
            self._mark(s, n)
        return int(missing.size)

    def load_touched(self, touched: np.ndarray) -> int:
        """Read the pages marked in an accounting bitmap that the node lacks, one ``pread``
        each (the branch and leaf pages of a walk or seek; with read-around, one per
        window)."""
        n = min(touched.shape[0], self.npages)
        new = np.flatnonzero(touched[:n].astype(bool)
                             & (self.present[:n] < self.generation))
        return self.load_pages(new, one_by_one=True)

    def stats(self) -> dict[str, float | int]:
        """What this rank read: ``reads`` (pread calls), ``pages``, ``bytes``, ``seconds``."""
        return {"reads": self.reads, "pages": self.pages, "bytes": self.pages * self.psize,
                "seconds": self.seconds}

    def present_count(self) -> int:
        """Pages of the file this node holds for this rank's epoch (its I/O footprint since
        that epoch began)."""
        return int(np.count_nonzero(self.present >= self.generation))

    def close(self) -> None:
        """Collective over the node: free the shared memory and the file descriptor."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        if self._win is not None:
            self.buf = self.present = None  # type: ignore[assignment]
            self._win.Free()
            self._win = None
