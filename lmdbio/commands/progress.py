"""Progress bars of the command line (tqdm): totals, rate and time left on stderr.

A bar is drawn only where someone watches: when stderr is a terminal, or, on a rank of an
MPI job whose output the launcher forwards, when the launcher's own stderr is one (Open MPI
runs the ranks of a host as children of ``prterun``; ``lmdbio launch`` also says so through
``LMDBIO_PROGRESS``). ``--quiet`` turns bars off, ``--progress`` forces them on (a log file
then gets the bar's successive states), and ``LMDBIO_PROGRESS=0|1`` does either from the
environment. Logs and pipes stay free of carriage-return noise by default.

Commands decide with :func:`wanted` and draw with :func:`bar`; code that does the work
(a benchmark's repeats, a converter's passes) wraps its loops in :func:`steps`, which
draws a bar only inside :func:`enabled` (set by the command), so library callers never
see one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

#: the environment variable that forces bars on (1) or off (0) for a process and its children
ENV = "LMDBIO_PROGRESS"
_ON = ("1", "yes", "on", "true", "always")
_OFF = ("0", "no", "off", "false", "never")
#: whether :func:`steps` draws (set by a command through :func:`enabled`)
_ACTIVE: ContextVar[bool] = ContextVar("lmdbio_progress", default=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``-q/--quiet`` and ``--progress`` (mutually exclusive)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true",
                       help="no progress bar")
    group.add_argument("--progress", action="store_true",
                       help="draw the progress bar even when stderr is not a terminal "
                            "(default: only on a terminal)")


def _mpi_rank_env() -> bool:
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"))


def _launcher_on_terminal() -> bool:
    """Whether this MPI rank's launcher (the parent process, e.g. Open MPI's ``prterun``)
    writes to a terminal: the rank's own stderr is then a pipe the launcher forwards."""
    try:
        target = os.readlink(f"/proc/{os.getppid()}/fd/2")
    except OSError:
        return False
    return target.startswith(("/dev/pts/", "/dev/tty"))


def wanted(args: argparse.Namespace | None = None, stream: TextIO | None = None) -> bool:
    """Whether this process should draw progress bars: ``--quiet`` no, ``--progress`` yes,
    else ``LMDBIO_PROGRESS`` when set, else whether someone watches ``stream`` (stderr)."""
    if args is not None and getattr(args, "quiet", False):
        return False
    if args is not None and getattr(args, "progress", False):
        return True
    env = os.environ.get(ENV, "").strip().lower()
    if env in _ON:
        return True
    if env in _OFF:
        return False
    stream = sys.stderr if stream is None else stream
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):
        return False
    return _mpi_rank_env() and _launcher_on_terminal()


class NoBar:
    """What :func:`bar` returns where nothing is drawn: tqdm's methods, doing nothing (no
    tqdm object, so no monitor thread either)."""

    total: float | None = None
    n = 0

    def __init__(self, iterable: Iterable[Any] | None = None) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        return iter(self._iterable or ())

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: float = 1) -> None:
        pass

    def set_description_str(self, desc: str = "", refresh: bool = True) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: float | None = None, desc: str = "", unit: str = "it", *, show: bool = True,
        **kwargs: Any) -> Any:
    """A tqdm bar on stderr (a :class:`NoBar` when ``show`` is false).

    ``unit_scale`` makes large counts read 12.3k; ``total`` None shows the count and rate
    without a time left."""
    if not show:
        return NoBar(kwargs.get("iterable"))
    from tqdm import tqdm

    opts: dict[str, Any] = {"total": total, "desc": desc, "unit": unit, "file": sys.stderr,
                            "mininterval": 0.25, "smoothing": 0.1, "leave": True}
    columns, rows = _size()
    if columns >= 20 and rows >= 2:
        opts["dynamic_ncols"] = True  # follows the terminal's width
    else:
        # a pipe the launcher forwards, a terminal of unknown size (0 x 0: tqdm would hide
        # the bar as below the screen's last line): a usual size
        opts["ncols"], opts["nrows"] = 80, 24
    opts.update(kwargs)
    return tqdm(**opts)


def _size() -> tuple[int, int]:
    """The columns and rows of the terminal on stderr (0 where unknown)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return 0, 0
    return size.columns, size.lines


@contextlib.contextmanager
def enabled(show: bool) -> Iterator[None]:
    """Inside the block, :func:`steps` draws bars when ``show``."""
    token = _ACTIVE.set(bool(show))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    """Whether a command asked for bars (:func:`enabled`)."""
    return _ACTIVE.get()


def steps(iterable: Iterable[T], desc: str = "", total: float | None = None,
          unit: str = "it", **kwargs: Any) -> Iterable[T]:
    """``iterable`` itself, or wrapped in a bar inside :func:`enabled` ``(True)``."""
    if not _ACTIVE.get():
        return iterable
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return bar(total, desc, unit, iterable=iterable, **kwargs)
