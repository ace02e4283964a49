"""Where a shared-memory mapping lives on disk, so that no file is ever left behind.

An MPI library backs an MPI-3 shared window with a file in a tmpfs (Open MPI 5's ``osc/sm``:
``$osc_sm_backing_directory``, default ``/dev/shm``, a file named ``osc_sm.<host>.<job>...``)
that every rank of the node maps. Open MPI unlinks that file as soon as every rank has mapped
it, so nothing can be left behind even by ``SIGKILL``; :class:`~lmdbio.shm.BatchRing` checks
this at creation with :func:`backing_file` and, for a library that keeps the name, unlinks it
itself on every way out (close, exception, SIGINT/SIGTERM, interpreter exit).
"""

from __future__ import annotations

import logging
import os

__all__ = ["backing_file", "mapping_path", "unlink_quietly"]

log = logging.getLogger("lmdbio.shm")

_DELETED = " (deleted)"


def mapping_path(address: int, maps: str = "/proc/self/maps") -> str | None:
    """The path column of ``/proc/self/maps`` for the mapping that contains ``address``.

    A file that was unlinked while mapped ends with ``" (deleted)"``; anonymous memory gives
    ``""``; ``None`` means no mapping contains ``address`` or ``/proc`` is unavailable.
    """
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split(None, 5)
                lo_s, _, hi_s = fields[0].partition("-") if fields else ("", "", "")
                try:
                    lo, hi = int(lo_s, 16), int(hi_s, 16)
                except ValueError:
                    continue
                if lo <= address < hi:
                    return fields[5].rstrip("\n") if len(fields) == 6 else ""
    except OSError:
        return None
    return None


def backing_file(address: int, maps: str = "/proc/self/maps") -> str | None:
    """The file that backs the mapping containing ``address``, if it still has a name.

    Returns ``None`` for anonymous memory, for a file already unlinked (``/proc`` marks it
    ``(deleted)``), for pseudo-mappings (``[heap]`` ...) and where ``/proc`` is unavailable
    (not Linux). Reads ``/proc/self/maps`` (a few hundred lines; done once per window).
    """
    path = mapping_path(address, maps)
    if not path or not path.startswith("/") or path.endswith(_DELETED):
        return None
    return path


def unlink_quietly(path: str | None) -> bool:
    """Unlink ``path`` if it exists; ``True`` if this call removed it. Never raises."""
    if not path:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:  # pragma: no cover - permissions, read-only fs
        log.warning("could not unlink shared-memory file %s: %s", path, exc)
        return False
    log.info("unlinked shared-memory backing file %s", path)
    return True
