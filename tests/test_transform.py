"""Caffe's DataTransformer on batches, checked against a direct per-pixel transcription of
Caffe's loop (``DataTransformer<Dtype>::Transform(const Datum&, Dtype*)``) for every
combination of options, with the same per-image decisions."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from lmdbio.codecs.binaryproto import write_mean_file
from lmdbio.config import load_config
from lmdbio.errors import ConfigError
from loaders.transform import DataTransformer, TransformDraw, transform_rng


def caffe_reference(datum: np.ndarray, *, crop_size: int, scale: float, mean_file, mean_values,
                    do_mirror: bool, h_off: int, w_off: int) -> np.ndarray:
    """Caffe's loop, one image, one pixel at a time, float32 arithmetic (Dtype = float)."""
    C, H, W = datum.shape
    flat = datum.reshape(-1)
    height, width = (crop_size, crop_size) if crop_size else (H, W)
    mean_values = list(mean_values)
    if len(mean_values) == 1 and C > 1:
        mean_values = mean_values * C
    top = np.zeros(C * height * width, np.float32)
    sc = np.float32(scale)
    mflat = None if mean_file is None else mean_file.reshape(-1)
    for c in range(C):
        for h in range(height):
            for w in range(width):
                data_index = (c * H + h_off + h) * W + w_off + w
                if do_mirror:
                    top_index = (c * height + h) * width + (width - 1 - w)
                else:
                    top_index = (c * height + h) * width + w
                element = np.float32(flat[data_index])
                if mflat is not None:
                    top[top_index] = (element - np.float32(mflat[data_index])) * sc
                elif mean_values:
                    top[top_index] = (element - np.float32(mean_values[c])) * sc
                else:
                    top[top_index] = element * sc
    return top.reshape(C, height, width)


def _caffe_decisions(t: DataTransformer, n: int, H: int, W: int, rng):
    """What the transformer should decide, restated from Caffe's rules."""
    d = t.draw(n, H, W, rng)
    if not t.mirror:
        assert not d.mirror.any()
    if t.crop_size and t.phase == "test":
        assert (d.h_off == (H - t.crop_size) // 2).all()
        assert (d.w_off == (W - t.crop_size) // 2).all()
    if t.crop_size:
        assert (d.h_off >= 0).all() and (d.h_off <= H - t.crop_size).all()
        assert (d.w_off >= 0).all() and (d.w_off <= W - t.crop_size).all()
    else:
        assert (d.h_off == 0).all() and (d.w_off == 0).all()
    return d


@pytest.mark.parametrize(
    ("dtype", "crop", "mirror", "phase", "mean", "scale"),
    list(itertools.product(["uint8", "float32"], [0, 3, 5], [False, True], ["train", "test"],
                           ["none", "values1", "valuesC", "file"], [1.0, 0.00390625, -2.5])),
)
def test_matches_caffes_loop(dtype, crop, mirror, phase, mean, scale):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, crop, mirror, phase, mean, scale))
                                           .encode()))
    N, C, H, W = 5, 3, 6, 7
    if dtype == "uint8":
        batch = rng.integers(0, 256, (N, C, H, W), dtype=np.uint8)
    else:
        batch = (rng.standard_normal((N, C, H, W)) * 40).astype(np.float32)
    mean_file = (rng.random((C, H, W)) * 255).astype(np.float32) if mean == "file" else None
    mean_values = {"none": (), "values1": (117.3,), "valuesC": (104.0, 117.0, 123.5),
                   "file": ()}[mean]
    t = DataTransformer(scale=scale, mean_values=mean_values, mean_file=mean_file,
                        crop_size=crop, mirror=mirror, phase=phase)
    draw = _caffe_decisions(t, N, H, W, transform_rng(7, 1, 2, 0))
    out = t(batch, draw=draw)
    assert out.dtype == np.float32 and out.shape == (N, C, crop or H, crop or W)
    for i in range(N):
        ref = caffe_reference(batch[i], crop_size=crop, scale=scale, mean_file=mean_file,
                              mean_values=mean_values, do_mirror=bool(draw.mirror[i]),
                              h_off=int(draw.h_off[i]), w_off=int(draw.w_off[i]))
        np.testing.assert_array_equal(out[i], ref)  # bit-exact float32
    # drawing from the same generator state gives the same batch
    again = t(batch, transform_rng(7, 1, 2, 0))
    np.testing.assert_array_equal(again, out)


def test_mirror_is_random_in_both_phases_and_crops_centre_in_test():
    """Caffe: ``do_mirror = param_.mirror() && Rand(2)`` whatever the phase."""
    for phase in ("train", "test"):
        t = DataTransformer(mirror=True, crop_size=4, phase=phase)
        d = t.draw(400, 10, 12, transform_rng(0, 0, 0, 0))
        assert 120 < d.mirror.sum() < 280  # about half of 400
        if phase == "test":
            assert set(d.h_off.tolist()) == {3} and set(d.w_off.tolist()) == {4}
        else:
            assert set(d.h_off.tolist()) == set(range(7))
            assert set(d.w_off.tolist()) == set(range(9))


def test_decisions_are_a_function_of_seed_epoch_iteration_rank():
    t = DataTransformer(mirror=True, crop_size=2)

    def decide(*key):
        d = t.draw(64, 9, 9, transform_rng(*key))
        return (d.h_off.tolist(), d.w_off.tolist(), d.mirror.tolist())

    assert decide(1, 2, 3, 4) == decide(1, 2, 3, 4)
    others = [decide(2, 2, 3, 4), decide(1, 3, 3, 4), decide(1, 2, 4, 4), decide(1, 2, 3, 5)]
    assert all(o != decide(1, 2, 3, 4) for o in others)


def test_identity_and_a_mirror_by_hand():
    x = np.arange(2 * 1 * 2 * 3, dtype=np.uint8).reshape(2, 1, 2, 3)
    t = DataTransformer()
    assert t.is_identity
    np.testing.assert_array_equal(t(x), x.astype(np.float32))
    d = TransformDraw(np.zeros(2, np.int64), np.zeros(2, np.int64), np.array([True, False]))
    out = DataTransformer(mirror=True)(x, draw=d)
    np.testing.assert_array_equal(out[0, 0], [[2, 1, 0], [5, 4, 3]])
    np.testing.assert_array_equal(out[1, 0], [[6, 7, 8], [9, 10, 11]])


def test_mean_file_is_subtracted_at_the_crop_offset(tmp_path):
    x = np.zeros((1, 1, 4, 4), np.uint8)
    mean = np.arange(16, dtype=np.float32).reshape(1, 4, 4)
    path = tmp_path / "mean.binaryproto"
    write_mean_file(path, mean)
    t = DataTransformer(mean_file=path, crop_size=2, phase="test")
    out = t(x)
    np.testing.assert_array_equal(out[0, 0], -mean[0, 1:3, 1:3])


def test_from_config_and_checks(tmp_path):
    mean = np.ones((3, 8, 8), np.float32)
    path = tmp_path / "m.binaryproto"
    write_mean_file(path, mean)
    cfg = load_config({"dataset": {"path": "/x"},
                       "transform": {"mean_file": str(path), "crop_size": 4, "scale": 0.5}})
    t = DataTransformer.from_config(cfg.transform)
    assert t.crop_size == 4 and t.scale == np.float32(0.5) and t.mean.shape == (3, 8, 8)
    x = np.full((2, 3, 8, 8), 3, np.uint8)
    np.testing.assert_array_equal(t(x, transform_rng(0, 0, 0, 0)), np.ones((2, 3, 4, 4)))
    with pytest.raises(ConfigError, match="mean_file holds a"):
        t(np.zeros((1, 3, 9, 9), np.uint8), transform_rng(0, 0, 0, 0))
    with pytest.raises(ConfigError, match="larger than"):
        DataTransformer(crop_size=9)(np.zeros((1, 1, 8, 8), np.uint8), transform_rng(0, 0, 0, 0))
    with pytest.raises(ConfigError, match="either 1 or as many as channels: 3"):
        DataTransformer(mean_values=(1, 2))(np.zeros((1, 3, 4, 4), np.uint8))
    with pytest.raises(ConfigError, match="at the same time"):
        DataTransformer(mean_values=(1,), mean_file=mean)
    with pytest.raises(ConfigError, match="needs a numpy Generator"):
        DataTransformer(mirror=True)(np.zeros((1, 1, 2, 2), np.uint8))
    with pytest.raises(ConfigError, match="expected"):
        DataTransformer()(np.zeros((2, 2), np.uint8))


def test_out_parameter_and_no_per_call_allocation_of_the_result():
    x = np.random.default_rng(0).integers(0, 256, (4, 3, 10, 10), dtype=np.uint8)
    t = DataTransformer(crop_size=8, mirror=True, mean_values=(5,), scale=2.0)
    out = np.empty((4, 3, 8, 8), np.float32)
    res = t(x, transform_rng(1, 0, 0, 0), out=out)
    assert res is out
    np.testing.assert_array_equal(out, t(x, transform_rng(1, 0, 0, 0)))
    with pytest.raises(ConfigError, match="out must be"):
        t(x, transform_rng(1, 0, 0, 0), out=np.empty((4, 3, 10, 10), np.float32))


@pytest.mark.parametrize(("crop", "mean", "dtype"), list(itertools.product(
    [0, 4], ["none", "values", "file"], ["uint8", "float64"])))
def test_array_api_path_equals_the_compiled_kernel(crop, mean, dtype):
    """transform_batch (the xp = numpy / cupy path) and the fused CPU kernel agree bit for
    bit, so the GPU path computes what the tested CPU path computes."""
    from loaders.transform import transform_batch

    rng = np.random.default_rng(11)
    batch = (rng.random((6, 3, 7, 9)) * 255).astype(dtype)
    mean_file = (rng.random((3, 7, 9)) * 255).astype(np.float32) if mean == "file" else None
    means = (10.5, 20.0, 30.25) if mean == "values" else ()
    t = DataTransformer(scale=0.5, mean_values=means, mean_file=mean_file, crop_size=crop,
                        mirror=True)
    d = t.draw(6, 7, 9, transform_rng(3, 0, 0, 0))
    kernel = t(batch, draw=d)
    xp_path = transform_batch(batch, d, crop_size=crop, scale=t.scale, mean=mean_file,
                              mean_values=np.asarray(means, np.float32) if means else None)
    np.testing.assert_array_equal(kernel, xp_path)


def _datum_buffer(images: np.ndarray, labels: list[int], rng, *, gap: int = 11):
    """Caffe Datum records of ``images`` back to back with ``gap`` junk bytes between them
    (records anywhere in a buffer, as spans of a mapping are): (buffer, starts, lengths)."""
    from lmdbio.codecs.datum import datum_from_array, encode_datum

    parts, starts, lengths, at = [], [], [], 0
    for img, label in zip(images, labels, strict=True):
        junk = rng.integers(0, 256, gap, dtype=np.uint8).tobytes()
        rec = encode_datum(datum_from_array(img, label))
        parts += [junk, rec]
        starts.append(at + gap)
        lengths.append(len(rec))
        at += gap + len(rec)
    return (np.frombuffer(b"".join(parts), np.uint8), np.array(starts, np.int64),
            np.array(lengths, np.int64))


@pytest.mark.parametrize(
    ("crop", "mirror", "phase", "mean", "scale"),
    list(itertools.product([0, 3, 7], [False, True], ["train", "test"],
                           ["none", "values1", "valuesC", "file"], [1.0, 0.00390625])),
)
def test_datums_straight_from_their_bytes_match_caffes_loop(crop, mirror, phase, mean, scale):
    """``DataTransformer.datums``: Datum bytes -> the transformed batch in one kernel,
    checked pixel by pixel against Caffe's loop (not against the array kernel)."""
    from loaders.decode import datum_spans

    rng = np.random.default_rng(zlib.crc32(repr((crop, mirror, phase, mean, scale)).encode()))
    N, C, H, W = 6, 3, 7, 9
    images = rng.integers(0, 256, (N, C, H, W), dtype=np.uint8)
    labels = [int(x) for x in rng.integers(-3, 1000, N)]
    buf, starts, lengths = _datum_buffer(images, labels, rng)
    mean_file = (rng.random((C, H, W)) * 255).astype(np.float32) if mean == "file" else None
    mean_values = {"none": (), "values1": (117.3,), "valuesC": (104.0, 117.0, 123.5),
                   "file": ()}[mean]
    t = DataTransformer(scale=scale, mean_values=mean_values, mean_file=mean_file,
                        crop_size=crop, mirror=mirror, phase=phase)
    spans = datum_spans(buf, starts, lengths)
    assert spans is not None and spans.shape == (C, H, W)
    out, got_labels = t.datums(buf, spans, transform_rng(3, 0, 5, 1))
    draw = t.draw(N, H, W, transform_rng(3, 0, 5, 1))  # the same decisions, drawn again
    assert out.shape == (N, C, crop or H, crop or W) and out.dtype == np.float32
    assert got_labels.tolist() == labels
    for i in range(N):
        ref = caffe_reference(images[i], crop_size=crop, scale=scale, mean_file=mean_file,
                              mean_values=mean_values, do_mirror=bool(draw.mirror[i]),
                              h_off=int(draw.h_off[i]), w_off=int(draw.w_off[i]))
        np.testing.assert_array_equal(out[i], ref)  # bit-exact float32


@pytest.mark.parametrize(("crop", "mirror", "mean"), list(itertools.product(
    [0, 35], [False, True], ["none", "valuesC", "file"])))
def test_streaming_stores_give_caffes_values(crop, mirror, mean, monkeypatch):
    """Batches too large for the cache are written with non-temporal stores, 16 values a
    cache line (mirrored rows reversed in registers): forced here on images whose rows
    and planes start at every alignment, both kernels give Caffe's values bit for bit."""
    import loaders.stores
    from loaders.decode import datum_spans

    monkeypatch.setattr(loaders.stores, "STORES", loaders.stores.StoreChoice("always"))
    rng = np.random.default_rng(zlib.crc32(repr((crop, mirror, mean)).encode()))
    N, C, H, W = 6, 3, 40, 53  # odd widths: runs of 35 and 53 values at any alignment
    images = rng.integers(0, 256, (N, C, H, W), dtype=np.uint8)
    buf, starts, lengths = _datum_buffer(images, list(range(N)), rng)
    mean_file = (rng.random((C, H, W)) * 255).astype(np.float32) if mean == "file" else None
    mean_values = (104.0, 117.0, 123.5) if mean == "valuesC" else ()
    t = DataTransformer(scale=0.017, mean_values=mean_values, mean_file=mean_file,
                        crop_size=crop, mirror=mirror, phase="train")
    fused, _ = t.datums(buf, datum_spans(buf, starts, lengths), transform_rng(0, 2, 3, 0))
    # the array kernel, into an output shifted off 64-byte alignment
    shape = (N, C, crop or H, crop or W)
    shifted = np.empty(int(np.prod(shape)) + 3, np.float32)[3:].reshape(shape)
    batch = t(images, rng=transform_rng(0, 2, 3, 0), out=shifted)
    draw = t.draw(N, H, W, transform_rng(0, 2, 3, 0))
    assert len(set(draw.mirror.tolist())) == (2 if mirror else 1)  # mirrored and not
    for i in range(N):
        ref = caffe_reference(images[i], crop_size=crop, scale=0.017, mean_file=mean_file,
                              mean_values=mean_values, do_mirror=bool(draw.mirror[i]),
                              h_off=int(draw.h_off[i]), w_off=int(draw.w_off[i]))
        np.testing.assert_array_equal(fused[i], ref)
        np.testing.assert_array_equal(batch[i], ref)


def test_datums_give_up_on_a_record_of_another_kind():
    """A record of another shape, an encoded one or a broken one: ``None`` (the loader then
    decodes that batch on the general path, which explains the record), never a read past
    the record."""
    from lmdbio.codecs.datum import datum_from_array, encode_datum
    from loaders.decode import DatumSpans, datum_spans

    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (4, 3, 5, 5), dtype=np.uint8)
    buf, starts, lengths = _datum_buffer(images, [0, 1, 2, 3], rng)
    t = DataTransformer(scale=0.5)
    spans = datum_spans(buf, starts, lengths)
    assert t.datums(buf, spans) is not None
    other = np.frombuffer(encode_datum(datum_from_array(images[0][:, :4], 1)), np.uint8)
    mixed = np.concatenate([buf, other])
    s2 = np.append(starts, buf.size)
    l2 = np.append(lengths, other.size)
    assert t.datums(mixed, DatumSpans(s2, l2, spans.shape)) is None  # a 3x4x5 image
    cut = lengths.copy()
    cut[2] -= 7  # the last pixels of record 2 fall outside its record
    assert t.datums(buf, DatumSpans(starts, cut, spans.shape)) is None
    assert datum_spans(buf, starts[:1], cut[:1] - 80) is None  # first record broken
