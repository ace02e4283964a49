"""Structure-aware fuzzing shared by the decoder fuzzers (issue 40, "tests that can fail").

Random bytes almost never get past a codec's magic, version and checksum, so a fuzzer fed
with them tests the first ten lines of a parser and never its decoding kernels. The fuzzers
built on this module start instead from *valid* encodings (made by the project's own
encoders over small random inputs), split them into named header fields and body sections
(:class:`Parsed`), change one or two of those (boundary values 0, 1, max, ``value±1``,
``len±1``, negative where signed; truncated, extended, swapped, emptied or flipped
sections) and serialise them again with the codec's checksum recomputed. Most cases then
reach the kernels, and each test asserts that share (:class:`Tally`), so a fuzzer that
silently stops reaching them fails.

Every case must end in the right data or the codec's own error type: :func:`run_case`
turns any other exception (``IndexError``, numba errors, ``struct.error``...) into a test
failure naming the seed, the case and the mutation. Inputs live in :func:`guarded` buffers
that end on an unreadable page, so a read past the end crashes the run instead of passing
unnoticed; hangs are caught by pytest-timeout.

Seeds: each fuzzer runs a fixed regression set (:data:`REGRESSION_SEEDS` plus any seeds a
test adds for cases that once failed) and one seed that differs between runs (from
``os.urandom``), or the seed in ``LMDBIO_FUZZ_SEED`` to replay a failure. The seed is part
of the test id and of every failure message.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import mmap
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: environment variable that fixes the per-run random seed (to replay a failure)
SEED_ENV = "LMDBIO_FUZZ_SEED"
#: seeds every fuzzer runs on every run, whatever the random one is
REGRESSION_SEEDS: tuple[int, ...] = (0, 1, 40)


def _run_seed() -> int:
    """The per-run seed: ``$LMDBIO_FUZZ_SEED`` when set, else 32 fresh random bits."""
    env = os.environ.get(SEED_ENV, "").strip()
    if env:
        return int(env, 0)
    # pytest-xdist's workers must collect the same test ids (the seed is in them): they
    # share the run's id, from which the seed is drawn
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id:
        return int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16)
    return int.from_bytes(os.urandom(4), "little")


#: chosen once per process, so that every fuzzer of a run reports the same seed
RUN_SEED = _run_seed()


def fuzz_seeds(extra: Iterable[int] = ()) -> list[int]:
    """Seeds to parametrize a fuzzer with: the regression seeds, ``extra`` (seeds of cases
    that once found a bug) and the per-run seed last (its test id is ``seed=<n>``)."""
    seeds = list(dict.fromkeys([*REGRESSION_SEEDS, *extra]))
    if RUN_SEED not in seeds:
        seeds.append(RUN_SEED)
    return seeds


def replay_hint(test: str, seed: int, case: int) -> str:
    """How to run one failing case again (the seed is the test's parameter id)."""
    return (f"{test}: seed {seed}, case {case}; replay: {SEED_ENV}={seed} "
            f".venv/bin/pytest 'tests/...::<test>[{seed}]'")


# --------------------------------------------------------------------------------- buffers
_PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_NONE = 0


def guarded(data: bytes | bytearray | memoryview) -> np.ndarray:
    """A read-only uint8 array holding ``data`` whose last byte is the last one before a
    ``PROT_NONE`` page: a decoder that reads even one byte past the end of its input gets
    SIGSEGV (pytest reports the crash and faulthandler the stack) instead of reading
    whatever follows in memory. The mapping lives as long as the array."""
    raw = bytes(data)
    pages = (len(raw) + _PAGE - 1) // _PAGE
    m = mmap.mmap(-1, (pages + 1) * _PAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    if libc.mprotect(ctypes.c_void_p(addr + pages * _PAGE), _PAGE, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of the guard page failed")
    start = pages * _PAGE - len(raw)
    m[start:start + len(raw)] = raw
    arr = np.frombuffer(m, np.uint8, len(raw), start)
    arr.flags.writeable = False
    return arr


# ------------------------------------------------------------------------ structured values
@dataclass
class Parsed:
    """A valid encoding taken apart: ``fields`` (header integers, by name, with the range
    ``limits[name]`` their storage can hold) and ``sections`` (body bytes, in order), plus
    ``build`` that serialises them again (recomputing any checksum, so that a mutation is
    judged by the structure checks and kernels, not stopped by the CRC)."""

    fields: dict[str, int]
    limits: dict[str, tuple[int, int]]
    sections: dict[str, bytes]
    build: Callable[[dict[str, int], dict[str, bytes]], bytes]
    #: fields the mutator leaves alone (magic, version: they only ever reach "bad magic")
    frozen: frozenset[str] = frozenset()

    def encode(self) -> bytes:
        """The encoding as it was parsed (``build`` of the unchanged parts)."""
        return self.build(dict(self.fields), dict(self.sections))


def int_limits(nbytes: int, signed: bool = False) -> tuple[int, int]:
    """Range of an ``nbytes``-byte integer."""
    bits = 8 * nbytes
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def boundary_values(value: int, lo: int, hi: int, total: int, rng: random.Random) -> list[int]:
    """Candidates for a field that holds ``value`` in ``[lo, hi]`` of an encoding of
    ``total`` bytes: 0, 1, ``lo``, ``hi``, ``value±1``, twice and half the value,
    ``total±1``, -1 where signed, and one random value; clipped to what the field holds."""
    cands = [0, 1, 2, lo, hi, hi - 1, value - 1, value + 1, value * 2, value // 2,
             total - 1, total, total + 1, -1, rng.randint(lo, hi)]
    return [c for c in cands if lo <= c <= hi]


@dataclass
class Mutation:
    """One applied mutation: the bytes and a description for failure messages. ``benign``
    is True when the bytes equal the original encoding (the decode must then be exact)."""

    data: bytes
    what: str
    benign: bool


#: kinds of mutation and their weights: most change one header field or one section so
#: the rest of the encoding stays consistent and the case reaches the kernels
KINDS: dict[str, int] = {
    "field": 5, "two_fields": 2, "section_flip": 4, "section_set": 2, "section_truncate": 2,
    "section_extend": 2, "section_swap": 1, "section_drop": 1, "truncate": 1, "extend": 1,
}


def mutate(parsed: Parsed, rng: random.Random, kinds: dict[str, int] | None = None) -> Mutation:
    """Apply one random structure-aware mutation (``kinds``: name -> weight, default
    :data:`KINDS`) to ``parsed`` and serialise the result with ``parsed.build``."""
    kinds = kinds or KINDS
    names = [k for k in kinds if kinds[k] > 0]
    kind = rng.choices(names, weights=[kinds[k] for k in names])[0]
    fields = dict(parsed.fields)
    sections = dict(parsed.sections)
    original = parsed.encode()
    total = len(original)
    mutable = [f for f in fields if f not in parsed.frozen]
    secs = list(sections)
    filled = [s for s in secs if sections[s]] or secs
    what = kind
    tail: Callable[[bytes], bytes] = lambda b: b  # noqa: E731 - whole-output edits
    if kind in ("field", "two_fields") and mutable:
        picks = rng.sample(mutable, min(len(mutable), 1 if kind == "field" else 2))
        parts = []
        for name in picks:
            lo, hi = parsed.limits[name]
            fields[name] = rng.choice(boundary_values(fields[name], lo, hi, total, rng))
            parts.append(f"{name}={fields[name]} (was {parsed.fields[name]})")
        what = ", ".join(parts)
    elif kind == "section_flip" and filled:
        name = rng.choice(filled)
        buf = bytearray(sections[name])
        if buf:
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(buf))
                buf[i] ^= rng.randint(1, 255)
        sections[name] = bytes(buf)
        what = f"flip bytes of section {name}"
    elif kind == "section_set" and filled:
        name = rng.choice(filled)
        buf = bytearray(sections[name])
        if buf:
            i = rng.randrange(len(buf))
            buf[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        sections[name] = bytes(buf)
        what = f"set a byte of section {name}"
    elif kind == "section_truncate" and filled:
        name = rng.choice(filled)
        n = len(sections[name])
        cut = rng.choice([n - 1, n // 2, rng.randint(0, max(0, n - 1))])
        sections[name] = sections[name][:max(0, cut)]
        what = f"truncate section {name} to {max(0, cut)} of {n} bytes"
    elif kind == "section_extend" and secs:
        name = rng.choice(secs)
        extra = rng.choice([b"\0", b"\0" * 8, bytes(rng.randrange(256)
                                                     for _ in range(rng.randint(1, 16)))])
        sections[name] = sections[name] + extra
        what = f"extend section {name} by {len(extra)} bytes"
    elif kind == "section_swap" and len(secs) >= 2:
        a, b = rng.sample(secs, 2)
        sections[a], sections[b] = sections[b], sections[a]
        what = f"swap sections {a} and {b}"
    elif kind == "section_drop" and filled:
        name = rng.choice(filled)
        sections[name] = b""
        what = f"drop section {name}"
    elif kind == "truncate":
        cut = rng.choice([total - 1, total // 2, rng.randint(0, max(0, total - 1))])
        tail = lambda b: b[:cut]  # noqa: E731
        what = f"truncate to {cut} of {total} bytes"
    else:  # "extend", or a kind that does not apply to this encoding
        extra = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        tail = lambda b: b + extra  # noqa: E731
        what = f"extend by {len(extra)} bytes"
    data = tail(parsed.build(fields, sections))
    return Mutation(data, what, data == original)


# ------------------------------------------------------------------------------- outcomes
@dataclass
class Tally:
    """Outcome counts of one fuzzer run, and the share that reached the decoding kernels."""

    name: str
    seed: int
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def share(self, outcomes: Sequence[str]) -> float:
        """Fraction of the cases whose outcome is one of ``outcomes``."""
        return sum(self.counts[o] for o in outcomes) / max(1, self.total)

    def require(self, reached: Sequence[str], at_least: float) -> None:
        """Assert that at least ``at_least`` of the cases ended in one of ``reached`` (the
        outcomes that mean the kernels ran), naming the counts and the seed otherwise."""
        got = self.share(reached)
        print(f"{self.name} seed {self.seed}: {got:.0%} of {self.total} reached the kernels "
              f"({dict(self.counts)})")  # shown by pytest -rP: the measured share
        assert got >= at_least, (
            f"{self.name}: only {got:.0%} of {self.total} cases reached the kernels "
            f"({dict(self.counts)}), expected >= {at_least:.0%}; {SEED_ENV}={self.seed}")


def run_case(test: str, seed: int, case: int, what: str, fn: Callable[[], str],
             expected: tuple[type[BaseException], ...]) -> str:
    """Run one fuzz case: ``fn`` returns its outcome name (it checks the result itself);
    an exception of one of the ``expected`` types is the outcome ``"error:<stage>"``, where
    ``fn`` may set the stage by raising from inside :func:`stage`. Any other exception, and
    any failed assertion, becomes an AssertionError naming the seed, the case and the
    mutation (so that it can be replayed)."""
    try:
        return fn()
    except expected as exc:
        return f"error:{getattr(exc, '_fuzz_stage', 'decode')}"
    except Exception as exc:  # everything else is a bug in the decoder (or the test)
        raise AssertionError(f"{replay_hint(test, seed, case)}; mutation: {what}: "
                             f"{type(exc).__name__}: {exc}") from exc


class stage:  # noqa: N801 - used as a context manager, like a function
    """``with stage("header"):`` marks errors raised inside as coming from that stage, so
    that :func:`run_case` counts them apart (``error:header`` did not reach the kernels)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> bool:
        if exc is not None and not hasattr(exc, "_fuzz_stage"):
            with contextlib.suppress(AttributeError):  # exceptions with __slots__
                exc._fuzz_stage = self.name  # type: ignore[attr-defined]
        return False
