"""Map a file read-only at the same virtual address in every rank (LMDBIO-DM step 1).

When every reader has the database at the same address, a cursor - a stack of page pointers
and slot indices - means the same thing in every process and can be sent as raw bytes. The
collective :func:`map_symmetric` gets there like the reference implementation, without its
deadlock:

1. every rank opens the file; one ``allgather`` checks that all could and that all see the
   same size (different files on different nodes would make every cursor wrong);
2. per attempt, rank 0 draws a random 2 MiB-aligned address inside
   ``[SAFE_LOW, SAFE_HIGH)`` (far above heap and libraries, far below the stack of the 47-bit
   user address space) and broadcasts it; every rank calls
   ``mmap(addr, len, PROT_READ, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0)`` and compares the
   returned address with the one asked for (kernels before 4.17 ignore the flag and place
   the mapping elsewhere: that counts as a failure and is unmapped); an
   ``allreduce(MIN)`` decides; on any failure every rank unmaps and the next attempt starts.
   Every rank takes part in every collective of every attempt, whatever happened locally
   (the reference's rank 0 skipped the broadcast after its own failure and deadlocked);
3. after ``max_attempts`` failures the fallback is explicit and logged: every rank maps
   wherever the kernel chooses and the result has ``symmetric=False``; callers then send
   cursors as page numbers instead of addresses.

The returned :class:`Mapping` exposes the bytes as a zero-copy read-only numpy ``uint8``
array. Mappings are unmapped by :meth:`Mapping.close` or when the object and every array
derived from it are garbage. Linux only (``MAP_FIXED_NOREPLACE``).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import random
import stat as _stat
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.errors import LmdbioError
from lmdbio.io import libc

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

__all__ = [
    "DEFAULT_ALIGNMENT",
    "DEFAULT_MAX_ATTEMPTS",
    "FAIL_ATTEMPTS_ENV",
    "FAIL_RANK_ENV",
    "SAFE_HIGH",
    "SAFE_LOW",
    "Mapping",
    "MappingInUseError",
    "map_file",
    "map_symmetric",
]

log = logging.getLogger(__name__)

#: lowest address drawn (16 TiB): above the heap, the executable and mmap'd libraries' usual
#: place on x86-64 and arm64 with 48-bit address spaces
SAFE_LOW = 0x1000_0000_0000
#: highest end of a symmetric mapping (96 TiB): below the stack and the mmap base at ~128 TiB
SAFE_HIGH = 0x6000_0000_0000
#: addresses are 2 MiB aligned (a huge-page boundary; also a multiple of every LMDB page size)
DEFAULT_ALIGNMENT = 2 << 20
#: attempts before falling back (the reference allows 200; collisions in an 80 TiB window are
#: rare, so repeated failure means a systematic cause such as an old kernel)
DEFAULT_MAX_ATTEMPTS = 32
#: test hook: comma-separated ranks (of the communicator) whose attempts are made to fail
FAIL_RANK_ENV = "LMDBIO_SYMMAP_FAIL_RANK"
#: test hook: how many attempts the failing ranks fail (default: all)
FAIL_ATTEMPTS_ENV = "LMDBIO_SYMMAP_FAIL_ATTEMPTS"


class MappingInUseError(LmdbioError, BufferError):
    """``close()`` was called while numpy views of the mapping are still alive."""


def _release(address: int, length: int) -> None:
    try:
        libc.munmap(address, length)
    except OSError as exc:  # pragma: no cover - only with a corrupted address
        log.error("munmap of %#x (+%d) failed: %s", address, length, exc)


class Mapping:
    """A read-only memory mapping of (the first ``length`` bytes of) a file.

    ``address`` is where it lives in this process; ``symmetric`` says whether it is the same
    address on every rank of the communicator it was made on (always ``False`` for
    :func:`map_file`); ``attempts`` is how many collective attempts it took (0 for
    :func:`map_file`). Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        path: str,
        address: int,
        length: int,
        file_size: int,
        symmetric: bool,
        attempts: int,
    ) -> None:
        self.path = path
        self.address = address
        self.length = length
        self.file_size = file_size
        self.symmetric = symmetric
        self.attempts = attempts
        self._array_ref: weakref.ref[np.ndarray] | None = None
        self._finalizer = weakref.finalize(self, _release, address, length)
        # The kernel drops every mapping at process exit; unmapping from an atexit hook
        # could only fault a daemon thread (e.g. a nogil touch loop) still reading it.
        self._finalizer.atexit = False

    # ------------------------------------------------------------------ access
    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def array(self) -> np.ndarray:
        """Zero-copy read-only ``uint8`` array over the whole mapping.

        The array (and every view of it) keeps this mapping alive; :meth:`close` refuses to
        unmap while any of them exists.
        """
        self._check_open()
        arr = self._array_ref() if self._array_ref is not None else None
        if arr is None:
            buf = (ctypes.c_uint8 * self.length).from_address(self.address)
            buf._lmdbio_mapping = self  # views -> ctypes buffer -> this mapping
            arr = np.frombuffer(buf, dtype=np.uint8)
            arr.flags.writeable = False  # PROT_READ: a write would be a segfault
            self._array_ref = weakref.ref(arr)
        return arr

    def view(self, offset: int = 0, length: int | None = None) -> np.ndarray:
        """``array[offset:offset+length]``, bounds-checked (zero-copy)."""
        if length is None:
            length = self.length - offset
        if offset < 0 or length < 0 or offset + length > self.length:
            raise LmdbioError(
                f"{self.path}: range [{offset}, {offset + length}) is outside the "
                f"{self.length}-byte mapping"
            )
        return self.array[offset : offset + length]

    def pointer(self, offset: int) -> int:
        """The address of byte ``offset`` in this process (bounds-checked)."""
        if not 0 <= offset < self.length:
            raise LmdbioError(f"{self.path}: offset {offset} outside [0, {self.length})")
        return self.address + offset

    def offset(self, pointer: int) -> int:
        """The file offset of an address inside this mapping (bounds-checked)."""
        off = pointer - self.address
        if not 0 <= off < self.length:
            raise LmdbioError(
                f"{self.path}: address {pointer:#x} is outside the mapping at "
                f"{self.address:#x} (+{self.length})"
            )
        return off

    def __len__(self) -> int:
        return self.length

    def describe(self) -> dict[str, Any]:
        """JSON-able summary."""
        return {
            "path": self.path,
            "address": self.address,
            "length": self.length,
            "file_size": self.file_size,
            "symmetric": self.symmetric,
            "attempts": self.attempts,
            "closed": self.closed,
        }

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at {self.address:#x}"
        return (
            f"Mapping({self.path!r}, {self.length} bytes {state}, "
            f"symmetric={self.symmetric}, attempts={self.attempts})"
        )

    # ------------------------------------------------------------------ teardown
    def _check_open(self) -> None:
        if self.closed:
            raise LmdbioError(f"{self.path}: the mapping is closed")

    def close(self) -> None:
        """Unmap. Safe to call twice. Raises :class:`MappingInUseError` (and keeps the
        mapping) while numpy views of it are alive, because reading them after ``munmap``
        would crash the process."""
        if self.closed:
            return
        if self._array_ref is not None and self._array_ref() is not None:
            gc.collect()  # a view dropped inside a reference cycle is not really alive
        if self._array_ref is not None and self._array_ref() is not None:
            raise MappingInUseError(
                f"{self.path}: cannot unmap while numpy views of the mapping exist; "
                "drop them first"
            )
        self._finalizer()

    def __enter__(self) -> Mapping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- helpers


def _resolve(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if p.is_dir() and (p / "data.mdb").exists():
        p = p / "data.mdb"  # an LMDB environment directory
    return p


def _open_checked(path: Path, length: int | None) -> tuple[int, int, int]:
    """Open read-only; return ``(fd, file_size, length_to_map)`` or raise LmdbioError."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise LmdbioError(f"{path}: cannot open for reading: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise LmdbioError(f"{path}: not a regular file")
        size = st.st_size
        if size == 0:
            raise LmdbioError(f"{path}: the file is empty (0 bytes); nothing to map")
        if length is None:
            length = size
        if length <= 0:
            raise LmdbioError(f"{path}: length to map must be positive, got {length}")
        if length > size:
            raise LmdbioError(
                f"{path}: cannot map {length} bytes, the file has only {size} "
                "(pages past the end of a file fault with SIGBUS)"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, size, length


def _try_fixed(fd: int, address: int, length: int, block: bool) -> tuple[int | None, str]:
    """One local attempt at ``address``; never raises. Returns (address or None, error)."""
    blocker = None
    try:
        if block:
            # Test hook: occupy the target so the real call fails the way a collision does.
            try:
                blocker = libc.mmap(
                    address,
                    libc.OS_PAGE_SIZE,
                    libc.PROT_NONE,
                    libc.MAP_PRIVATE | libc.MAP_ANONYMOUS | libc.MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            except OSError:
                blocker = None
        try:
            got = libc.mmap(
                address,
                length,
                libc.PROT_READ,
                libc.MAP_SHARED | libc.MAP_FIXED_NOREPLACE,
                fd,
                0,
            )
        except OSError as exc:
            return None, f"mmap at {address:#x}: {exc.strerror}"
        if got != address:
            libc.munmap(got, length)  # kernel < 4.17: the flag was only a hint
            return None, f"kernel placed the mapping at {got:#x} instead of {address:#x}"
        return got, ""
    except Exception as exc:  # anything local must turn into a vote, not skip a collective
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        if blocker is not None:
            _release(blocker, libc.OS_PAGE_SIZE)


def _fail_plan(
    fail_ranks: object, fail_attempts: int | None
) -> tuple[frozenset[int], int | None]:
    """The test hook's (ranks, attempts), from the arguments or the environment."""
    try:
        if fail_ranks is None:
            raw = os.environ.get(FAIL_RANK_ENV, "").strip()
            fail_ranks = [int(x) for x in raw.split(",") if x.strip()] if raw else []
            if fail_attempts is None and os.environ.get(FAIL_ATTEMPTS_ENV, "").strip():
                fail_attempts = int(os.environ[FAIL_ATTEMPTS_ENV])
        return frozenset(int(r) for r in fail_ranks), fail_attempts  # type: ignore[attr-defined]
    except (TypeError, ValueError) as exc:
        raise LmdbioError(
            f"bad symmetric-mapping test hook ({FAIL_RANK_ENV}="
            f"{os.environ.get(FAIL_RANK_ENV)!r}, {FAIL_ATTEMPTS_ENV}="
            f"{os.environ.get(FAIL_ATTEMPTS_ENV)!r}, fail_ranks={fail_ranks!r}): {exc}"
        ) from None


# --------------------------------------------------------------------------- public


def map_file(
    path: str | os.PathLike[str], length: int | None = None, address: int | None = None
) -> Mapping:
    """Map a file read-only in this process only (no MPI).

    ``address`` asks for an exact place (``MAP_FIXED_NOREPLACE``; raises if it cannot be had);
    by default the kernel chooses. ``path`` may be an LMDB directory (maps ``data.mdb``).
    """
    p = _resolve(path)
    fd, size, length = _open_checked(p, length)
    try:
        if address is None:
            ptr = libc.mmap(0, length, libc.PROT_READ, libc.MAP_SHARED, fd, 0)
        else:
            got, err = _try_fixed(fd, address, length, block=False)
            if got is None:
                raise LmdbioError(f"{p}: cannot map at {address:#x}: {err}")
            ptr = got
    except OSError as exc:
        raise LmdbioError(f"{p}: mmap of {length} bytes failed: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return Mapping(str(p), ptr, length, size, symmetric=False, attempts=0)


def map_symmetric(
    comm: MPI.Comm,
    path: str | os.PathLike[str],
    length: int | None = None,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    seed: int | None = None,
    low: int = SAFE_LOW,
    high: int = SAFE_HIGH,
    alignment: int = DEFAULT_ALIGNMENT,
    fail_ranks: object = None,
    fail_attempts: int | None = None,
) -> Mapping:
    """Collective over ``comm``: map ``path`` read-only at one address common to all ranks.

    ``length`` defaults to the file size and must be the same everywhere. ``seed`` seeds rank
    0's address draws (reproducible tests). On success ``Mapping.symmetric`` is True and
    ``Mapping.attempts`` counts the attempts; after ``max_attempts`` failures the logged
    fallback returns a kernel-placed mapping with ``symmetric=False``.

    ``fail_ranks`` / ``fail_attempts`` are a test hook (default: the environment variables
    ``LMDBIO_SYMMAP_FAIL_RANK`` = comma-separated ranks, ``LMDBIO_SYMMAP_FAIL_ATTEMPTS``):
    the listed ranks have their first ``fail_attempts`` attempts (all when ``None``) collide
    with a page mapped at the drawn address, exercising the real failure path.

    Raises :class:`~lmdbio.errors.LmdbioError` on every rank when any rank cannot open the
    file, the ranks see different sizes or lengths, or even the fallback mapping fails.
    """
    from mpi4py import MPI

    if comm == MPI.COMM_NULL:
        raise LmdbioError("map_symmetric needs a communicator, got MPI.COMM_NULL")
    _check_window(max_attempts, low, high, alignment)
    p = _resolve(path)
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    window = _AddressWindow(low, high, alignment, rng)
    fd, size, mlen, first_address, hook = _open_everywhere(
        comm, p, length, window, fail_ranks, fail_attempts
    )
    try:
        addr, attempts, last_error = _try_common_address(
            comm, p, fd, mlen, window, first_address, max_attempts, hook
        )
        if addr is not None:
            return Mapping(str(p), addr, mlen, size, symmetric=True, attempts=attempts)
        ptr = _map_fallback(comm, p, fd, mlen, attempts, last_error)
        return Mapping(str(p), ptr, mlen, size, symmetric=False, attempts=attempts)
    finally:
        os.close(fd)


def _try_common_address(
    comm: Any, p: Path, fd: int, mlen: int, window: _AddressWindow, first_address: int | None,
    max_attempts: int, hook: tuple[frozenset[int], int | None],
) -> tuple[int | None, int, str]:
    """Step 2, collective: up to ``max_attempts`` tries to map ``fd`` at an address rank 0
    draws (the first one already sent, ``first_address``), all ranks voting on each.

    Returns ``(address, attempts, last_error)``: the common address (None when every try
    failed, every rank's own try then unmapped) and this rank's last failure, for the log.
    ``hook`` is the test hook's (ranks, attempts) that collide on purpose.
    """
    from mpi4py import MPI

    fail_set, fail_count = hook
    rank = comm.Get_rank()
    attempt = 0
    last_error = "the file does not fit in the address window" if not window.slots(mlen) else ""
    while first_address is not None and attempt < max_attempts:
        attempt += 1
        if attempt == 1:
            addr = first_address
        else:
            addr = comm.bcast(window.draw(mlen) if rank == 0 else None, root=0)
        block = rank in fail_set and (fail_count is None or attempt <= fail_count)
        got, err = _try_fixed(fd, addr, mlen, block)
        everyone_ok = comm.allreduce(1 if got is not None else 0, op=MPI.MIN)
        if everyone_ok:
            log.debug("%s: symmetric mapping at %#x after %d attempt(s)", p, addr, attempt)
            return addr, attempt, last_error
        if got is not None:
            _release(got, mlen)
        if err:
            last_error = err
        log.debug("%s: attempt %d at %#x failed (%s)", p, attempt, addr, err or "elsewhere")
    return None, attempt, last_error


def _check_window(max_attempts: int, low: int, high: int, alignment: int) -> None:
    """Raise :class:`~lmdbio.errors.LmdbioError` for attempt counts or address windows that
    :func:`map_symmetric` cannot draw from (checked before any collective)."""
    if max_attempts < 1:
        raise LmdbioError(f"max_attempts must be >= 1, got {max_attempts}")
    if alignment < libc.OS_PAGE_SIZE or alignment % libc.OS_PAGE_SIZE:
        raise LmdbioError(f"alignment {alignment} is not a multiple of the OS page size")
    if low % alignment or high <= low:
        raise LmdbioError(f"bad address window [{low:#x}, {high:#x}) for alignment {alignment}")


@dataclass(frozen=True)
class _AddressWindow:
    """Where rank 0 draws candidate addresses: ``alignment``-aligned starts in
    ``[low, high)`` that leave room for the whole mapping."""

    low: int
    high: int
    alignment: int
    rng: random.Random

    def slots(self, length: int) -> int:
        """How many aligned starts leave room for ``length`` bytes (0: it does not fit)."""
        if self.high - self.low < length:
            return 0
        return (self.high - self.low - length) // self.alignment + 1

    def draw(self, length: int) -> int:
        """A random aligned start for ``length`` bytes (the window must have a slot)."""
        return self.low + self.rng.randrange(self.slots(length)) * self.alignment


def _open_everywhere(
    comm: Any, p: Path, length: int | None, window: _AddressWindow, fail_ranks: object,
    fail_attempts: int | None,
) -> tuple[int, int, int, int | None, tuple[frozenset[int], int | None]]:
    """Step 1, collective: open the file on every rank and check that all could, with one
    size and length. Returns ``(fd, size, length, first_address, test_hook_plan)``, where
    ``first_address`` is rank 0's first draw, sent in the same exchange (one less).

    Raises :class:`~lmdbio.errors.LmdbioError` on every rank, the file closed, otherwise.
    """
    fd = -1
    plan: tuple[frozenset[int], int | None] = (frozenset(), None)
    first_draw = None
    try:
        plan = _fail_plan(fail_ranks, fail_attempts)
        fd, size, mlen = _open_checked(p, length)
        mine: tuple[str, int, int] = ("", size, mlen)
        if comm.Get_rank() == 0 and window.slots(mlen):
            first_draw = window.draw(mlen)
    except LmdbioError as exc:
        mine = (str(exc), -1, -1)
    gathered = comm.allgather((*mine, first_draw))
    everyone = [g[:3] for g in gathered]
    errors = {r: e for r, (e, _, _) in enumerate(everyone) if e}
    if not errors and len({(s, n) for _, s, n in everyone}) > 1:
        sizes = {r: (s, n) for r, (_, s, n) in enumerate(everyone)}
        errors = {-1: f"ranks see different (file size, length): {sizes}"}
    if errors:
        if fd >= 0:
            os.close(fd)
        detail = "; ".join(
            (f"rank {r}: {e}" if r >= 0 else e) for r, e in sorted(errors.items())
        )
        raise LmdbioError(f"{p}: symmetric mapping cannot start: {detail}")
    return fd, mine[1], mine[2], gathered[0][3], plan


def _map_fallback(comm: Any, p: Path, fd: int, mlen: int, attempts: int,
                  last_error: str) -> int:
    """Step 3, collective: map wherever the kernel chooses on every rank; rank 0 logs why
    (each rank's last failure). Raises :class:`~lmdbio.errors.LmdbioError` on every rank
    when any rank's mapping fails, so that none keeps a half-made result."""
    reasons = comm.gather(last_error, root=0)
    try:
        ptr = libc.mmap(0, mlen, libc.PROT_READ, libc.MAP_SHARED, fd, 0)
        fallback_error = ""
    except OSError as exc:
        ptr, fallback_error = 0, f"mmap: {exc.strerror}"
    failed = comm.allgather(fallback_error)
    if any(failed):
        if ptr:
            _release(ptr, mlen)
        detail = "; ".join(f"rank {r}: {e}" for r, e in enumerate(failed) if e)
        raise LmdbioError(f"{p}: even the non-symmetric fallback mapping failed: {detail}")
    if comm.Get_rank() == 0:
        why = "; ".join(f"rank {r}: {e}" for r, e in enumerate(reasons or []) if e)
        log.warning(
            "%s: no common address for %d rank(s) after %d attempt(s) (%s); falling back "
            "to kernel-chosen addresses (symmetric=False): cursors travel as page numbers",
            p,
            comm.Get_size(),
            attempts,
            why or "no rank reported a reason",
        )
    return ptr
