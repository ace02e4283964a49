"""What lmdbio's numcodecs codecs share, so they behave as numcodecs' own do.

numcodecs' conventions (checked by its helpers in ``numcodecs.tests.common``): ``encode``
takes any buffer (an array, ``bytes``, ``bytearray``, ``array.array``), where a non-array is
its raw bytes; an object array cannot be encoded, nor decoded into, and says so with a
:class:`TypeError`; ``decode(buf, out)`` fills any writeable buffer of the right size; a
codec equals the codec :func:`numcodecs.get_codec` builds from its config, so config round
trips (zarr metadata) can be checked.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from lmdbio.errors import CodecError, CodecTypeError

__all__ = ["ConfigEquality", "as_input", "copy_out", "fill_out", "refuse_object_out"]


def as_input(buf: Any, what: str) -> np.ndarray:
    """``buf`` as an array: an array as it is, any other buffer as its bytes (1-D uint8,
    no copy). An object array raises :class:`CodecTypeError` (its memory holds pointers,
    not values)."""
    if isinstance(buf, np.ndarray):
        arr = buf
    else:
        try:
            arr = np.frombuffer(memoryview(buf).cast("B"), np.uint8)
        except TypeError:  # not a buffer (a list, say): numpy decides what it is
            arr = np.asarray(buf)
    if arr.dtype.hasobject:
        raise CodecTypeError(f"{what} cannot encode an object array (dtype {arr.dtype}): "
                             "it holds references, not values")
    return arr


def refuse_object_out(out: Any, what: str) -> None:
    """Raise :class:`CodecTypeError` for an ``out`` that is an object array (decoding into
    it would write raw bytes over object references)."""
    if isinstance(out, np.ndarray) and out.dtype.hasobject:
        raise CodecTypeError(f"{what} cannot decode into an object array")


def copy_out(data: np.ndarray, out: Any, what: str) -> Any:
    """Copy ``data``'s bytes into ``out`` (any writeable contiguous buffer of the same
    byte size: an array of any dtype and shape, a ``bytearray``) and return ``out``."""
    refuse_object_out(out, what)
    dst = out if isinstance(out, np.ndarray) else np.frombuffer(out, np.uint8)
    if not dst.flags.writeable or not (dst.flags.c_contiguous or dst.flags.f_contiguous):
        raise CodecError(f"{what}: out must be a writeable contiguous buffer")
    # its memory in order (a Fortran-ordered out is filled in its memory order, as
    # numcodecs' codecs fill it)
    flat = dst.reshape(-1) if dst.flags.c_contiguous else dst.T.reshape(-1)
    src = np.ascontiguousarray(data)
    if dst.nbytes != src.nbytes:
        raise CodecError(f"{what}: out holds {dst.nbytes} bytes, the decoded chunk "
                         f"{src.nbytes}")
    flat.view(np.uint8)[...] = src.reshape(-1).view(np.uint8)
    return out


def fill_out(data: np.ndarray, out: Any, what: str) -> Any:
    """Put decoded ``data`` into ``out`` and return it: an array of ``data``'s shape takes
    the values (whatever its memory order and dtype: a float32 buffer can receive uint8
    pixels); any buffer of ``data``'s byte size takes the bytes in its memory order
    (:func:`copy_out`, numcodecs' rule for a buffer); an array of as many elements in
    another shape and dtype takes the values in C order, cast."""
    refuse_object_out(out, what)
    if isinstance(out, np.ndarray) and out.shape == data.shape:
        np.copyto(out, data, casting="unsafe")
        return out
    if isinstance(out, np.ndarray) and out.nbytes != data.nbytes and out.size == data.size:
        np.copyto(out, data.reshape(out.shape), casting="unsafe")
        return out
    return copy_out(data, out, what)


class ConfigEquality:
    """Equality (and hash) by config: two codecs are equal when they are of one class
    and :meth:`get_config` returns the same settings, as numcodecs' ``check_config``
    expects of a codec rebuilt from its config."""

    def get_config(self) -> dict[str, Any]:  # pragma: no cover - every codec has its own
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and \
            other.get_config() == self.get_config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(json.dumps(self.get_config(), sort_keys=True, default=str))
