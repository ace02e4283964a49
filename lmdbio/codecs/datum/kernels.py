"""Compiled (numba) hot loops of Caffe Datum records: parsing a batch and copying its pixels.

Kept apart from :mod:`lmdbio.codecs.datum.format` and :mod:`lmdbio.codecs.datum.batch` so
that importing them (and decoding single records) does not import numba; the batch decoder
imports this module on first use (as do the loader's fused kernels). Every kernel checks
every offset against the buffer it reads and reports a problem as an error code plus the
failing record's index, never reading outside its input.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lmdbio.kernels import copy_bytes, prefetch_line
from lmdbio.lmdb.kernels import bad_span_header

# Column layout of the Datum header table filled by parse_datums (one int64 row per record).
COL_CHANNELS = 0
COL_HEIGHT = 1
COL_WIDTH = 2
COL_LABEL = 3
COL_DATA_OFF = 4  # absolute offset of the `data` bytes in the buffer, -1 when absent
COL_DATA_LEN = 5
COL_FLOAT_OFF = 6  # absolute offset of the first float_data value, -1 when absent
COL_FLOAT_COUNT = 7  # total number of float_data values over all runs
COL_FLOAT_PACKED = 8  # 1 packed, 0 unpacked, -1 absent
COL_ENCODED = 9
COL_PRESENT = 10  # bit f set when field number f (1..7) was present
COL_ERROR = 11  # 0 or one of the ERR_* codes
COL_ERROR_AT = 12  # byte offset, inside the record, of the problem
NCOLS = 13

ERR_NONE = 0
ERR_BOUNDS = 1
ERR_VARINT_TRUNCATED = 2
ERR_VARINT_TOO_LONG = 3
ERR_LENGTH = 4
ERR_FIXED = 5
ERR_WIRE_TYPE = 6
ERR_FIELD_ZERO = 7
ERR_PACKED_FLOATS = 8

ERROR_TEXT = {
    ERR_BOUNDS: "record offset/length lies outside the buffer",
    ERR_VARINT_TRUNCATED: "truncated varint",
    ERR_VARINT_TOO_LONG: "varint longer than 10 bytes",
    ERR_LENGTH: "length-delimited field runs past the end of the record",
    ERR_FIXED: "fixed-width field runs past the end of the record",
    ERR_WIRE_TYPE: "unsupported protobuf wire type (groups 3/4 or 6/7)",
    ERR_FIELD_ZERO: "field number 0 (not a protobuf message)",
    ERR_PACKED_FLOATS: "packed float_data length is not a multiple of 4",
}


@njit(cache=True, nogil=True)
def _varint(buf, pos, end):
    """Read a varint at ``pos`` (< ``end``); returns (value as int64, new pos, error)."""
    result = np.int64(0)
    shift = 0
    while True:
        if pos >= end:
            return result, pos, ERR_VARINT_TRUNCATED
        if shift >= 70:
            return result, pos, ERR_VARINT_TOO_LONG
        b = np.int64(buf[pos])
        pos += 1
        if shift < 64:
            result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, pos, ERR_NONE


@njit(cache=True, nogil=True)
def _int32(v):
    low = v & 0xFFFFFFFF
    if low >= 0x80000000:
        low -= 0x100000000
    return low


@njit(cache=True, nogil=True)
def parse_datums(buf, offsets, lengths, out):
    """Parse the Datum records ``buf[offsets[i] : offsets[i] + lengths[i]]`` into ``out``
    (an ``(N, NCOLS)`` int64 table). Unknown fields and known fields with an unexpected wire
    type are skipped, as protobuf does. Returns the number of records with an error."""
    n = offsets.shape[0]
    size = buf.shape[0]
    nbad = 0
    for i in range(n):
        row = out[i]
        for c in range(NCOLS):
            row[c] = 0
        row[COL_DATA_OFF] = -1
        row[COL_FLOAT_OFF] = -1
        row[COL_FLOAT_PACKED] = -1
        start = offsets[i]
        length = lengths[i]
        if start < 0 or length < 0 or start > size or length > size - start:
            row[COL_ERROR] = ERR_BOUNDS
            nbad += 1
            continue
        end = start + length
        pos = start
        err = ERR_NONE
        while pos < end:
            tag_at = pos
            key, pos, err = _varint(buf, pos, end)
            if err:
                row[COL_ERROR_AT] = tag_at - start
                break
            field = key >> 3
            wire = key & 7
            if field == 0:
                err = ERR_FIELD_ZERO
                row[COL_ERROR_AT] = tag_at - start
                break
            if wire == 0:
                v, pos, err = _varint(buf, pos, end)
                if err:
                    row[COL_ERROR_AT] = tag_at - start
                    break
                if field == 1:
                    row[COL_CHANNELS] = _int32(v)
                elif field == 2:
                    row[COL_HEIGHT] = _int32(v)
                elif field == 3:
                    row[COL_WIDTH] = _int32(v)
                elif field == 5:
                    row[COL_LABEL] = _int32(v)
                elif field == 7:
                    row[COL_ENCODED] = 1 if v != 0 else 0
                else:
                    continue
                row[COL_PRESENT] |= np.int64(1) << field
            elif wire == 2:
                ln, pos, err = _varint(buf, pos, end)
                if err:
                    row[COL_ERROR_AT] = tag_at - start
                    break
                if ln < 0 or ln > end - pos:
                    err = ERR_LENGTH
                    row[COL_ERROR_AT] = tag_at - start
                    break
                if field == 4:
                    row[COL_DATA_OFF] = pos
                    row[COL_DATA_LEN] = ln
                    row[COL_PRESENT] |= np.int64(1) << 4
                elif field == 6:
                    if ln % 4 != 0:
                        err = ERR_PACKED_FLOATS
                        row[COL_ERROR_AT] = tag_at - start
                        break
                    if row[COL_FLOAT_OFF] < 0:
                        row[COL_FLOAT_OFF] = pos
                        row[COL_FLOAT_PACKED] = 1
                    row[COL_FLOAT_COUNT] += ln // 4
                    row[COL_PRESENT] |= np.int64(1) << 6
                pos += ln
            elif wire == 5:
                if end - pos < 4:
                    err = ERR_FIXED
                    row[COL_ERROR_AT] = tag_at - start
                    break
                if field == 6:
                    if row[COL_FLOAT_OFF] < 0:
                        row[COL_FLOAT_OFF] = pos
                        row[COL_FLOAT_PACKED] = 0
                    row[COL_FLOAT_COUNT] += 1
                    row[COL_PRESENT] |= np.int64(1) << 6
                pos += 4
            elif wire == 1:
                if end - pos < 8:
                    err = ERR_FIXED
                    row[COL_ERROR_AT] = tag_at - start
                    break
                pos += 8
            else:
                err = ERR_WIRE_TYPE
                row[COL_ERROR_AT] = tag_at - start
                break
        if err:
            row[COL_ERROR] = err
            nbad += 1
    return nbad


@njit(cache=True, nogil=True)
def copy_datum_bytes(buf, table, rows, out):
    """Copy the ``data`` bytes of records ``rows`` into consecutive ``width``-byte rows of the
    flat uint8 ``out`` (``width = out.size // rows.size``; lengths were checked against it
    before the call). One memcpy per record."""
    if rows.shape[0] == 0:
        return
    width = np.int64(out.shape[0] // rows.shape[0])
    for j in range(rows.shape[0]):
        copy_bytes(out, np.int64(j) * width, buf, table[rows[j], COL_DATA_OFF], width)


@njit(cache=True, nogil=True)
def widen_datum_bytes(buf, table, rows, out):
    """Like :func:`copy_datum_bytes` into a 2-D float32 ``out`` (uint8 values widened)."""
    width = out.shape[1]
    for j in range(rows.shape[0]):
        src = np.uint64(table[rows[j], COL_DATA_OFF])
        dst = out[j]
        for b in range(width):
            dst[b] = np.float32(buf[src + np.uint64(b)])


@njit(cache=True, nogil=True)
def copy_datum_floats(buf, offsets, lengths, rows, out):
    """Copy every float_data value of records ``rows`` (packed or not, in as many runs as
    the record has) as raw little-endian bytes into consecutive rows of the flat uint8
    ``out`` (viewed as float32 by the caller, so NaN payloads survive). Records were parsed
    without error and their counts checked against the row width."""
    if rows.shape[0] == 0:
        return
    width = np.int64(out.shape[0] // rows.shape[0])
    for j in range(rows.shape[0]):
        r = rows[j]
        start = offsets[r]
        end = start + lengths[r]
        pos = start
        k = np.int64(j) * width
        while pos < end:
            key, pos, _err = _varint(buf, pos, end)
            field = key >> 3
            wire = key & 7
            if wire == 0:
                _v, pos, _err = _varint(buf, pos, end)
            elif wire == 2:
                ln, pos, _err = _varint(buf, pos, end)
                if field == 6:
                    copy_bytes(out, k, buf, pos, ln)
                    k += ln
                pos += ln
            elif wire == 5:
                if field == 6:
                    copy_bytes(out, k, buf, pos, np.int64(4))
                    k += 4
                pos += 4
            else:
                pos += 8


#: cache lines of each record :func:`parse_uniform` asks for ahead of the parse
PREFETCH_LINES = 4


@njit(cache=True, nogil=True)
def parse_uniform(buf, starts, lengths, shape, table, header_fmt):
    """Parse the Datum records at ``buf[starts[i] : starts[i] + lengths[i]]`` into
    ``table`` (``parse_datums``) and return -1 when every one is a raw uint8 Datum of
    ``shape`` (C, H, W) without error, else the index of the first that is not: the check
    the fused kernels make on a batch before they read its pixels (every ``data`` field then
    lies inside ``buf``).

    The first lines of every record are asked for before the parse starts, so the cache
    misses of records scattered over a mapping overlap instead of following one another
    (a batch of 64 CIFAR-like records parsed and transformed: 1.7 -> 1.4 us per record,
    2-core VM).

    ``header_fmt``: the database's page format (``Database.fmt``) when the records are
    value spans of its mapping whose overflow page headers are still to be checked, else
    empty. Each header shares the first line of its value, so it is checked here, after
    the lines were asked for, not in a pass of its own that takes every cache miss one after
    another (CIFAR-like batches of 64: 0.6 us per record before the transform, 0.09 after
    it). A bad header returns 0, like a record that does not fit: the caller's exact check
    (:func:`lmdbio.io.gather.check_value_spans`) then names the page."""
    for i in range(starts.shape[0]):
        for line in range(PREFETCH_LINES):
            prefetch_line(buf, starts[i] + 64 * line)
    if header_fmt.shape[0]:
        for i in range(starts.shape[0]):
            if bad_span_header(buf, header_fmt, starts[i], lengths[i]) >= 0:
                return 0
    parse_datums(buf, starts, lengths, table)
    return first_misfit(table, shape[0] * shape[1] * shape[2], shape)


@njit(cache=True, nogil=True)
def first_misfit(table, size, shape):
    """-1 when every parsed record (``table`` from ``parse_datums``) is a raw uint8 Datum
    of ``shape`` (C, H, W) with ``size`` data bytes and no error; else the first that is
    not."""
    for i in range(table.shape[0]):
        row = table[i]
        if (row[COL_ERROR] != 0 or row[COL_ENCODED] != 0 or row[COL_DATA_LEN] != size
                or row[COL_CHANNELS] != shape[0] or row[COL_HEIGHT] != shape[1]
                or row[COL_WIDTH] != shape[2]):
            return i
    return -1


@njit(cache=True, nogil=True)
def uniform_datums(buf, table, size, shape, out, labels):
    """The common case in one pass: every parsed record is a raw uint8 Datum of ``shape``
    (C, H, W) with ``size`` data bytes and no error. Copies the pixels into the flat uint8
    ``out`` and the labels into ``labels``; returns -1, or the index of the first record that
    does not fit the case (nothing is promised about ``out`` then)."""
    bad = first_misfit(table, size, shape)
    if bad >= 0:
        return bad
    for i in range(table.shape[0]):
        copy_bytes(out, np.int64(i) * size, buf, table[i, COL_DATA_OFF], size)
        labels[i] = table[i, COL_LABEL]
    return -1
