"""Numba kernels of IBP: bit counting for fitting, row planning, packing and the CPU decoders.

Imported lazily (only by the functions that need numba). All kernels are
``@njit(cache=True, nogil=True)``; bit data is handled as ``uint64`` whatever the chunk width
(32 or 64 bits), counters and positions as ``int64``, so that numba never mixes signed and
unsigned integers into floats.

Two CPU decoders share the stream format:

* :func:`decode_rows32` / :func:`decode_rows64` -- the fast ones (one pass; 32-bit chunks
  two at a time through pair tables; hardware ``pdep`` where the CPU has a fast BMI2, a
  run-by-run software deposit elsewhere);
* :func:`decode_rows_mirror` -- a lane-by-lane model of the CUDA kernel in
  ``lmdbio/codecs/ibp/ibp_kernel.cu``: rounds of 32 chunks, exclusive scan of bit lengths,
  128-byte aligned segment loads into a 512-byte ring, software deposit. Tests compare it
  bit for bit with the fast decoder and the array-API decoder, so the GPU algorithm is
  checked on machines without a GPU.

Decoders never read outside the arrays they are given and return ``(code, row)``;
:data:`ERRORS` maps codes to messages.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

ONE = np.uint64(1)
ZERO = np.uint64(0)
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
LOW32 = np.uint64(0xFFFFFFFF)

#: error codes returned by the decoders
ERRORS = {
    1: "row runs past the end of the payload",
    2: "participation bits give a row size that does not match the stored size",
    3: "payload has bytes after the last row",
    4: "cluster id out of range",
    5: "non-zero padding bits after the last participation bit or the last stream bit",
    6: "stored row length out of range",
}

# CPUs whose PDEP/PEXT are microcoded (tens to hundreds of cycles): use the software deposit.
_SLOW_PDEP = {"znver1", "znver2", "bdver1", "bdver2", "bdver3", "bdver4"}


def _fast_bmi2() -> bool:
    """Whether numba compiles for a CPU with a fast hardware PDEP/PEXT."""
    cpu = os.environ.get("NUMBA_CPU_NAME", "host")
    if cpu not in ("", "host"):
        return False  # generic or foreign target: do not assume BMI2
    try:
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features()
        name = llvm.get_host_cpu_name()
    except Exception:  # pragma: no cover - llvmlite without host introspection
        return False
    return bool(feats.get("bmi2", False)) and name not in _SLOW_PDEP


HAVE_FAST_BMI2 = _fast_bmi2()


def _llvm_unary(name: str, extra_false: bool):
    @intrinsic
    def fn(typingctx, x):
        sig = types.int64(types.uint64)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            argtys = [i64, ir.IntType(1)] if extra_false else [i64]
            f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, argtys), name)
            call_args = [args[0], ir.Constant(ir.IntType(1), 0)] if extra_false else [args[0]]
            return builder.call(f, call_args)

        return sig, codegen

    return fn


#: population count / count leading zeros of a uint64 (LLVM intrinsics, every target)
popc64 = _llvm_unary("llvm.ctpop.i64", False)
clz64 = _llvm_unary("llvm.ctlz.i64", True)


def _llvm_binary(name: str):
    @intrinsic
    def fn(typingctx, x, m):
        sig = types.uint64(types.uint64, types.uint64)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, i64]),
                                               name)
            return builder.call(f, args)

        return sig, codegen

    return fn


@njit(inline="always")
def pdep_soft(bits, free):
    """Deposit the low popcount(free) bits of ``bits`` into the set bits of ``free``, highest
    first, one run of consecutive free bits at a time (what the CUDA kernel does)."""
    out = ZERO
    rem = popc64(free)
    f = free
    while f != ZERO:
        hb = 63 - clz64(f)
        below = (~f) & ((ONE << np.uint64(hb)) - ONE)
        lo = 0 if below == ZERO else 64 - clz64(below)
        ln = hb - lo + 1
        rem -= ln
        lenmask = ALL if ln == 64 else (ONE << np.uint64(ln)) - ONE
        out |= ((bits >> np.uint64(rem)) & lenmask) << np.uint64(lo)
        f &= (ONE << np.uint64(lo)) - ONE
    return out


@njit(inline="always")
def pext_soft(x, free):
    """Gather the bits of ``x`` at the set bits of ``free`` (highest first) into the low bits."""
    out = ZERO
    f = free
    while f != ZERO:
        hb = 63 - clz64(f)
        below = (~f) & ((ONE << np.uint64(hb)) - ONE)
        lo = 0 if below == ZERO else 64 - clz64(below)
        ln = hb - lo + 1
        if ln == 64:
            out = x
        else:
            out = (out << np.uint64(ln)) | ((x >> np.uint64(lo)) & ((ONE << np.uint64(ln)) - ONE))
        f &= (ONE << np.uint64(lo)) - ONE
    return out


if HAVE_FAST_BMI2:
    pdep = _llvm_binary("llvm.x86.bmi.pdep.64")
    pext = _llvm_binary("llvm.x86.bmi.pext.64")
else:
    pdep = pdep_soft
    pext = pext_soft


# --------------------------------------------------------------------------------------------
# fitting


@njit(cache=True, nogil=True)
def bit_count_rows(words, labels, counts):
    """``counts[c, b, j] += 1`` for every row of cluster ``labels[i]`` (0 if ``labels`` is
    empty) whose chunk ``j`` has bit ``b`` set. The inner loop runs over chunk columns, so it
    vectorizes; per-block int32 partial counts keep the adds narrow."""
    nrows, n = words.shape
    width = counts.shape[1]
    block = 1 << 20
    part = np.zeros((counts.shape[0], width, n), np.int32)
    for start in range(0, nrows, block):
        stop = min(nrows, start + block)
        part[:] = 0
        for i in range(start, stop):
            c = labels[i] if labels.shape[0] > 0 else 0
            row = words[i]
            pc = part[c]
            for b in range(width):
                pb = pc[b]
                ub = np.uint64(b)
                for j in range(n):
                    pb[j] += np.int32((np.uint64(row[j]) >> ub) & ONE)
        counts += part


@njit(cache=True, nogil=True)
def mismatch_histogram(words, select, majority, rank, hist):
    """For column ``j``, histogram of the rank (in column ``j``'s bit order) of the first bit
    where a selected row differs from the column's majority value; ``W`` if none differs.

    A row matches the prefix mask made of the first ``p`` bits of the order iff its first
    mismatch has rank >= p, so ``hist`` gives, for every prefix, how many rows it compresses.
    """
    nrows, n = words.shape
    width = hist.shape[1] - 1
    for i in range(nrows):
        if not select[i]:
            continue
        for j in range(n):
            d = np.uint64(words[i, j]) ^ np.uint64(majority[j])
            k = width
            while d != ZERO:
                low = d & (~d + ONE)
                b = popc64(low - ONE)
                r = rank[j, b]
                if r < k:
                    k = r
                d ^= low
            hist[j, k] += 1


@njit(cache=True, nogil=True)
def plan_rows(words, masks, bitvals, pcs, meta_words, width, out_words, out_saved, out_cid):
    """For every row choose the cluster whose mask gives the fewest words; the row's stored
    size is ``meta_words + ceil(stream_bits / W)`` words when that is smaller than the raw
    row (``n`` words), else ``n`` (stored raw, cluster id 0). ``out_saved`` is the chosen
    cluster's saving in bits (participation bits not charged), also for raw rows."""
    nrows, n = words.shape
    k = masks.shape[0]
    for i in range(nrows):
        best_words = 0
        best_saved = 0
        best_c = 0
        for c in range(k):
            saved = 0
            for j in range(n):
                x = np.uint64(words[i, j])
                if (x & np.uint64(masks[c, j])) == np.uint64(bitvals[c, j]):
                    saved += pcs[c, j]
            stream = n * width - saved
            w = meta_words + (stream + width - 1) // width
            if c == 0 or w < best_words:
                best_words = w
                best_saved = saved
                best_c = c
        if best_words >= n:
            best_words = n
            best_c = 0
        out_words[i] = best_words
        out_saved[i] = best_saved
        out_cid[i] = best_c


@njit(cache=True, nogil=True)
def hamming_assign(words, centroids, out_label, out_dist):
    """Nearest centroid of every row under the Hamming distance of their bits."""
    nrows, n = words.shape
    k = centroids.shape[0]
    for i in range(nrows):
        best = -1
        best_c = 0
        for c in range(k):
            d = 0
            for j in range(n):
                d += popc64(np.uint64(words[i, j]) ^ np.uint64(centroids[c, j]))
                if best >= 0 and d >= best:
                    break
            if best < 0 or d < best:
                best = d
                best_c = c
        out_label[i] = best_c
        out_dist[i] = best


# --------------------------------------------------------------------------------------------
# packing


@njit(inline="always")
def _encode_row32(words, i, masks, bitvals, frees, pcu, c, n, meta_words, out, base):
    """Participation bits then stream of row ``i`` at word ``base`` (a 64-bit accumulator
    holds the pending bits; words are emitted MSB-first)."""
    acc = ZERO
    nb = np.uint64(0)
    q = np.uint64(base + meta_words)
    for g in range(meta_words):
        pw = ZERO
        for j in range(g * 32, min(n, g * 32 + 32)):
            uj = np.uint64(j)
            x = np.uint64(words[i, uj])
            hit = (x & masks[c, uj]) == bitvals[c, uj]
            sel = ZERO - np.uint64(hit)
            pw |= (sel & ONE) << (uj & np.uint64(31))
            k = np.uint64(32) - (pcu[c, uj] & sel)
            bits = pext(x, (frees[c, uj] & sel) | (LOW32 & ~sel))
            acc = (acc << k) | bits
            nb += k
            if nb >= np.uint64(32):
                nb -= np.uint64(32)
                out[q] = acc >> nb
                q += ONE
                acc &= (ONE << nb) - ONE
        out[np.uint64(base + g)] = pw
    if nb > ZERO:
        out[q] = acc << (np.uint64(32) - nb)


@njit(inline="always")
def _encode_row64(words, i, masks, bitvals, frees, pcu, c, n, meta_words, out, base):
    """As :func:`_encode_row32` for 64-bit chunks: ``pend`` holds fewer than 64 bits."""
    pend = ZERO
    nb = np.uint64(0)
    q = np.uint64(base + meta_words)
    for g in range(meta_words):
        pw = ZERO
        for j in range(g * 64, min(n, g * 64 + 64)):
            uj = np.uint64(j)
            x = np.uint64(words[i, uj])
            hit = (x & masks[c, uj]) == bitvals[c, uj]
            sel = ZERO - np.uint64(hit)
            pw |= (sel & ONE) << (uj & np.uint64(63))
            k = np.uint64(64) - (pcu[c, uj] & sel)
            bits = pext(x, (frees[c, uj] & sel) | ~sel)
            if k == ZERO:
                continue
            if nb + k < np.uint64(64):
                pend = (pend << k) | bits
                nb += k
            else:
                fill = np.uint64(64) - nb  # 1..64
                head = bits >> (k - fill)  # k - fill < 64
                out[q] = head if nb == ZERO else (pend << fill) | head
                q += ONE
                nb = k - fill
                pend = bits & ((ONE << nb) - ONE)
        out[np.uint64(base + g)] = pw
    if nb > ZERO:
        out[q] = pend << (np.uint64(64) - nb)


@njit(cache=True, nogil=True)
def encode_rows(words, masks, bitvals, frees, pcu, cids, row_words, row_off, meta_words, width,
                out):
    """Write every row at word offset ``row_off[i]`` of ``out``: raw when ``row_words[i] == n``,
    else participation bits then the bit stream (exactly ``row_words[i]`` words, the last one
    zero-padded). In-place slots are zeroed past the prefix by the caller."""
    nrows, n = words.shape
    for i in range(nrows):
        base = row_off[i]
        if row_words[i] >= n:
            ub = np.uint64(base)
            for j in range(n):
                out[ub + np.uint64(j)] = words[i, np.uint64(j)]
            continue
        c = cids[i]
        if width == 32:
            _encode_row32(words, i, masks, bitvals, frees, pcu, c, n, meta_words, out, base)
        else:
            _encode_row64(words, i, masks, bitvals, frees, pcu, c, n, meta_words, out, base)


# --------------------------------------------------------------------------------------------
# fast decoder


@njit(inline="always")
def _stream_bits(words, base, meta_words, n, width, pcu, c):
    """Bits of a compressed row's stream, from its participation bits."""
    total = 0
    for j in range(n):
        part = (np.uint64(words[base + j // width]) >> np.uint64(j % width)) & ONE
        total += width - (np.int64(pcu[c, j]) if part else 0)
    return total


# The row decoders below use unsigned indices (numba then emits no negative-index
# wraparound), load each participation word once per W chunks, and select raw/compressed with
# masks instead of branches: for a raw chunk the free mask is all ones, the popcount and bit
# values are zero, so the same pdep copies it. They read up to 3 words past the row's last
# stream word without bounds checks: the caller guarantees those words exist (rows near the
# end of the payload are decoded from a zero-padded copy).


@njit(inline="always")
def _decode_row32(words, base, meta_words, n, frees, bitvals, pcu, pfm, pbv, pk, c, out, i):
    """32-bit chunks two at a time: the pair's 2-bit participation pattern picks a combined
    64-bit free mask, bit values and bit count from the model's pair tables, so one 64-bit
    window read, one pdep and one OR decode both chunks (chunk j lands in the high half)."""
    ub = np.uint64(base)
    pos = (ub + np.uint64(meta_words)) * np.uint64(32)
    start = pos
    for g in range(meta_words):
        pw = np.uint64(words[ub + np.uint64(g)])
        j0 = g * 32
        cnt = min(n, j0 + 32) - j0
        for pp in range(cnt >> 1):
            t = pw & np.uint64(3)
            pw >>= np.uint64(2)
            jj = np.uint64((j0 >> 1) + pp)
            k = pk[c, jj, t]
            q = pos >> np.uint64(5)
            o = pos & np.uint64(31)
            v = (((np.uint64(words[q]) << np.uint64(32)) | np.uint64(words[q + ONE])) << o) | (
                np.uint64(words[q + np.uint64(2)]) >> (np.uint64(32) - o))
            # v >> (64 - k); k == 0 only when both chunks have no free bit (pdep mask 0)
            val = pdep(v >> ((np.uint64(64) - k) & np.uint64(63)), pfm[c, jj, t]) | pbv[c, jj, t]
            j = np.uint64(j0) + np.uint64(2 * pp)
            out[i, j] = val >> np.uint64(32)
            out[i, j + ONE] = val & LOW32
            pos += k
        if cnt & 1:  # odd tail chunk
            uj = np.uint64(j0 + cnt - 1)
            sel = ZERO - (pw & ONE)
            pcj = pcu[c, uj] & sel
            fm = (frees[c, uj] & sel) | (LOW32 & ~sel)
            q = pos >> np.uint64(5)
            v = ((np.uint64(words[q]) << np.uint64(32)) | np.uint64(words[q + ONE])) << (
                pos & np.uint64(31))
            out[i, uj] = pdep((v >> np.uint64(32)) >> pcj, fm) | (bitvals[c, uj] & sel)
            pos += np.uint64(32) - pcj
    return np.int64(pos - start)


@njit(inline="always")
def _decode_row64(words, base, meta_words, n, frees, bitvals, pcu, c, out, i):
    ub = np.uint64(base)
    pos = (ub + np.uint64(meta_words)) * np.uint64(64)
    start = pos
    for g in range(meta_words):
        pw = np.uint64(words[ub + np.uint64(g)])
        for j in range(g * 64, min(n, g * 64 + 64)):
            uj = np.uint64(j)
            sel = ZERO - (pw & ONE)
            pw >>= ONE
            pcj = pcu[c, uj] & sel
            fm = (frees[c, uj] & sel) | ~sel
            q = pos >> np.uint64(6)
            o = pos & np.uint64(63)
            v = (np.uint64(words[q]) << o) | (
                (np.uint64(words[q + ONE]) >> ONE) >> (np.uint64(63) - o))
            # v >> (64 - k) with k = 64 - pcj; pcj == 64 (all bits invariant) has no free
            # bit, so pdep(anything, 0) = 0 and the shift only needs to stay defined
            out[i, uj] = pdep(v >> (pcj & np.uint64(63)), fm) | (bitvals[c, uj] & sel)
            pos += np.uint64(64) - pcj
    return np.int64(pos - start)


@njit(nogil=True)
def _decode_row_padded(words, base, meta_words, n, width, frees, bitvals, pcu, pfm, pbv, pk, c,
                       out, i):
    """A compressed row near the end of ``words``: size its stream from the participation
    bits (-1 if it runs past the end), then decode it from a zero-padded copy."""
    nw = words.shape[0]
    stream = _stream_bits(words, base, meta_words, n, width, pcu, c)
    if base + meta_words + (stream + width - 1) // width > nw:
        return -1
    src = np.zeros(meta_words + n + 3, words.dtype)
    avail = min(nw - base, src.shape[0])
    src[:avail] = words[base:base + avail]
    if width == 32:
        return _decode_row32(src, 0, meta_words, n, frees, bitvals, pcu, pfm, pbv, pk, c, out, i)
    return _decode_row64(src, 0, meta_words, n, frees, bitvals, pcu, c, out, i)


@njit(inline="always")
def _check_tail(words, base, meta_words, n, width, stream):
    """Padding after the last participation bit and after the last stream bit must be zero."""
    if n % width != 0:
        pw = np.uint64(words[base + meta_words - 1])
        if (pw >> np.uint64(n % width)) != ZERO:
            return False
    r = stream % width
    if r != 0:
        lw = np.uint64(words[base + meta_words + stream // width])
        if (lw & ((ONE << np.uint64(width - r)) - ONE)) != ZERO:
            return False
    return True


@njit(inline="always")
def _decode_all(words, inplace, bitmask, lengths, cids, nclusters, frees, bitvals, pcu, pfm,
                pbv, pk, meta_words, out, width):
    # The per-row logic is written out in the loop on purpose: moving it into an inlined
    # helper returning (code, words) made this loop twice as slow (measured).
    nrows = out.shape[0]
    n = out.shape[1]
    nw = words.shape[0]
    base = 0
    for i in range(nrows):
        c = 0
        if cids.shape[0] > 0:
            c = np.int64(cids[i])
            if c >= nclusters:
                return 4, i
        if inplace:
            base = i * n
            comp = ((bitmask[i >> 3] >> (i & 7)) & 1) == 1
            rowlen = n
        else:
            rowlen = np.int64(lengths[i])
            comp = rowlen < n
            if rowlen > n or (comp and rowlen < meta_words):
                return 6, i
        if base + rowlen > nw:
            return 1, i
        if not comp:
            ub = np.uint64(base)
            for j in range(n):
                out[i, np.uint64(j)] = words[ub + np.uint64(j)]
        else:
            if base + meta_words + n + 3 > nw:
                stream = _decode_row_padded(words, base, meta_words, n, width, frees, bitvals,
                                            pcu, pfm, pbv, pk, c, out, i)
                if stream < 0:
                    return 1, i
            elif width == 32:
                stream = _decode_row32(words, base, meta_words, n, frees, bitvals, pcu, pfm,
                                       pbv, pk, c, out, i)
            else:
                stream = _decode_row64(words, base, meta_words, n, frees, bitvals, pcu, c, out,
                                       i)
            used = meta_words + (stream + width - 1) // width
            if (inplace and used >= n) or (not inplace and used != rowlen):
                return 2, i
            if not _check_tail(words, base, meta_words, n, width, stream):
                return 5, i
        base += rowlen
    if not inplace and base != nw:
        return 3, nrows
    return 0, -1


@njit(cache=True, nogil=True)
def decode_rows32(words, inplace, bitmask, lengths, cids, nclusters, frees, bitvals, pcu, pfm,
                  pbv, pk, meta_words, out):
    """Decode every row of an in-place or condensed payload of 32-bit chunks into ``out``
    (nrows x n words).

    ``words`` is the data section as uint32 words; in-place rows sit at ``i * n`` with
    ``bitmask`` saying which are compressed, condensed rows follow each other with
    ``lengths[i]`` words each (``n`` = raw). ``frees``, ``bitvals`` and ``pcu`` (popcounts)
    are (clusters, n) uint64; ``pfm``, ``pbv``, ``pk`` the pair tables
    (:meth:`IBPModel.pair_tables`). Returns ``(0, -1)`` or ``(error code, row)``. The chunk
    width is a constant in each of ``decode_rows32``/``decode_rows64`` so that only one row
    decoder is compiled into the loop.
    """
    return _decode_all(words, inplace, bitmask, lengths, cids, nclusters, frees, bitvals, pcu,
                       pfm, pbv, pk, meta_words, out, 32)


@njit(cache=True, nogil=True)
def decode_rows64(words, inplace, bitmask, lengths, cids, nclusters, frees, bitvals, pcu, pfm,
                  pbv, pk, meta_words, out):
    """:func:`decode_rows32` for 64-bit chunks (the pair tables are unused)."""
    return _decode_all(words, inplace, bitmask, lengths, cids, nclusters, frees, bitvals, pcu,
                       pfm, pbv, pk, meta_words, out, 64)


# --------------------------------------------------------------------------------------------
# mirror of the CUDA kernel

RING = 512  # bytes of shared memory staging per warp in ibp_kernel.cu
SEGMENT = 128  # bytes per aligned warp load
LANES = 32


@njit(inline="always")
def _ring_word(ring, addr, chunk):
    v = ZERO
    for b in range(chunk):
        v |= np.uint64(ring[(addr + b) & (RING - 1)]) << np.uint64(8 * b)
    return v


@njit(cache=True, nogil=True)
def decode_rows_mirror(src, addr0, inplace, bitmask, lengths, row_off, cids, nclusters, masks,
                       bitvals, pcs, meta_words, width, out):
    """Lane-by-lane model of ``ibp_decompress`` in ibp_kernel.cu (one warp per row).

    ``src`` is the data section as bytes, ``addr0`` the address its first byte would have on
    the device modulo 128 (the kernel aligns loads to absolute addresses), ``row_off`` the
    byte offset of every row. Per round of 32 chunks: every lane reads its participation bit
    from global memory, takes its bit length, the warp scans the lengths, 128-byte aligned
    segments covering the round's words are loaded into the ring, and every lane extracts its
    bits from the ring and deposits them (software deposit, as on the GPU).
    """
    nrows = out.shape[0]
    n = out.shape[1]
    chunk = width // 8
    srclen = src.shape[0]
    ring = np.zeros(RING, dtype=np.uint8)
    klane = np.zeros(LANES, dtype=np.int64)
    excl = np.zeros(LANES, dtype=np.int64)
    part = np.zeros(LANES, dtype=np.bool_)
    allw = ALL if width == 64 else LOW32
    for i in range(nrows):
        c = 0
        if cids.shape[0] > 0:
            c = np.int64(cids[i])
            if c >= nclusters:
                return 4, i
        rstart = row_off[i]
        if inplace:
            comp = ((bitmask[i >> 3] >> (i & 7)) & 1) == 1
            rowlen = n
        else:
            rowlen = np.int64(lengths[i])
            comp = rowlen < n
            if rowlen > n or (comp and rowlen < meta_words):
                return 6, i
        if rstart + rowlen * chunk > srclen:
            return 1, i
        if not comp:
            for j in range(n):
                v = ZERO
                for b in range(chunk):
                    v |= np.uint64(src[rstart + j * chunk + b]) << np.uint64(8 * b)
                out[i, j] = v
            continue
        stream_start = addr0 + rstart + meta_words * chunk  # absolute address
        loaded_end = stream_start - (stream_start % SEGMENT)
        bitpos = 0
        for r in range(0, n, LANES):
            # lanes: participation bit and bit length
            for lane in range(LANES):
                j = r + lane
                klane[lane] = 0
                part[lane] = False
                if j < n:
                    pb = rstart + (j >> 3)
                    byte = src[pb] if pb < srclen else 0
                    part[lane] = ((byte >> (j & 7)) & 1) == 1
                    klane[lane] = width - pcs[c, j] if part[lane] else width
            # exclusive warp scan
            acc = 0
            for lane in range(LANES):
                excl[lane] = acc
                acc += klane[lane]
            end_bits = bitpos + acc
            need_end = stream_start + ((end_bits + width - 1) // width) * chunk
            # aligned segment loads into the ring (each lane 4 bytes, guarded at the end)
            while loaded_end < need_end:
                for lane in range(LANES):
                    a = loaded_end + 4 * lane
                    off = a - addr0
                    for b in range(4):
                        if 0 <= off + b < srclen:
                            ring[(a + b) & (RING - 1)] = src[off + b]
                        else:
                            ring[(a + b) & (RING - 1)] = 0
                loaded_end += SEGMENT
            # lanes: extract and deposit
            for lane in range(LANES):
                j = r + lane
                if j >= n:
                    continue
                k = klane[lane]
                p = bitpos + excl[lane]
                q = p // width
                o = p % width
                aq = stream_start + q * chunk
                hi = _ring_word(ring, aq, chunk)
                lo = _ring_word(ring, aq + chunk, chunk) if o + k > width else ZERO
                if o == 0:
                    v = hi
                else:
                    v = ((hi << np.uint64(o)) | (lo >> np.uint64(width - o))) & allw
                bits = ZERO if k == 0 else v >> np.uint64(width - k)
                if part[lane]:
                    free = (~np.uint64(masks[c, j])) & allw
                    out[i, j] = pdep_soft(bits, free) | np.uint64(bitvals[c, j])
                else:
                    out[i, j] = bits
            bitpos = end_bits
        used = meta_words + (bitpos + width - 1) // width
        if (inplace and used >= n) or (not inplace and used != rowlen):
            return 2, i
        # tail checks, as the kernel's lane 0 does them (from global memory)
        if n % width != 0:
            pw = ZERO
            pstart = rstart + (meta_words - 1) * chunk
            for b in range(chunk):
                pw |= np.uint64(src[pstart + b]) << np.uint64(8 * b)
            if (pw >> np.uint64(n % width)) != ZERO:
                return 5, i
        rem = bitpos % width
        if rem != 0:
            lw = ZERO
            lstart = rstart + (meta_words + bitpos // width) * chunk
            for b in range(chunk):
                lw |= np.uint64(src[lstart + b]) << np.uint64(8 * b)
            if (lw & ((ONE << np.uint64(width - rem)) - ONE)) != ZERO:
                return 5, i
    return 0, -1
