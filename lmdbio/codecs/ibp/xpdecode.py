"""Whole-array IBP decoder written against the array API: ``xp`` is numpy or cupy.

Every compressed row is decoded at once: participation bits -> per-chunk bit lengths ->
prefix sums (the bit offset of every chunk) -> two-word gathers -> shifts -> deposit of the
free bits run by run (tables from :meth:`IBPModel.runs`). It is the reference the kernels are
checked against and the GPU fallback that needs no compiled code. Shift counts are always
unsigned and below 64, so no backend meets an undefined shift.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel
from lmdbio.codecs.ibp.packed import IBPPacked, raise_decode_error


def _first(xp: Any, rows: Any, bad: Any) -> int:
    return int(rows[int(xp.argmax(bad))])


def decode_words_xp(model: IBPModel, packed: IBPPacked, xp: Any) -> Any:
    """(N, n) chunk words of ``packed`` as an ``xp`` array; CodecError on a corrupt row."""
    n = model.nchunks
    width = model.width
    logw = 5 if width == 32 else 6
    meta = model.meta_words
    nrows = packed.nrows
    wd = xp.uint32 if width == 32 else xp.uint64
    u64 = xp.uint64
    out = xp.empty((nrows, n), dtype=wd)
    if nrows == 0:
        return out
    words = xp.asarray(packed.data_words())
    nw = int(words.shape[0])
    idx = xp.arange(nrows, dtype=xp.int64)
    if packed.layout == "inplace":
        bm = xp.asarray(packed.bitmask)
        comp = ((bm[idx >> 3] >> (idx & 7).astype(xp.uint8)) & 1) == 1
        base = idx * n
        lengths = None
    else:
        lengths = xp.asarray(packed.lengths).astype(xp.int64)
        comp = lengths < n
        base = xp.cumsum(lengths) - lengths
        short = comp & (lengths < meta)
        if bool(xp.any(short)):
            raise_decode_error(6, _first(xp, idx, short))
    j = xp.arange(n, dtype=xp.int64)
    raw = xp.nonzero(~comp)[0]
    if raw.size:
        out[raw] = words[base[raw][:, None] + j[None, :]]
    crow = xp.nonzero(comp)[0]
    if crow.size == 0:
        return out
    k = model.nclusters
    cid = xp.asarray(packed.cluster_ids).astype(xp.int64)[crow] if k > 1 else None
    cb = base[crow]
    pw = words[cb[:, None] + (j >> logw)[None, :]].astype(u64)
    part = ((pw >> (j & (width - 1)).astype(u64)[None, :]) & 1) == 1
    pcs = xp.asarray(model.pcs)
    pcm = pcs[cid] if cid is not None else pcs[0][None, :]
    kbits = xp.where(part, width - pcm, width)
    csum = xp.cumsum(kbits, axis=1)
    stream = csum[:, -1]
    used = meta + (stream + width - 1) // width
    bad = used >= n if lengths is None else used != lengths[crow]
    if bool(xp.any(bad)):
        raise_decode_error(2, _first(xp, crow, bad))
    # padding after the last participation bit and after the last stream bit must be zero
    tail_bad = xp.zeros(crow.shape, dtype=bool)
    if n % width:
        lastp = words[cb + meta - 1].astype(u64)
        tail_bad |= (lastp >> u64(n % width)) != 0
    rem = stream % width
    lw_idx = xp.where(rem != 0, cb + meta + stream // width, cb)
    lw = words[lw_idx].astype(u64)
    free_tail = xp.where(rem != 0, width - rem, 0).astype(u64)  # < width, 0 when full
    keep = (u64(1) << free_tail) - u64(1)
    tail_bad |= (lw & keep) != 0
    if bool(xp.any(tail_bad)):
        raise_decode_error(5, _first(xp, crow, tail_bad))
    pos = (cb + meta)[:, None] * width + (csum - kbits)
    q = pos >> logw
    o = (pos & (width - 1)).astype(u64)
    hi = words[xp.minimum(q, nw - 1)].astype(u64)  # q may be the end if no bits remain
    lo = words[xp.minimum(q + 1, nw - 1)].astype(u64)
    if width == 32:
        v = (((hi << u64(32)) | lo) << o) >> u64(32)
        bits = v >> xp.where(part, pcm, 0).astype(u64)
    else:
        v = (hi << o) | ((lo >> u64(1)) >> (u64(63) - o))
        short_k = (63 - xp.minimum(kbits, 63)).astype(u64)
        bits = xp.where(kbits < 64, (v >> u64(1)) >> short_k, v)
    lo_t, mask_t, sh_t, rmax = model.runs()
    if cid is not None:
        sel = np.asarray(cid.get() if hasattr(cid, "get") else cid)
        lo_t, mask_t, sh_t = lo_t[sel], mask_t[sel], sh_t[sel]
        bitval = xp.asarray(model.bitvals64)[cid]
    else:
        lo_t, mask_t, sh_t = lo_t[0][None], mask_t[0][None], sh_t[0][None]
        bitval = xp.asarray(model.bitvals64)[0][None, :]
    lo_t, mask_t, sh_t = xp.asarray(lo_t), xp.asarray(mask_t), xp.asarray(sh_t)
    dep = bitval
    for r in range(int(rmax)):
        dep = dep | (((bits >> sh_t[..., r]) & mask_t[..., r]) << lo_t[..., r])
    out[crow] = xp.where(part, dep, bits).astype(wd)
    return out
