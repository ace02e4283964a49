"""Batches of Caffe ``Datum`` records decoded by compiled kernels (:mod:`.kernels`).

:func:`decode_datum_batch` parses every record of a batch in one numba call (bounds
checked; a failing record is reported by key), then copies the pixels into one
``(N, C, H, W)`` array in a second compiled pass. Only encoded (JPEG/PNG) records are decoded
one by one (by Pillow, in C). The kernels are imported on first use, so importing this
module does not import numba.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from lmdbio.codecs.datum.format import ChannelOrder, decode_image
from lmdbio.codecs.record_batch import KeySource, as_spans, as_u8, key_of
from lmdbio.errors import CodecError, RecordError
from lmdbio.kernel_cache import kernel_module

__all__ = ["DatumBatch", "DatumHeaders", "decode_datum_batch", "parse_datum_headers"]


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
        ERROR_TEXT = kernel_module("lmdbio.codecs.datum").ERROR_TEXT

        code = int(self.error[i])
        return f"{ERROR_TEXT.get(code, f'error {code}')} (at byte {int(self.error_at[i])})"


def parse_datum_headers(buf: Any, offsets: Any, lengths: Any | None = None) -> DatumHeaders:
    """Parse the fields of every Datum ``buf[offsets[i] : offsets[i] + lengths[i]]`` in one
    compiled call (no pixel copy). ``lengths=None``: ``offsets`` are N+1 boundaries."""
    k = kernel_module("lmdbio.codecs.datum")

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
            ``offsets`` are N+1 boundaries as :func:`lmdbio.io.gather.gather` returns.
        keys: the records' keys (a sequence, or a function of the index) for error messages.
        expected_shape: ``(C, H, W)`` every record must have; by default the first valid
            record's shape.
        out: optional preallocated ``(N, C, H, W)`` uint8 or float32 output.
        channel_order: channel order of decoded encoded images (``bgr`` as Caffe).
        errors: ``"raise"`` raises :class:`~lmdbio.errors.RecordError` for the first bad
            record (by batch order); ``"mask"`` zeroes bad rows and reports them in
            ``valid``/``errors`` so a skip/substitute policy can act.
    """
    k = kernel_module("lmdbio.codecs.datum")

    u8 = as_u8(buf)
    off, ln = as_spans(offsets, lengths)
    n = off.shape[0]
    fast = _uniform_batch(k, u8, off, ln, expected_shape, out)
    if fast is not None:
        return fast
    h = parse_datum_headers(u8, off, ln)
    bad: dict[int, str] = {int(i): h.error_text(int(i)) for i in np.flatnonzero(h.error)}
    # encoded records: decode now (one Pillow call each) so their shapes join the checks
    images = _decode_encoded_images(u8, h, channel_order, bad)
    shapes = _record_shapes(h, images)
    ok = _valid_mask(n, bad)
    _mark_unfilled_shapes(h, shapes, ok, bad)
    expected = _batch_shape(shapes, ok, expected_shape)
    c, hh, ww = _usable_shape(expected, ok, bad)
    size = c * hh * ww
    has_bytes, has_floats = _pixel_sources(h, ok)
    _mark_size_mismatches(h, shapes, ok, bad, expected, size, has_bytes, has_floats)
    if bad and errors == "raise":
        i = min(bad)
        raise RecordError(key_of(keys, i), f"bad Caffe Datum: {bad[i]}")

    float_rows = np.flatnonzero(has_floats & ok)
    out = _output_array(out, (n, c, hh, ww), float_rows.size > 0, ok, bool(bad))
    _copy_pixels(k, u8, off, ln, h, out, np.flatnonzero(has_bytes & ok), float_rows)
    _place_images(out, images, ok)
    labels = h.label.copy()
    errs = [RecordError(key_of(keys, i), f"bad Caffe Datum: {bad[i]}") for i in sorted(bad)]
    return DatumBatch(out, labels, ok, errs)


def _valid_mask(n: int, bad: dict[int, str]) -> np.ndarray:
    """``(N,)`` bool: True for the records not (yet) in ``bad``."""
    ok = np.ones(n, bool)
    if bad:
        ok[list(bad)] = False
    return ok


def _pixel_sources(h: DatumHeaders, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(has_bytes, has_floats)`` masks of the valid raw records: pixels in ``data`` bytes,
    or (no data bytes) in float_data values."""
    raw = ok & ~h.encoded
    has_bytes = raw & (h.data_len > 0)
    return has_bytes, raw & ~has_bytes


def _place_images(out: np.ndarray, images: dict[int, np.ndarray], ok: np.ndarray) -> None:
    """Write the decoded encoded images into their rows of ``out``, valid records only."""
    for i, img in images.items():
        if ok[i]:
            out[i] = img


def _decode_encoded_images(u8: np.ndarray, h: DatumHeaders, channel_order: ChannelOrder,
                           bad: dict[int, str]) -> dict[int, np.ndarray]:
    """Decode the batch's encoded (JPEG/PNG) records that parsed cleanly, one Pillow call
    each, by batch index; a record that fails to decode is added to ``bad`` instead, so
    that its error is reported with the others."""
    images: dict[int, np.ndarray] = {}
    for i in np.flatnonzero(h.encoded & (h.error == 0)).tolist():
        lo = int(h.data_offset[i])
        data = u8[lo:lo + int(h.data_len[i])] if lo >= 0 else u8[:0]
        try:
            images[i] = decode_image(data, channel_order)
        except CodecError as exc:
            bad[i] = str(exc)
    return images


def _record_shapes(h: DatumHeaders, images: dict[int, np.ndarray]) -> np.ndarray:
    """``(N, 3)`` ``(channels, height, width)`` of every record: the header's, or a decoded
    image's own shape for encoded records (their headers need not give one)."""
    shapes = np.stack([h.channels, h.height, h.width], axis=1)
    for i, img in images.items():
        shapes[i] = img.shape
    return shapes


def _batch_shape(shapes: np.ndarray, ok: np.ndarray,
                 expected_shape: tuple[int, int, int] | None) -> tuple[int, ...]:
    """The ``(C, H, W)`` every record must have: ``expected_shape`` when given, else the
    first still-valid record's shape, ``(0, 0, 0)`` when none is valid."""
    if expected_shape is None:
        cand = np.flatnonzero(ok)
        return tuple(int(x) for x in shapes[cand[0]]) if cand.size else (0, 0, 0)
    return tuple(int(x) for x in expected_shape)


def _usable_shape(expected: tuple[int, ...], ok: np.ndarray,
                  bad: dict[int, str]) -> tuple[int, int, int]:
    """``expected`` when it holds pixels; otherwise every still-valid record is marked bad
    ("no pixels") and the output gets the empty shape ``(0, 0, 0)``."""
    if min(expected) <= 0:
        for i in np.flatnonzero(ok).tolist():
            bad[i] = f"no pixels: (channels, height, width) = {expected}"
        ok[:] = False
        return 0, 0, 0
    c, hh, ww = expected
    return c, hh, ww


def _mark_size_mismatches(h: DatumHeaders, shapes: np.ndarray, ok: np.ndarray,
                          bad: dict[int, str], expected: tuple[int, ...], size: int,
                          has_bytes: np.ndarray, has_floats: np.ndarray) -> None:
    """Mark the still-valid records whose shape differs from the batch's, or whose bytes or
    float values do not hold ``size`` pixels; the first failing check names the error."""
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


def _output_array(out: np.ndarray | None, shape: tuple[int, int, int, int], any_floats: bool,
                  ok: np.ndarray, any_bad: bool) -> np.ndarray:
    """The ``(N, C, H, W)`` array to decode into: float32 when any record holds float_data,
    else uint8; a caller's ``out`` is checked. Rows of bad records are zero."""
    dtype = np.float32 if any_floats else np.uint8
    if out is None:
        return np.zeros(shape, dtype) if any_bad else np.empty(shape, dtype)
    n, c, hh, ww = shape
    if (out.shape != shape or out.dtype not in (np.uint8, np.float32)
            or not out.flags.c_contiguous):
        raise CodecError(f"Datum batch: out must be C-contiguous ({n}, {c}, {hh}, {ww}) "
                         f"uint8/float32, got {out.shape} {out.dtype}")
    if out.dtype == np.uint8 and any_floats:
        raise CodecError("Datum batch: records hold float_data; out must be float32")
    if any_bad:
        out[~ok] = 0
    return out


def _copy_pixels(k: Any, u8: np.ndarray, off: np.ndarray, ln: np.ndarray, h: DatumHeaders,
                 out: np.ndarray, byte_rows: np.ndarray, float_rows: np.ndarray) -> None:
    """Copy the raw records' pixels into ``out`` in compiled passes: ``byte_rows`` from
    their ``data`` bytes (straight into ``out`` when every row is such a uint8 row, widened
    when ``out`` is float32), ``float_rows`` from their float_data."""
    n = out.shape[0]
    size = int(np.prod(out.shape[1:]))
    flat = out.reshape(n, size)
    if byte_rows.size == n and out.dtype == np.uint8:
        k.copy_datum_bytes(u8, h.table, byte_rows, out.reshape(-1))
        return
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
