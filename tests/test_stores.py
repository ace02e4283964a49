"""loaders.stores: the store kind for float32 batches, a setting (LMDBIO_STREAMING_STORES)
whose default, ``auto``, times both kinds on the job's own batches."""

from __future__ import annotations

import numpy as np
import pytest

import loaders.stores as stores
from loaders.stores import (
    MAX_TRIAL_BYTES,
    MIN_BYTES,
    SAMPLES,
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


def drive(trial: StoreTrial, seconds: dict[bool, float], faults: dict[bool, int],
          batches: int) -> list[tuple[bool, bool]]:
    """``batches`` batches of ``trial``: the (streaming, timed) of each; a timed one records
    ``seconds[kind]`` and ``faults[kind]``."""
    seen = []
    for _ in range(batches):
        streaming, timed = trial.next_batch()
        seen.append((streaming, timed))
        if timed:
            trial.record(streaming, seconds[streaming], faults[streaming])
    return seen


def block_batches(nbytes: int, warm: int) -> int:
    """Batches of ``nbytes`` in a trial block whose warm-up is ``warm`` bytes."""
    return -(-(warm + TIMED_BYTES) // nbytes)


@pytest.mark.parametrize("streaming_wins", [True, False])
def test_a_trial_times_each_kind_after_its_warm_up_and_keeps_the_faster(streaming_wins):
    nbytes = 64 << 20
    ordinary, streaming = block_batches(nbytes, WARM_BYTES), block_batches(nbytes, 1)
    trial = StoreTrial(nbytes)
    fast, slow = 1.0, 1.5
    seen = drive(trial, {True: fast if streaming_wins else slow,
                         False: slow if streaming_wins else fast}, {True: 0, False: 0},
                 ordinary + streaming + 5)
    # an ordinary block, timed after WARM_BYTES; then a streaming one, after one batch
    warm = WARM_BYTES // nbytes
    assert seen[:ordinary] == [(False, False)] * warm + [(False, True)] * (ordinary - warm)
    assert seen[ordinary:ordinary + streaming] == \
        [(True, False)] + [(True, True)] * (streaming - 1)
    assert min(ordinary - warm, streaming - 1) >= SAMPLES  # one pair decides here
    # then the choice, for every later batch, untimed
    assert trial.streaming is streaming_wins
    assert seen[ordinary + streaming:] == [(streaming_wins, False)] * 5
    assert trial.as_dict()["choice"] == ("streaming" if streaming_wins else "ordinary")


def test_timings_with_page_faults_do_not_count():
    """A block whose streaming batches all faulted gives no streaming timings: the trial
    goes on (a second pair of blocks), and the faulting batches' times never decide."""
    nbytes = 64 << 20
    pair = block_batches(nbytes, WARM_BYTES) + block_batches(nbytes, 1)
    trial = StoreTrial(nbytes)
    drive(trial, {True: 0.1, False: 1.0}, {True: 3, False: 0}, pair + 1)
    assert trial.streaming is None and trial.seconds[True] == []
    assert len(trial.seconds[False]) >= SAMPLES
    drive(trial, {True: 2.0, False: 1.0}, {True: 0, False: 0}, pair)
    trial.next_batch()
    assert trial.streaming is False  # the clean streaming timings were the slower ones


def test_a_trial_that_never_gets_clean_timings_falls_back_to_the_size_rule():
    nbytes = 64 << 20
    trial = StoreTrial(nbytes)
    drive(trial, {True: 1.0, False: 1.0}, {True: 1, False: 1}, MAX_TRIAL_BYTES // nbytes + 1)
    assert trial.streaming is stores.large_rule(nbytes) is True


def test_auto_writes_small_batches_with_ordinary_stores_untimed(monkeypatch):
    choice = StoreChoice("auto")
    kinds = [choice.write(TRIAL_MIN_BYTES - 1, lambda streaming: streaming) for _ in range(3)]
    assert kinds == [False] * 3 and choice.trials() == []


def test_auto_times_the_kernel_on_its_own_thread_and_keeps_the_faster_kind(monkeypatch):
    """StoreChoice.write under ``auto``: the kernel's CPU time (a fake thread clock the
    kernel advances: ordinary batches cost half) decides, and the choice then holds for
    that output size only."""
    clock = [0.0]
    monkeypatch.setattr(stores.time, "thread_time", lambda: clock[0])
    monkeypatch.setattr(stores, "page_faults", lambda: 0)
    choice = StoreChoice("auto")
    nbytes = 64 << 20

    def kernel(streaming: bool) -> str:
        clock[0] += 2.0 if streaming else 1.0
        return "wrote"

    ordinary = block_batches(nbytes, WARM_BYTES)
    kinds = []
    for _ in range(ordinary + block_batches(nbytes, 1) + 3):
        assert choice.write(nbytes, lambda s: (kinds.append(s), kernel(s))[1]) == "wrote"
    assert kinds[:ordinary] == [False] * ordinary
    assert kinds[-3:] == [False] * 3 and not choice.streams(nbytes)
    [trial] = choice.trials()
    assert trial["choice"] == "ordinary" and trial["median_us"] == {"ordinary": 1e6,
                                                                   "streaming": 2e6}
    assert choice.streams(nbytes + 1)  # another size: undecided, under the size rule


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


@pytest.mark.parametrize(("streaming_seconds", "streaming_wins"), [(0.97, False), (0.90, True)])
def test_streaming_stores_must_win_by_the_margin(streaming_seconds, streaming_wins):
    """A tie (streaming 3 % faster: within stores.MARGIN) keeps ordinary stores."""
    assert stores.faster_kind([1.0] * SAMPLES, [streaming_seconds] * SAMPLES) is streaming_wins


def test_a_choice_is_tried_again_after_retrial_bytes(monkeypatch):
    """The host changes: after RETRIAL_BYTES written with the first choice (ordinary), a
    second trial runs and, streaming stores now timed faster, changes it."""
    clock = [0.0]
    cost = {False: 1.0, True: 2.0}
    monkeypatch.setattr(stores.time, "thread_time", lambda: clock[0])
    monkeypatch.setattr(stores, "page_faults", lambda: 0)
    nbytes = 64 << 20
    monkeypatch.setattr(stores, "RETRIAL_BYTES", 10 * nbytes)
    choice = StoreChoice("auto")
    pair = block_batches(nbytes, WARM_BYTES) + block_batches(nbytes, 1)

    def kernel(streaming: bool) -> None:
        clock[0] += cost[streaming]

    for _ in range(pair + 1):
        choice.write(nbytes, kernel)
    assert choice.trials()[0]["choices"] == ["ordinary"] and not choice.streams(nbytes)
    cost[True] = 0.5
    for _ in range(9):  # still the first choice, RETRIAL_BYTES not yet written
        choice.write(nbytes, kernel)
    assert choice.trials()[0]["choice"] == "ordinary"
    for _ in range(1 + pair + 1):
        choice.write(nbytes, kernel)
    [trial] = choice.trials()
    assert trial["choices"] == ["ordinary", "streaming"] and choice.streams(nbytes)
