"""Compiled CPU kernel of :mod:`loaders.transform`: crop, mirror, mean and scale fused into
one pass over each image (no temporaries), float32 arithmetic in Caffe's order."""

from __future__ import annotations

import numpy as np
from numba import njit

MEAN_NONE = 0
MEAN_FILE = 1
MEAN_VALUES = 2


@njit(cache=True, nogil=True)
def transform(x, h_off, w_off, mirror, mean_mode, mean, mean_values, scale, out):
    """``out[n, c, h, w'] = (x[n, c, h_off+h, w_off+w] - mean) * scale`` with ``w'`` mirrored
    for flagged images. ``x`` is (N, C, H, W) of any real dtype; ``out`` (N, C, h, w) float32;
    offsets were checked by the caller (``0 <= off <= H - h``).

    Rows are computed with branch-free loops over sliced views (so LLVM vectorizes them) and
    mirrored rows are reversed in place afterwards: a mirror moves values, never changes them.
    """
    n, c, oh, ow = out.shape
    for i in range(n):
        ho = h_off[i]
        wo = w_off[i]
        flip = mirror[i]
        for ch in range(c):
            mv = mean_values[ch]
            for h in range(oh):
                src = x[i, ch, ho + h, wo:wo + ow]
                dst = out[i, ch, h]
                if mean_mode == MEAN_FILE:
                    mrow = mean[ch, ho + h, wo:wo + ow]
                    for w in range(ow):
                        dst[w] = (np.float32(src[w]) - mrow[w]) * scale
                elif mean_mode == MEAN_VALUES:
                    for w in range(ow):
                        dst[w] = (np.float32(src[w]) - mv) * scale
                else:
                    for w in range(ow):
                        dst[w] = np.float32(src[w]) * scale
                if flip:
                    for w in range(ow // 2):
                        t = dst[w]
                        dst[w] = dst[ow - 1 - w]
                        dst[ow - 1 - w] = t
