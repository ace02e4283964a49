"""Caffe's ``DataTransformer`` on whole batches ``(N, C, H, W)``.

Semantics follow BVLC Caffe's ``src/caffe/data_transformer.cpp``,
``DataTransformer<Dtype>::Transform(const Datum&, Dtype*)`` (read at BVLC/caffe commit
45d30f4), per image:

* ``do_mirror = param_.mirror() && Rand(2)`` -- drawn in **both** phases (TRAIN and TEST):
  Caffe mirrors at random whenever ``mirror`` is set, whatever the phase;
* with ``crop_size``: in TRAIN ``h_off = Rand(H - crop + 1)``, ``w_off = Rand(W - crop + 1)``;
  in TEST the centre, ``h_off = (H - crop) / 2``, ``w_off = (W - crop) / 2``;
* for every output position, with ``data_index = (c*H + h_off + h)*W + w_off + w`` and
  ``top_index`` the same position mirrored (``width - 1 - w``) when ``do_mirror``:
  ``top[top_index] = (pixel[data_index] - mean[data_index]) * scale`` with a mean file (so the
  mean image is subtracted *at the crop offset*, before cropping), or
  ``(pixel - mean_values[c]) * scale``, or ``pixel * scale``. One mean value with C > 1
  channels is replicated to every channel; otherwise there must be one per channel.
* arithmetic in ``Dtype`` = float32; the output is float32.

Here the decisions are drawn for the whole batch from a :class:`numpy.random.Generator` (see
:func:`transform_rng`, seeded per ``(seed, epoch, iteration, rank)``), so runs are
reproducible; the stream is not Caffe's boost RNG, so individual crops differ from a Caffe
run while following the same distribution. The computation is whole-array (a strided window
view gathered once per batch), written against an array module ``xp`` (numpy, or cupy on a
GPU) so the same code serves both; numpy batches go through one fused compiled kernel
(``loaders/kernels.py``) that gives the same float32 results in one pass.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
from numpy.typing import DTypeLike

from lmdbio.codecs.binaryproto import read_mean_file
from lmdbio.errors import ConfigError
from lmdbio.kernel_args import read_only
from lmdbio.kernel_cache import kernel_module
from loaders import stores

if TYPE_CHECKING:  # pragma: no cover
    from lmdbio.config import TransformConfig
    from loaders.decode import Allocator, DatumSpans

__all__ = ["DataTransformer", "RaggedImages", "TransformDraw", "XpArray", "transform_batch",
           "transform_rng"]

#: an array of a worker's array module: numpy on a CPU worker, cupy on a GPU worker (cupy
#: has no type stubs and the two share no Protocol mypy can check: Any, named once here)
XpArray = Any

#: the mean image argument of the compiled kernels when there is none
_NO_MEAN = np.zeros((1, 1, 1), np.float32)

_RNG_TAG = 0x5452414E  # "TRAN": keeps transform draws independent of other users of `seed`


def _offsets(u: np.ndarray, count: int) -> np.ndarray:
    """Offsets ``0 .. count - 1`` from uniform ``[0, 1)`` variates: ``floor(u * count)``
    (below ``count``: ``u * count`` rounds below it for every ``u < 1``)."""
    return (u * count).astype(np.int64)


class RaggedImages:
    """The images of a batch whose records differ in size: image ``i`` is ``(C, H, W)`` =
    ``shapes[i]``, its pixels ``pixels[starts[i] : starts[i] + C * H * W]`` (one flat
    array, back to back). What the decoders return for such a batch; Caffe's transform
    with ``crop_size`` (:meth:`DataTransformer.ragged`) makes it an ``(N, C, crop, crop)``
    array. Indexing: ``r[i]`` is image ``i`` (a view), ``r[a:b]`` / ``r[indices]`` a
    :class:`RaggedImages` of those images; ``r[i] = image`` replaces one."""

    __slots__ = ("pixels", "shapes", "starts")

    def __init__(self, pixels: np.ndarray, starts: np.ndarray, shapes: np.ndarray) -> None:
        self.pixels = pixels  # 1-D
        self.starts = np.ascontiguousarray(starts, np.int64)  # (N,)
        self.shapes = np.ascontiguousarray(shapes, np.int64).reshape(-1, 3)  # (N, 3)

    @classmethod
    def from_list(cls, images: list[np.ndarray], dtype: DTypeLike | None = None
                  ) -> RaggedImages:
        """Images ``(C, H, W)`` (or ``(H, W)``: one channel) copied back to back."""
        arrays = [im[None] if im.ndim == 2 else im for im in images]
        if any(a.ndim != 3 for a in arrays):
            raise ConfigError("RaggedImages: images are (C, H, W) or (H, W)")
        shapes = np.array([a.shape for a in arrays], np.int64).reshape(-1, 3)
        sizes = shapes.prod(axis=1)
        starts = np.zeros(len(arrays), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        dtype = np.result_type(*arrays) if dtype is None and arrays else (dtype or np.uint8)
        pixels = np.concatenate([a.reshape(-1) for a in arrays]).astype(dtype, copy=False) \
            if arrays else np.empty(0, dtype)
        return cls(pixels, starts, shapes)

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    @property
    def shape(self) -> tuple[int]:
        """``(N,)``: the number of images (each has its own ``shapes[i]``)."""
        return (len(self),)

    @property
    def dtype(self) -> np.dtype:
        return self.pixels.dtype

    def _image(self, i: int) -> np.ndarray:
        c, h, w = (int(x) for x in self.shapes[i])
        s = int(self.starts[i])
        return self.pixels[s:s + c * h * w].reshape(c, h, w)

    @overload
    def __getitem__(self, index: int | np.integer) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice | np.ndarray | list[int]) -> RaggedImages: ...

    def __getitem__(self, index: int | np.integer | slice | np.ndarray | list[int]
                    ) -> np.ndarray | RaggedImages:
        if isinstance(index, int | np.integer):
            return self._image(int(index))
        return RaggedImages(self.pixels, self.starts[index], self.shapes[index])

    def __setitem__(self, index: int | np.integer, image: np.ndarray) -> None:
        image = np.asarray(image)
        i = int(index)
        if image.shape == tuple(int(x) for x in self.shapes[i]):
            self._image(i)[...] = image
            return
        at = self.pixels.shape[0]  # another size: its pixels go after the others
        self.pixels = np.concatenate([self.pixels, image.reshape(-1).astype(self.dtype)])
        self.starts[i] = at
        self.shapes[i] = image.shape

    def uniform(self) -> np.ndarray | None:
        """The images as one ``(N, C, H, W)`` array when they all have one shape (a copy
        unless they lie back to back), else ``None``."""
        if not len(self) or (self.shapes != self.shapes[0]).any():
            return None
        c, h, w = (int(x) for x in self.shapes[0])
        size = c * h * w
        s0 = int(self.starts[0])
        if (self.starts == s0 + size * np.arange(len(self))).all():
            return self.pixels[s0:s0 + size * len(self)].reshape(len(self), c, h, w)
        return np.stack([self._image(i) for i in range(len(self))])

    def astype(self, dtype: DTypeLike, copy: bool = True) -> np.ndarray:
        """The ``(N, C, H, W)`` batch in ``dtype`` (images of one shape only)."""
        u = self.uniform()
        if u is None:
            raise ConfigError(_mixed_sizes_text(self.shapes))
        return u.astype(dtype, copy=copy)

    def __repr__(self) -> str:
        return f"RaggedImages({len(self)} images, {self.dtype}, shapes {self.shapes.tolist()})"


def _mixed_sizes_text(shapes: np.ndarray) -> str:
    i = int(np.flatnonzero((shapes != shapes[0]).any(axis=1))[0])
    return (f"transform: the images of a batch differ in size (image 0 is "
            f"{tuple(int(x) for x in shapes[0])}, image {i} {tuple(int(x) for x in shapes[i])})"
            "; Caffe takes images of several sizes only with crop_size, cropping each one: "
            "set transform.crop_size, or convert the images to one size (lmdbio convert "
            "--resize H W)")


def transform_rng(seed: int, epoch: int, iteration: int, rank: int) -> np.random.Generator:
    """The generator of one batch's random decisions, a pure function of its arguments."""
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=(_RNG_TAG, int(epoch),
                                                               int(iteration), int(rank)))
    return np.random.Generator(np.random.PCG64(ss))


@dataclass(frozen=True)
class TransformDraw:
    """The per-image decisions of one batch: crop offsets and mirror flags (numpy arrays).

    ``h_u``, ``w_u``: the uniform ``[0, 1)`` variates random crop offsets come from
    (``offset = floor(u * (side - crop + 1))``), so that a batch of images of several
    sizes gets each image's offsets for its own size from the same draw; ``None`` where no
    offset is random (test phase, no crop)."""

    h_off: np.ndarray
    w_off: np.ndarray
    mirror: np.ndarray
    h_u: np.ndarray | None = None
    w_u: np.ndarray | None = None


@functools.cache
def _fused_kernels() -> tuple[ModuleType, int, np.ndarray]:
    """The fused Datum kernels' module, the parse table's width and the empty header
    format, imported once (numba loads with the kernels: not when this module is imported)
    and then looked up per batch without an import statement."""
    from loaders.decode import NO_HEADER_CHECK

    return kernel_module("loaders"), kernel_module("lmdbio.codecs.datum").NCOLS, NO_HEADER_CHECK


class DataTransformer:
    """Caffe's ``TransformationParameter`` applied to batches.

    Args:
        scale: multiplier applied after mean subtraction.
        mean_values: per-channel means (one value applies to every channel).
        mean_file: a Caffe ``.binaryproto`` path, or an already loaded ``(C, H, W)`` array.
        crop_size: square crop side; 0 for no crop.
        mirror: mirror each image with probability 1/2 (any phase, as Caffe).
        phase: ``"train"`` (random crops) or ``"test"`` (centred crops).
    """

    def __init__(
        self,
        *,
        scale: float = 1.0,
        mean_values: tuple[float, ...] | list[float] = (),
        mean_file: str | os.PathLike | np.ndarray | None = None,
        crop_size: int = 0,
        mirror: bool = False,
        phase: Literal["train", "test"] = "train",
    ) -> None:
        if mean_file is not None and len(mean_values):
            raise ConfigError("transform: cannot specify mean_file and mean_values at the "
                              "same time (Caffe refuses it too)")
        if crop_size < 0:
            raise ConfigError(f"transform.crop_size must be >= 0, not {crop_size}")
        if phase not in ("train", "test"):
            raise ConfigError(f"transform.phase must be 'train' or 'test', not {phase!r}")
        self.scale = np.float32(scale)
        self.mean_values = np.asarray(mean_values, np.float32).reshape(-1)
        self.mean: np.ndarray | None = None
        if isinstance(mean_file, np.ndarray):
            self.mean = np.ascontiguousarray(mean_file, np.float32)
        elif mean_file is not None:
            self.mean = read_mean_file(mean_file)
        if self.mean is not None and self.mean.ndim != 3:
            raise ConfigError(f"transform: a mean image is (C, H, W), got {self.mean.shape}")
        self.crop_size = int(crop_size)
        self.mirror = bool(mirror)
        self.phase = phase
        #: kernel arguments per (batch size, image shape): see :meth:`_datum_args`
        self._datum_cache: dict[tuple[int, tuple[int, int, int]], tuple[Any, ...]] = {}
        #: only converts to float32 (see :attr:`is_identity`), decided once: asked per batch
        self._identity = bool(self.scale == 1 and self.mean is None
                              and not self.mean_values.size and not self.crop_size
                              and not self.mirror)
        #: the means on each device array module (:meth:`_means_on`)
        self._device_means: dict[tuple[int, bytes | None],
                                 tuple[XpArray | None, XpArray | None]] = {}

    @classmethod
    def from_config(cls, cfg: TransformConfig) -> DataTransformer:
        """From a :class:`lmdbio.config.TransformConfig` (or anything with its attributes)."""
        return cls(scale=cfg.scale, mean_values=tuple(cfg.mean_values), mean_file=cfg.mean_file,
                   crop_size=cfg.crop_size, mirror=cfg.mirror, phase=cfg.phase)

    @property
    def is_identity(self) -> bool:
        """True when the transform only converts to float32 (nothing to compute)."""
        return self._identity

    def check(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """Check an input ``(N, C, H, W)`` (or ``(C, H, W)``) against the parameters as Caffe's
        CHECKs do; return the output image shape ``(C, h, w)``."""
        if len(shape) not in (3, 4):
            raise ConfigError(f"transform: expected (N, C, H, W) images, got shape {shape}")
        c, h, w = (int(x) for x in shape[-3:])
        if c <= 0:
            raise ConfigError(f"transform: images have {c} channels")
        if self.crop_size > h or self.crop_size > w:
            raise ConfigError(f"transform.crop_size {self.crop_size} is larger than the "
                              f"{h}x{w} images")
        if self.mean is not None and self.mean.shape != (c, h, w):
            raise ConfigError(f"transform.mean_file holds a {self.mean.shape} mean, the images "
                              f"are {(c, h, w)} (Caffe requires equal shapes)")
        if self.mean_values.size not in (0, 1, c):
            raise ConfigError(f"transform.mean_values has {self.mean_values.size} values; "
                              f"specify either 1 or as many as channels: {c}")
        if self.crop_size:
            return c, self.crop_size, self.crop_size
        return c, h, w

    def draw(self, n: int, height: int, width: int,
             rng: np.random.Generator | None) -> TransformDraw:
        """Draw the batch's decisions: mirror flags (if ``mirror``), then crop offsets (random
        in train, centred in test), the same quantities Caffe draws per image."""
        if (self.mirror or (self.crop_size and self.phase == "train")) and rng is None:
            raise ConfigError("transform: random mirror/crop needs a numpy Generator "
                              "(see transform_rng)")
        if self.mirror:
            mirror = rng.integers(0, 2, size=n).astype(bool)  # type: ignore[union-attr]
        else:
            mirror = np.zeros(n, bool)
        crop = self.crop_size
        h_u = w_u = None
        if crop and self.phase == "train":
            # each offset equally likely, as Caffe's Rand(H - crop + 1); drawn as uniform
            # variates so that images of other sizes use the same draw (see ragged())
            h_u = rng.random(n)  # type: ignore[union-attr]
            w_u = rng.random(n)  # type: ignore[union-attr]
            h_off = _offsets(h_u, height - crop + 1)
            w_off = _offsets(w_u, width - crop + 1)
        elif crop:
            h_off = np.full(n, (height - crop) // 2)
            w_off = np.full(n, (width - crop) // 2)
        else:
            h_off = np.zeros(n, np.int64)
            w_off = np.zeros(n, np.int64)
        return TransformDraw(h_off.astype(np.int64), w_off.astype(np.int64),
                             np.ascontiguousarray(mirror, np.bool_), h_u, w_u)

    def __call__(self, batch: XpArray | RaggedImages, rng: np.random.Generator | None = None,
                 *, draw: TransformDraw | None = None, out: XpArray | None = None,
                 xp: ModuleType = np) -> XpArray:
        """Transform a ``(N, C, H, W)`` uint8/float batch into float32 ``(N, C, h, w)``.

        Decisions come from ``draw`` when given, else are drawn from ``rng``. ``xp`` is the
        array module of ``batch`` (numpy or cupy); decisions are always numpy arrays.
        A :class:`RaggedImages` batch (images of several sizes) goes to :meth:`ragged`.
        """
        if isinstance(batch, RaggedImages):
            same = batch.uniform()
            if same is None:
                return self.ragged(batch, rng, draw=draw, out=out)
            batch = same
        c = self.check(batch.shape)[0]
        n = int(batch.shape[0])
        if draw is None:
            draw = self.draw(n, int(batch.shape[2]), int(batch.shape[3]), rng)
        mean_values = None
        if self.mean_values.size:
            mean_values = np.broadcast_to(self.mean_values, (c,)).copy()
        if xp is np and isinstance(batch, np.ndarray) and batch.dtype.kind in "uif":
            return _transform_cpu(batch, draw, self.crop_size, self.scale, self.mean,
                                  mean_values, out)
        mean, mean_values = self._means_on(xp, mean_values)
        return transform_batch(batch, draw, crop_size=self.crop_size, scale=self.scale,
                               mean=mean, mean_values=mean_values, out=out, xp=xp)

    def ragged(self, images: RaggedImages, rng: np.random.Generator | None = None, *,
               draw: TransformDraw | None = None, out: np.ndarray | None = None
               ) -> np.ndarray:
        """Images of several sizes to the float32 ``(N, C, crop, crop)`` batch, as Caffe's
        ``DataTransformer`` treats each datum: every image cropped at an offset drawn for its
        own size (random in train, centred in test), mirrored, mean values subtracted,
        scaled. Caffe's checks, per image: one channel count for the batch, ``crop_size``
        set and no larger than the image, no mean file (it has one size: Caffe requires
        each datum to have it). Decisions come from ``draw`` or ``rng`` (:meth:`draw`,
        whose uniform variates give each image its offsets): the same values as the fused
        Datum path (:meth:`datums`) gives the same records."""
        k = kernel_module("loaders")

        n = len(images)
        shapes = images.shapes
        crop = self.crop_size
        c = int(shapes[0, 0]) if n else 0
        odd = np.flatnonzero(shapes[:, 0] != c)
        if odd.size:
            i = int(odd[0])
            raise ConfigError(f"transform: image {i} of the batch has {int(shapes[i, 0])} "
                              f"channel(s), image 0 has {c}: grey and colour images mixed "
                              "(Caffe refuses them too); convert them to one kind")
        if not crop:
            raise ConfigError(_mixed_sizes_text(shapes))
        if self.mean is not None:
            raise ConfigError(f"transform.mean_file holds one {self.mean.shape} mean image, "
                              "and Caffe requires every image to have its size; the images of "
                              "this batch differ in size: use transform.mean_values")
        small = np.flatnonzero((shapes[:, 1] < crop) | (shapes[:, 2] < crop))
        if small.size:
            i = int(small[0])
            raise ConfigError(f"transform.crop_size {crop} is larger than image {i} of the "
                              f"batch ({int(shapes[i, 1])}x{int(shapes[i, 2])})")
        if self.mean_values.size not in (0, 1, c):
            raise ConfigError(f"transform.mean_values has {self.mean_values.size} values; "
                              f"specify either 1 or as many as channels: {c}")
        ends = images.starts + shapes.prod(axis=1)
        if n and (int(images.starts.min()) < 0 or int(ends.max()) > images.pixels.shape[0]):
            raise ConfigError("RaggedImages: an image lies outside its pixels")
        if draw is None:
            draw = self.draw(n, crop, crop, rng)
        train = self.phase == "train"
        if train and (draw.h_u is None or draw.w_u is None):
            raise ConfigError("transform: images of several sizes take random crops from the "
                              "draw's uniform variates (DataTransformer.draw)")
        shape = (n, c, crop, crop)
        if out is None:
            out = np.empty(shape, np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ConfigError(f"transform: out must be C-contiguous float32 {shape}, got "
                              f"{out.shape} {out.dtype}")
        mode, mv, _ = self._kernel_mean(c)
        none = np.zeros(n)
        k.transform_ragged(read_only(images.pixels), images.starts, shapes, train,
                           none if draw.h_u is None else np.ascontiguousarray(draw.h_u),
                           none if draw.w_u is None else np.ascontiguousarray(draw.w_u),
                           np.ascontiguousarray(draw.mirror, np.bool_), mode, read_only(mv),
                           self.scale, out)
        return out

    def _means_on(self, xp: ModuleType, mean_values: np.ndarray | None
                  ) -> tuple[XpArray | None, XpArray | None]:
        """The mean image and per-channel means as arrays of ``xp``, copied to a device
        once (a mean file is as large as an image: not a copy per batch)."""
        key = (id(xp), None if mean_values is None else mean_values.tobytes())
        hit = self._device_means.get(key)
        if hit is None:
            hit = (None if self.mean is None else xp.asarray(self.mean),
                   None if mean_values is None else xp.asarray(mean_values))
            self._device_means[key] = hit
        return hit

    def datums(self, buf: np.ndarray, spans: DatumSpans, rng: np.random.Generator | None = None,
               *, out: np.ndarray | None = None, header_fmt: np.ndarray | None = None,
               alloc: Allocator | None = None
               ) -> tuple[np.ndarray, np.ndarray] | None:
        """The transformed float32 batch ``(N, C, h, w)`` and int64 labels of the raw
        uint8 Datums ``spans`` (:class:`loaders.decode.DatumSpans`) in ``buf``, in one
        compiled pass over the records' bytes: the same values as decoding them to uint8
        and calling this transformer, without the uint8 batch in between. Decisions are
        drawn from ``rng`` as :meth:`__call__` draws them. ``None`` when a record is not a
        raw uint8 Datum of ``spans.shape`` (the general decoder then explains it), or, with
        ``header_fmt`` (the database's page format, for spans of its mapping whose overflow
        page headers are still to be checked), when one of those headers is wrong.
        ``alloc(shape, dtype)`` gives the output when ``out`` is not given (e.g. a
        :class:`~loaders.buffer_pool.BufferPool`'s ``take``)."""
        k, ncols, no_check = _fused_kernels()
        n = len(spans)
        shape, dims, mode, mv, mean, fixed = self._datum_args(n, spans.shape)
        draw = fixed if fixed is not None else self.draw(n, dims[1], dims[2], rng)
        if out is None:
            out = (np.empty if alloc is None else alloc)(shape, np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ConfigError(f"transform: out must be C-contiguous float32 {shape}, got "
                              f"{out.shape} {out.dtype}")
        labels = np.empty(n, np.int64)
        table = np.empty((n, ncols), np.int64)
        fmt = no_check if header_fmt is None else header_fmt
        src = read_only(buf)
        if stores.write(out.nbytes, lambda streaming: k.transform_datums(
                src, spans.starts, spans.lengths, dims, draw.h_off, draw.w_off, draw.mirror,
                mode, mean, mv, self.scale, out, labels, table, fmt, streaming),
                wrote=fused_kernel_wrote) >= 0:
            if not self.crop_size or self.mean is not None:
                return None
            # records of several sizes, each cropped as Caffe crops it: its own pass
            return self._ragged_datums(buf, spans, draw, mode, mv, out, labels, table, fmt)
        return out, labels

    def _ragged_datums(self, buf: np.ndarray, spans: DatumSpans, draw: TransformDraw, mode: int,
                       mv: np.ndarray, out: np.ndarray, labels: np.ndarray,
                       table: np.ndarray, fmt: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`datums` for a batch whose raw uint8 Datums differ in size (a crop, no
        mean file): each cropped at offsets for its own size from the batch's ``draw``,
        as :meth:`ragged` crops the decoded images. ``None`` when a record is not a raw
        uint8 Datum of the batch's channels at least ``crop_size`` in both sides (the
        general decoder then names it)."""
        k = kernel_module("loaders")

        n = len(spans)
        none = np.zeros(n)
        train = draw.h_u is not None and draw.w_u is not None
        if k.transform_datums_ragged(read_only(buf), spans.starts, spans.lengths, train,
                                     draw.h_u if train else none,
                                     draw.w_u if train else none, draw.mirror, mode,
                                     read_only(mv),
                                     self.scale, out, labels, table, fmt) >= 0:
            return None
        return out, labels

    def output_shape(self, n: int, image: tuple[int, int, int]) -> tuple[int, int, int, int]:
        """The ``(N, C, h, w)`` output of ``n`` images of ``image`` = ``(C, H, W)`` (checked
        as :meth:`check` does)."""
        return self._datum_args(n, image)[0]

    def _datum_args(self, n: int, image: tuple[int, int, int]) -> tuple[Any, ...]:
        """What :meth:`datums` passes to the kernel for ``n`` images of ``image``, checked
        once per batch size and shape: the output shape, the image shape as an array, the
        mean arguments, and the draw when it is not random (no mirror, no train crop)."""
        key = (n, image)
        args = self._datum_cache.get(key)
        if args is None:
            c, oh, ow = self.check((n, *image))
            mode, mv, mean = self._kernel_mean(c)
            fixed = None
            if not (self.mirror or (self.crop_size and self.phase == "train")):
                d = self.draw(n, image[1], image[2], None)
                fixed = TransformDraw(d.h_off, d.w_off, np.ascontiguousarray(d.mirror, np.bool_))
            # the mean values read-only once here, not a view per batch (kernel_args)
            args = ((n, c, oh, ow), np.asarray(image, np.int64), mode, read_only(mv), mean,
                    fixed)
            if len(self._datum_cache) > 64:  # batch sizes and shapes seen: a handful
                self._datum_cache.clear()
            self._datum_cache[key] = args
        return args

    def _kernel_mean(self, c: int) -> tuple[int, np.ndarray, np.ndarray]:
        """The compiled kernels' mean arguments: mode, per-channel values, mean image."""
        k = kernel_module("loaders")

        if self.mean is not None:
            return k.MEAN_FILE, np.zeros(c, np.float32), self.mean
        if self.mean_values.size:
            return (k.MEAN_VALUES, np.ascontiguousarray(
                np.broadcast_to(self.mean_values, (c,)), np.float32), _NO_MEAN)
        return k.MEAN_NONE, np.zeros(c, np.float32), _NO_MEAN


def _transform_cpu(batch: np.ndarray, draw: TransformDraw, crop_size: int, scale: np.float32,
                   mean: np.ndarray | None, mean_values: np.ndarray | None,
                   out: np.ndarray | None) -> np.ndarray:
    """The fused compiled kernel (numpy inputs): same results as :func:`transform_batch`."""
    k = kernel_module("loaders")

    n, c, height, width = batch.shape
    oh, ow = (crop_size, crop_size) if crop_size else (height, width)
    shape = (n, c, oh, ow)
    if out is None:
        out = np.empty(shape, np.float32)
    elif out.shape != shape or out.dtype != np.float32:
        raise ConfigError(f"transform: out must be float32 {shape}, got {out.shape} {out.dtype}")
    h_off = np.ascontiguousarray(draw.h_off, np.int64)
    w_off = np.ascontiguousarray(draw.w_off, np.int64)
    if h_off.shape != (n,) or w_off.shape != (n,) or np.shape(draw.mirror) != (n,):
        raise ConfigError(f"transform: the draw holds decisions for {h_off.shape[0]} images, "
                          f"the batch has {n}")
    if ((h_off < 0) | (h_off > height - oh) | (w_off < 0) | (w_off > width - ow)).any():
        raise ConfigError("transform: crop offsets outside the images")
    if mean is not None:
        mode, mv = k.MEAN_FILE, np.zeros(c, np.float32)
        m = np.ascontiguousarray(mean, np.float32)
    elif mean_values is not None:
        mode, mv, m = k.MEAN_VALUES, np.ascontiguousarray(mean_values, np.float32), None
    else:
        mode, mv, m = k.MEAN_NONE, np.zeros(c, np.float32), None
    if m is None:
        m = np.zeros((1, 1, 1), np.float32)
    src = read_only(np.ascontiguousarray(batch))
    mirror = np.ascontiguousarray(draw.mirror, np.bool_)
    mvr, sc = read_only(mv), np.float32(scale)
    stores.write(out.nbytes, lambda streaming: k.transform(src, h_off, w_off, mirror, mode, m,
                                                           mvr, sc, out, streaming))
    return out


def fused_kernel_wrote(status: int) -> bool:
    """Whether a fused Datum kernel wrote its batch (a status of 0 or more: it gave up at
    that record, having written nothing the caller keeps)."""
    return status < 0


def transform_batch(
    batch: XpArray,
    draw: TransformDraw,
    *,
    crop_size: int = 0,
    scale: float | np.floating = 1.0,
    mean: XpArray | None = None,
    mean_values: XpArray | None = None,
    out: XpArray | None = None,
    xp: ModuleType = np,
) -> XpArray:
    """The whole-batch computation, given the decisions: gather each image's crop (a strided
    window view indexed once), subtract the mean at the same source positions, scale, and
    mirror the flagged images. ``mean`` is ``(C, H, W)``; ``mean_values`` ``(C,)``."""
    n = int(batch.shape[0])
    s = np.float32(scale)
    if crop_size:
        idx = xp.arange(n)
        h_off = xp.asarray(draw.h_off)
        w_off = xp.asarray(draw.w_off)
        win = xp.lib.stride_tricks.sliding_window_view(batch, (crop_size, crop_size),
                                                        axis=(2, 3))
        # win: (N, C, H-crop+1, W-crop+1, crop, crop) -> pick one window per image
        x = win[idx, :, h_off, w_off]  # (N, C, crop, crop)
        if mean is not None:
            mwin = xp.lib.stride_tricks.sliding_window_view(mean, (crop_size, crop_size),
                                                             axis=(1, 2))
            m = xp.moveaxis(mwin[:, h_off, w_off], 1, 0)  # (N, C, crop, crop)
        else:
            m = None
    else:
        x = batch
        m = None if mean is None else mean[None]
    if out is None:
        out = xp.empty(x.shape, xp.float32)
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != xp.float32:
        raise ConfigError(f"transform: out must be float32 {tuple(x.shape)}, got "
                          f"{tuple(out.shape)} {out.dtype}")
    out[...] = x  # uint8 -> float32 exactly; a float batch is copied (float32)
    if m is not None:
        xp.subtract(out, m, out=out)
    elif mean_values is not None:
        xp.subtract(out, xp.asarray(mean_values, xp.float32)[None, :, None, None], out=out)
    if s != 1:
        xp.multiply(out, s, out=out)
    mirror = np.asarray(draw.mirror, bool)
    if mirror.any():
        rows = xp.asarray(np.flatnonzero(mirror))
        out[rows] = out[rows][..., ::-1]
    return out
