"""Which stores write a large float32 batch: ordinary ones, or streaming (non-temporal) ones.

A float32 batch too large to stay in the cache can be written with streaming stores, which
skip reading every output line before writing it (read for ownership) and do not evict the
rest of the cache. Both kinds write the same values; which is faster depends on the host:

* on the 2-core VM's earlier host, streaming stores halved the CPU per ImageNet-like image
  (87 -> 45 µs, ``docs/findings/peers-2026-11-27b.md``);
* on its host of 2026-11-28 (AMD EPYC, 32 MB last-level cache) ordinary stores were faster
  in the loader: 15-16 against 18-19 µs an image in one process and at two ranks
  (``docs/findings/peers-2026-11-28d.md``), though the store loop alone, on a source
  already in the cache, favoured streaming stores.

So the default, ``auto``, measures the loader's own kernels on the job's own batches
(:class:`StoreTrial`): each output size of :data:`TRIAL_MIN_BYTES` or more is written with
streaming stores, then with ordinary stores, in blocks that each time at least
:data:`SAMPLES` batches and :data:`TIMED_BYTES` (streaming ones:
:data:`STREAMING_TIMED_BYTES`; CPU time of the writing thread), and the kind with the
lower median is kept until the size is tried again. Ordinary stores are timed only after
:data:`WARM_BYTES`: their speed depends on the stores before them (after streaming stores,
and from a process's start, ordinary ones took some 300-450 MB to reach their own speed on
the host above); streaming stores after one batch. The streaming block comes first
because that recovery is what a trial costs where ordinary stores win: streaming blocks
at a process's start, where ordinary stores are still slow, cost about half as much as the
same block after ordinary stores had reached their speed (one process, ImageNet-like,
2026-11-28: 0.3-0.8 against 0.7-1.3 µs an image over the first 110 batches). A batch during
which its thread took a page fault is not counted: a first epoch faults the database's pages
into the process (on a cold cache reads them; a small warm database is mapped whole when its
session opens, :func:`lmdbio.io.prefetch.populate_if_resident`), which swamps the store
kind; a choice timed over short alternating blocks without this filter flipped between runs
(``docs/findings/peers-2026-11-28c.md``). A block whose batches faulted times on until it
has :data:`SAMPLES` clean ones, or :data:`MAX_BLOCK_TIMED` in all (a process's first batches
fault in its output buffers). Nor is a call that wrote nothing counted (a kernel that gave
up on a record of another shape). Streaming stores must win by :data:`MARGIN` (a tie keeps
ordinary stores); if :data:`MAX_PAIRS` pairs of blocks give too few clean timings (a data
set that faults on every batch) the ``large`` rule decides; and every :data:`RETRIAL_BYTES`
of one size the trial runs again, so that a choice made while a neighbour loaded the host's
memory does not hold for the rest of a long job. A size seen rarely (an epoch's short last
batch) stays on trial for long (its first few batches with streaming stores, then ordinary
ones); at most :data:`MAX_TRIALS` sizes are tried, the others follow the ``large`` rule.

``LMDBIO_STREAMING_STORES`` sets the policy:

* ``auto`` (the default): as above;
* ``large``: streaming stores for batches of :data:`MIN_BYTES` and more, the winner where
  the streaming kernels were written;
* ``never``: ordinary stores always;
* ``always``: streaming stores for every batch (tests, benchmarks).
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from typing import Literal, TypeVar, get_args

#: the ``large`` rule: batches at least this large take streaming stores; larger than a
#: core's L2 cache, and with several workers per host larger than their share of the
#: last-level cache. Smaller ones keep ordinary stores: one process, CIFAR-like batches of
#: 64 (786 KB), streaming them took 3.9 against 3.0 µs of CPU a sample (2-core VM)
MIN_BYTES = 8 << 20
#: ``auto``: smaller batches are written with ordinary stores, untimed (they stay in the
#: cache, where ordinary stores are as fast or faster)
TRIAL_MIN_BYTES = 2 << 20
#: ``auto``: bytes written with ordinary stores before their timings count. Ordinary stores
#: reach their steady speed only some 300-450 MB after streaming ones, and from a process's
#: start (ImageNet-like batches of 19 MB, 2-core VM, 2026-11-28: 17 -> 13 µs an image over
#: 16-24 batches); streaming stores run at their own speed from their first batch
WARM_BYTES = 512 << 20
#: ``auto``: bytes of ordinary stores timed in a block (after its warm-up of
#: :data:`WARM_BYTES`), and at least :data:`SAMPLES` batches
TIMED_BYTES = 256 << 20
#: ``auto``: bytes of streaming stores timed in a block (after one batch), and at least
#: :data:`SAMPLES` batches. Fewer than ordinary ones: streaming stores run at their own
#: speed from their first batch, and where they lose every batch of theirs is the trial's
#: cost (at two ranks on the 2-core VM, 2026-11-28: 543 against 428 µs an ImageNet-like
#: batch of 32; 15 such batches a trial with 256 MiB, 5 with 64 MiB)
STREAMING_TIMED_BYTES = 64 << 20
#: ``auto``: clean timings of each kind before the choice (and timed batches a block)
SAMPLES = 4
#: ``auto``: timed batches after which a block ends without :data:`SAMPLES` clean ones
#: (every batch faulted: a database read from storage as it goes)
MAX_BLOCK_TIMED = 4 * SAMPLES
#: ``auto``: pairs of blocks tried for clean timings before the ``large`` rule decides
MAX_PAIRS = 4
#: ``auto``: streaming stores are chosen only when their median is at least this much below
#: the ordinary stores' (a tie keeps ordinary stores: their output may still be in the cache
#: when the trainer reads it, which a trial does not time). Under a memory-bound neighbour
#: the two kinds measured within 1-6 % of each other, and the choice went either way
MARGIN = 0.05
#: ``auto``: bytes of one output size written with the choice before it is tried again
#: (what the host's other tenants do changes; a choice made under their load should not
#: hold for the rest of a long job): 64 GiB is 3,500 ImageNet-like batches of 32, a few
#: seconds of one worker; a new trial costs a few milliseconds where the choice holds
RETRIAL_BYTES = 64 << 30
#: ``auto``: output sizes tried per process; further sizes follow the ``large`` rule
MAX_TRIALS = 8
#: the environment variable that sets the policy
ENV = "LMDBIO_STREAMING_STORES"

Policy = Literal["auto", "large", "always", "never"]
POLICIES: tuple[Policy, ...] = get_args(Policy)

T = TypeVar("T")
#: the kernel call of one batch, given whether to write it with streaming stores
Writer = Callable[[bool], T]

_THREAD_USAGE = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def page_faults() -> int:
    """Page faults (minor and major) taken so far by the calling thread (by the process
    where the platform does not count threads: a stricter filter, never a looser one)."""
    u = resource.getrusage(_THREAD_USAGE)
    return u.ru_minflt + u.ru_majflt


def large_rule(nbytes: int) -> bool:
    """The ``large`` policy: streaming stores for batches of :data:`MIN_BYTES` or more."""
    return nbytes >= MIN_BYTES


def kind_name(streaming: bool) -> str:
    """``streaming`` or ``ordinary``: the store kind's name in reports."""
    return "streaming" if streaming else "ordinary"


def faster_kind(ordinary: list[float], streaming: list[float]) -> bool:
    """Whether streaming stores won a trial: their median time :data:`MARGIN` or more below
    the ordinary ones'."""
    return statistics.median(streaming) <= (1 - MARGIN) * statistics.median(ordinary)


class StoreTrial:
    """The trial of one output size under ``auto`` (see the module docstring): which kind
    the next batch takes (:meth:`next_batch`), what it cost (:meth:`finish`), and the
    choice once made. Pairs of blocks, streaming stores then ordinary ones, each timing
    :data:`SAMPLES` clean batches (at most :data:`MAX_BLOCK_TIMED` in all) and
    :data:`STREAMING_TIMED_BYTES` (:data:`TIMED_BYTES`) after its warm-up, until both
    kinds have :data:`SAMPLES` clean timings. Not thread-safe:
    :class:`StoreChoice` holds its lock around every call but :meth:`wrote`.

    A choice holds for :data:`RETRIAL_BYTES`; then the size is tried again (:meth:`wrote`).
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        #: the choices made so far (``True``: streaming), the last one first made
        self.choices: list[bool] = []
        self.restart()

    def restart(self) -> None:
        """Begin a new trial (the earlier choices stay in :attr:`choices`)."""
        #: batches written in this trial, blocks finished, and the current block's bytes
        #: written, batches timed and timings counted (taken without a page fault)
        self.batches = 0
        self.blocks = 0
        self.written = 0
        self.timed = 0
        self.clean = 0
        #: clean CPU seconds per batch, by kind (``True``: streaming)
        self.seconds: dict[bool, list[float]] = {False: [], True: []}
        #: the choice (``None`` while trying), and bytes written with it
        self.streaming: bool | None = None
        self.since = 0

    def wrote(self) -> bool:
        """A batch written with the choice; whether it is time to try again. Called without
        the lock: a lost increment only delays the next trial by a batch."""
        self.since += self.nbytes
        return self.since >= RETRIAL_BYTES

    def decide(self, streaming: bool) -> None:
        """Keep ``streaming`` as the choice from now on."""
        self.streaming = streaming
        self.choices.append(streaming)

    def next_batch(self) -> tuple[bool, bool]:
        """``(streaming, timed)`` for the next batch: the current block's kind, and whether
        its warm-up is over (:data:`WARM_BYTES` of ordinary stores, one batch of streaming
        ones); the choice, untimed, once made."""
        if self.streaming is not None:
            return self.streaming, False
        streaming = self.blocks % 2 == 0
        warm = self.written < (self.nbytes if streaming else WARM_BYTES)
        return streaming, not warm

    def finish(self, streaming: bool, timed: bool, seconds: float, faults: int) -> None:
        """A batch :meth:`next_batch` gave was written: ``seconds`` of its thread's CPU
        with ``faults`` page faults (a timing counted only without faults). Ends the block
        when it timed :data:`TIMED_BYTES` (streaming: :data:`STREAMING_TIMED_BYTES`) and
        counted :data:`SAMPLES` timings, or timed :data:`MAX_BLOCK_TIMED` batches; after
        each pair of blocks decides, if both kinds have their timings (the ``large`` rule
        after :data:`MAX_PAIRS`)."""
        if self.streaming is not None or streaming != (self.blocks % 2 == 0):
            return  # the kind of a block that ended meanwhile (another thread's batch)
        self.batches += 1
        self.written += self.nbytes
        if not timed:
            return
        self.timed += 1
        if faults == 0:
            self.seconds[streaming].append(seconds)
            self.clean += 1
        block_bytes = STREAMING_TIMED_BYTES if streaming else TIMED_BYTES
        if self.timed < SAMPLES or self.timed * self.nbytes < block_bytes or \
                (self.clean < SAMPLES and self.timed < MAX_BLOCK_TIMED):
            return
        self.blocks, self.written, self.timed, self.clean = self.blocks + 1, 0, 0, 0
        if self.blocks % 2:
            return
        if min(len(v) for v in self.seconds.values()) >= SAMPLES:
            self.decide(faster_kind(self.seconds[False], self.seconds[True]))
        elif self.blocks >= 2 * MAX_PAIRS:
            self.decide(large_rule(self.nbytes))

    def as_dict(self) -> dict[str, object]:
        """The trial, JSON-able: the choice and the median microseconds of each kind."""
        med = {kind_name(k): round(statistics.median(v) * 1e6, 1)
               for k, v in self.seconds.items() if v}
        return {"bytes": self.nbytes,
                "choice": None if self.streaming is None else kind_name(self.streaming),
                "batches": self.batches, "median_us": med,
                "choices": [kind_name(c) for c in self.choices]}


class StoreChoice:
    """The store kind of the float32 batches this process writes, under ``policy`` (see the
    module docstring). Thread-safe: a worker writes on its decoding thread and, when it did
    not decode ahead, on the trainer's."""

    def __init__(self, policy: Policy = "auto") -> None:
        if policy not in POLICIES:
            raise ValueError(f"{ENV}: expected one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self._trials: dict[int, StoreTrial] = {}
        #: sizes past :data:`MAX_TRIALS`: the ``large`` rule, without the lock
        self._untried: set[int] = set()
        self._lock = threading.Lock()

    def streams(self, nbytes: int) -> bool:
        """Whether a batch of ``nbytes`` is written with streaming stores now (under
        ``auto``: the choice made for its size, else the ``large`` rule)."""
        if self.policy == "auto":
            trial = self._trials.get(nbytes)
            if trial is not None and trial.streaming is not None:
                return trial.streaming
        if self.policy in ("auto", "large"):
            return large_rule(nbytes)
        return self.policy == "always"

    def write(self, nbytes: int, kernel: Writer[T],
              wrote: Callable[[T], bool] = lambda _: True) -> T:
        """``kernel(streaming)``, the writing of one batch of ``nbytes``, with the kind this
        policy picks; under ``auto`` a batch of a size on trial is timed, and counts if
        ``wrote(result)`` (a kernel that gave up wrote nothing: its time says nothing)."""
        if self.policy != "auto" or nbytes < TRIAL_MIN_BYTES or nbytes in self._untried:
            return kernel(self.streams(nbytes))
        trial = self._trials.get(nbytes)
        if trial is not None:
            streaming = trial.streaming
            if streaming is not None:
                if trial.wrote():
                    with self._lock:
                        if trial.streaming is not None and trial.since >= RETRIAL_BYTES:
                            trial.restart()
                return kernel(streaming)
        with self._lock:
            trial = self._trials.get(nbytes)
            if trial is None and len(self._trials) >= MAX_TRIALS:
                self._untried.add(nbytes)
            elif trial is None:
                trial = self._trials[nbytes] = StoreTrial(nbytes)
            if trial is not None:
                streaming, timed = trial.next_batch()
        if trial is None:
            return kernel(large_rule(nbytes))
        cpu = faults = 0
        if timed:  # the clocks (two system calls each) only where the timing counts
            faults, start = page_faults(), time.thread_time()
            result = kernel(streaming)
            cpu, faults = time.thread_time() - start, page_faults() - faults
        else:
            result = kernel(streaming)
        if wrote(result):
            with self._lock:
                trial.finish(streaming, timed, cpu, faults)
        return result

    def trials(self) -> list[dict[str, object]]:
        """Every trial of this process (``auto``), JSON-able."""
        with self._lock:
            return [t.as_dict() for t in self._trials.values()]

    def as_dict(self) -> dict[str, object]:
        """The policy and every trial, JSON-able (what a loader's summary reports)."""
        return {"policy": self.policy, "trials": self.trials()}


def policy_from_env() -> str:
    """What ``LMDBIO_STREAMING_STORES`` says, normalised (``auto`` when unset); checked by
    :class:`StoreChoice`."""
    return os.environ.get(ENV, "auto").strip().lower() or "auto"


#: this process's choice (the loader's kernels ask it for every float32 batch they write)
STORES = StoreChoice(policy_from_env())  # type: ignore[arg-type]


def set_policy(policy: Policy) -> StoreChoice:
    """Set this process's policy (benchmarks; tests patch :data:`STORES`); returns it."""
    global STORES
    STORES = StoreChoice(policy)
    return STORES


def streams(nbytes: int) -> bool:
    """Whether this process writes a float32 batch of ``nbytes`` with streaming stores now."""
    return STORES.streams(nbytes)


def write(nbytes: int, kernel: Writer[T], wrote: Callable[[T], bool] = lambda _: True) -> T:
    """``kernel(streaming)`` for one float32 batch of ``nbytes``, with this process's store
    kind (see :meth:`StoreChoice.write`)."""
    return STORES.write(nbytes, kernel, wrote)
