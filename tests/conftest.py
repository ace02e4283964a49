"""Shared fixtures: where the reference test data lives, and generated databases."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TESTDATA = REPO.parent / "shared" / "testdata"


@pytest.fixture(scope="session")
def shared_testdata() -> Path:
    """``../shared/testdata`` (files written by Caffe and others); skip where it is absent."""
    if not SHARED_TESTDATA.is_dir():
        pytest.skip("../shared/testdata is not present")
    return SHARED_TESTDATA


def shared_lmdbs() -> list[Path]:
    """Every LMDB directory under ``../shared/testdata/lmdb`` (empty where absent)."""
    root = SHARED_TESTDATA / "lmdb"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "data.mdb").exists())
