"""``lmdbio convert --layout caffe-datum``: what Caffe's converters would write, read back
with py-lmdb (the C library) and the Datum decoder."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from lmdbio.cli import main as cli
from lmdbio.codecs.datum import decode_datum, decode_datum_batch
from lmdbio.codecs.record_batch import pack_values
from lmdbio.dataset_meta import read_dataset_meta


def _items(path) -> list[tuple[bytes, bytes]]:
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def _convert(*argv) -> None:
    assert cli(["convert", *map(str, argv)]) == 0


@pytest.fixture()
def image_folder(tmp_path):
    """Two classes of small generated images (PNG and JPEG files)."""
    from PIL import Image

    rng = np.random.default_rng(5)
    root = tmp_path / "images"
    arrays = {}
    for cls, names in (("cat", ["b.png", "a.jpg"]), ("dog", ["c.png"])):
        (root / cls).mkdir(parents=True)
        for name in names:
            arr = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            fmt = "PNG" if name.endswith(".png") else "JPEG"
            Image.fromarray(arr).save(root / cls / name, format=fmt, quality=95)
            arrays[f"{cls}/{name}"] = np.asarray(Image.open(root / cls / name))
    return root, arrays


def test_digits_as_caffe_would_write_them(tmp_path):
    from sklearn.datasets import load_digits

    dst = tmp_path / "digits"
    _convert("sklearn:digits", dst, "--layout", "caffe-datum")
    items = _items(dst)
    digits = load_digits()
    assert len(items) == 1797
    assert [k for k, _ in items] == [f"{i:08d}".encode() for i in range(1797)]  # key order
    for i in (0, 1, 1796):
        d = decode_datum(items[i][1])
        assert d.shape == (1, 8, 8) and d.label == digits.target[i] and d.encoded is False
        np.testing.assert_array_equal(d.to_array()[0], digits.images[i])  # 0..16 unchanged
    batch = decode_datum_batch(*pack_values([v for _, v in items]))
    np.testing.assert_array_equal(batch.data[:, 0], digits.images)
    np.testing.assert_array_equal(batch.labels, digits.target)
    meta = read_dataset_meta(dst)
    assert meta["layout"] == "caffe-datum" and meta["shape"] == [1, 8, 8]
    assert meta["dtype"] == "uint8" and meta["records"] == 1797 and meta["num_classes"] == 10
    assert meta["channel_order"] == "gray"
    assert "load_digits" in meta["provenance"] and meta["format_version"] == 1


def test_image_folder_raw_like_convert_imageset(tmp_path, image_folder):
    root, arrays = image_folder
    dst = tmp_path / "raw"
    _convert(root, dst, "--layout", "caffe-datum")
    items = _items(dst)
    assert [k for k, _ in items] == [b"00000000_cat/a.jpg", b"00000001_cat/b.png",
                                     b"00000002_dog/c.png"]
    for (key, value), label in zip(items, (0, 0, 1), strict=True):
        d = decode_datum(value)
        rgb = arrays[key.decode()[9:]]
        assert d.label == label and d.shape == (3, 6, 5)
        np.testing.assert_array_equal(d.to_array(), rgb.transpose(2, 0, 1)[::-1])  # BGR
    meta = read_dataset_meta(dst)
    assert meta["label_names"] == ["cat", "dog"] and meta["channel_order"] == "bgr"
    # --gray, --resize, --limit
    _convert(root, tmp_path / "g", "--layout", "caffe-datum", "--gray", "--resize", "4", "3",
             "--limit", "2")
    g = _items(tmp_path / "g")
    assert len(g) == 2 and decode_datum(g[0][1]).shape == (1, 4, 3)


def test_image_folder_encoded(tmp_path, image_folder):
    root, _ = image_folder
    _convert(root, tmp_path / "png", "--layout", "caffe-datum", "--encoded", "png")
    items = dict(_items(tmp_path / "png"))
    # PNG files go in byte for byte; the JPEG is re-encoded as PNG
    d = decode_datum(items[b"00000001_cat/b.png"])
    assert d.encoded is True and d.channels is None and d.label == 0
    assert bytes(d.data) == (root / "cat" / "b.png").read_bytes()
    d = decode_datum(items[b"00000000_cat/a.jpg"])
    assert bytes(d.data[:8]) == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    np.testing.assert_array_equal(d.to_array("rgb"), np.asarray(
        Image.open(root / "cat" / "a.jpg")).transpose(2, 0, 1))
    _convert(root, tmp_path / "jpg", "--layout", "caffe-datum", "--encoded", "jpg")
    d = decode_datum(dict(_items(tmp_path / "jpg"))[b"00000000_cat/a.jpg"])
    assert bytes(d.data) == (root / "cat" / "a.jpg").read_bytes()
    assert read_dataset_meta(tmp_path / "jpg")["shape"] == [3, 6, 5]


def test_arrays_tables_shuffle_and_encoded_photos(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((7, 5))
    y = np.arange(7) % 3
    np.savez(tmp_path / "xy.npz", X=X, y=y)
    _convert(tmp_path / "xy.npz", tmp_path / "t", "--layout", "caffe-datum", "--json")
    items = _items(tmp_path / "t")
    d = decode_datum(items[3][1])
    assert d.shape == (5, 1, 1) and d.label == y[3] and d.data is None
    np.testing.assert_array_equal(d.float_data, X[3].astype(np.float32))
    meta = read_dataset_meta(tmp_path / "t")
    assert 0 < meta["float32_rounding_max_abs_error"] < 1e-6 and meta["kind"] == "table"
    # shuffle is deterministic and keeps (sample, label) pairs together
    _convert(tmp_path / "xy.npz", tmp_path / "s1", "--layout", "caffe-datum", "--shuffle",
             "--seed", "4")
    _convert(tmp_path / "xy.npz", tmp_path / "s2", "--layout", "caffe-datum", "--shuffle",
             "--seed", "4")
    s1, s2 = _items(tmp_path / "s1"), _items(tmp_path / "s2")
    assert s1 == s2 and s1 != items
    for _, v in s1:
        dd = decode_datum(v)
        row = int(np.flatnonzero((X.astype(np.float32) == dd.float_data).all(axis=1))[0])
        assert dd.label == y[row]
    # 4-D NHWC arrays are transposed, not reordered
    imgs = rng.integers(0, 256, (3, 4, 5, 3), dtype=np.uint8)
    np.save(tmp_path / "imgs.npy", imgs)
    _convert(tmp_path / "imgs.npy", tmp_path / "n", "--layout", "caffe-datum", "--input-order",
             "nhwc")
    np.testing.assert_array_equal(decode_datum(_items(tmp_path / "n")[1][1]).to_array(),
                                  imgs[1].transpose(2, 0, 1))
    # bundled JPEG photographs, encoded: stored byte for byte, keys carry the file name
    _convert("sklearn:sample_images", tmp_path / "p", "--layout", "caffe-datum", "--encoded",
             "jpg")
    p = _items(tmp_path / "p")
    assert [k for k, _ in p] == [b"00000000_china.jpg", b"00000001_flower.jpg"]
    from sklearn.datasets import load_sample_images

    f0 = load_sample_images().filenames[0]
    assert bytes(decode_datum(p[0][1]).data) == open(f0, "rb").read()  # noqa: SIM115


def test_converter_errors(tmp_path, capsys, image_folder):
    root, _ = image_folder
    assert cli(["convert", "sklearn:iris", str(tmp_path / "x"), "--layout", "caffe-datum",
                "--encoded", "png"]) == 2
    assert "holds table rows, not images" in capsys.readouterr().err
    assert cli(["convert", "skimage:lfw", str(tmp_path / "y"), "--layout", "caffe-datum",
                "--encoded", "png"]) == 2
    assert "needs uint8 images" in capsys.readouterr().err
    assert cli(["convert", str(tmp_path / "missing"), str(tmp_path / "z"), "--layout",
                "caffe-datum"]) == 2
    assert "not a bundled data set name" in capsys.readouterr().err
    assert cli(["convert", "sklearn:nope", str(tmp_path / "z"), "--layout",
                "caffe-datum"]) == 2
    assert "unknown data set" in capsys.readouterr().err
    (root / "loose.png").write_bytes((root / "cat" / "b.png").read_bytes())
    assert cli(["convert", str(root), str(tmp_path / "w"), "--layout", "caffe-datum"]) == 2
    assert "class subfolder" in capsys.readouterr().err
    (root / "cat" / "broken.png").write_bytes(b"not a png")
    (root / "loose.png").unlink()
    assert cli(["convert", str(root), str(tmp_path / "v"), "--layout", "caffe-datum"]) == 2
    assert "broken.png: cannot read image" in capsys.readouterr().err


def test_json_summary(tmp_path, capsys):
    _convert("sklearn:iris", tmp_path / "i", "--layout", "caffe-datum", "--json", "--limit", "9")
    summary = json.load(io.StringIO(capsys.readouterr().out))
    assert summary["records"] == 9 and summary["shape"] == [4, 1, 1]
    assert summary["dtype"] == "float32" and "load_iris" in summary["provenance"]
