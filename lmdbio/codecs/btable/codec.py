"""The numcodecs codec of one sparse row record of ``--layout btable``
(``lmdbio.sparse_row``), registered with numcodecs on import when numcodecs is installed
(it is optional)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.btable.rows import decode_row_records, encode_row_records
from lmdbio.codecs.numcodecs_base import ConfigEquality, as_input, refuse_object_out
from lmdbio.errors import CodecError

__all__ = ["SparseRowCodec", "register"]


class SparseRowCodec(ConfigEquality):
    """numcodecs-style codec of one sparse row record: a dense 1-D row <-> record bytes.

    ``encode`` keeps the entries that are != 0.0 (so -0.0 is dropped and NaN kept, as BTables
    do); ``decode`` returns the dense row as float64 (or fills ``out``).
    """

    codec_id = "lmdbio.sparse_row"

    def __init__(self, n_cols: int) -> None:
        self.n_cols = int(n_cols)

    def encode(self, buf: Any) -> bytes:
        row = as_input(buf, "sparse row codec").astype(np.float64).reshape(-1)
        if row.shape[0] != self.n_cols:
            raise CodecError(f"row has {row.shape[0]} entries, codec expects {self.n_cols}")
        cols = np.flatnonzero(row != 0.0)
        out, _ = encode_row_records(np.array([0, cols.shape[0]]), cols, row[cols], self.n_cols)
        return out.tobytes()

    def decode(self, buf: Any, out: np.ndarray | None = None) -> np.ndarray:
        refuse_object_out(out, "sparse row codec")
        b = np.frombuffer(buf, np.uint8)
        m = decode_row_records(b, np.zeros(1, np.int64), np.array([b.shape[0]]), self.n_cols)
        row = np.zeros(self.n_cols, np.float64) if out is None else out.reshape(-1)
        if out is not None:
            row[...] = 0
        row[m.indices] = m.data
        return row if out is None else out

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "n_cols": self.n_cols}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SparseRowCodec:
        return cls(config["n_cols"])

    def __repr__(self) -> str:
        return f"SparseRowCodec(n_cols={self.n_cols})"


def register() -> None:
    """Register :class:`SparseRowCodec` with numcodecs (nothing when it is not installed)."""
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # numcodecs is optional
        return
    register_codec(SparseRowCodec)  # type: ignore[arg-type]


register()
