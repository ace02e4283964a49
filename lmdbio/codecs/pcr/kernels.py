"""numba kernels of :mod:`lmdbio.codecs.pcr` (imported on first use only).

``jpeg_scans`` walks the marker structure of a JPEG file and finds where every scan's
entropy-coded data ends; ``assemble`` rebuilds the images of a PCR value prefix.
Both return status codes instead of raising inside compiled code.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OK = 0
J_NO_SOI = 1  # does not start with FF D8
J_NO_MARKER = 2  # expected a marker (FF xx) at the offset
J_TRUNCATED = 3  # a segment or a scan runs past the end of the data
J_BAD_LENGTH = 4  # a segment length below 2
J_TOO_MANY = 5  # more scans than the output array holds
J_NO_EOI = 6  # data ends without an EOI marker
J_NO_SCAN = 7  # EOI before any scan
A_BAD = 10  # a PCR value's piece lengths do not fit its group extents


@njit(cache=True, nogil=True)
def jpeg_scans(buf, ends, info):
    """Fill ``ends[s]`` with the offset where scan ``s``'s entropy-coded data ends (the first
    byte of the following marker). ``info`` receives [frame SOF marker, EOI offset].
    Returns (status, n_scans, error offset)."""
    n = buf.shape[0]
    if n < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        return J_NO_SOI, 0, 0
    p = np.int64(2)
    ns = 0
    info[0] = 0
    info[1] = -1
    while True:
        if p >= n:
            return J_NO_EOI, ns, p
        if buf[p] != 0xFF:
            return J_NO_MARKER, ns, p
        while p < n and buf[p] == 0xFF:  # fill bytes before a marker
            p += 1
        if p >= n:
            return J_TRUNCATED, ns, p
        m = buf[p]
        mstart = p - 1
        p += 1
        if m == 0xD9:  # EOI
            if ns == 0:
                return J_NO_SCAN, ns, mstart
            info[1] = mstart
            return OK, ns, -1
        if m == 0x01 or (0xD0 <= m <= 0xD7) or m == 0xD8:  # standalone markers
            continue
        if p + 2 > n:
            return J_TRUNCATED, ns, mstart
        ln = (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])
        if ln < 2:
            return J_BAD_LENGTH, ns, mstart
        seg_end = p + ln
        if seg_end > n:
            return J_TRUNCATED, ns, mstart
        if (0xC0 <= m <= 0xCF) and m != 0xC4 and m != 0xC8 and m != 0xCC and info[0] == 0:
            info[0] = m
        p = seg_end
        if m == 0xDA:  # SOS: entropy-coded data follows until the next real marker
            j = p
            while True:
                if j + 1 >= n:
                    return J_TRUNCATED, ns, mstart
                if buf[j] == 0xFF:
                    nx = buf[j + 1]
                    if nx == 0x00 or (0xD0 <= nx <= 0xD7):
                        j += 2
                        continue
                    break
                j += 1
            if ns >= ends.shape[0]:
                return J_TOO_MANY, ns, mstart
            ends[ns] = j
            ns += 1
            p = j


@njit(cache=True, nogil=True)
def assemble(prefix, src_off, piece_len, k, out, img_off):
    """Concatenate pieces 0..k-1 of every image of a PCR value (piece g of image i is
    ``prefix[src_off[i, g]:src_off[i, g] + piece_len[i, g]]``) and append FF D9 to each.
    ``img_off`` (length N + 1) receives where each image lies in ``out``.
    Returns (status, image, group)."""
    n_img = piece_len.shape[0]
    pos = np.int64(0)
    img_off[0] = 0
    for i in range(n_img):
        for g in range(k):
            src = src_off[i, g]
            ln = piece_len[i, g]
            if src < 0 or src + ln > prefix.shape[0] or pos + ln + 2 > out.shape[0]:
                return A_BAD, i, g
            out[pos:pos + ln] = prefix[src:src + ln]
            pos += ln
        if pos + 2 > out.shape[0]:
            return A_BAD, i, k
        out[pos] = 0xFF
        out[pos + 1] = 0xD9
        pos += 2
        img_off[i + 1] = pos
    return OK, -1, -1
