"""Caffe ``Datum`` records: the message and its exact protobuf encoding and decoding.

The message (``caffe.proto``)::

    message Datum {
      optional int32 channels = 1;  optional int32 height = 2;  optional int32 width = 3;
      optional bytes data = 4;      // raw pixels, C x H x W order (or an encoded image)
      optional int32 label = 5;
      repeated float float_data = 6;  // proto2 default: unpacked (tag 0x35 + 4 bytes each)
      optional bool encoded = 7 [default = false];  // data is a JPEG/PNG file
    }

No protobuf package is needed: the wire format is parsed and written here. Presence is kept
(an absent field is ``None``, as proto2's ``has_`` bits say), so :func:`encode_datum` of a
decoded record writes exactly the bytes Caffe's serializer wrote (fields in number order;
Caffe's ``convert_imageset`` writes ``label`` and ``encoded`` even when 0/false, Caffe's Python
``array_to_datum`` leaves ``encoded`` out). Unknown fields, and known fields with an
unexpected wire type, are skipped on decoding as protobuf does (and so not re-encoded).

Channel order: Caffe reads images with OpenCV, so colour pixels are stored and decoded as
BGR. Encoded datums are decoded here with Pillow and returned in BGR by default
(``channel_order="bgr"``), matching what Caffe's ``DecodeDatumToCVMatNative`` feeds its
DataTransformer; pass ``"rgb"`` to keep Pillow's order.

Batches of records are decoded by :mod:`lmdbio.codecs.datum.batch`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lmdbio.codecs.protobuf import get_varint, put_varint
from lmdbio.errors import CodecError

__all__ = [
    "ChannelOrder",
    "Datum",
    "datum_from_array",
    "datum_from_image",
    "decode_datum",
    "decode_image",
    "encode_datum",
]

ChannelOrder = Literal["bgr", "rgb"]

# -------------------------------------------------------------------------------- wire helpers


def _put_varint(out: bytearray, value: int) -> None:
    put_varint(out, value)


def _get_varint(mv: memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    return get_varint(mv, pos, end, what, "Datum")


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


# -------------------------------------------------------------------------------- one record


@dataclass(frozen=True, eq=False)
class Datum:
    """One decoded ``caffe.Datum``; ``None`` marks a field that was absent.

    ``data`` is a zero-copy view into the buffer given to :func:`decode_datum`.
    ``float_packed`` records how ``float_data`` was written (Caffe writes it unpacked).
    """

    channels: int | None = None
    height: int | None = None
    width: int | None = None
    data: memoryview | bytes | None = None
    label: int | None = None
    float_data: np.ndarray | None = None
    encoded: bool | None = None
    float_packed: bool = False

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(channels, height, width)`` as Caffe reads them (absent fields are 0)."""
        return (self.channels or 0, self.height or 0, self.width or 0)

    def to_array(self, channel_order: ChannelOrder = "bgr") -> np.ndarray:
        """The record as a ``(C, H, W)`` array: ``uint8`` pixels (decoding an encoded image),
        or ``float32`` from ``float_data`` when ``data`` is empty, as Caffe's transformer."""
        if self.encoded:
            return decode_image(self.data or b"", channel_order)
        c, h, w = self.shape
        n = c * h * w
        if self.data is not None and len(self.data) > 0:
            if len(self.data) != n:
                raise CodecError(f"Datum: data holds {len(self.data)} bytes, "
                                 f"channels*height*width = {c}*{h}*{w} = {n}")
            return np.frombuffer(self.data, np.uint8).reshape(c, h, w)
        floats = self.float_data if self.float_data is not None else np.empty(0, np.float32)
        if floats.shape[0] != n:
            raise CodecError(f"Datum: {floats.shape[0]} float_data values, "
                             f"channels*height*width = {c}*{h}*{w} = {n}")
        return floats.reshape(c, h, w)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Datum):
            return NotImplemented
        return encode_datum(self) == encode_datum(other)

    __hash__ = None  # type: ignore[assignment]


def decode_datum(buf: Any) -> Datum:
    """Parse one serialized Datum. ``data`` is a zero-copy slice of ``buf``.

    Raises :class:`~lmdbio.errors.CodecError` (naming the byte offset) on a truncated or
    malformed message.
    """
    mv = memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    end = len(mv)
    pos = 0
    vals: dict[str, Any] = {}
    float_parts: list[np.ndarray] = []
    packed = False
    while pos < end:
        tag_at = pos
        key, pos = _get_varint(mv, pos, end, "field key")
        fnum, wire = key >> 3, key & 7
        if fnum == 0:
            raise CodecError(f"Datum: field number 0 at byte {tag_at} (not a protobuf message)")
        if wire == 0:
            v, pos = _get_varint(mv, pos, end, f"field {fnum}")
            if fnum in (1, 2, 3, 5):
                vals[("channels", "height", "width", None, "label")[fnum - 1]] = _int32(v)
            elif fnum == 7:
                vals["encoded"] = v != 0
        elif wire == 2:
            pos, packed_floats = _read_length_delimited(mv, pos, end, fnum, tag_at, vals,
                                                        float_parts)
            packed = packed or packed_floats
        elif wire == 5:
            pos = _read_fixed32(mv, pos, end, fnum, tag_at, float_parts)
        elif wire == 1:
            if end - pos < 8:
                raise CodecError(f"Datum: 64-bit field {fnum} at byte {tag_at} is truncated")
            pos += 8
        else:
            raise CodecError(f"Datum: unsupported wire type {wire} at byte {tag_at}")
    if float_parts:
        floats = np.concatenate(float_parts).astype(np.float32, copy=False)
        vals["float_data"] = floats
    return Datum(**vals, float_packed=packed)


def _read_length_delimited(mv: memoryview, pos: int, end: int, fnum: int, tag_at: int,
                           vals: dict[str, Any], float_parts: list[np.ndarray]
                           ) -> tuple[int, bool]:
    """Read the length-delimited field ``fnum`` whose length varint starts at ``pos``:
    ``data`` (a zero-copy slice into ``vals``) or packed ``float_data`` (into
    ``float_parts``); other fields are skipped. Returns the position after the field and
    whether it was packed floats."""
    ln, pos = _get_varint(mv, pos, end, f"length of field {fnum}")
    if ln > end - pos:
        raise CodecError(f"Datum: field {fnum} at byte {tag_at} declares {ln} bytes, "
                         f"only {end - pos} remain")
    packed = False
    if fnum == 4:
        vals["data"] = mv[pos:pos + ln]
    elif fnum == 6:
        if ln % 4:
            raise CodecError(f"Datum: packed float_data at byte {tag_at} holds {ln} "
                             "bytes, not a multiple of 4")
        float_parts.append(np.frombuffer(mv[pos:pos + ln], "<f4"))
        packed = True
    return pos + ln, packed


def _read_fixed32(mv: memoryview, pos: int, end: int, fnum: int, tag_at: int,
                  float_parts: list[np.ndarray]) -> int:
    """Read the 32-bit field ``fnum`` (key at ``tag_at``, value at ``pos``); returns the
    position after it. Unpacked ``float_data`` is taken as the whole run of (0x35, 4 bytes)
    pairs from here in one go, not value by value."""
    if end - pos < 4:
        raise CodecError(f"Datum: 32-bit field {fnum} at byte {tag_at} is truncated")
    if fnum != 6:
        return pos + 4
    count = (end - tag_at) // 5
    run = np.frombuffer(mv[tag_at:tag_at + 5 * count], np.uint8).reshape(count, 5)
    stop = np.flatnonzero(run[:, 0] != 0x35)
    k = int(stop[0]) if stop.size else count
    if k == 0:  # a key written as a non-minimal varint: take this value alone
        float_parts.append(np.frombuffer(mv[pos:pos + 4], "<f4"))
        return pos + 4
    float_parts.append(run[:k, 1:].copy().view("<f4").reshape(-1))
    return tag_at + 5 * k


def encode_datum(datum: Datum) -> bytes:
    """Serialize ``datum`` exactly as protobuf's C++ serializer (and so Caffe) does: present
    fields only, in field-number order, float_data unpacked unless ``float_packed``."""
    out = bytearray()
    for fnum, value in ((1, datum.channels), (2, datum.height), (3, datum.width)):
        if value is not None:
            out.append(fnum << 3)
            _put_varint(out, int(value))
    if datum.data is not None:
        data = memoryview(datum.data).cast("B")
        out.append(0x22)
        _put_varint(out, len(data))
        out += data
    if datum.label is not None:
        out.append(0x28)
        _put_varint(out, int(datum.label))
    if datum.float_data is not None and len(datum.float_data):
        floats = np.ascontiguousarray(datum.float_data, dtype="<f4").reshape(-1)
        if datum.float_packed:
            out.append(0x32)
            _put_varint(out, 4 * floats.shape[0])
            out += floats.tobytes()
        else:
            rec = np.empty((floats.shape[0], 5), np.uint8)
            rec[:, 0] = 0x35
            rec[:, 1:] = floats.view(np.uint8).reshape(-1, 4)
            out += rec.tobytes()
    if datum.encoded is not None:
        out += b"\x38\x01" if datum.encoded else b"\x38\x00"
    return bytes(out)


def datum_from_array(array: np.ndarray, label: int | None = 0, *,
                     encoded_field: bool = True) -> Datum:
    """The Datum Caffe writes for a ``(C, H, W)`` array (``(H, W)`` is one channel).

    ``uint8`` arrays go to ``data``; any other dtype to ``float_data`` as float32 (the only
    float type a Datum has). ``encoded_field=True`` writes ``encoded: false`` explicitly as
    ``convert_imageset`` does; ``False`` leaves it out as Caffe's ``array_to_datum`` does.
    """
    a = np.asarray(array)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise CodecError(f"Datum: expected a (C, H, W) or (H, W) array, got shape {a.shape}")
    c, h, w = (int(x) for x in a.shape)
    enc = False if encoded_field else None
    if a.dtype == np.uint8:
        return Datum(c, h, w, np.ascontiguousarray(a).tobytes(), label, None, enc)
    floats = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    return Datum(c, h, w, None, label, floats, enc)


def datum_from_image(file_bytes: bytes, label: int | None = 0) -> Datum:
    """The Datum ``convert_imageset --encoded`` writes: the image file's bytes in ``data``,
    ``label``, ``encoded: true`` (no channels/height/width)."""
    return Datum(data=bytes(file_bytes), label=label, encoded=True)


def decode_image(data: Any, channel_order: ChannelOrder = "bgr") -> np.ndarray:
    """Decode an encoded (JPEG/PNG/...) image to a ``(C, H, W)`` uint8 array with Pillow.

    Grey images keep one channel (OpenCV's ``IMREAD_ANYCOLOR``, what Caffe uses); colour ones
    get three (alpha dropped), in BGR unless ``channel_order="rgb"``.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(bytes(data))) as im:
            mode = im.mode
            if mode in ("1", "L", "LA", "I;16", "I;16B", "I;16L", "I"):
                if mode.startswith("I"):
                    raise CodecError(f"encoded image: {mode} (16/32-bit) images are not "
                                     "supported; Caffe datums hold 8-bit pixels")
                im = im.convert("L")
            elif mode != "RGB":
                im = im.convert("RGB")
            pixels = np.asarray(im)
    except CodecError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise CodecError(f"encoded image could not be decoded: {exc}") from None
    if pixels.ndim == 2:
        return pixels[None]
    chw = pixels.transpose(2, 0, 1)
    if channel_order == "bgr":
        chw = chw[::-1]
    return np.ascontiguousarray(chw)
