"""loaders.stores: the store kind for float32 batches, a setting (LMDBIO_STREAMING_STORES)
whose default, ``auto``, times both kinds on the job's own batches."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import loaders.stores as stores
from loaders.stores import (
    MAX_BLOCK_TIMED,
    MAX_PAIRS,
    MAX_TRIALS,
    MIN_BYTES,
    SAMPLES,
    STREAMING_TIMED_BYTES,
    TIMED_BYTES,
    TRIAL_MIN_BYTES,
    WARM_BYTES,
    StoreChoice,
    StoreTrial,
    policy_from_env,
)


def test_the_fixed_policies():
    large = StoreChoice("large")
    assert large.streams(MIN_BYTES) and not large.streams(MIN_BYTES - 1)
    assert StoreChoice("always").streams(1) and not StoreChoice("never").streams(1 << 40)
    with pytest.raises(ValueError, match=r"LMDBIO_STREAMING_STORES.*auto, large, always, never"):
        StoreChoice("sometimes")  # type: ignore[arg-type]


def test_the_policy_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("LMDBIO_STREAMING_STORES", raising=False)
    assert policy_from_env() == "auto"
    monkeypatch.setenv("LMDBIO_STREAMING_STORES", " Never ")
    assert policy_from_env() == "never"
    monkeypatch.setenv("LMDBIO_STREAMING_STORES", "often")
    with pytest.raises(ValueError, match="expected one of auto, large, always, never, got 'often'"):
        StoreChoice(policy_from_env())  # type: ignore[arg-type]


def block(nbytes: int, streaming: bool) -> tuple[int, int]:
    """(untimed, timed) batches of ``nbytes`` in a trial block of this kind."""
    warm = 1 if streaming else -(-WARM_BYTES // nbytes)
    timed = STREAMING_TIMED_BYTES if streaming else TIMED_BYTES
    return warm, max(SAMPLES, -(-timed // nbytes))


def pair(nbytes: int) -> int:
    """Batches of ``nbytes`` in a pair of trial blocks."""
    return sum(block(nbytes, False)) + sum(block(nbytes, True))


def faulting_block(nbytes: int, streaming: bool) -> int:
    """Batches of ``nbytes`` in a trial block whose every timed batch faulted."""
    warm, timed = block(nbytes, streaming)
    return warm + max(timed, MAX_BLOCK_TIMED)


def drive(trial: StoreTrial, seconds: dict[bool, float], faults: dict[bool, int],
          batches: int) -> list[tuple[bool, bool]]:
    """``batches`` batches of ``trial``: the (streaming, timed) of each, finished with
    ``seconds[kind]`` and ``faults[kind]``."""
    seen = []
    for _ in range(batches):
        streaming, timed = trial.next_batch()
        seen.append((streaming, timed))
        trial.finish(streaming, timed, seconds[streaming], faults[streaming])
    return seen


@pytest.mark.parametrize("nbytes", [16 << 20, 64 << 20, 300 << 20, 800 << 20])
@pytest.mark.parametrize("streaming_wins", [True, False])
def test_a_trial_times_each_kind_after_its_warm_up_and_keeps_the_faster(streaming_wins,
                                                                        nbytes):
    """A streaming block (timed after one batch), an ordinary one (after WARM_BYTES), each
    timing at least SAMPLES batches and STREAMING_TIMED_BYTES (ordinary: TIMED_BYTES),
    then the choice: at any batch size, one larger than a block's bytes too."""
    (ow, ot), (sw, st) = block(nbytes, False), block(nbytes, True)
    trial = StoreTrial(nbytes)
    fast, slow = 1.0, 1.5
    seen = drive(trial, {True: fast if streaming_wins else slow,
                         False: slow if streaming_wins else fast}, {True: 0, False: 0},
                 pair(nbytes) + 5)
    assert seen[:sw + st] == [(True, False)] * sw + [(True, True)] * st
    assert seen[sw + st:pair(nbytes)] == [(False, False)] * ow + [(False, True)] * ot
    assert trial.streaming is streaming_wins
    assert seen[pair(nbytes):] == [(streaming_wins, False)] * 5
    assert trial.as_dict()["choice"] == ("streaming" if streaming_wins else "ordinary")


def test_timings_with_page_faults_do_not_count():
    """A block whose streaming batches all faulted gives no streaming timings: it times on
    up to MAX_BLOCK_TIMED batches, the trial goes on (a second pair of blocks), and the
    faulting batches' times never decide."""
    nbytes = 64 << 20
    trial = StoreTrial(nbytes)
    first = faulting_block(nbytes, True) + sum(block(nbytes, False))
    seen = drive(trial, {True: 0.1, False: 1.0}, {True: 3, False: 0}, first)
    assert seen[:faulting_block(nbytes, True)] == \
        [(True, False)] + [(True, True)] * MAX_BLOCK_TIMED
    assert trial.streaming is None and trial.seconds[True] == []
    assert len(trial.seconds[False]) >= SAMPLES
    drive(trial, {True: 2.0, False: 1.0}, {True: 0, False: 0}, pair(nbytes))
    assert trial.streaming is False  # the clean streaming timings were the slower ones


def test_a_block_times_on_past_its_faulting_batches():
    """A process's first batches fault in its output buffers: a block counts SAMPLES clean
    timings after them before it ends, and the choice needs no second pair."""
    nbytes = 64 << 20
    trial = StoreTrial(nbytes)
    sw, st = block(nbytes, True)
    for i in range(sw + st + 2):  # the first two timed streaming batches faulted
        streaming, timed = trial.next_batch()
        assert streaming
        trial.finish(streaming, timed, 0.5, 2 if i in (1, 2) else 0)
    assert len(trial.seconds[True]) == SAMPLES and trial.next_batch()[0] is False
    drive(trial, {True: 0.5, False: 1.0}, {True: 0, False: 0}, sum(block(nbytes, False)))
    assert trial.streaming is True and trial.as_dict()["batches"] == sw + st + 2 + \
        sum(block(nbytes, False))


def test_a_trial_that_never_gets_clean_timings_falls_back_to_the_size_rule():
    nbytes = 64 << 20
    trial = StoreTrial(nbytes)
    faulting_pair = faulting_block(nbytes, True) + faulting_block(nbytes, False)
    drive(trial, {True: 1.0, False: 1.0}, {True: 1, False: 1}, MAX_PAIRS * faulting_pair - 1)
    assert trial.streaming is None
    drive(trial, {True: 1.0, False: 1.0}, {True: 1, False: 1}, 1)
    assert trial.streaming is stores.large_rule(nbytes) is True


def test_the_median_decides_not_one_outlier():
    assert not stores.faster_kind([1.0, 1.0, 1.0, 100.0], [2.0] * 4)
    assert stores.faster_kind([2.0] * 4, [1.0, 1.0, 1.0, 100.0])


@pytest.mark.parametrize(("streaming_seconds", "streaming_wins"), [(0.97, False), (0.90, True)])
def test_streaming_stores_must_win_by_the_margin(streaming_seconds, streaming_wins):
    """A tie (streaming 3 % faster: within stores.MARGIN) keeps ordinary stores."""
    assert stores.faster_kind([1.0] * SAMPLES, [streaming_seconds] * SAMPLES) is streaming_wins


def test_auto_writes_small_batches_with_ordinary_stores_untimed(monkeypatch):
    choice = StoreChoice("auto")
    kinds = [choice.write(TRIAL_MIN_BYTES - 1, lambda streaming: streaming) for _ in range(3)]
    assert kinds == [False] * 3 and choice.trials() == []


class Host:
    """A fake machine for StoreChoice.write: a thread clock the kernel advances, where
    streaming stores cost ``streaming`` a batch and ordinary ones ``ordinary``, but
    ``slow`` for the first ``recovery`` ordinary batches after a streaming batch or the
    process's start (the history the warm-up is for)."""

    def __init__(self, monkeypatch, choice: StoreChoice, ordinary: float, streaming: float,
                 slow: float, recovery: int) -> None:
        self.clock = 0.0
        self.choice = choice
        self.cost = {False: ordinary, True: streaming}
        self.slow, self.recovery = slow, recovery
        self.since_streaming = 0
        self.kinds: list[bool] = []
        monkeypatch.setattr(stores.time, "thread_time", lambda: self.clock)
        monkeypatch.setattr(stores, "page_faults", lambda: 0)

    def kernel(self, streaming: bool) -> int:
        assert not self.choice._lock.locked(), "a kernel ran under the trial's lock"
        self.kinds.append(streaming)
        if streaming:
            self.since_streaming = 0
            self.clock += self.cost[True]
        else:
            self.since_streaming += 1
            self.clock += self.slow if self.since_streaming <= self.recovery \
                else self.cost[False]
        return -1


def test_auto_times_only_after_the_warm_up_and_keeps_the_steady_winner(monkeypatch):
    """Ordinary stores are slow for as many batches as WARM_BYTES after streaming ones (and
    at the start), then the fastest: timing the warm-up would choose streaming stores."""
    nbytes = 64 << 20
    choice = StoreChoice("auto")
    host = Host(monkeypatch, choice, ordinary=1.0, streaming=1.5, slow=3.0,
                recovery=WARM_BYTES // nbytes)
    for _ in range(pair(nbytes) + 3):
        choice.write(nbytes, host.kernel)
    sw, st = block(nbytes, True)
    assert host.kinds[:sw + st] == [True] * (sw + st)
    assert host.kinds[sw + st:pair(nbytes)] == [False] * (pair(nbytes) - sw - st)
    assert host.kinds[-3:] == [False] * 3 and not choice.streams(nbytes)
    [trial] = choice.trials()
    assert trial["choice"] == "ordinary" and trial["median_us"] == {"ordinary": 1e6,
                                                                   "streaming": 1.5e6}
    assert choice.streams(nbytes + 1)  # another size: undecided, under the size rule


def test_a_batch_the_kernel_gave_up_on_is_not_counted(monkeypatch):
    """A fused kernel that stops at a record of another shape wrote nothing: its call is
    neither timed nor counted towards a block."""
    choice = StoreChoice("auto")
    host = Host(monkeypatch, choice, 1.0, 1.0, 1.0, 0)
    nbytes = 64 << 20
    for _ in range(2 * pair(nbytes)):
        choice.write(nbytes, host.kernel, wrote=lambda status: False)
    [trial] = choice.trials()
    assert trial["batches"] == 0 and trial["median_us"] == {} and trial["choice"] is None


class CountingLock:
    """A lock that counts its acquisitions."""

    def __init__(self) -> None:
        self.lock, self.taken = threading.Lock(), 0

    def locked(self) -> bool:
        return self.lock.locked()

    def __enter__(self) -> None:
        self.lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_sizes_past_max_trials_follow_the_size_rule_without_the_lock(monkeypatch):
    choice = StoreChoice("auto")
    host = Host(monkeypatch, choice, 1.0, 1.0, 1.0, 0)
    sizes = [(16 << 20) + i for i in range(MAX_TRIALS + 1)]
    for n in sizes:
        choice.write(n, host.kernel)
    assert len(choice.trials()) == MAX_TRIALS
    assert host.kinds == [True] * MAX_TRIALS + [stores.large_rule(sizes[-1])]
    choice._lock = lock = CountingLock()  # type: ignore[assignment]
    for _ in range(3):
        choice.write(sizes[-1], host.kernel)
    assert lock.taken == 0 and host.kinds[-3:] == [stores.large_rule(sizes[-1])] * 3


def test_the_choice_comes_after_a_pair_of_blocks():
    """Ordinary timings that all faulted in the first pair: the second pair's ordinary
    block gives them, and its streaming block still runs before them (both kinds'
    timings from one pair of blocks, side by side)."""
    nbytes = 64 << 20
    trial = StoreTrial(nbytes)
    first = sum(block(nbytes, True)) + faulting_block(nbytes, False)
    drive(trial, {True: 1.0, False: 2.0}, {True: 0, False: 5}, first)
    assert trial.streaming is None and len(trial.seconds[True]) >= SAMPLES
    seen = drive(trial, {True: 1.0, False: 2.0}, {True: 0, False: 0}, pair(nbytes))
    assert seen[0] == (True, False) and seen[-1] == (False, True)
    assert trial.streaming is True


def test_a_choice_is_tried_again_after_retrial_bytes(monkeypatch):
    """The host changes: after RETRIAL_BYTES written with the first choice (ordinary), a
    second trial runs and, streaming stores now timed faster, changes it."""
    nbytes = 64 << 20
    monkeypatch.setattr(stores, "RETRIAL_BYTES", 10 * nbytes)
    choice = StoreChoice("auto")
    host = Host(monkeypatch, choice, ordinary=1.0, streaming=2.0, slow=1.0, recovery=0)
    for _ in range(pair(nbytes)):
        choice.write(nbytes, host.kernel)
    assert choice.trials()[0]["choices"] == ["ordinary"] and not choice.streams(nbytes)
    host.cost[True] = 0.5
    for _ in range(9):  # still the first choice, RETRIAL_BYTES not yet written
        choice.write(nbytes, host.kernel)
    assert choice.trials()[0]["choice"] == "ordinary"
    for _ in range(1 + pair(nbytes)):
        choice.write(nbytes, host.kernel)
    [trial] = choice.trials()
    assert trial["choices"] == ["ordinary", "streaming"] and choice.streams(nbytes)


@pytest.mark.parametrize("policy", ["always", "never"])
def test_the_loader_kernels_write_the_same_values_under_either_policy(monkeypatch, policy):
    """The fused Datum kernel and the array kernel, small batches forced to streaming
    stores or large-batch rules off: the values are the reference conversion."""
    import loaders.stores
    from lmdbio.codecs.datum import datum_from_array, encode_datum
    from lmdbio.codecs.record_batch import pack_values
    from loaders.decode import datum_spans
    from loaders.transform import DataTransformer, TransformDraw

    monkeypatch.setattr(loaders.stores, "STORES", StoreChoice(policy))
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (4, 3, 17, 23), dtype=np.uint8)
    buf, offsets, _ = pack_values([encode_datum(datum_from_array(x, i))
                                   for i, x in enumerate(images)])
    starts = np.asarray(offsets, np.int64)
    lengths = np.diff(np.r_[starts, buf.size]).astype(np.int64)
    t = DataTransformer(scale=0.25)
    want = images.astype(np.float32) * np.float32(0.25)
    got, labels = t.datums(buf, datum_spans(buf, starts, lengths))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(labels, np.arange(4))
    zeros = np.zeros(4, np.int64)
    draw = TransformDraw(zeros, zeros, np.zeros(4, bool))
    np.testing.assert_array_equal(t(images, draw=draw), want)
