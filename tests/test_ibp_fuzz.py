"""IBP parsers and decoders on hostile input: a CodecError or a correct-shaped result, never a
crash, hang or out-of-bounds read (hypothesis)."""

from __future__ import annotations

import functools
import random
import struct
import zlib

import numpy as np
import pytest
import structfuzz
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lmdbio.codecs import ibp
from lmdbio.codecs.ibp import packed as packed_mod
from lmdbio.codecs.ibp.format import decode_record, encode_record
from lmdbio.errors import CodecError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
DECODERS = ("kernel", "xp", "mirror", "parallel")


@functools.cache
def model_and_rows(chunk: int) -> tuple[ibp.IBPModel, np.ndarray]:
    """The model fitted with ``chunk``-byte chunks and the rows it was fitted on. Built at
    first use, once per process, not at import: every pytest-xdist worker imports every
    test file, and only the one that runs this file needs them."""
    from sklearn.datasets import load_breast_cancer

    x = load_breast_cancer().data[:60].astype(np.float32)
    x[::9] = np.float32(np.nan)
    return ibp.fit(x, chunk_bytes=chunk), x


#: (chunk, layout, crc) of each valid frame the mutation test starts from
FRAME_KEYS = tuple(sorted((c, layout, crc) for c in (4, 8)
                          for layout in ("inplace", "condensed") for crc in (False, True)))


@functools.cache
def valid_frame(key: tuple[int, str, bool]) -> bytes:
    """The frame of all of :func:`model_and_rows`' rows for ``key`` (built at first use)."""
    chunk, layout, crc = key
    model, x = model_and_rows(chunk)
    return model.compress(x, layout).to_bytes(crc)


def _decode_all(model: ibp.IBPModel, data: bytes) -> None:
    """Every CPU decoder on ``data``: the codec's error or rows of the declared shape."""
    try:
        packed = ibp.IBPPacked.from_bytes(data)
    except CodecError:
        return
    _decode_every_way(model, packed)


#: seeds of cases that once found a bug (none yet: the codec held); always run
IBP_REGRESSION_SEEDS: tuple[int, ...] = ()
_HEAD_FIELDS = ("layout", "chunk", "flags", "nrows", "nchunks", "nclusters", "lbytes", "res0",
                "data_nbytes", "nbytes", "res1")
_HEAD_SIZES = (1, 1, 1, 8, 4, 2, 1, 1, 8, 8, 4)
#: the frame header is all sizes that must agree with each other (most changed values are
#: refused before decoding, by design), so sections are mutated more often than fields
_IBP_KINDS = {**structfuzz.KINDS, "field": 3, "two_fields": 1, "section_flip": 8,
              "section_set": 4, "section_truncate": 1, "section_extend": 1}


def _frame_parts(frame: bytes) -> structfuzz.Parsed:
    """An IBP frame as its header integers and sections (bitmask or lengths, cluster ids,
    padding, data); ``build`` packs the header again and recomputes the CRC when the
    (possibly mutated) flags ask for one."""
    (_magic, _version, layout, chunk, flags, nrows, nchunks, nclusters, lbytes, res0, model_id,
     data_nbytes, nbytes, _crc, res1) = packed_mod.HEAD.unpack_from(frame)
    values = (layout, chunk, flags, nrows, nchunks, nclusters, lbytes, res0, data_nbytes,
              nbytes, res1)
    fields = dict(zip(_HEAD_FIELDS, values, strict=True))
    limits = {k: structfuzz.int_limits(n) for k, n in zip(_HEAD_FIELDS, _HEAD_SIZES,
                                                           strict=True)}
    first, cids, _pad, data_off = packed_mod.section_layout(
        packed_mod.LAYOUTS[layout], nrows, nchunks, nclusters)
    h = packed_mod.HEAD.size
    sections = {"meta": frame[h:h + first], "cids": frame[h + first:h + first + cids],
                "pad": frame[h + first + cids:data_off], "data": frame[data_off:]}

    def build(f: dict[str, int], sec: dict[str, bytes]) -> bytes:
        head = bytearray(packed_mod.HEAD.pack(
            packed_mod.FRAME_MAGIC, packed_mod.FRAME_VERSION, f["layout"], f["chunk"],
            f["flags"], f["nrows"], f["nchunks"], f["nclusters"], f["lbytes"], f["res0"],
            model_id, f["data_nbytes"], f["nbytes"], 0, f["res1"]))
        body = b"".join(sec.values())
        if f["flags"] & packed_mod.FLAG_CRC:
            struct.pack_into("<I", head, 48, zlib.crc32(body, zlib.crc32(bytes(head))))
        return bytes(head) + body

    return structfuzz.Parsed(fields, limits, sections, build)


def _decode_every_way(model: ibp.IBPModel, packed: ibp.IBPPacked) -> list[np.ndarray]:
    """Rows from every CPU decoder that accepts ``packed`` (each may raise CodecError)."""
    got = []
    for how in DECODERS:
        try:
            if how == "parallel":
                rows = model.decompress(packed, parallel=True)
            else:
                rows = model.decompress(packed, method=how)
        except CodecError:
            continue
        assert rows.shape == (packed.nrows, *model.row_shape), how
        assert rows.dtype == model.dtype, how
        got.append(rows)
    return got


@pytest.mark.slow  # a fuzzer (pyproject's markers): make test runs it, make unit does not
@pytest.mark.parametrize("seed", structfuzz.fuzz_seeds(IBP_REGRESSION_SEEDS))
def test_structured_fuzz_reaches_the_kernels(seed: int) -> None:
    """Valid frames of random row subsets, one header field or section mutated (CRC
    recomputed): a CodecError or rows of the declared shape from every decoder -- the same
    rows from each, and the original rows when nothing changed. Most cases get past
    ``IBPPacked.from_bytes`` into the decode kernels."""
    rng = random.Random(seed)
    tally = structfuzz.Tally("ibp", seed)
    for case in range(150):
        chunk = rng.choice([4, 8])
        model, x = model_and_rows(chunk)
        rows = x[sorted(rng.sample(range(len(x)), rng.randint(1, 12)))]
        layout = rng.choice(packed_mod.LAYOUTS)
        frame = model.compress(rows, layout).to_bytes(rng.random() < 0.5)
        mut = structfuzz.mutate(_frame_parts(frame), rng, _IBP_KINDS)

        def one(model: ibp.IBPModel = model, rows: np.ndarray = rows,
                mut: structfuzz.Mutation = mut) -> str:
            with structfuzz.stage("header"):
                packed = ibp.IBPPacked.from_bytes(structfuzz.guarded(mut.data), validate=False)
            got = _decode_every_way(model, packed)
            if not got:
                raise CodecError("every decoder refused the frame")
            for other in got[1:]:
                assert np.array_equal(other.view(np.uint8), got[0].view(np.uint8))
            if mut.benign:
                assert len(got) == len(DECODERS)
                assert np.array_equal(got[0].view(np.uint8), rows.view(np.uint8))
            return "ok"

        tally.add(structfuzz.run_case("ibp", seed, case, mut.what, one, (CodecError,)))
    tally.require(("ok", "error:decode"), 0.45)


@pytest.mark.slow  # a fuzzer
@SETTINGS
@given(st.sampled_from(FRAME_KEYS), st.data())
def test_mutated_frames(key: tuple[int, str, bool], data: st.DataObject) -> None:
    chunk, _, crc = key
    frame = bytearray(valid_frame(key))
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
    changed = bytes(frame) != valid_frame(key)
    model = model_and_rows(chunk)[0]
    if crc and changed:
        with pytest.raises(CodecError):
            model.decompress(ibp.IBPPacked.from_bytes(bytes(frame)))
    else:
        _decode_all(model, bytes(frame))
        if kind in ("truncate", "extend") and changed:
            with pytest.raises(CodecError):
                ibp.IBPPacked.from_bytes(bytes(frame))


@pytest.mark.slow  # a fuzzer
@SETTINGS
@given(st.sampled_from([4, 8]), st.data())
def test_mutated_model_bytes(chunk: int, data: st.DataObject) -> None:
    raw = bytearray(model_and_rows(chunk)[0].to_bytes())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CodecError):
        ibp.IBPModel.from_bytes(bytes(raw))
    with pytest.raises(CodecError):
        ibp.IBPModel.from_bytes(bytes(raw[: data.draw(st.integers(0, len(raw) - 1))]))


@pytest.mark.slow  # a fuzzer
@SETTINGS
@given(st.data())
def test_mutated_records(data: st.DataObject) -> None:
    model, x = model_and_rows(4)
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
    model, x = model_and_rows(4)
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
