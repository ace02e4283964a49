"""lmdbio tensor records: exact header layout, round trips over dtypes and shapes, zero-copy
views, clear errors, the batch decoder, and fuzzing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lmdbio.codecs.record_batch import pack_values
from lmdbio.codecs.tensor import (
    DTYPE_CODES,
    MAGIC,
    TensorCodec,
    decode_tensor,
    decode_tensor_batch,
    encode_tensor,
    header_size,
    read_tensor_header,
)
from lmdbio.errors import CodecError, RecordError


def test_header_layout_is_the_documented_one():
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    rec = encode_tensor(a, -5)
    assert rec[:4] == MAGIC == b"LTNS"
    assert rec[4] == 1 and DTYPE_CODES[rec[5]] == np.dtype("<f4") and rec[6] == 2
    assert rec[7] == 1  # label flag
    assert int.from_bytes(rec[8:10], "little") == header_size(2) == 48
    assert rec[10:16] == b"\x00" * 6
    assert int.from_bytes(rec[16:24], "little", signed=True) == -5
    assert [int.from_bytes(rec[24 + 8 * i:32 + 8 * i], "little") for i in range(2)] == [2, 3]
    assert rec[40:48] == b"\x00" * 8
    assert rec[48:] == a.tobytes()
    assert [header_size(n) for n in (0, 1, 2, 3, 4, 32)] == [32, 32, 48, 48, 64, 288]
    assert encode_tensor(a)[7] == 0 and decode_tensor(encode_tensor(a))[1] is None


@pytest.mark.parametrize("dtype", [d.str for d in DTYPE_CODES.values()])
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (3, 4, 5), (1, 1, 1, 1, 2)])
def test_round_trip_every_dtype_and_shape(dtype, shape):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 50).astype(dtype)
    arr, label = decode_tensor(encode_tensor(a, 12))
    assert arr.dtype == np.dtype(dtype) and arr.shape == shape and label == 12
    np.testing.assert_array_equal(arr, a)


def test_big_endian_input_is_stored_little_endian():
    a = np.arange(5, dtype=">i4")
    rec = encode_tensor(a)
    assert rec[header_size(1):] == np.arange(5, dtype="<i4").tobytes()
    np.testing.assert_array_equal(decode_tensor(rec)[0], a)


def test_decode_is_zero_copy_and_aligned_for_aligned_records():
    a = np.arange(64, dtype=np.float64).reshape(8, 8)
    rec = encode_tensor(a, 1)
    buf = np.zeros(len(rec) + 16, np.uint8)
    start = (-buf.ctypes.data) % 16
    buf[start:start + len(rec)] = np.frombuffer(rec, np.uint8)
    view, _ = decode_tensor(buf[start:start + len(rec)])
    assert np.shares_memory(view, buf)
    assert view.ctypes.data % 16 == 0 and view.flags.aligned
    ro, _ = decode_tensor(rec)
    assert not ro.flags.writeable  # a view of immutable bytes


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda r: b"XTNS" + r[4:], "bad magic"),
    (lambda r: r[:4] + b"\x02" + r[5:], "version 2"),
    (lambda r: r[:5] + b"\x63" + r[6:], "unknown dtype code 99"),
    (lambda r: r[:6] + b"\x40" + r[7:], "ndim 64"),
    (lambda r: r[:7] + b"\x03" + r[8:], "reserved flag"),
    (lambda r: r[:8] + b"\x20\x00" + r[10:], "header size 32"),
    (lambda r: r[:12] + b"\x01" + r[13:], "reserved header bytes"),
    (lambda r: r[:-1], "truncated"),
    (lambda r: r + b"\x00", "trailing bytes"),
    (lambda r: r[:10], "shorter than the 24-byte header"),
    (lambda r: r[:40], "shorter than its 48-byte header"),
    (lambda r: r[:44] + b"\x01" + r[45:], "padding"),
])
def test_clear_errors(mutate, needle):
    rec = encode_tensor(np.zeros((2, 3), np.float32), 1)
    with pytest.raises(CodecError, match=needle):
        decode_tensor(mutate(rec))


def test_unsupported_dtype_and_rank():
    with pytest.raises(CodecError, match="not supported"):
        encode_tensor(np.array(["a"]))
    with pytest.raises(CodecError, match="at most 32"):
        encode_tensor(np.zeros((1,) * 33))
    with pytest.raises(CodecError, match="int64"):
        encode_tensor(np.zeros(1), 2**63)


def test_batch_decoder():
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(7)]
    vals = [encode_tensor(a, i * 10) for i, a in enumerate(arrays)]
    b = decode_tensor_batch(*pack_values(vals))
    np.testing.assert_array_equal(b.data, np.stack(arrays))
    assert b.labels.tolist() == [i * 10 for i in range(7)] and b.has_labels
    assert b.valid.all() and b.errors == []
    buf, off, ln = pack_values(vals)
    bounds = np.concatenate([off, [off[-1] + ln[-1]]])
    np.testing.assert_array_equal(decode_tensor_batch(buf, bounds).data, b.data)
    out = np.empty_like(b.data)
    assert decode_tensor_batch(buf, off, ln, out=out).data is out
    unlabelled = decode_tensor_batch(*pack_values([encode_tensor(a) for a in arrays]))
    assert not unlabelled.has_labels and (unlabelled.labels == 0).all()
    u8 = decode_tensor_batch(*pack_values([encode_tensor(np.full((2, 2), i, np.uint8), i)
                                           for i in range(3)]))
    assert u8.data.dtype == np.uint8 and u8.data[:, 0, 0].tolist() == [0, 1, 2]


def test_batch_errors_name_the_key_or_mask():
    a = np.ones((2, 3), np.int16)
    vals = [encode_tensor(a, 0), encode_tensor(np.ones((3, 2), np.int16), 1),
            encode_tensor(a, 2)[:-1], encode_tensor(a.astype(np.int32), 3), encode_tensor(a),
            encode_tensor(a, 5)]
    keys = [f"{i:08d}".encode() for i in range(len(vals))]
    with pytest.raises(RecordError) as info:
        decode_tensor_batch(*pack_values(vals), keys=keys)
    assert info.value.key == b"00000001" and "shape (3, 2)" in str(info.value)
    b = decode_tensor_batch(*pack_values(vals), keys=keys, errors="mask")
    assert b.valid.tolist() == [True, False, False, False, False, True]
    assert [e.key for e in b.errors] == keys[1:5]
    assert "truncated" in str(b.errors[1]) and "int32" in str(b.errors[2])
    assert "labelled=False" in str(b.errors[3])
    assert (b.data[1:5] == 0).all() and b.labels.tolist() == [0, 0, 0, 0, 0, 5]
    # the first record broken: the reference comes from the first good one
    b2 = decode_tensor_batch(*pack_values([b"junk", *vals[:1]]), errors="mask")
    assert b2.valid.tolist() == [False, True] and b2.data.shape == (2, 2, 3)
    with pytest.raises(RecordError, match="bad magic"):
        decode_tensor_batch(*pack_values([b"junk" * 10]), keys=[b"k"])
    # expected shape/dtype from the caller (e.g. the dataset metadata)
    b3 = decode_tensor_batch(*pack_values(vals), expected=((2, 3), np.int32), errors="mask")
    assert b3.valid.tolist() == [False, False, False, True, False, False]
    buf, off, ln = pack_values(vals[:1])
    with pytest.raises(RecordError, match="outside"):
        decode_tensor_batch(buf, off + 3, ln)


def test_numcodecs_style_codec():
    c = TensorCodec(label=3)
    a = np.arange(10, dtype=np.uint16).reshape(2, 5)
    enc = c.encode(a)
    assert decode_tensor(enc)[1] == 3
    np.testing.assert_array_equal(c.decode(enc), a)
    assert TensorCodec.from_config(c.get_config()).label == 3
    numcodecs = pytest.importorskip("numcodecs")
    assert type(numcodecs.get_codec({"id": "lmdbio_tensor"})) is TensorCodec


def _mutate(data: bytes, op: str, pos: int, byte: int) -> bytes:
    pos %= max(len(data), 1)
    if op == "truncate":
        return data[:pos]
    if op == "flip":
        return data[:pos] + bytes([data[pos] ^ (byte or 1)]) + data[pos + 1:]
    if op == "insert":
        return data[:pos] + bytes([byte]) + data[pos:]
    return data[:pos] + data[pos + 1:]


_records = st.builds(
    lambda shape, code, label, seed: encode_tensor(
        np.random.default_rng(seed).integers(0, 255, shape).astype(DTYPE_CODES[code]), label),
    st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple),
    st.sampled_from(sorted(DTYPE_CODES)), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    st.integers(0, 2**32 - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records, st.sampled_from(["truncate", "flip", "insert", "delete"]),
       st.integers(0, 10_000), st.integers(0, 255))
def test_fuzz_decode_is_correct_or_a_clear_error(rec, op, pos, byte):
    orig, label = decode_tensor(rec)
    bad = _mutate(rec, op, pos, byte)
    try:
        arr, lab = decode_tensor(bad)
    except CodecError:
        return
    # accepted: the record must be self-consistent (header parse agrees with its length)
    h = read_tensor_header(bad)
    assert arr.nbytes == h.nbytes == len(bad) - h.header_size
    if bad == rec:
        np.testing.assert_array_equal(arr, orig)
        assert lab == label


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["truncate", "flip", "insert", "delete", "keep"]),
                          st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, 2**32 - 1))
@example([("flip", 2023, 0)], 0)  # the label flag flipped: a record without a label
def test_fuzz_batch_decoder(ops, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((2, 3)).astype(np.float32) for _ in ops]
    vals = [encode_tensor(a, i) for i, a in enumerate(arrays)]
    vals = [v if op == "keep" else _mutate(v, op, p, b) for v, (op, p, b) in zip(vals, ops,
                                                                                 strict=True)]
    b = decode_tensor_batch(*pack_values(vals), errors="mask", expected=((2, 3), np.float32))
    for i, v in enumerate(vals):
        if b.valid[i]:
            arr, lab = decode_tensor(v)
            np.testing.assert_array_equal(b.data[i], arr)
            # a batch's labels are int64: 0 for a record without one (a mutated flag can
            # drop it), and every valid record is labelled as the batch says
            assert b.labels[i] == (0 if lab is None else lab)
            assert b.has_labels == (lab is not None)
        else:
            assert (b.data[i] == 0).all()


def test_fast_path_equals_the_general_path(monkeypatch):
    import lmdbio.codecs.tensor.batch as tmod

    rng = np.random.default_rng(9)
    for label in (None, 3):
        vals = [encode_tensor(rng.standard_normal((2, 5)), label) for _ in range(9)]
        packed = pack_values(vals)
        fast = decode_tensor_batch(*packed)
        with monkeypatch.context() as m:
            m.setattr(tmod, "_uniform_batch", lambda *a: None)
            slow = decode_tensor_batch(*packed)
        np.testing.assert_array_equal(fast.data, slow.data)
        np.testing.assert_array_equal(fast.labels, slow.labels)
        assert fast.has_labels == slow.has_labels == (label is not None)
