"""``lmdbio convert --layout tensor``, read back with py-lmdb and the tensor decoders."""

from __future__ import annotations

import numpy as np
import pytest

from lmdbio.cli import main as cli
from lmdbio.codecs.record_batch import pack_values
from lmdbio.codecs.tensor import decode_tensor, decode_tensor_batch
from lmdbio.dataset_meta import read_dataset_meta


def _items(path) -> list[tuple[bytes, bytes]]:
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def test_digits_tensor_records(tmp_path):
    from sklearn.datasets import load_digits

    dst = tmp_path / "d"
    assert cli(["convert", "sklearn:digits", str(dst), "--layout", "tensor"]) == 0
    items = _items(dst)
    digits = load_digits()
    assert [k for k, _ in items] == [f"{i:08d}".encode() for i in range(1797)]
    b = decode_tensor_batch(*pack_values([v for _, v in items]))
    assert b.data.shape == (1797, 1, 8, 8) and b.data.dtype == np.uint8
    np.testing.assert_array_equal(b.data[:, 0], digits.images)
    np.testing.assert_array_equal(b.labels, digits.target)
    meta = read_dataset_meta(dst)
    assert meta["layout"] == "tensor" and meta["shape"] == [1, 8, 8] and meta["dtype"] == "uint8"
    assert meta["label_names"] == [str(i) for i in range(10)] and meta["records"] == 1797


def test_cast_tables_and_photos(tmp_path):
    from sklearn.datasets import load_breast_cancer, load_sample_images

    assert cli(["convert", "sklearn:breast_cancer", str(tmp_path / "b"), "--layout", "tensor",
                "--dtype", "float32", "--format-version", "3"]) == 0
    meta = read_dataset_meta(tmp_path / "b")
    assert meta["dtype"] == "float32" and meta["shape"] == [30] and meta["format_version"] == 3
    assert 0 < meta["cast_max_abs_error"] < 1e-2
    import lmdb

    env = lmdb.open(str(tmp_path / "b"), readonly=True, lock=False)  # py-lmdb reads v3 too
    with env.begin() as txn:
        arr, label = decode_tensor(txn.get(b"00000005"))
    env.close()
    ref = load_breast_cancer()
    np.testing.assert_array_equal(arr, ref.data[5].astype(np.float32))
    assert label == ref.target[5]
    assert cli(["convert", "sklearn:sample_images", str(tmp_path / "p"), "--layout",
                "tensor"]) == 0
    arr, label = decode_tensor(_items(tmp_path / "p")[1][1])
    np.testing.assert_array_equal(arr, load_sample_images().images[1].transpose(2, 0, 1))  # RGB
    assert label == 1 and read_dataset_meta(tmp_path / "p")["channel_order"] == "rgb"


def test_npy_with_labels_and_errors(tmp_path, capsys):
    X = np.arange(24, dtype=np.int16).reshape(6, 4)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", np.arange(6) * 2)
    assert cli(["convert", str(tmp_path / "x.npy"), str(tmp_path / "t"), "--layout", "tensor",
                "--labels", str(tmp_path / "y.npy")]) == 0
    b = decode_tensor_batch(*pack_values([v for _, v in _items(tmp_path / "t")]))
    np.testing.assert_array_equal(b.data, X)
    assert b.labels.tolist() == [0, 2, 4, 6, 8, 10]
    assert cli(["convert", str(tmp_path / "x.npy"), str(tmp_path / "u"), "--layout", "tensor",
                "--dtype", "object"]) == 2
    assert "cannot be stored" in capsys.readouterr().err
    np.save(tmp_path / "bad.npy", np.zeros(3))
    assert cli(["convert", str(tmp_path / "bad.npy"), str(tmp_path / "v"), "--layout",
                "tensor"]) == 2
    assert "expected (N, F) rows" in capsys.readouterr().err
    assert cli(["convert", str(tmp_path / "x.npy"), str(tmp_path / "t"), "--layout",
                "tensor"]) == 2
    assert "destination exists" in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_limit_bounds(tmp_path, capsys, limit):
    assert cli(["convert", "sklearn:iris", str(tmp_path / "l"), "--layout", "tensor",
                "--limit", limit]) == 2
    err = capsys.readouterr().err
    assert "nothing to write" in err or "--limit must be >= 0" in err
