"""Failure handling for MPI code: agree on errors, abort instead of hanging, time out, clean up.

The worst failure of an MPI job is a hang: one rank raises, the others wait forever in the
next collective, and the job burns its allocation. This module gives every lmdbio component
the same tools against that:

* :func:`agree` / :func:`agreed` - a collective check: every rank says whether its local step
  worked; if any failed, *every* rank raises :class:`AgreementError` naming the failing ranks
  and their messages. Use it after any local step (open a file, map it, allocate) that the
  next collective depends on.
* :class:`abort_on_error` - a context manager / decorator for a rank's main function: an
  uncaught exception prints the traceback with the rank and calls ``comm.Abort(1)``, so the
  whole job ends promptly instead of hanging.
* :func:`wait_with_timeout` / :func:`barrier_with_timeout` - wait for a non-blocking request
  by polling ``test()`` with a short, growing sleep (yielding the CPU to the other ranks that
  share the core), and raise :class:`MPITimeoutError` after a deadline.
* :func:`on_shutdown` - a registry of cleanup callbacks run once, at interpreter exit, on
  SIGTERM/SIGINT, and before an abort (e.g. the shared-memory ring frees its windows).
* :class:`fail_together` - around a command's main code: a failure on every rank is
  reported once, by rank 0, and every rank exits with the same code; a failure on some ranks
  only (the others still at work, or waiting on the failed ones) aborts the job after a
  short grace.

``mpi4py`` is imported lazily, only by the functions that need it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import FrameType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from lmdbio.errors import ConfigError, JobError, LmdbioError
from lmdbio.timerslack import timer_slack

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI

__all__ = [
    "FAILURE_GRACE_ENV",
    "AgreementError",
    "MPITimeoutError",
    "abort_on_error",
    "agree",
    "agreed",
    "barrier_with_timeout",
    "exit_code_for",
    "fail_together",
    "interrupted",
    "on_shutdown",
    "rank_prefix",
    "remove_shutdown",
    "run_shutdown",
    "sleeping_barrier",
    "wait_with_timeout",
]

log = logging.getLogger(__name__)


class AgreementError(LmdbioError):
    """Raised on every rank when at least one rank of a collective check failed.

    ``failures`` maps the rank (in the communicator of the check) to its message.
    """

    def __init__(self, what: str, failures: dict[int, str], size: int) -> None:
        self.what = what
        self.failures = dict(failures)
        self.size = size
        detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(self.failures.items()))
        super().__init__(
            f"{what}: failed on {len(self.failures)} of {size} ranks "
            f"({sorted(self.failures)}): {detail}"
        )


class MPITimeoutError(LmdbioError):
    """A non-blocking MPI operation did not complete before its deadline.

    ``request`` is the still-pending request (or sequence), so the caller can keep waiting,
    ``Cancel`` it, or abort.
    """

    def __init__(self, message: str,
                 request: MPI.Request | Sequence[MPI.Request] | None = None) -> None:
        super().__init__(message)
        self.request = request


#: variables a launcher (mpiexec, srun, Hydra) sets in every rank's environment
_LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_STEP_ID")


def start_mpi() -> ModuleType:
    """Start MPI in this process (if it has not started) and return mpi4py's ``MPI`` module.

    A process started without a launcher is an MPI singleton, and Open MPI's shared-memory
    transport leaves its 16 MiB ``sm_segment.*`` file in /dev/shm after such a process exits,
    even a clean exit. One process needs no transport but ``self``, so a singleton starts
    with ``OMPI_MCA_btl=self`` (and without the UCX one-sided component, which only prints
    errors on hosts without InfiniBand). The variables are set only for MPI's start and
    removed again, so that programs this process starts (an ``mpiexec``) do not inherit
    them; a user's own settings are left alone. Other MPI libraries ignore them.
    """
    added = []
    if "mpi4py.MPI" not in sys.modules and not any(k in os.environ for k in _LAUNCHED):
        for key, value in (("OMPI_MCA_btl", "self"), ("OMPI_MCA_osc", "^ucx")):
            if key not in os.environ:
                os.environ[key] = value
                added.append(key)
    try:
        from mpi4py import MPI  # MPI starts here and reads the variables
    finally:
        for key in added:
            os.environ.pop(key, None)
    return MPI


def _world() -> MPI.Comm:
    return start_mpi().COMM_WORLD


def _mpi_running() -> bool:
    """Whether MPI was started in this process (and not finalized), without starting it."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and bool(mpi.Is_initialized()) and not bool(mpi.Is_finalized())


def _launched_ranks() -> int:
    """Ranks of the MPI job this process was launched in (``mpiexec``, ``srun``), read from
    the launcher's variables without starting MPI; 1 for a process started by hand."""
    from launch.detect import MPI_LAUNCHERS, detect_launcher

    try:
        info = detect_launcher()
    except LmdbioError:  # malformed launcher variables: MPI will say what it sees
        return 1
    return info.size if info is not None and info.name in MPI_LAUNCHERS else 1


def rank_prefix(comm: MPI.Comm | None = None) -> str:
    """``"[rank R/N host]"`` for log and error lines (world communicator by default)."""
    comm = _world() if comm is None else comm
    return f"[rank {comm.Get_rank()}/{comm.Get_size()} {socket.gethostname()}]"


# --------------------------------------------------------------------------- agreement


def agree(comm: MPI.Comm, ok: bool, message: str = "", what: str = "collective check") -> None:
    """Collective: return on every rank if ``ok`` is true everywhere, else raise everywhere.

    Costs one ``allreduce`` of an int when everything worked; the messages are gathered
    (``allgather``) only when something failed, so that every rank's error names all
    failing ranks and what each said. Every rank of ``comm`` must call it.
    """
    from mpi4py import MPI

    if comm == MPI.COMM_NULL:
        raise LmdbioError(f"{what}: agree() called with MPI.COMM_NULL")
    n_failed = comm.allreduce(0 if ok else 1, op=MPI.SUM)
    if n_failed == 0:
        return
    messages = comm.allgather(None if ok else (message or "failed"))
    failures = {r: m for r, m in enumerate(messages) if m is not None}
    raise AgreementError(what, failures, comm.Get_size())


@contextlib.contextmanager
def agreed(comm: MPI.Comm, what: str, *, own_error: bool = False) -> Iterator[None]:
    """Run a local step and agree on its outcome (collective on exit of the block).

    An exception inside the block is caught and reported to :func:`agree`; then every rank
    raises :class:`AgreementError` (chained to the local exception on the rank that had it)::

        with agreed(readers, "open data.mdb"):
            db = lmdbio.open(path)

    ``own_error``: a rank whose step failed raises its own exception (a refusal naming the
    key and its line reads better than the agreement's summary); the others still raise
    :class:`AgreementError`, naming it.
    """
    try:
        yield
    except Exception as exc:
        try:
            agree(comm, False, f"{type(exc).__name__}: {exc}", what)
        except AgreementError as err:
            if own_error:
                raise exc from None
            raise err from exc
    else:
        agree(comm, True, "", what)


# --------------------------------------------------------------------------- abort


class abort_on_error(contextlib.ContextDecorator):  # noqa: N801 - reads as a decorator name
    """End the whole MPI job when this rank raises, instead of letting the others hang.

    As a context manager or a decorator around a rank's main code. On an uncaught exception
    (including ``KeyboardInterrupt``; ``SystemExit(0)`` passes through) it prints the
    traceback (for a :class:`~lmdbio.errors.ConfigError` its message alone), every line
    prefixed with the rank and host, runs the :func:`on_shutdown`
    callbacks with reason ``"abort"``, and calls ``comm.Abort(exit_code)``. With a
    communicator of size 1 nothing can hang, so the exception propagates normally; so it
    does, without starting MPI, in a process started by hand (no launcher) that raised
    before MPI started (starting it only to abort would leave Open MPI's files behind).
    """

    def __init__(self, comm: MPI.Comm | None = None, exit_code: int = 1) -> None:
        self.comm = comm
        self.exit_code = int(exit_code)

    def __enter__(self) -> abort_on_error:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if not _failed(exc):
            return False
        if self.comm is None and not _mpi_running() and _launched_ranks() <= 1:
            return False  # a process of its own: nobody waits for it
        comm = _world() if self.comm is None else self.comm
        if comm.Get_size() == 1:
            return False
        # a configuration mistake is named by its message; a traceback would read as a crash
        parts = traceback.format_exception_only(exc_type, exc) \
            if isinstance(exc, ConfigError) else traceback.format_exception(exc_type, exc, tb)
        _abort_job(comm, self.exit_code, "".join(parts).rstrip("\n"),
                   f"aborting the MPI job (exit code {self.exit_code})")


def _failed(exc: BaseException | None) -> bool:
    """Whether a block ended by ``exc`` failed (``SystemExit(0)`` is a normal exit)."""
    return exc is not None and not (isinstance(exc, SystemExit) and exc.code in (0, None))


def _abort_job(comm: MPI.Comm, code: int, text: str, last: str) -> NoReturn:
    """Print ``text`` and ``last``, each line prefixed with the rank and host, run the
    :func:`on_shutdown` callbacks, and abort the job with ``code``; never returns."""
    prefix = rank_prefix(comm)
    lines = "\n".join(f"{prefix} {line}" for line in text.split("\n"))
    try:
        sys.stderr.write(f"{lines}\n{prefix} {last}\n")
        sys.stderr.flush()
        sys.stdout.flush()
    except Exception:  # a closed stream must not stop the abort
        pass
    run_shutdown("abort")
    comm.Abort(code)
    os._exit(code)  # Abort does not return; be sure anyway


# --------------------------------------------------------------------------- fail together

#: environment variable: seconds :class:`fail_together` waits for every rank to fail
FAILURE_GRACE_ENV = "LMDBIO_FAILURE_GRACE"
#: its default: ranks that fail together (a missing file, a bad configuration) fail within
#: moments of each other; the grace only delays the end of a job where some did not
_FAILURE_GRACE = 10.0


def interrupted(exc: BaseException | None = None) -> bool:
    """Whether this process was interrupted (SIGINT): ``exc`` is a ``KeyboardInterrupt`` or
    was raised while one propagated, or the shutdown handler saw SIGINT (and ran the
    callbacks: a ring the signal aborted then fails the next call, even in a process that
    inherited SIGINT ignored, as a shell's background job does)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return _interrupted


def exit_code_for(exc: BaseException) -> int:
    """The exit status a command reports for ``exc``: 130 interrupted (as a shell reports
    SIGINT), 2 an error lmdbio raises on purpose (bad input: config, files, data), 1 a
    bug (any other exception)."""
    if interrupted(exc):
        return 130
    return 2 if isinstance(exc, LmdbioError) else 1


def _failure_text(exc: BaseException) -> str:
    if isinstance(exc, LmdbioError):
        return str(exc)
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def _secondary(exc: BaseException) -> bool:
    """An error a rank raised only because another rank failed first (it aborted the
    node's batch ring): not what the report is about."""
    from lmdbio.shm.errors import RingAbortedError

    return isinstance(exc, RingAbortedError)


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def quiet_cleanup_warnings() -> None:
    """After a failure was reported: the warnings of the cleanup that follows (batch rings
    aborted at exit, their memory returned) would only bury the report."""
    logging.getLogger("lmdbio").setLevel(logging.ERROR)


class fail_together(contextlib.AbstractContextManager):  # noqa: N801 - reads as a statement
    """Around the main code of a command that runs as one rank of a job (``lmdbio run``):
    report a failure once and exit every rank alike, or end the job when ranks disagree.

    Entering it in a process an MPI launcher started as one of several ranks starts MPI
    and keeps a duplicate of ``COMM_WORLD`` used for nothing but this (collective: every
    rank enters it first, before anything that can fail on one rank only). In a process of
    its own it does nothing: MPI starts only if the command gets that far, and an error
    before that leaves no Open MPI files behind.

    On an exception (``KeyboardInterrupt`` included; ``SystemExit(0)`` passes through):

    * one process: the exception propagates (the command line prints it);
    * every rank failed (a missing or corrupt file, a bad configuration, a decode error
      whose node's peers then found the batch ring aborted): the ranks find out with a
      barrier on the duplicate, gather what each raised, and raise :class:`JobError` with
      one message on rank 0 (what the ranks raised, each distinct error once, naming the
      ranks unless all said the same) and ``quiet`` on the others; the exit code is 130
      when interrupted, 2 for lmdbio's errors, 1 for any other exception (a bug);
    * some ranks only (the others still at work or waiting for the failed ones): after
      ``grace`` seconds (``LMDBIO_FAILURE_GRACE``, default 10) without the barrier
      completing, a failed rank prints its error prefixed with its rank, runs the
      :func:`on_shutdown` callbacks and aborts the job (``Abort``) with that code. Ranks
      whose error is only the consequence of another's (the ring aborted) wait twice as
      long, so that the rank where the failure began is the one that reports it.
    """

    def __init__(self, grace: float | None = None) -> None:
        if grace is None:
            raw = os.environ.get(FAILURE_GRACE_ENV, "").strip()
            try:
                grace = float(raw) if raw else _FAILURE_GRACE
            except ValueError:
                raise ConfigError(f"{FAILURE_GRACE_ENV}={raw!r} is not a number") from None
        self.grace = max(float(grace), 0.0)
        self.comm: MPI.Comm | None = None

    def __enter__(self) -> fail_together:
        if _launched_ranks() > 1:
            from mpi4py import MPI  # a launched rank: no singleton settings to apply

            if MPI.COMM_WORLD.Get_size() > 1:
                self.comm = MPI.COMM_WORLD.Dup()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc is None or not _failed(exc):
            return False
        quiet_cleanup_warnings()
        if self.comm is None or not _mpi_running():
            return False  # one process: the command line reports it
        code, secondary = exit_code_for(exc), _secondary(exc)
        text = "interrupted" if code == 130 else _failure_text(exc)
        try:
            wait_with_timeout(self.comm.Ibarrier(), self.grace * (2 if secondary else 1),
                              "every rank to fail", max_sleep=0.05)
        except MPITimeoutError:
            self._abort(code, text)
        reports = self.comm.allgather((code, text, secondary))
        primary = [(r, c, t) for r, (c, t, s) in enumerate(reports) if not s] or \
            [(r, c, t) for r, (c, t, _) in enumerate(reports)]
        codes = {c for _, c, _ in primary}
        code = 130 if 130 in {c for c, _, _ in reports} else 1 if 1 in codes else 2
        if code == 130:
            message = "interrupted"
        else:
            by_text: dict[str, list[int]] = {}
            for r, _, t in primary:
                by_text.setdefault(t, []).append(r)
            if len(by_text) == 1 and len(primary) == len(reports):
                message = next(iter(by_text))
            else:
                message = "; ".join(f"{_ranks_text(r)}: {t}" for t, r in by_text.items())
        raise JobError(message, exit_code=code, quiet=self.comm.Get_rank() != 0) from None

    def _abort(self, code: int, text: str) -> NoReturn:
        _abort_job(_world(), code, f"error: {text}",
                   f"the other ranks did not fail with it within {self.grace:g} s: "
                   f"aborting the MPI job (exit code {code})")


# --------------------------------------------------------------------------- timeouts


def wait_with_timeout(
    request: MPI.Request | Sequence[MPI.Request],
    seconds: float,
    what: str = "MPI request",
    *,
    max_sleep: float = 0.01,
    sleep_slack: float | None = None,
) -> Any:
    """Wait for one request (or a sequence of requests) to complete, at most ``seconds``.

    Polls ``request.test()`` (``Request.Testall`` for a sequence) with a sleep that starts at
    50 microseconds and doubles up to ``max_sleep``, so a waiting rank yields its core to the
    ranks it waits for (``Wait`` in most MPI libraries spins at 100% CPU). Returns what
    ``test()`` returns for a completed request: the received object for a pickle-based
    ``irecv``, ``None`` for a buffer request; a list of those for a sequence.

    ``sleep_slack`` (seconds): how late the kernel may end each of those sleeps (the
    thread's timer slack, :func:`lmdbio.timerslack.timer_slack`, set only while this call
    sleeps and restored after); None keeps the thread's own, 50 us on Linux by default,
    which every sleep then adds to the time a waiter takes to notice its request.

    Raises :class:`MPITimeoutError` on timeout; the request is left pending and travels in
    the exception's ``request`` (the caller may ``Cancel`` it or keep waiting).
    """
    MPI = start_mpi()  # as a singleton safely, where nothing has started it yet

    deadline = time.monotonic() + float(seconds)

    def test() -> tuple[bool, Any]:
        if isinstance(request, Sequence):
            return MPI.Request.testall(list(request))
        return request.test()

    done, result = test()
    if done:  # no sleep: the timer slack is left alone
        return result
    sleep = 5e-5
    with timer_slack(sleep_slack):
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise MPITimeoutError(f"{what}: not complete after {seconds:g} s", request)
            time.sleep(min(sleep, deadline - now))
            sleep = min(sleep * 2, max_sleep)
            done, result = test()
            if done:
                return result


def barrier_with_timeout(comm: MPI.Comm, seconds: float, what: str = "barrier", *,
                         max_sleep: float = 0.01) -> None:
    """``Ibarrier`` + :func:`wait_with_timeout`: a barrier that raises instead of hanging,
    and whose waiting ranks sleep (``max_sleep``: the longest sleep between polls) instead
    of taking the cores of the ranks they wait for."""
    wait_with_timeout(comm.Ibarrier(), seconds, what, max_sleep=max_sleep)


def sleeping_barrier(comm: MPI.Comm, seconds: float, what: str = "barrier") -> None:
    """:func:`barrier_with_timeout` polling at most every millisecond: for ranks that wait
    while others work (a node's workers during its reader's setup, readers while reader 0
    reads the leaf directory, a benchmark's ranks around its timed part). MPI's own waits
    poll with ``sched_yield`` on an oversubscribed host and took the cores of the ranks
    being waited for: setup collectives cost milliseconds each instead of ~0.1 ms."""
    barrier_with_timeout(comm, seconds, what, max_sleep=1e-3)


# --------------------------------------------------------------------------- shutdown

ShutdownCallback = Callable[[str], object]

_lock = threading.RLock()
_callbacks: list[ShutdownCallback] = []
_installed = False
#: what signal.getsignal returned: a handler, SIG_DFL / SIG_IGN, or None (not set from Python)
_previous_handlers: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: SIGINT reached the handler (which ran the callbacks: the job cannot go on)
_interrupted = False


def on_shutdown(callback: ShutdownCallback) -> ShutdownCallback:
    """Register ``callback(reason)`` to run once at shutdown; returns it (usable as decorator).

    ``reason`` is ``"exit"`` (normal interpreter exit, before mpi4py finalizes MPI),
    ``"signal:SIGTERM"`` / ``"signal:SIGINT"``, or ``"abort"`` (from :class:`abort_on_error`).
    Callbacks run last-registered first, each at most once; an exception in one is logged and
    does not stop the others. Only with reason ``"exit"`` are all ranks known to be alive and
    in step, so a callback must not call MPI collectives (e.g. ``Win.Free``) for other
    reasons: it should do local cleanup only (unlink files, unmap memory) and return quickly.

    The first registration installs the atexit hook and, from the main thread, handlers for
    SIGTERM and SIGINT that run the callbacks and then defer to the handler that was there
    before (default SIGINT -> ``KeyboardInterrupt``, default SIGTERM -> terminate).
    """
    if not callable(callback):
        raise TypeError(f"on_shutdown needs a callable, got {type(callback).__name__}")
    with _lock:
        _callbacks.append(callback)
        _install()
    return callback


def remove_shutdown(callback: ShutdownCallback) -> bool:
    """Unregister a callback (e.g. after the resource was released normally)."""
    with _lock:
        for i in range(len(_callbacks) - 1, -1, -1):
            if _callbacks[i] is callback:
                del _callbacks[i]
                return True
    return False


def run_shutdown(reason: str = "exit") -> int:
    """Run and forget every registered callback (newest first); returns how many ran."""
    with _lock:
        pending = _callbacks[::-1]
        _callbacks.clear()
    for cb in pending:
        try:
            cb(reason)
        except Exception:
            log.exception("shutdown callback %r failed (reason %s)", cb, reason)
    return len(pending)


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(run_shutdown, "exit")
    if threading.current_thread() is not threading.main_thread():
        log.debug("on_shutdown registered outside the main thread: no signal handlers")
        return
    for signum in _SIGNALS:
        try:
            _previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, _handle_signal)
        except (ValueError, OSError):  # pragma: no cover - exotic embedding
            log.debug("cannot install a handler for %s", signum)


def _handle_signal(signum: int, frame: FrameType | None) -> None:
    global _interrupted
    name = signal.Signals(signum).name
    run_shutdown(f"signal:{name}")
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if signum == signal.SIGINT:  # the callbacks ended what they guard (e.g. the rings)
        _interrupted = True
    if callable(previous) and previous is not _handle_signal:
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
