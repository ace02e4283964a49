"""The byte layout of one TOC-compressed matrix, and its parser.

All integers little-endian. ``varint`` is unsigned LEB128 (at most 10 bytes).

====================  =====================================================================
field                 meaning
====================  =====================================================================
``b"TOC"`` + u8       magic and format version (``1``)
u8 dtype              code of the input dtype (:data:`DTYPES`); values are stored in it
u8 flags              bit 0: section 1 holds per-column pair counts (else one column index
                      per pair); other bits reserved, 0
u8 x 3 widths         bit widths of: section 1 entries, value indices, row lengths
varint x 5            rows, columns, L (first-layer pairs), V (distinct values), codes
section 1             first-layer columns: L column indices, or (flag) ``columns`` counts
section 2             L value indices of the first layer, bit-packed
section 3             V distinct values, raw little-endian in the input dtype
section 4             rows row lengths (number of codes per row), bit-packed
section 5             the codes of all rows, concatenated, in LZW's growing widths
u32 crc               CRC-32 (zlib) of every byte before it
====================  =====================================================================

The first layer (the distinct ``(column, value index)`` pairs, i.e. tree nodes ``0..L-1``) is
sorted by column, then value index, so its columns are a non-decreasing run that the encoder
stores either explicitly or as the number of pairs of each column, whichever is smaller. Values
are numbered by first appearance. Bit-packed sections hold their integers LSB-first, each in
exactly ``width`` bits (0 when the largest integer is 0), padded with zero bits to a byte
boundary. Codes take ``bit_length(limit - 1)`` bits where ``limit`` is the number of tree nodes
a code can name at that point (see ``kernels.code_widths_total``): the paper packs all codes
to one byte width; growing widths are LZW's classic refinement and cost nothing here because
the codes are unpacked once per batch, in a compiled loop.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from lmdbio.errors import CodecError

MAGIC = b"TOC"
VERSION = 1
#: largest bit width of a packed integer (all packed integers are < 2**31)
MAX_WIDTH = 31
#: rows, columns and stored non-zeros of one compressed matrix must stay below this
MAX_DIM = (1 << 31) - 1
CRC_BYTES = 4
FIXED_HEADER = 9  # magic, version, dtype, flags, three widths
FLAG_COLUMN_COUNTS = 1

#: dtype code <-> numpy dtype of the values; the code is what the header stores
DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f8"),
    1: np.dtype("<f4"),
    2: np.dtype("<f2"),
    3: np.dtype("i1"),
    4: np.dtype("<i2"),
    5: np.dtype("<i4"),
    6: np.dtype("<i8"),
    7: np.dtype("u1"),
    8: np.dtype("<u2"),
    9: np.dtype("<u4"),
    10: np.dtype("<u8"),
    11: np.dtype("?"),
}
_CODE_OF = {(dt.kind, dt.itemsize): code for code, dt in DTYPES.items()}

#: unsigned view type with the same item size (for bit patterns)
UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def dtype_code(dtype: np.dtype) -> int:
    """Header code of ``dtype``; raises ``TypeError`` for dtypes TOC does not store."""
    dt = np.dtype(dtype)
    try:
        return _CODE_OF[(dt.kind, dt.itemsize)]
    except KeyError:
        raise TypeError(
            f"TOC stores float16/32/64, (u)int8..64 and bool matrices, not {dt}"
        ) from None


def bit_width(max_value: int) -> int:
    """Bits needed for ``max_value`` (0 for 0)."""
    return int(max_value).bit_length()


def packed_size(count: int, width: int) -> int:
    """Bytes of a bit-packed section of ``count`` integers of ``width`` bits."""
    return (count * width + 7) // 8


def put_varint(out: bytearray, value: int) -> None:
    value = int(value)
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def get_varint(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    """Read one varint at ``pos``; return ``(value, next position)``."""
    value = 0
    shift = 0
    for i in range(10):
        if pos + i >= len(buf):
            raise CodecError(f"TOC header truncated at byte {pos + i} while reading {what}")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise CodecError(f"TOC header: varint for {what} at byte {pos} is longer than 10 bytes")


@dataclass(frozen=True)
class Header:
    """Parsed header plus the byte ranges of the five sections."""

    dtype: np.dtype
    flags: int
    col_w: int
    vidx_w: int
    rowlen_w: int
    n_rows: int
    n_cols: int
    n_first: int
    n_values: int
    n_codes: int
    sections: tuple[tuple[int, int], ...]  # (start, stop) of sections 1..5

    @property
    def widths(self) -> tuple[int, int, int]:
        return (self.col_w, self.vidx_w, self.rowlen_w)

    @property
    def counts(self) -> tuple[int, int, int, int, int]:
        return (self.n_rows, self.n_cols, self.n_first, self.n_values, self.n_codes)


def header_bytes(dtype: np.dtype, flags: int, widths: tuple[int, int, int],
                 counts: tuple[int, int, int, int, int]) -> bytearray:
    out = bytearray(MAGIC)
    out.append(VERSION)
    out.append(dtype_code(dtype))
    out.append(flags)
    out.extend(bytes(widths))
    for c in counts:
        put_varint(out, c)
    return out


def section_sizes(dtype: np.dtype, flags: int, widths: tuple[int, int, int],
                  counts: tuple[int, int, int, int, int]) -> list[int]:
    """Sizes of sections 1-4 (the code section's size follows from the row lengths)."""
    col_w, vidx_w, rowlen_w = widths
    n_rows, n_cols, n_first, n_values, _n_codes = counts
    n_col_entries = n_cols if flags & FLAG_COLUMN_COUNTS else n_first
    return [
        packed_size(n_col_entries, col_w),
        packed_size(n_first, vidx_w),
        n_values * dtype.itemsize,
        packed_size(n_rows, rowlen_w),
    ]


def parse_header(buf: memoryview, *, verify: bool = True) -> Header:
    """Check magic, version, checksum and sizes; never trusts a count it has not bounded."""
    n = len(buf)
    _check_envelope(buf, verify)
    code = buf[4]
    if code not in DTYPES:
        raise CodecError(f"TOC header: unknown dtype code {code} at byte 4")
    flags = buf[5]
    if flags & ~FLAG_COLUMN_COUNTS:
        raise CodecError(f"TOC header: unknown flags {flags:#04x} at byte 5")
    widths = (buf[6], buf[7], buf[8])
    names = ("column", "value index", "row length")
    for name, w in zip(names, widths, strict=True):
        if w > MAX_WIDTH:
            raise CodecError(f"TOC header: {name} width {w} bits exceeds {MAX_WIDTH}")
    counts, pos = _read_counts(buf)
    dtype = DTYPES[code]
    sizes = section_sizes(dtype, flags, widths, counts)
    code_bytes = n - CRC_BYTES - pos - sum(sizes)
    _check_counts(n, counts, widths, code_bytes)
    sections = []
    start = pos
    for size in [*sizes, code_bytes]:
        sections.append((start, start + size))
        start += size
    return Header(dtype, flags, *widths, *counts, tuple(sections))


def _check_envelope(buf: memoryview, verify: bool) -> None:
    """Check what surrounds the header's fields: the smallest size, magic, version and
    (``verify``) the CRC-32 of everything before the trailing checksum."""
    n = len(buf)
    if n < FIXED_HEADER + 5 + CRC_BYTES:
        raise CodecError(f"TOC payload is {n} bytes, shorter than the smallest valid one (18)")
    if bytes(buf[:3]) != MAGIC:
        raise CodecError(f"not a TOC payload: magic is {bytes(buf[:3])!r}, expected {MAGIC!r}")
    if buf[3] != VERSION:
        raise CodecError(f"TOC format version {buf[3]} is not supported (expected {VERSION})")
    if verify:
        stored = int.from_bytes(buf[n - CRC_BYTES:], "little")
        actual = zlib.crc32(buf[: n - CRC_BYTES])
        if stored != actual:
            raise CodecError(
                f"TOC payload checksum mismatch (stored {stored:#010x}, computed {actual:#010x}):"
                f" the {n} bytes are corrupt or truncated"
            )


def _read_counts(buf: memoryview) -> tuple[tuple[int, int, int, int, int], int]:
    """The header's five varint counts (rows, columns, first-layer pairs, distinct values,
    codes), each bounded by :data:`MAX_DIM`, and the position after them."""
    pos = FIXED_HEADER
    counts = []
    for what in ("rows", "columns", "first-layer pairs", "distinct values", "codes"):
        value, pos = get_varint(buf, pos, what)
        if value > MAX_DIM:
            raise CodecError(f"TOC header: {what} = {value} exceeds the limit {MAX_DIM}")
        counts.append(value)
    n_rows, n_cols, n_first, n_values, n_codes = counts
    return (n_rows, n_cols, n_first, n_values, n_codes), pos


def _check_counts(n: int, counts: tuple[int, int, int, int, int],
                  widths: tuple[int, int, int], code_bytes: int) -> None:
    """Check the counts against the payload's ``n`` bytes (``code_bytes`` left for the code
    section) and against the structural invariants of a valid encoding: cheap, and they
    bound what decoding does next."""
    n_rows, n_cols, n_first, n_values, n_codes = counts
    if code_bytes < 0:
        raise CodecError(
            f"TOC payload is {n} bytes, too short for its header ({n_rows}x{n_cols}, "
            f"{n_first} pairs, {n_values} values, {n_codes} codes): truncated or corrupt"
        )
    if code_bytes > packed_size(n_codes, MAX_WIDTH):
        raise CodecError(
            f"TOC payload: {code_bytes} bytes of codes for {n_codes} codes is more than they "
            "can take: corrupt"
        )
    if n_values > n_first or (n_first > 0 and n_values == 0):
        raise CodecError(f"TOC header: {n_values} distinct values for {n_first} pairs")
    if (n_codes == 0) != (n_first == 0):
        raise CodecError(f"TOC header: {n_codes} codes for {n_first} first-layer pairs")
    if n_first > 0 and n_cols == 0:
        raise CodecError("TOC header: stored pairs in a matrix with 0 columns")
    if n_codes > 0 and widths[2] == 0:
        raise CodecError("TOC header: codes stored but every row length is 0 bits wide")


#: kernel status -> message
KERNEL_ERRORS = {
    1: "a bit-packed section ends early",
    2: "a first-layer column index is out of range",
    3: "a first-layer value index is out of range",
    4: "row lengths do not add up to the number of codes",
    5: "a code refers to a tree node that does not exist",
    6: "a decoded row's columns are not strictly ascending",
    7: "non-zero padding bits after a bit-packed section",
    8: "bytes left over after the codes",
    9: "per-column pair counts do not add up to the number of pairs",
}

#: section number (as the decode kernel reports it) -> name
SECTION_NAMES = {0: "prefix tree", 1: "first-layer columns", 2: "first-layer value indices",
                 4: "row lengths", 5: "codes"}
