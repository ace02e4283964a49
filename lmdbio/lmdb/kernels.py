"""Compiled hot loops of the page engine (numba, cached on disk, imported lazily).

Every kernel reads the memory mapping as a ``uint8`` array and bounds-checks every offset it
derives from the file before using it, so a corrupt file ends in an error code, never a read
outside the mapping. Kernels cannot raise exceptions with a message, so they return
``(code, page)`` and :func:`error_message` turns a code into words.

The layout parameter vector ``fmt`` comes from :meth:`PageLayout.as_array`:
``[psize, header_size, flags_off, lower_off, upper_off, ptr_base, lower_base, pad_key,
bigdata_size]``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lmdbio.kernels import copy_bytes, prefetch_line

OK = 0
E_PAGE_RANGE = 1
E_PAGENO = 2
E_PAGE_KIND = 3
E_BOUNDS = 4
E_NODE = 5
E_DEPTH = 6
E_CYCLE = 7
E_OVERFLOW = 8
E_DUPDATA = 9
E_COUNT = 10
E_OVERFLOW_HEADER = 11
E_ORDER = 12

_MESSAGES = {
    E_PAGE_RANGE: "page number is past the last page of the snapshot or the end of the file",
    E_PAGENO: "page header holds a different page number than its position",
    E_PAGE_KIND: "page is not the kind the tree expects here (branch/leaf flags)",
    E_BOUNDS: "mp_lower/mp_upper outside the page or crossing",
    E_NODE: "node offset, key length or data length runs off the page",
    E_DEPTH: "tree is deeper than md_depth says (or leaves at different depths)",
    E_CYCLE: "page reached twice in one tree walk (cycle or shared subtree)",
    E_OVERFLOW: "overflow run runs off the snapshot or the file",
    E_DUPDATA: "node carries F_DUPDATA but the database is not DUPSORT",
    E_COUNT: "tree holds a different number of records than the meta page says",
    E_OVERFLOW_HEADER: "overflow page header is wrong (flag, page number or page count)",
    E_ORDER: "branch page has no children",
}


def error_message(code: int) -> str:
    """The words for a kernel error code."""
    return _MESSAGES.get(int(code), f"unknown error code {code}")


@njit(cache=True, nogil=True, inline="always")
def _u16(buf, off):
    return np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)


@njit(cache=True, nogil=True, inline="always")
def _u32(buf, off):
    return _u16(buf, off) | (_u16(buf, off + 2) << 16)


@njit(cache=True, nogil=True, inline="always")
def _u64(buf, off):
    # page numbers above 2**63 are invalid anyway; keep the top bit so they compare large
    lo = _u32(buf, off)
    hi = _u32(buf, off + 4)
    if hi >= 0x80000000:
        return np.int64(0x7FFFFFFFFFFFFFFF)
    return lo | (hi << 32)


@njit(cache=True, nogil=True)
def check_page(buf, fmt, pgno, last_pg):
    """Validate the header of branch/leaf page ``pgno``; return (code, nkeys)."""
    psize = fmt[0]
    hdr = fmt[1]
    if pgno < 2 or pgno > last_pg or (pgno + 1) * psize > buf.shape[0]:
        return E_PAGE_RANGE, 0
    base = pgno * psize
    if _u64(buf, base) != pgno:
        return E_PAGENO, 0
    lower = _u16(buf, base + fmt[3])
    upper = _u16(buf, base + fmt[4])
    if lower < fmt[6]:
        return E_BOUNDS, 0
    nkeys = (lower - fmt[6]) >> 1
    # the pointer array must fit before upper, upper inside the page
    if hdr + 2 * nkeys > psize or upper + fmt[5] > psize or lower + fmt[5] > upper + fmt[5]:
        return E_BOUNDS, 0
    return OK, nkeys


@njit(cache=True, nogil=True)
def node_offset(buf, fmt, base, i):
    """Offset (from the file start) of node ``i`` of the page at ``base``; -1 if invalid."""
    psize = fmt[0]
    ptr = _u16(buf, base + fmt[1] + 2 * i) + fmt[5]
    if ptr < fmt[1] or ptr + 8 > psize:
        return -1
    return base + ptr


@njit(cache=True, nogil=True)
def branch_child(buf, fmt, base, i):
    """Child page number of node ``i`` of a branch page; -1 if the node is invalid."""
    node = node_offset(buf, fmt, base, i)
    if node < 0:
        return -1
    ksize = _u16(buf, node + 6)
    if node + 8 + ksize > base + fmt[0]:
        return -1
    return _u16(buf, node) | (_u16(buf, node + 2) << 16) | (_u16(buf, node + 4) << 32)


@njit(cache=True, nogil=True)
def branch_children(buf, fmt, pg, last_pg, out):
    """Child page numbers of branch page ``pg`` into ``out`` (at least as long as the
    page's key count). Returns ``(code, n)``: ``E_PAGE_KIND`` when ``pg`` is not a branch
    page, ``E_NODE`` for a node that runs off the page, ``E_PAGE_RANGE`` for a child past
    ``last_pg``."""
    code, nkeys = check_page(buf, fmt, pg, last_pg)
    if code != OK:
        return code, 0
    if not _u16(buf, pg * fmt[0] + fmt[2]) & 0x01 or nkeys > out.shape[0]:
        return E_PAGE_KIND, 0
    for i in range(nkeys):
        child = branch_child(buf, fmt, pg * fmt[0], i)
        if child < 0:
            return E_NODE, 0
        if child < 2 or child > last_pg:
            return E_PAGE_RANGE, 0
        out[i] = child
    return OK, nkeys


@njit(cache=True, nogil=True)
def walk_tree(buf, fmt, root, depth, last_pg, leaves, touched, account):
    """Collect the leaf pages of the tree at ``root`` in key order.

    Returns ``(code, page, nleaves, nbranches)``. ``leaves`` must hold ``last_pg + 1``
    entries. Every page is visited once (a second visit is a cycle); leaves must all sit at
    level ``depth - 1``. With ``account``, every page read is marked in ``touched``.
    """
    psize = fmt[0]
    flags_off = fmt[2]
    if depth < 1 or depth > 32:
        return E_DEPTH, root, 0, 0
    visited = np.zeros(last_pg + 1, np.uint8)
    stack_pg = np.empty(33, np.int64)
    stack_next = np.empty(33, np.int64)
    stack_n = np.empty(33, np.int64)
    nleaves = 0
    nbranches = 0
    top = 0
    stack_pg[0] = root
    stack_next[0] = -1
    while top >= 0:
        pg = stack_pg[top]
        if stack_next[top] < 0:
            # first visit of this page
            code, nkeys = check_page(buf, fmt, pg, last_pg)
            if code != OK:
                return code, pg, nleaves, nbranches
            if visited[pg]:
                return E_CYCLE, pg, nleaves, nbranches
            visited[pg] = 1
            if account:
                touched[pg] = 1
            flags = _u16(buf, pg * psize + flags_off)
            if flags & 0x02:  # leaf
                if flags & 0x01 or top != depth - 1:
                    return (E_DEPTH if top != depth - 1 else E_PAGE_KIND), pg, nleaves, nbranches
                leaves[nleaves] = pg
                nleaves += 1
                top -= 1
                continue
            if not flags & 0x01:
                return E_PAGE_KIND, pg, nleaves, nbranches
            if top >= depth - 1:
                return E_DEPTH, pg, nleaves, nbranches
            if nkeys < 1:
                return E_ORDER, pg, nleaves, nbranches
            nbranches += 1
            stack_next[top] = 0
            stack_n[top] = nkeys
        i = stack_next[top]
        if i >= stack_n[top]:
            top -= 1
            continue
        stack_next[top] = i + 1
        child = branch_child(buf, fmt, pg * psize, i)
        if child < 0:
            return E_NODE, pg, nleaves, nbranches
        top += 1
        stack_pg[top] = child
        stack_next[top] = -1
    return OK, 0, nleaves, nbranches


@njit(cache=True, nogil=True)
def count_leaf_records(buf, fmt, leaves, counts, touched, account):
    """Number of nodes on each leaf page (reads leaf headers only); returns (code, page)."""
    psize = fmt[0]
    for j in range(leaves.shape[0]):
        pg = leaves[j]
        if (pg + 1) * psize > buf.shape[0]:
            return E_PAGE_RANGE, pg
        lower = _u16(buf, pg * psize + fmt[3])
        if lower < fmt[6] or fmt[1] + lower - fmt[6] > psize:
            return E_BOUNDS, pg
        counts[j] = (lower - fmt[6]) >> 1
        if account:
            touched[pg] = 1
    return OK, 0


@njit(cache=True, nogil=True)
def leaf_node(buf, fmt, base, i, last_pg, dupsort):
    """Decode node ``i`` of the leaf page at file offset ``base``.

    Returns ``(code, key_off, key_len, val_off, val_len, ovf_pages, flags)`` where
    ``val_off`` is the value's file offset (inside the leaf, or past the header of the first
    overflow page) and ``ovf_pages`` the length of its overflow run (0 when inline).
    """
    psize = fmt[0]
    hdr = fmt[1]
    end = base + psize
    node = node_offset(buf, fmt, base, i)
    if node < 0:
        return E_NODE, 0, 0, 0, 0, 0, 0
    dsize = _u16(buf, node) | (_u16(buf, node + 2) << 16)
    nflags = _u16(buf, node + 4)
    ksize = _u16(buf, node + 6)
    kstart = node + 8
    dstart = kstart + ksize
    if fmt[7] and (ksize & 1):
        dstart += 1
    if dstart > end:
        return E_NODE, 0, 0, 0, 0, 0, 0
    if nflags & 0x04 and not dupsort:
        return E_DUPDATA, 0, 0, 0, 0, 0, 0
    if nflags & 0x01:  # F_BIGDATA: the data is the first overflow page number
        if dstart + fmt[8] > end:
            return E_NODE, 0, 0, 0, 0, 0, 0
        opg = _u64(buf, dstart)
        npages = (hdr + dsize + psize - 1) // psize
        if opg < 2 or opg + npages - 1 > last_pg or (opg + npages) * psize > buf.shape[0]:
            return E_OVERFLOW, 0, 0, 0, 0, 0, 0
        return OK, kstart, ksize, opg * psize + hdr, dsize, npages, nflags
    if dstart + dsize > end:
        return E_NODE, 0, 0, 0, 0, 0, 0
    return OK, kstart, ksize, dstart, dsize, 0, nflags


@njit(cache=True, nogil=True)
def leaf_records(buf, fmt, leaves, last_pg, dupsort,
                 leaf_pg, slot, key_off, key_len, val_off, val_len, ovf_pages, node_flags,
                 touched, account):
    """Fill the record table for the leaf pages ``leaves`` (in order).

    Output arrays must hold every record of those leaves. Overflow headers are not read (a
    walk touches branch and leaf pages only); each overflow run's extent is checked against
    the snapshot and the file. Returns ``(code, page, nrecords)``.
    """
    psize = fmt[0]
    k = 0
    for j in range(leaves.shape[0]):
        pg = leaves[j]
        code, nkeys = check_page(buf, fmt, pg, last_pg)
        if code != OK:
            return code, pg, k
        if k + nkeys > leaf_pg.shape[0]:
            return E_COUNT, pg, k
        base = pg * psize
        if account:
            touched[pg] = 1
        for i in range(nkeys):
            code, ko, kl, vo, vl, op, fl = leaf_node(buf, fmt, base, i, last_pg, dupsort)
            if code != OK:
                return code, pg, k
            leaf_pg[k] = pg
            slot[k] = i
            key_off[k] = ko
            key_len[k] = kl
            val_off[k] = vo
            val_len[k] = vl
            ovf_pages[k] = op
            node_flags[k] = fl
            k += 1
    return OK, 0, k


@njit(cache=True, nogil=True)
def check_overflow_headers(buf, fmt, val_off, ovf_pages, indices, touched, account):
    """Check the first page header of the overflow runs of the records ``indices``.

    Returns ``(code, page)``. Marks nothing (``touched`` and ``account`` keep the
    signature of the other kernels): callers that read the values mark their pages.
    """
    for t in range(indices.shape[0]):
        r = indices[t]
        bad = _bad_overflow_run(buf, fmt, val_off[r], ovf_pages[r])
        if bad >= 0:
            return E_OVERFLOW_HEADER, bad
    return OK, 0


@njit(inline="always")
def _bad_overflow_run(buf, fmt, value_off, pages):
    """The first page of the overflow run holding a value at ``value_off`` (``pages``
    long) when its header does not say so (its own number, the overflow flag, at least
    ``pages`` pages); -1 when it does, or when the value is not in overflow pages."""
    if pages == 0:
        return -1
    psize = fmt[0]
    pg = (value_off - fmt[1]) // psize
    base = pg * psize
    if _u64(buf, base) != pg or not _u16(buf, base + fmt[2]) & 0x04 or \
            _u32(buf, base + fmt[3]) < pages:
        return pg
    return -1


@njit(inline="always")
def value_page_span(off, length, psize):
    """``(first, last)``: the first and last page of a value's bytes ``[off, off +
    length)``; an empty value stands for the page of the byte before it, its leaf node's
    (an empty value is inline, and the node nearest a leaf's end ends that page: its
    offset is the next page's first byte). The engine's one rule for the pages a value
    needs, in compiled code (:meth:`lmdbio.lmdb.RecordRefs.value_page_runs` is its numpy
    form)."""
    if length <= 0:
        p = max(off - 1, 0) // psize
        return p, p
    return off // psize, (off + length - 1) // psize


@njit(inline="always")
def _mark_span(touched, start, n, psize):
    """Mark the pages of the bytes ``[start, start + n)`` as touched: nothing for an empty
    span, and no page past the bitmap (the spans come from walks that validated them
    against the file)."""
    if n > 0 and start >= 0:
        for p in range(start // psize, min((start + n - 1) // psize, touched.shape[0] - 1) + 1):
            touched[p] = 1


@njit(inline="always")
def _copy_range(out, pos, buf, start, n, psize, touched, account):
    """Copy ``buf[start:start + n]`` to ``out[pos:]``, marking its pages when accounting;
    the position after it."""
    copy_bytes(out, pos, buf, start, n)
    if account:
        _mark_span(touched, start, n, psize)
    return pos + n


@njit(cache=True, nogil=True)
def gather(buf, fmt, val_off, val_len, indices, out, out_offsets, touched, account,
           prefix_limit):
    """Copy the values of records ``indices`` back to back into ``out``.

    ``out_offsets`` (len(indices)+1) receives the start of each value in ``out``. With
    ``prefix_limit >= 0`` only the first ``prefix_limit`` bytes of each value are copied
    (a prefix read: later overflow pages are never touched). Returns the bytes written, or
    ``-1 - t`` when ``out`` is too small for value ``t``.
    """
    psize = fmt[0]
    pos = 0
    out_offsets[0] = 0
    for t in range(indices.shape[0]):
        r = indices[t]
        n = val_len[r]
        if prefix_limit >= 0 and n > prefix_limit:
            n = prefix_limit
        if pos + n > out.shape[0]:
            return -1 - t
        pos = _copy_range(out, pos, buf, val_off[r], n, psize, touched, account)
        out_offsets[t + 1] = pos
    return pos


@njit(cache=True, nogil=True)
def gather_lengths(val_len, indices, prefix_limit):
    """Total bytes :func:`gather` will write for ``indices``."""
    total = 0
    for t in range(indices.shape[0]):
        n = val_len[indices[t]]
        if prefix_limit >= 0 and n > prefix_limit:
            n = prefix_limit
        total += n
    return total


@njit(cache=True, nogil=True)
def mark_values(touched, val_off, val_len, psize):
    """Mark the pages of every value as touched without reading them (empty values mark
    nothing; pages beyond the bitmap are not marked: the spans come from a walk that
    validated them against the file): a reader that hands out the values' spans counts
    the pages its node's workers read from the mapping."""
    for i in range(val_off.shape[0]):
        _mark_span(touched, val_off[i], val_len[i], psize)


@njit(inline="always")
def bad_span_header(buf, fmt, off, length):
    """The first page of the overflow run a value span ``[off, off + length)`` of the
    mapping lies in when its header does not say so; -1 when it does, or when the span is
    an inline value. A span that starts right after a page header is an overflow value's
    bytes (an inline value never starts there: its page's pointer array, node header and
    key come first) and must lie in a run of at least ``(header + length)`` bytes' pages
    whose first page names itself (what :func:`_bad_overflow_run` checks from the walk's
    page counts). The span is inside the mapping (checked before)."""
    psize = fmt[0]
    hdr = fmt[1]
    if off % psize != hdr:
        return -1
    return _bad_overflow_run(buf, fmt, off, (hdr + length + psize - 1) // psize)


@njit(cache=True, nogil=True)
def check_value_spans(buf, fmt, starts, lengths):
    """Check the overflow page header of every value span (:func:`bad_span_header`), for a
    consumer handed spans of the mapping. Returns ``(code, page)``: the first page whose
    header is wrong, with the code."""
    for i in range(starts.shape[0]):
        bad = bad_span_header(buf, fmt, starts[i], lengths[i])
        if bad >= 0:
            return E_OVERFLOW_HEADER, bad
    return OK, 0


@njit(cache=True, nogil=True)
def account_records(touched, own, total_touched, total_own, leaf_pg, val_off, val_len,
                    psize):
    """One iteration's page accounting in one pass: ``own`` (all zero on entry, and again
    on return) marks the pages holding the records (their leaf pages and every page of
    their values); the pages ``touched`` marks are or-ed into ``total_touched`` and the
    records' pages into ``total_own``. Returns ``(touched, own, extra)``: the pages
    touched, the pages holding the records, and the pages touched that hold none of them.
    """
    n = touched.shape[0]
    n_own = 0
    for i in range(leaf_pg.shape[0]):
        p = leaf_pg[i]
        if 0 <= p < n and own[p] == 0:
            own[p] = 1
            n_own += 1
    for i in range(val_off.shape[0]):
        if val_off[i] < 0:
            continue
        first, last = value_page_span(val_off[i], val_len[i], psize)
        for p in range(first, min(last, n - 1) + 1):
            if own[p] == 0:
                own[p] = 1
                n_own += 1
    n_touched = 0
    extra = 0
    for p in range(n):
        if touched[p]:
            n_touched += 1
            total_touched[p] = 1
            if own[p] == 0:
                extra += 1
        if own[p]:
            total_own[p] = 1
            own[p] = 0
    return n_touched, n_own, extra


@njit(inline="always")
def _next_leaf(buf, fmt, stack_pg, stack_slot, depth, last_pg, nkeys, wrap, root, touched,
               account):
    """Move a cursor past the end of its leaf (``nkeys`` records) to the first record of
    the next leaf: climb the stack to the first level that has a next child, descend
    leftmost; at the end of the tree wrap around to the first record when ``wrap``, else
    stay on the last record. Only branch and leaf pages are read. Returns ``(code, page,
    wrapped, at_end)``."""
    psize = fmt[0]
    leaf_level = depth - 1
    level = leaf_level - 1
    while level >= 0:
        bpg = stack_pg[level]
        code, bkeys = check_page(buf, fmt, bpg, last_pg)
        if code != OK:
            return code, bpg, 0, 0
        if stack_slot[level] + 1 < bkeys:
            break
        level -= 1
    wrapped = 0
    if level < 0:
        if not wrap:
            stack_slot[leaf_level] = nkeys - 1
            return OK, 0, 0, 1
        wrapped = 1
        level = 0
        stack_pg[0] = root
        stack_slot[0] = 0
        if leaf_level == 0:
            return OK, 0, wrapped, 0
        child = branch_child(buf, fmt, root * psize, 0)
    else:
        stack_slot[level] += 1
        child = branch_child(buf, fmt, stack_pg[level] * psize, stack_slot[level])
    if child < 0:
        return E_NODE, stack_pg[level], wrapped, 0
    for lv in range(level + 1, depth):
        stack_pg[lv] = child
        stack_slot[lv] = 0
        code, _ck = check_page(buf, fmt, child, last_pg)
        if code != OK:
            return code, child, wrapped, 0
        if account:
            touched[child] = 1
        if lv < leaf_level:
            child = branch_child(buf, fmt, child * psize, 0)
            if child < 0:
                return E_NODE, stack_pg[lv], wrapped, 0
    return OK, 0, wrapped, 0


@njit(inline="always")
def _walk(buf, fmt, stack_pg, stack_slot, depth, last_pg, n, wrap, root, collect,
          val_off, val_len, leaf_pg, ovf_pages, key_off, key_len, touched, account):
    """The walk of :func:`walk_collect` (``collect``) and :func:`walk_skip` (not)."""
    psize = fmt[0]
    got = 0
    wrapped = 0
    leaf_level = depth - 1
    while got < n:
        pg = stack_pg[leaf_level]
        code, nkeys = check_page(buf, fmt, pg, last_pg)
        if code != OK:
            return code, pg, got, wrapped, 0
        if account:
            touched[pg] = 1
        slot = stack_slot[leaf_level]
        if collect:
            base = pg * psize
            while slot < nkeys and got < n:
                code, ko, kl, vo, vl, op, _fl = leaf_node(buf, fmt, base, slot, last_pg,
                                                          False)
                if code != OK:
                    return code, pg, got, wrapped, 0
                key_off[got] = ko
                key_len[got] = kl
                val_off[got] = vo
                val_len[got] = vl
                leaf_pg[got] = pg
                ovf_pages[got] = op
                got += 1
                slot += 1
        else:  # leaf by leaf from the record counts
            take = max(min(nkeys - slot, n - got), 0)
            got += take
            slot += take
        if slot < nkeys:
            stack_slot[leaf_level] = slot
            return OK, 0, got, wrapped, 0
        code, page, w, at_end = _next_leaf(buf, fmt, stack_pg, stack_slot, depth, last_pg,
                                           nkeys, wrap, root, touched, account)
        if code != OK:
            return code, page, got, wrapped, 0
        wrapped += w
        if at_end:
            return OK, 0, got, wrapped, 1
    return OK, 0, got, wrapped, 0


@njit(cache=True, nogil=True)
def walk_collect(buf, fmt, stack_pg, stack_slot, depth, last_pg, n, wrap, root,
                 val_off, val_len, leaf_pg, ovf_pages, key_off, key_len, touched, account):
    """Advance a cursor ``n`` records from its position, collecting each record passed.

    The cursor is ``stack_pg``/``stack_slot`` (root to leaf, updated in place) and must sit
    on a record; the record under it is the first one collected. Moving to the next leaf
    climbs the stack and descends leftmost, so only branch and leaf pages are read (values
    are located, never read). At the end of the tree the walk wraps around to the first
    record when ``wrap``, else stops. Returns ``(code, page, collected, wrapped, at_end)``;
    after the call the cursor sits on the record following the last one collected (or, at
    the end without ``wrap``, on the last record with ``at_end`` set).
    """
    return _walk(buf, fmt, stack_pg, stack_slot, depth, last_pg, n, wrap, root, True,
                 val_off, val_len, leaf_pg, ovf_pages, key_off, key_len, touched, account)


@njit(cache=True, nogil=True)
def walk_skip(buf, fmt, stack_pg, stack_slot, depth, last_pg, n, wrap, root, touched,
              account):
    """:func:`walk_collect` without collecting: advance a cursor ``n`` records, leaf by
    leaf from the leaves' record counts (the same branch and leaf pages are read, no node
    is parsed). Returns ``(code, page, passed, wrapped, at_end)``."""
    none = np.empty(0, np.int64)
    return _walk(buf, fmt, stack_pg, stack_slot, depth, last_pg, n, wrap, root, False,
                 none, none, none, none, none, none, touched, account)


@njit(cache=True, nogil=True)
def locate(buf, fmt, leaves, leaf_first, last_pg, indices, val_off, val_len, leaf_pg,
           ovf_pages, key_off, key_len, touched, account):
    """Value offset and length of records ``indices`` through the leaf directory.

    ``leaf_first[j]`` is the index of the first record on leaf ``leaves[j]``. Each lookup
    is a binary search plus one leaf node read: exactly the leaf pages holding the records
    are touched. A record that follows the one before it on the same leaf (runs of
    consecutive records, as unshuffled epochs ask for) takes that leaf, already found and
    checked, without the search. Returns ``(code, page)``.
    """
    psize = fmt[0]
    nleaves = leaves.shape[0]
    lo = -1  # the leaf of the record before, checked: it holds nkeys records
    nkeys = 0
    prev = -2
    for t in range(indices.shape[0]):
        r = indices[t]
        if not (r == prev + 1 and lo >= 0 and r - leaf_first[lo] < nkeys
                and (lo + 1 == nleaves or r < leaf_first[lo + 1])):
            lo = 0
            hi = nleaves
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if leaf_first[mid] <= r:
                    lo = mid
                else:
                    hi = mid
            code, nkeys = check_page(buf, fmt, leaves[lo], last_pg)
            if code != OK:
                return code, leaves[lo]
        prev = r
        pg = leaves[lo]
        slot = r - leaf_first[lo]
        if slot < 0 or slot >= nkeys:
            return E_COUNT, pg
        code, ko, kl, vo, vl, op, _fl = leaf_node(buf, fmt, pg * psize, slot, last_pg, False)
        if code != OK:
            return code, pg
        if account:
            touched[pg] = 1
        key_off[t] = ko
        key_len[t] = kl
        val_off[t] = vo
        val_len[t] = vl
        leaf_pg[t] = pg
        ovf_pages[t] = op
    return OK, 0


@njit(cache=True, nogil=True)
def gather_batch(buf, fmt, val_off, val_len, ovf_pages, key_off, key_len, payload,
                 offsets, keys, key_offsets, touched, account):
    """A batch in one pass: check each record's overflow header, copy the values back to
    back into ``payload`` and the keys into ``keys``, and write both offset tables
    (``n + 1`` entries each, starting at 0).

    What the reader fills a ring slot with, without a call (and a Python round trip) per
    step. Returns ``(code, page, payload_bytes, key_bytes)``; the copy stops at the first
    bad overflow header (``E_OVERFLOW_HEADER``, its page), or when ``payload`` or ``keys``
    is too small (``E_COUNT``, page ``-1`` or ``-2``, with the bytes needed in place of the
    sizes). Ranges come from the validating kernels (locate, walks): inside ``buf``.
    """
    psize = fmt[0]
    n = val_off.shape[0]
    need = 0
    kneed = 0
    for t in range(n):
        need += val_len[t]
        kneed += key_len[t]
    if need > payload.shape[0]:
        return E_COUNT, -1, need, kneed
    if kneed > keys.shape[0]:
        return E_COUNT, -2, need, kneed
    pos = 0
    kpos = 0
    offsets[0] = 0
    key_offsets[0] = 0
    for t in range(n):
        bad = _bad_overflow_run(buf, fmt, val_off[t], ovf_pages[t])
        if bad >= 0:
            return E_OVERFLOW_HEADER, bad, 0, 0
        pos = _copy_range(payload, pos, buf, val_off[t], val_len[t], psize, touched, account)
        offsets[t + 1] = pos
        copy_bytes(keys, kpos, buf, key_off[t], key_len[t])
        kpos += key_len[t]
        key_offsets[t + 1] = kpos
    return OK, 0, pos, kpos


@njit(cache=True, nogil=True)
def gather_ranges(buf, val_off, val_len, out, out_offsets, psize, touched, account):
    """Copy byte ranges (``val_off[t]``, ``val_len[t]``) back to back into ``out``.

    Callers check that ``out`` is large enough (``val_len.sum()``) and that every range
    lies inside ``buf`` (ranges come from the validating kernels above).
    """
    pos = 0
    out_offsets[0] = 0
    for t in range(val_off.shape[0]):
        pos = _copy_range(out, pos, buf, val_off[t], val_len[t], psize, touched, account)
        out_offsets[t + 1] = pos
    return pos


@njit(cache=True, nogil=True)
def gather_each_batch(buf, fmt, val_off, val_len, batch, out, check):
    """Copy value spans batch by batch (``batch`` spans each) into ``out``, every batch
    from ``out[0]`` on: a consumer taking the batches of a ring slot one after another, each
    into memory the size of one batch. With ``check``, each overflow value's page header
    is checked (:func:`bad_span_header`) just before its bytes are copied: one pass over
    the values instead of a checking pass over the slot and then a copying one (on a
    slot of thousands of values the second pass found neither their cache lines nor their
    page translations any more). Returns ``(code, value)``: ``(OK, bytes copied over all
    batches)``, ``(-1, t)`` when ``out`` is too small for span ``t``, or
    ``(E_OVERFLOW_HEADER, page)``; nothing past the failing span is copied.

    Callers check that every span lies inside ``buf`` (spans a worker checked against its
    mapping) and that ``batch`` is at least 1.
    """
    total = 0
    n = val_off.shape[0]
    for first in range(0, n, batch):
        pos = 0
        for t in range(first, min(first + batch, n)):
            if pos + val_len[t] > out.shape[0]:
                return -1, t
            if check:
                bad = bad_span_header(buf, fmt, val_off[t], val_len[t])
                if bad >= 0:
                    return E_OVERFLOW_HEADER, bad
            copy_bytes(out, pos, buf, val_off[t], val_len[t])
            pos += val_len[t]
        total += pos
    return OK, total


#: rows :func:`take_rows` asks for ahead of the one it copies
TAKE_ROWS_AHEAD = 16


@njit(cache=True, nogil=True)
def take_rows(table, known, ids, out):
    """Rows ``ids`` of the row-major ``table`` (n, k) into the field-major ``out`` (k,
    len(ids)): record ``ids[j]``'s k fields (one cache line for k <= 8 int64) become column
    ``j`` of the k output rows. Returns -1, or the first ``j`` whose record is not
    ``known`` (``out`` is then partly written). The caller checked ``ids`` (0 <= id < n).

    Shuffled ids make every row a cache miss, and between two slots the kernels' pixel
    traffic evicts the table from the cache: the row :data:`TAKE_ROWS_AHEAD` ids ahead is
    asked for before each row is copied, so that the misses overlap (2,880 rows of a
    20,000-row table after evicting the cache: 280-390 us -> 130-240 us)."""
    k = table.shape[1]
    flat = table.reshape(-1)
    m = ids.shape[0]
    for j in range(min(TAKE_ROWS_AHEAD, m)):
        prefetch_line(flat, ids[j] * k)
    for j in range(m):
        if j + TAKE_ROWS_AHEAD < m:
            prefetch_line(flat, ids[j + TAKE_ROWS_AHEAD] * k)
        r = ids[j]
        if not known[r]:
            return j
        for f in range(k):
            out[f, j] = table[r, f]
    return -1
