"""Where numba keeps lmdbio's compiled kernels: under ``NUMBA_CACHE_DIR``, in a
subdirectory named by a digest of every module that defines kernels.

Why: numba stamps each cached kernel with the content of its own source file only, but a
kernel that calls a kernel of another module holds a compiled copy of that callee. After
only the callee's module changes, numba still loads the caller from its cache, with the old
callee inside. This happened here: dm-spec's ``observe_iteration`` kept an old
``value_page_span`` from :mod:`lmdbio.lmdb.kernels` and gave wrong dm-spec estimates until
the cache was removed. Naming the directory by all kernel sources (:data:`KERNEL_MODULES`)
makes any change to any of them start a fresh cache, so no stale copy can load.

Kernel modules are found by their name, not listed: every module of ``lmdbio`` and
``loaders`` that compiles numba kernels is a ``kernels.py`` (one per package; a test checks
that every module importing numba is one). :data:`READ_KERNEL_MODULES`, the kernels a read
session calls, follows by package: every kernel module of ``lmdbio`` outside
``lmdbio.codecs`` (the record formats, decoded by the workers). Code that calls kernels
reaches a package's kernel module through :func:`kernel_module`, imported at first use, so
that importing lmdbio loads no numba.

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

import functools
import hashlib
import importlib
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

#: the file name of every module that compiles numba kernels
KERNEL_MODULE_NAME = "kernels.py"
#: the top-level packages searched for kernel modules
KERNEL_PACKAGES = ("lmdbio", "loaders")
#: the package whose kernel modules a read session does not call (the record formats)
RECORD_CODECS_PACKAGE = "lmdbio/codecs/"

#: where this package's sources are: the repository or install root holding ``lmdbio``
SOURCE_ROOT = Path(__file__).resolve().parent.parent


def find_kernel_modules(root: Path) -> tuple[str, ...]:
    """Every kernel module under ``root``: the files named :data:`KERNEL_MODULE_NAME` in
    :data:`KERNEL_PACKAGES`, as paths relative to ``root``, sorted. Reads directory
    listings only (nothing is imported)."""
    return tuple(sorted(path.relative_to(root).as_posix() for top in KERNEL_PACKAGES
                        for path in (root / top).rglob(KERNEL_MODULE_NAME)))


def read_kernel_modules(modules: Iterable[str]) -> tuple[str, ...]:
    """The dotted names of the kernel modules (paths as :func:`find_kernel_modules` gives
    them) that a read session calls: those of ``lmdbio`` outside
    :data:`RECORD_CODECS_PACKAGE`."""
    return tuple(rel.removesuffix(".py").replace("/", ".") for rel in sorted(modules)
                 if rel.startswith("lmdbio/") and not rel.startswith(RECORD_CODECS_PACKAGE))


#: every module that compiles numba kernels, relative to the repository root
KERNEL_MODULES: tuple[str, ...] = find_kernel_modules(SOURCE_ROOT)
#: the modules whose kernels a read session calls (page walks, gathers, page touching,
#: slot checksums, the dm-spec estimate, the shared building blocks), as dotted names
READ_KERNEL_MODULES: tuple[str, ...] = read_kernel_modules(KERNEL_MODULES)


@functools.cache
def kernel_module(package: str) -> ModuleType:
    """The kernel module of ``package`` (``package.kernels``, e.g. ``kernel_module(
    "lmdbio.lmdb")`` is :mod:`lmdbio.lmdb.kernels`), imported at the first call and then
    returned from a cache.

    Why: importing a kernel module imports numba and llvmlite, which ``import lmdbio``,
    ``import loaders`` and ``lmdbio --help`` must not pay for (a test checks). Modules
    that call kernels fetch them through this function at the point of use instead of
    importing the kernel module at the top; one accessor serves them all."""
    return importlib.import_module(f"{package}.{KERNEL_MODULE_NAME.removesuffix('.py')}")


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
    root = SOURCE_ROOT if root is None else root
    target = keyed_cache_dir(base, sources_digest(root, modules))
    config = sys.modules.get("numba.core.config")
    if config is None:  # numba reads it when imported
        os.environ["NUMBA_CACHE_DIR"] = target
    else:  # numba read the variable already; a changed environment would reset config
        config.CACHE_DIR = target
    return target


def load_cached_kernels(modules: tuple[str, ...] = READ_KERNEL_MODULES) -> int:
    """Load every specialisation that numba's on-disk cache holds for the ``njit``
    functions of ``modules``, now rather than at each function's first call; returns how
    many were loaded.

    A process's first cached kernel costs ~0.4 s of CPU (numba initialises its target) and
    every further one ~20-40 ms; 8 ranks on 2 cores spend ~3 s on it. ``lmdbio bench read``
    calls this before its clock starts, as it imports modules before it, so that the
    throughput of a short run is that of reading and not of loading code (the time is
    reported on its own). Best effort: it reads numba's cache index (an internal of numba,
    checked up to 0.61-0.68); if that fails, or the cache is empty or stale, functions load
    or compile at their first call as usual."""
    import importlib

    from numba.core.dispatcher import Dispatcher

    loaded = 0
    for name in modules:
        for fn in vars(importlib.import_module(name)).values():
            if not isinstance(fn, Dispatcher):
                continue
            try:
                index = fn._cache._cache_file._load_index()
                machine = fn.targetctx.codegen().magic_tuple()
            except Exception:  # no cache (inline helpers) or another numba
                continue
            for key in index:
                if key[1] != machine:  # compiled for another CPU: would compile, not load
                    continue
                try:
                    fn.compile(key[0])
                    loaded += 1
                except Exception:  # a stale entry: the first call compiles
                    continue
    return loaded
