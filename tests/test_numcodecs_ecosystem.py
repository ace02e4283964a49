"""lmdbio's codecs as numcodecs and zarr see them.

Every codec lmdbio registers with numcodecs is run through numcodecs' own test helpers
(``numcodecs.tests.common``): encode/decode from arrays and raw buffers, decoding into
``out`` buffers, config round trips through JSON and :func:`numcodecs.get_codec`, and
object buffers refused with ``TypeError``. The record codecs (Datum, PCR, sparse rows)
take only their own record types, so their round trips use those; the buffer-agnostic ones
(TOC, IBP, tensor, progressive tensor) take numcodecs' arrays. IBP is built from its config
alone (``{"id": "ibp"}``: each chunk fitted, its model in the frame) or with a model that
travels in the config. A zarr v3 array stores and reads chunks through TOC and IBP.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")
common = pytest.importorskip("numcodecs.tests.common")

import lmdbio.codecs.btable  # noqa: E402  (each import registers its codecs)
import lmdbio.codecs.datum  # noqa: E402
import lmdbio.codecs.pcr  # noqa: E402
import lmdbio.codecs.tensor  # noqa: E402,F401
from lmdbio.codecs import ibp  # noqa: E402
from lmdbio.codecs.btable import SparseRowCodec  # noqa: E402
from lmdbio.codecs.datum import DatumCodec  # noqa: E402
from lmdbio.codecs.ibp import IBPCodec  # noqa: E402
from lmdbio.codecs.pcr import PCRCodec, ProgressiveTensorCodec  # noqa: E402
from lmdbio.codecs.tensor import TensorCodec  # noqa: E402
from lmdbio.codecs.toc.codec import TocCodec  # noqa: E402
from lmdbio.errors import CodecError  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "numcodecs"

#: the arrays numcodecs' own codec tests use, in kind: several dtypes, orders and shapes
ARRAYS = [
    np.arange(1000, dtype="i4"),
    np.linspace(1000, 1001, 1000, dtype="f8"),
    np.random.default_rng(42).normal(loc=1000, scale=1, size=(100, 10)),
    np.random.default_rng(42).integers(0, 2, size=1000, dtype=bool).reshape(100, 10,
                                                                             order="F"),
    np.random.default_rng(42).integers(0, 200, size=1000, dtype="u2").reshape(100, 10),
    np.arange(1000, dtype="f4").reshape(10, 10, 10),
    np.arange(100, dtype="u1"),
    np.asfortranarray(np.arange(2000, dtype="i8").reshape(20, 100)),
    np.arange(60).astype("M8[ns]"),
    np.arange(12, dtype="c16").reshape(3, 4),
    np.zeros((0, 5), "f4"),
]

#: every codec lmdbio registers, as numcodecs builds it from a config
CONFIGS = [
    {"id": "lmdbio_toc"},
    {"id": "lmdbio_toc", "verify": False},
    {"id": "ibp"},
    {"id": "ibp", "layout": "inplace", "chunk_bytes": 8, "search": "global"},
    {"id": "lmdbio_tensor"},
    {"id": "lmdbio_tensor", "label": 7},
    {"id": "lmdbio.progressive_tensor"},
    {"id": "caffe_datum", "label": 3},
    {"id": "lmdbio.pcr", "quality": 80},
    {"id": "lmdbio.sparse_row", "n_cols": 10},
]
#: the codecs that take any buffer (numcodecs' arrays), and their round trips' arrays
BUFFER_CODECS = ["lmdbio_toc", "ibp", "lmdbio_tensor", "lmdbio.progressive_tensor"]


def _ids(configs: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(c, sort_keys=True) for c in configs]


def _fitted_ibp() -> IBPCodec:
    rows = np.random.default_rng(0).normal(size=(300, 7)).astype("f4")
    return IBPCodec(ibp.fit(rows, chunk_bytes=4), layout="condensed")


@pytest.mark.parametrize("config", CONFIGS, ids=_ids(CONFIGS))
def test_every_codec_is_built_from_its_config(config: dict[str, Any]) -> None:
    codec = numcodecs.get_codec(config)
    common.check_config(codec)
    assert codec == numcodecs.get_codec(json.loads(json.dumps(codec.get_config())))
    assert hash(codec) == hash(numcodecs.get_codec(codec.get_config()))
    # numcodecs' check_repr evaluates in its own namespace; the same check in ours
    names = {c.__name__: c for c in (TocCodec, IBPCodec, TensorCodec, DatumCodec,
                                     PCRCodec, ProgressiveTensorCodec, SparseRowCodec)}
    assert eval(repr(codec), names) == codec


@pytest.mark.parametrize("config", CONFIGS, ids=_ids(CONFIGS))
def test_every_codec_refuses_object_buffers(config: dict[str, Any]) -> None:
    codec = numcodecs.get_codec(config)
    common.check_err_encode_object_buffer(codec)
    samples = {
        "caffe_datum": np.arange(12, dtype="u1").reshape(1, 3, 4),
        "lmdbio.pcr": np.zeros((2, 8, 8), "u1"),
    }
    if config["id"] in samples:  # record codecs: a record of their own kind
        enc = codec.encode(samples[config["id"]])
        with pytest.raises(TypeError):
            codec.decode(enc, out=np.empty(samples[config["id"]].size, dtype=object))
    else:
        common.check_err_decode_object_buffer(codec)


@pytest.mark.parametrize("config", [c for c in CONFIGS if c["id"] in BUFFER_CODECS],
                         ids=_ids([c for c in CONFIGS if c["id"] in BUFFER_CODECS]))
@pytest.mark.parametrize("arr", ARRAYS, ids=[f"{a.dtype}{a.shape}" for a in ARRAYS])
def test_buffer_codecs_pass_numcodecs_round_trips(config: dict[str, Any],
                                                  arr: np.ndarray) -> None:
    codec = numcodecs.get_codec(config)
    if config["id"] in ("lmdbio_tensor", "lmdbio.progressive_tensor") and (
            arr.dtype.kind in "Mc" or ("progressive" in config["id"] and (
                arr.dtype.kind == "b" or arr.size == 0))):
        pytest.skip(f"{config['id']} records hold plain numbers, not {arr.dtype}")
    if config["id"] in ("lmdbio_tensor", "lmdbio.progressive_tensor") and \
            arr.ndim > 1 and not arr.flags.c_contiguous:
        # records of a logical array and its shape, decoded C-ordered (zarr's chunks are):
        # numcodecs' array check compares memory orders
        common.check_encode_decode(arr, codec)
        return
    common.check_encode_decode(arr, codec)
    if arr.dtype.kind in "fiu":
        common.check_encode_decode_array(arr, codec)


@pytest.mark.parametrize("arr", [a for a in ARRAYS if a.dtype == np.float32 or a.ndim == 2],
                         ids=lambda a: f"{a.dtype}{a.shape}")
def test_ibp_with_a_fitted_model_passes_numcodecs_round_trips(arr: np.ndarray) -> None:
    """A model in the config: rows of any other buffer are its rows (or a whole number
    of them); the config, model included, goes through JSON."""
    rows = np.ascontiguousarray(arr)
    codec = IBPCodec(ibp.fit(rows.reshape(len(rows), -1) if rows.shape[0] else
                             np.zeros((1, 5), rows.dtype)))
    common.check_encode_decode(rows.reshape(len(rows), -1) if rows.size else
                               np.zeros((0, 5), rows.dtype), codec)
    common.check_config(codec)
    common.check_config(_fitted_ibp())


def test_ibp_from_its_config_alone_stores_the_model_in_each_frame() -> None:
    """``get_codec({"id": "ibp"})`` (what a zarr array's metadata holds): each chunk is
    fitted, its model goes in its frame, and any IBP codec decodes it (one with another
    model, or none); a plain frame needs the codec's model, and says so."""
    rows = np.random.default_rng(1).integers(0, 50, size=(500, 9)).astype("<u4")
    bare = numcodecs.get_codec({"id": "ibp"})
    assert isinstance(bare, IBPCodec) and bare.model is None
    frame = bare.encode(rows)
    assert frame[:4] == b"IBPS" and len(frame) < rows.nbytes  # fitted: it compresses
    for other in (bare, _fitted_ibp(), IBPCodec(layout="inplace")):
        assert np.array_equal(other.decode(frame), rows)
    fitted = _fitted_ibp()
    plain = fitted.encode(np.zeros((4, 7), "f4"))
    with pytest.raises(CodecError, match="carries no model"):
        bare.decode(plain)
    assert np.array_equal(fitted.decode(plain), np.zeros((4, 7), "f4"))


def test_toc_refuses_an_object_array_with_type_error() -> None:
    with pytest.raises(TypeError, match="object array"):
        TocCodec().encode(np.array(["foo", "bar", "baz"], dtype=object))
    with pytest.raises(TypeError):
        TocCodec().encode(np.array([[1, None]], dtype=object))


def test_record_codecs_round_trip_their_records() -> None:
    """The record codecs' own domain, through numcodecs: Datum (C, H, W) pixels, a PCR
    value of same-sized images (lossy JPEG: close), a sparse row."""
    img = np.random.default_rng(3).integers(0, 255, size=(3, 6, 5), dtype=np.uint8)
    datum = numcodecs.get_codec({"id": "caffe_datum", "label": 4})
    assert np.array_equal(datum.decode(datum.encode(img)), img)
    out = np.empty(img.shape, "f4")
    datum.decode(datum.encode(img), out=out)
    assert np.array_equal(out, img)
    flat = np.full((2, 16, 16), 128, np.uint8)
    pcr = numcodecs.get_codec({"id": "lmdbio.pcr"})
    assert np.abs(pcr.decode(pcr.encode(flat)).astype(int) - 128).max() <= 2
    row = np.zeros(10)
    row[[1, 7]] = (2.5, -1.0)
    sparse = numcodecs.get_codec({"id": "lmdbio.sparse_row", "n_cols": 10})
    assert np.array_equal(sparse.decode(sparse.encode(row)), row)


@pytest.mark.parametrize("codec_id", ["lmdbio_toc", "ibp"])
def test_frames_of_earlier_versions_still_decode(codec_id: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """numcodecs' check_backwards_compatibility on the frames kept in
    ``tests/fixtures/numcodecs`` (written once, by the version that added them): the
    formats may not change under the arrays users have stored."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(FIXTURES)
    arrays = [a for a in ARRAYS if a.size and a.dtype.kind in "fiub"]
    codecs = [numcodecs.get_codec(c) for c in CONFIGS if c["id"] == codec_id]
    common.check_backwards_compatibility(codec_id, arrays, codecs)


# --------------------------------------------------------------------------- zarr v3


def _zarr3() -> Any:
    zarr = pytest.importorskip(
        "zarr", minversion="3.1",
        reason="zarr>=3.1 (its numcodecs bridge, zarr.codecs.numcodecs) is not installed: "
               "add it to the test extra to run the zarr v3 round trip")
    return zarr


@pytest.mark.parametrize("make", ["toc", "ibp", "ibp-model"])
def test_zarr_v3_array_round_trip(tmp_path: Path, make: str) -> None:
    """A zarr v3 array on disk whose serializer (array-to-bytes) is TOC or IBP: written in
    chunks (one partial at the edge), read back by a fresh ``open_array`` from the
    metadata alone (IBP without a model: nothing but the codec's name there)."""
    zarr = _zarr3()
    from lmdbio.codecs.zarr3 import IBP, Toc

    data = np.random.default_rng(5).integers(0, 1000, size=(250, 12)).astype("f4")
    data[::7] = 0
    with warnings.catch_warnings():  # numcodecs codecs are outside the v3 spec: zarr warns
        warnings.simplefilter("ignore")
        fitted = IBPCodec(ibp.fit(data[::3]))  # a model fitted on a sample of the rows
        serializer = {"toc": Toc(), "ibp": IBP(),
                      "ibp-model": IBP(**{k: v for k, v in fitted.get_config().items()
                                          if k != "id"})}[make]
        store = str(tmp_path / "a.zarr")
        arr = zarr.create_array(store, shape=data.shape, dtype=data.dtype, chunks=(64, 12),
                                serializer=serializer)
        arr[:] = data
        back = zarr.open_array(store, mode="r")
        assert np.array_equal(back[:], data)
        assert np.array_equal(back[100:140, 3], data[100:140, 3])
    meta = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    names = [c["name"] for c in meta["codecs"]]
    assert names[0] == {"toc": "numcodecs.lmdbio_toc"}.get(make, "numcodecs.ibp")
