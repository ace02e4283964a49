"""Compile the kernels the quick test loop calls before it starts, once each, on every core.

Why: from a fresh clone numba compiles ~130 CPU-seconds of kernels during ``make unit``
(measured 2026-11-28 on the 2-core VM: 109 signatures; the TOC, transform, LMDB and IBP
kernels 25-35 s each). Each pytest-xdist worker compiles a
kernel at its first call, so the kernels two workers' test files share are compiled twice
(25 s), and a test that is first to call a kernel waits for it. Compiled here first, every kernel
reaches numba's on-disk cache once, on all cores, and the workers only load them.

What: :data:`MANIFEST` lists each kernel specialisation (module, function, numba
signature as text) the unit tests compiled, with the CPU seconds its compile took (the
order in which modules are handed out). ``python -m tests.precompile_kernels`` compiles
every listed signature into the cache ``NUMBA_CACHE_DIR`` names (keyed by
:mod:`lmdbio.kernel_cache`) and leaves a stamp there, so a later run with the same
manifest and kernels returns at once. ``make kernel-signatures`` writes the manifest
again: it runs the unit tests on an empty cache with :data:`RECORD_ENV` set (each test
process records its compiles) and then ``--record`` merges what they recorded.

Safety: numba's cache index is read, changed and written without a lock, so two
processes must not save entries of one function at once (one could lose the other's
entry, or both write one data file). Each module's signatures are compiled by one
process; the kernels other kernel modules call (the shared building blocks) are compiled
first, before the processes fan out (only a module that neither defines nor calls one
compiles meanwhile), so a caller compiled later loads them from the cache instead of
saving them again. A signature that no longer fits its kernel (the
manifest is older than the code) is skipped and the tests compile it at first call, as
without this step; nothing here changes what a test computes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import lmdbio  # noqa: F401  (keys NUMBA_CACHE_DIR before any kernel module loads numba)
from lmdbio.kernel_cache import KERNEL_MODULES

#: the kernel signatures the unit tests compile (``make kernel-signatures`` writes it)
MANIFEST = Path(__file__).with_name("kernel_signatures.json")
#: the stamp's name prefix in the keyed cache directory (the manifest's digest follows)
STAMP_PREFIX = "precompiled-"


@dataclass(frozen=True)
class Signature:
    """One specialisation of one kernel: ``module.function`` compiled for ``types``
    (numba's text form of the argument types), whose compile took ``seconds`` of CPU
    when recorded (which module is handed out first)."""

    module: str
    function: str
    types: str
    seconds: float


def kernel_module_names() -> list[str]:
    """The dotted names of every kernel module (:data:`KERNEL_MODULES`)."""
    return [rel.removesuffix(".py").replace("/", ".") for rel in KERNEL_MODULES]


def read_manifest(path: Path = MANIFEST) -> list[Signature]:
    """The signatures of the manifest at ``path``."""
    return [Signature(**entry) for entry in json.loads(path.read_text())["signatures"]]


def manifest_digest(path: Path = MANIFEST) -> str:
    """16 hex digits over the manifest's bytes (the stamp's name)."""
    return hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()


def by_module_heaviest_first(signatures: Iterable[Signature]) -> list[list[Signature]]:
    """``signatures`` grouped by module, the groups in falling order of their recorded
    compile time: handed out in this order to processes that each take the next group
    when done with their last, the heavy modules start first and the light ones fill the
    gaps at the end."""
    groups: dict[str, list[Signature]] = {}
    for sig in signatures:
        groups.setdefault(sig.module, []).append(sig)
    return sorted(groups.values(), key=lambda group: (-sum(s.seconds for s in group),
                                                      group[0].module))


def kernel_imports(modules: Iterable[str]) -> dict[str, set[tuple[str, str]]]:
    """For each of ``modules``, the ``(module, function)`` of every kernel it imports from
    another kernel module: the shared callees, which processes compiling different modules
    would otherwise both save."""
    from numba.core.dispatcher import Dispatcher

    imports: dict[str, set[tuple[str, str]]] = {}
    for name in modules:
        imports[name] = {(value.py_func.__module__, value.py_func.__name__)
                         for value in vars(importlib.import_module(name)).values()
                         if isinstance(value, Dispatcher) and value.py_func.__module__ != name}
    return imports


def independent_of_shared(groups: Sequence[list[Signature]],
                          imports: dict[str, set[tuple[str, str]]]) -> list[Signature] | None:
    """The first of ``groups`` (one module's signatures each) whose module neither defines
    nor imports a shared kernel (see :func:`kernel_imports`): it can compile while another
    process compiles the shared kernels, since the two save entries of no common function.
    None when every module touches one."""
    touching = {name for name, callees in imports.items() if callees}
    touching |= {module for callees in imports.values() for module, _ in callees}
    return next((group for group in groups if group[0].module not in touching), None)


def parse_types(text: str) -> tuple[Any, ...]:
    """The argument types that numba writes as ``text`` (the ``repr`` of a signature
    tuple, e.g. ``(Array(uint8, 1, 'C', True, aligned=True), int64, Literal[int](0))``),
    evaluated among numba's type names only (plus the two forms its ``repr`` writes that
    are not type names: ``Literal[kind](value)`` and ``omitted(default=value)``)."""
    from numba.core import types

    class Literal:  # numba writes literal types as Literal[int](0)
        def __class_getitem__(cls, _kind: type) -> Callable[[Any], Any]:
            return types.literal

    def omitted(default: Any) -> Any:  # an argument left at its default value
        return types.Omitted(default)

    names = {**vars(types), "Literal": Literal, "omitted": omitted, "bool": types.boolean,
             "int": int, "float": float,
             "__builtins__": {}}
    parsed = eval(text, names)  # numba's type names only (builtins removed)
    return tuple(parsed)


@dataclass
class Compiled:
    """What compiling a list of signatures did: how many are now in the cache, why the
    others were skipped, and the wall-clock seconds it took."""

    done: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, other: Compiled) -> None:
        """Count ``other``'s signatures in (its time is not added: it ran alongside)."""
        self.done += other.done
        self.skipped += other.skipped


def compile_signatures(signatures: Sequence[Signature]) -> Compiled:
    """Compile (or load from the cache) each of ``signatures``."""
    start = time.perf_counter()
    result = Compiled()
    for sig in signatures:
        try:
            kernel = getattr(importlib.import_module(sig.module), sig.function)
            kernel.compile(parse_types(sig.types))
            result.done += 1
        except Exception as exc:  # a stale entry: the tests compile it at first call
            result.skipped.append(f"{sig.module}.{sig.function}{sig.types[:60]}...: "
                                  f"{type(exc).__name__}: {str(exc)[:120]}")
    result.seconds = time.perf_counter() - start
    return result


def precompile(signatures: Sequence[Signature], workers: int) -> dict[str, Compiled]:
    """Compile ``signatures`` in ``workers`` processes: the shared kernels first, in one,
    alongside the heaviest module that touches none of them (so that no core waits), then
    each module's signatures in one, heaviest module first. Returns what each step did, by
    module (the shared kernels under ``"shared"``)."""
    modules = sorted({s.module for s in signatures})
    # no more processes than modules: a process without a module to take only starts up
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(modules))),
                             mp_context=get_context("spawn")) as pool:
        imports = pool.submit(kernel_imports, modules).result()
        callees = set().union(*imports.values())
        first = [s for s in signatures if (s.module, s.function) in callees]
        groups = by_module_heaviest_first(s for s in signatures if s not in first)
        shared = pool.submit(compile_signatures, first)
        early = independent_of_shared(groups, imports)
        jobs = {} if early is None else {early[0].module: pool.submit(compile_signatures, early)}
        steps = {"shared": shared.result()}
        jobs.update((group[0].module, pool.submit(compile_signatures, group))
                    for group in groups if group is not early)
        steps.update((module, job.result()) for module, job in jobs.items())
    return steps


#: where the recording of a test run goes: one file of compiles per process
RECORD_ENV = "LMDBIO_RECORD_KERNEL_COMPILES"


def record_compiles(folder: str) -> None:
    """Append every numba compile of this process from now on to a file in ``folder``:
    the kernel, its argument types and the CPU seconds its compile took, less those of
    the kernels it compiled inside (``tests/conftest.py`` calls this when
    :data:`RECORD_ENV` is set)."""
    from numba.core import event

    path = Path(folder) / f"compiles-{os.getpid()}.jsonl"
    open_compiles: list[list[float]] = []  # [start CPU time, CPU time of inner compiles]

    class Recorder(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            open_compiles.append([time.process_time(), 0.0])

        def on_end(self, ev: event.Event) -> None:
            started, inner = open_compiles.pop()
            took = time.process_time() - started
            if open_compiles:
                open_compiles[-1][1] += took
            fn = ev.data["dispatcher"].py_func
            with path.open("a") as out:
                out.write(json.dumps({"module": fn.__module__, "function": fn.__name__,
                                      "types": repr(tuple(ev.data["args"])),
                                      "seconds": took - inner}) + "\n")

    event.register("numba:compile", Recorder())


def merge_recording(folder: Path, modules: Iterable[str]) -> list[Signature]:
    """The signatures of ``modules``' kernels that the recording in ``folder`` holds, each
    once (the compile that took longest: the first in its process), sorted."""
    wanted = set(modules)
    found: dict[tuple[str, str, str], Signature] = {}
    for path in sorted(folder.glob("compiles-*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry["module"] not in wanted:
                continue
            sig = Signature(entry["module"], entry["function"], entry["types"],
                            round(entry["seconds"], 2))
            key = (sig.module, sig.function, sig.types)
            if key not in found or found[key].seconds < sig.seconds:
                found[key] = sig
    return [found[key] for key in sorted(found)]


def write_manifest(signatures: Sequence[Signature], path: Path = MANIFEST) -> None:
    """Write ``signatures`` as the manifest at ``path`` (one JSON object per signature)."""
    import numba

    lines = ",\n  ".join(json.dumps(vars(s)) for s in signatures)
    version = json.dumps(numba.__version__)
    path.write_text(f'{{"numba": {version},\n "signatures": [\n  {lines}\n ]}}\n')


def main(argv: Sequence[str] | None = None) -> int:
    """Precompile the manifest's signatures (default) or record them (``--record``)."""
    parser = argparse.ArgumentParser(prog="python -m tests.precompile_kernels",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, metavar="FOLDER",
                        help=f"write the manifest from the compiles a test run with "
                             f"{RECORD_ENV}=FOLDER recorded there")
    parser.add_argument("--verbose", action="store_true",
                        help="print each module's compile time")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="processes that compile (default: one per core)")
    args = parser.parse_args(argv)
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    if args.record:
        signatures = merge_recording(args.record, kernel_module_names())
        write_manifest(signatures)
        print(f"precompile: {len(signatures)} signatures written to {MANIFEST}")
        return 0
    stamp = Path(cache_dir) / f"{STAMP_PREFIX}{manifest_digest()}" if cache_dir else None
    if stamp is not None and stamp.exists():
        return 0
    start = time.perf_counter()
    steps = precompile(read_manifest(), args.workers)
    total = Compiled()
    for step in steps.values():
        total.add(step)
    print(f"precompile: {total.done} kernel signatures in numba's cache, "
          f"{len(total.skipped)} skipped, {time.perf_counter() - start:.0f} s "
          f"on {args.workers} processes")
    if args.verbose:
        for name, step in steps.items():
            print(f"  {step.seconds:6.1f} s  {step.done:3d}  {name}")
    for why in total.skipped:
        print(f"  skipped {why}")
    if stamp is not None:
        stamp.touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
