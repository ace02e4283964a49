"""Caffe ``Datum`` records: exact protobuf encoding and decoding, and a compiled batch decoder.

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

Batches: :func:`decode_datum_batch` parses every record of a batch in one numba call (bounds
checked; a failing record is reported by key), then copies the pixels into one
``(N, C, H, W)`` array in a second compiled pass. Only encoded (JPEG/PNG) records are decoded
one by one (by Pillow, in C).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from lmdbio.codecs._batch import KeySource, as_spans, as_u8, key_of, pack_values
from lmdbio.codecs._numcodecs import ConfigEquality, as_input, refuse_object_out
from lmdbio.codecs.protobuf import get_varint, put_varint
from lmdbio.errors import CodecError, RecordError

__all__ = [
    "Datum",
    "DatumBatch",
    "DatumCodec",
    "DatumHeaders",
    "datum_from_array",
    "datum_from_image",
    "decode_datum",
    "decode_datum_batch",
    "decode_image",
    "encode_datum",
    "pack_values",
    "parse_datum_headers",
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
            ln, pos = _get_varint(mv, pos, end, f"length of field {fnum}")
            if ln > end - pos:
                raise CodecError(f"Datum: field {fnum} at byte {tag_at} declares {ln} bytes, "
                                 f"only {end - pos} remain")
            if fnum == 4:
                vals["data"] = mv[pos:pos + ln]
            elif fnum == 6:
                if ln % 4:
                    raise CodecError(f"Datum: packed float_data at byte {tag_at} holds {ln} "
                                     "bytes, not a multiple of 4")
                float_parts.append(np.frombuffer(mv[pos:pos + ln], "<f4"))
                packed = True
            pos += ln
        elif wire == 5:
            if end - pos < 4:
                raise CodecError(f"Datum: 32-bit field {fnum} at byte {tag_at} is truncated")
            if fnum == 6:
                # a run of unpacked floats: (0x35, 4 bytes) repeated; take it in one go
                count = (end - tag_at) // 5
                run = np.frombuffer(mv[tag_at:tag_at + 5 * count], np.uint8).reshape(count, 5)
                stop = np.flatnonzero(run[:, 0] != 0x35)
                k = int(stop[0]) if stop.size else count
                if k == 0:  # a key written as a non-minimal varint: take this value alone
                    float_parts.append(np.frombuffer(mv[pos:pos + 4], "<f4"))
                    pos += 4
                    continue
                float_parts.append(run[:k, 1:].copy().view("<f4").reshape(-1))
                pos = tag_at + 5 * k
                continue
            pos += 4
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


# -------------------------------------------------------------------------------- batches


@dataclass
class DatumHeaders:
    """Per-record fields of a parsed batch (all arrays of length N)."""

    channels: np.ndarray
    height: np.ndarray
    width: np.ndarray
    label: np.ndarray
    data_offset: np.ndarray  #: absolute offset of ``data`` in the buffer, -1 when absent
    data_len: np.ndarray
    float_offset: np.ndarray  #: absolute offset of the first float value, -1 when absent
    float_count: np.ndarray
    float_packed: np.ndarray  #: 1 packed, 0 unpacked, -1 no floats
    encoded: np.ndarray  #: bool
    present: np.ndarray  #: bit ``f`` set when field ``f`` was present
    error: np.ndarray  #: 0 or an error code (see ``error_text``)
    error_at: np.ndarray  #: byte offset of the problem inside the record
    table: np.ndarray = field(repr=False)  #: the raw (N, 13) int64 table

    def error_text(self, i: int) -> str:
        from lmdbio.codecs._record_kernels import ERROR_TEXT

        code = int(self.error[i])
        return f"{ERROR_TEXT.get(code, f'error {code}')} (at byte {int(self.error_at[i])})"


def parse_datum_headers(buf: Any, offsets: Any, lengths: Any | None = None) -> DatumHeaders:
    """Parse the fields of every Datum ``buf[offsets[i] : offsets[i] + lengths[i]]`` in one
    compiled call (no pixel copy). ``lengths=None``: ``offsets`` are N+1 boundaries."""
    from lmdbio.codecs import _record_kernels as k

    u8 = as_u8(buf)
    off, ln = as_spans(offsets, lengths)
    table = np.empty((off.shape[0], k.NCOLS), np.int64)
    k.parse_datums(u8, off, ln, table)
    t = table.T
    return DatumHeaders(
        channels=t[k.COL_CHANNELS], height=t[k.COL_HEIGHT], width=t[k.COL_WIDTH],
        label=t[k.COL_LABEL], data_offset=t[k.COL_DATA_OFF], data_len=t[k.COL_DATA_LEN],
        float_offset=t[k.COL_FLOAT_OFF], float_count=t[k.COL_FLOAT_COUNT],
        float_packed=t[k.COL_FLOAT_PACKED], encoded=t[k.COL_ENCODED].astype(bool),
        present=t[k.COL_PRESENT], error=t[k.COL_ERROR], error_at=t[k.COL_ERROR_AT],
        table=table,
    )


@dataclass
class DatumBatch:
    """A decoded batch: ``data`` ``(N, C, H, W)`` (uint8, or float32 when any record holds
    float_data), ``labels`` int64, ``valid`` (False for records that failed with
    ``errors="mask"``; their rows are zero) and the errors themselves."""

    data: np.ndarray
    labels: np.ndarray
    valid: np.ndarray
    errors: list[RecordError]


def decode_datum_batch(
    buf: Any,
    offsets: Any,
    lengths: Any | None = None,
    *,
    keys: KeySource = None,
    expected_shape: tuple[int, int, int] | None = None,
    out: np.ndarray | None = None,
    channel_order: ChannelOrder = "bgr",
    errors: Literal["raise", "mask"] = "raise",
) -> DatumBatch:
    """Decode a batch of Datum records into one ``(N, C, H, W)`` array.

    Args:
        buf: the bytes holding the records (a mapping of the LMDB file, a gathered batch...).
        offsets, lengths: where each record lies in ``buf``; with ``lengths=None``,
            ``offsets`` are N+1 boundaries as :meth:`lmdbio.lmdb.Database.gather` returns.
        keys: the records' keys (a sequence, or a function of the index) for error messages.
        expected_shape: ``(C, H, W)`` every record must have; by default the first valid
            record's shape.
        out: optional preallocated ``(N, C, H, W)`` uint8 or float32 output.
        channel_order: channel order of decoded encoded images (``bgr`` as Caffe).
        errors: ``"raise"`` raises :class:`~lmdbio.errors.RecordError` for the first bad
            record (by batch order); ``"mask"`` zeroes bad rows and reports them in
            ``valid``/``errors`` so a skip/substitute policy can act.
    """
    from lmdbio.codecs import _record_kernels as k

    u8 = as_u8(buf)
    off, ln = as_spans(offsets, lengths)
    n = off.shape[0]
    fast = _uniform_batch(k, u8, off, ln, expected_shape, out)
    if fast is not None:
        return fast
    h = parse_datum_headers(u8, off, ln)
    bad: dict[int, str] = {int(i): h.error_text(int(i)) for i in np.flatnonzero(h.error)}

    # encoded records: decode now (one Pillow call each) so their shapes join the checks
    images: dict[int, np.ndarray] = {}
    for i in np.flatnonzero(h.encoded & (h.error == 0)).tolist():
        lo = int(h.data_offset[i])
        data = u8[lo:lo + int(h.data_len[i])] if lo >= 0 else u8[:0]
        try:
            images[i] = decode_image(data, channel_order)
        except CodecError as exc:
            bad[i] = str(exc)

    shapes = np.stack([h.channels, h.height, h.width], axis=1)
    for i, img in images.items():
        shapes[i] = img.shape
    ok = np.ones(n, bool)
    if bad:
        ok[list(bad)] = False
    _mark_unfilled_shapes(h, shapes, ok, bad)
    if expected_shape is None:
        cand = np.flatnonzero(ok)
        expected = tuple(int(x) for x in shapes[cand[0]]) if cand.size else (0, 0, 0)
    else:
        expected = tuple(int(x) for x in expected_shape)
    c, hh, ww = expected
    size = c * hh * ww
    if min(expected) <= 0:
        for i in np.flatnonzero(ok).tolist():
            bad[i] = f"no pixels: (channels, height, width) = {expected}"
        ok[:] = False
        c = hh = ww = size = 0
    raw = ok & ~h.encoded
    has_bytes = raw & (h.data_len > 0)
    has_floats = raw & ~has_bytes
    checks = (
        (ok & np.any(shapes != np.asarray(expected), axis=1),
         lambda i: f"shape {tuple(int(x) for x in shapes[i])} differs from the batch's "
                   f"{expected}"),
        (has_bytes & (h.data_len != size),
         lambda i: f"data holds {int(h.data_len[i])} bytes, channels*height*width = {size}"),
        (has_floats & (h.float_count != size),
         lambda i: f"{int(h.float_count[i])} float_data values (and no data bytes), "
                   f"channels*height*width = {size}"),
    )
    for mask, text in checks:
        for i in np.flatnonzero(mask & ok).tolist():
            bad[i] = text(i)
            ok[i] = False
    if bad and errors == "raise":
        i = min(bad)
        raise RecordError(key_of(keys, i), f"bad Caffe Datum: {bad[i]}")

    float_rows = np.flatnonzero(has_floats & ok)
    dtype = np.float32 if float_rows.size else np.uint8
    if out is None:
        out = np.zeros((n, c, hh, ww), dtype) if bad else np.empty((n, c, hh, ww), dtype)
    else:
        if (out.shape != (n, c, hh, ww) or out.dtype not in (np.uint8, np.float32)
                or not out.flags.c_contiguous):
            raise CodecError(f"Datum batch: out must be C-contiguous ({n}, {c}, {hh}, {ww}) "
                             f"uint8/float32, got {out.shape} {out.dtype}")
        if out.dtype == np.uint8 and float_rows.size:
            raise CodecError("Datum batch: records hold float_data; out must be float32")
        if bad:
            out[~ok] = 0
    flat = out.reshape(n, size)
    byte_rows = np.flatnonzero(has_bytes & ok)
    if byte_rows.size == n and out.dtype == np.uint8:
        k.copy_datum_bytes(u8, h.table, byte_rows, out.reshape(-1))
    else:
        if byte_rows.size and out.dtype == np.uint8:
            tmp = np.empty(byte_rows.size * size, np.uint8)
            k.copy_datum_bytes(u8, h.table, byte_rows, tmp)
            flat[byte_rows] = tmp.reshape(byte_rows.size, size)
        elif byte_rows.size:
            tmp32 = np.empty((byte_rows.size, size), np.float32)
            k.widen_datum_bytes(u8, h.table, byte_rows, tmp32)
            flat[byte_rows] = tmp32
        if float_rows.size:
            raw = np.empty(float_rows.size * size * 4, np.uint8)
            k.copy_datum_floats(u8, off, ln, float_rows, raw)
            flat[float_rows] = raw.view("<f4").reshape(float_rows.size, size)
        for i, img in images.items():
            if ok[i]:
                out[i] = img
    labels = h.label.copy()
    errs = [RecordError(key_of(keys, i), f"bad Caffe Datum: {bad[i]}") for i in sorted(bad)]
    return DatumBatch(out, labels, ok, errs)


def _mark_unfilled_shapes(h: DatumHeaders, shapes: np.ndarray, ok: np.ndarray,
                          bad: dict[int, str]) -> None:
    """Mark raw records whose pixels do not fill their own (positive) shape, so that the
    batch's shape is never taken from such a record: a corrupt header can claim a shape
    of terabytes, which must be reported, not allocated."""
    raw = ok & ~h.encoded
    positive = (shapes > 0).all(axis=1)
    claimed = np.prod(shapes.astype(np.float64), axis=1)  # exact below 2**53
    has_bytes = raw & (h.data_len > 0)
    unfilled = positive & np.where(has_bytes, h.data_len != claimed,
                                   raw & (h.float_count != claimed))
    for i in np.flatnonzero(unfilled).tolist():
        what = (f"data holds {int(h.data_len[i])} bytes" if has_bytes[i] else
                f"{int(h.float_count[i])} float_data values (and no data bytes)")
        bad[i] = (f"{what}, channels*height*width = {int(claimed[i])} for its shape "
                  f"{tuple(int(x) for x in shapes[i])}")
        ok[i] = False


def _uniform_batch(k: Any, u8: np.ndarray, off: np.ndarray, ln: np.ndarray,
                   expected_shape: tuple[int, int, int] | None,
                   out: np.ndarray | None) -> DatumBatch | None:
    """Two compiled calls for the usual batch (raw uint8 Datums of one shape, all valid);
    None sends anything else to the general path, which explains what is wrong."""
    n = off.shape[0]
    if n == 0:
        return None
    table = np.empty((n, k.NCOLS), np.int64)
    k.parse_datums(u8, off, ln, table)
    shape = np.array(expected_shape if expected_shape is not None else
                     table[0, k.COL_CHANNELS:k.COL_WIDTH + 1], np.int64)
    if (shape <= 0).any():
        return None
    c, h, w = (int(x) for x in shape)
    if table[0, k.COL_DATA_LEN] != c * h * w:
        # a first record whose pixels do not fill its claimed shape (a corrupt header can
        # claim terabytes): nothing is allocated from the claim, the general path explains
        return None
    if out is None:
        out = np.empty((n, c, h, w), np.uint8)
    elif out.shape != (n, c, h, w) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        return None
    labels = np.empty(n, np.int64)
    if k.uniform_datums(u8, table, c * h * w, shape, out.reshape(-1), labels) >= 0:
        return None
    return DatumBatch(out, labels, np.ones(n, bool), [])


# -------------------------------------------------------------------------------- codec


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


def _register() -> None:
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # numcodecs is optional
        return
    register_codec(DatumCodec)  # type: ignore[arg-type]


_register()
