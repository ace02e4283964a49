"""numcodecs-compatible IBP codec, constructible from its config alone.

Two ways to use it, both nameable in a zarr array's metadata or any numcodecs config:

* ``IBPCodec(model)``: the fitted model travels **inside the config** (``get_config()``
  holds it base64-encoded, so the config is JSON), and frames are the plain IBP frames
  of :mod:`lmdbio.codecs.ibp.packed` (what the batch transport and ``convert --layout ibp``
  write). Best when one model fits the whole data set: fit it once on a sample.
* ``IBPCodec()`` (``get_codec({"id": "ibp"})``): no model; **each chunk is fitted on its
  own and its model is stored in its frame** (a self-describing frame: ``"IBPS"``, the
  model's bytes, then the IBP frame), so decoding needs nothing from the config and any
  codec decodes it. Each encode is independent of the others (no state kept between
  chunks, safe from several threads), at the price of a fit per chunk and the model's
  bytes (``2 x chunks-per-row x chunk_bytes`` plus ~60 bytes) in every frame.
  ``chunk_bytes``, ``search`` and ``sample`` are :func:`~lmdbio.codecs.ibp.model.fit`'s.

Rows: an array's rows are along its first axis (a 0-d or 1-D array: one element a row;
a Fortran-ordered array: its elements in memory order, as numcodecs takes buffers);
with a model, any buffer whose size is a whole number of the model's rows is viewed as
such rows; without one, a raw buffer (``bytes``) is rows of one byte, so pass arrays.
``decode(buf, out=None)`` returns the rows, or fills ``out`` (any buffer of their byte
size). An object array raises :class:`TypeError`, as numcodecs' codecs do. Registered
with numcodecs as ``"ibp"`` when numcodecs is importable; numcodecs is not required.
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel, fit, model_from_bits
from lmdbio.codecs.ibp.packed import LAYOUTS, IBPPacked
from lmdbio.codecs.numcodecs_base import as_input, fill_out, refuse_object_out
from lmdbio.errors import CodecError

try:  # numcodecs is optional: subclass its Codec when it is there
    from numcodecs.abc import Codec as _Base
except ImportError:  # pragma: no cover - exercised only without numcodecs
    _Base = object  # type: ignore[assignment,misc]

#: magic of a self-describing frame (the model, then the IBP frame)
SELF_MAGIC = b"IBPS"
SELF_VERSION = 1
#: magic, version, 3 reserved bytes, model length
_SELF_HEAD = struct.Struct("<4sBxxxI")


def _memory_order(arr: np.ndarray) -> np.ndarray:
    """``arr`` C-contiguous; a Fortran-ordered array as its elements in memory order (1-D),
    since numcodecs' codecs take a buffer's bytes as they lie (and give them back so)."""
    if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous:
        return arr.reshape(-1, order="A")
    return np.ascontiguousarray(arr)


class IBPCodec(_Base):  # type: ignore[misc,valid-type]
    """Invariant bit packing of fixed-size rows: with a fitted :class:`IBPModel` (carried
    in the config), or without one (each chunk fitted, its model in its frame); see the
    module docstring."""

    codec_id = "ibp"

    def __init__(self, model: IBPModel | bytes | str | None = None,
                 layout: str = "condensed", checksum: bool = True, chunk_bytes: int = 4,
                 search: str = "auto", sample: float | None = None) -> None:
        if isinstance(model, str):
            try:
                model = base64.b64decode(model.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as exc:
                raise CodecError(f"IBP codec: model is not valid base64 ({exc})") from None
        if isinstance(model, (bytes, bytearray, memoryview)):
            model = IBPModel.from_bytes(model)
        if model is not None and not isinstance(model, IBPModel):
            raise CodecError(f"IBP codec needs an IBPModel or none, not "
                             f"{type(model).__name__}")
        if layout not in LAYOUTS:
            raise CodecError(f"IBP layout must be 'inplace' or 'condensed', not {layout!r}")
        if chunk_bytes not in (4, 8):
            raise CodecError(f"IBP chunk_bytes must be 4 or 8, not {chunk_bytes!r}")
        if search not in ("auto", "global", "column"):
            raise CodecError(f"IBP search must be auto, global or column, not {search!r}")
        self.model: IBPModel | None = model
        self.layout = layout
        self.checksum = bool(checksum)
        self.chunk_bytes = int(chunk_bytes)
        self.search = search
        self.sample = None if sample is None else float(sample)

    def _rows(self, buf: Any, model: IBPModel) -> np.ndarray:
        arr = _memory_order(as_input(buf, "IBP codec"))
        m = model
        if arr.dtype == m.dtype and arr.shape[1:] == m.row_shape and arr.ndim >= 1:
            return arr
        flat = arr.reshape(-1).view(np.uint8)
        if flat.nbytes % m.row_bytes:
            raise CodecError(f"IBP codec: {flat.nbytes} bytes is not a whole number of "
                             f"{m.row_bytes}-byte rows")
        return flat.view(m.dtype).reshape((-1, *m.row_shape))

    def _fit(self, buf: Any) -> tuple[IBPModel, np.ndarray]:
        """The rows of ``buf`` (first axis; a 0-d or 1-D array: one element a row) and a
        model fitted to them (an all-raw model for no rows: there is nothing to fit)."""
        arr = _memory_order(as_input(buf, "IBP codec"))
        rows = arr.reshape(-1) if arr.ndim == 0 else arr
        row_shape = rows.shape[1:]
        if rows.shape[0] == 0:
            n = -(-max(int(np.prod(row_shape, dtype=np.int64)) * rows.dtype.itemsize, 1)
                  // self.chunk_bytes)
            zeros = np.zeros((1, n), np.uint32 if self.chunk_bytes == 4 else np.uint64)
            return model_from_bits(rows.dtype, row_shape, self.chunk_bytes, zeros, zeros,
                                   search="fixed"), rows
        # fit takes rows of at least one axis: one element a row is fitted as (N, 1)
        m = fit(rows.reshape(-1, 1) if rows.ndim == 1 else rows, self.chunk_bytes,
                sample=self.sample, search=self.search)
        if rows.ndim == 1:  # the same masks, for rows of one element (decoded as (N,))
            m = IBPModel(m.dtype, (), m.chunk_bytes, m.masks, m.bitvals, m.threshold,
                         m.search)
        return m, rows

    def encode(self, buf: Any) -> bytes:
        """One frame holding every row of ``buf``: a plain IBP frame with the codec's
        model, else a self-describing one (the chunk's own model, then the frame)."""
        if self.model is not None:
            return self.model.compress(self._rows(buf, self.model), self.layout).to_bytes(
                self.checksum)
        model, rows = self._fit(buf)
        frame = model.compress(rows, self.layout).to_bytes(self.checksum)
        mb = model.to_bytes()
        return _SELF_HEAD.pack(SELF_MAGIC, SELF_VERSION, len(mb)) + mb + frame

    def decode(self, buf: Any, out: Any = None) -> Any:
        """The rows of the frame ``buf`` (decoded with the model its frame carries, else
        the codec's); copied into ``out`` when given (same byte size)."""
        refuse_object_out(out, "IBP codec")
        data = buf if isinstance(buf, np.ndarray) else np.frombuffer(
            memoryview(buf).cast("B"), np.uint8)
        data = data.reshape(-1).view(np.uint8)
        model = self.model
        if data.nbytes >= _SELF_HEAD.size and bytes(data[:4]) == SELF_MAGIC:
            _, version, n = _SELF_HEAD.unpack(data[:_SELF_HEAD.size].tobytes())
            if version != SELF_VERSION:
                raise CodecError(f"IBP self-describing frame: unsupported version {version}")
            if _SELF_HEAD.size + n > data.nbytes:
                raise CodecError(f"IBP self-describing frame: {data.nbytes} bytes cannot hold "
                                 f"its {n}-byte model")
            model = IBPModel.from_bytes(data[_SELF_HEAD.size:_SELF_HEAD.size + n].tobytes())
            data = data[_SELF_HEAD.size + n:]
        elif model is None:
            raise CodecError("IBP frame carries no model and the codec has none: decode it "
                             "with IBPCodec(model), the model it was packed with")
        rows = model.decompress(IBPPacked.from_bytes(data, validate=False))
        if out is None:
            return rows
        return fill_out(rows, out, "IBP codec")

    def get_config(self) -> dict[str, Any]:
        """JSON-able config: the model travels as base64; without one, the fit's
        settings."""
        if self.model is None:
            return {"id": self.codec_id, "model": None, "layout": self.layout,
                    "checksum": self.checksum, "chunk_bytes": self.chunk_bytes,
                    "search": self.search, "sample": self.sample}
        return {"id": self.codec_id,
                "model": base64.b64encode(self.model.to_bytes()).decode("ascii"),
                "layout": self.layout, "checksum": self.checksum}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> IBPCodec:
        """Inverse of :meth:`get_config`; ``{"id": "ibp"}`` alone gives a codec that fits
        each chunk."""
        cfg = dict(config)
        cfg.pop("id", None)
        try:
            return cls(**cfg)
        except TypeError as exc:
            raise CodecError(f"IBP codec config: {exc}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IBPCodec) and other.get_config() == self.get_config()

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, str(v)) for k, v in self.get_config().items())))

    def __repr__(self) -> str:
        if self.model is None:
            return (f"IBPCodec(layout={self.layout!r}, checksum={self.checksum}, "
                    f"chunk_bytes={self.chunk_bytes}, search={self.search!r}, "
                    f"sample={self.sample!r})")
        return f"IBPCodec({self.model!r}, layout={self.layout!r})"


def register() -> bool:
    """Register :class:`IBPCodec` with numcodecs; False when numcodecs is absent."""
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # pragma: no cover
        return False
    register_codec(IBPCodec)
    return True


register()
