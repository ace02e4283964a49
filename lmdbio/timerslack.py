"""The calling thread's timer slack: how late the kernel may wake a sleeping thread.

Linux lets every sleep of a (non-real-time) thread end up to its *timer slack* after the
time asked for, so that wake-ups can be batched; the default is 50 microseconds. A rank
that waits for a message by sleeping between tests (:func:`lmdbio.mpiutil.
wait_with_timeout`) notices the message that much later on every sleep: on the DM
reader's cursor hand-off, measured by ``bench/pingpong.py``, each
sleep of 50 us to 0.5 ms lasted 66-82 us longer than asked. ``prctl(PR_SET_TIMERSLACK)``
sets the slack of the calling thread only; :func:`timer_slack` sets it for a block and
puts the thread's own value back after, so nothing else the thread does changes.

Where the call does not exist (not Linux, no libc through ctypes) or fails, nothing is
changed and the sleeps keep the system's slack: a waiting rank is then only slower to
notice its message, never wrong.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["current_timer_slack_ns", "set_timer_slack_ns", "timer_slack"]

#: ``prctl`` options of <linux/prctl.h>
PR_SET_TIMERSLACK = 29
PR_GET_TIMERSLACK = 30


def _load_prctl() -> Any:
    """libc's ``prctl`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                   ctypes.c_ulong]
    return fn


PRCTL = _load_prctl()


def current_timer_slack_ns() -> int | None:
    """The calling thread's timer slack in nanoseconds, or None where it cannot be read."""
    if PRCTL is None:
        return None
    got = int(PRCTL(PR_GET_TIMERSLACK, 0, 0, 0, 0))
    return got if got >= 0 else None


def set_timer_slack_ns(ns: int) -> bool:
    """Set the calling thread's timer slack to ``ns`` nanoseconds (>= 1: Linux reads 0 as
    "back to the thread's default"); whether it was set."""
    if ns < 1:
        raise ValueError(f"timer slack must be >= 1 ns, got {ns}")
    if PRCTL is None:
        return False
    return int(PRCTL(PR_SET_TIMERSLACK, int(ns), 0, 0, 0)) == 0


@contextlib.contextmanager
def timer_slack(seconds: float | None) -> Iterator[bool]:
    """Within the block, the calling thread's sleeps end at most ``seconds`` late (its
    timer slack); the thread's own slack is restored on leaving. ``None`` changes nothing.
    Yields whether the slack was changed (False where unsupported)."""
    before = current_timer_slack_ns() if seconds is not None else None
    changed = before is not None and seconds is not None and \
        set_timer_slack_ns(max(1, round(seconds * 1e9)))
    try:
        yield changed
    finally:
        if changed and before is not None:
            set_timer_slack_ns(max(1, before))
