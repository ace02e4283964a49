"""BTables, the sparse labelled binary table format, and the sparse row records of
``--layout btable``: the file format (:mod:`.format`), the row encodings (:mod:`.rows`,
kernels in :mod:`.kernels`, status codes there) and the numcodecs codec of one row record
(:mod:`.codec`, registered on import)."""

from __future__ import annotations

from lmdbio.codecs.btable.codec import SparseRowCodec
from lmdbio.codecs.btable.format import (
    CHUNK_BYTES,
    SEP,
    VERSION,
    BTableError,
    BTableWriter,
    export_lmdb,
    info,
    iter_blocks,
    iter_rows,
    read,
    read_labels,
    write,
)
from lmdbio.codecs.btable.rows import (
    STATUS_TEXT,
    decode_btable_rows,
    decode_row_records,
    encode_btable_rows,
    encode_row_records,
    record_nbytes,
    rows_to_dense_tensor,
    scan_btable_rows,
)

__all__ = [
    "CHUNK_BYTES",
    "SEP",
    "STATUS_TEXT",
    "VERSION",
    "BTableError",
    "BTableWriter",
    "SparseRowCodec",
    "decode_btable_rows",
    "decode_row_records",
    "encode_btable_rows",
    "encode_row_records",
    "export_lmdb",
    "info",
    "iter_blocks",
    "iter_rows",
    "read",
    "read_labels",
    "record_nbytes",
    "rows_to_dense_tensor",
    "scan_btable_rows",
    "write",
]
