"""numba's kernel cache keyed by every kernel source (:mod:`lmdbio.kernel_cache`): a kernel
that calls a kernel of another module is compiled again when only the callee changes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmdbio.kernel_cache import (
    KERNEL_MODULES,
    READ_KERNEL_MODULES,
    find_kernel_modules,
    kernel_module,
    keyed_cache_dir,
    read_kernel_modules,
    sources_digest,
)

REPO = Path(__file__).resolve().parent.parent


def test_every_module_that_imports_numba_is_a_kernel_module():
    """A module that compiles kernels and is not listed would not key the cache: its
    callers elsewhere could load a stale copy of it."""
    found = {str(p.relative_to(REPO)) for top in ("lmdbio", "loaders")
             for p in (REPO / top).rglob("*.py")
             if re.search(r"^(from numba|import numba)", p.read_text(), re.M)}
    assert found == set(KERNEL_MODULES)


def test_kernel_modules_are_found_by_their_name(tmp_path):
    """Every kernel module is a ``kernels.py``; a new one is found without being listed
    anywhere."""
    assert all(Path(rel).name == "kernels.py" for rel in KERNEL_MODULES)
    for rel in ("lmdbio/new/kernels.py", "loaders/kernels.py", "lmdbio/new/other.py",
                "elsewhere/kernels.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert set(find_kernel_modules(tmp_path)) == {
        "lmdbio/new/kernels.py", "loaders/kernels.py"}


def test_a_read_session_loads_the_kernels_of_lmdbio_outside_the_record_codecs():
    assert set(READ_KERNEL_MODULES) == {
        "lmdbio.kernels", "lmdbio.io.kernels", "lmdbio.lmdb.kernels",
        "lmdbio.plan.strategies.kernels", "lmdbio.shm.kernels"}
    assert read_kernel_modules(["lmdbio/codecs/tensor/kernels.py", "loaders/kernels.py",
                                "lmdbio/x/kernels.py"]) == ("lmdbio.x.kernels",)


def test_keys_replace_an_earlier_key_and_follow_every_source(tmp_path):
    key = "0123456789abcdef"
    assert keyed_cache_dir("/c", key) == "/c/lmdbio-kernels-0123456789abcdef"
    assert keyed_cache_dir("/c/lmdbio-kernels-fedcba9876543210/", key) == \
        "/c/lmdbio-kernels-0123456789abcdef"
    assert keyed_cache_dir("/c/lmdbio-kernels-x", key) == \
        "/c/lmdbio-kernels-x/lmdbio-kernels-0123456789abcdef"
    (tmp_path / "a.py").write_text("x = 1\n")
    first = sources_digest(tmp_path, ["a.py", "b.py"])
    assert sources_digest(tmp_path, ["b.py", "a.py"]) == first
    (tmp_path / "b.py").write_text("")  # appears, empty
    assert sources_digest(tmp_path, ["a.py", "b.py"]) != first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert len({first, sources_digest(tmp_path, ["a.py", "b.py"])}) == 2


CALLER = """
from numba import njit
from kpkg.callee import value

@njit(cache=True)
def caller():
    return value() + 10
"""

RUN = """
import sys
if sys.argv[1] == "keyed":
    from pathlib import Path
    from lmdbio.kernel_cache import key_numba_cache
    key_numba_cache(Path(sys.argv[2]), ["kpkg/caller.py", "kpkg/callee.py"])
from kpkg.caller import caller
print(caller())
"""


def _run(tmp_path: Path, mode: str, cache: Path) -> int:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", RUN, mode, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.slow
def test_a_caller_is_compiled_again_when_only_its_callee_changed(tmp_path):
    """numba alone loads the caller with the old callee inside (the plain cache below);
    keyed, the caller sees the new callee."""
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "caller.py").write_text(CALLER)
    (pkg / "callee.py").write_text("from numba import njit\n\n@njit(cache=True)\n"
                                   "def value():\n    return 1\n")
    results = {mode: _run(tmp_path, mode, tmp_path / f"cache-{mode}")
               for mode in ("plain", "keyed")}
    assert results == {"plain": 11, "keyed": 11}
    (pkg / "callee.py").write_text("from numba import njit\n\n@njit(cache=True)\n"
                                   "def value():\n    return 2\n")
    results = {mode: _run(tmp_path, mode, tmp_path / f"cache-{mode}")
               for mode in ("plain", "keyed")}
    assert results == {"plain": 11, "keyed": 12}  # plain: numba's stale caller


KEEP_SETTINGS = """
import numba
from numba import njit
numba.config.BOUNDSCHECK = 1
import lmdbio  # keys the cache after numba read its settings

@njit(cache=True)
def f(a):
    return a[0]

f(__import__("numpy").zeros(1))  # compiling reloads numba's config from the environment
print(numba.config.BOUNDSCHECK, numba.config.CACHE_DIR)
"""


def test_keying_after_numba_was_imported_keeps_its_settings(tmp_path):
    """Imported after numba, lmdbio moves the cache without changing the environment (a
    changed ``NUMBA_*`` environment makes numba re-read every setting at its next compile,
    which reset ``BOUNDSCHECK`` set in code)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    script = tmp_path / "job.py"  # numba caches functions of source files only
    script.write_text(KEEP_SETTINGS)
    out = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=True)
    check, cache = out.stdout.split()
    assert check == "1"
    assert re.fullmatch(re.escape(str(tmp_path)) + r"/lmdbio-kernels-[0-9a-f]{16}", cache)


def test_kernel_module_is_the_packages_kernels_module():
    """``kernel_module(package)`` is ``package.kernels``, the same object every call."""
    from lmdbio.lmdb import kernels

    assert kernel_module("lmdbio.lmdb") is kernels
    assert kernel_module("lmdbio.lmdb") is kernel_module("lmdbio.lmdb")


LIGHT_IMPORTS = """
import sys
import lmdbio, lmdbio.reader, lmdbio.lmdb, lmdbio.codecs.btable.rows, loaders, loaders.decode
print(sorted(m for m in sys.modules if m.split(".")[0] == "numba" or m.endswith(".kernels")))
"""


def test_importing_the_package_loads_no_kernel_module():
    """The modules that call kernels reach them through :func:`kernel_module` at first
    use: importing them loads neither numba nor a kernel module."""
    out = subprocess.run([sys.executable, "-c", LIGHT_IMPORTS], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
