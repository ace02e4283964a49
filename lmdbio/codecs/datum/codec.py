"""The numcodecs codec of Caffe ``Datum`` records (``caffe_datum``), registered with
numcodecs on import when numcodecs is installed (it is optional)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.datum.format import datum_from_array, decode_datum, encode_datum
from lmdbio.codecs.numcodecs_base import ConfigEquality, as_input, refuse_object_out

__all__ = ["DatumCodec", "register"]


class DatumCodec(ConfigEquality):
    """numcodecs-style codec between a ``(C, H, W)`` array and a serialized Datum.

    ``encode`` writes what ``convert_imageset`` writes (with ``label``); ``decode`` returns the
    pixels (``out``, when given, receives them).
    """

    codec_id = "caffe_datum"

    def __init__(self, label: int = 0) -> None:
        self.label = int(label)

    def encode(self, buf: Any) -> bytes:
        return encode_datum(datum_from_array(as_input(buf, "Datum codec"), self.label))

    def decode(self, buf: Any, out: np.ndarray | None = None) -> np.ndarray:
        refuse_object_out(out, "Datum codec")
        arr = decode_datum(buf).to_array()
        if out is not None:
            np.copyto(out.reshape(arr.shape), arr, casting="unsafe")
            return out
        return arr

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "label": self.label}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> DatumCodec:
        cfg = {k: v for k, v in config.items() if k != "id"}
        return cls(**cfg)

    def __repr__(self) -> str:
        return f"DatumCodec(label={self.label})"


def register() -> None:
    """Register :class:`DatumCodec` with numcodecs (nothing when it is not installed)."""
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # numcodecs is optional
        return
    register_codec(DatumCodec)  # type: ignore[arg-type]


register()
