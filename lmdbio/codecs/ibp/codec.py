"""numcodecs-compatible IBP codec: the codec carries its model (base64 in its config).

``IBPCodec(model).encode(array)`` packs an array of rows (any buffer whose size is a whole
number of rows is viewed as rows of the model's dtype and shape) into one frame;
``decode(buf, out=None)`` returns the rows, or fills ``out``. Registered with numcodecs as
``"ibp"`` when numcodecs is importable; numcodecs is not required.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel
from lmdbio.codecs.ibp.packed import LAYOUTS, IBPPacked
from lmdbio.errors import CodecError

try:  # numcodecs is optional: subclass its Codec when it is there
    from numcodecs.abc import Codec as _Base
except ImportError:  # pragma: no cover - exercised only without numcodecs
    _Base = object  # type: ignore[assignment,misc]


class IBPCodec(_Base):  # type: ignore[misc,valid-type]
    """Invariant bit packing of fixed-size rows with a fitted :class:`IBPModel`."""

    codec_id = "ibp"

    def __init__(self, model: IBPModel | bytes | str, layout: str = "condensed",
                 checksum: bool = True) -> None:
        if isinstance(model, str):
            try:
                model = base64.b64decode(model.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise CodecError(f"IBP codec: model is not valid base64 ({exc})") from None
        if isinstance(model, (bytes, bytearray, memoryview)):
            model = IBPModel.from_bytes(model)
        if not isinstance(model, IBPModel):
            raise CodecError(f"IBP codec needs an IBPModel, not {type(model).__name__}")
        if layout not in LAYOUTS:
            raise CodecError(f"IBP layout must be 'inplace' or 'condensed', not {layout!r}")
        self.model = model
        self.layout = layout
        self.checksum = bool(checksum)

    def _rows(self, buf: Any) -> np.ndarray:
        arr = np.asarray(buf) if isinstance(buf, np.ndarray) else np.frombuffer(buf, np.uint8)
        arr = np.ascontiguousarray(arr)
        m = self.model
        if arr.dtype == m.dtype and arr.shape[1:] == m.row_shape and arr.ndim >= 1:
            return arr
        flat = arr.reshape(-1).view(np.uint8)
        if flat.nbytes % m.row_bytes:
            raise CodecError(f"IBP codec: {flat.nbytes} bytes is not a whole number of "
                             f"{m.row_bytes}-byte rows")
        return flat.view(m.dtype).reshape((-1, *m.row_shape))

    def encode(self, buf: Any) -> bytes:
        """One frame holding every row of ``buf``."""
        return self.model.compress(self._rows(buf), self.layout).to_bytes(self.checksum)

    def decode(self, buf: Any, out: Any = None) -> Any:
        """The rows of the frame ``buf``; copied into ``out`` when given (same byte size)."""
        data = buf if isinstance(buf, np.ndarray) else memoryview(buf)
        rows = self.model.decompress(IBPPacked.from_bytes(data, validate=False))
        if out is None:
            return rows
        dst = np.asarray(out)
        if dst.nbytes != rows.nbytes or not dst.flags.c_contiguous:
            raise CodecError(f"IBP codec: out holds {dst.nbytes} bytes, decoded {rows.nbytes}")
        dst.reshape(-1).view(np.uint8)[:] = rows.reshape(-1).view(np.uint8)
        return out

    def get_config(self) -> dict[str, Any]:
        """JSON-able config; the model travels as base64."""
        return {"id": self.codec_id,
                "model": base64.b64encode(self.model.to_bytes()).decode("ascii"),
                "layout": self.layout, "checksum": self.checksum}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> IBPCodec:
        """Inverse of :meth:`get_config`."""
        cfg = dict(config)
        cfg.pop("id", None)
        try:
            return cls(**cfg)
        except TypeError as exc:
            raise CodecError(f"IBP codec config: {exc}") from None

    def __repr__(self) -> str:
        return f"IBPCodec({self.model!r}, layout={self.layout!r})"


def register() -> bool:
    """Register :class:`IBPCodec` with numcodecs; False when numcodecs is absent."""
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # pragma: no cover
        return False
    register_codec(IBPCodec)
    return True
