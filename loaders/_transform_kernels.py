"""Compiled CPU kernels of :mod:`loaders.transform`: Caffe's crop, mirror, mean and scale
fused into one pass over each image (no temporaries), float32 arithmetic in Caffe's order.

Two entry points share one per-image routine:

* :func:`transform` reads images from an ``(N, C, H, W)`` array (any real dtype);
* :func:`transform_datums` reads the uint8 pixels of raw Caffe Datums straight from the
  buffer that holds the records (a ring slot, or the database mapping), so a batch of Datums
  becomes the trainer's float32 batch in one pass: no uint8 batch is written and read again.

Indices are unsigned: numba checks a signed index for a negative value (Python's wrap
around) on every element, which stops LLVM from vectorizing the loops. With unsigned
indices the row loops vectorize; measured on the 2-core VM on a CIFAR-like batch of 64
(3x32x32), scale only: 1.4 us per image against 4-5 us for per-row slices of the same
arithmetic, and 1.9 us for numpy's gather + convert + scale of the same bytes (the
``bench/peers.py`` floor). Callers check every offset and shape: these kernels do not.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lmdbio.codecs._record_kernels import COL_DATA_OFF, COL_LABEL, parse_uniform

MEAN_NONE = 0
MEAN_FILE = 1
MEAN_VALUES = 2

_ONE = np.uint64(1)


@njit(cache=True, nogil=True, inline="always")
def _run(src, s, dst, d, count, flip, mode, mean, m, mv, scale):
    """``count`` values from ``src[s:]`` to ``dst[d:]`` (reversed when ``flip``):
    ``(x - mean) * scale`` as float32; ``mean[m:]`` with a mean image, ``mv`` with mean
    values. Every index is unsigned (see the module docstring)."""
    n = np.uint64(count)
    s = np.uint64(s)
    d = np.uint64(d)
    m = np.uint64(m)
    last = d + n - _ONE
    if mode == MEAN_FILE:
        if flip:
            for w in range(n):
                dst[last - w] = (np.float32(src[s + w]) - mean[m + w]) * scale
        else:
            for w in range(n):
                dst[d + w] = (np.float32(src[s + w]) - mean[m + w]) * scale
    elif mode == MEAN_VALUES:
        if flip:
            for w in range(n):
                dst[last - w] = (np.float32(src[s + w]) - mv) * scale
        else:
            for w in range(n):
                dst[d + w] = (np.float32(src[s + w]) - mv) * scale
    else:
        if flip:
            for w in range(n):
                dst[last - w] = np.float32(src[s + w]) * scale
        else:
            for w in range(n):
                dst[d + w] = np.float32(src[s + w]) * scale


@njit(cache=True, nogil=True)
def _image(src, base, c, height, width, ho, wo, flip, mode, mean, mean_values, scale,
           dst, d0, oh, ow):
    """One image: the ``(C, H, W)`` pixels at ``src[base:]`` to the ``(C, oh, ow)`` output
    at ``dst[d0:]``, cropped at ``(ho, wo)``, mirrored when ``flip``. ``mean`` is the flat
    ``(C, H, W)`` mean image (read at the crop offset, as Caffe does)."""
    plane = height * width
    whole = oh == height and ow == width and not flip
    for ch in range(c):
        mv = mean_values[ch]
        if whole:  # uncropped, unmirrored: the channel is one contiguous run
            _run(src, base + ch * plane, dst, d0 + ch * plane, plane, False, mode, mean,
                 ch * plane, mv, scale)
            continue
        for h in range(oh):
            at = (ch * height + ho + h) * width + wo
            _run(src, base + at, dst, d0 + (ch * oh + h) * ow, ow, flip, mode, mean, at, mv,
                 scale)


@njit(cache=True, nogil=True)
def transform(x, h_off, w_off, mirror, mean_mode, mean, mean_values, scale, out):
    """``out[n, c, h, w'] = (x[n, c, h_off+h, w_off+w] - mean) * scale`` with ``w'``
    mirrored for flagged images. ``x`` is a C-contiguous (N, C, H, W) array of any real
    dtype; ``out`` (N, C, h, w) float32, C-contiguous; offsets were checked by the caller
    (``0 <= off <= H - h``)."""
    n, c, height, width = x.shape
    oh, ow = out.shape[2], out.shape[3]
    src = x.reshape(-1)
    dst = out.reshape(-1)
    flat_mean = mean.reshape(-1)
    for i in range(n):
        _image(src, i * c * height * width, c, height, width, h_off[i], w_off[i], mirror[i],
               mean_mode, flat_mean, mean_values, scale, dst, i * c * oh * ow, oh, ow)


@njit(cache=True, nogil=True)
def transform_datums(buf, starts, lengths, shape, h_off, w_off, mirror, mean_mode, mean,
                     mean_values, scale, out, labels, table):
    """Raw uint8 Datums to the transformed float32 batch in one pass. Record ``i`` lies at
    ``buf[starts[i] : starts[i] + lengths[i]]``; each is parsed (into ``table``, (N, NCOLS)
    int64) and must be a raw uint8 Datum of ``shape`` (C, H, W): returns -1 with ``out``
    ((N, C, h, w) float32, C-contiguous) and ``labels`` written, or the index of the first
    record that is not (nothing is promised about ``out`` then). Parsing a record just
    before its pixels are read keeps its bytes in the cache for them."""
    bad = parse_uniform(buf, starts, lengths, shape, table)
    if bad >= 0:
        return bad
    c, height, width = shape[0], shape[1], shape[2]
    oh, ow = out.shape[2], out.shape[3]
    dst = out.reshape(-1)
    flat_mean = mean.reshape(-1)
    for i in range(starts.shape[0]):
        _image(buf, table[i, COL_DATA_OFF], c, height, width, h_off[i], w_off[i], mirror[i],
               mean_mode, flat_mean, mean_values, scale, dst, i * c * oh * ow, oh, ow)
        labels[i] = table[i, COL_LABEL]
    return -1
