"""Compiled kernels of the TOC codec: encoding, tree rebuild, decoding and every operation.

Everything here is ``numba.njit(cache=True, nogil=True)``: no per-element Python runs when a
mini-batch is compressed, parsed or multiplied. Kernels that read untrusted input (the bit
unpacker and the tree rebuild) check every index they use and return an error code instead
of raising, so the Python wrapper can raise :class:`lmdbio.errors.CodecError` with a message;
the operation kernels run only on structures the rebuild has validated.

Node numbering (the prefix tree ``C'`` of the paper): nodes ``0 .. L-1`` are the first layer
(one per distinct ``(column, value)`` pair, numbered by first appearance), nodes ``L ..`` are
the sequences added by the LZW pass, in creation order. After the rebuild only *live* nodes
are kept (those a code refers to, and their ancestors) and renumbered densely, so operations
touch no node that cannot contribute to a result.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ---------------------------------------------------------------------------------------------
# status codes returned by the validating kernels (mapped to messages in format.py)
OK = 0
ERR_TRUNCATED = 1  # a packed section ends before the integers it should hold
ERR_COLUMN = 2  # a first-layer column index >= number of columns
ERR_VALUE_INDEX = 3  # a first-layer value index >= number of distinct values
ERR_ROW_LENGTHS = 4  # row lengths do not add up to the number of codes
ERR_CODE = 5  # a code refers to a node that does not exist (yet)
ERR_ORDER = 6  # decoded columns of a row are not strictly ascending
ERR_PADDING = 7  # non-zero bits after the last packed integer of a section
ERR_TRAILING = 8  # bytes left over after the last packed integer of a section
ERR_COUNTS = 9  # per-column pair counts do not add up to the number of pairs

# (numba freezes module-level numpy scalars through pickling at every call: use literals)


@njit(cache=True, nogil=True, inline="always")
def _mix(x):
    """splitmix64's finalizer: a cheap, well-spread 64-bit hash."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True)
def _table_capacity(n):
    cap = 16
    while cap < 2 * n + 2:
        cap *= 2
    return cap


# ---------------------------------------------------------------------------------------------
# sparse encoding: (column, value-bits) pairs per row, zeros (bit pattern 0) dropped


@njit(cache=True, nogil=True)
def dense_pairs(bits):
    """Row-major non-zero pairs of a 2-D unsigned view of a dense matrix.

    A cell is "zero" only when all its bits are 0, so -0.0 and NaN are kept as stored pairs.
    Returns ``(indptr int64[n+1], cols int32[nnz], vbits uint64[nnz])``.
    """
    n, m = bits.shape
    indptr = np.zeros(n + 1, np.int64)
    for r in range(n):
        c = 0
        for j in range(m):
            if bits[r, j] != 0:
                c += 1
        indptr[r + 1] = indptr[r] + c
    nnz = indptr[n]
    cols = np.empty(nnz, np.int32)
    vbits = np.empty(nnz, np.uint64)
    p = 0
    for r in range(n):
        for j in range(m):
            b = bits[r, j]
            if b != 0:
                cols[p] = j
                vbits[p] = np.uint64(b)
                p += 1
    return indptr, cols, vbits


@njit(cache=True, nogil=True)
def csr_pairs(indptr, indices, data_bits):
    """The pairs of a canonical CSR matrix (sorted, no duplicates) minus explicit +0 entries."""
    n = indptr.size - 1
    out_ptr = np.zeros(n + 1, np.int64)
    cols = np.empty(indices.size, np.int32)
    vbits = np.empty(indices.size, np.uint64)
    p = 0
    for r in range(n):
        for q in range(indptr[r], indptr[r + 1]):
            b = data_bits[q]
            if b != 0:
                cols[p] = indices[q]
                vbits[p] = np.uint64(b)
                p += 1
        out_ptr[r + 1] = p
    return out_ptr, cols[:p].copy(), vbits[:p].copy()


# ---------------------------------------------------------------------------------------------
# logical encoding


@njit(cache=True, nogil=True)
def lzw_encode(indptr, cols, vbits):
    """Value indexing, first tree layer and the LZW pass of TOC (Algorithm 1 of the paper).

    Returns ``(pair_col int32[L], pair_vidx int32[L], values uint64[V], row_len int32[n],
    codes int32[n_codes], n_nodes)``: distinct values numbered by first appearance (row-major),
    distinct pairs sorted by (column, value index), and per row the node indices of its
    longest-match decomposition. The tree is
    shared by the rows of the batch but a node never spans two rows: the last match of a row
    adds no node.
    """
    n = indptr.size - 1
    nnz = cols.size
    # value indexing: bits -> value index (0 is never a stored value: zeros are dropped)
    vcap = _table_capacity(nnz)
    vmask = np.uint64(vcap - 1)
    vkeys = np.zeros(vcap, np.uint64)
    vids = np.empty(vcap, np.int32)
    values = np.empty(nnz, np.uint64)
    nv = 0
    # pair table: (column << 32 | value index) -> pair id
    pcap = vcap
    pmask = vmask
    pkeys = np.full(pcap, np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64)
    pids = np.empty(pcap, np.int32)
    pair_col = np.empty(nnz, np.int32)
    pair_vidx = np.empty(nnz, np.int32)
    npairs = 0
    seq = np.empty(nnz, np.int32)
    for p in range(nnz):
        b = vbits[p]
        h = _mix(b) & vmask
        while True:
            k = vkeys[h]
            if k == b:
                vid = vids[h]
                break
            if k == 0:
                vkeys[h] = b
                vids[h] = nv
                values[nv] = b
                vid = nv
                nv += 1
                break
            h = (h + np.uint64(1)) & vmask
        key = (np.uint64(cols[p]) << np.uint64(32)) | np.uint64(vid)
        h = _mix(key) & pmask
        while True:
            k = pkeys[h]
            if k == key:
                pid = pids[h]
                break
            if k == np.uint64(0xFFFFFFFFFFFFFFFF):
                pkeys[h] = key
                pids[h] = npairs
                pair_col[npairs] = cols[p]
                pair_vidx[npairs] = vid
                pid = npairs
                npairs += 1
                break
            h = (h + np.uint64(1)) & pmask
        seq[p] = pid

    # first layer sorted by (column, value index): the columns then compress to per-column
    # counts, and the order is free (any numbering of the first layer is a valid tree)
    order = np.argsort((pair_col[:npairs].astype(np.int64) << 32)
                       | pair_vidx[:npairs].astype(np.int64))
    rank = np.empty(npairs, np.int32)
    for i in range(npairs):
        rank[order[i]] = i
    sorted_col = np.empty(npairs, np.int32)
    sorted_vidx = np.empty(npairs, np.int32)
    for i in range(npairs):
        sorted_col[i] = pair_col[order[i]]
        sorted_vidx[i] = pair_vidx[order[i]]
    for p in range(nnz):
        seq[p] = rank[seq[p]]

    # LZW over pair ids, tuple boundaries kept. child table: (node << 32 | pair) -> child
    ccap = _table_capacity(nnz)
    cmask = np.uint64(ccap - 1)
    ckeys = np.full(ccap, np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64)
    cvals = np.empty(ccap, np.int32)
    codes = np.empty(nnz, np.int32)
    row_len = np.zeros(n, np.int32)
    next_node = npairs
    nc = 0
    for r in range(n):
        pos = indptr[r]
        end = indptr[r + 1]
        cnt = 0
        while pos < end:
            node = seq[pos]
            pos += 1
            while pos < end:
                key = (np.uint64(node) << np.uint64(32)) | np.uint64(seq[pos])
                h = _mix(key) & cmask
                child = -1
                while True:
                    k = ckeys[h]
                    if k == key:
                        child = cvals[h]
                        break
                    if k == np.uint64(0xFFFFFFFFFFFFFFFF):
                        break
                    h = (h + np.uint64(1)) & cmask
                if child < 0:
                    # the longest match ends here: the row continues, so add node + next pair
                    # (h is the empty slot the failed lookup stopped at)
                    ckeys[h] = key
                    cvals[h] = next_node
                    next_node += 1
                    break
                node = child
                pos += 1
            codes[nc] = node
            nc += 1
            cnt += 1
        row_len[r] = cnt
    return sorted_col, sorted_vidx, values[:nv].copy(), row_len, codes[:nc].copy(), next_node


# ---------------------------------------------------------------------------------------------
# physical encoding: LSB-first bit packing of non-negative integers (< 2**32)


@njit(cache=True, nogil=True)
def pack_bits(vals, width, out, start):
    """Pack ``vals`` with ``width`` bits each into ``out[start:]``; return the end offset."""
    if width == 0:
        return start
    w = np.uint64(width)
    acc = np.uint64(0)
    nb = np.uint64(0)
    o = start
    eight = np.uint64(8)
    for i in range(vals.size):
        acc |= np.uint64(vals[i]) << nb
        nb += w
        while nb >= eight:
            out[o] = np.uint8(acc & np.uint64(0xFF))
            acc >>= eight
            nb -= eight
            o += 1
    if nb > 0:
        out[o] = np.uint8(acc & np.uint64(0xFF))
        o += 1
    return o


@njit(cache=True, nogil=True)
def unpack_bits(buf, start, stop, count, width):
    """Read ``count`` integers of ``width`` bits from ``buf[start:stop]``.

    Returns ``(status, values int32[count])``; never reads outside ``[start, stop)`` and
    requires the unused high bits of the last byte to be zero.
    """
    out = np.zeros(count, np.int32)
    if width == 0 or count == 0:
        return OK, out
    w = np.uint64(width)
    mask = (np.uint64(1) << w) - np.uint64(1)
    acc = np.uint64(0)
    nb = np.uint64(0)
    i_in = start
    eight = np.uint64(8)
    for i in range(count):
        while nb < w:
            if i_in >= stop:
                return ERR_TRUNCATED, out
            acc |= np.uint64(buf[i_in]) << nb
            i_in += 1
            nb += eight
        out[i] = np.int32(acc & mask)
        acc >>= w
        nb -= w
    if acc != 0:
        return ERR_PADDING, out
    return OK, out


@njit(cache=True, nogil=True, inline="always")
def _fit_width(w, x):
    """Adjust bit width ``w`` (valid for a neighbour of ``x``) to the bit length of ``x``."""
    while w < 32 and (np.int64(1) << w) <= x:
        w += 1
    while w > 0 and (np.int64(1) << (w - 1)) > x:
        w -= 1
    return w


@njit(cache=True, nogil=True)
def code_widths_total(row_len, n_first):
    """Total bits of the code section: LZW's growing code widths.

    When code ``j`` of a row is written, the tree has ``n_first + added`` nodes, where
    ``added`` counts the codes so far that were not last in their row; the node added after
    the previous code of the same row cannot be referenced (columns ascend strictly), so the
    code is below ``limit = n_first + added - (j > 0)`` and takes ``bit_length(limit - 1)``
    bits. Encoder and decoder derive the same widths from the row lengths.
    """
    added = 0
    w = 0
    total = 0
    for r in range(row_len.size):
        n = row_len[r]
        for j in range(n):
            limit = n_first + added - (1 if j > 0 else 0)
            w = _fit_width(w, limit - 1)
            total += w
            if j < n - 1:
                added += 1
    return total


@njit(cache=True, nogil=True)
def pack_codes(codes, row_len, n_first, out, start):
    """Pack the codes with growing widths (see :func:`code_widths_total`)."""
    acc = np.uint64(0)
    nb = np.uint64(0)
    o = start
    eight = np.uint64(8)
    added = 0
    w = 0
    q = 0
    for r in range(row_len.size):
        n = row_len[r]
        for j in range(n):
            limit = n_first + added - (1 if j > 0 else 0)
            w = _fit_width(w, limit - 1)
            acc |= np.uint64(codes[q]) << nb
            nb += np.uint64(w)
            while nb >= eight:
                out[o] = np.uint8(acc & np.uint64(0xFF))
                acc >>= eight
                nb -= eight
                o += 1
            q += 1
            if j < n - 1:
                added += 1
    if nb > 0:
        out[o] = np.uint8(acc & np.uint64(0xFF))
        o += 1
    return o


@njit(cache=True, nogil=True)
def unpack_codes(buf, start, stop, row_len, n_first, n_codes):
    """Inverse of :func:`pack_codes`, bounds-checked; ``(status, where, codes int32)``."""
    out = np.zeros(n_codes, np.int32)
    total = 0
    for r in range(row_len.size):
        total += row_len[r]
    if total != n_codes:
        return ERR_ROW_LENGTHS, total, out
    acc = np.uint64(0)
    nb = np.uint64(0)
    i_in = start
    eight = np.uint64(8)
    added = 0
    w = 0
    q = 0
    for r in range(row_len.size):
        n = row_len[r]
        for j in range(n):
            limit = n_first + added - (1 if j > 0 else 0)
            if limit < 1:
                return ERR_CODE, q, out
            w = _fit_width(w, limit - 1)
            uw = np.uint64(w)
            while nb < uw:
                if i_in >= stop:
                    return ERR_TRUNCATED, q, out
                acc |= np.uint64(buf[i_in]) << nb
                i_in += 1
                nb += eight
            out[q] = np.int32(acc & ((np.uint64(1) << uw) - np.uint64(1)))
            acc >>= uw
            nb -= uw
            q += 1
            if j < n - 1:
                added += 1
    if acc != 0:
        return ERR_PADDING, q, out
    if i_in != stop:
        return ERR_TRAILING, i_in, out
    return OK, 0, out


# ---------------------------------------------------------------------------------------------
# tree rebuild (Algorithm 2) + validation + dead-node removal


@njit(cache=True, nogil=True)
def build_tree(pair_col, pair_vidx, n_values, n_cols, row_len, codes):
    """Rebuild the prefix tree ``C'`` (Algorithm 2) from the first layer and the codes, and
    validate both; keep only the live nodes.

    Checks: columns < ``n_cols``, value indices < ``n_values``, row lengths add up to the
    number of codes, every code names a node that exists when it is read, and the columns of
    every row come out strictly ascending (so every decoded row is a valid sparse row).

    Live nodes are those a code refers to and their ancestors; the others cannot contribute to
    any result. First-layer nodes keep their numbers ``0..L-1``; live later nodes are
    renumbered densely in creation order (``L + t``, parents first) and the codes with them.

    Returns ``(status, where, row_ptr int64[n+1], codes int32 (renumbered), lp int32[nl],
    lkey int32[nl], first_live int32, nnz)``: parent and key pair of live node ``L + t`` and
    the list of live first-layer nodes.
    """
    L = pair_col.size
    n = row_len.size
    nc = codes.size
    row_ptr = np.zeros(n + 1, np.int64)
    e_i32 = np.zeros(0, np.int32)
    for k in range(L):
        if pair_col[k] < 0 or pair_col[k] >= n_cols:
            return ERR_COLUMN, k, row_ptr, e_i32, e_i32, e_i32, e_i32, 0
        if pair_vidx[k] < 0 or pair_vidx[k] >= n_values:
            return ERR_VALUE_INDEX, k, row_ptr, e_i32, e_i32, e_i32, e_i32, 0
    total = 0
    for r in range(n):
        total += row_len[r]
        row_ptr[r + 1] = total
    if total != nc:
        return ERR_ROW_LENGTHS, total, row_ptr, e_i32, e_i32, e_i32, e_i32, 0
    cap = L + nc
    parent = np.empty(cap, np.int32)
    key = np.empty(cap, np.int32)
    first = np.empty(cap, np.int32)
    lastcol = np.empty(cap, np.int32)
    length = np.empty(cap, np.int64)
    for k in range(L):
        parent[k] = -1
        key[k] = k
        first[k] = k
        lastcol[k] = pair_col[k]
        length[k] = 1
    cnt = L
    nnz = 0
    for r in range(n):
        prev = -1
        for q in range(row_ptr[r], row_ptr[r + 1]):
            c = codes[q]
            if c < 0 or c >= cnt:
                return ERR_CODE, q, row_ptr, e_i32, e_i32, e_i32, e_i32, 0
            if prev >= 0:
                fc = first[c]
                col = pair_col[fc]
                if col <= lastcol[prev]:
                    return ERR_ORDER, q, row_ptr, e_i32, e_i32, e_i32, e_i32, 0
                parent[cnt] = prev
                key[cnt] = fc
                first[cnt] = first[prev]
                lastcol[cnt] = col
                length[cnt] = length[prev] + 1
                cnt += 1
            nnz += length[c]
            prev = c
    live = np.zeros(cnt, np.uint8)
    for q in range(nc):
        live[codes[q]] = 1
    for i in range(cnt - 1, L - 1, -1):
        if live[i]:
            live[parent[i]] = 1
    nfl = 0
    for k in range(L):
        nfl += live[k]
    first_live = np.empty(nfl, np.int32)
    j = 0
    for k in range(L):
        if live[k]:
            first_live[j] = k
            j += 1
    newid = np.empty(cnt, np.int32)
    for k in range(L):
        newid[k] = k
    nl = 0
    for i in range(L, cnt):
        nl += live[i]
    lp = np.empty(nl, np.int32)
    lkey = np.empty(nl, np.int32)
    t = 0
    for i in range(L, cnt):
        if live[i]:
            newid[i] = L + t
            lp[t] = newid[parent[i]]
            lkey[t] = key[i]
            t += 1
    out_codes = np.empty(nc, np.int32)
    for q in range(nc):
        out_codes[q] = newid[codes[q]]
    return OK, 0, row_ptr, out_codes, lp, lkey, first_live, nnz


@njit(cache=True, nogil=True)
def build_schedule(n_first, lp, lkey, codes, threshold):
    """Compile the live tree into the schedule of the matrix operations.

    Theorem 1 computes ``H[node] = key·M + H[parent]`` for every live node, one row of ``p``
    numbers each. A node used once (by one code and no live child, or by one child and no
    code) gains nothing from being materialised: its key is added straight into its single
    user. Only *shared* nodes (>= 2 uses) get an ``H`` row. The schedule is a list of
    entries: first the shared nodes in creation order (parents first), then one entry per
    code; entry ``e`` adds ``H[ref[e]]`` (when ``ref[e] >= 0``) and the keys
    ``keys[kptr[e]:kptr[e+1]]`` (pair ids, from the node up to its next shared ancestor).
    Every live node's key appears exactly once, so an operation costs one row multiply-add
    per live node plus one row read per code and per shared node, and ``H`` is as small as the
    sharing. (For vector operations the plain per-node scan is faster: its loops are
    branch-free, while here the short key lists make branches unpredictable.)

    Returns ``(sched int32, n_shared)``: ``sched`` holds ``ref`` (E entries), ``kptr``
    (E + 1) and ``keys``, concatenated, with ``E = n_shared + codes``.
    """
    # threshold 1: every live node materialised (the paper's scan); 2: only shared ones. A
    # larger one would let a node be walked by two users, breaking the one-key-per-live-node
    # count the keys array is sized by.
    threshold = min(max(threshold, 1), 2)
    nl = lp.size
    N = n_first + nl
    nc = codes.size
    uses = np.zeros(N, np.int32)
    for q in range(nc):
        uses[codes[q]] += 1
    for t in range(nl - 1, -1, -1):
        if uses[n_first + t] > 0:
            uses[lp[t]] += 1
    n_keys = 0
    n_shared = 0
    slot = np.full(N, -1, np.int32)
    for i in range(N):
        if uses[i] > 0:
            n_keys += 1
        if uses[i] >= threshold:
            slot[i] = n_shared
            n_shared += 1
    n_ent = n_shared + nc
    sched = np.empty(2 * n_ent + 1 + n_keys, np.int32)
    ref = sched[:n_ent]
    kptr = sched[n_ent:2 * n_ent + 1]
    keys = sched[2 * n_ent + 1:]
    kptr[0] = 0
    t = 0
    e = 0
    for i in range(N):  # shared nodes, creation order = parents first
        if slot[i] >= 0:
            j = i
            while True:
                if j < n_first:
                    keys[t] = j
                    t += 1
                    j = -1
                    break
                keys[t] = lkey[j - n_first]
                t += 1
                j = lp[j - n_first]
                if slot[j] >= 0:
                    break
            ref[e] = slot[j] if j >= 0 else -1
            e += 1
            kptr[e] = t
    for q in range(nc):
        j = codes[q]
        while j >= 0 and slot[j] < 0:
            if j < n_first:
                keys[t] = j
                t += 1
                j = -1
            else:
                keys[t] = lkey[j - n_first]
                t += 1
                j = lp[j - n_first]
        ref[e] = slot[j] if j >= 0 else -1
        e += 1
        kptr[e] = t
    return sched, n_shared


@njit(cache=True, nogil=True)
def decode_structure(raw, flags, col_w, vidx_w, rowlen_w, n_rows, n_cols, n_first, n_values,
                     n_codes, s1, e1, s2, e2, s4, e4, s5, e5):
    """Unpack sections 1, 2, 4 and 5 of a payload and rebuild the tree: one call per batch.

    Returns ``(status, section, where, pcol, pvidx, row_ptr, codes, lp, lkey, first_live,
    nnz)``; ``section`` names the failing section (0 = the tree itself).
    """
    e_i32 = np.zeros(0, np.int32)
    e_i64 = np.zeros(1, np.int64)
    if flags & 1:
        st, counts = unpack_bits(raw, s1, e1, n_cols, col_w)
        if st:
            return st, 1, 0, e_i32, e_i32, e_i64, e_i32, e_i32, e_i32, e_i32, 0
        total = 0
        for j in range(n_cols):
            total += counts[j]
        if total != n_first:
            return ERR_COUNTS, 1, total, e_i32, e_i32, e_i64, e_i32, e_i32, e_i32, e_i32, 0
        pcol = np.empty(n_first, np.int32)
        t = 0
        for j in range(n_cols):
            for _ in range(counts[j]):
                pcol[t] = j
                t += 1
    else:
        st, pcol = unpack_bits(raw, s1, e1, n_first, col_w)
        if st:
            return st, 1, 0, e_i32, e_i32, e_i64, e_i32, e_i32, e_i32, e_i32, 0
    st, pvidx = unpack_bits(raw, s2, e2, n_first, vidx_w)
    if st:
        return st, 2, 0, e_i32, e_i32, e_i64, e_i32, e_i32, e_i32, e_i32, 0
    st, row_len = unpack_bits(raw, s4, e4, n_rows, rowlen_w)
    if st:
        return st, 4, 0, e_i32, e_i32, e_i64, e_i32, e_i32, e_i32, e_i32, 0
    st, where, codes = unpack_codes(raw, s5, e5, row_len, n_first, n_codes)
    if st:
        return st, 5, where, e_i32, e_i32, e_i64, e_i32, e_i32, e_i32, e_i32, 0
    st, where, row_ptr, codes_c, lp, lkey, first_live, nnz = build_tree(
        pcol, pvidx, n_values, n_cols, row_len, codes)
    return st, 0, where, pcol, pvidx, row_ptr, codes_c, lp, lkey, first_live, nnz


# ---------------------------------------------------------------------------------------------
# the whole parse in one call (numba's dispatch costs ~1 us per argument and per returned
# array, more than the work on a small batch: one array in, two out)

ERR_HEADER = 10  # the header is inconsistent (Python's parse_header says how)
_ITEMSIZE = (8, 4, 2, 1, 2, 4, 8, 1, 2, 4, 8, 1)  # by dtype code, as format.DTYPES
_MAX_DIM = (1 << 31) - 1


@njit(cache=True, nogil=True, inline="always")
def _packed(count, width):
    return (count * width + 7) // 8


@njit(cache=True, nogil=True)
def read_header(raw):
    """The checks of ``format.parse_header`` (CRC aside) on a uint8 array.

    Returns ``(status, h int64[20])``: dtype code, flags, 3 widths, rows, columns, L, V, codes,
    then (start, stop) of the five sections.
    """
    h = np.zeros(20, np.int64)
    n = raw.size
    if n < 18 or raw[0] != 84 or raw[1] != 79 or raw[2] != 67 or raw[3] != 1:
        return ERR_HEADER, h
    code = raw[4]
    flags = raw[5]
    if code >= 12 or (flags & 0xFE) != 0:
        return ERR_HEADER, h
    for i in range(3):
        if raw[6 + i] > 31:
            return ERR_HEADER, h
    h[0] = code
    h[1] = flags
    h[2] = raw[6]
    h[3] = raw[7]
    h[4] = raw[8]
    pos = 9
    for f in range(5):
        value = 0
        shift = 0
        done = False
        for _ in range(10):
            if pos >= n:
                return ERR_HEADER, h
            byte = np.int64(raw[pos])
            pos += 1
            if shift > 31:
                return ERR_HEADER, h
            value |= (byte & 0x7F) << shift
            if value > _MAX_DIM:
                return ERR_HEADER, h
            shift += 7
            if byte < 0x80:
                done = True
                break
        if not done:
            return ERR_HEADER, h
        h[5 + f] = value
    n_rows, n_cols, n_first, n_values, n_codes = h[5], h[6], h[7], h[8], h[9]
    s1 = _packed(n_cols if flags & 1 else n_first, h[2])
    s2 = _packed(n_first, h[3])
    s3 = n_values * _ITEMSIZE[code]
    s4 = _packed(n_rows, h[4])
    s5 = n - 4 - pos - s1 - s2 - s3 - s4
    if s5 < 0 or s5 > _packed(n_codes, 31):
        return ERR_HEADER, h
    if n_values > n_first or (n_first > 0 and n_values == 0):
        return ERR_HEADER, h
    if (n_codes == 0) != (n_first == 0) or (n_first > 0 and n_cols == 0):
        return ERR_HEADER, h
    if n_codes > 0 and h[4] == 0:
        return ERR_HEADER, h
    start = pos
    k = 10
    for size in (s1, s2, s3, s4, s5):
        h[k] = start
        h[k + 1] = start + size
        start += size
        k += 2
    return OK, h


@njit(cache=True, nogil=True)
def decode_payload(raw):
    """Header, sections and tree of a payload: ``(meta int64[24], store int32)``.

    ``meta``: status, failing section, where, dtype code, flags, rows, columns, L, V, codes,
    live later nodes, live first-layer nodes, nnz, value section start and stop, 0, then the
    8 offsets into ``store`` of: first-layer columns, first-layer value indices, row pointer
    (rows + 1), codes, parents and keys of the live later nodes, live first-layer nodes, end.
    """
    meta = np.zeros(24, np.int64)
    st, h = read_header(raw)
    if st:
        meta[0] = st
        return meta, np.zeros(0, np.int32)
    (st, sec, where, pcol, pvidx, row_ptr, codes, lp, lkey, first_live,
     nnz) = decode_structure(raw, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9],
                             h[10], h[11], h[12], h[13], h[16], h[17], h[18], h[19])
    meta[0] = st
    meta[1] = sec
    meta[2] = where
    if st:
        return meta, np.zeros(0, np.int32)
    meta[3] = h[0]
    meta[4] = h[1]
    meta[5] = h[5]
    meta[6] = h[6]
    meta[7] = h[7]
    meta[8] = h[8]
    meta[9] = h[9]
    meta[10] = lp.size
    meta[11] = first_live.size
    meta[12] = nnz
    meta[13] = h[14]
    meta[14] = h[15]
    meta[15] = 0
    sizes = (pcol.size, pvidx.size, row_ptr.size, codes.size, lp.size, lkey.size,
             first_live.size)
    off = 0
    for i in range(7):
        meta[16 + i] = off
        off += sizes[i]
    meta[23] = off
    store = np.empty(off, np.int32)
    o = meta[16:24]
    store[o[0]:o[1]] = pcol
    store[o[1]:o[2]] = pvidx
    for i in range(row_ptr.size):
        store[o[2] + i] = np.int32(row_ptr[i])
    store[o[3]:o[4]] = codes
    store[o[4]:o[5]] = lp
    store[o[5]:o[6]] = lkey
    store[o[6]:o[7]] = first_live
    return meta, store


@njit(cache=True, nogil=True, inline="always")
def _parts(store, off):
    """``(pcol, pvidx, row_ptr, codes, lp, lkey, first_live)`` views of a store."""
    return (store[off[0]:off[1]], store[off[1]:off[2]], store[off[2]:off[3]],
            store[off[3]:off[4]], store[off[4]:off[5]], store[off[5]:off[6]],
            store[off[6]:off[7]])


@njit(cache=True, nogil=True)
def schedule_of(store, off, threshold):
    """:func:`build_schedule` of a store."""
    pcol, _pv, _rp, codes, lp, lkey, _fl = _parts(store, off)
    return build_schedule(pcol.size, lp, lkey, codes, threshold)


# ---------------------------------------------------------------------------------------------
# full decode


@njit(cache=True, nogil=True)
def expand(store, off, nnz):
    """Sparse rows of the matrix: ``(indptr int64, indices int32, pair ids int32)``.

    Each code's sequence is written back to front by walking parent pointers, so every output
    element costs O(1) (the LZW decoding bound).
    """
    pair_col, _pv, row_ptr, codes, lp, lkey, _fl = _parts(store, off)
    L = pair_col.size
    nl = lp.size
    length = np.empty(L + nl, np.int64)
    for k in range(L):
        length[k] = 1
    for t in range(nl):
        length[L + t] = length[lp[t]] + 1
    n = row_ptr.size - 1
    indptr = np.zeros(n + 1, np.int64)
    indices = np.empty(nnz, np.int32)
    pids = np.empty(nnz, np.int32)
    pos = 0
    for r in range(n):
        for q in range(row_ptr[r], row_ptr[r + 1]):
            node = codes[q]
            end = pos + length[node]
            w = end - 1
            while node >= L:
                k = lkey[node - L]
                pids[w] = k
                indices[w] = pair_col[k]
                w -= 1
                node = lp[node - L]
            pids[w] = node
            indices[w] = pair_col[node]
            pos = end
        indptr[r + 1] = pos
    return indptr, indices, pids


@njit(cache=True, nogil=True)
def expand_dense(store, off, values_bits, out):
    """Write the stored cells into ``out``, a zeroed 2-D unsigned view of the dense result."""
    pair_col, pair_vidx, row_ptr, codes, lp, lkey, _fl = _parts(store, off)
    L = pair_col.size
    n = row_ptr.size - 1
    for r in range(n):
        for q in range(row_ptr[r], row_ptr[r + 1]):
            node = codes[q]
            while node >= L:
                k = lkey[node - L]
                out[r, pair_col[k]] = values_bits[pair_vidx[k]]
                node = lp[node - L]
            out[r, pair_col[node]] = values_bits[pair_vidx[node]]


# ---------------------------------------------------------------------------------------------
# operations on the compressed form (Theorems 1-4 of the paper)


@njit(cache=True, nogil=True)
def matvec(store, off, pval, v):
    """A·v: H[node] = key·v + H[parent] over the tree, then each row sums H over its codes."""
    pcol, _pv, row_ptr, codes, lp, lkey, first_live = _parts(store, off)
    L = pcol.size
    nl = lp.size
    H = np.empty(L + nl)
    for i in range(first_live.size):
        k = first_live[i]
        H[k] = pval[k] * v[pcol[k]]
    for t in range(nl):
        k = lkey[t]
        H[L + t] = H[lp[t]] + pval[k] * v[pcol[k]]
    n = row_ptr.size - 1
    out = np.empty(n)
    for r in range(n):
        s = 0.0
        for q in range(row_ptr[r], row_ptr[r + 1]):
            s += H[codes[q]]
        out[r] = s
    return out


@njit(cache=True, nogil=True)
def rmatvec(store, off, pval, v, n_cols):
    """v·A: G[node] += v[row] per code, then a backward scan pushes G into R and the parent."""
    pcol, _pv, row_ptr, codes, lp, lkey, first_live = _parts(store, off)
    L = pcol.size
    nl = lp.size
    G = np.zeros(L + nl)
    n = row_ptr.size - 1
    for r in range(n):
        x = v[r]
        for q in range(row_ptr[r], row_ptr[r + 1]):
            G[codes[q]] += x
    out = np.zeros(n_cols)
    for t in range(nl - 1, -1, -1):
        g = G[L + t]
        k = lkey[t]
        out[pcol[k]] += pval[k] * g
        G[lp[t]] += g
    for i in range(first_live.size):
        k = first_live[i]
        out[pcol[k]] += pval[k] * G[k]
    return out


@njit(cache=True, nogil=True)
def matmat(store, off, sched, n_shared, pval, M):
    """A·M for a C-contiguous float64 ``M`` (m x p), on the schedule of
    :func:`build_schedule`: ``H`` rows of the shared nodes, then each row of the result."""
    pcol, _pv, row_ptr, codes, _lp, _lk, _fl = _parts(store, off)
    n_ent = n_shared + codes.size
    ref = sched[:n_ent]
    kptr = sched[n_ent:2 * n_ent + 1]
    keys = sched[2 * n_ent + 1:]
    p = M.shape[1]
    H = np.empty((n_shared, p))
    for e in range(n_shared):
        if ref[e] >= 0:
            H[e, :] = H[ref[e], :]
        else:
            H[e, :] = 0.0
        for t in range(kptr[e], kptr[e + 1]):
            k = keys[t]
            a = pval[k]
            c = pcol[k]
            for j in range(p):
                H[e, j] += a * M[c, j]
    n = row_ptr.size - 1
    out = np.zeros((n, p))
    for r in range(n):
        for q in range(row_ptr[r], row_ptr[r + 1]):
            e = n_shared + q
            if ref[e] >= 0:
                h = ref[e]
                for j in range(p):
                    out[r, j] += H[h, j]
            for t in range(kptr[e], kptr[e + 1]):
                k = keys[t]
                a = pval[k]
                c = pcol[k]
                for j in range(p):
                    out[r, j] += a * M[c, j]
    return out


@njit(cache=True, nogil=True)
def rmatmat_t(store, off, sched, n_shared, pval, MT, n_cols):
    """(M·A)ᵀ for ``MT`` = Mᵀ (n x p, C-contiguous), on the schedule: codes push rows of
    ``MT`` into their keys and shared node; shared nodes, children first, push their totals
    into their keys and their shared ancestor (Theorem 4)."""
    pcol, _pv, row_ptr, codes, _lp, _lk, _fl = _parts(store, off)
    n_ent = n_shared + codes.size
    ref = sched[:n_ent]
    kptr = sched[n_ent:2 * n_ent + 1]
    keys = sched[2 * n_ent + 1:]
    p = MT.shape[1]
    G = np.zeros((n_shared, p))
    out = np.zeros((n_cols, p))
    n = row_ptr.size - 1
    for r in range(n):
        for q in range(row_ptr[r], row_ptr[r + 1]):
            e = n_shared + q
            for t in range(kptr[e], kptr[e + 1]):
                k = keys[t]
                a = pval[k]
                c = pcol[k]
                for j in range(p):
                    out[c, j] += a * MT[r, j]
            if ref[e] >= 0:
                h = ref[e]
                for j in range(p):
                    G[h, j] += MT[r, j]
    for e in range(n_shared - 1, -1, -1):
        for t in range(kptr[e], kptr[e + 1]):
            k = keys[t]
            a = pval[k]
            c = pcol[k]
            for j in range(p):
                out[c, j] += a * G[e, j]
        if ref[e] >= 0:
            h = ref[e]
            for j in range(p):
                G[h, j] += G[e, j]
    return out
