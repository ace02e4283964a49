"""IBP parsers and decoders on hostile input: a CodecError or a correct-shaped result, never a
crash, hang or out-of-bounds read (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lmdbio.codecs import ibp
from lmdbio.convert.ibp import decode_record, encode_record
from lmdbio.errors import CodecError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
DECODERS = ("kernel", "xp", "mirror", "parallel")


def _model(chunk: int) -> tuple[ibp.IBPModel, np.ndarray]:
    from sklearn.datasets import load_breast_cancer

    x = load_breast_cancer().data[:60].astype(np.float32)
    x[::9] = np.float32(np.nan)
    return ibp.fit(x, chunk_bytes=chunk), x


MODELS = {c: _model(c) for c in (4, 8)}
FRAMES = {(c, layout, crc): MODELS[c][0].compress(MODELS[c][1], layout).to_bytes(crc)
          for c in (4, 8) for layout in ("inplace", "condensed") for crc in (False, True)}


def _decode_all(model: ibp.IBPModel, data: bytes) -> None:
    try:
        packed = ibp.IBPPacked.from_bytes(data)
    except CodecError:
        return
    for how in DECODERS:
        try:
            if how == "parallel":
                rows = model.decompress(packed, parallel=True)
            else:
                rows = model.decompress(packed, method=how)
        except CodecError:
            continue
        assert rows.shape == (packed.nrows, *model.row_shape)


@SETTINGS
@given(st.binary(max_size=600), st.sampled_from([4, 8]))
def test_random_bytes(data: bytes, chunk: int) -> None:
    _decode_all(MODELS[chunk][0], data)
    with pytest.raises(CodecError):
        ibp.IBPModel.from_bytes(data)


@SETTINGS
@given(st.sampled_from(sorted(FRAMES)), st.data())
def test_mutated_frames(key: tuple[int, str, bool], data: st.DataObject) -> None:
    chunk, _, crc = key
    frame = bytearray(FRAMES[key])
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "splice"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(frame) - 1))
            frame[i] ^= data.draw(st.integers(1, 255))
    elif kind == "truncate":
        frame = frame[: data.draw(st.integers(0, len(frame) - 1))]
    elif kind == "extend":
        frame += data.draw(st.binary(min_size=1, max_size=16))
    else:
        i = data.draw(st.integers(0, len(frame) - 1))
        chunk_bytes = data.draw(st.binary(min_size=1, max_size=32))
        frame[i:i + len(chunk_bytes)] = chunk_bytes
    changed = bytes(frame) != FRAMES[key]
    model = MODELS[chunk][0]
    if crc and changed:
        with pytest.raises(CodecError):
            model.decompress(ibp.IBPPacked.from_bytes(bytes(frame)))
    else:
        _decode_all(model, bytes(frame))
        if kind in ("truncate", "extend") and changed:
            with pytest.raises(CodecError):
                ibp.IBPPacked.from_bytes(bytes(frame))


@SETTINGS
@given(st.sampled_from([4, 8]), st.data())
def test_mutated_model_bytes(chunk: int, data: st.DataObject) -> None:
    raw = bytearray(MODELS[chunk][0].to_bytes())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CodecError):
        ibp.IBPModel.from_bytes(bytes(raw))
    with pytest.raises(CodecError):
        ibp.IBPModel.from_bytes(bytes(raw[: data.draw(st.integers(0, len(raw) - 1))]))


@SETTINGS
@given(st.data())
def test_mutated_records(data: st.DataObject) -> None:
    model, x = MODELS[4]
    labels = np.arange(len(x), dtype=np.int16)
    rec = bytearray(encode_record(model.compress(x, "condensed").to_bytes(False), labels,
                                  len(x)))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(rec) - 1))
        rec[i] ^= data.draw(st.integers(1, 255))
    try:
        rows, lab = decode_record(bytes(rec), model)
    except CodecError:
        return
    assert rows.shape == x.shape
    assert lab is None or lab.shape == (len(x),)


@pytest.mark.parametrize("dtype", [b"2i1", b"b,b"])
def test_label_dtype_that_is_not_one_number_per_row(dtype: bytes) -> None:
    """A mutated label dtype string that numpy parses as a subarray or a record (found by
    the fuzzer above, which then got numpy's ValueError) is a CodecError."""
    model, x = MODELS[4]
    rec = encode_record(model.compress(x, "condensed").to_bytes(False),
                        np.arange(len(x), dtype=np.int16), len(x))
    assert rec.count(b"<i2") == 1
    with pytest.raises(CodecError, match="label dtype"):
        decode_record(rec.replace(b"<i2", dtype), model)


row_dtypes = st.sampled_from(["<f2", "<f4", "<f8", "<i4", "<u8", ">f4", "u1", "<c8"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row_dtypes.flatmap(lambda dt: hnp.arrays(
    dt, st.tuples(st.integers(1, 20), st.integers(1, 9)),
    elements=hnp.from_dtype(np.dtype(dt), allow_nan=True, allow_infinity=True))),
    st.sampled_from([4, 8]), st.sampled_from([None, 0.75]))
def test_any_rows_roundtrip(rows: np.ndarray, chunk: int, threshold: float | None) -> None:
    model = ibp.fit(rows, chunk_bytes=chunk, threshold=threshold)
    raw = rows.view(np.uint8)
    for layout in ("inplace", "condensed"):
        packed = ibp.IBPPacked.from_bytes(model.compress(rows, layout).to_bytes())
        for how in ("kernel", "xp", "mirror"):
            got = model.decompress(packed, method=how)
            assert got.dtype == rows.dtype
            assert np.array_equal(got.view(np.uint8), raw)
