"""Snapshot pinning: keep a py-lmdb read transaction open while lmdbio reads the file.

LMDB writers recycle a page only after every registered reader that could see it is gone,
but lmdbio parses ``data.mdb`` itself and so is invisible to writers. A pin registers a
reader for the snapshot being read. It runs in a small child process, for two reasons:
LMDB allows one environment per file per process (a pin inside this process would stop the
user from opening the same environment with py-lmdb), and the child's reader slot dies with
it (the child exits when this process closes its stdin, including when this process dies).

The pin is taken only where the lock file already exists: lmdbio never creates files in a
data directory. The child reports the transaction id it pinned; it must equal the meta
txnid being parsed, otherwise a writer committed in between and the pin is reported as not
held.
"""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

_CHILD = r"""
import sys
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
    interpreter and py-lmdb, ~40 ms of CPU with ``site``, ~13 ms without (``-S``, given the
    one directory it imports py-lmdb from) on the project's machine. It starts at the
    lowest CPU priority (``nice -n 19``, where ``nice`` exists): on a busy host it then
    takes no CPU from the ranks setting up. The pin is taken a little later; either way it
    is checked against the snapshot being read (:meth:`SnapshotPin.status`)."""
    import importlib.util
    import shutil

    nice = shutil.which("nice")
    head: tuple[str, ...] = (nice, "-n", "19") if nice else ()
    try:
        spec = importlib.util.find_spec("lmdb")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return (*head, sys.executable, "-c", _CHILD), ()
    package = Path(next(iter(spec.submodule_search_locations)))
    return (*head, sys.executable, "-S", "-c", _CHILD), (str(package.parent),)


class SnapshotPin:
    """A read transaction held by a child process on the environment of ``data_file``."""

    def __init__(self, data_file: Path, txnid: int) -> None:
        self.txnid = txnid
        self._proc: subprocess.Popen | None = None
        self._state: str | None = None
        subdir = data_file.name == "data.mdb"
        lock = data_file.parent / "lock.mdb" if subdir else Path(str(data_file) + "-lock")
        if not lock.exists():
            self._state = ("not pinned: no lock file, so no LMDB writer is registered; a writer "
                           "that starts later may recycle pages under this reader")
            return
        target = str(data_file.parent if subdir else data_file)
        try:
            head, tail = _child_command()
            self._proc = subprocess.Popen(
                [*head, target, "1" if subdir else "0", *tail],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, close_fds=True)
        except OSError as exc:
            self._state = f"not pinned: could not start the pin process ({exc})"

    def status(self, timeout: float = 10.0) -> tuple[bool, str]:
        """Wait for the child's answer (once); return (pinned, explanation)."""
        if self._state is None and self._proc is not None:
            line = ""
            try:
                assert self._proc.stdout is not None
                import selectors

                sel = selectors.DefaultSelector()
                sel.register(self._proc.stdout, selectors.EVENT_READ)
                if sel.select(timeout):
                    line = self._proc.stdout.readline().strip()
                sel.close()
            except (OSError, ValueError):
                line = ""
            if line.isdigit() and int(line) == self.txnid:
                self._state = f"pinned by a read transaction (txn {line}) in pid {self._proc.pid}"
            else:
                if line.isdigit():
                    why = (f"a writer committed txn {line} since the file was read "
                           f"(txn {self.txnid}); reopen to read the newer snapshot")
                else:
                    why = line.removeprefix("ERR ") or "the pin process did not answer"
                self._state = f"not pinned: {why}"
                self.close()
        pinned = self._proc is not None and self._state is not None \
            and self._state.startswith("pinned")
        return pinned, self._state or ""

    def close(self) -> None:
        """Release the transaction (the child exits when its stdin closes)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout:
                proc.stdout.close()
