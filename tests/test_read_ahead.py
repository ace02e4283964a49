"""Prefetch advice and read-ahead of the strategies that know their pages before reading them
(dm-spec's estimate, indexed's exact ranges), one reader, no MPI: what they ask the kernel
for, and that asking reads nothing and counts nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.lmdbgen import random_items, uneven_key_items, write_db
from lmdbio.errors import LmdbFormatError
from lmdbio.io import prefetch as pf
from lmdbio.io.gather import gather_refs
from lmdbio.lmdb import Database, RecordRefs
from lmdbio.plan.epoch import plan_epoch
from lmdbio.plan.strategies import DmSpec, Indexed, IterationStats, ReaderContext, base
from lmdbio.plan.strategies.base import WARM_TRUST_MAX, WarmFile

BATCH = 32


@pytest.fixture(scope="module")
def cifar_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """640 records of 3,072 bytes (one overflow page each), committed 100 at a time."""
    path = tmp_path_factory.mktemp("ahead") / "db"
    write_db(path, random_items(640, 3072, seed=3), commit_every=100)
    return path


@pytest.fixture()
def open_strategy():
    """``open_strategy(cls, path, advise=True) -> (db, strategy)``, one reader; the
    databases are closed after the test (a mapping left open keeps its pages resident)."""
    opened: list[Database] = []

    def make(cls, path: Path, advise: bool = True):
        db = Database(path)
        opened.append(db)
        s = cls(ReaderContext(db, None, 0, 1, advise=advise))
        s.setup()
        return db, s

    yield make
    for db in opened:
        db.close()


def _resident_db_pages(path: Path, db: Database) -> np.ndarray:
    os_pages = pf.resident_pages(path / "data.mdb")
    per = db.psize // pf.OS_PAGE_SIZE
    return np.flatnonzero(os_pages[: os_pages.size // per * per].reshape(-1, per).all(axis=1))


def _cold(path: Path, db: Database) -> None:
    """Unmap ``db``'s pages in this process and drop the file from the page cache, then turn
    read-around off in ``db``'s mapping (skip where the file system keeps it resident).
    The file's first 16 pages may stay (the meta pages, read again by the snapshot pin's
    LMDB environment with the kernel's read-around): no test looks at them. The pin is
    waited for first: its child starts at low priority, and opening its environment after
    the drop would read (around) the file's first pages again."""
    from lmdbio.io import libc

    db.stat()  # waits for the pin child's answer (its environment is open by then)

    length = db.buf.shape[0] // pf.OS_PAGE_SIZE * pf.OS_PAGE_SIZE
    libc.madvise(db.buf.ctypes.data, length, pf.MADV_DONTNEED)
    pf.drop_cache(path / "data.mdb")
    if (_resident_db_pages(path, db) >= 16).any():
        pytest.skip(f"this file system keeps the file resident: {_resident_db_pages(path, db)}")
    libc.madvise(db.buf.ctypes.data, length, pf.MADV_RANDOM)
    db.read_around = False


def _eventually(check, seconds: float = 60.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def test_indexed_read_ahead_asks_for_the_next_values_without_counting(cifar_like,
                                                                      open_strategy) -> None:
    db, s = open_strategy(Indexed, cifar_like)
    plan = plan_epoch(len(db), 1, BATCH)
    ids = plan.records(3, 0)
    want = db.locate(ids).value_pages(db.psize)
    db.accounting.enable()
    _cold(cifar_like, db)
    db.accounting.reset()
    s.read_ahead(plan, 3, ids)
    assert not db.accounting.touched.any(), "read-ahead is not a read of this iteration"
    assert _eventually(lambda: np.isin(want, _resident_db_pages(cifar_like, db)).all())
    # besides the values asked for: the leaf pages its locate read
    assert want.min() >= 16
    extra = np.setdiff1d(_resident_db_pages(cifar_like, db), want)
    assert (extra >= 16).sum() <= 3, extra


def test_indexed_fetch_takes_what_read_ahead_located_and_counts_its_leaves(
        cifar_like, open_strategy) -> None:
    """The fetch after a read-ahead of the same ids returns the records located then,
    counting their leaves as this iteration's reads (as a locate of its own would); other
    ids are located afresh."""
    db, s = open_strategy(Indexed, cifar_like)
    plan = plan_epoch(len(db), 1, BATCH)
    db.accounting.enable()
    ids = plan.records(4, 0)
    db.accounting.reset()
    fresh = db.locate(ids)
    fresh_pages = db.accounting.pages()
    db.accounting.reset()
    s.read_ahead(plan, 4, ids)
    assert not db.accounting.touched.any()
    refs = s.fetch(plan, 4, ids, IterationStats(4))
    for f in ("val_off", "val_len", "leaf_pg", "ovf_pages", "key_off", "key_len"):
        np.testing.assert_array_equal(getattr(refs, f), getattr(fresh, f))
    np.testing.assert_array_equal(db.accounting.pages(), fresh_pages)
    # read ahead for one slot, fetched another: located as asked, not the read-ahead's
    s.read_ahead(plan, 5, plan.records(5, 0))
    other = plan.records(6, 0)
    got = s.fetch(plan, 6, other, IterationStats(6))
    np.testing.assert_array_equal(got.val_off, db.locate(other).val_off)


def test_indexed_adds_the_whole_leaves_of_the_records_it_locates(cifar_like, open_strategy,
                                                                 monkeypatch) -> None:
    """Locating a record parses its whole leaf page into the record table (the page is
    read anyway, for the key): a slot of records on leaves parsed before is served from
    the table, one with records on other leaves parses only those leaves, once; the refs
    and the pages counted are those of a locate of the whole slot."""
    db, s = open_strategy(Indexed, cifar_like)
    first = db.leaf_directory()
    assert first.shape[0] > 5  # several leaves
    plan = plan_epoch(len(db), 1, BATCH)
    s.fetch(plan, 0, np.array([first[1] + 1]), IterationStats(0))  # one record of leaf 1
    np.testing.assert_array_equal(np.flatnonzero(s.table.known),
                                  np.arange(first[1], first[2]))
    parsed: list[np.ndarray] = []
    build = db.build_table
    monkeypatch.setattr(db, "build_table",
                        lambda tree, leaves, n: parsed.append(leaves.copy()) or
                        build(tree, leaves, n))
    # every record of leaf 1, shuffled, and one each of leaves 4 and 0
    ids = np.concatenate([np.arange(first[1], first[2])[::-1], [first[4] + 2, first[0]]])
    db.accounting.enable()
    db.accounting.reset()
    got = s.fetch(plan, 0, ids, IterationStats(0))
    pages = db.accounting.pages()
    assert len(parsed) == 1
    np.testing.assert_array_equal(parsed[0], db.leaves()[[0, 4]])
    db.accounting.reset()
    fresh = db.locate(ids)
    for f in ("val_off", "val_len", "leaf_pg", "ovf_pages", "key_off", "key_len"):
        np.testing.assert_array_equal(getattr(got, f), getattr(fresh, f))
    np.testing.assert_array_equal(pages, db.accounting.pages())
    # all of them held now: no leaf is parsed again
    s.fetch(plan, 0, ids, IterationStats(0))
    assert len(parsed) == 1


def test_a_leaf_holding_other_records_than_the_directory_counted_is_refused(
        cifar_like, open_strategy) -> None:
    """A leaf directory that disagrees with the pages (a stale or edited sidecar the spot
    check missed) makes the leaf parse fail naming the page, never misplace a record."""
    db, s = open_strategy(Indexed, cifar_like)
    first = db.leaf_directory().copy()
    first[2] -= 1  # leaf 1 said to hold one record fewer, leaf 2 one more
    db.set_leaf_directory(db.leaves(), first)
    with pytest.raises(LmdbFormatError, match=f"page {int(db.leaves()[1])}"):
        s.located(np.array([first[1]]))
    # both leaves at once: as many records as counted, but not where the directory says
    with pytest.raises(LmdbFormatError, match="other records than the leaf directory"):
        s.located(np.array([first[1], first[2]]))
    assert not s.table.known.any()  # nothing misplaced was kept


@pytest.mark.parametrize("advise", [True, False])
def test_indexed_fetch_asks_for_its_values_unless_turned_off(cifar_like, open_strategy,
                                                             advise) -> None:
    """A fetch only locates (the gather reads later): with the advice on, the values it
    located arrive meanwhile; off, nothing is read until the gather faults them in."""
    db, s = open_strategy(Indexed, cifar_like, advise=advise)
    plan = plan_epoch(len(db), 1, BATCH)
    ids = plan.records(5, 0)
    _cold(cifar_like, db)
    s.read_ahead(plan, 5, ids)
    refs = s.fetch(plan, 5, ids, IterationStats(5))
    pages = refs.value_pages(db.psize)
    assert pages.min() >= 16
    if advise:  # they arrive (the bound only ends a wait that would never end)
        assert _eventually(
            lambda: np.isin(pages, _resident_db_pages(cifar_like, db)).all(), seconds=60.0)
    else:  # no read was asked for: none of them is in the page cache
        assert not np.isin(pages, _resident_db_pages(cifar_like, db)).any()


def test_dm_spec_reads_ahead_exactly_what_its_next_fetch_prefetches(cifar_like, open_strategy,
                                                                     monkeypatch) -> None:
    """Before every regular iteration, read-ahead advises the ranges that iteration's fetch
    then touches (same estimate, same state); at a new estimate (the epoch's start, records
    that do not continue the previous ones) it advises nothing."""
    db, s = open_strategy(DmSpec, cifar_like)
    plan = plan_epoch(len(db), 1, BATCH)
    advised: list[tuple[list, list]] = []
    touched: list[tuple[list, list]] = []
    # the kernel was asked (True): the fetch then touches what it asked for
    monkeypatch.setattr(s, "advise_pages", lambda a, b: (advised.append(
        (np.asarray(a).tolist(), np.asarray(b).tolist())), True)[1])
    real_touch = pf.touch_page_ranges
    monkeypatch.setattr(pf, "touch_page_ranges", lambda t, a, b, p: (
        touched.append((np.asarray(a).tolist(), np.asarray(b).tolist())),
        real_touch(t, a, b, p))[1])
    s.begin_epoch(plan)
    compared = far = 0
    for it in range(plan.iterations):
        ids = plan.records(it, 0)
        if it:
            advised.clear()
            s.read_ahead(plan, it, ids)
            ahead = list(advised)
            # the fetch takes read-ahead's estimate: it is the one it would compute
            starts, lengths, *_ = s._ranges(ids)
            assert ahead == [(starts.tolist(), lengths.tolist())], f"iteration {it}"
        advised.clear()
        touched.clear()
        db.accounting.reset()
        s.fetch(plan, it, ids, IterationStats(it))
        assert len(touched) == 1
        if it:  # what read-ahead asked for is not asked for again (missed values may be)
            assert ahead[0] not in advised, f"iteration {it}"
        if it:
            # besides: the values out of sequence that the share's leaves name, asked
            # for by the fetch (first) and prefetched with the rest
            (a_starts, a_lengths), (t_starts, t_lengths) = ahead[0], touched[0]
            n = len(a_starts)
            assert (t_starts[:n], t_lengths[:n]) == (a_starts, a_lengths), f"iteration {it}"
            if len(t_starts) > n:
                assert advised[0] == (t_starts[n:], t_lengths[n:]), f"iteration {it}"
                far += 1
            compared += 1
    assert compared == plan.iterations - 1
    assert far > 0  # committed 100 at a time: values in pages freed by earlier commits
    # records that do not continue the previous ones: no advice (a fresh estimate follows)
    advised.clear()
    s.read_ahead(plan, 2, plan.records(2, 0))
    assert advised == []


def test_indexed_asks_for_nothing_on_a_warm_file(cifar_like, open_strategy,
                                                monkeypatch) -> None:
    """Every page in the page cache: a sample of the slot's leaves and one of its values
    say so, and neither the leaves' nor the values' runs are built and asked for."""
    db, s = open_strategy(Indexed, cifar_like)
    db.advise_access(pf.MADV_RANDOM)
    gather_refs(db, db.locate(np.arange(len(db))))  # every page read: the file is warm
    asked: list = []
    monkeypatch.setattr(s, "advise_pages", lambda a, b: asked.append(a))
    plan = plan_epoch(len(db), 1, BATCH)
    s.fetch(plan, 0, plan.records(0, 0), IterationStats(0))
    s.read_ahead(plan, 1, plan.records(1, 0))
    s.fetch(plan, 1, plan.records(1, 0), IterationStats(1))
    assert asked == []
    assert s.resident_skips == 4  # leaves and values of the first slot, then the next's


def test_indexed_asks_for_the_leaves_of_a_slot_it_did_not_read_ahead(tmp_path, open_strategy,
                                                                       monkeypatch) -> None:
    """Without read-around, indexed's fetch of records that were not read ahead (an
    epoch's first slot) first asks for their leaf pages, merged into runs; records read
    ahead are not asked for twice. Inline values: five to a leaf page."""
    write_db(tmp_path, random_items(400, 700, seed=5), commit_every=100)
    db, s = open_strategy(Indexed, tmp_path)
    db.advise_access(pf.MADV_RANDOM)
    plan = plan_epoch(len(db), 1, 64)
    advised: list[list[int]] = []
    monkeypatch.setattr(s, "advise_pages", lambda a, b: advised.append(
        sorted(set(np.repeat(np.asarray(a), np.asarray(b)).tolist()))))
    # the file was just written (warm): what is asked for, as if it were not
    monkeypatch.setattr(s, "cached_sample", lambda pages, samples=16: False)
    leaves, first = db.leaves(), db.leaf_directory()

    def leaves_of(ids: np.ndarray) -> list[int]:
        return sorted(set(leaves[np.searchsorted(first, ids, "right") - 1].tolist()))

    ids = plan.records(0, 0)
    s.fetch(plan, 0, ids, IterationStats(0))
    assert advised == [leaves_of(ids)] and len(advised[0]) > 1
    advised.clear()
    nxt = plan.records(1, 0)
    s.read_ahead(plan, 1, nxt)
    assert advised == [leaves_of(nxt)]  # inline values: nothing else to ask for
    advised.clear()
    s.fetch(plan, 1, nxt, IterationStats(1))
    assert advised == []


@pytest.mark.parametrize("advise, asked", [(True, True), (True, False), (False, False)])
def test_dm_spec_waits_for_its_prefetch_after_the_cursor_has_gone_on(
        cifar_like, open_strategy, monkeypatch, advise, asked) -> None:
    """With advice, dm-spec asks for its pages before the chain and touches them (waits
    for the reads) after its walk has passed the cursor on; without advice the touch is
    the read, before the chain, as in the paper. With advice but every page in the page
    cache already (the kernel was not asked: a warm file) there is nothing to wait for and
    nothing is touched."""
    db, s = open_strategy(DmSpec, cifar_like, advise=advise)
    plan = plan_epoch(len(db), 1, BATCH)
    order: list[str] = []
    monkeypatch.setattr(s, "advise_pages", lambda a, b: (order.append("advise"), asked)[1])
    real_touch, real_walk = pf.touch_page_ranges, s.walk_share
    monkeypatch.setattr(pf, "touch_page_ranges", lambda *a: (order.append("touch"),
                                                             real_touch(*a))[1])
    monkeypatch.setattr(s, "walk_share", lambda *a, **k: (order.append("walk"),
                                                          real_walk(*a, **k))[1])
    s.begin_epoch(plan)
    for it in range(3):
        order.clear()
        s.fetch(plan, it, plan.records(it, 0), IterationStats(it))
        assert order[0] == "advise", order  # asked for first (a no-op without advice)
        if advise and not asked:
            assert "touch" not in order, order
            continue
        walked, touched = order.index("walk"), order.index("touch")
        assert (touched > walked) == advise, order


def test_dm_spec_asks_for_the_leaves_after_a_blind_guess(tmp_path, open_strategy,
                                                          monkeypatch) -> None:
    """Estimates alone (no placement): at an epoch's start (the first guess, nothing
    observed) dm-spec asks, before its walk, for the leaves the walk will read: the first
    leaf's siblings under its parent branch page, as many as the share fills at the
    database's records per leaf; once the estimate has observed iterations it does not."""
    write_db(tmp_path, random_items(3000, 700, seed=9), commit_every=500)
    db, s = open_strategy(DmSpec, tmp_path)
    s.placement = False
    assert db.db.depth >= 2
    plan = plan_epoch(len(db), 1, 64)
    asked: list[list[int]] = []
    real_advise = s.advise_pages
    monkeypatch.setattr(s, "advise_pages", lambda a, b: (asked.append(
        np.repeat(np.asarray(a), np.asarray(b)).tolist()), real_advise(a, b))[1])
    s.begin_epoch(plan)
    cur = db.cursor()
    cur.first()
    parent, slot = cur.stack[-2]
    ids = plan.records(0, 0)
    per_leaf = db.db.entries / db.db.leaf_pages
    expect = db.branch_children(parent)[slot:slot + int(ids.size / per_leaf * 1.25) + 2]
    s.fetch(plan, 0, ids, IterationStats(0))
    assert expect.tolist() in asked
    # the leaves of the records read: among those asked for
    assert set(db.leaves()[:int(np.ceil(ids.size / per_leaf))].tolist()) <= set(expect.tolist())
    for it in (1, 2, 3):
        asked.clear()
        s.fetch(plan, it, plan.records(it, 0), IterationStats(it))
    assert not any(a == db.branch_children(parent)[:len(a)].tolist() for a in asked)


def test_dm_spec_first_guess_on_inline_values_covers_their_leaves(tmp_path,
                                                                   open_strategy) -> None:
    """The first guess for inline values (five to a leaf page here), from the meta pages
    and from where the last walk ended: it covers nearly all the leaves the records are
    on and prefetches little else ("every record the size of the first one" would have
    asked for a page per record, five times too many, and mostly elsewhere)."""
    write_db(tmp_path, random_items(3000, 700, seed=9), commit_every=500)
    db, s = open_strategy(DmSpec, tmp_path)
    s.begin_epoch(plan_epoch(len(db), 1, 64))
    table = db.record_table()
    pages = table.val_off // db.psize

    def check(first: int, count: int) -> None:
        start, length = s._inline_guess(first, count)
        need = np.unique(pages[first:first + count])
        covered = np.count_nonzero((need >= start) & (need < start + length))
        assert covered >= 0.9 * need.size, (first, start, length, need[[0, -1]])
        assert length <= 1.25 * need.size + 4

    for first in (0, 400, 1200):
        check(first, 256)
    s._anchor = (int(pages[1000]), 1000)  # a walk ended on record 1000
    check(1300, 256)


def _epoch_stats(db: Database, s: DmSpec, batch: int, whole: bool = False
                 ) -> list[IterationStats]:
    """One reader's epoch in key order, up to the padded wrap-around (``whole``: with it):
    each iteration's fetch statistics, read-ahead before each after the first."""
    plan = plan_epoch(len(db), 1, batch)
    s.begin_epoch(plan)
    got = []
    for it in range(plan.iterations - (len(db) % batch > 0 and not whole)):
        ids = plan.records(it, 0)
        if it:
            s.read_ahead(plan, it, ids)
        db.accounting.reset()
        stats = IterationStats(it)
        s.fetch(plan, it, ids, stats)
        got.append(stats)
    return got


def _epoch_pages(db: Database, s: DmSpec, batch: int) -> list[tuple[int, int]]:
    """:func:`_epoch_stats`' ``(missed, redundant)`` pages per iteration."""
    return [(st.missed_pages, st.redundant_pages) for st in _epoch_stats(db, s, batch)]


def _out_of_sequence(db: Database) -> int:
    """Records whose value does not lie between its neighbours' in the file."""
    first = db.record_table().val_off // db.psize
    return int(((first[1:-1] < first[:-2]) | (first[1:-1] > first[2:])).sum())


@pytest.mark.parametrize("scan", [True, False])
def test_dm_spec_prefetches_the_values_a_commit_stored_out_of_sequence(
        cifar_like, open_strategy, monkeypatch, scan) -> None:
    """One reader over an epoch of a file committed 100 records at a time, where later
    commits store a value in a page an earlier one freed, far from its neighbours: the
    share's leaves name those pages, so from the second iteration on no value page is
    missed (one reader: no other reader's records lie between its shares to shift them).
    Without the leaf scan (``scan=False``, the estimate alone) they are missed. (The
    estimates path: the leaves' placement, which names every value through the scan,
    is off.)"""
    from lmdbio.plan.strategies import dm

    if not scan:
        monkeypatch.setattr(dm.FarScan, "missing", lambda self, first, counts:
                            (first[:0], counts[:0]))
    db, s = open_strategy(DmSpec, cifar_like)
    s.placement = False
    assert _out_of_sequence(db) > 0
    missed = [m for m, _ in _epoch_pages(db, s, BATCH)]
    assert (sum(missed[1:]) == 0) == scan, missed


def test_empty_values_need_only_their_leaf(tmp_path, open_strategy) -> None:
    """An empty value is inline; the node nearest a leaf's end ends that page, so its
    value's offset is the next page's first byte. It needs its leaf, not that next page:
    dm-spec misses nothing on a file of empty and 3 KB values (it missed the next pages
    when an empty value stood for the page of its offset)."""
    rng = np.random.default_rng(5)
    items = [(b"%08d_%s" % (i, b"k" * int(rng.integers(0, 40))),
              b"" if rng.random() < 0.3 else rng.bytes(3072)) for i in range(1500)]
    write_db(tmp_path, items, commit_every=500)
    db, s = open_strategy(DmSpec, tmp_path)
    refs = db.record_table()
    empty = refs.val_len == 0
    at_start = empty & (refs.val_off % db.psize == 0)
    assert at_start.any(), "no empty value ends a leaf: the case is not exercised"
    first, counts = RecordRefs(refs.val_off, refs.val_len, refs.leaf_pg, refs.ovf_pages,
                               refs.key_off, refs.key_len).value_page_runs(db.psize)
    np.testing.assert_array_equal(first[empty], refs.leaf_pg[empty])
    assert (counts[empty] == 1).all()
    db.accounting.enable()
    assert [m for m, _ in _epoch_pages(db, s, BATCH)] == [0] * (len(db) // BATCH)


@pytest.mark.parametrize("commit_every", [500, 2000])
def test_dm_spec_names_the_leaves_of_inline_values(tmp_path, open_strategy,
                                                  commit_every) -> None:
    """Inline values (five to a leaf page, a three-level tree): from the first iteration
    on, dm-spec's prefetch is the share's leaves, named in key order (every leaf known
    from the branch pages), whether the file was written in one commit or in four: no
    page missed, none prefetched for nothing (the min/max range of the file's pages it
    used before left 5-19 % of its pages unused)."""
    write_db(tmp_path, random_items(6000, 700, seed=9), commit_every=commit_every)
    db, s = open_strategy(DmSpec, tmp_path)
    assert db.db.depth == 3 and db.db.overflow_pages == 0
    got = _epoch_pages(db, s, 64)
    assert got == [(0, 0)] * len(got)


def test_dm_spec_names_the_values_of_records_of_mixed_sizes(tmp_path, open_strategy) -> None:
    """Values of 2.2-9 KB (one to three overflow pages each) committed 500 at a time: no
    estimate from past iterations knows the sizes of the records not yet walked (the
    min/max range prefetched 15 % of its pages for nothing at 8 ranks), but the leaves
    place the share (full leaves) and name its values: nothing missed and nothing
    prefetched for nothing, from the first iteration on (before any walk, the leaves'
    counts place it from its first record's number)."""
    write_db(tmp_path, random_items(3000, (2200, 9000), seed=11), commit_every=500)
    db, s = open_strategy(DmSpec, tmp_path)
    assert len(set(db.record_table().ovf_pages.tolist())) == 3
    got = _epoch_pages(db, s, 64)
    assert got == [(0, 0)] * len(got), got


@pytest.mark.parametrize("order", ["keys", "random"])
def test_dm_spec_places_shares_through_the_leaf_directory(tmp_path, open_strategy,
                                                          order) -> None:
    """Leaves of uneven counts (keys of many lengths; or the records put in random order,
    values far out of key order): dm-spec reads the leaf directory at the epoch's start
    (saved beside the file as :mod:`~lmdbio.plan.strategies.indexed` saves it) and from
    the first iteration misses nothing and prefetches nothing for nothing. In random
    order the estimates alone (``placement`` off) miss pages (one reader in key order
    they do not: no other reader's records lie between its shares; the MPI test in
    ``test_read_strategies.py`` has two)."""
    from lmdbio.plan.strategies.indexed import sidecar_path

    items = uneven_key_items(1500, seed=3)
    if order == "random":
        items = [items[i] for i in np.random.default_rng(4).permutation(len(items))]
    write_db(tmp_path, items, commit_every=400)
    db, s = open_strategy(DmSpec, tmp_path)
    got = _epoch_pages(db, s, 48)
    assert s._leaf_first is not None and sidecar_path(db).exists()
    assert got == [(0, 0)] * len(got), got
    if order == "random":
        db2, estimates = open_strategy(DmSpec, tmp_path)
        estimates.placement = False
        assert sum(m for m, _ in _epoch_pages(db2, estimates, 48)) > 0


def test_dm_spec_reads_no_directory_where_the_leaves_are_full(cifar_like, open_strategy
                                                              ) -> None:
    """Keys of one length written in key order: every leaf but the last is full, the
    records' numbers place a share, and no leaf directory is read."""
    db, s = open_strategy(DmSpec, cifar_like)
    got = _epoch_pages(db, s, BATCH)
    assert s._leaf_first is None and s._full_count() is not None
    assert got == [(0, 0)] * len(got), got


@pytest.mark.parametrize("n", [640, 650])
def test_dm_spec_names_every_page_of_an_epoch_up_to_its_end(tmp_path, open_strategy,
                                                            n) -> None:
    """One reader, a whole epoch including its last iteration: ending on the file's last
    record (640 = 10 x 64), the walk moves on around to the first leaf; with a padded
    wrap-around (650), the last share's records after it are reached down from the root.
    Every iteration's prefetch holds every value, leaf and branch page it needs and no
    other."""
    write_db(tmp_path, random_items(n, 3072, seed=8), commit_every=100)
    db, s = open_strategy(DmSpec, tmp_path)
    got = [(st.missed_pages, st.missed_walk_pages, st.redundant_pages)
           for st in _epoch_stats(db, s, 64, whole=True)]
    assert len(got) == -(-n // 64) and got == [(0, 0, 0)] * len(got), got


def test_dm_spec_builds_the_directory_when_one_leaf_lost_a_record(tmp_path,
                                                                  open_strategy) -> None:
    """Keys of one length written in key order, then one record of the second leaf
    deleted: the first leaf and the meta page's counts still look like full leaves, but
    the last leaf's count does not add up, so dm-spec reads the leaf directory and places
    every share exactly (counting would put every share after the delete one record
    off)."""
    import lmdb

    write_db(tmp_path, random_items(3000, 3072, seed=5), commit_every=1000)
    with Database(tmp_path) as db:
        second = int(db.leaf_directory()[1])
    env = lmdb.open(str(tmp_path), map_size=1 << 28)
    with env.begin(write=True) as txn:
        assert txn.delete(b"%08d" % (second + 3))
    env.close()
    db, s = open_strategy(DmSpec, tmp_path)
    got = _epoch_pages(db, s, 64)
    assert s._leaf_first is not None
    assert got == [(0, 0)] * len(got), got


def test_warm_file_trust_doubles_up_to_its_cap_and_a_cold_sample_ends_it() -> None:
    """Samples that find the file warm earn calls answered without sampling: 1, 2, 4, ...
    up to WARM_TRUST_MAX; a cold one ends the trust at once."""
    w = WarmFile()
    assert not w.trusted()  # nothing sampled yet: sample

    def credits() -> int:
        n = 0
        while w.trusted():
            n += 1
        return n

    earned = []
    for _ in range(6):
        w.sampled(True)
        earned.append(credits())
    assert earned == [1, 2, 4, 8, 8, 8] and WARM_TRUST_MAX == 8
    w.sampled(True)
    w.sampled(False)  # evicted: sampled again at the very next call
    assert credits() == 0
    w.sampled(True)
    assert credits() == 1  # and the trust is earned again from the start


def test_indexed_samples_a_warm_file_less_often_as_it_stays_warm(
        cifar_like, open_strategy, monkeypatch) -> None:
    """On a warm file, the slots after the first few skip the residency samples (counted
    as resident skips); a sample that finds a page missing brings sampling back."""
    db, s = open_strategy(Indexed, cifar_like)
    db.advise_access(pf.MADV_RANDOM)
    gather_refs(db, db.locate(np.arange(len(db))))  # every page read: the file is warm
    sampled: list[bool] = []
    real = s.cached_sample

    def counting(pages: np.ndarray, samples: int = 16) -> bool:
        sampled.append(True)
        return real(pages, samples)

    monkeypatch.setattr(s, "cached_sample", counting)
    monkeypatch.setattr(s, "advise_pages", lambda a, b: True)
    plan = plan_epoch(len(db), 1, BATCH)
    iterations = min(plan.iterations, 12)
    for it in range(iterations):
        s.fetch(plan, it, plan.records(it, 0), IterationStats(it))
        s.read_ahead(plan, it + 1, plan.records((it + 1) % plan.iterations, 0))
    asks = 2 + 2 * iterations  # leaves and values of the first slot, then of each next
    assert s.resident_skips == asks  # every one answered "warm", sampled or trusted
    assert 0 < len(sampled) < asks // 2


def test_a_file_whose_residency_mincore_hides_is_advised_as_a_cold_one(
        cifar_like, open_strategy, monkeypatch) -> None:
    """mincore shows a process that neither owns nor may write a file every page of it
    resident (Linux 5.2+): on such a file (another user's read-only data set) the samples
    would always find it warm and nothing would ever be advised. The strategy asks for
    its pages as on a cold file instead; with residency reported, a warm file is not."""
    db, s = open_strategy(Indexed, cifar_like)
    gather_refs(db, db.locate(np.arange(len(db))))  # every page read: the file is warm
    asked: list[int] = []
    monkeypatch.setattr(base, "advise_page_ranges",
                        lambda buf, starts, counts, *a, **k: asked.append(len(starts)))
    pages = np.arange(2, 40, dtype=np.int64)
    assert s.cached_sample(pages) and not s.advise_pages(pages, np.ones_like(pages))
    assert asked == []
    monkeypatch.setattr(base, "residency_is_reported", lambda path: False)
    _, hidden = open_strategy(Indexed, cifar_like)
    assert not hidden.cached_sample(pages) and not hidden.trusts_warm()
    assert hidden.advise_pages(pages, np.ones_like(pages)) and asked == [len(pages)]
    assert hidden.resident_skips == 0
