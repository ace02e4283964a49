"""``indexed``: exact record positions from a leaf directory built once, collectively.

The leaf directory holds the index of the first record of every leaf page. Reader 0 walks
the branch pages to list the leaves (branch pages only) and broadcasts the list; each reader
reads the headers of its share of the leaves (each leaf read by exactly one rank); an
allgather assembles the counts. The directory is saved as a sidecar in lmdbio's cache
directory (:func:`cache_root`: ``$LMDBIO_CACHE``, else ``$XDG_CACHE_HOME/lmdbio``, else
``~/.cache/lmdbio``), never beside ``data.mdb`` (datasets often live on read-only or
shared file systems), in a folder keyed by the snapshot identity (:func:`sidecar_key`:
the file's identity and modification time, format, txnid and size) and reused by later
runs; a changed database has another identity, so its directory is rebuilt. With it, any
record is one binary search and one leaf read away: O(1) seeks, exact page ranges,
shuffled epochs, zero extra pages.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.io.prefetch import advise_page_ranges
from lmdbio.kernel_cache import kernel_module
from lmdbio.lmdb import Database, RecordRefs
from lmdbio.lmdb.format import P_LEAF
from lmdbio.lmdb.records import LocatedRecords
from lmdbio.mpiutil import agree, sleeping_barrier
from lmdbio.plan.epoch import EpochPlan
from lmdbio.plan.strategies.base import IterationStats, ReadStrategy, Timer, spread

log = logging.getLogger(__name__)

#: the environment variable naming lmdbio's cache directory (sidecars such as the leaf
#: directories of ``indexed``); pointing it at the dataset's own folder keeps them there
CACHE_ENV = "LMDBIO_CACHE"
#: the folder of the cache directory that holds the leaf directories
INDEX_FOLDER = "index"


def cache_root() -> Path | None:
    """lmdbio's cache directory: ``$LMDBIO_CACHE``, else ``$XDG_CACHE_HOME/lmdbio`` (an
    absolute ``XDG_CACHE_HOME`` only, as the XDG specification says), else
    ``~/.cache/lmdbio``; ``None`` when none can be named (no home directory)."""
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "lmdbio"
    try:
        return Path.home() / ".cache" / "lmdbio"
    except (RuntimeError, KeyError):  # no HOME and no password entry
        return None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _file_id(db: Database) -> str:
    """The database file's identity (resolved path, device, inode): one cache folder
    prefix per file, whatever its snapshots."""
    st = os.stat(db.path)
    return _digest(f"{db.path.resolve()}\0{st.st_dev}\0{st.st_ino}")


def sidecar_key(db: Database) -> str:
    """The cache folder of this snapshot of the database: ``<file>-<snapshot>``, two
    digests. ``<file>`` is the file's identity (:func:`_file_id`); ``<snapshot>`` adds what
    changes when a writer commits or the file is replaced in place (modification time,
    format version, txnid, size). A changed database therefore has another key and its
    directory is rebuilt (and one that names the snapshot but holds other contents is
    still caught by the spot check of :func:`load_sidecar`)."""
    st = os.stat(db.path)
    s = db.snapshot
    snap = _digest(f"{st.st_mtime_ns}\0{st.st_size}\0{s.format_version}\0{s.txnid}"
                   f"\0{s.file_size}")
    return f"{_file_id(db)}-{snap}"


def _sidecar_name(db: Database) -> str:
    """The file name of the leaf directory of this snapshot's tree (the named
    sub-database's, if any): the name older versions wrote beside ``data.mdb``."""
    s = db.snapshot
    name = f"lmdbio-index-v{s.format_version}-t{s.txnid}-r{s.root}-s{s.file_size}.npz"
    if db.subdb_name:
        name = name.replace(".npz", f"-db{db.subdb_name.hex()}.npz")
    return name


def sidecar_path(db: Database) -> Path | None:
    """Where the leaf directory of this snapshot is kept: ``<cache>/index/<key>/<name>``
    (:func:`cache_root`, :func:`sidecar_key`); ``None`` when there is no cache directory
    or the file cannot be looked at."""
    root = cache_root()
    try:
        key = sidecar_key(db)
    except OSError:
        return None
    return None if root is None else root / INDEX_FOLDER / key / _sidecar_name(db)


def legacy_sidecar_path(db: Database) -> Path:
    """Where versions before the cache directory wrote the leaf directory: beside
    ``data.mdb``. Still read (when valid: the same checks as the cache's) so an existing
    one is not rebuilt; nothing is written there any more."""
    return db.path.parent / _sidecar_name(db)


def _load(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path) as z:
            return z["leaves"], z["first"]
    except Exception as exc:  # a cache: whatever is wrong with it, the directory is rebuilt
        # (raising here would leave the other readers waiting for reader 0); no file, or a
        # cache path through a file (reported once, by the save), is quietly a miss
        if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            log.warning("%s: leaf directory sidecar unreadable (%s); rebuilding", path, exc)
        return None


def load_sidecar(db: Database) -> tuple[np.ndarray, np.ndarray] | None:
    """The leaf directory ``(leaves, first)`` of this snapshot from the cache (or from an
    older version's sidecar beside ``data.mdb``), if one is there and matches the file;
    else ``None`` (a warning for one that exists but is unreadable or does not match)."""
    for path in (sidecar_path(db), legacy_sidecar_path(db)):
        got = _load(path) if path is not None else None
        if got is None:
            continue
        leaves, first = got
        if first.shape != (leaves.shape[0] + 1,) or int(first[-1]) != len(db) \
                or not _spot_check(db, leaves.astype(np.int64), first.astype(np.int64)):
            log.warning("%s: leaf directory does not match the database; rebuilding", path)
            return None
        return leaves.astype(np.int64), first.astype(np.int64)
    return None


def _spot_check(db: Database, leaves: np.ndarray, first: np.ndarray, samples: int = 8) -> bool:
    """A few leaves of a loaded directory (the first, the last and some between) are leaf
    pages of this file holding the counted number of records: a sidecar that names the
    snapshot but was written for other contents (copied, edited) is caught before use."""
    k = kernel_module("lmdbio.lmdb")
    if leaves.shape[0] == 0:
        return len(db) == 0
    if (np.diff(first) < 1).any() or leaves.min() < 2 or leaves.max() > db.last_pg:
        return False
    pick = np.unique(np.linspace(0, leaves.shape[0] - 1, samples).astype(np.int64))
    # asked for at once: on a cold file one batch of reads, not a fault and a read each
    # (7-9 ms -> ~2 ms for 8 pages here); advisory, nothing is read or counted by asking
    with contextlib.suppress(LmdbioError):
        advise_page_ranges(db.buf, leaves[pick], np.ones(pick.shape[0], np.int64), db.psize)
    counts = np.empty(pick.shape[0], np.int64)
    code, _ = k.count_leaf_records(db.buf, db.fmt, leaves[pick], counts,
                                   db.accounting.touched, db.accounting.enabled)
    if code or (counts != first[pick + 1] - first[pick]).any():
        return False
    for pg in leaves[pick].tolist():  # a handful of pages: their header says leaf
        code, _ = k.check_page(db.buf, db.fmt, pg, db.last_pg)
        flags = int(db.buf[pg * db.psize + db.fmt[2]])
        if code or not flags & P_LEAF:
            return False
    return True


def save_sidecar(db: Database, leaves: np.ndarray, first: np.ndarray) -> Path | None:
    """Keep the leaf directory of this snapshot in the cache directory, for later runs:
    written to a temporary file of the key's folder and renamed into place (atomic: a
    concurrent run reads the old file, the new one or none, never half of one). Other
    snapshots' folders of the same file are stale (the file has changed since) and are
    removed. Called by reader 0 alone. A cache that cannot be written (read-only, full,
    a path through a file) costs a warning and nothing else: the directory built in
    memory serves this run. Returns the path written, or ``None``."""
    path = sidecar_path(db)
    if path is None:
        log.warning("no cache directory for the leaf directory (set %s): it is kept in "
                    "memory for this run only", CACHE_ENV)
        return None
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".lmdbio-index-", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, leaves=leaves, first=first)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        log.warning("lmdbio cache %s is not writable (%s): the leaf directory is kept in "
                    "memory for this run only (rebuilt by the next one); set %s to a "
                    "writable folder to keep it", path.parents[2], exc, CACHE_ENV)
        return None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    _prune_stale(path.parent)
    return path


def _prune_stale(folder: Path) -> None:
    """Remove the cache folders of this file's other snapshots (``<file>-*`` beside
    ``folder``, whose name is ``<file>-<snapshot>``): the file has changed since they were
    written, so no run reads them again. Best effort: a folder another process removes or
    still writes is left to it."""
    prefix = folder.name.split("-", 1)[0] + "-"
    with contextlib.suppress(OSError):
        for other in folder.parent.iterdir():
            if other.name.startswith(prefix) and other.name != folder.name and other.is_dir():
                shutil.rmtree(other, ignore_errors=True)


def build_leaf_directory(db: Database, comm, rank: int, size: int, timeout: float = 120.0
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Collective over ``comm``: the leaves named by rank 0's branch pages
    (:meth:`~lmdbio.lmdb.Database.tree_levels`: no leaf read), counts split by leaf
    (:func:`count_records_collectively`): every page is read by exactly one rank."""
    leaves, error = None, None
    if rank == 0:
        try:
            leaves = db.tree_levels()[0][-1]
        except Exception as exc:  # agreed on below, so no rank is left waiting
            error = str(exc)
    if comm is not None:
        # the others wait sleeping, not polling in the broadcast (reader 0's core)
        sleeping_barrier(comm, timeout, "readers: waiting for reader 0's leaf pages")
        agree(comm, error is None, error or "", "listing the leaf pages")
        leaves = comm.bcast(leaves, root=0)
    elif error:
        raise RuntimeError(error)
    return leaves, count_records_collectively(db, leaves, comm, rank, size)


def count_records_collectively(db: Database, leaves: np.ndarray, comm, rank: int,
                               size: int) -> np.ndarray:
    """Collective over ``comm`` (None: this rank alone): ``first`` of the leaf pages
    ``leaves`` (key order, the same list on every rank): ``first[j]`` is the index of leaf
    ``j``'s first record, ``first[-1]`` the total. Each rank reads the headers of its
    ``1 / size`` of the leaves (marked in the accounting); an allgather assembles the
    counts. A damaged leaf raises on every rank alike, naming the page."""
    k = kernel_module("lmdbio.lmdb")
    lo = leaves.shape[0] * rank // size
    hi = leaves.shape[0] * (rank + 1) // size
    counts = np.empty(hi - lo, np.int64)
    error: LmdbioError | None = None
    try:  # named by their parents: each must be a leaf page of the snapshot
        db.checked_leaves(leaves[lo:hi])
        code, page = k.count_leaf_records(db.buf, db.fmt, leaves[lo:hi], counts,
                                          db.accounting.touched, db.accounting.enabled)
        if code:
            db.raise_format_error(code, page)
    except LmdbioError as exc:  # agreed on below, so no rank is left waiting
        error = exc
    if comm is not None:
        agree(comm, error is None, str(error or ""), "counting leaf records")
        counts = np.concatenate(comm.allgather(counts))
    elif error is not None:
        raise error
    first = np.zeros(leaves.shape[0] + 1, np.int64)
    np.cumsum(counts, out=first[1:])
    if first[-1] != db.db.entries:  # every rank has the same counts: all raise alike
        raise LmdbFormatError(db.path, f"the leaves hold {first[-1]} records but the meta "
                              f"page says {db.db.entries}", page=db.db.root)
    return first


def shared_leaf_directory(db: Database, comm, rank: int, size: int, timeout: float = 120.0,
                          leaves: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray, str]:
    """Collective over ``comm``: ``(leaves, first, source)``, the leaf directory of this
    snapshot from the sidecar when rank 0 finds a valid one (``source`` "sidecar"), else
    built collectively (:func:`build_leaf_directory`, or only counted when every rank
    passes the same ``leaves`` in key order) and saved by rank 0 (``source`` "built")."""
    cached = load_sidecar(db) if rank == 0 else None
    if comm is not None:  # the others wait sleeping, not polling in the broadcast: on
        # an oversubscribed host that took reader 0's core (its sidecar check took
        # 0.5-15 ms instead of 0.5)
        sleeping_barrier(comm, timeout,
                         "readers: waiting for reader 0's leaf directory sidecar")
        cached = comm.bcast(cached, root=0)
    if cached is not None:
        return cached[0], cached[1], "sidecar"
    if leaves is None:
        leaves, first = build_leaf_directory(db, comm, rank, size, timeout)
    else:
        first = count_records_collectively(db, leaves, comm, rank, size)
    if rank == 0:
        save_sidecar(db, leaves, first)
    return leaves, first, "built"


class Indexed(ReadStrategy):
    """Reads located through the leaf directory: exact, random access, shuffle-capable."""

    name = "indexed"
    summary = ("a leaf directory built once gives every record's position: O(1) seeks, "
               "exact page ranges, global and block shuffles, exact resume")
    advises = True
    shuffles = True

    def setup(self) -> None:
        leaves, first, self.source = shared_leaf_directory(
            self.db, self.ctx.readers, self.ctx.reader_index, self.ctx.n_readers,
            self.ctx.timeout)
        self.db.set_leaf_directory(leaves, first)
        self._overflow = True  # until a fetch shows the records' values are all inline
        self._ahead: tuple[int, int] | None = None  # (first id, count) last read ahead
        #: the ids read_ahead located and their refs (values advised already), which the
        #: fetch after it takes instead of locating them again
        self._located: tuple[np.ndarray, RecordRefs] | None = None
        #: every record located so far (None for a database too large to keep them):
        #: shuffled epochs after the first search no leaf for a record located before.
        #: Its leaf page is still read, for its key (every batch carries its keys), and
        #: counted as read.
        self.table = LocatedRecords(len(self.db)) if LocatedRecords.fits(len(self.db)) \
            else None

    def fetch(self, plan: EpochPlan, iteration: int, ids: np.ndarray,
              stats: IterationStats, iterations: int = 1) -> RecordRefs:
        ahead, self._ahead = self._ahead, None
        located, self._located = self._located, None
        if located is not None and np.array_equal(located[0], ids):
            # located by read_ahead, its values advised then: count the leaves it read
            refs = located[1]
            with Timer(stats, "walk"):
                self.db.accounting.mark_pages(refs.leaf_pg)
            self._overflow = bool((refs.ovf_pages > 0).any())
            return refs
        if ids.size and ahead != (int(ids[0]), ids.size):
            # not read ahead (an epoch's first slot, a resume): the leaves in a few reads
            # (located before or not: the keys are read from them)
            with Timer(stats, "prefetch"):
                self._advise_leaves(ids)
        with Timer(stats, "walk"):
            refs = self.located(ids)
            # the keys are read from the leaves, found in the table or not: counted as read
            self.db.accounting.mark_pages(refs.leaf_pg)
        # inline values are in the leaf pages locate has just read: only overflow ones
        self._overflow = bool((refs.ovf_pages > 0).any())
        if self._overflow:
            # the exact pages are known before anything is read: ask for them now, as a few
            # large reads, rather than fault them in one page (or read-around window) at a
            # time during the gather
            with Timer(stats, "prefetch"):
                self.advise_values(refs)
        return refs

    def _advise_leaves(self, ids: np.ndarray) -> None:
        """Ask for the leaf pages of records ``ids`` (the directory names them: nothing is
        read), merged into runs; only without read-around, where faults read single
        pages (with it, faults read around them: advising leaf pages then costs more than
        it saves, docs/reading.md)."""
        if self.db.read_around or not self.advising or not ids.size or self.trusts_warm():
            return
        leaves, first = self.db.leaves(), self.db.leaf_directory()
        some = ids[spread(ids.size, 16)]
        if self.cached_sample(leaves[np.searchsorted(first, some, "right") - 1]):
            return  # a warm file: nothing to ask for
        pages = np.unique(leaves[np.searchsorted(first, ids, "right") - 1])
        self.advise_pages(pages, np.ones_like(pages))

    def read_ahead(self, plan: EpochPlan, iteration: int, ids: np.ndarray) -> None:
        """Ask for the next iteration's leaf pages (the directory names them: nothing is
        read; only without read-around) and, when this iteration's records had overflow
        values, locate the next ones and ask for their overflow pages. The fetch of those
        ids takes the located records as they are (and counts their leaves as read in its
        own iteration) instead of locating them again."""
        if not ids.size or not self.advising:
            return
        self._advise_leaves(ids)  # located or not, the keys are read from the leaves
        self._ahead = (int(ids[0]), ids.size)
        if not self._overflow:
            return
        acc = self.db.accounting
        was, acc.enabled = acc.enabled, False  # counted by the fetch that takes them
        try:
            refs = self.located(ids)
        finally:
            acc.enabled = was
        self.advise_values(refs)
        self._located = (ids, refs)

    def located(self, ids: np.ndarray) -> RecordRefs:
        """Records ``ids``: from the record table, after adding the leaves of those it
        does not hold yet (:meth:`locate_leaves_of`; only those: locating the whole slot
        again for a few new records took about twice the reader's other work)."""
        if self.table is None or not ids.size:
            return self.locate(ids)
        ids = np.ascontiguousarray(ids, np.int64)
        refs = self.table.lookup(ids)
        if refs is None:  # some not located yet: their leaves, then the slot from the table
            self.locate_leaves_of(ids[~self.table.known[ids]])
            refs = self.table.lookup(ids)
            assert refs is not None  # every record of their leaves was added
        return refs

    def locate_leaves_of(self, ids: np.ndarray) -> None:
        """Put every record of the leaf pages that hold records ``ids`` in the record
        table, each leaf parsed once in order (:meth:`Database.build_table`).

        Locating a record reads its leaf page anyway (for its key); parsing the whole page
        then costs a few nanoseconds per node, where a record located on its own costs a
        binary search and cache misses (0.1-0.3 us). A reader whose share changes every
        shuffled epoch (several nodes, or reader groups of one) thus has its table whole
        after the leaves of its first slots, instead of meeting records it never located
        for several epochs; the table still grows only with leaves this reader reads, and
        the pages read (and counted) are exactly the leaves the records' locates read:
        overflow pages are not touched (a run's length comes from the node)."""
        assert self.table is not None  # located() calls it only with a table
        db = self.db
        first, leaves = db.leaf_directory(), db.leaves()
        js = np.unique(np.searchsorted(first, ids, "right") - 1)
        counts = first[js + 1] - first[js]
        total = int(counts.sum())
        table = db.build_table(db.db, leaves[js], total)
        # row r holds node `slot` of its leaf, record first[leaf] + slot
        slot = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        pages = np.repeat(leaves[js], counts)
        wrong = np.flatnonzero((table.leaf_pg != pages) | (table.slot != slot))
        if wrong.size:  # the directory and the pages disagree: never a misplaced record
            raise LmdbFormatError(db.path, "a leaf page holds other records than the leaf "
                                  "directory counted", page=int(pages[wrong[0]]))
        self.table.add(np.repeat(first[js], counts) + slot, table.refs())

    def locate(self, ids: np.ndarray) -> RecordRefs:
        """Records ``ids`` located through their leaf pages (:meth:`Database.locate`), and
        remembered in the record table."""
        refs = self.db.locate(ids)
        if self.table is not None:
            self.table.add(np.ascontiguousarray(ids, np.int64), refs)
        return refs
