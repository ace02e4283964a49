"""Tests written to kill mutants that survived the suite (docs/findings/
mutation-testing-2026-11-27.md): each names the mutant it kills, as mutmut printed it."""

from __future__ import annotations

import numpy as np
import pytest

import lmdbio
from bench.lmdbgen import random_items, write_db
from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.lmdb.format import sniff_version
from lmdbio.lmdb.records import RecordRefs
from lmdbio.plan.epoch import block_order, permutation, plan_epoch


@pytest.fixture(scope="module", params=[1, 3])
def small_db(tmp_path_factory, request):
    """A tree of a few leaves (values inline and on overflow pages)."""
    path = tmp_path_factory.mktemp(f"small-v{request.param}")
    write_db(path, random_items(400, (1, 3000), seed=3), version=request.param,
             commit_every=100)
    return path


def test_shuffled_orders_never_change_for_a_seed_and_epoch() -> None:
    """The module's promise, "the plan for a given seed and world size never changes":
    a resumed or re-run job (another version of lmdbio, another rank) must get the very
    same order. Pinned values (numpy's PCG64 ``default_rng`` streams).
    Kills ``default_rng([seed, epoch, 1])`` -> ``[seed, epoch, 2]`` in block_order."""
    leaf_first = np.array([0, 3, 5, 9, 12, 13, 17, 20])
    assert block_order(leaf_first, 7, 2, block_leaves=2, window=4).tolist() == [
        14, 12, 13, 15, 6, 16, 5, 7, 8, 9, 10, 11, 1, 3, 0, 2, 17, 18, 4, 19]
    assert permutation(12, 7, 2).tolist() == [1, 11, 4, 3, 5, 0, 10, 6, 8, 2, 9, 7]
    plan = plan_epoch(20, 2, 3, "pad", "block", seed=7, epoch=2, leaf_first=leaf_first,
                      block_leaves=2, window=4)
    assert plan.order.tolist() == block_order(leaf_first, 7, 2, 2, 4).tolist()


def test_a_single_short_partial_batch_is_split_not_padded_even_with_slot_groups() -> None:
    """``partial`` with one iteration whose global batch is short: the slot-group layout
    (which needs full batches) must not apply, or the short batch would be padded with
    repeated records. Kills ``iters > 0`` -> ``iters > 1`` in plan_epoch's ``short_last``."""
    plan = plan_epoch(5, 2, 4, "partial", group=2, node_consumers=(2,))
    assert plan.iterations == 1
    assert plan.group == 1
    assert plan.sizes.tolist() == [[3, 2]]
    assert not plan.padding(0, 0).any() and not plan.padding(0, 1).any()
    assert sorted(np.concatenate([plan.records(0, 0), plan.records(0, 1)]).tolist()) == \
        list(range(5))


def test_a_walk_at_the_end_stays_there_without_wrap_and_restarts_with_it(small_db) -> None:
    """A cursor at the end: walking on without ``wrap`` moves nothing (no record twice);
    with ``wrap`` it starts again at the first record. Kills ``not wrap or not
    cursor.first()`` -> ``not wrap and not cursor.first()`` in Database._advance."""
    with lmdbio.open(small_db, pin_snapshot=False) as db:
        n = len(db)
        cur = db.cursor()
        refs, wraps, at_end = db.walk_collect(cur, n + 5)
        assert (len(refs), wraps, at_end, cur.eof) == (n, 0, True, True)
        refs, wraps, at_end = db.walk_collect(cur, 5)
        assert (len(refs), wraps, at_end) == (0, 0, True)
        assert db.walk_skip(cur, 5) == (0, 0, True)
        refs, wraps, at_end = db.walk_collect(cur, 5, wrap=True)
        assert len(refs) == 5 and not at_end
        np.testing.assert_array_equal(refs.key_off, db.record_table().key_off[:5])


def test_a_leaf_directory_is_adopted_only_when_it_adds_up_to_the_snapshot(small_db) -> None:
    """:meth:`Database.set_leaf_directory` takes the directory of this snapshot (total in
    ``first[-1]``) and refuses one of another size. Kills ``first[-1]`` -> ``first[-2]``."""
    with lmdbio.open(small_db, pin_snapshot=False) as db:
        leaves, first = db.leaves().copy(), db.leaf_directory().copy()
    assert leaves.size > 2
    with lmdbio.open(small_db, pin_snapshot=False) as db:
        db.set_leaf_directory(leaves, first)
        np.testing.assert_array_equal(db.leaf_directory(), first)
        wrong = first.copy()
        wrong[-1] += 1
        with pytest.raises(LmdbioError, match="does not match"):
            db.set_leaf_directory(leaves, wrong)


@pytest.mark.parametrize("size", [1, 7, 12, 23])
def test_a_file_too_short_for_a_meta_header_is_not_lmdb_not_a_crash(tmp_path, size) -> None:
    """A file shorter than the meta header: ``sniff_version`` says "not LMDB" (None)
    instead of reading past the buffer (``struct.error``). Kills ``len(head) >= off + 8``
    -> ``len(head) >= off - 8`` in format.sniff_version."""
    data = (b"\xde\xc0\xef\xbe\x01\x00\x00\x00" * 4)[:size]
    assert sniff_version(data) is None
    # and the shortest head that holds the v1 magic and version is enough (kills ``off + 9``)
    head = bytes(16) + b"\xde\xc0\xef\xbe\x01\x00\x00\x00"
    assert sniff_version(head) == 1
    (tmp_path / "data.mdb").write_bytes(data)
    with pytest.raises(LmdbFormatError, match="not an LMDB data file"):
        lmdbio.open(tmp_path, pin_snapshot=False)


def test_a_shard_of_one_record_pads_with_its_own_record() -> None:
    """``shard`` pads a shard by wrapping around to its own start (DALI): a shard holding
    one record repeats that record, never the next shard's. Kills ``np.maximum(..., 1)``
    -> ``np.maximum(..., 2)`` (the wrap length) in plan_epoch."""
    plan = plan_epoch(3, 4, 2, "pad", scheme="shard")
    assert plan.table.tolist() == [[[0, 0], [1, 1], [2, 2], [2, 2]]]
    assert plan.pad.tolist() == [[[False, True], [False, True], [False, True], [True, True]]]
    for c in range(3):
        assert plan.records(0, c).tolist() == [c, c]


def test_a_tree_of_one_page_has_its_root_as_only_level_and_no_parents(tmp_path) -> None:
    """``tree_levels`` of a one-page tree: the root (a leaf) and an empty array of
    parents, as documented. Kills ``parents = np.empty(0, np.int64)`` -> ``None``."""
    write_db(tmp_path, random_items(5, 20, seed=1))
    with lmdbio.open(tmp_path, pin_snapshot=False) as db:
        assert db.stat()["depth"] == 1
        levels, parents = db.tree_levels()
        assert [lv.tolist() for lv in levels] == [[db.db.root]]
        assert isinstance(parents, np.ndarray) and parents.dtype == np.int64
        assert parents.size == 0


def test_a_shard_pads_by_wrapping_to_its_own_start() -> None:
    """The last, shorter shard (3 own records of a shard of 4) pads with its own first
    record. Kills ``(pos - start) % length`` -> ``(pos + start) % length``."""
    plan = plan_epoch(11, 3, 4, "pad", scheme="shard")
    assert plan.table.tolist() == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 8]]]
    assert plan.padding(0, 2).tolist() == [False, False, False, True]


def test_value_pages_cover_every_byte_of_every_value_and_nothing_else() -> None:
    """:meth:`RecordRefs.value_page_runs` / :meth:`value_pages` (what prefetch advises
    and accounting charges): a value inside one page, one across a page boundary, a
    two-page overflow value, and an empty value (the page of the byte before it). Kills
    ``- first + 1`` -> ``+ 2``, the ramp's ``-`` -> ``+``, ``np.empty(0)`` -> ``np.empty(1)``
    for no records, and ``first, counts = None``."""
    ps = 4096
    refs = RecordRefs(val_off=np.array([100, ps - 6, 3 * ps, 5 * ps + 7]),
                      val_len=np.array([50, 10, 2 * ps, 0]),
                      leaf_pg=np.array([2, 2, 6, 6]), ovf_pages=np.array([0, 0, 2, 0]),
                      key_off=np.zeros(4, np.int64), key_len=np.ones(4, np.int64))
    first, counts = refs.value_page_runs(ps)
    assert first.tolist() == [0, 0, 3, 5]
    assert counts.tolist() == [1, 2, 2, 1]
    assert refs.value_pages(ps).tolist() == [0, 1, 3, 4, 5]
    assert refs.pages(ps).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert refs.head(0).value_pages(ps).size == 0
    assert RecordRefs.empty(0).pages(ps).size == 0


def test_a_leaf_that_is_the_last_page_of_the_file_is_a_valid_leaf(tmp_path) -> None:
    """A one-leaf tree written in one commit: its leaf is the file's last page and reads
    as any leaf. Kills ``(leaves + 1) * psize > size`` -> ``(leaves + 2) * ...`` in
    Database.checked_leaves."""
    write_db(tmp_path, random_items(5, 20, seed=1))
    with lmdbio.open(tmp_path, pin_snapshot=False) as db:
        leaves = db.leaves()
        assert (int(leaves[-1]) + 1) * db.psize == db.file_size
        first, counts = db.leaf_value_runs(leaves)
        assert first.tolist() == [int(leaves[0])] * 5 and counts.tolist() == [0] * 5


def test_a_damaged_stale_meta_page_is_passed_over_for_the_other(tmp_path) -> None:
    """LMDB keeps two meta pages so that one may be torn: a bad meta page 0 (here the
    stale one, its page number overwritten) is reported and the file opens from meta
    page 1; both bad names both. Kills ``problems = []`` -> ``None`` in _read_meta."""
    items = write_db(tmp_path, random_items(5, 20, seed=1))
    data = tmp_path / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[0:8] = (7).to_bytes(8, "little")
    data.write_bytes(bytes(raw))
    with lmdbio.open(tmp_path, pin_snapshot=False) as db:
        assert db.meta.page == 1
        assert [(k, bytes(v)) for k, v in db.items()] == items
    raw[4096:4104] = (9).to_bytes(8, "little")
    data.write_bytes(bytes(raw))
    with pytest.raises(LmdbFormatError, match=r"meta page 0: .*page 7.*meta page 1: .*page 9"):
        lmdbio.open(tmp_path, pin_snapshot=False)
