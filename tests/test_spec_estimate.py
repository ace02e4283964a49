"""dm-spec's value-page estimate, replayed from real databases without MPI.

The replay does what a DM chain does: ``readers`` readers take ``count`` records each per
iteration in key order; each reader walks its records with a cursor (so it learns the tree
pages from the branch pages on its stack), predicts the next iteration's pages and compares
them with the pages its records use.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.lmdbgen import random_items, write_db
from lmdbio.errors import LmdbFormatError
from lmdbio.lmdb import Database
from lmdbio.lmdb.free_pages import free_list
from lmdbio.plan.strategies.kernels import observe_iteration
from lmdbio.plan.strategies.spec_estimate import (
    KnownTreePages,
    PageRangeEstimator,
    ValuePageEstimator,
    main_run,
)


def make_tree(pages: list[int]) -> KnownTreePages:
    tree = KnownTreePages()
    tree.pages = np.unique(np.asarray(pages, np.int64))
    tree._shifted = tree.pages - np.arange(tree.pages.size, dtype=np.int64)
    return tree


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(2, 300), max_size=60))
def test_value_coordinate_skips_tree_pages_and_inverts(tree_pages: list[int]) -> None:
    tree = make_tree(tree_pages)
    known = set(tree_pages)
    values = [p for p in range(2, 400) if p not in known]
    coords = [tree.coord(p) for p in values]
    # consecutive non-tree pages have consecutive coordinates, whatever lies between
    assert coords == list(range(coords[0], coords[0] + len(coords)))
    assert [tree.page_of(c) for c in coords] == values


def replay(path, readers: int, count: int) -> dict:
    """Returns the pages needed, redundant and missed after each reader's first iteration,
    with ``predicted``: the iterations the value-page estimator predicted."""
    db = Database(path)
    psize = db.psize
    tree = KnownTreePages()
    ests = [ValuePageEstimator(tree) for _ in range(readers)]
    cursor = db.cursor()
    cursor.first()
    out = {"needed": 0, "redundant": 0, "missed": 0, "predicted": 0, "iterations": 0}
    for i in range(len(db) // (readers * count)):
        for r in range(readers):
            lo = (i * readers + r) * count
            refs, _, _ = db.walk_collect(cursor, count)
            ranges = ests[r].predict(lo, count)
            first = refs.val_off // psize
            values = np.unique(np.concatenate(
                [np.arange(f, f + n) for f, n in zip(first, refs.ovf_pages, strict=True)]))
            # the walk also reads the branch pages on its way (the root, here)
            walked = np.union1d(refs.leaf_pg, [pg for pg, _ in cursor.stack[:-1]])
            pages = np.union1d(values, walked)
            run = main_run(np.union1d(values, refs.leaf_pg), max(2, pages.size // 8))
            tree.learn(db, cursor.stack)
            ests[r].observe(lo, refs, psize, run)
            if i == 0:
                continue
            out["iterations"] += 1
            out["needed"] += pages.size
            if ranges is None:
                continue
            out["predicted"] += 1
            fetched = np.unique(np.concatenate([np.arange(s, s + n) for s, n in ranges]))
            out["redundant"] += int(np.setdiff1d(fetched, pages).size)
            out["missed"] += int(np.setdiff1d(values, fetched).size)
    db.close()
    return out


@pytest.fixture(scope="module")
def caffe_like(tmp_path_factory: pytest.TempPathFactory):
    """3 KB records (one overflow page each), written in one commit and, as Caffe's
    converter does, 1,000 at a time (later values then reuse pages freed by commits)."""
    base = tmp_path_factory.mktemp("spec")
    items = random_items(4000, 3072, seed=11)
    one, caffe = base / "one-commit", base / "caffe"
    write_db(one, items, commit_every=10**9)
    write_db(caffe, items, commit_every=1000)
    return one, caffe


def test_exact_pages_on_a_file_written_in_one_commit(caffe_like) -> None:
    one, _ = caffe_like
    for readers, count in ((4, 64), (3, 50), (8, 32)):
        got = replay(one, readers, count)
        assert got["predicted"] == got["iterations"] > 0
        assert got["redundant"] == 0 and got["missed"] == 0, (readers, count, got)


def test_caffe_commits_cost_about_a_page_per_commit(caffe_like) -> None:
    """Values stored in pages freed by earlier commits cannot be predicted: each costs one
    missed page, and the pages of the records around it shift by one for one iteration."""
    _, caffe = caffe_like
    for readers, count in ((4, 64), (4, 32)):
        got = replay(caffe, readers, count)
        assert got["predicted"] == got["iterations"]
        assert got["redundant"] <= 0.01 * got["needed"], got
        assert got["missed"] <= 0.01 * got["needed"], got


def test_no_value_page_estimate_for_inline_or_mixed_sizes(tmp_path) -> None:
    inline, mixed = tmp_path / "inline", tmp_path / "mixed"
    write_db(inline, random_items(600, 200, seed=1))
    write_db(mixed, random_items(600, (3000, 9000), seed=1))
    for path in (inline, mixed):
        got = replay(path, 2, 50)
        assert got["iterations"] > 0 and got["predicted"] == 0


def test_branch_children_are_the_leaves_under_the_root(caffe_like) -> None:
    one, _ = caffe_like
    with Database(one) as db:
        assert db.db.depth == 2
        assert np.array_equal(db.branch_children(db.db.root), db.leaves())
        with pytest.raises(LmdbFormatError, match=f"page {int(db.leaves()[0])}"):
            db.branch_children(int(db.leaves()[0]))  # a leaf page is not a branch


def test_values_outside_the_prefetched_ranges_are_the_ones_advised_again():
    """dm-spec asks again only for the values a prefetch missed (all or part of them)."""
    from lmdbio.lmdb import RecordRefs
    from lmdbio.plan.strategies.dm import _outside

    psize = 4096
    first = np.array([10, 12, 20, 30, 41], np.int64)  # value pages, 1 or 2 each
    lens = np.array([3000, 5000, 3000, 3000, 100], np.int64)
    zeros = np.zeros(5, np.int64)
    refs = RecordRefs(first * psize + 16, lens, zeros, np.ones(5, np.int64), zeros, zeros)
    starts, lengths = np.array([10, 28], np.int64), np.array([3, 4], np.int64)
    # 10 inside [10, 13); 12-13 crosses its end; 20 outside; 30 inside [28, 32); 41 outside
    assert _outside(refs, psize, starts, lengths).tolist() == [1, 2, 4]
    # adjacent ranges join: 12-13 lies in [10, 13) + [13, 14); unsorted ranges are fine
    assert _outside(refs, psize, np.array([28, 13, 10]), np.array([4, 1, 3])).tolist() == [2, 4]
    assert _outside(refs, psize, np.empty(0, np.int64), np.empty(0, np.int64)).tolist() == \
        [0, 1, 2, 3, 4]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 9000)), max_size=30),
       st.lists(st.tuples(st.integers(0, 70), st.integers(0, 8)), max_size=8))
def test_values_outside_matches_a_page_by_page_check(values, ranges):
    """The compiled pass equals the definition: a value is outside when one of its pages
    is in no range."""
    from lmdbio.lmdb import RecordRefs
    from lmdbio.plan.strategies.dm import _outside

    psize = 4096
    off = np.array([p * psize + 8 for p, _ in values], np.int64)
    lens = np.array([n for _, n in values], np.int64)
    starts = np.array([a for a, _ in ranges], np.int64)
    lengths = np.array([n for _, n in ranges], np.int64)
    covered = {p for a, n in ranges for p in range(a, a + n)}
    want = [i for i, (o, n) in enumerate(zip(off.tolist(), lens.tolist(), strict=True))
            if any(p not in covered for p in range(o // psize, (o + max(n, 1) - 1) // psize + 1))]
    refs = RecordRefs(off, lens, np.zeros_like(off), np.ones_like(off), np.zeros_like(off),
                      np.zeros_like(off))
    assert _outside(refs, psize, starts, lengths).tolist() == want


def test_a_single_jump_moves_the_range_without_widening_it() -> None:
    """A leaf a commit copied far away: the range follows it and comes back, and the
    predictions around it stay as narrow as before (kept in the history, the jump widened
    the next eight predictions by its length)."""
    est = PageRangeEstimator()
    for leaf in (40, 40, 41, 41, 42):
        est.observe(leaf, leaf + 1)
    before = est.predict()
    est.observe(14, 15)  # the leaf moved by a commit
    assert est.predict() == (14, before[1])
    for _ in range(3):
        est.observe(14, 15)
        assert est.predict()[1] <= before[1]
    est.observe(43, 44)  # back to the leaves in order: a jump again, but not in a row
    assert est.predict() == (43, before[1])


def test_two_jumps_in_a_row_are_a_new_pattern() -> None:
    est = PageRangeEstimator()
    for start in range(0, 50, 10):
        est.observe(100 + start, 102 + start)
    est.observe(400, 402)
    est.observe(700, 702)  # the records now step 300 pages: the history takes it
    start, length = est.predict()
    assert start + length >= 1002


def replay_inline(path, readers: int, count: int) -> dict:
    """dm-spec's min/max path replayed with its compiled observation: ``readers`` readers
    take ``count`` records each per iteration in key order; every walk reads the records'
    leaves and the branch pages on its path. Returns predicted and redundant pages after
    each reader's first two iterations, and the longest prediction."""
    db = Database(path)
    psize = db.psize
    npages = db.file_size // psize
    ests = [PageRangeEstimator() for _ in range(readers)]
    scratch = np.zeros(npages, np.uint8)
    cursor = db.cursor()
    cursor.first()
    out = {"predictions": 0, "predicted": 0, "redundant": 0, "longest": 0, "needed": 0}
    for i in range(len(db) // (readers * count)):
        for r in range(readers):
            guess = ests[r].predict()
            refs, _, _ = db.walk_collect(cursor, count)
            touched = np.zeros(npages, np.uint8)
            touched[refs.leaf_pg] = 1
            touched[[int(pg) for pg, _ in cursor.stack[:-1]]] = 1
            starts = np.array([guess[0]] if guess else [], np.int64)
            lengths = np.array([guess[1]] if guess else [], np.int64)
            run_start, run_end, needed, _, _, redundant, prefetched = observe_iteration(
                refs.val_off, refs.val_len, refs.leaf_pg, psize, touched, scratch, starts,
                lengths)
            ests[r].observe(int(run_start), int(run_end))
            if i >= 2 and guess:
                out["predictions"] += 1
                out["predicted"] += int(prefetched)
                out["redundant"] += int(redundant)
                out["needed"] += int(needed)
                out["longest"] = max(out["longest"], int(guess[1]))
    db.close()
    return out


def test_min_max_range_does_not_run_away_on_tiny_inline_records(tmp_path) -> None:
    """30-byte values, ~80 to a leaf, 7 records a share: a share needs one or two leaves
    and the branch pages above them. When the main run counted branch pages, a branch page
    alone was as large a run as a one-leaf share's leaf, the run alternated between them
    and the range grew to the whole file (helper sweep); and every commit's copy of the
    leaf being filled, far from the others, widened eight predictions by the jump."""
    path = tmp_path / "tiny"
    write_db(path, random_items(12_000, 30, seed=2), commit_every=1000)
    got = replay_inline(path, 2, 7)
    assert got["predictions"] > 1000
    assert got["longest"] <= 8, got
    # what min/max cannot avoid: a page of slack when a share's records fill one leaf
    assert got["redundant"] <= 1.25 * got["predictions"], got


# --------------------------------------------------------------------------- leaf scan


def _leaf_values(n_before: int, share: int, n_after: int, start: int,
                 displaced: dict[int, int], foreign: frozenset[int] = frozenset()
                 ) -> np.ndarray:
    """The first value pages, in key order, of the records on a share's leaves: ``n_before``
    other records, the share's ``share``, ``n_after`` others, one page each from page
    ``start - n_before`` on, except the records in ``displaced`` (position: page), stored
    elsewhere (the next record takes the page); before the records in ``foreign`` lies
    a page that holds none of them (another record's value stored there)."""
    pages, nxt = [], start - n_before
    for i in range(n_before + share + n_after):
        nxt += i in foreign
        if i in displaced:
            pages.append(displaced[i])
        else:
            pages.append(nxt)
            nxt += 1
    return np.asarray(pages, np.int64)


def test_leaf_scan_names_the_shares_displaced_values_and_the_shift() -> None:
    """With an exact estimate the share is the records from the one at the predicted
    start: its value stored far away and the page its last record moved on to are named;
    another reader's displaced value on the same leaves is not."""
    from lmdbio.plan.strategies.dm import FarScan

    start, share = 500, 40
    first = _leaf_values(20, share, 30, start, {25: 90, 65: 95}, frozenset({30, 70}))
    counts = np.ones_like(first)
    scan = FarScan(np.array([7, 8]), start, start + share, 1, share, exact=True)
    got, n = scan.missing(first, counts)
    # record 25 (the share's 6th) is at page 90; a page before record 30 holding another
    # value pushes the share's last records on by one, past the range, and record 25's
    # place went to the next record: the last ends on the range's last page; record 65
    # (another reader's) is left out
    assert got.tolist() == [90] and n.tolist() == [1]
    pushed = _leaf_values(20, share, 30, start, {}, frozenset({30, 65}))
    assert scan.missing(pushed, counts)[0].tolist() == [start + share]
    # a min/max range (no record count): only values far from the run, and of those
    # only the ones next to the share's records in key order
    far = FarScan(np.array([7, 8]), start, start + share, 1, share)
    assert far.missing(first, counts)[0].tolist() == [90]
    # nothing on the leaves near the range: no basis to name anything
    away = FarScan(np.array([7]), 5000, 5040, 1, share, exact=True)
    assert away.missing(first, counts)[0].size == 0
    # inline values (0 pages) are never named
    assert scan.missing(first, np.zeros_like(counts))[0].size == 0


def test_leaf_scan_placed_by_the_leaves_counts_survives_a_shifted_estimate() -> None:
    """When the leaves' record counts place the share (its first record is the 20th on
    the first leaf), an estimate shifted by values moved among other readers' records
    (here two pages early) still gets every page: the scan names the share's pages past
    the range's end; taken by value page, the share would start two records late."""
    from lmdbio.plan.strategies.dm import FarScan

    start, share = 500, 40
    first = _leaf_values(20, share, 30, start, {}, frozenset({}))
    counts = np.ones_like(first)
    early = start - 2
    placed = FarScan(np.array([7, 8]), early, early + share, 1, share, True, first_slot=20)
    assert placed.missing(first, counts)[0].tolist() == [start + share - 2, start + share - 1]
    by_page = FarScan(np.array([7, 8]), early, early + share, 1, share, True)
    assert by_page.missing(first, counts)[0].size == 0  # it takes the wrong records


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.integers(1, 80), st.integers(0, 60),
       st.sets(st.integers(0, 199), max_size=4), st.integers(1, 3))
def test_leaf_scan_with_an_exact_estimate_leaves_nothing_out(
        n_before: int, share: int, n_after: int, moved: set[int], per: int) -> None:
    """Whatever records are stored elsewhere, and pages of other values lie between the
    share's (here after each displaced record): the predicted range and the runs the scan
    names cover every page of the share's values (records of ``per`` pages each)."""
    from lmdbio.plan.strategies.dm import FarScan

    total = n_before + share + n_after
    moved = {i for i in moved if i < total and i != n_before}  # the first stays in place
    pages = _leaf_values(n_before, share, n_after, 1000,
                         {i: 10 + 4 * k for k, i in enumerate(sorted(moved))},
                         frozenset(i + 1 for i in moved))
    # every record ``per`` pages: page numbers scaled, displaced ones kept apart
    first = np.where(pages >= 1000, 1000 + (pages - 1000) * per, pages * per)
    counts = np.full_like(first, per)
    start = 1000
    scan = FarScan(np.array([3]), start, start + share * per, per, share, exact=True)
    extra_first, extra_counts = scan.missing(first, counts)
    covered = set(range(start, start + share * per))
    for f, c in zip(extra_first.tolist(), extra_counts.tolist(), strict=True):
        covered |= set(range(f, f + c))
    mine = slice(n_before, n_before + share)
    need = {p for f, c in zip(first[mine].tolist(), counts[mine].tolist(), strict=True)
            for p in range(f, f + c)}
    assert need <= covered


def test_learn_tree_names_every_tree_page_reading_branch_pages_only(tmp_path) -> None:
    """On a three-level tree (400-byte keys: ~9 records a leaf, ~9 children a branch)
    committed 50 records at a time, the pages a dm-spec reader learns at its first epoch
    are every branch and leaf page, the free-page database's pages and the free pages it
    lists; what it read for them are the branch pages and the free database's, no leaf
    of the main tree (each marked as read); no value page is among them."""
    write_db(tmp_path, random_items(300, 3072, seed=4, key_fmt="%0400d"), commit_every=50)
    db = Database(tmp_path)
    try:
        assert db.db.depth == 3
        leaves = db.leaves()
        free, own = free_list(db)
        assert free.size and own.size
        t = db.record_table()
        values = np.unique(np.concatenate([np.arange(f, f + n) for f, n in zip(
            ((t.val_off - db.layout.header_size) // db.psize).tolist(), t.ovf_pages.tolist(),
            strict=True)]))
        db.accounting.enable()
        db.accounting.reset()
        tree = KnownTreePages()
        tree.learn_tree(db)
        read = np.flatnonzero(db.accounting.touched)
        branches = np.setdiff1d(read, own)
        assert tree.complete
        assert tree.leaves.tolist() == sorted(leaves.tolist())
        assert tree.pages.tolist() == np.unique(np.concatenate(
            [branches, leaves, free, own])).tolist()
        assert branches.size == db.db.branch_pages and db.db.root in branches
        assert not np.isin(read, leaves).any()
        assert np.intersect1d(tree.pages, values).size == 0
    finally:
        db.close()


def test_dm_spec_first_guess_is_exact_on_a_deep_tree_written_in_one_commit(tmp_path) -> None:
    """From the first iteration of the first epoch, before any walk: on a three-level tree
    written in one commit the first guess (every record the size of the first, counted
    past the tree pages) misses no page, since every leaf is known from the start (before,
    the leaves under branch pages no walk had passed pushed the values out of the range).
    Its range is one run: the branch pages inside it that the walk does not pass are the
    only pages prefetched for nothing."""
    from lmdbio.plan.epoch import plan_epoch
    from lmdbio.plan.strategies import DmSpec, IterationStats, ReaderContext

    write_db(tmp_path, random_items(300, 3072, seed=5, key_fmt="%0400d"), commit_every=300)
    db = Database(tmp_path)
    try:
        assert db.db.depth == 3
        s = DmSpec(ReaderContext(db, None, 0, 1, advise=False))
        s.setup()
        plan = plan_epoch(len(db), 1, 100)
        s.begin_epoch(plan)
        for it in range(plan.iterations):
            db.accounting.reset()
            stats = IterationStats(it)
            s.fetch(plan, it, plan.records(it, 0), stats)
            assert stats.missed_pages == 0, it
            assert stats.redundant_pages <= db.db.branch_pages, it
    finally:
        db.close()


def test_walk_branches_are_the_branch_pages_a_walk_reads(tmp_path) -> None:
    """On a three-level tree, for walks from a record of one leaf over the records of the
    next leaves (crossing parents or not), from a cursor rebuilt from bytes (its whole
    path is read again) or a reader's own: :meth:`KnownTreePages.walk_branches` names
    exactly the branch pages the walk's accounting marks."""
    write_db(tmp_path, random_items(300, 3072, seed=4, key_fmt="%0400d"), commit_every=300)
    db = Database(tmp_path)
    try:
        assert db.db.depth == 3
        tree = KnownTreePages()
        tree.learn_tree(db)
        first = db.leaf_directory()
        leaves = tree.ordered_leaves
        db.accounting.enable()
        crossed = 0
        for lo, end in ((0, 0), (0, 3), (2, 12), (5, 20), (10, leaves.size - 1)):
            crossed += int(len(set(tree.leaf_parents[lo:end + 1].tolist())) > 1)
            for received in (True, False):
                cur = db.cursor()
                cur.first()
                db.walk_skip(cur, int(first[lo]) + 1)  # a record inside leaf lo
                db.accounting.reset()
                if received:
                    cur = db.cursor_from_bytes(cur.to_bytes())
                # on to the last record of leaf ``end``
                db.walk_skip(cur, int(first[end + 1]) - int(first[lo]) - 2)
                read = set(np.flatnonzero(db.accounting.touched).tolist())
                got = tree.walk_branches(lo, end, received)
                assert read - set(leaves.tolist()) == set(got), (lo, end, received)
                db.accounting.reset()
        assert crossed >= 2
    finally:
        db.close()
