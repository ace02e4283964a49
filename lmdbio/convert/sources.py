"""Sources the ``caffe-datum`` and ``tensor`` converters read: a bundled data set name, a
folder of images (one subfolder per class, as for Caffe's ``convert_imageset``), or a
``.npy`` / ``.npz`` file of arrays.

A source yields :class:`Sample` objects lazily (a folder is read one image at a time), in the
order records will be written; ``--shuffle`` reorders them first, ``--limit`` keeps the first N.

The images of a folder are measured before anything is written (their headers only, see
:func:`check_image_sizes`): a folder of several image sizes needs a choice, ``--resize H W``
(one size for all) or, where the layout offers it, ``--keep-sizes`` (each image stored as it
is and cropped on its own when read, as Caffe's data layer crops each datum); without one the
conversion stops naming the first image of another size.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np

from lmdbio import datasets
from lmdbio.errors import LmdbioError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm",
                  ".pgm", ".pnm")


def _pil_image() -> ModuleType:
    """Pillow's ``PIL.Image``, imported on first use (Pillow is optional: the ``images``
    extra)."""
    from PIL import Image

    return Image


@dataclass
class Sample:
    """One record to write. ``array`` is ``(H, W)``, ``(H, W, C)`` (an image as read from a
    file or bundled, RGB) or ``(C, H, W)`` / ``(F,)`` (from user arrays: ``layout`` says which);
    ``file`` is the original encoded image when there is one."""

    name: str | None
    label: int
    load: Callable[[], np.ndarray]
    layout: Literal["hwc", "chw", "row"]
    file: Path | None = None


@dataclass
class Source:
    """What a converter reads: samples plus what the metadata needs to say about them."""

    kind: Literal["image", "table"]
    samples: list[Sample]
    label_names: list[str]
    provenance: str
    from_image_files: bool  #: pixels come from image files/bundled photos (Caffe reads BGR)
    folder: Path | None = None  #: the image folder, for a folder source
    #: what :func:`check_image_sizes` found (``sizes_vary``, ``smallest_image``...)
    sizes: dict[str, Any] = field(default_factory=dict)


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the array-and-image converters."""
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="write only the first N records (after --shuffle)")
    parser.add_argument("--shuffle", action="store_true",
                        help="shuffle the samples before numbering them (convert_imageset "
                             "--shuffle)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --shuffle")
    parser.add_argument("--gray", action="store_true",
                        help="image folders: read images as one grey channel (default: 3 "
                             "colour channels, as convert_imageset)")
    parser.add_argument("--resize", type=int, nargs=2, metavar=("H", "W"), default=None,
                        help="image folders: resize every image to H x W (bilinear); "
                             "needed for a folder of several image sizes")
    parser.add_argument("--input-order", choices=("nchw", "nhwc"), default="nchw",
                        help=".npy/.npz 4-D arrays: axis order of X (default nchw)")
    parser.add_argument("--labels", default=None, metavar="FILE.npy",
                        help=".npy input: labels (default: every label 0)")


def image_header(path: Path) -> tuple[int, int, str]:
    """``(height, width, mode)`` of an image file, from its header (no pixels decoded)."""
    Image = _pil_image()

    try:
        with Image.open(path) as im:
            return int(im.height), int(im.width), str(im.mode)
    except (Image.UnidentifiedImageError, OSError, ValueError) as exc:
        raise LmdbioError(f"{path}: cannot read image ({exc})") from None


def decoded_channels(mode: str) -> int:
    """Channels an image of Pillow ``mode`` decodes to when nothing forces colour or grey:
    1 for grey modes, 3 for the others (alpha dropped, CMYK and palettes as RGB): what the
    Datum decoder and the PCR decoder give, and OpenCV's ``IMREAD_ANYCOLOR`` in Caffe."""
    return 1 if mode in ("1", "L", "LA", "I", "F") or mode.startswith("I;") else 3


def check_image_sizes(root: Path, entries: list[tuple[str, Path]], *, resized: bool,
                      keep_option: str | None, keep: bool,
                      channels_fix: str | None = None) -> dict[str, Any]:
    """Measure every image of ``entries`` (``(name, file)``, in write order) before
    anything is written. Images of several sizes need a choice: ``resized`` (``--resize``:
    one size for all), or ``keep`` (the layout's ``keep_option``: stored as they are, each
    cropped when read, with ``transform.crop_size`` no larger than the smallest image);
    without one, :class:`~lmdbio.errors.LmdbioError` names the first image of another size
    than the first. Returns what the metadata sidecar records: ``sizes_vary``,
    ``min_size`` (the smallest height and width) and ``smallest_image`` (the image whose
    shorter side is the shortest: the largest crop every image allows).

    ``channels_fix``: where the images are stored as they are (PCR), grey and colour images
    mixed are refused too (Caffe's data layer refuses them in one batch), naming the first
    image of other channels than the first and this way out."""
    first_mode: tuple[str, int] | None = None
    first: tuple[str, int, int] | None = None
    odd: tuple[str, int, int] | None = None
    smallest: tuple[str, int, int] | None = None
    min_h = min_w = 0
    for name, path in entries:
        h, w, mode = image_header(path)
        if channels_fix is not None:
            c = decoded_channels(mode)
            if first_mode is None:
                first_mode = (name, c)
            elif c != first_mode[1]:
                raise LmdbioError(
                    f"{root}: grey and colour images mixed: {name} decodes to {c} channel(s), "
                    f"the first image {first_mode[0]} to {first_mode[1]}; Caffe's data layer "
                    f"refuses them in one batch. {channels_fix}")
        if first is None:
            first, min_h, min_w = (name, h, w), h, w
        elif odd is None and (h, w) != first[1:]:
            odd = (name, h, w)
        min_h, min_w = min(min_h, h), min(min_w, w)
        if smallest is None or min(h, w) < min(smallest[1:]):
            smallest = (name, h, w)
    if first is None or smallest is None:
        return {"sizes_vary": False}
    if odd is not None and not resized and not keep:
        keep_text = (f", or {keep_option} (each image stored as it is; read them with "
                     f"transform.crop_size at most {min(smallest[1:])}, the shorter side of "
                     f"the smallest image {smallest[0]} ({smallest[1]}x{smallest[2]}): each "
                     "image is cropped on its own, as Caffe's data layer does)"
                     if keep_option else "")
        raise LmdbioError(
            f"{root}: images of several sizes (height x width): {odd[0]} is "
            f"{odd[1]}x{odd[2]}, the first image {first[0]} {first[1]}x{first[2]}. Choose "
            f"--resize H W (every image resized to one size){keep_text}")
    if resized:
        return {"sizes_vary": False}
    return {"sizes_vary": odd is not None, "min_size": [min_h, min_w],
            "smallest_image": {"name": smallest[0], "height": smallest[1],
                               "width": smallest[2]}}


def _read_image_file(path: Path, gray: bool, resize: tuple[int, int] | None) -> np.ndarray:
    Image = _pil_image()

    try:
        with Image.open(path) as im:
            im = im.convert("L" if gray else "RGB")
            if resize is not None:
                im = im.resize((resize[1], resize[0]), Image.BILINEAR)
            return np.asarray(im)
    except (Image.UnidentifiedImageError, OSError, ValueError) as exc:
        raise LmdbioError(f"{path}: cannot read image ({exc})") from None


def _folder_source(root: Path, args: argparse.Namespace) -> Source:
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    groups: list[tuple[str, list[Path]]] = []
    for d in classes:
        files = sorted(p for p in d.rglob("*") if p.is_file()
                       and p.suffix.lower() in IMAGE_SUFFIXES)
        if files:
            groups.append((d.name, files))
    if groups and loose:
        raise LmdbioError(f"{root}: images both directly in the folder and in subfolders; put "
                          "every image in a class subfolder (its name is the label)")
    if not groups:
        if not loose:
            raise LmdbioError(f"{root}: no images found (suffixes "
                              f"{', '.join(IMAGE_SUFFIXES)})")
        groups = [(root.name, loose)]
    gray = bool(getattr(args, "gray", False))
    resize = tuple(args.resize) if getattr(args, "resize", None) else None
    samples = []
    for label, (_, files) in enumerate(groups):
        for f in files:
            samples.append(Sample(
                f.relative_to(root).as_posix(), label,
                (lambda f=f: _read_image_file(f, gray, resize)), "hwc", f))
    names = [g for g, _ in groups]
    return Source("image", samples, names,
                  f"image folder {root} ({len(samples)} images, {len(names)} classes from "
                  "subfolder names)", True, folder=root)


def _array_source(path: Path, args: argparse.Namespace) -> Source:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise LmdbioError(f"{path}: cannot read ({exc})") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            names = set(loaded.files)
            xk = next((k for k in ("X", "x", "data", "images") if k in names), None)
            yk = next((k for k in ("y", "Y", "labels", "label", "target") if k in names), None)
            if xk is None:
                raise LmdbioError(f"{path}: no data array (looked for X, x, data, images; "
                                  f"found {', '.join(sorted(names))})")
            X = loaded[xk]
            y = loaded[yk] if yk else None
    else:
        X, y = loaded, None
        if getattr(args, "labels", None):
            y = np.load(args.labels, allow_pickle=False)
    X = np.asarray(X)
    if X.ndim not in (2, 3, 4):
        raise LmdbioError(f"{path}: X has shape {X.shape}; expected (N, F) rows, (N, H, W) "
                          "or (N, C, H, W) / (N, H, W, C) images")
    n = X.shape[0]
    if y is None:
        y = np.zeros(n, np.int64)
    y = np.asarray(y)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise LmdbioError(f"{path}: labels must be {n} integers, got shape {y.shape} {y.dtype}")
    if X.ndim == 4 and getattr(args, "input_order", "nchw") == "nhwc":
        X = X.transpose(0, 3, 1, 2)
    layout: Literal["hwc", "chw", "row"] = "row" if X.ndim == 2 else "chw"
    samples = [Sample(None, int(y[i]), (lambda i=i: X[i]), layout) for i in range(n)]
    kind: Literal["image", "table"] = "table" if X.ndim == 2 else "image"
    return Source(kind, samples, [str(v) for v in np.unique(y).tolist()],
                  f"array file {path} (X {X.shape} {X.dtype})", False)


def _dataset_source(name: str) -> Source:
    ds = datasets.load_dataset(name)
    data = ds.data
    samples = []
    for i in range(len(ds)):
        file = ds.files[i] if ds.files else None
        samples.append(Sample(file.name if file else None, int(ds.labels[i]),
                              (lambda i=i: data[i]), "hwc" if ds.kind == "image" else "row",
                              file))
    photos = ds.files is not None
    return Source(ds.kind, samples, list(ds.label_names), ds.provenance, photos)


def open_source(src: str, args: argparse.Namespace) -> Source:
    """Resolve ``src`` (data set name, folder, .npy/.npz) and apply --shuffle / --limit."""
    p = Path(src)
    if datasets.is_dataset_name(src):
        source = _dataset_source(src)
    elif p.is_dir():
        source = _folder_source(p, args)
    elif p.suffix in (".npy", ".npz") and p.is_file():
        source = _array_source(p, args)
    elif not p.exists():
        raise LmdbioError(f"{src}: no such file or folder, and not a bundled data set name "
                          "(e.g. sklearn:digits; see lmdbio.datasets.available_datasets())")
    else:
        raise LmdbioError(f"{src}: unsupported source; expected a data set name, a folder of "
                          "images or a .npy/.npz file")
    if getattr(args, "shuffle", False):
        order = np.random.default_rng(getattr(args, "seed", 0)).permutation(len(source.samples))
        source.samples = [source.samples[i] for i in order]
    limit = getattr(args, "limit", None)
    if limit is not None:
        if limit < 0:
            raise LmdbioError(f"--limit must be >= 0, not {limit}")
        source.samples = source.samples[:limit]
    if not source.samples:
        raise LmdbioError(f"{src}: nothing to write (0 samples)")
    if source.folder is not None:  # the images that will be written, measured first
        source.sizes = check_image_sizes(
            source.folder, [(s.name or "", s.file) for s in source.samples if s.file],
            resized=bool(getattr(args, "resize", None)),
            keep_option="--keep-sizes" if hasattr(args, "keep_sizes") else None,
            keep=bool(getattr(args, "keep_sizes", False)))
    return source


def iter_samples(source: Source) -> Iterator[tuple[int, Sample, np.ndarray]]:
    """``(index, sample, array)`` in write order, loading each array when it is needed."""
    for i, s in enumerate(source.samples):
        yield i, s, np.asarray(s.load())
