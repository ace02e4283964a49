"""Compiled (numba) hot loops of tensor records: batch gathers and the one-pass copy of a
uniform batch.

Kept apart from :mod:`lmdbio.codecs.tensor.format` and :mod:`lmdbio.codecs.tensor.batch` so
that importing them (and decoding single records) does not import numba; the batch decoder
imports this module on first use. Every kernel checks every offset against the buffer it
reads and reports a problem as the failing record's index, never reading outside its input.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lmdbio.kernels import copy_bytes


@njit(cache=True, nogil=True)
def gather_rows(buf, starts, nbytes, out):
    """Copy ``nbytes`` bytes from ``buf[starts[j]:]`` into the ``j``-th ``nbytes``-byte row of
    the flat uint8 ``out``. Returns the index of the first out-of-bounds source (the copy
    stops there), else -1."""
    size = buf.shape[0]
    for j in range(starts.shape[0]):
        s = starts[j]
        if s < 0 or s > size or nbytes > size - s:
            return j
        copy_bytes(out, np.int64(j) * nbytes, buf, s, np.int64(nbytes))
    return -1


@njit(cache=True, nogil=True)
def gather_headers(buf, starts, lengths, nbytes, out):
    """Copy the first ``min(nbytes, length)`` bytes of every record into ``out`` rows (zero
    padded); records outside the buffer get an all-zero row. Returns how many were outside."""
    size = buf.shape[0]
    bad = 0
    for j in range(starts.shape[0]):
        s = starts[j]
        ln = lengths[j]
        dst = out[j]
        for b in range(nbytes):
            dst[b] = 0
        if s < 0 or ln < 0 or s > size or ln > size - s:
            bad += 1
            continue
        m = nbytes if ln > nbytes else ln
        for b in range(m):
            dst[b] = buf[s + b]
    return bad


@njit(cache=True, nogil=True)
def uniform_tensors(buf, offsets, lengths, ref, nbytes, out, labels):
    """The common case of tensor records in one pass: every record's header equals ``ref``
    (label bytes 16..23 excepted) and its length is header + ``nbytes``. Copies the data into
    the flat uint8 ``out`` and the labels into ``labels``; returns -1 or the first index that
    does not fit."""
    n = offsets.shape[0]
    hs = ref.shape[0]
    size = buf.shape[0]
    total = hs + nbytes
    for i in range(n):
        s = offsets[i]
        if lengths[i] != total or s < 0 or s > size - total:
            return i
        for b in range(hs):
            if (b < 16 or b >= 24) and buf[s + b] != ref[b]:
                return i
    has_label = ref[7] & 1
    for i in range(n):
        s = offsets[i]
        if has_label:
            v = np.int64(0)
            for b in range(8):
                v |= np.int64(buf[s + 16 + b]) << (8 * b)
            labels[i] = v
        else:
            labels[i] = 0
        copy_bytes(out, np.int64(i) * nbytes, buf, s + hs, np.int64(nbytes))
    return -1
