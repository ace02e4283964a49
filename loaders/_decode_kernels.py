"""Compiled kernel of :mod:`loaders.decode`: Caffe Datum pixels straight to float32.

When the transform is the identity (Caffe's output is the pixels as float32), decoding to
uint8 and then converting writes and reads the batch once more than needed; this kernel
widens the pixel bytes into the float32 batch in the same pass that gathers them, with
streaming stores when the batch is too large to stay in the cache (see
:func:`lmdbio.compiled.widen_u8_f32`).
"""

from __future__ import annotations

from numba import njit

from lmdbio.codecs._record_kernels import COL_DATA_LEN, COL_DATA_OFF, COL_LABEL, parse_uniform
from lmdbio.compiled import copy_bytes, store_fence, widen_u8_f32


@njit(cache=True, nogil=True)
def widen_datums(buf, starts, lengths, shape, out, labels, table, header_fmt,
                 streaming=False):
    """Raw uint8 Datums to float32 in one pass: record ``i`` at ``buf[starts[i] :
    starts[i] + lengths[i]]`` is parsed (into ``table``) and must be a raw uint8 Datum of
    ``shape``; its pixels widened into row ``i`` of the 2-D ``out`` (N, C*H*W), its label
    into ``labels``. Returns -1, or the index of the first record that does not fit (``out``
    is then unspecified; a bad overflow page header when ``header_fmt`` is the database's
    page format counts as one: see :func:`~lmdbio.codecs._record_kernels.parse_uniform`)."""
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
