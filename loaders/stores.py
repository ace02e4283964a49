"""Which stores write a large float32 batch: ordinary ones, or streaming (non-temporal) ones.

A float32 batch too large to stay in the cache can be written with streaming stores, which
skip reading every output line before writing it (read for ownership) and do not evict the
rest of the cache. Whether that is faster depends on the machine, not on the code:

* on the 2-core VM the streaming kernels were written on, they took half the CPU per
  ImageNet-like image (``bench/widen.py``);
* on the same VM on another host (AMD EPYC, 2026-11-28) ordinary stores were faster in
  every case measured, also for two batches of 19 MB each against a 32 MB last-level cache:
  13.8 against 17.5 µs an image in one process, 9.7 against 18 µs in each of two
  (``bench/peers.py``'s kernel variant, 60 epochs of 600 images, alternating kinds).

Both kinds write the same values, so the choice is a measurement: a process times its first
large batches, alternating the kinds (:data:`TRIALS` of each), and keeps the faster one per
byte. Batches under :data:`MIN_BYTES` always take ordinary stores (they stay in the cache).
``LMDBIO_STREAMING_STORES=always|never`` (or :func:`set_policy`) fixes the choice instead,
for benchmarks and tests.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Literal, TypeVar

#: batches at least this large may take streaming stores: larger than a core's L2 cache,
#: and with several workers per host larger than their share of the last-level cache.
#: Smaller ones keep ordinary stores: one process, CIFAR-like batches of 64 (786 KB),
#: streaming them took 3.9 against 3.0 µs of CPU a sample (2-core VM)
MIN_BYTES = 8 << 20
#: large batches timed with each store kind before the choice is made
TRIALS = 5
#: the environment variable that fixes the policy
ENV = "LMDBIO_STREAMING_STORES"

Policy = Literal["auto", "always", "never"]
POLICIES: tuple[Policy, ...] = ("auto", "always", "never")
T = TypeVar("T")


def faster_is_streaming(ordinary: list[float], streaming: list[float]) -> bool:
    """Whether streaming stores won the trials: their median seconds per byte is lower than
    ordinary stores' (a tie keeps ordinary stores, which need no fence)."""
    return statistics.median(streaming) < statistics.median(ordinary)


class StoreChoice:
    """The store kind for large batches in this process: ``policy`` ``"auto"`` measures
    (see the module docstring), ``"always"`` and ``"never"`` fix it. Thread-safe: the
    loader's decoding thread and the trainer's thread both write batches."""

    def __init__(self, policy: Policy = "auto", trials: int = TRIALS,
                 min_bytes: int | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"{ENV}: expected one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy, self.trials = policy, trials
        self.min_bytes = MIN_BYTES if min_bytes is None else min_bytes
        #: seconds per byte of the large batches timed so far, by kind
        self.timed: dict[bool, list[float]] = {False: [], True: []}
        #: trials handed out and not yet recorded, by kind (two threads may run trials at
        #: once: each gets the kind that has had fewer)
        self.pending: dict[bool, int] = {False: 0, True: 0}
        #: the kind chosen once the trials are done (None while they run)
        self.chosen: bool | None = {"auto": None, "always": True, "never": False}[policy]
        self._lock = threading.Lock()

    def streams(self, nbytes: int) -> bool:
        """The store kind for a batch of ``nbytes``: True for streaming stores. While the
        trials run, the kind with fewer trials so far, recorded or handed out (ordinary
        first); the caller then owes :meth:`record` or :meth:`forget` for it."""
        if nbytes < self.min_bytes and self.policy != "always":
            return False
        chosen = self.chosen
        if chosen is not None:
            return chosen
        with self._lock:
            if self.chosen is not None:
                return self.chosen
            kind = self._count(True) < self._count(False)
            self.pending[kind] += 1
            return kind

    def _count(self, kind: bool) -> int:
        return len(self.timed[kind]) + self.pending[kind]

    def record(self, streaming: bool, nbytes: int, seconds: float) -> None:
        """The time a large batch of ``nbytes`` took with ``streaming`` (a trial handed out
        by :meth:`streams`); once both kinds have :attr:`trials` times, the faster one is
        kept."""
        if self.chosen is not None or nbytes < self.min_bytes or nbytes <= 0:
            return
        with self._lock:
            if self.chosen is not None:
                return
            self.pending[streaming] = max(self.pending[streaming] - 1, 0)
            self.timed[streaming].append(seconds / nbytes)
            if min(len(self.timed[False]), len(self.timed[True])) >= self.trials:
                self.chosen = faster_is_streaming(self.timed[False], self.timed[True])

    def forget(self, streaming: bool) -> None:
        """A trial handed out by :meth:`streams` whose batch was not written (a record did
        not fit the kernel, which returned after parsing only): not timed."""
        with self._lock:
            self.pending[streaming] = max(self.pending[streaming] - 1, 0)

    def run(self, nbytes: int, write: Callable[[bool], T],
            wrote: Callable[[T], bool] = lambda _: True) -> T:
        """``write(streaming)`` with the kind for a batch of ``nbytes``, timed while the
        trials run; a call whose result fails ``wrote`` (the kernel wrote nothing) is not
        counted as a trial."""
        if self.chosen is not None or nbytes < self.min_bytes:
            return write(self.streams(nbytes))
        streaming = self.streams(nbytes)
        t0 = time.perf_counter()
        try:
            got = write(streaming)
        except BaseException:
            self.forget(streaming)
            raise
        if wrote(got):
            self.record(streaming, nbytes, time.perf_counter() - t0)
        else:
            self.forget(streaming)
        return got


def _policy_from_env() -> Policy:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in POLICIES:
        raise ValueError(f"{ENV}: expected one of {', '.join(POLICIES)}, got {value!r}")
    return value  # type: ignore[return-value]


#: this process's choice (the loader's kernels ask it for every float32 batch they write)
STORES = StoreChoice(_policy_from_env())


def set_policy(policy: Policy, min_bytes: int | None = None) -> StoreChoice:
    """Start this process's choice again under ``policy`` (and ``min_bytes``); returns it."""
    global STORES
    STORES = StoreChoice(policy, min_bytes=min_bytes)
    return STORES


def run_with_stores(nbytes: int, write: Callable[[bool], T],
                    wrote: Callable[[T], bool] = lambda _: True) -> T:
    """``write(streaming)`` for a float32 batch of ``nbytes`` with this process's choice;
    ``wrote(result)``: whether the call wrote the batch (a trial counts only then)."""
    return STORES.run(nbytes, write, wrote)
