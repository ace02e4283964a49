"""What ``lmdbio inspect`` reports about a database, as a plain dictionary.

Beyond py-lmdb's statistics it measures how closely the file's page order follows key
order: speculative prefetch of page ranges only works when consecutive records sit on
increasing pages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.lmdb.database import Database


def _sizes(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"min": 0, "mean": 0.0, "median": 0.0, "p95": 0.0, "max": 0, "total": 0}
    return {
        "min": int(values.min()),
        "mean": float(values.mean()),
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
        "max": int(values.max()),
        "total": int(values.sum()),
    }


def increasing_fraction(pages: np.ndarray) -> float | None:
    """Fraction of consecutive pairs whose page numbers increase (None for < 2 pages)."""
    if pages.size < 2:
        return None
    return float(np.mean(np.diff(pages) > 0))


def free_pages(db: Database) -> dict[str, int]:
    """Records and total page numbers held by the free list (FREE_DBI) of the snapshot."""
    free = db.meta.free_db
    if free.empty:
        return {"records": 0, "pages": 0}
    table = db._build_table(free)
    total = 0
    for off, length in zip(table.val_off.tolist(), table.val_len.tolist(), strict=False):
        if length >= 8:
            total += int.from_bytes(db.mv[off:off + 8], "little")
    return {"records": len(table), "pages": total}


def inspect_database(path: str, subdb: str | bytes | None = None) -> dict[str, Any]:
    """Everything ``lmdbio inspect`` prints, for the database at ``path``."""
    with Database(path, subdb=subdb, pin_snapshot=False) as db:
        st = db.stat()
        table = db.record_table()
        leaves = db.leaves()
        runs = table.ovf_pages > 0
        ovf_start = (table.val_off[runs] - db.layout.header_size) // db.psize
        return {
            "path": str(db.path),
            "format_version": st["format_version"],
            "page_size": st["psize"],
            "entries": st["entries"],
            "depth": st["depth"],
            "txnid": st["txnid"],
            "live_meta_page": st["live_meta_page"],
            "flags": st["flags"],
            "pages": {
                "branch": st["branch_pages"],
                "leaf": st["leaf_pages"],
                "overflow": st["overflow_pages"],
                "last_page": st["last_pgno"],
                "in_file": st["file_size"] // st["psize"],
            },
            "free_list": free_pages(db),
            "named_databases": [n.decode("utf-8", "replace") for n in db.subdatabases()],
            "key_bytes": _sizes(table.key_len.astype(np.int64)),
            "value_bytes": _sizes(table.val_len),
            "records_inline": int(np.count_nonzero(~runs)),
            "records_overflow": int(np.count_nonzero(runs)),
            "file_order": {
                "leaf_pages_increasing": increasing_fraction(leaves),
                "overflow_runs_increasing": increasing_fraction(ovf_start),
                "comment": "fraction of consecutive pages (in key order) whose page numbers "
                           "increase: 1.0 means the file is laid out in key order",
            },
        }
