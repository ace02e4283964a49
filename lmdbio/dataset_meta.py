"""The dataset sidecar ``lmdbio.json``: what a converter wrote about the records beside them.

Dataset metadata (layout, shapes, codec parameters, an IBP model, BTable labels...) goes in a
JSON file beside ``data.mdb`` rather than in the database: the main database then holds the
data records only, so Caffe and py-lmdb readers see exactly the records. Converters write it
(:mod:`lmdbio.convert.writer`), and readers, codecs and ``lmdbio inspect`` read it; this
module is their one home, below both (it imports nothing of lmdbio but its errors).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmdbio.errors import LmdbioError

__all__ = ["META_FILE", "dataset_dir", "read_dataset_meta", "write_dataset_meta"]

#: the sidecar's name, beside ``data.mdb``
META_FILE = "lmdbio.json"


def dataset_dir(path: str | os.PathLike) -> Path:
    """The LMDB directory for ``path`` (a directory, or a ``data.mdb`` inside one)."""
    p = Path(path)
    return p.parent if p.is_file() else p


def read_dataset_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The metadata sidecar of the LMDB at ``path``; ``{}`` where there is none."""
    f = dataset_dir(path) / META_FILE
    if not f.exists():
        return {}
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise LmdbioError(f"{f}: unreadable dataset metadata ({exc})") from exc
    if not isinstance(meta, dict):
        raise LmdbioError(f"{f}: dataset metadata must be a JSON object")
    return meta


def write_dataset_meta(path: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Write the metadata sidecar atomically (write a temporary file, then rename)."""
    d = dataset_dir(path)
    tmp = d / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=_jsonable))
    os.replace(tmp, d / META_FILE)


def _jsonable(value: Any) -> Any:
    """JSON for what ``json`` cannot write itself: numpy values and arrays, bytes."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
