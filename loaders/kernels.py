"""Compiled CPU kernels of the loader: Caffe's transform (:mod:`loaders.transform`) and the
widening decode of Caffe Datums (:mod:`loaders.decode`).

Transform: Caffe's crop, mirror, mean and scale fused into one pass over each image (no
temporaries), float32 arithmetic in Caffe's order. Two entry points share one per-image
routine:

* :func:`transform` reads images from an ``(N, C, H, W)`` array (any real dtype);
* :func:`transform_datums` reads the uint8 pixels of raw Caffe Datums straight from the
  buffer that holds the records (a ring slot, or the database mapping), so a batch of Datums
  becomes the trainer's float32 batch in one pass: no uint8 batch is written and read again.

Images of several sizes in one batch (Caffe crops each datum on its own) take their own
entry points, :func:`transform_ragged` and :func:`transform_datums_ragged`, which the callers
choose only when a batch's records differ in shape.

Indices are unsigned: numba checks a signed index for a negative value (Python's wrap
around) on every element, which stops LLVM from vectorizing the loops. With unsigned
indices the row loops vectorize; measured on the 2-core VM on a CIFAR-like batch of 64
(3x32x32), scale only: 1.4 us per image against 4-5 us for per-row slices of the same
arithmetic, and 1.9 us for numpy's gather + convert + scale of the same bytes (the
``bench/peers.py`` floor). Callers check every offset and shape: these kernels do not.

A batch too large for the cache is written with non-temporal stores, a cache line at a time
(:func:`_stream_run`): ordinary stores read every output line first. Same values; which is
faster depends on the host, so :mod:`loaders.stores` makes it a setting.

Decode: when the transform is the identity (Caffe's output is the pixels as float32),
decoding to uint8 and then converting writes and reads the batch once more than needed;
:func:`widen_datums` widens the pixel bytes into the float32 batch in the same pass that
gathers them, with streaming stores when the batch is too large to stay in the cache (see
:func:`lmdbio.kernels.widen_u8_f32`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lmdbio.codecs.datum.kernels import (
    COL_CHANNELS,
    COL_DATA_LEN,
    COL_DATA_OFF,
    COL_ENCODED,
    COL_ERROR,
    COL_HEIGHT,
    COL_LABEL,
    COL_WIDTH,
    parse_datums,
    parse_uniform,
)
from lmdbio.kernels import (
    STREAM_PIXELS,
    copy_bytes,
    store_fence,
    store_transformed_line,
    widen_u8_f32,
)
from lmdbio.lmdb.kernels import bad_span_header

MEAN_NONE = 0
MEAN_FILE = 1
MEAN_VALUES = 2

_ONE = np.uint64(1)


@njit(cache=True, nogil=True, inline="always")
def _run(src, s, dst, d, count, flip, mode, mean, m, mv, scale, streaming):
    """``count`` values from ``src[s:]`` to ``dst[d:]`` (reversed when ``flip``):
    ``(x - mean) * scale`` as float32; ``mean[m:]`` with a mean image, ``mv`` with mean
    values. Every index is unsigned (see the module docstring). With ``streaming`` the
    64-byte aligned lines of the run are written with non-temporal stores
    (:func:`_stream_run`); the caller fences after its last image."""
    if streaming and count >= 2 * STREAM_PIXELS:
        _stream_run(src, s, dst, d, count, flip, mode, mean, m, mv, scale)
        return
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


@njit(cache=True, nogil=True, inline="always")
def _one(src, s, dst, d, mode, mean, m, mv, scale):
    """One value of :func:`_run`: ``dst[d] = (src[s] - mean) * scale`` as float32."""
    if mode == MEAN_FILE:
        dst[d] = (np.float32(src[s]) - mean[m]) * scale
    elif mode == MEAN_VALUES:
        dst[d] = (np.float32(src[s]) - mv) * scale
    else:
        dst[d] = np.float32(src[s]) * scale


@njit(cache=True, nogil=True)
def _stream_run(src, s, dst, d, count, flip, mode, mean, m, mv, scale):
    """:func:`_run` with the run's whole 64-byte lines of ``dst`` written by non-temporal
    stores (:func:`lmdbio.kernels.store_transformed_line`) and the partial lines at its
    ends by ordinary ones. Output position ``j`` of the run takes source position ``j``,
    or ``count - 1 - j`` when ``flip``."""
    image = mean if mode == MEAN_FILE else mean[:0]
    sub = mv if mode == MEAN_VALUES else np.float32(0.0)  # x - 0 is x: the same value
    addr = dst.ctypes.data
    j = 0
    while j < count and (addr + 4 * (d + j)) % 64 != 0:
        k = count - 1 - j if flip else j
        _one(src, s + k, dst, d + j, mode, mean, m + k, mv, scale)
        j += 1
    while j + STREAM_PIXELS <= count:
        k = count - STREAM_PIXELS - j if flip else j
        store_transformed_line(src, s + k, image, m + k, sub, scale, dst, d + j, flip)
        j += STREAM_PIXELS
    while j < count:
        k = count - 1 - j if flip else j
        _one(src, s + k, dst, d + j, mode, mean, m + k, mv, scale)
        j += 1


@njit(cache=True, nogil=True)
def _image(src, base, c, height, width, ho, wo, flip, mode, mean, mean_values, scale,
           dst, d0, oh, ow, streaming):
    """One image: the ``(C, H, W)`` pixels at ``src[base:]`` to the ``(C, oh, ow)`` output
    at ``dst[d0:]``, cropped at ``(ho, wo)``, mirrored when ``flip``. ``mean`` is the flat
    ``(C, H, W)`` mean image (read at the crop offset, as Caffe does)."""
    plane = height * width
    whole = oh == height and ow == width and not flip
    for ch in range(c):
        mv = mean_values[ch]
        if whole:  # uncropped, unmirrored: the channel is one contiguous run
            # ``flip`` is False here; passed as the variable, not the literal, so that
            # :func:`_stream_run` compiles one specialisation per source dtype, not two
            _run(src, base + ch * plane, dst, d0 + ch * plane, plane, flip, mode, mean,
                 ch * plane, mv, scale, streaming)
            continue
        for h in range(oh):
            at = (ch * height + ho + h) * width + wo
            _run(src, base + at, dst, d0 + (ch * oh + h) * ow, ow, flip, mode, mean, at, mv,
                 scale, streaming)


@njit(cache=True, nogil=True)
def transform(x, h_off, w_off, mirror, mean_mode, mean, mean_values, scale, out,
              streaming=False):
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
               mean_mode, flat_mean, mean_values, scale, dst, i * c * oh * ow, oh, ow,
               streaming)
    if streaming:
        store_fence()


@njit(cache=True, nogil=True)
def transform_datums(buf, starts, lengths, shape, h_off, w_off, mirror, mean_mode, mean,
                     mean_values, scale, out, labels, table, header_fmt, streaming):
    """Raw uint8 Datums to the transformed float32 batch in one pass. Record ``i`` lies at
    ``buf[starts[i] : starts[i] + lengths[i]]``; each is parsed (into ``table``, (N, NCOLS)
    int64) and must be a raw uint8 Datum of ``shape`` (C, H, W): returns -1 with ``out``
    ((N, C, h, w) float32, C-contiguous) and ``labels`` written, or the index of the first
    record that is not (nothing is promised about ``out`` then). Parsing a record just
    before its pixels are read keeps its bytes in the cache for them. ``header_fmt``: see
    :func:`~lmdbio.codecs.datum.kernels.parse_uniform` (a bad overflow header is a
    record that does not fit)."""
    bad = parse_uniform(buf, starts, lengths, shape, table, header_fmt)
    if bad >= 0:
        return bad
    c, height, width = shape[0], shape[1], shape[2]
    oh, ow = out.shape[2], out.shape[3]
    dst = out.reshape(-1)
    flat_mean = mean.reshape(-1)
    for i in range(starts.shape[0]):
        _image(buf, table[i, COL_DATA_OFF], c, height, width, h_off[i], w_off[i], mirror[i],
               mean_mode, flat_mean, mean_values, scale, dst, i * c * oh * ow, oh, ow,
               streaming)
        labels[i] = table[i, COL_LABEL]
    if streaming:
        store_fence()
    return -1


# ------------------------------------------------------------- images of mixed sizes
#
# Caffe crops every datum on its own: with ``crop_size`` the images of one batch may differ
# in height and width (not in channels), each cropped at an offset drawn for its own size.
# These kernels are the path a batch takes when its records differ in shape; the common
# batch of one shape never comes here.


@njit(cache=True, nogil=True, inline="always")
def _crop_offset(size, crop, train, u):
    """The crop offset in a side of ``size`` pixels: ``floor(u * (size - crop + 1))`` in
    train (``u`` uniform in [0, 1): every offset equally likely), the centre in test."""
    if not train:
        return (size - crop) // 2
    off = np.int64(u * np.float64(size - crop + 1))
    return min(off, size - crop)


@njit(cache=True, nogil=True)
def transform_ragged(src, starts, shapes, train, h_u, w_u, mirror, mean_mode, mean_values,
                     scale, out):
    """Images of their own sizes to the ``(N, C, crop, crop)`` float32 ``out``: image
    ``i`` is the ``shapes[i]`` = (C, H, W) pixels at ``src[starts[i]:]`` (any real dtype),
    cropped at offsets :func:`_crop_offset` of its own size, mirrored when ``mirror[i]``,
    ``(x - mean_values[c]) * scale`` (``mean_mode`` MEAN_NONE or MEAN_VALUES: a mean image
    has one size, so it never meets images of several). The caller checked that every
    image has ``C`` channels, is at least ``crop`` in both sides and lies inside ``src``."""
    c, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    dst = out.reshape(-1)
    no_mean = np.zeros(1, np.float32)
    for i in range(starts.shape[0]):
        height = shapes[i, 1]
        width = shapes[i, 2]
        ho = _crop_offset(height, oh, train, h_u[i])
        wo = _crop_offset(width, ow, train, w_u[i])
        # no streaming, as a run-time bool (not omitted): transform's specialisation
        _image(src, starts[i], c, height, width, ho, wo, mirror[i], mean_mode, no_mean,
               mean_values, scale, dst, i * c * oh * ow, oh, ow, np.bool_(False))


@njit(cache=True, nogil=True)
def transform_datums_ragged(buf, starts, lengths, train, h_u, w_u, mirror, mean_mode,
                            mean_values, scale, out, labels, table, header_fmt):
    """:func:`transform_datums` for a batch of raw uint8 Datums of several sizes, each
    cropped to ``out``'s ``crop x crop`` as :func:`transform_ragged` crops. Every record
    must parse without error, be raw uint8 with ``C`` = ``out.shape[1]`` channels, its
    pixels filling its shape, and be at least ``crop`` in height and width; returns -1, or
    the index of the first record that is not (``header_fmt``: a bad overflow page header
    of a span of the mapping counts as one, see
    :func:`~lmdbio.codecs.datum.kernels.parse_uniform`)."""
    c, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    n = starts.shape[0]
    if header_fmt.shape[0]:
        for i in range(n):
            if bad_span_header(buf, header_fmt, starts[i], lengths[i]) >= 0:
                return i
    parse_datums(buf, starts, lengths, table)
    for i in range(n):
        row = table[i]
        height = row[COL_HEIGHT]
        width = row[COL_WIDTH]
        if (row[COL_ERROR] != 0 or row[COL_ENCODED] != 0 or row[COL_CHANNELS] != c
                or height < oh or width < ow or height > (1 << 31) or width > (1 << 31)
                or row[COL_DATA_LEN] != c * height * width):
            return i
    dst = out.reshape(-1)
    no_mean = np.zeros(1, np.float32)
    for i in range(n):
        row = table[i]
        height = row[COL_HEIGHT]
        width = row[COL_WIDTH]
        ho = _crop_offset(height, oh, train, h_u[i])
        wo = _crop_offset(width, ow, train, w_u[i])
        # no streaming, as a run-time bool (not omitted): transform_datums' specialisation
        _image(buf, row[COL_DATA_OFF], c, height, width, ho, wo, mirror[i], mean_mode,
               no_mean, mean_values, scale, dst, i * c * oh * ow, oh, ow, np.bool_(False))
        labels[i] = row[COL_LABEL]
    return -1


@njit(cache=True, nogil=True)
def widen_datums(buf, starts, lengths, shape, out, labels, table, header_fmt,
                 streaming=False):
    """Raw uint8 Datums to float32 in one pass: record ``i`` at ``buf[starts[i] :
    starts[i] + lengths[i]]`` is parsed (into ``table``) and must be a raw uint8 Datum of
    ``shape``; its pixels widened into row ``i`` of the 2-D ``out`` (N, C*H*W), its label
    into ``labels``. Returns -1, or the index of the first record that does not fit (``out``
    is then unspecified; a bad overflow page header when ``header_fmt`` is the database's
    page format counts as one: see :func:`~lmdbio.codecs.datum.kernels.parse_uniform`)."""
    bad = parse_uniform(buf, starts, lengths, shape, table, header_fmt)
    if bad >= 0:
        return bad
    for i in range(starts.shape[0]):
        widen_u8_f32(buf, table[i, COL_DATA_OFF], out[i], streaming)
        labels[i] = table[i, COL_LABEL]
    if streaming:
        store_fence()
    return -1


@njit(cache=True, nogil=True)
def gather_pixels(buf, table, rows, starts, out):
    """The ``data`` bytes of the parsed raw Datums ``rows`` (``table`` from
    ``parse_datums``; each holds ``channels * height * width`` bytes, checked by the
    caller) into the flat uint8 ``out``, record ``rows[j]`` at ``out[starts[j]:]``: a batch
    of Datums of several sizes gathered back to back (a
    :class:`~loaders.transform.RaggedImages`)."""
    for j in range(rows.shape[0]):
        r = rows[j]
        copy_bytes(out, starts[j], buf, table[r, COL_DATA_OFF], table[r, COL_DATA_LEN])
