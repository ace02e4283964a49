"""loaders.decode.dataset_meta: the sidecar read once per version of the file, read-only."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

import lmdbio.dataset_meta as dm
from loaders.decode import dataset_meta


def test_the_sidecar_is_read_once_and_again_when_replaced(tmp_path, monkeypatch):
    (tmp_path / "data.mdb").write_bytes(b"")
    dm.write_dataset_meta(tmp_path, {"shape": [3, 4, 5]})
    reads = []
    real = dm.read_dataset_meta
    monkeypatch.setattr(dm, "read_dataset_meta", lambda p: reads.append(p) or real(p))
    cfg = SimpleNamespace(dataset=SimpleNamespace(path=str(tmp_path)))
    assert [dataset_meta(cfg)["shape"] for _ in range(3)] == [[3, 4, 5]] * 3
    assert len(reads) == 1
    with pytest.raises(TypeError):
        dataset_meta(cfg)["shape"] = [1]  # type: ignore[index]
    dm.write_dataset_meta(tmp_path, {"shape": [1, 2]})  # a new file (os.replace)
    assert dataset_meta(cfg)["shape"] == [1, 2] and len(reads) == 2
    os.remove(tmp_path / dm.META_FILE)
    assert dict(dataset_meta(cfg)) == {}
    assert dict(dataset_meta(SimpleNamespace(dataset=SimpleNamespace(path=None)))) == {}
