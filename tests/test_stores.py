"""loaders.stores: the store kind for large float32 batches, chosen by measurement."""

from __future__ import annotations

import numpy as np
import pytest

from loaders.stores import StoreChoice, faster_is_streaming

BIG = 32 << 20


def trial(choice: StoreChoice, per_byte: dict[bool, float], batches: int) -> list[bool]:
    """``batches`` large batches through ``choice``, each 'taking' ``per_byte[kind]`` seconds
    a byte; the kinds used, in order."""
    used = []
    for _ in range(batches):
        kind = choice.streams(BIG)
        used.append(kind)
        choice.record(kind, BIG, per_byte[kind] * BIG)
    return used


@pytest.mark.parametrize("streaming_wins", [True, False])
def test_the_trials_alternate_then_keep_the_faster_kind(streaming_wins):
    choice = StoreChoice("auto", trials=3)
    per_byte = {True: 1e-10 if streaming_wins else 3e-10, False: 2e-10}
    used = trial(choice, per_byte, 10)
    assert used[:6] == [False, True, False, True, False, True]  # ordinary first, alternating
    assert choice.chosen is streaming_wins
    assert used[6:] == [streaming_wins] * 4


def test_one_slow_trial_does_not_decide():
    """The first batch of each kind may carry a compile or fresh pages: medians, not means."""
    choice = StoreChoice("auto", trials=3)
    times = iter([50e-10, 2e-10, 1e-10, 2e-10, 1e-10, 2e-10])  # ordinary's first is slow
    for _ in range(6):
        kind = choice.streams(BIG)
        choice.record(kind, BIG, next(times) * BIG)
    assert choice.chosen is False  # ordinary: median 1e-10 against streaming's 2e-10


def test_small_batches_take_ordinary_stores_and_are_not_timed():
    choice = StoreChoice("auto", trials=1, min_bytes=BIG)
    assert choice.streams(BIG - 1) is False
    choice.record(False, BIG - 1, 1.0)
    assert choice.timed == {False: [], True: []} and choice.chosen is None


def test_fixed_policies_and_a_bad_one():
    assert StoreChoice("always").streams(1) is True  # also below the size: a test forces it
    assert StoreChoice("never").streams(BIG) is False
    with pytest.raises(ValueError, match=r"LMDBIO_STREAMING_STORES.*always"):
        StoreChoice("sometimes")  # type: ignore[arg-type]


def test_a_tie_keeps_ordinary_stores():
    assert faster_is_streaming([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) is False
    assert faster_is_streaming([1.0, 2.0, 3.0], [1.9, 1.0, 5.0]) is True


def test_run_times_the_trials_and_gives_the_write_result():
    choice = StoreChoice("auto", trials=2)
    kinds = [choice.run(BIG, lambda streaming: streaming) for _ in range(6)]
    assert kinds[:4] == [False, True, False, True]
    assert choice.chosen is not None and kinds[4:] == [choice.chosen] * 2


def test_the_loader_kernels_write_the_same_values_while_the_choice_is_made(monkeypatch):
    """A batch above the size through the Datum kernel: every trial, of either kind, and the
    batches after the choice equal the reference conversion."""
    import loaders.stores
    from lmdbio.codecs.datum import datum_from_array, encode_datum
    from lmdbio.codecs.record_batch import pack_values
    from loaders.decode import datum_spans
    from loaders.transform import DataTransformer

    choice = StoreChoice("auto", trials=2, min_bytes=1 << 10)
    monkeypatch.setattr(loaders.stores, "STORES", choice)
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (4, 3, 17, 23), dtype=np.uint8)
    buf, offsets, _ = pack_values([encode_datum(datum_from_array(x, i))
                                   for i, x in enumerate(images)])
    starts = np.asarray(offsets, np.int64)
    lengths = np.diff(np.r_[starts, buf.size]).astype(np.int64)
    t = DataTransformer(scale=0.25)
    for _ in range(6):
        got, labels = t.datums(buf, datum_spans(buf, starts, lengths))
        np.testing.assert_array_equal(got, images.astype(np.float32) * np.float32(0.25))
        np.testing.assert_array_equal(labels, np.arange(4))
    assert choice.chosen is not None
    assert len(choice.timed[False]) == len(choice.timed[True]) == 2


def test_a_call_that_wrote_nothing_is_not_a_trial():
    """A kernel that returns after parsing (a record that does not fit) took no store time:
    counting it would make its kind look fast."""
    choice = StoreChoice("auto", trials=1)
    assert choice.run(BIG, lambda streaming: 7, wrote=lambda bad: bad < 0) == 7
    assert choice.timed == {False: [], True: []} and choice.pending == {False: 0, True: 0}
    with pytest.raises(RuntimeError):
        choice.run(BIG, lambda streaming: (_ for _ in ()).throw(RuntimeError("bad")))
    assert choice.pending == {False: 0, True: 0}
    choice.run(BIG, lambda streaming: -1, wrote=lambda bad: bad < 0)
    assert len(choice.timed[False]) == 1 and choice.chosen is None


def test_two_threads_share_the_trials_and_agree_on_one_choice():
    """The decoding thread and the trainer's thread both write batches: trials handed out
    at the same time go to different kinds, and the choice is made once."""
    import threading

    choice = StoreChoice("auto", trials=3)
    barrier = threading.Barrier(2)
    seen: list[bool] = []

    def write(streaming: bool) -> bool:
        seen.append(streaming)
        return streaming

    def worker() -> None:
        barrier.wait()
        for _ in range(20):
            choice.run(BIG, write)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert choice.chosen is not None
    assert len(choice.timed[False]) >= 3 and len(choice.timed[True]) >= 3
    assert choice.pending == {False: 0, True: 0}
    assert seen.count(True) >= 3 and seen.count(False) >= 3
    assert set(seen[-10:]) == {choice.chosen}
