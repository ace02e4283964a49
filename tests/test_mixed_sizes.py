"""Image folders of several sizes (issue 36, point 5), from conversion to batches.

``lmdbio convert`` measures a folder before writing anything and asks for a choice
(``--resize`` or ``--keep-sizes``, and for PCR ``--color``/``--gray`` when grey and colour
images are mixed), naming the first odd image; the loader then reads images of several sizes
as Caffe's data layer does (each cropped on its own to ``crop_size``, refused with the record
named otherwise); PCR batches come out transformed as one array, and ``batch.size`` counts
images (rows) for every layout. Real photographs: the two scikit-learn bundles, cut to
several sizes; checked pixel by pixel against Caffe's loop (``tests/test_transform.py``).
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import loaders
from bench.lmdbgen import write_db
from lmdbio.codecs.datum import datum_from_array, decode_datum, encode_datum
from lmdbio.errors import ConfigError, LmdbioError, RecordError
from loaders.transform import DataTransformer, transform_rng
from tests.test_transform import _datum_buffer, caffe_reference

#: (height, width) of the cuts: three share the first size, the rest differ; 33x47 is the
#: smallest (the largest crop every image allows: 33)
SIZES = [(40, 50), (64, 44), (40, 50), (35, 60), (50, 50), (33, 47), (40, 50), (70, 36)]


def _photo(i: int) -> np.ndarray:
    from sklearn.datasets import load_sample_image

    return load_sample_image("china.jpg" if i % 2 else "flower.jpg")


def _folder(root: Path, sizes=SIZES, *, grey=(), fmt="png", quality=92) -> dict[str, np.ndarray]:
    """Class folders ``a``/``b`` of photo cuts of ``sizes`` (``grey``: indices saved as
    one-channel images); returns the pixels of each file as Pillow reads it, by name."""
    out = {}
    for i, (h, w) in enumerate(sizes):
        d = root / ("a" if i % 2 else "b")
        d.mkdir(parents=True, exist_ok=True)
        cut = _photo(i)[17 * i:17 * i + h, 23 * i:23 * i + w]
        im = Image.fromarray(np.ascontiguousarray(cut))
        if i in grey:
            im = im.convert("L")
        name = f"{i:02d}.{fmt}"
        im.save(d / name, quality=quality)
        out[f"{d.name}/{name}"] = np.asarray(Image.open(d / name))
    return out


def _convert(src, dst, layout, *options) -> dict:
    """``lmdbio convert SRC DST --layout LAYOUT OPTIONS...`` through the layout's own options
    and converter (what the command runs); its errors raise."""
    import argparse

    from lmdbio.convert import load_layout

    module = load_layout(layout)
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args([str(x) for x in options])
    args.overwrite, args.format_version = False, 1
    return module.convert(str(src), str(dst), args)


def _config(path, layout="caffe-datum", size=4, last="pad", **transform):
    return {"dataset": {"path": str(path), "layout": layout},
            "batch": {"size": size, "last": last},
            "readers": {"strategy": "indexed"}, "shuffle": {"seed": 5},
            "metrics": {"every": 0}, "workers": {"device": "cpu"},
            "transform": transform}


def _items(path) -> dict[bytes, bytes]:
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def _expected(t: DataTransformer, images: list[np.ndarray], rng) -> np.ndarray:
    """Caffe's loop on each image with the batch's decisions: mirror flags, and crop offsets
    for the image's own size (``floor(u * (side - crop + 1))`` of the draw's uniform
    variates in train, the centre in test)."""
    crop = t.crop_size
    d = t.draw(len(images), crop, crop, rng)
    out = []
    for i, img in enumerate(images):
        _, h, w = img.shape
        if t.phase == "train":
            ho, wo = int(d.h_u[i] * (h - crop + 1)), int(d.w_u[i] * (w - crop + 1))
        else:
            ho, wo = (h - crop) // 2, (w - crop) // 2
        out.append(caffe_reference(img, crop_size=crop, scale=float(t.scale), mean_file=None,
                                   mean_values=tuple(t.mean_values.tolist()),
                                   do_mirror=bool(d.mirror[i]), h_off=ho, w_off=wo))
    return np.stack(out)


# ------------------------------------------------------------------ convert: a choice


@pytest.mark.parametrize("layout", ["caffe-datum", "tensor"])
def test_convert_stops_at_the_first_image_of_another_size(tmp_path, layout):
    _folder(tmp_path / "img")
    with pytest.raises(LmdbioError) as exc:
        _convert(tmp_path / "img", tmp_path / "db", layout)
    err = str(exc.value)
    # the first image (a/01.png) is 64x44; the first of another size is a/03.png, 35x60
    assert "a/03.png is 35x60" in err and "a/01.png 64x44" in err and "--resize H W" in err
    assert ("--keep-sizes" in err) == (layout == "caffe-datum")  # tensor records: one size
    assert "crop_size at most 33" in err or layout == "tensor"
    assert not (tmp_path / "db").exists()  # nothing written


def test_resize_or_keep_sizes(tmp_path):
    _folder(tmp_path / "img")
    _convert(tmp_path / "img", tmp_path / "r", "caffe-datum", "--resize", "36", "40")
    meta = json.loads((tmp_path / "r" / "lmdbio.json").read_text())
    assert meta["shape"] == [3, 36, 40] and not meta["shapes_vary"]
    summary = _convert(tmp_path / "img", tmp_path / "k", "caffe-datum", "--keep-sizes")
    assert summary["smallest_image"]["name"] == "a/05.png"
    meta = json.loads((tmp_path / "k" / "lmdbio.json").read_text())
    assert meta["shape"] is None and meta["shapes_vary"]
    assert meta["smallest_image"] == {"name": "a/05.png", "height": 33, "width": 47}
    assert meta["min_size"] == [33, 36]
    shapes = {decode_datum(v).shape for v in _items(tmp_path / "k").values()}
    assert shapes == {(3, h, w) for h, w in SIZES}


def test_a_grey_file_among_colour_ones_is_stored_in_colour_when_encoded(tmp_path):
    """``--encoded jpg`` keeps JPEG files byte for byte, except one whose channels are not
    the conversion's (Caffe would keep a grey JPEG grey, and its data layer then refuses
    the batch): it is re-encoded in colour, so the folder reads as one batch."""
    pixels = _folder(tmp_path / "img", [(30, 30)] * 4, grey={2}, fmt="jpg")
    _convert(tmp_path / "img", tmp_path / "db", "caffe-datum", "--encoded", "jpg")
    items = _items(tmp_path / "db")
    kept = [k for k, v in items.items()
            if bytes(decode_datum(v).data) == (tmp_path / "img" / k.decode()[9:]).read_bytes()]
    assert kept == [b"00000000_a/01.jpg", b"00000001_a/03.jpg", b"00000002_b/00.jpg"]
    grey = decode_datum(items[b"00000003_b/02.jpg"]).to_array("rgb")
    assert grey.shape == (3, 30, 30)
    np.testing.assert_allclose(grey.astype(float).mean(axis=(1, 2)),
                               pixels["b/02.jpg"].mean(), atol=2)  # still the grey picture
    with loaders.open(_config(tmp_path / "db", size=4)) as loader:
        (batch,) = list(loader)
    assert batch.data.shape == (4, 3, 30, 30)


# ------------------------------------------------- reading: Caffe's per-image crop


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A --keep-sizes Datum LMDB of photo cuts; their (C, H, W) BGR pixels by key."""
    root = tmp_path_factory.mktemp("mixed")
    _folder(root / "img")
    _convert(root / "img", root / "db", "caffe-datum", "--keep-sizes")
    return root / "db", {k: decode_datum(v).to_array() for k, v in _items(root / "db").items()}


@pytest.mark.parametrize("transfer", ["copy", "spans"])
@pytest.mark.parametrize(("phase", "mirror"), [("train", True), ("test", False),
                                               ("test", True)])
def test_mixed_sizes_are_cropped_each_as_caffe_crops_them(kept, transfer, phase, mirror):
    path, images = kept
    cfg = _config(path, size=4, crop_size=32, mirror=mirror, phase=phase, scale=0.5,
                  mean_values=[104, 117, 123])
    cfg["readers"]["transfer"] = transfer
    t = DataTransformer(crop_size=32, mirror=mirror, phase=phase, scale=0.5,
                        mean_values=(104, 117, 123))
    seen = 0
    with loaders.open(cfg) as loader:
        for batch in loader:
            assert isinstance(batch.data, np.ndarray) and batch.data.dtype == np.float32
            assert batch.data.shape == (4, 3, 32, 32) and len(batch) == 4
            rng = transform_rng(5, batch.epoch, batch.iteration, 0)
            want = _expected(t, [images[k] for k in batch.keys], rng)
            np.testing.assert_array_equal(batch.data, want)  # bit-exact float32
            seen += 4
    assert seen == len(images) == 8


def test_a_gpu_worker_reads_mixed_sizes_as_a_cpu_worker_does(kept, monkeypatch):
    """On a GPU worker (the stand-in of tests/fake_gpu.py) the records are decoded on the
    general path, a slot of two batches at once, and cropped on the host: the same batches
    as a CPU worker's compiled pass over the records' bytes."""
    from tests import fake_gpu

    path, _ = kept
    cfg = _config(path, size=4, crop_size=32, mirror=True, scale=0.5)
    cfg["readers"]["batches_per_slot"] = 2
    with loaders.open(cfg) as loader:
        cpu = [b.data.copy() for b in loader]
    fake_gpu.install(monkeypatch)
    cfg["workers"] = {"device": "auto"}
    with loaders.open(cfg) as loader:
        gpu = [fake_gpu.to_host(b.data) for b in loader]
    assert len(cpu) == len(gpu) == 2
    for a, b in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_fused_and_the_general_path_agree_on_mixed_sizes():
    """Raw Datums of several sizes: the compiled pass over their bytes
    (:meth:`DataTransformer.datums`) and decoding them (:func:`ragged_datum_batch`) then
    transforming (:meth:`DataTransformer.ragged`) give the same batch, with decisions from
    generators of the same seed."""
    from loaders.decode import datum_spans, ragged_datum_batch
    from loaders.transform import RaggedImages

    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (3, h, w), dtype=np.uint8) for h, w in SIZES]
    buf, starts, lengths = _datum_buffer(images, list(range(len(images))), rng)
    for phase, mirror in (("train", True), ("test", True), ("test", False)):
        t = DataTransformer(crop_size=30, mirror=mirror, phase=phase, scale=0.25)
        spans = datum_spans(buf, starts, lengths)
        fused = t.datums(buf, spans, transform_rng(1, 2, 3, 4))
        assert fused is not None
        ragged, labels, valid, errors = ragged_datum_batch(buf, starts, lengths, None, crop=30)
        assert isinstance(ragged, RaggedImages) and valid.all() and not errors
        general = t(ragged, transform_rng(1, 2, 3, 4))
        np.testing.assert_array_equal(fused[0], general)
        np.testing.assert_array_equal(fused[1], labels)
        np.testing.assert_array_equal(general, _expected(t, images, transform_rng(1, 2, 3, 4)))


def test_without_a_crop_the_record_is_named_with_the_way_out(kept):
    path, _ = kept
    with loaders.open(_config(path, size=4, scale=0.5)) as loader, \
            pytest.raises(RecordError, match=r"a/03\.png.*crop_size.*--resize H W"):
        list(loader)


def test_a_crop_larger_than_the_smallest_image_is_refused_when_the_job_opens(kept):
    path, _ = kept
    with pytest.raises(ConfigError, match=r"smallest image.*a/05\.png.*33x47"):
        loaders.open(_config(path, crop_size=34))


def test_a_mean_file_takes_one_size(kept, tmp_path):
    from lmdbio.codecs.binaryproto import write_mean_file

    path, _ = kept
    mean = tmp_path / "mean.binaryproto"
    write_mean_file(mean, np.full((3, 64, 44), 100, np.float32))
    with loaders.open(_config(path, size=4, crop_size=32, mean_file=str(mean))) as loader, \
            pytest.raises(RecordError, match=r"mean_file.*mean_values"):
        list(loader)


@pytest.mark.parametrize("transfer", ["copy", "spans"])
def test_grey_and_colour_records_in_one_batch_are_named(tmp_path, transfer):
    rng = np.random.default_rng(4)
    shapes = [(3, 40, 40), (3, 36, 44), (1, 40, 40), (3, 40, 40)]
    write_db(tmp_path, [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, s, dtype=np.uint8), i))) for i, s in enumerate(shapes)])
    cfg = _config(tmp_path, size=4, crop_size=32)
    cfg["readers"]["transfer"] = transfer
    with loaders.open(cfg) as loader, \
            pytest.raises(RecordError, match=r"00000002.*1 channel.*grey and colour"):
        list(loader)


def test_skip_and_substitute_in_a_batch_of_mixed_sizes(tmp_path):
    rng = np.random.default_rng(6)
    items = []
    for i, (h, w) in enumerate(SIZES):
        value = encode_datum(datum_from_array(rng.integers(0, 256, (3, h, w), np.uint8), i))
        items.append((b"%08d" % i, value[:-9] if i == 5 else value))  # 5: truncated
    write_db(tmp_path, items)
    cfg = _config(tmp_path, size=4, crop_size=30, phase="test")
    cfg["on_error"] = "skip"
    with loaders.open(cfg) as loader:
        batches = list(loader)
        assert loader.metrics.skipped == 1
    assert sorted(np.concatenate([b.label for b in batches]).tolist()) == [0, 1, 2, 3, 4, 6, 7]
    assert all(b.data.shape[1:] == (3, 30, 30) for b in batches)
    cfg["on_error"] = "substitute"
    with loaders.open(cfg) as loader:
        batches = list(loader)
        assert loader.metrics.substituted == 1
    b = batches[1]
    assert b.label.tolist() == [4, 4, 6, 7]  # record 5's place: the previous good record's
    np.testing.assert_array_equal(b.data[1], b.data[0])


# ----------------------------------------------------------------------------- PCR


def test_pcr_convert_asks_for_a_choice(tmp_path):
    _folder(tmp_path / "img", grey={4}, fmt="jpg")
    with pytest.raises(LmdbioError) as exc:
        _convert(tmp_path / "img", tmp_path / "p", "pcr")
    err = str(exc.value)
    assert "grey and colour images mixed: b/04.jpg" in err and "--color" in err
    with pytest.raises(LmdbioError) as exc:
        _convert(tmp_path / "img", tmp_path / "p", "pcr", "--color")
    err = str(exc.value)
    assert "a/03.jpg is 35x60" in err and "--resize H W" in err and "--keep-sizes" in err
    assert not (tmp_path / "p").exists()


@pytest.fixture(scope="module")
def pcr_kept(tmp_path_factory):
    from lmdbio.codecs import pcr

    if not pcr.available_tools():
        pytest.skip("no lossless JPEG transcoder installed")
    root = tmp_path_factory.mktemp("pcr-mixed")
    _folder(root / "img", grey={4}, fmt="jpg")
    _convert(root / "img", root / "p", "pcr", "--color", "--keep-sizes",
             "--group-size", "3")
    rgb = {f"{p.parent.name}/{p.name}": np.asarray(Image.open(p).convert("RGB"))
           for p in (root / "img").rglob("*.jpg")}
    return root / "p", rgb


def test_pcr_with_a_transform_gives_a_batch_array_of_images(pcr_kept):
    """``--color --keep-sizes``, read with a centred crop: each batch one float32 array of
    ``batch.size`` images (groups of 3: 3 + 3, then the last group's 2), each the centre of
    its image decoded in colour (the grey one too), with its label."""
    path, rgb = pcr_kept
    meta = json.loads((path / "lmdbio.json").read_text())
    assert meta["decode_mode"] == "RGB" and meta["sizes_vary"] and meta["shape"] is None
    from lmdbio.codecs import pcr

    names = {}
    for v in _items(path).values():
        _, labels, keys = pcr.decode_pcr_value(v, 1)
        names.update({k.decode(): int(lab) for k, lab in zip(keys, labels, strict=True)})
    t = DataTransformer(crop_size=32, phase="test", scale=0.5)
    cfg = _config(path, "pcr", size=6, last="partial", crop_size=32, phase="test", scale=0.5)
    got = 0
    with loaders.open(cfg) as loader:
        order = sorted(names)  # keys are the relative paths, groups in folder order
        for batch in loader:
            n = len(batch)
            assert isinstance(batch.data, np.ndarray) and batch.data.dtype == np.float32
            assert batch.data.shape == (n, 3, 32, 32) and batch.label.shape == (n,)
            assert n == (6 if batch.iteration == 0 else 2)  # 8 images: groups 3 + 3, 2
            want = _expected(t, [rgb[k].transpose(2, 0, 1) for k in order[got:got + n]], None)
            np.testing.assert_array_equal(batch.data, want)
            assert batch.label.tolist() == [names[k] for k in order[got:got + n]]
            got += n
        assert loader.metrics.samples == got == 8


def test_pcr_without_a_crop_names_the_image(pcr_kept):
    path, _ = pcr_kept
    with loaders.open(_config(path, "pcr", size=3)) as loader, \
            pytest.raises(RecordError, match=r"a/03\.jpg.*crop_size"):
        list(loader)


def test_pcr_resize_and_gray(tmp_path):
    _folder(tmp_path / "img", grey={4}, fmt="png")
    _convert(tmp_path / "img", tmp_path / "p", "pcr", "--gray",
             "--resize", "24", "28", "--group-size", "4")
    meta = json.loads((tmp_path / "p" / "lmdbio.json").read_text())
    assert meta["shape"] == [1, 24, 28] and meta["decode_mode"] == "L"
    with loaders.open(_config(tmp_path / "p", "pcr", size=8)) as loader:
        (batch,) = list(loader)
    assert batch.data.shape == (8, 1, 24, 28) and batch.data.dtype == np.float32


def test_pcr_from_an_lmdb_is_checked_as_converted_and_leaves_nothing(tmp_path):
    """An LMDB source is read once: an image of another size stops the conversion there
    and the part written is removed."""
    from lmdbio.codecs import pcr
    from lmdbio.codecs.datum import datum_from_image

    if not pcr.available_tools():
        pytest.skip("no lossless JPEG transcoder installed")
    items = []
    for i, (h, w) in enumerate(SIZES):
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(_photo(i)[:h, :w])).save(buf, format="JPEG")
        items.append((b"%08d" % i, encode_datum(datum_from_image(buf.getvalue(), i))))
    write_db(tmp_path / "src", items)
    with pytest.raises(LmdbioError) as exc:
        _convert(tmp_path / "src", tmp_path / "p", "pcr", "--group-size", "2")
    err = str(exc.value)
    assert "b'00000001' is 64x44, the first item b'00000000' 40x50" in err
    assert "--keep-sizes" in err
    assert not (tmp_path / "p").exists()
    _convert(tmp_path / "src", tmp_path / "p", "pcr", "--group-size", "2",
             "--keep-sizes")


# --------------------------------------------------- batch.size counts images (rows)


def test_pcr_batch_size_counts_images(pcr_kept, caplog):
    path, _ = pcr_kept
    with pytest.raises(ConfigError,
                       match=r"batch.size: 2 counts images.*group of 3.*multiple of 3"):
        loaders.open(_config(path, "pcr", size=2, crop_size=32))
    caplog.set_level(logging.WARNING)
    with loaders.open(_config(path, "pcr", size=7, last="partial", crop_size=32)) as loader:
        sizes = [len(b) for b in loader]
    assert sizes == [6, 2] and "6 images per batch" in caplog.text


def test_toc_batch_size_counts_rows(tmp_path):
    _convert("sklearn:digits", tmp_path / "t", "toc", "--batch-size", "150")
    cfg = _config(tmp_path / "t", "toc", size=150)
    cfg["transform"] = {}
    with loaders.open(cfg) as loader:
        batches = list(loader)
    assert [len(b) for b in batches] == [150] * 11 + [147]
    assert batches[0].data.shape[0] == 150 and loader.metrics.samples == 1797
    cfg["batch"]["size"] = 1
    with pytest.raises(ConfigError, match=r"exactly 150"):
        loaders.open(cfg)


def test_ibp_batch_size_counts_rows(tmp_path):
    _convert("sklearn:digits", tmp_path / "i", "ibp", "--rows-per-record", "64")
    cfg = _config(tmp_path / "i", "ibp", size=128)
    cfg["transform"] = {}
    cfg["batch"]["last"] = "drop"
    with loaders.open(cfg) as loader:
        batches = list(loader)
    assert len(batches) == 14 and all(len(b) == 128 == b.data.shape[0] for b in batches)


# ------------------------------------------------------------- the pieces on their own


def test_ragged_images_index_like_a_batch():
    from loaders.transform import RaggedImages

    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    b = np.arange(2 * 5 * 2, dtype=np.uint8).reshape(2, 5, 2)
    r = RaggedImages.from_list([a, b, a[:1]])
    assert len(r) == 3 and r.shape == (3,) and r.uniform() is None
    np.testing.assert_array_equal(r[1], b)
    sub = r[np.array([0, 2])]
    assert isinstance(sub, RaggedImages) and sub.shapes.tolist() == [[2, 3, 4], [1, 3, 4]]
    r[2] = a  # another size: stored after the others
    assert r[np.array([0, 2])].uniform().shape == (2, 2, 3, 4)
    r[1] = b[::-1]
    np.testing.assert_array_equal(r[1], b[::-1])
    with pytest.raises(ConfigError, match="crop_size"):
        r.astype(np.float32)
    np.testing.assert_array_equal(r[0:1].astype(np.float32), a[None].astype(np.float32))


def test_the_transform_of_mixed_sizes_refuses_what_caffe_refuses():
    from loaders.transform import RaggedImages

    imgs = RaggedImages.from_list([np.zeros((3, 8, 9), np.uint8), np.zeros((3, 10, 7), np.uint8)])
    with pytest.raises(ConfigError, match="crop_size"):
        DataTransformer(scale=2)(imgs)
    with pytest.raises(ConfigError, match="larger than image 1"):
        DataTransformer(crop_size=8)(imgs)
    with pytest.raises(ConfigError, match="mean_file"):
        DataTransformer(crop_size=4, mean_file=np.zeros((3, 8, 9), np.float32))(imgs)
    grey = RaggedImages.from_list([np.zeros((3, 8, 9), np.uint8), np.zeros((1, 8, 9), np.uint8)])
    with pytest.raises(ConfigError, match="grey and colour"):
        DataTransformer(crop_size=4)(grey)
    out = DataTransformer(crop_size=7, phase="test")(imgs)
    assert out.shape == (2, 3, 7, 7) and out.dtype == np.float32
