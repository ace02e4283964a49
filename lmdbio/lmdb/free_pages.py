"""The free list of a snapshot: pages LMDB's free-page database lists, and its own pages.

Neither holds a record of the snapshot: between the values, which LMDB writes in key order,
they are what a reader cannot place from the main tree alone (dm-spec's estimate,
:mod:`lmdbio.plan.strategies.spec_estimate`, places them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lmdbio.errors import LmdbFormatError
from lmdbio.lmdb.snapshot import check_db_record

if TYPE_CHECKING:
    from lmdbio.lmdb.database import Database


def free_list(db: Database) -> tuple[np.ndarray, np.ndarray]:
    """``(free, own)``: the pages LMDB's free-page database lists as free in ``db``'s
    snapshot, and that database's own pages (branch, leaf and overflow), each sorted.

    Reads the free database's pages (a leaf or a few on most files; marked in the
    accounting as any page read). Raises :class:`~lmdbio.errors.LmdbFormatError` naming
    the page for a record that is not a page list or lists a page outside the snapshot."""
    db.check_open()
    fdb = db.meta.free_db
    empty = np.empty(0, np.int64)
    if fdb.empty:
        return empty, empty
    fdb = check_db_record(fdb, db.meta, db.path, "free-page database")
    levels, _ = db.tree_levels(fdb)
    t = db.build_table(fdb, db.checked_leaves(levels[-1]))
    own = list(levels)
    free = []
    last, psize = db.meta.last_pg, db.psize
    for j in range(len(t)):  # one record per commit that freed pages still listed
        off, n, ovf = int(t.val_off[j]), int(t.val_len[j]), int(t.ovf_pages[j])
        page = off // psize  # its leaf, or the first page of its overflow run
        if ovf:
            own.append(np.arange(page, page + ovf, dtype=np.int64))
            if db.accounting.enabled:
                db.accounting.touched[page:page + ovf] = 1
        ids = db.buf[off:off + n // 8 * 8].copy().view("<u8").astype(np.int64)
        count = int(ids[0]) if ids.size else -1
        if not 0 <= count < ids.size:
            raise LmdbFormatError(db.path, f"free-page record of {n} bytes does not "
                                  f"hold a page list (count {count})", page=page)
        pages = ids[1:count + 1]
        if pages.size and (pages.min() < 2 or pages.max() > last):
            raise LmdbFormatError(db.path, f"free-page record lists a page outside "
                                  f"2..{last}", page=page)
        free.append(pages)
    return (np.unique(np.concatenate(free)) if free else empty,
            np.unique(np.concatenate(own)))
