"""Caffe BlobProto mean files: the wire format by hand, both shape encodings, packed and
unpacked values, clear errors, fuzzing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdbio.codecs.binaryproto import (
    decode_blobproto,
    encode_blobproto,
    read_mean_file,
    write_mean_file,
)
from lmdbio.errors import CodecError


def test_legacy_encoding_by_hand():
    mean = np.array([[[1.5, -2.0]]], np.float32)  # (C=1, H=1, W=2)
    raw = encode_blobproto(mean[None])
    # num=1 channels=1 height=1 width=2, then data (field 5, packed)
    assert raw == (b"\x08\x01\x10\x01\x18\x01\x20\x02\x2a\x08"
                   + np.array([1.5, -2.0], "<f4").tobytes())
    np.testing.assert_array_equal(decode_blobproto(raw), mean[None])


def test_shape_message_and_unpacked_and_double_values():
    a = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    raw = encode_blobproto(a, legacy=False)
    # data first (field 5), then shape (field 7) holding packed dims (field 1)
    assert raw.endswith(b"\x3a\x06\x0a\x04\x01\x01\x02\x03")
    np.testing.assert_array_equal(decode_blobproto(raw), a)
    # data written unpacked (tag 0x2d + 4 bytes each) is accepted, as protobuf parsers do
    unpacked = b"\x08\x01\x10\x01\x18\x01\x20\x02" + b"".join(
        b"\x2d" + np.float32(v).tobytes() for v in (3.0, 4.0))
    np.testing.assert_array_equal(decode_blobproto(unpacked).ravel(), [3.0, 4.0])
    # double_data (field 8) wins over data, converted to float32
    dbl = (b"\x08\x01\x10\x01\x18\x01\x20\x01\x2a\x04" + np.float32(1).tobytes()
           + b"\x42\x08" + np.float64(0.25).tobytes())
    assert decode_blobproto(dbl).ravel().tolist() == [0.25]
    # dims written unpacked (varints with wire type 0)
    unpacked_dims = (b"\x2a\x08" + np.array([1, 2], "<f4").tobytes()
                     + b"\x3a\x04\x08\x01\x08\x02")
    assert decode_blobproto(unpacked_dims).shape == (1, 2)


def test_mean_file_round_trip(tmp_path):
    mean = np.random.default_rng(0).random((3, 5, 4)).astype(np.float32)
    for legacy in (True, False):
        p = tmp_path / f"mean{legacy}.binaryproto"
        write_mean_file(p, mean, legacy=legacy)
        np.testing.assert_array_equal(read_mean_file(p), mean)


@pytest.mark.parametrize(("raw", "needle"), [
    (b"\x08\x01\x10\x01\x18\x01\x20\x02\x2a\x04" + b"\x00" * 4, "1 data values, shape"),
    (b"\x08\x01\x10\x01\x18\x01\x20\x02\x2a\x09", "declares 9 bytes"),
    (b"\x2a\x03abc", "not a multiple of 4"),
    (b"\x08", "truncated varint"),
    (b"\x0b", "unsupported wire type 3"),
    (b"\x08\xff\xff\xff\xff\x0f", "negative dimension"),
    (b"\x00", "field number 0"),
])
def test_errors(raw, needle):
    with pytest.raises(CodecError, match=needle):
        decode_blobproto(raw)


def test_mean_file_errors_name_the_file(tmp_path):
    p = tmp_path / "two.binaryproto"
    p.write_bytes(encode_blobproto(np.zeros((2, 3, 4, 4), np.float32)))
    with pytest.raises(CodecError, match=r"two\.binaryproto: a mean file must hold one"):
        read_mean_file(p)
    bad = tmp_path / "bad.binaryproto"
    bad.write_bytes(b"\x08\x01\x10")
    with pytest.raises(CodecError, match=r"bad\.binaryproto: BlobProto: truncated"):
        read_mean_file(bad)
    with pytest.raises(CodecError, match=r"missing\.binaryproto: cannot read"):
        read_mean_file(tmp_path / "missing.binaryproto")


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.booleans(),
       st.sampled_from(["truncate", "flip", "insert"]), st.integers(0, 10_000),
       st.integers(0, 255))
def test_fuzz(c, h, w, legacy, op, pos, byte):
    a = np.arange(c * h * w, dtype=np.float32).reshape(1, c, h, w)
    raw = encode_blobproto(a, legacy=legacy)
    pos %= len(raw)
    if op == "truncate":
        bad = raw[:pos]
    elif op == "flip":
        bad = raw[:pos] + bytes([raw[pos] ^ (byte or 1)]) + raw[pos + 1:]
    else:
        bad = raw[:pos] + bytes([byte]) + raw[pos:]
    try:
        out = decode_blobproto(bad)
    except CodecError:
        return
    assert out.dtype == np.float32
    assert out.size == int(np.prod(out.shape))
