"""The consumer's copy in ``lmdbio bench read``: spans copied batch by batch, overflow page
headers checked in the same pass."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lmdbio
from bench.kinds.read import BatchCopy
from bench.lmdbgen import random_items, write_db
from lmdbio.errors import LmdbFormatError
from lmdbio.slot_receiver import Delivered


@functools.cache
def _database() -> Path:
    """40 records of 0..9000 bytes (inline and overflow values), written once."""
    path = Path(tempfile.mkdtemp(prefix="lmdbio-copy-"))
    write_db(path, random_items(40, (0, 9000), seed=11))
    return path


def _delivery(db, picks: np.ndarray) -> Delivered:
    refs = db.locate(picks)
    n = picks.size
    return Delivered(0, 0, picks, np.zeros(n, bool), payload=db.buf, offsets=refs.val_off,
                     key_offsets=refs.key_off, key_data=db.buf, lengths=refs.val_len,
                     key_lengths=refs.key_len, database=db, values_checked=False)


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.integers(0, 39), max_size=40), batch=st.integers(1, 9),
       start_size=st.integers(0, 20000))
def test_gather_batches_copies_every_batch_into_one_buffer(picks, batch, start_size):
    with lmdbio.open(_database()) as db:
        ids = np.array(picks, np.int64)
        got = _delivery(db, ids)
        lens = got.lengths
        copy = BatchCopy()
        copy.buf = np.zeros(start_size, np.uint8)  # a buffer left by an earlier, smaller slot
        assert copy.gather_batches(got, batch) == int(lens.sum())
        assert got.values_checked
        if ids.size:  # the buffer ends holding the last batch, back to back
            last = range((ids.size - 1) // batch * batch, ids.size)
            expect = b"".join(bytes(db.value(int(ids[t]))) for t in last)
            assert bytes(copy.buf[:len(expect)]) == expect
            biggest = max(int(lens[i:i + batch].sum()) for i in range(0, ids.size, batch))
            assert copy.buf.size >= biggest


def test_a_bad_overflow_header_stops_the_copy_at_its_record(tmp_path):
    """The copy checks each overflow value's page header just before copying it: a damaged
    one raises naming the page, after the records before it were copied, none after."""
    src = _database()
    shutil.copytree(src, tmp_path / "db")
    with lmdbio.open(src) as db:
        refs = db.locate(np.arange(40))
        bad = int(np.flatnonzero(refs.ovf_pages > 0)[3])
        pg = int((refs.val_off[bad] - db.layout.header_size) // db.psize)
        before = b"".join(bytes(db.value(i)) for i in range(bad))
    with open(tmp_path / "db" / "data.mdb", "r+b") as f:
        f.seek(pg * 4096)
        f.write((pg + 3).to_bytes(8, "little"))
    with lmdbio.open(tmp_path / "db") as db:
        got = _delivery(db, np.arange(40))
        out = np.zeros(int(got.lengths.sum()) + 1, np.uint8)
        with pytest.raises(LmdbFormatError, match=f"page {pg}: overflow page header"):
            got.copy_batches(out, 40)
        assert not got.values_checked
        assert bytes(out[:len(before)]) == before and not out[len(before):].any()
        with pytest.raises(LmdbFormatError, match=f"page {pg}"):
            got.check_values()
        got.values_checked = True  # a consumer that checked elsewhere copies unchecked
        assert got.copy_batches(out, 40) == int(got.lengths.sum())
