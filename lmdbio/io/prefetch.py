"""Bring file pages into memory ahead of use, drop them, and measure what is resident.

Ways to prefetch, for the situations of the readers (LMDBIO-DM step 2):

* :func:`prefetch` / :func:`prefetch_pages` - the default: advise the kernel
  (``MADV_WILLNEED``, large asynchronous reads) and then touch, so the pages are resident
  *and* mapped when it returns;
* :func:`touch` / :func:`touch_pages` / :func:`touch_page_ranges` - fault pages of a mapping
  in synchronously by reading one byte per OS page (compiled loop, GIL released): after it
  returns, the pages are both in the page cache and mapped in this process, so the serial
  cursor walk that follows never blocks on I/O.
* :func:`advise` (``madvise(MADV_WILLNEED)``) and :func:`fadvise_willneed`
  (``posix_fadvise(POSIX_FADV_WILLNEED)``) - ask the kernel to start reading asynchronously
  and return at once.
* :func:`pread_prefetch` - read ranges with ``pread`` into a scratch buffer (page cache only,
  nothing mapped; works on any file system).

Measuring and resetting the page cache: :func:`resident_pages` (``mincore``) returns one bool
per OS page; :func:`drop_cache` evicts a file's clean pages (``POSIX_FADV_DONTNEED``) so a
benchmark starts cold. :class:`DirectReader` reads with ``O_DIRECT``, bypassing the page
cache - the way to emulate, on one host, nodes that do not share a page cache.

Ranges are byte offsets into the file unless a function says pages; ``page_size`` there is
the *database* page size (LMDB's psize), not the OS page size.
"""

from __future__ import annotations

import errno
import logging
import mmap as _mmap
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.io import libc
from lmdbio.io.symmap import Mapping, map_file
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module

__all__ = [
    "MADV_DONTNEED",
    "MADV_NORMAL",
    "MADV_RANDOM",
    "MADV_SEQUENTIAL",
    "MADV_WILLNEED",
    "OS_PAGE_SIZE",
    "DirectReader",
    "advise",
    "advise_page_ranges",
    "drop_cache",
    "fadvise_willneed",
    "populate_if_resident",
    "pread_prefetch",
    "prefetch",
    "prefetch_pages",
    "residency_is_reported",
    "resident_count",
    "resident_pages",
    "touch",
    "touch_page_ranges",
    "touch_pages",
]

log = logging.getLogger(__name__)

OS_PAGE_SIZE = libc.OS_PAGE_SIZE
MADV_NORMAL: int = getattr(_mmap, "MADV_NORMAL", 0)
MADV_RANDOM: int = getattr(_mmap, "MADV_RANDOM", 1)
MADV_SEQUENTIAL: int = getattr(_mmap, "MADV_SEQUENTIAL", 2)
MADV_WILLNEED: int = getattr(_mmap, "MADV_WILLNEED", 3)
MADV_DONTNEED: int = getattr(_mmap, "MADV_DONTNEED", 4)
#: Linux 5.14+: map every page of a range into the page tables now, reading those not in
#: the page cache (no constant in Python's mmap module before 3.13)
MADV_POPULATE_READ: int = getattr(_mmap, "MADV_POPULATE_READ", 22)
#: :func:`populate_if_resident` maps files up to this size: 2 GiB takes ~35 ms and 4 MiB
#: of page tables a process (86 MiB: 1.5 ms on the 2-core VM)
POPULATE_MAX_BYTES = 2 << 30

PathOrMapping = Mapping | str | os.PathLike


def _as_array(target: Mapping | np.ndarray) -> np.ndarray:
    if isinstance(target, Mapping):
        return target.array
    arr = np.asarray(target)
    if arr.dtype != np.uint8 or arr.ndim != 1 or not arr.flags.c_contiguous:
        raise LmdbioError(
            f"touch needs a Mapping or a 1-D contiguous uint8 array, got {arr.dtype} "
            f"with shape {arr.shape}"
        )
    return arr


def _byte_range(total: int, offset: int, length: int | None, what: str) -> tuple[int, int]:
    if length is None:
        length = total - offset
    if offset < 0 or length < 0 or offset + length > total:
        raise LmdbioError(
            f"{what}: byte range [{offset}, {offset + length}) is outside [0, {total})"
        )
    return offset, offset + length


# --------------------------------------------------------------------------- touching


def touch(target: Mapping | np.ndarray, offset: int = 0, length: int | None = None) -> int:
    """Fault in every OS page of ``[offset, offset+length)``; returns a checksum of the bytes
    read (one per page), meaningless except that computing it forces the reads."""
    touch_range = kernel_module("lmdbio.io").touch_range

    arr = _as_array(target)
    start, stop = _byte_range(arr.shape[0], offset, length, "touch")
    return int(touch_range(read_only(arr), start, stop, OS_PAGE_SIZE))


def touch_pages(
    target: Mapping | np.ndarray, first_page: int, n_pages: int, page_size: int
) -> int:
    """:func:`touch` of database pages ``[first_page, first_page+n_pages)`` of ``page_size``."""
    if page_size <= 0:
        raise LmdbioError(f"page_size must be positive, got {page_size}")
    return touch(target, first_page * page_size, n_pages * page_size)


def touch_page_ranges(
    target: Mapping | np.ndarray,
    starts: Sequence[int] | np.ndarray,
    counts: Sequence[int] | np.ndarray,
    page_size: int,
) -> int:
    """Touch many database page ranges in one compiled call (``starts[i]``, ``counts[i]``).

    All ranges are validated up front (whole-array checks) and a bad one raises
    :class:`~lmdbio.errors.LmdbioError` naming it, before anything is read.
    """
    touch_ranges = kernel_module("lmdbio.io").touch_ranges

    arr = _as_array(target)
    s, c = _checked_page_ranges("touch_page_ranges", arr.shape[0], starts, counts, page_size)
    byte_start = s * page_size
    byte_stop = (s + c) * page_size
    return int(touch_ranges(read_only(arr), byte_start, byte_stop, OS_PAGE_SIZE))


# --------------------------------------------------------------------------- advice


def _aligned(mapping: Mapping, offset: int, length: int | None) -> tuple[int, int]:
    """(address, length) of the OS pages covering the byte range, inside the mapping."""
    start, stop = _byte_range(mapping.length, offset, length, f"{mapping.path}")
    a0 = (start // OS_PAGE_SIZE) * OS_PAGE_SIZE
    return mapping.address + a0, stop - a0


def advise(
    mapping: Mapping, offset: int = 0, length: int | None = None, advice: int = MADV_WILLNEED
) -> None:
    """``madvise`` the OS pages covering ``[offset, offset+length)`` of ``mapping``.

    ``MADV_WILLNEED`` starts asynchronous read-ahead and returns before the pages arrive;
    ``MADV_RANDOM`` turns off the kernel's own read-ahead (what LMDB does); ``MADV_DONTNEED``
    drops this process's page-table entries (the page cache keeps the data).
    """
    if mapping.closed:
        raise LmdbioError(f"{mapping.path}: the mapping is closed")
    addr, n = _aligned(mapping, offset, length)
    if n:
        try:
            libc.madvise(addr, n, advice)
        except OSError as exc:
            raise LmdbioError(f"{mapping.path}: madvise({advice}) failed: {exc}") from exc


def merge_ranges(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted union of byte ranges ``[starts[i], stops[i])`` (whole-array, no Python loop)."""
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    if starts.size == 0:
        return starts, stops
    order = np.argsort(starts, kind="stable")
    starts, stops = starts[order], np.maximum.accumulate(stops[order])
    # a new run begins where a range starts after everything before it ended
    new_run = np.ones(starts.size, dtype=bool)
    new_run[1:] = starts[1:] > stops[:-1]
    first = np.flatnonzero(new_run)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], stops[last]


def prefetch(mapping: Mapping, offset: int = 0, length: int | None = None) -> int:
    """Bring a byte range of a mapping into memory: ``MADV_WILLNEED``, then :func:`touch`.

    The advice lets the kernel read the whole range with large asynchronous requests; the
    touch then waits for it and maps every page in this process. On a cold file this is
    several times faster than touching alone, which faults one read-ahead window at a time
    (see docs/mpi.md for measurements). Returns the touch checksum.
    """
    advise(mapping, offset, length, MADV_WILLNEED)
    return touch(mapping, offset, length)


def _checked_page_ranges(
    what: str, total: int, starts: Sequence[int] | np.ndarray,
    counts: Sequence[int] | np.ndarray, page_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``starts``/``counts`` as int64 arrays, every range checked against ``total`` bytes (a
    bad one raises :class:`~lmdbio.errors.LmdbioError` naming it, before anything is done)."""
    s = np.asarray(starts, dtype=np.int64).ravel()
    c = np.asarray(counts, dtype=np.int64).ravel()
    if s.shape != c.shape:
        raise LmdbioError(f"{what}: {s.size} starts but {c.size} counts")
    if page_size <= 0:
        raise LmdbioError(f"page_size must be positive, got {page_size}")
    bad = (s < 0) | (c < 0) | ((s + c) * page_size > total)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise LmdbioError(
            f"{what}: range {i} (pages {s[i]}..{s[i] + c[i]} of {page_size} bytes) "
            f"is outside the {total}-byte mapping"
        )
    return s, c


#: what :func:`readahead_limit` assumes when the file's block device is not known (the
#: kernel's default ``read_ahead_kb``; network file systems have no entry under /sys/dev)
DEFAULT_READAHEAD_LIMIT = 128 << 10


def readahead_limit(path: str | os.PathLike) -> int:
    """The most one ``MADV_WILLNEED`` (``POSIX_FADV_WILLNEED``) call reads of ``path``:
    Linux cuts the request to the larger of its device's ``read_ahead_kb`` and
    ``max_sectors_kb`` (``force_page_cache_ra``) and the rest is left to faults, one page at
    a time under ``MADV_RANDOM``: a 16 MiB range asked for at once read 8 MiB ahead here and
    faulted the rest (a cold dm-spec slot took 250 ms instead of ~20). From the device's
    queue settings in sysfs (its partition's parent for a partition); the kernel's default
    read-ahead when they cannot be read."""
    try:
        dev = os.stat(path).st_dev
        base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        for queue in (base / "queue", base / ".." / "queue"):
            if queue.is_dir():
                kb = max(int((queue / name).read_text()) for name in
                         ("read_ahead_kb", "max_sectors_kb"))
                return max((kb << 10) // OS_PAGE_SIZE * OS_PAGE_SIZE, OS_PAGE_SIZE)
    except (OSError, ValueError):
        pass
    return DEFAULT_READAHEAD_LIMIT


def _split_runs(starts: np.ndarray, stops: np.ndarray, chunk: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Byte runs cut into pieces of at most ``chunk`` bytes (whole-array)."""
    pieces = np.maximum(-(-(stops - starts) // chunk), 1)
    first = np.repeat(starts, pieces) + \
        (np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * chunk
    return first, np.minimum(first + chunk, np.repeat(stops, pieces))


def advise_page_ranges(
    target: Mapping | np.ndarray,
    starts: Sequence[int] | np.ndarray,
    counts: Sequence[int] | np.ndarray,
    page_size: int,
    advice: int = MADV_WILLNEED,
    max_bytes: int | None = None,
) -> int:
    """``madvise`` database page ranges of a mapping (or of the array over one, such as
    :attr:`lmdbio.lmdb.Database.buf`): the ranges are merged and each merged run is advised
    with one call. With ``MADV_WILLNEED`` (the default) the kernel reads every run with large
    asynchronous requests and returns at once, whatever read-around the mapping has
    (``MADV_RANDOM`` included): the way a reader turns the page ranges it will need into
    a few large reads instead of a page fault, and a 4 KiB read, per page. Bad ranges raise
    before anything is advised. ``max_bytes``: merged runs are advised in pieces of at most
    this many bytes (:func:`readahead_limit`: one call reads no more). Returns the number
    of ``madvise`` calls."""
    arr = _as_array(target)
    s, c = _checked_page_ranges("advise_page_ranges", arr.shape[0], starts, counts,
                                page_size)
    run_starts, run_stops = merge_ranges(s * page_size, (s + c) * page_size)
    if not run_starts.size:
        return 0
    if max_bytes is not None:
        # whole OS pages: a piece is advised from its first page's start
        run_starts, run_stops = _split_runs(
            run_starts, run_stops, max(int(max_bytes) // OS_PAGE_SIZE * OS_PAGE_SIZE,
                                       OS_PAGE_SIZE))
    base = arr.ctypes.data
    # absolute addresses, page-aligned down, never before the buffer's first whole OS page
    floor = -(-base // OS_PAGE_SIZE) * OS_PAGE_SIZE
    first = np.maximum((base + run_starts) // OS_PAGE_SIZE * OS_PAGE_SIZE, floor)
    stops = base + run_stops
    keep = first < stops
    for a, b in zip(first[keep].tolist(), stops[keep].tolist(), strict=True):
        try:
            libc.madvise(a, b - a, advice)
        except OSError as exc:
            where = target.path if isinstance(target, Mapping) else "the database mapping"
            raise LmdbioError(f"{where}: madvise({advice}) of bytes {a - base}..{b - base} "
                              f"failed: {exc}") from exc
    return int(keep.sum())


def pages_resident(
    target: Mapping | np.ndarray,
    starts: Sequence[int] | np.ndarray,
    counts: Sequence[int] | np.ndarray,
    page_size: int,
    samples: int | None = 16,
) -> bool:
    """Whether the database pages of the ranges ``[starts[i], starts[i] + counts[i])`` are in
    the page cache: ``samples`` of them, spread evenly over the ranges, one ``mincore`` each
    (``None``: every page, one ``mincore`` over the ranges' span and a count per range).

    The question a reader asks before :func:`advise_page_ranges`: on a warm file every
    advised page is there already, and the advice (a call per piece of each run) and the
    touch that waits for it only cost CPU. A sample, because ``mincore`` costs ~55 ns per
    page not mapped in this process (0.44 ms for a 2,048-record CIFAR-like slot, as much as
    the advice): 16 pages cost ~8 us, sampled in one compiled loop
    (:func:`lmdbio.io.kernels.sample_resident`). A sample that finds every page while
    some others are missing (a file partly in the cache) only leaves those to be faulted in
    as read.
    False when ``mincore`` refuses (then advise as usual); True for no pages. Bad ranges
    raise as in :func:`advise_page_ranges`."""
    arr = _as_array(target)
    s, c = _checked_page_ranges("pages_resident", arr.shape[0], starts, counts, page_size)
    base = arr.ctypes.data
    if samples is not None:
        sample_resident = kernel_module("lmdbio.io").sample_resident

        return sample_resident(base, s, c, page_size, OS_PAGE_SIZE, max(int(samples), 1)) > 0
    keep = c > 0
    if not keep.any():
        return True
    s, c = s[keep], c[keep]
    first = (base + s * page_size) // OS_PAGE_SIZE  # absolute OS page numbers
    stop = -(-(base + (s + c) * page_size) // OS_PAGE_SIZE)
    lo, hi = int(first.min()), int(stop.max())
    try:
        resident = libc.mincore(lo * OS_PAGE_SIZE, (hi - lo) * OS_PAGE_SIZE)
    except OSError:
        return False
    missing = np.zeros(resident.shape[0] + 1, np.int64)
    np.cumsum(~resident, out=missing[1:])
    return bool((missing[stop - lo] == missing[first - lo]).all())


def residency_is_reported(path: str | os.PathLike) -> bool:
    """Whether ``mincore`` tells this process which pages of the data file ``path`` are in
    the page cache. Since Linux 5.2 (and distributions' backports of that fix) it does so
    only for a file the caller owns or may write (the kernel's own permission check,
    capabilities and user namespaces included); for any other file it reports every page
    resident, against page-cache side channels: a data set another user owns looks warm
    however cold. Root is not assumed to pass: a container's root without
    ``CAP_DAC_OVERRIDE`` does not. A file on a read-only mount that this process could
    otherwise write counts as not reported (``access`` says ``EROFS``): the safe side."""
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return False
    return os.geteuid() == owner or os.access(
        path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)


def populate_if_resident(target: Mapping | np.ndarray, path: str | os.PathLike,
                         max_bytes: int = POPULATE_MAX_BYTES, samples: int = 64,
                         resident_share: float = 0.9) -> bool:
    """Map every page of a read-only mapping of the file ``path`` (at most ``max_bytes``)
    into this process's page tables now, in one ``madvise(MADV_POPULATE_READ)``, when at
    least ``resident_share`` of ``samples`` pages spread over it are in the page cache
    (the few others are read then, with the mapping's read-around: call this before
    ``MADV_RANDOM``). Returns whether it did.

    Why: a process that reads a warm file through a fresh mapping takes a page fault per
    fault-around window (16 pages, the kernel's ``fault_around_bytes``) the first time it
    touches one: 1,388 faults for the 86 MiB ImageNet-like benchmark database, 5 ms of
    CPU, where populating the mapping took 1.5 ms (2-core VM, 2026-11-28). A shuffled
    reader touches a new window on most batches of its first epochs, so the faults also
    fall inside the transform kernel's calls, whose store-kind trial (:mod:`loaders.stores`)
    leaves out every batch that faulted: at two ranks the trial needed a second pair of
    blocks, written partly with the slower stores. A share, not every sampled page: on
    that VM 0.3-0.5 % of a warm file's pages were often out of the cache, and a sample of
    64 met one in some runs. A cold or large file is left to the reads as before
    (populating it would read it whole, synchronously, and cold strategies choose what
    they read), and so is a file whose residency ``mincore`` does not report
    (:func:`residency_is_reported`: it would look warm however cold). Never raises: a
    kernel without the advice (before Linux 5.14), a mapping it refuses or another
    platform keep the faults."""
    try:
        arr = _as_array(target)
        size = int(arr.shape[0])
        if not sys.platform.startswith("linux") or not 0 < size <= max_bytes or \
                not residency_is_reported(path):
            return False
        base = arr.ctypes.data
        pages = size // OS_PAGE_SIZE  # whole pages sampled (a file is whole LMDB pages)
        if pages < 1:
            return False
        k = min(samples, pages)
        picks = (2 * np.arange(k) + 1) * pages // (2 * k)
        resident = sum(bool(libc.mincore(base + int(p) * OS_PAGE_SIZE, OS_PAGE_SIZE)[0])
                       for p in picks.tolist())
        if resident < resident_share * k:
            return False
        libc.madvise(base, size, MADV_POPULATE_READ)
    except (OSError, LmdbioError) as exc:
        log.debug("%s: mapping not populated: %s", path, exc)
        return False
    return True


def prefetch_pages(
    target: Mapping | np.ndarray,
    starts: Sequence[int] | np.ndarray,
    counts: Sequence[int] | np.ndarray,
    page_size: int,
) -> int:
    """:func:`prefetch` of many database page ranges: :func:`advise_page_ranges`
    (``MADV_WILLNEED``, one call per merged run), then all ranges touched in one compiled
    call, so the pages are resident and mapped when it returns. Bad ranges raise before
    anything is read. Returns the touch checksum."""
    advise_page_ranges(target, starts, counts, page_size, MADV_WILLNEED)
    return touch_page_ranges(target, starts, counts, page_size)


def _file_path(target: PathOrMapping) -> str:
    if isinstance(target, Mapping):
        return target.path
    p = Path(target)
    if p.is_dir() and (p / "data.mdb").exists():
        p = p / "data.mdb"
    return str(p)


def _open_ro(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise LmdbioError(f"{path}: cannot open for reading: {exc.strerror}") from exc


def fadvise_willneed(target: PathOrMapping, offset: int = 0, length: int = 0) -> None:
    """``posix_fadvise(POSIX_FADV_WILLNEED)``: asynchronous read-ahead of a byte range of the
    file (``length=0``: to the end), without mapping anything."""
    path = _file_path(target)
    fd = _open_ro(path)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def pread_prefetch(
    target: PathOrMapping,
    offsets: Sequence[int] | np.ndarray,
    lengths: Sequence[int] | np.ndarray,
    chunk: int = 1 << 20,
) -> int:
    """Read byte ranges with ``pread`` into a reused scratch buffer; returns bytes read.

    Brings the ranges into the page cache synchronously without mapping them (the touch
    variant also maps them in this process). Ranges past the end of the file raise.
    """
    path = _file_path(target)
    offs = np.asarray(offsets, dtype=np.int64).ravel()
    lens = np.asarray(lengths, dtype=np.int64).ravel()
    if offs.shape != lens.shape:
        raise LmdbioError(f"pread_prefetch: {offs.size} offsets but {lens.size} lengths")
    fd = _open_ro(path)
    try:
        size = os.fstat(fd).st_size
        bad = (offs < 0) | (lens < 0) | (offs + lens > size)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise LmdbioError(
                f"{path}: prefetch range {i} [{offs[i]}, {offs[i] + lens[i]}) is outside the "
                f"{size}-byte file"
            )
        buf = memoryview(bytearray(max(OS_PAGE_SIZE, min(chunk, int(lens.max(initial=0))))))
        total = 0
        # One iteration per range chunk (MiB granularity), not per record.
        for off, n in zip(offs.tolist(), lens.tolist(), strict=True):
            end = off + n
            while off < end:
                got = os.preadv(fd, [buf[: min(len(buf), end - off)]], off)
                if got <= 0:
                    raise LmdbioError(f"{path}: unexpected end of file at offset {off}")
                off += got
                total += got
        return total
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- page cache


def drop_cache(target: PathOrMapping) -> None:
    """Evict the file's pages from the page cache (``POSIX_FADV_DONTNEED``).

    Dirty pages are written back first (``fdatasync``), since the kernel only evicts clean
    ones. On tmpfs the page cache *is* the file, so nothing is evicted there.

    Pages still mapped by some process are not evicted by the kernel; for a :class:`Mapping`
    this process's page-table entries are dropped first (``MADV_DONTNEED``, harmless on a
    read-only file mapping: the next access faults the page in again). Other processes'
    mappings (other ranks) keep their pages resident until they do the same.
    """
    if isinstance(target, Mapping) and not target.closed:
        advise(target, 0, None, MADV_DONTNEED)
    path = _file_path(target)
    fd = _open_ro(path)
    try:
        # Dirty pages (a file just written) are not evicted: write them back first.
        # fdatasync on a read-only descriptor is allowed on Linux.
        try:
            os.fdatasync(fd)
        except OSError as exc:  # e.g. EINVAL on special files: nothing to write back
            log.debug("%s: fdatasync before eviction failed: %s", path, exc)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_pages(
    target: PathOrMapping, offset: int = 0, length: int | None = None
) -> np.ndarray:
    """One bool per OS page of the byte range: is it in the page cache (``mincore``)?

    ``target`` is a :class:`Mapping` (queried in place) or a path (mapped for the query and
    unmapped). For a file mapping ``mincore`` reports page-cache residency, whether or not
    this process touched the page - but since Linux 5.2 only for files the caller owns or
    may write to (root may); otherwise only the pages mapped in this process are reported.
    """
    if isinstance(target, Mapping):
        if target.closed:
            raise LmdbioError(f"{target.path}: the mapping is closed")
        start, stop = _byte_range(target.length, offset, length, target.path)
        a0 = (start // OS_PAGE_SIZE) * OS_PAGE_SIZE
        vec = libc.mincore(target.address + a0, stop - a0)
        return vec
    path = _file_path(target)
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype=bool)
    m = map_file(path)
    try:
        return resident_pages(m, offset, length)
    finally:
        m.close()


def resident_count(target: PathOrMapping, offset: int = 0, length: int | None = None) -> int:
    """Number of resident OS pages of the range (see :func:`resident_pages`)."""
    return int(np.count_nonzero(resident_pages(target, offset, length)))


# --------------------------------------------------------------------------- O_DIRECT


def open_direct(path: str) -> int:
    """``open(O_RDONLY | O_DIRECT)`` (a separate function so tests can make it refuse)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))


class DirectReader:
    """Read byte or page ranges of a file with ``O_DIRECT``, bypassing the page cache.

    Every read goes to storage, as on a node that has never seen the file: with one reader
    per simulated node this emulates nodes that do not share a page cache. Reads are done in
    ``alignment``-sized blocks (default: the OS page size, which satisfies the logical block
    size of practically every device) into a page-aligned buffer, and the requested bytes are
    copied out. ``bytes_read`` counts what the device delivered, padding included.

    Where the file system refuses ``O_DIRECT`` (EINVAL at open or at the first read), and
    ``fallback`` is true, the reader says so in a warning and uses buffered reads, each
    followed by ``POSIX_FADV_DONTNEED`` on the range: close to cold-cache behaviour, but the
    data does pass through the cache. ``direct`` tells which mode is in use. With
    ``fallback=False`` it raises :class:`~lmdbio.errors.LmdbioError` instead.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        alignment: int = OS_PAGE_SIZE,
        fallback: bool = True,
    ) -> None:
        self.path = _file_path(path)
        if alignment <= 0 or alignment & (alignment - 1):
            raise LmdbioError(f"O_DIRECT alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.fallback = fallback
        self.bytes_read = 0
        self.reads = 0
        self._buf: _mmap.mmap | None = None
        self.direct = True
        try:
            self._fd = open_direct(self.path)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise LmdbioError(f"{self.path}: cannot open: {exc.strerror}") from exc
            self._fd = self._refuse(exc)
        self.size = os.fstat(self._fd).st_size

    def _refuse(self, exc: OSError) -> int:
        msg = f"{self.path}: the file system refuses O_DIRECT ({exc.strerror})"
        if not self.fallback:
            raise LmdbioError(msg) from exc
        log.warning(
            "%s; falling back to buffered reads followed by POSIX_FADV_DONTNEED "
            "(data passes through the page cache)",
            msg,
        )
        self.direct = False
        return _open_ro(self.path)

    def _buffer(self, n: int) -> memoryview:
        if self._buf is None or len(self._buf) < n:
            if self._buf is not None:
                self._buf.close()
            size = -(-n // OS_PAGE_SIZE) * OS_PAGE_SIZE
            self._buf = _mmap.mmap(-1, size)  # anonymous memory is page aligned
        return memoryview(self._buf)

    def read(self, offset: int, length: int, out: np.ndarray | None = None) -> np.ndarray:
        """Bytes ``[offset, offset+length)`` as a new ``uint8`` array (or into ``out``)."""
        if self._fd < 0:
            raise LmdbioError(f"{self.path}: the reader is closed")
        if offset < 0 or length < 0 or offset + length > self.size:
            raise LmdbioError(
                f"{self.path}: read [{offset}, {offset + length}) is outside the "
                f"{self.size}-byte file"
            )
        if out is None:
            out = np.empty(length, dtype=np.uint8)
        elif out.dtype != np.uint8 or out.ndim != 1 or out.shape[0] < length:
            raise LmdbioError(f"out must be a 1-D uint8 array of >= {length} bytes")
        if length == 0:
            return out[:0]
        a = self.alignment
        astart = offset // a * a
        aend = -(-(offset + length) // a) * a
        mv = self._buffer(aend - astart)
        pos = 0
        want = offset + length - astart  # bytes needed from astart on
        while pos < want:
            try:
                got = os.preadv(self._fd, [mv[pos : aend - astart]], astart + pos)
            except OSError as exc:
                if self.direct and pos == 0 and exc.errno == errno.EINVAL:
                    os.close(self._fd)
                    self._fd = self._refuse(exc)
                    return self.read(offset, length, out)
                raise LmdbioError(
                    f"{self.path}: read at offset {astart + pos} failed: {exc.strerror}"
                ) from exc
            if got <= 0:
                raise LmdbioError(f"{self.path}: unexpected end of file at {astart + pos}")
            pos += got
        self.bytes_read += pos
        self.reads += 1
        if not self.direct:
            os.posix_fadvise(self._fd, astart, pos, os.POSIX_FADV_DONTNEED)
        out[:length] = np.frombuffer(mv, dtype=np.uint8, count=length, offset=offset - astart)
        del mv
        return out[:length]

    def read_pages(
        self, first_page: int, n_pages: int, page_size: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Database pages ``[first_page, first_page+n_pages)`` of ``page_size`` bytes."""
        if page_size <= 0 or first_page < 0 or n_pages < 0:
            raise LmdbioError(
                f"{self.path}: bad page range first={first_page} n={n_pages} size={page_size}"
            )
        return self.read(first_page * page_size, n_pages * page_size, out)

    def close(self) -> None:
        """Close the file and free the buffer (safe to call twice)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._buf is not None:
            self._buf.close()
            self._buf = None

    def __enter__(self) -> DirectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            os.close(fd)
