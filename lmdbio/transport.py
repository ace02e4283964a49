"""Batch compression between a node's reader and its workers (``codec: {name: ibp}``).

The reader fits an IBP model once on a sample of the records' raw bytes (records must all
have one size: tensor records, raw Datums of one shape), shares it with the node's workers,
then compresses each worker's part of every slot separately, so each worker decompresses
only its own part. Less data sits in node shared memory and, on GPU workers, crosses PCIe.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.errors import ConfigError
from lmdbio.lmdb import Database

SAMPLE_RECORDS = 2048


def fit_transport_model(db: Database, options: dict[str, Any]) -> Any:
    """Fit the IBP model on up to ``SAMPLE_RECORDS`` records spread over the database."""
    from lmdbio.codecs import ibp

    n = len(db)
    if n == 0:
        raise ConfigError("codec ibp: the database is empty")
    idx = np.unique(np.linspace(0, n - 1, min(n, SAMPLE_RECORDS)).astype(np.int64))
    refs = db.locate(idx) if db._leaf_first is not None else None
    if refs is None:
        t = db.record_table()
        sizes = np.unique(t.val_len)
        if sizes.size != 1:
            raise ConfigError(f"codec ibp compresses fixed-size records; {db.path} holds "
                              f"values of {sizes.size} sizes ({sizes.min()}..{sizes.max()})")
        buf, _ = db.gather(idx)
        size = int(sizes[0])
    else:
        sizes = np.unique(refs.val_len)
        if sizes.size != 1:
            raise ConfigError(f"codec ibp compresses fixed-size records; {db.path} holds "
                              f"values of several sizes ({sizes.min()}..{sizes.max()})")
        buf, _ = db.gather_refs(refs)
        size = int(sizes[0])
    rows = buf.reshape(idx.size, size)
    chunk = int(options.get("chunk_bytes", 4))
    return ibp.fit(rows, chunk_bytes=chunk, threshold=options.get("threshold"))


def compress_parts(model: Any, payload: np.ndarray, offsets: np.ndarray,
                   counts: np.ndarray) -> list[np.ndarray]:
    """One IBP frame per worker part of a gathered batch (rows of one size)."""
    from lmdbio.codecs.ibp import compress_into, max_packed_nbytes

    n = offsets.shape[0] - 1
    size = int(offsets[1] - offsets[0]) if n else 0
    if n and int(offsets[-1]) != n * size:
        raise ConfigError("codec ibp: a batch holds records of different sizes")
    rows = payload[:n * size].reshape(n, size) if n else payload[:0].reshape(0, 0)
    blobs = []
    start = 0
    for c in counts.tolist():
        part = rows[start:start + c]
        out = np.empty(max_packed_nbytes(model, c), np.uint8)
        used = compress_into(model, part, out)
        blobs.append(out[:used])
        start += c
    return blobs


def decompress_part(model: Any, blob: np.ndarray, count: int, xp: Any = np) -> np.ndarray:
    """The rows of one worker part, as one contiguous uint8 buffer."""
    from lmdbio.codecs.ibp import decompress_from

    rows = decompress_from(model, blob, nrows=count, xp=xp)
    return rows.reshape(-1).view(np.uint8) if xp is np else rows.reshape(-1)
