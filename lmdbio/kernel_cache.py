"""Where numba keeps lmdbio's compiled kernels: under ``NUMBA_CACHE_DIR``, in a
subdirectory named by a digest of every module that defines kernels.

Why: numba stamps each cached kernel with the content of its own source file only, but a
kernel that calls a kernel of another module holds a compiled copy of that callee. After
only the callee's module changes, numba still loads the caller from its cache, with the old
callee inside. This happened here: ``_spec_kernels.observe_iteration`` kept an old
``value_page_span`` from :mod:`lmdbio.lmdb.kernels` and gave wrong dm-spec estimates until
the cache was removed. Naming the directory by all kernel sources (:data:`KERNEL_MODULES`)
makes any change to any of them start a fresh cache, so no stale copy can load.

:func:`key_numba_cache` runs when :mod:`lmdbio` is imported, before any kernel module is
imported (they are all inside ``lmdbio`` or ``loaders``, which imports ``lmdbio`` first).
It changes ``NUMBA_CACHE_DIR`` in the environment, which numba reads when it is
imported and subprocesses inherit. If numba is already imported, it changes
``numba.config.CACHE_DIR`` instead and leaves the environment as it is: numba re-reads
every ``NUMBA_*`` setting from the environment when that changes, which would undo
settings made in code. Subprocesses then key the inherited directory themselves when they
import lmdbio. A directory that already carries a key is re-keyed, not nested, which covers
a subprocess of another checkout.

The setting is process-wide: the cache of any other numba library in the process moves
into the keyed directory too. Without ``NUMBA_CACHE_DIR``, numba keeps its default (next to
the sources, stamped per file), and nothing here changes it. The Makefile, the tests, the
benchmarks and ``launch/slurm-example.sbatch`` set ``NUMBA_CACHE_DIR``; ``lmdbio launch``
passes on whatever the environment holds.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

#: every module that compiles numba kernels, relative to the repository root (a test
#: checks that no module importing numba is missing)
KERNEL_MODULES: tuple[str, ...] = (
    "lmdbio/codecs/_record_kernels.py",
    "lmdbio/codecs/btable_kernels.py",
    "lmdbio/codecs/ibp/kernels.py",
    "lmdbio/codecs/pcr_kernels.py",
    "lmdbio/codecs/toc/_kernels.py",
    "lmdbio/compiled.py",
    "lmdbio/io/_residency.py",
    "lmdbio/io/_touch.py",
    "lmdbio/lmdb/kernels.py",
    "lmdbio/plan/strategies/_spec_kernels.py",
    "lmdbio/shm/_hash.py",
    "loaders/_decode_kernels.py",
    "loaders/_transform_kernels.py",
)

#: the last path component of a keyed cache directory
_KEYED = re.compile(r"lmdbio-kernels-[0-9a-f]{16}")


def sources_digest(root: Path, modules: Iterable[str]) -> str:
    """16 hex digits over the paths and contents of ``modules`` under ``root``. A module
    that cannot be read counts as absent, which differs from any content, empty included."""
    h = hashlib.blake2b(digest_size=8)
    for rel in sorted(modules):
        try:
            data = (root / rel).read_bytes()
        except OSError:
            h.update(rel.encode() + b"\0absent\0")
            continue
        h.update(rel.encode() + b"\0%d\0" % len(data) + data)
    return h.hexdigest()


def keyed_cache_dir(base: str, digest: str) -> str:
    """``base``/lmdbio-kernels-``digest``, where ``base`` loses a key it already ends
    with."""
    path = base.rstrip(os.sep) or os.sep
    if _KEYED.fullmatch(os.path.basename(path)):
        path = os.path.dirname(path)
    return os.path.join(path, f"lmdbio-kernels-{digest}")


def key_numba_cache(root: Path | None = None,
                    modules: Iterable[str] = KERNEL_MODULES) -> str | None:
    """Point numba's cache at the keyed subdirectory of ``NUMBA_CACHE_DIR`` (see the
    module docstring); returns that directory, or None when ``NUMBA_CACHE_DIR`` is not
    set. ``root``: the repository or install root holding ``modules`` (default: this
    package's parent)."""
    base = os.environ.get("NUMBA_CACHE_DIR")
    if not base:
        return None
    root = Path(__file__).resolve().parent.parent if root is None else root
    target = keyed_cache_dir(base, sources_digest(root, modules))
    config = sys.modules.get("numba.core.config")
    if config is None:  # numba reads it when imported
        os.environ["NUMBA_CACHE_DIR"] = target
    else:  # numba read the variable already; a changed environment would reset config
        config.CACHE_DIR = target
    return target
