"""``lmdbio convert FILE.btable DST --layout btable``: one sparse row record per BTable row.

Keys are the row numbers as 10 zero-padded ASCII digits (``b"0000000000"``, ...), so key order
is row order. Each value is a sparse row record (little-endian; see
:mod:`lmdbio.codecs.btable.rows`)::

    uint32 nnz | uint32 n_cols | int32 columns[nnz] | 4 zero bytes if nnz is odd |
    float64 values[nnz]

The labels, row/non-zero counts and the record format go in the ``lmdbio.json`` sidecar.
The file is streamed in chunks (``--chunk-mib``), so a BTable larger than memory converts.
:func:`lmdbio.codecs.btable.export_lmdb` writes such an LMDB back to a byte-identical BTable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

from lmdbio.codecs import btable
from lmdbio.commands import progress
from lmdbio.convert.writer import write_records
from lmdbio.dataset_meta import write_dataset_meta
from lmdbio.errors import LmdbioError

RECORD_FORMAT = "sparse-row-v1"
KEY_DIGITS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunk-mib", type=int, default=16,
                        help="read the BTable this many MiB at a time (default 16)")


def row_key(row: int) -> bytes:
    """The LMDB key of row ``row``."""
    return b"%0*d" % (KEY_DIGITS, row)


def convert(src: str, dst: str, args: argparse.Namespace) -> dict[str, Any]:
    """Stream ``src`` (a .btable file) into a new LMDB ``dst``; return a summary."""
    if not os.path.isfile(src):
        raise LmdbioError(f"{src}: --layout btable converts a .btable file; no such file")
    labels = btable.read_labels(src)
    n_cols = len(labels)
    counts = {"rows": 0, "nnz": 0}
    chunk = max(1, int(getattr(args, "chunk_mib", 16))) << 20

    def records() -> Iterator[tuple[bytes, bytes]]:
        row = 0
        for block in btable.iter_blocks(src, chunk):
            buf, offsets = btable.encode_row_records(block.indptr, block.indices,
                                                          block.data, n_cols)
            mv = memoryview(buf)
            offs = offsets.tolist()
            for r in range(block.shape[0]):
                yield row_key(row + r), mv[offs[r]:offs[r + 1]]
            row += block.shape[0]
            counts["rows"] = row
            counts["nnz"] += block.nnz

    meta = {"layout": "btable", "record_format": RECORD_FORMAT, "labels": labels,
            "n_cols": n_cols, "source": os.path.abspath(src), "key_format": f"%0{KEY_DIGITS}d"}
    # the bar's total: one pass over the row headers (not the values), only for a bar
    total = btable.info(src, chunk)["rows"] if progress.active() else None
    summary = write_records(dst, records(), meta=None, total=total,
                            format_version=getattr(args, "format_version", 1),
                            overwrite=getattr(args, "overwrite", False))
    write_dataset_meta(dst, {**meta, "rows": counts["rows"], "nnz": counts["nnz"],
                             "records": summary["records"],
                             "format_version": getattr(args, "format_version", 1)})
    return {**summary, "rows": counts["rows"], "nnz": counts["nnz"], "n_cols": n_cols,
            "btable_bytes": os.path.getsize(src)}
