"""Snapshot pinning: keep a py-lmdb read transaction open while lmdbio reads the file.

LMDB writers recycle a page only after every registered reader that could see it is gone,
but lmdbio parses ``data.mdb`` itself and so is invisible to writers. A pin registers a
reader for the snapshot being read. It runs in a small child process, for two reasons:
LMDB allows one environment per file per process (a pin inside this process would stop the
user from opening the same environment with py-lmdb), and the child's reader slot dies with
it (the child exits when this process closes its stdin, including when this process dies).

The child starts under the idle scheduling policy (``SCHED_IDLE``; ``nice -n 19`` where
there is none): its start costs a Python interpreter's worth of CPU, which it takes only
from cores nothing else wants.

The pin is taken only where the lock file already exists: lmdbio never creates files in a
data directory. The child reports the transaction id it pinned; it must equal the meta
txnid being parsed, otherwise a writer committed in between and the pin is reported as not
held.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import selectors
import shutil
import signal
import sys
import threading
import time
from functools import cache
from pathlib import Path
from typing import IO

_CHILD = r"""
import os, sys
os.closerange(3, 1 << 20)  # a descriptor the parent opened while spawning it
sys.path[:0] = [p for p in sys.argv[3:] if p]
try:
    import lmdb
    env = lmdb.open(sys.argv[1], subdir=sys.argv[2] == "1", readonly=True, lock=True,
                    max_dbs=0, max_readers=126)
    txn = env.begin()
    print(txn.id(), flush=True)
except Exception as exc:
    print("ERR", type(exc).__name__, exc, flush=True)
    sys.exit(1)
sys.stdin.read()
"""


@cache
def _child_command() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The pin child's command before and after its two arguments.

    The child holds a transaction and then only waits, so what it costs is its start: an
    interpreter and py-lmdb, ~40 ms of CPU with ``site``, ~12-18 ms without (``-S``, given
    the one directory it imports py-lmdb from) on the project's machine. Where the child
    cannot start under ``SCHED_IDLE`` (:func:`_spawn`) it starts under ``nice -n 19``."""
    head: tuple[str, ...] = ()
    if _IDLE_POLICY is None:
        nice = shutil.which("nice")
        head = (nice, "-n", "19") if nice else ()
    try:
        spec = importlib.util.find_spec("lmdb")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return (*head, sys.executable, "-c", _CHILD), ()
    package = Path(next(iter(spec.submodule_search_locations)))
    return (*head, sys.executable, "-S", "-c", _CHILD), (str(package.parent),)


#: the scheduling policy the pin child starts under (Linux): it runs only where no task of
#: a normal policy wants the core. Measured with ``perf sched`` in an 8-rank benchmark on
#: 2 cores (docs/reading.md, eighth session): under ``nice -n 19`` its start took ~31 ms
#: of CPU inside the timed run, under ``SCHED_IDLE`` ~14 ms (its whole start) in idle time.
_IDLE_POLICY: int | None = getattr(os, "SCHED_IDLE", None) \
    if hasattr(os, "sched_setscheduler") else None


def _inheritable_fds() -> list[int]:
    """This process's file descriptors above 2 that a spawned child would inherit (no
    close-on-exec flag): libraries such as MPI's may open some; the child gets none."""
    fds = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return fds
    for name in names:
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                fds.append(fd)
        except OSError:  # the descriptor of the listing itself, closed by now
            continue
    return fds


def _spawn(argv: list[str]) -> tuple[int, int, int]:
    """Start ``argv`` with its stdin and stdout on new pipes and stderr on ``/dev/null``,
    no other descriptor of this process, default ``SIGPIPE``, then move it to the idle
    scheduling policy where there is one. Returns ``(pid, its stdin's write end, its stdout's read
    end)``. ``posix_spawn`` starts it without copying this (large) process's page tables."""
    in_r, in_w = os.pipe()  # both ends close-on-exec: the child gets them as 0 and 1 only
    out_r, out_w = os.pipe()
    try:
        actions: list[tuple] = [(os.POSIX_SPAWN_DUP2, in_r, 0),
                                (os.POSIX_SPAWN_DUP2, out_w, 1),
                                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds()]
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=actions,
                             setsigdef=[signal.SIGPIPE])
        if _IDLE_POLICY is not None:
            # posix_spawn takes only the POSIX policies; the child has just started
            # (posix_spawn returns once it has executed the interpreter)
            # (refused: it keeps the default policy, which costs CPU, not correctness)
            with contextlib.suppress(OSError):
                os.sched_setscheduler(pid, _IDLE_POLICY, os.sched_param(0))
    except BaseException:
        os.close(in_w)
        os.close(out_r)
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
    return pid, in_w, out_r


def _reap(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for child ``pid`` to exit; whether it did."""
    deadline = time.monotonic() + timeout
    delay = 1e-4
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            return True
        if done:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


class SnapshotPin:
    """A read transaction held by a child process on the environment of ``data_file``."""

    def __init__(self, data_file: Path, txnid: int) -> None:
        self.txnid = txnid
        self._pid: int | None = None
        self._stdin: int | None = None  # closing it tells the child to exit
        self._stdout: IO[str] | None = None
        self._state: str | None = None
        self._spawner: threading.Thread | None = None
        subdir = data_file.name == "data.mdb"
        lock = data_file.parent / "lock.mdb" if subdir else Path(str(data_file) + "-lock")
        if not lock.exists():
            self._state = ("not pinned: no lock file, so no LMDB writer is registered; a writer "
                           "that starts later may recycle pages under this reader")
            return
        if not hasattr(os, "posix_spawn"):
            self._state = "not pinned: this platform has no posix_spawn to start the pin process"
            return
        target = str(data_file.parent if subdir else data_file)
        # started on a thread: posix_spawn returns only once the child has executed the
        # interpreter, which under load waited for a core for up to ~5 ms, holding up the
        # collective the pinning rank takes part in next (status and close join it)
        self._spawner = threading.Thread(
            target=self._start, args=(target, "1" if subdir else "0"),
            name="lmdbio-snapshot-pin", daemon=True)
        self._spawner.start()

    def _start(self, target: str, subdir: str) -> None:
        try:
            head, tail = _child_command()
            pid, stdin, stdout = _spawn([*head, target, subdir, *tail])
        except Exception as exc:  # on this thread: kept for status(), not raised
            self._state = f"not pinned: could not start the pin process ({exc})"
            return
        self._pid, self._stdin = pid, stdin
        self._stdout = os.fdopen(stdout, "r")

    def _started(self) -> None:
        """Wait for the thread that starts the child (once)."""
        spawner, self._spawner = self._spawner, None
        if spawner is not None:
            spawner.join()

    def status(self, timeout: float = 10.0) -> tuple[bool, str]:
        """Wait for the child's answer (once); return (pinned, explanation)."""
        self._started()
        if self._state is None and self._stdout is not None:
            line = ""
            try:
                sel = selectors.DefaultSelector()
                sel.register(self._stdout, selectors.EVENT_READ)
                if sel.select(timeout):
                    line = self._stdout.readline().strip()
                sel.close()
            except (OSError, ValueError):
                line = ""
            if line.isdigit() and int(line) == self.txnid:
                self._state = f"pinned by a read transaction (txn {line}) in pid {self._pid}"
            else:
                if line.isdigit():
                    why = (f"a writer committed txn {line} since the file was read "
                           f"(txn {self.txnid}); reopen to read the newer snapshot")
                else:
                    why = line.removeprefix("ERR ") or "the pin process did not answer"
                self._state = f"not pinned: {why}"
                self.close()
        pinned = self._pid is not None and self._state is not None \
            and self._state.startswith("pinned")
        return pinned, self._state or ""

    def close(self) -> None:
        """Release the transaction (the child exits when its stdin closes)."""
        self._started()
        pid, self._pid = self._pid, None
        if pid is None:
            return
        stdin, self._stdin = self._stdin, None
        stdout, self._stdout = self._stdout, None
        try:
            if stdin is not None:
                os.close(stdin)
            if not _reap(pid, 5.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _reap(pid, 5.0)
        finally:
            if stdout is not None:
                stdout.close()
