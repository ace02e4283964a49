"""loaders.stores: the store kind for float32 batches, a setting (LMDBIO_STREAMING_STORES)."""

from __future__ import annotations

import numpy as np
import pytest

from loaders.stores import MIN_BYTES, StoreChoice, policy_from_env


def test_the_policies():
    large = StoreChoice("large")
    assert large.streams(MIN_BYTES) and not large.streams(MIN_BYTES - 1)
    assert StoreChoice("always").streams(1) and not StoreChoice("never").streams(1 << 40)
    with pytest.raises(ValueError, match=r"LMDBIO_STREAMING_STORES.*always"):
        StoreChoice("sometimes")  # type: ignore[arg-type]


def test_the_policy_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("LMDBIO_STREAMING_STORES", raising=False)
    assert policy_from_env() == "large"
    monkeypatch.setenv("LMDBIO_STREAMING_STORES", " Never ")
    assert policy_from_env() == "never"
    monkeypatch.setenv("LMDBIO_STREAMING_STORES", "auto")
    with pytest.raises(ValueError, match="expected one of large, always, never, got 'auto'"):
        StoreChoice(policy_from_env())  # type: ignore[arg-type]


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
