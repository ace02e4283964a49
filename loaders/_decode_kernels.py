"""Compiled kernel of :mod:`loaders.decode`: Caffe Datums straight to float32.

When the transform is the identity (Caffe's output is the pixels as float32), decoding to
uint8 and then converting writes and reads the batch once more than needed; this kernel
widens the pixel bytes into the float32 batch in the same pass that gathers them, with
streaming stores when the batch is too large to stay in the cache (see
:func:`lmdbio.compiled.widen_u8_f32`).
"""

from __future__ import annotations

from numba import njit

from lmdbio.codecs._record_kernels import (
    COL_CHANNELS,
    COL_DATA_LEN,
    COL_DATA_OFF,
    COL_ENCODED,
    COL_ERROR,
    COL_HEIGHT,
    COL_LABEL,
    COL_WIDTH,
)
from lmdbio.compiled import store_fence, widen_u8_f32


@njit(cache=True, nogil=True)
def uniform_datums_f32(buf, table, shape, out, labels, streaming=False):
    """The common case in one pass: every parsed record (``table`` from ``parse_datums``)
    is a raw uint8 Datum of ``shape`` (C, H, W) without error. Writes the pixels widened to
    float32 into the 2-D ``out`` (N, C*H*W) and the labels into ``labels``; returns -1, or
    the index of the first record that does not fit the case (``out`` is then unspecified).

    ``parse_datums`` checked that every ``data`` field lies inside ``buf``, so the copy reads
    only ``buf[data_off : data_off + size]`` of records that passed the checks.
    """
    n = table.shape[0]
    size = out.shape[1]
    for i in range(n):
        row = table[i]
        if (row[COL_ERROR] != 0 or row[COL_ENCODED] != 0 or row[COL_DATA_LEN] != size
                or row[COL_CHANNELS] != shape[0] or row[COL_HEIGHT] != shape[1]
                or row[COL_WIDTH] != shape[2]):
            return i
    for i in range(n):
        widen_u8_f32(buf, table[i, COL_DATA_OFF], out[i], streaming)
        labels[i] = table[i, COL_LABEL]
    if streaming:
        store_fence()
    return -1
