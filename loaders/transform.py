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
(``loaders/_transform_kernels.py``) that gives the same float32 results in one pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lmdbio.errors import ConfigError

__all__ = ["DataTransformer", "TransformDraw", "transform_batch", "transform_rng"]

#: the mean image argument of the compiled kernels when there is none
_NO_MEAN = np.zeros((1, 1, 1), np.float32)

_RNG_TAG = 0x5452414E  # "TRAN": keeps transform draws independent of other users of `seed`


def transform_rng(seed: int, epoch: int, iteration: int, rank: int) -> np.random.Generator:
    """The generator of one batch's random decisions, a pure function of its arguments."""
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=(_RNG_TAG, int(epoch),
                                                               int(iteration), int(rank)))
    return np.random.Generator(np.random.PCG64(ss))


@dataclass(frozen=True)
class TransformDraw:
    """The per-image decisions of one batch: crop offsets and mirror flags (numpy arrays)."""

    h_off: np.ndarray
    w_off: np.ndarray
    mirror: np.ndarray


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
            from lmdbio.codecs.binaryproto import read_mean_file

            self.mean = read_mean_file(mean_file)
        if self.mean is not None and self.mean.ndim != 3:
            raise ConfigError(f"transform: a mean image is (C, H, W), got {self.mean.shape}")
        self.crop_size = int(crop_size)
        self.mirror = bool(mirror)
        self.phase = phase
        #: kernel arguments per (batch size, image shape): see :meth:`_datum_args`
        self._datum_cache: dict[tuple[int, tuple[int, int, int]], tuple[Any, ...]] = {}
        #: the means on each device array module (:meth:`_means_on`)
        self._device_means: dict[tuple[int, bytes | None], tuple[Any, Any]] = {}

    @classmethod
    def from_config(cls, cfg: Any) -> DataTransformer:
        """From a :class:`lmdbio.config.TransformConfig` (or anything with its attributes)."""
        return cls(scale=cfg.scale, mean_values=tuple(cfg.mean_values), mean_file=cfg.mean_file,
                   crop_size=cfg.crop_size, mirror=cfg.mirror, phase=cfg.phase)

    @property
    def is_identity(self) -> bool:
        """True when the transform only converts to float32 (nothing to compute)."""
        return (self.scale == 1 and self.mean is None and not self.mean_values.size
                and not self.crop_size and not self.mirror)

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
        if crop and self.phase == "train":
            h_off = rng.integers(0, height - crop + 1, size=n)  # type: ignore[union-attr]
            w_off = rng.integers(0, width - crop + 1, size=n)  # type: ignore[union-attr]
        elif crop:
            h_off = np.full(n, (height - crop) // 2)
            w_off = np.full(n, (width - crop) // 2)
        else:
            h_off = np.zeros(n, np.int64)
            w_off = np.zeros(n, np.int64)
        return TransformDraw(h_off.astype(np.int64), w_off.astype(np.int64),
                             np.ascontiguousarray(mirror, np.bool_))

    def __call__(self, batch: Any, rng: np.random.Generator | None = None, *,
                 draw: TransformDraw | None = None, out: Any = None, xp: Any = np) -> Any:
        """Transform a ``(N, C, H, W)`` uint8/float batch into float32 ``(N, C, h, w)``.

        Decisions come from ``draw`` when given, else are drawn from ``rng``. ``xp`` is the
        array module of ``batch`` (numpy or cupy); decisions are always numpy arrays.
        """
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

    def _means_on(self, xp: Any, mean_values: np.ndarray | None) -> tuple[Any, Any]:
        """The mean image and per-channel means as arrays of ``xp``, copied to a device
        once (a mean file is as large as an image: not a copy per batch)."""
        key = (id(xp), None if mean_values is None else mean_values.tobytes())
        hit = self._device_means.get(key)
        if hit is None:
            hit = (None if self.mean is None else xp.asarray(self.mean),
                   None if mean_values is None else xp.asarray(mean_values))
            self._device_means[key] = hit
        return hit

    def datums(self, buf: np.ndarray, spans: Any, rng: np.random.Generator | None = None,
               *, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The transformed float32 batch ``(N, C, h, w)`` and int64 labels of the raw
        uint8 Datums ``spans`` (:class:`loaders.decode.DatumSpans`) in ``buf``, in one
        compiled pass over the records' bytes: the same values as decoding them to uint8
        and calling this transformer, without the uint8 batch in between. Decisions are
        drawn from ``rng`` as :meth:`__call__` draws them. ``None`` when a record is not a
        raw uint8 Datum of ``spans.shape`` (the general decoder then explains it)."""
        from lmdbio.codecs._record_kernels import NCOLS
        from loaders import _transform_kernels as k

        n = len(spans)
        shape, dims, mode, mv, mean, fixed = self._datum_args(n, spans.shape)
        draw = fixed if fixed is not None else self.draw(n, dims[1], dims[2], rng)
        if out is None:
            out = np.empty(shape, np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ConfigError(f"transform: out must be C-contiguous float32 {shape}, got "
                              f"{out.shape} {out.dtype}")
        labels = np.empty(n, np.int64)
        if k.transform_datums(buf, spans.starts, spans.lengths, dims, draw.h_off, draw.w_off,
                              draw.mirror, mode, mean, mv, self.scale, out, labels,
                              np.empty((n, NCOLS), np.int64)) >= 0:
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
            args = ((n, c, oh, ow), np.asarray(image, np.int64), mode, mv, mean, fixed)
            if len(self._datum_cache) > 64:  # batch sizes and shapes seen: a handful
                self._datum_cache.clear()
            self._datum_cache[key] = args
        return args

    def _kernel_mean(self, c: int) -> tuple[int, np.ndarray, np.ndarray]:
        """The compiled kernels' mean arguments: mode, per-channel values, mean image."""
        from loaders import _transform_kernels as k

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
    from loaders import _transform_kernels as k

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
    k.transform(np.ascontiguousarray(batch), h_off, w_off,
                np.ascontiguousarray(draw.mirror, np.bool_), mode, m, mv, np.float32(scale), out)
    return out


def transform_batch(
    batch: Any,
    draw: TransformDraw,
    *,
    crop_size: int = 0,
    scale: float | np.floating = 1.0,
    mean: Any = None,
    mean_values: Any = None,
    out: Any = None,
    xp: Any = np,
) -> Any:
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
