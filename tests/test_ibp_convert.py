"""``lmdbio convert --layout ibp``: records decode to the source rows and labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lmdbio.cli import main as cli_main
from lmdbio.codecs.ibp.format import decode_record, encode_record, load_model
from lmdbio.convert.ibp import iter_records, load_source
from lmdbio.errors import CodecError, LmdbioError


def read_all(path: Path) -> tuple[np.ndarray, np.ndarray | None, list[bytes]]:
    model = load_model(path)
    rows, labels, keys = [], [], []
    for key, value in iter_records(path):
        r, lab = decode_record(value, model)
        rows.append(r)
        labels.append(lab)
        keys.append(key)
    lab = None if labels[0] is None else np.concatenate(labels)
    return np.concatenate(rows), lab, keys


@pytest.mark.parametrize("src,chunk", [("sklearn:digits", 4), ("sklearn:wine", 8),
                                       ("skimage:lfw", 4)])
def test_convert_bundled(tmp_path: Path, src: str, chunk: int) -> None:
    dst = tmp_path / "db"
    assert cli_main(["convert", src, str(dst), "--layout", "ibp", "--chunk-bytes", str(chunk),
                     "--rows-per-record", "64", "--json"]) == 0
    x, y, _ = load_source(src)
    rows, labels, keys = read_all(dst)
    assert rows.dtype == np.float32
    assert np.array_equal(rows.view(np.uint32), x.astype(np.float32).view(np.uint32))
    assert np.array_equal(labels, y)
    assert keys == [b"%010d" % i for i in range(-(-len(x) // 64))]
    meta = json.loads((dst / "lmdbio.json").read_text())
    assert meta["layout"] == "ibp" and meta["rows"] == len(x)
    assert meta["ibp"]["chunk_bytes"] == chunk
    assert meta["ibp"]["ratio"] > 1.0
    assert meta["records"] == len(keys)


def test_convert_npz_and_npy(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(0, 1, (300, 6, 5)), 2).astype(np.float64)
    y = rng.integers(0, 3, 300).astype(np.uint8)
    np.savez(tmp_path / "d.npz", X=x, y=y)
    np.save(tmp_path / "d.npy", x)
    assert cli_main(["convert", str(tmp_path / "d.npz"), str(tmp_path / "a"), "--layout", "ibp",
                     "--chunk-bytes", "8", "--sample", "0.5", "--clusters", "3"]) == 0
    rows, labels, _ = read_all(tmp_path / "a")
    assert rows.shape == x.shape and rows.dtype == x.dtype
    assert np.array_equal(rows.view(np.uint64), x.view(np.uint64))
    assert np.array_equal(labels, y)
    assert cli_main(["convert", str(tmp_path / "d.npy"), str(tmp_path / "b"), "--layout", "ibp",
                     "--no-checksum", "--dtype", "float32"]) == 0
    rows, labels, _ = read_all(tmp_path / "b")
    assert labels is None
    assert np.array_equal(rows, x.astype(np.float32))
    # an existing destination needs --overwrite
    assert cli_main(["convert", str(tmp_path / "d.npy"), str(tmp_path / "b"), "--layout",
                     "ibp"]) == 2


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(LmdbioError):
        load_source("sklearn:nope")
    with pytest.raises(LmdbioError):
        load_source(str(tmp_path / "missing.npy"))
    (tmp_path / "x.txt").write_text("1 2 3")
    with pytest.raises(LmdbioError):
        load_source(str(tmp_path / "x.txt"))
    np.savez(tmp_path / "two.npz", a=np.zeros(3), b=np.ones(3))
    with pytest.raises(LmdbioError, match="array-key"):
        load_source(str(tmp_path / "two.npz"))
    with pytest.raises(LmdbioError):
        load_model(tmp_path)


def test_record_validation() -> None:
    from lmdbio.codecs import ibp

    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    model = ibp.fit(x)
    frame = model.compress(x, "condensed").to_bytes()
    rec = encode_record(frame, np.arange(10, dtype=np.int32), 10)
    rows, labels = decode_record(memoryview(rec), model)
    assert np.array_equal(rows, x) and labels.tolist() == list(range(10))
    with pytest.raises(CodecError):
        decode_record(rec[:-1], model)
    with pytest.raises(CodecError):
        decode_record(b"IBPX" + rec[4:], model)
    wrong_rows = encode_record(frame, None, 9)
    with pytest.raises(CodecError, match="rows"):
        decode_record(wrong_rows, model)
