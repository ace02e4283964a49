"""The numcodecs codec of lmdbio's tensor records (``lmdbio_tensor``), registered with
numcodecs on import when numcodecs is installed (it is optional)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.numcodecs_base import ConfigEquality, as_input, fill_out, refuse_object_out
from lmdbio.codecs.tensor.format import decode_tensor, encode_tensor

__all__ = ["TensorCodec", "register"]


class TensorCodec(ConfigEquality):
    """numcodecs-style codec between an array and one tensor record (``label`` optional)."""

    codec_id = "lmdbio_tensor"

    def __init__(self, label: int | None = None) -> None:
        self.label = None if label is None else int(label)

    def encode(self, buf: Any) -> bytes:
        return encode_tensor(as_input(buf, "tensor codec"), self.label)

    def decode(self, buf: Any, out: np.ndarray | None = None) -> np.ndarray:
        refuse_object_out(out, "tensor codec")
        arr, _ = decode_tensor(buf)
        if out is not None:
            return fill_out(arr, out, "tensor codec")
        return arr

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "label": self.label}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TensorCodec:
        return cls(**{k: v for k, v in config.items() if k != "id"})

    def __repr__(self) -> str:
        return f"TensorCodec(label={self.label})"


def register() -> None:
    """Register :class:`TensorCodec` with numcodecs (nothing when it is not installed)."""
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # numcodecs is optional
        return
    register_codec(TensorCodec)  # type: ignore[arg-type]


register()
