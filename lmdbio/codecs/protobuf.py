"""The two protobuf wire-format primitives Caffe's messages need (Datum, BlobProto).

lmdbio reads and writes these messages without the protobuf package: varints and
length-delimited fields are all they use.
"""

from __future__ import annotations

from lmdbio.errors import CodecError


def put_varint(out: bytearray, value: int) -> None:
    """Append ``value`` as a varint (negative int32 values sign-extend to 10 bytes)."""
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def get_varint(mv: memoryview, pos: int, end: int, what: str, message: str) -> tuple[int, int]:
    """Read a varint at ``pos`` (before ``end``); return ``(value, next position)``.

    Errors name the ``message`` type, the field (``what``) and the byte offset.
    """
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise CodecError(f"{message}: truncated varint ({what}) at byte {pos}")
        if shift >= 70:
            raise CodecError(f"{message}: varint longer than 10 bytes ({what}) at byte {pos}")
        b = mv[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result & ((1 << 64) - 1), pos
