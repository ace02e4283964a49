"""Where a rank's time goes: CPU and wall time per stage of the data path.

A reader's slot passes through ``locate`` (find the records), ``read_ahead`` (ask the kernel
for the next slot's pages), ``slot_wait`` (wait for a free ring slot), ``slot_fill`` (copy
records or their spans into it) and ``publish`` (checksum, tell the workers). A worker's
batch passes through ``receive`` (wait for a slot, check it), ``prepare`` (checksum and
header checks deferred to the worker, parse the slot), ``assemble`` (decode and transform a
batch) and ``handoff`` (wait for a batch the decoding thread assembles). The difference
between a stage's wall and CPU time is time spent waiting (idle).

CPU time is the calling thread's (``time.thread_time``), so work on the decoding thread
counts in its own stage, not in the trainer's wait. Reading that clock is a system call
(about a microsecond here), so a :class:`StageClock` measures only while ``enabled``:
``lmdbio run --stages`` and the peer benchmark's untimed warm-up epoch turn it on, timed
epochs leave it off. Off, a span is one shared no-op context manager.
"""

from __future__ import annotations

import contextlib
import threading
import time

__all__ = ["READER_STAGES", "WORKER_STAGES", "StageClock", "merged", "per_sample"]

#: a reader's stages, in the order a slot passes through them
READER_STAGES = ("locate", "read_ahead", "slot_wait", "slot_fill", "publish")
#: a worker's stages, in the order a batch passes through them
WORKER_STAGES = ("receive", "prepare", "assemble", "handoff")

_OFF = contextlib.nullcontext()


class _Span:
    """Adds the thread CPU and wall time of a ``with`` block to one stage of a clock."""

    __slots__ = ("_clock", "_cpu", "_name", "_wall")

    def __init__(self, clock: StageClock, name: str) -> None:
        self._clock, self._name = clock, name

    def __enter__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()

    def __exit__(self, *exc: object) -> None:
        cpu = time.thread_time() - self._cpu
        self._clock.add(self._name, cpu, time.perf_counter() - self._wall)


class StageClock:
    """Per-stage totals of one rank: CPU seconds, wall seconds and spans counted.

    Thread-safe (the trainer's thread and the decoding thread both add to it); measures
    nothing until :attr:`enabled` is set.
    """

    __slots__ = ("_lock", "_totals", "enabled")

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._totals: dict[str, list[float]] = {}

    def span(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A context manager timing its block as stage ``name`` (a no-op while off)."""
        return _Span(self, name) if self.enabled else _OFF

    def add(self, name: str, cpu_seconds: float, wall_seconds: float) -> None:
        """Add one span of stage ``name``."""
        with self._lock:
            total = self._totals.setdefault(name, [0.0, 0.0, 0])
            total[0] += cpu_seconds
            total[1] += wall_seconds
            total[2] += 1

    def reset(self) -> None:
        """Forget every stage's totals (e.g. after a warm-up)."""
        with self._lock:
            self._totals.clear()

    def as_dict(self) -> dict[str, dict[str, float]]:
        """``{stage: {"cpu_seconds", "wall_seconds", "spans"}}`` for every stage timed."""
        with self._lock:
            return {name: {"cpu_seconds": cpu, "wall_seconds": wall, "spans": int(n)}
                    for name, (cpu, wall, n) in self._totals.items()}


def per_sample(stages: dict[str, dict[str, float]], samples: int) -> dict[str, dict[str, float]]:
    """Each stage's CPU and idle (wall - CPU) microseconds per sample of ``samples``."""
    n = max(int(samples), 1)
    return {name: {"cpu_us": 1e6 * s["cpu_seconds"] / n,
                   "idle_us": 1e6 * max(s["wall_seconds"] - s["cpu_seconds"], 0.0) / n}
            for name, s in stages.items()}


def merged(parts: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The sum of several ranks' :meth:`StageClock.as_dict` results, stage by stage."""
    out: dict[str, dict[str, float]] = {}
    for part in parts:
        for name, s in part.items():
            t = out.setdefault(name, {"cpu_seconds": 0.0, "wall_seconds": 0.0, "spans": 0})
            for key in t:
                t[key] += s[key]
    return out
