"""Caffe ``BlobProto`` files (``.binaryproto``), the format of Caffe's mean images.

``caffe.proto``::

    message BlobShape { repeated int64 dim = 1 [packed = true]; }
    message BlobProto {
      optional BlobShape shape = 7;
      repeated float data = 5 [packed = true];   repeated float diff = 6 [packed = true];
      repeated double double_data = 8 [packed = true];
      repeated double double_diff = 9 [packed = true];
      optional int32 num = 1; optional int32 channels = 2;   // legacy 4-D shape
      optional int32 height = 3; optional int32 width = 4;
    }

As in Caffe's ``Blob::FromProto``: the legacy fields, when any is present, give the shape
``(num, channels, height, width)``, otherwise ``shape.dim`` does; values come from
``double_data`` when it is non-empty, else from ``data``; their count must equal the shape's.
Packed and unpacked encodings of the repeated fields are both accepted. ``compute_image_mean``
writes the legacy fields with ``num = 1``, which :func:`write_mean_file` reproduces.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from lmdbio.codecs.protobuf import get_varint, put_varint
from lmdbio.errors import CodecError

__all__ = ["decode_blobproto", "encode_blobproto", "read_mean_file", "write_mean_file"]

_MAX_DIMS = 32


def _varint(mv: memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    return get_varint(mv, pos, end, what, "BlobProto")


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def _fields(mv: memoryview, start: int, end: int, what: str):
    """Yield ``(field, wire, value_or_start, length)`` for each field of a message."""
    pos = start
    while pos < end:
        tag_at = pos
        key, pos = _varint(mv, pos, end, f"{what} field key")
        fnum, wire = key >> 3, key & 7
        if fnum == 0:
            raise CodecError(f"{what}: field number 0 at byte {tag_at}")
        if wire == 0:
            v, pos = _varint(mv, pos, end, f"{what} field {fnum}")
            yield fnum, wire, v, 0
        elif wire == 2:
            ln, pos = _varint(mv, pos, end, f"{what} length of field {fnum}")
            if ln > end - pos:
                raise CodecError(f"{what}: field {fnum} at byte {tag_at} declares {ln} bytes, "
                                 f"only {end - pos} remain")
            yield fnum, wire, pos, ln
            pos += ln
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if end - pos < size:
                raise CodecError(f"{what}: fixed-width field {fnum} at byte {tag_at} is "
                                 "truncated")
            yield fnum, wire, pos, size
            pos += size
        else:
            raise CodecError(f"{what}: unsupported wire type {wire} at byte {tag_at}")


def decode_blobproto(buf: Any) -> np.ndarray:
    """The blob's ``data`` as a float32 array of the blob's shape (4-D for legacy blobs)."""
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    legacy: dict[int, int] = {}
    dims: list[int] | None = None
    floats: list[np.ndarray] = []
    doubles: list[np.ndarray] = []
    for fnum, wire, val, ln in _fields(mv, 0, len(mv), "BlobProto"):
        if fnum in (1, 2, 3, 4) and wire == 0:
            legacy[fnum] = _signed(val, 32)
        elif fnum in (5, 8):
            size, dt, parts = (4, "<f4", floats) if fnum == 5 else (8, "<f8", doubles)
            if wire == 2:
                if ln % size:
                    raise CodecError(f"BlobProto: packed field {fnum} holds {ln} bytes, not a "
                                     f"multiple of {size}")
                parts.append(np.frombuffer(mv[val:val + ln], dt))
            elif (wire == 5 and size == 4) or (wire == 1 and size == 8):
                parts.append(np.frombuffer(mv[val:val + ln], dt))
        elif fnum == 7 and wire == 2:
            dims = []
            for f2, w2, v2, l2 in _fields(mv, val, val + ln, "BlobShape"):
                if f2 != 1:
                    continue
                if w2 == 0:
                    dims.append(_signed(v2, 64))
                elif w2 == 2:
                    p, stop = v2, v2 + l2
                    while p < stop:
                        d, p = _varint(mv, p, stop, "BlobShape dim")
                        dims.append(_signed(d, 64))
                if len(dims) > _MAX_DIMS:
                    raise CodecError(f"BlobProto: more than {_MAX_DIMS} shape dimensions")
    if legacy:
        shape = tuple(legacy.get(f, 0) for f in (1, 2, 3, 4))
    elif dims is not None:
        shape = tuple(dims)
    else:
        shape = (0,)
    if any(d < 0 for d in shape):
        raise CodecError(f"BlobProto: negative dimension in shape {shape}")
    values = np.concatenate(doubles) if doubles else (
        np.concatenate(floats) if floats else np.empty(0, np.float32))
    count = math.prod(shape)
    if values.shape[0] != count:
        raise CodecError(f"BlobProto: {values.shape[0]} data values, shape {shape} needs "
                         f"{count}")
    return values.astype(np.float32).reshape(shape)


def encode_blobproto(array: Any, *, legacy: bool = True) -> bytes:
    """Serialize a float array as a BlobProto: with the legacy ``num/channels/height/width``
    fields (a 1-4-D array, padded on the left with 1s, as ``compute_image_mean`` writes) or,
    with ``legacy=False``, with a ``shape`` message; ``data`` packed float32."""
    a = np.ascontiguousarray(array, dtype="<f4")
    out = bytearray()
    if legacy:
        if a.ndim > 4:
            raise CodecError(f"BlobProto: legacy fields hold at most 4 dimensions, not {a.ndim}")
        shape4 = (1,) * (4 - a.ndim) + a.shape
        for fnum, d in zip((1, 2, 3, 4), shape4, strict=True):
            out.append(fnum << 3)
            put_varint(out, int(d))
    raw = a.tobytes()
    out.append((5 << 3) | 2)
    put_varint(out, len(raw))
    out += raw
    if not legacy:
        inner = bytearray()
        for d in a.shape:
            put_varint(inner, int(d))
        msg = bytearray([(1 << 3) | 2])
        put_varint(msg, len(inner))
        msg += inner
        out.append((7 << 3) | 2)
        put_varint(out, len(msg))
        out += msg
    return bytes(out)


def read_mean_file(path: str | os.PathLike) -> np.ndarray:
    """A Caffe mean file as a float32 ``(C, H, W)`` array.

    The blob must hold one image: shape ``(1, C, H, W)`` (legacy fields or ``shape``), as
    Caffe's DataTransformer requires; errors name the file.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise CodecError(f"{p}: cannot read mean file ({exc.strerror or exc})") from None
    try:
        blob = decode_blobproto(raw)
    except CodecError as exc:
        raise CodecError(f"{p}: {exc}") from None
    if blob.ndim != 4 or blob.shape[0] != 1:
        raise CodecError(f"{p}: a mean file must hold one (1, C, H, W) blob, this one has shape "
                         f"{blob.shape}")
    if blob.size == 0:
        raise CodecError(f"{p}: empty mean blob (shape {blob.shape})")
    return blob[0]


def write_mean_file(path: str | os.PathLike, mean: Any, *, legacy: bool = True) -> None:
    """Write a ``(C, H, W)`` mean image as Caffe's ``compute_image_mean`` does."""
    a = np.asarray(mean)
    if a.ndim != 3:
        raise CodecError(f"a mean image is (C, H, W), got shape {a.shape}")
    Path(path).write_bytes(encode_blobproto(a[None], legacy=legacy))
