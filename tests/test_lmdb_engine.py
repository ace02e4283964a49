"""The page engine reads exactly what py-lmdb (the C library) reads."""

from __future__ import annotations

import hashlib
import os
import sys

import lmdb
import numpy as np
import pytest

import lmdbio
from bench.lmdbgen import NODEMAX_4K, churn_db, random_items, read_pylmdb, write_db
from lmdbio.errors import LmdbFormatError, LmdbioError
from lmdbio.io.gather import check_value_spans, gather, gather_batch, gather_keys, gather_refs
from lmdbio.lmdb.free_pages import free_list
from tests.conftest import shared_lmdbs

STAT_KEYS = ("psize", "depth", "branch_pages", "leaf_pages", "overflow_pages", "entries")
FINGERPRINTS = {
    "caffe-3x20x20-inline": "cb905ffa268b0584",
    "caffe-3x256x256-overflow": "d94a029040793acc",
    "caffe-3x32x32-depth2": "865fa68e92461fe2",
    "plain-multicommit": "a6e17b1c2cb767b0",
}


def pylmdb_stat(path, subdb=None):
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=8)
    try:
        db = env.open_db(subdb, create=False) if subdb else None
        with env.begin() as txn:
            return txn.stat(db) if db is not None else env.stat()
    finally:
        env.close()


def assert_same_as_pylmdb(path, subdb=None):
    expected = read_pylmdb(path, subdb)
    with lmdbio.open(path, subdb=subdb) as db:
        got = [(k, bytes(v)) for k, v in db.items()]
        assert got == expected
        assert len(db) == len(expected)
        st = db.stat()
        ref = pylmdb_stat(path, subdb)
        assert {k: st[k] for k in STAT_KEYS} == {k: ref[k] for k in STAT_KEYS}
    return expected


@pytest.mark.parametrize("path", shared_lmdbs(), ids=lambda p: p.name)
def test_shared_testdata_matches_pylmdb(path):
    assert_same_as_pylmdb(path)


@pytest.mark.parametrize("path", shared_lmdbs(), ids=lambda p: p.name)
def test_shared_testdata_fingerprint(path):
    h = hashlib.sha256()
    with lmdbio.open(path / "data.mdb") as db:
        for k, v in db.items():
            h.update(k)
            h.update(v)
        assert db.stat()["format_version"] == 1
    assert h.hexdigest()[:16] == FINGERPRINTS[path.name]


def test_shared_multicommit_live_meta(shared_testdata):
    with lmdbio.open(shared_testdata / "lmdb" / "plain-multicommit") as db:
        assert db.stat()["live_meta_page"] == 0
        assert db.stat()["txnid"] == 4


@pytest.mark.parametrize("version", [1, 3])
def test_empty_database(tmp_path, version):
    write_db(tmp_path, [], version=version)
    with lmdbio.open(tmp_path) as db:
        assert len(db) == 0
        assert list(db.items()) == []
        assert not db.cursor().first()
        assert db.stat()["format_version"] == version
        assert gather(db, [])[0].size == 0


@pytest.mark.parametrize("version", [1, 3])
def test_one_record(tmp_path, version):
    write_db(tmp_path, [(b"only", b"value")], version=version)
    assert assert_same_as_pylmdb(tmp_path) == [(b"only", b"value")]


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_overflow_threshold(tmp_path, version, delta):
    key = b"k" * 8
    size = NODEMAX_4K - 8 - len(key) + delta
    items = [(b"a" + key[1:], b"x" * size), (key, bytes(range(256)) * (size // 256) + b"y" *
                                             (size % 256)), (b"z" * 8, b"z" * size)]
    write_db(tmp_path, items, version=version)
    assert_same_as_pylmdb(tmp_path)
    with lmdbio.open(tmp_path) as db:
        overflowing = db.record_table().ovf_pages > 0
        # LMDB 0.9 overflows above nodemax; LMDB 1.0 pads keys, so just agree with py-lmdb
        if version == 1:
            assert overflowing.all() == (delta > 0)


@pytest.mark.parametrize("version", [1, 3])
def test_multi_megabyte_values(tmp_path, version):
    items = random_items(4, 3_000_000, seed=3)
    write_db(tmp_path, items, version=version)
    assert_same_as_pylmdb(tmp_path)


@pytest.mark.parametrize("version", [1, 3])
def test_longest_keys(tmp_path, version):
    items = [(bytes([65 + i]) * 511, b"v%d" % i) for i in range(20)]
    write_db(tmp_path, items, version=version)
    assert_same_as_pylmdb(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("commits", [1999, 2000])
def test_many_commits_with_deletes(tmp_path, version, commits):
    truth = churn_db(tmp_path, commits=commits, version=version)
    assert assert_same_as_pylmdb(tmp_path) == truth
    with lmdbio.open(tmp_path) as db:
        # transaction N writes meta page N % 2 (the first commit is txn 1)
        assert db.stat()["live_meta_page"] == db.stat()["txnid"] % 2


@pytest.mark.parametrize("version", [1, 3])
def test_named_subdatabases(tmp_path, version):
    subs = {b"alpha": random_items(50, (1, 3000), seed=1),
            b"beta": random_items(300, 100, seed=2)}
    write_db(tmp_path, [], version=version, subdbs=subs)
    assert lmdbio.list_databases(tmp_path) == [b"alpha", b"beta"]
    for name in subs:
        assert assert_same_as_pylmdb(tmp_path, name) == sorted(subs[name])
    with pytest.raises(LmdbioError, match="no named database b'gamma'"):
        lmdbio.open(tmp_path, subdb="gamma")


def test_integerkey_and_reversekey_reported(tmp_path):
    ints = [(np.uint64(i * 7919 % 1000).tobytes(), b"%d" % i) for i in range(400)]
    rev = [(b"%dx" % i, b"v") for i in range(200)]
    write_db(tmp_path, [], subdbs={b"ints": ints, b"rev": rev},
             flags={b"ints": {"integerkey": True}, b"rev": {"reverse_key": True}})
    with lmdbio.open(tmp_path, subdb=b"ints") as db:
        assert "INTEGERKEY" in db.stat()["flags"]
        got = [(k, bytes(v)) for k, v in db.items()]
        assert got == read_pylmdb(tmp_path, b"ints")
        cur = db.cursor()
        for k, _v in ints[::37]:
            assert cur.set_key(k) and cur.key() == k
        assert cur.set_range(np.uint64(1000).tobytes()) is False
    with lmdbio.open(tmp_path, subdb=b"rev") as db:
        assert "REVERSEKEY" in db.stat()["flags"]
        assert [(k, bytes(v)) for k, v in db.items()] == read_pylmdb(tmp_path, b"rev")
        assert db.get(b"17x") is not None and db.get(b"17") is None


def test_dupsort_refused_clearly(tmp_path):
    env = lmdb.open(str(tmp_path), max_dbs=2)
    d = env.open_db(b"dups", dupsort=True)
    with env.begin(write=True, db=d) as txn:
        txn.put(b"a", b"1")
        txn.put(b"a", b"2")
    env.close()
    with pytest.raises(LmdbioError, match="DUPSORT"):
        lmdbio.open(tmp_path, subdb=b"dups")


def test_missing_and_non_lmdb_files(tmp_path):
    with pytest.raises(LmdbioError, match="no such LMDB file"):
        lmdbio.open(tmp_path / "nope")
    (tmp_path / "data.mdb").write_bytes(b"")
    with pytest.raises(LmdbFormatError, match="empty file"):
        lmdbio.open(tmp_path)
    (tmp_path / "data.mdb").write_bytes(b"\0" * 8192)
    with pytest.raises(LmdbFormatError, match="not an LMDB data file"):
        lmdbio.open(tmp_path)


@pytest.fixture(scope="module", params=[1, 3])
def medium_db(tmp_path_factory, request):
    path = tmp_path_factory.mktemp(f"medium-v{request.param}")
    items = write_db(path, random_items(3000, (1, 6000), seed=7), version=request.param,
                     commit_every=250)
    return path, items


def test_record_table_ranges_and_gather(medium_db):
    path, items = medium_db
    with lmdbio.open(path) as db:
        full = db.record_table()
        for start, stop in [(0, 1), (5, 900), (1234, 3000), (2999, 3000), (100, 100)]:
            part = db.record_table(start, stop)
            assert part.start == start
            np.testing.assert_array_equal(part.val_off, full.val_off[start:stop])
        idx = np.array([5, 0, 2999, 17, 17, 1500])
        buf, off = gather(db, idx)
        for t, i in enumerate(idx):
            assert bytes(buf[off[t]:off[t + 1]]) == items[i][1]
        buf, off = gather(db, idx, prefix=100)
        for t, i in enumerate(idx):
            assert bytes(buf[off[t]:off[t + 1]]) == items[i][1][:100]
        first = db.leaf_directory()
        assert first[0] == 0 and first[-1] == len(items)
        with pytest.raises(IndexError):
            gather(db, [3000])


def test_gather_into_small_buffer_is_an_error(medium_db):
    path, _items = medium_db
    with lmdbio.open(path) as db, pytest.raises(LmdbioError, match="output buffer"):
        gather(db, range(10), out=np.empty(10, np.uint8))


def test_cursor_moves_match_items(medium_db):
    path, items = medium_db
    with lmdbio.open(path) as db:
        cur = db.cursor()
        forward = []
        ok = cur.first()
        while ok:
            forward.append((cur.key(), bytes(cur.value())))
            ok = cur.next()
        assert forward == items
        backward = []
        ok = cur.last()
        while ok:
            backward.append(cur.key())
            ok = cur.prev()
        assert backward == [k for k, _ in reversed(items)]


def test_cursor_seek_matches_pylmdb(medium_db):
    path, items = medium_db
    keys = [k for k, _ in items]
    env = lmdb.open(str(path), readonly=True, lock=False)
    rng = np.random.default_rng(0)
    probes = [keys[0], keys[-1], b"", b"\xff" * 9] + [
        keys[int(i)][:int(j)] + bytes([int(b)]) for i, j, b in
        zip(rng.integers(0, len(keys), 200), rng.integers(0, 9, 200),
            rng.integers(0, 256, 200), strict=False)]
    with env.begin() as txn, lmdbio.open(path) as db:
        ref = txn.cursor()
        cur = db.cursor()
        for p in probes:
            found = ref.set_range(p)
            assert cur.set_range(p) == found
            if found:
                assert cur.key() == ref.key()
                assert cur.index() == keys.index(ref.key())
            assert cur.set_key(p) == (p in set(keys))
    env.close()


def test_cursor_walk_and_seek_index(medium_db):
    path, items = medium_db
    with lmdbio.open(path) as db:
        cur = db.cursor()
        cur.first()
        pos = 0
        for step in [0, 1, 7, 100, 31, 1000, 1]:
            moved = cur.walk(step)
            pos += moved
            assert moved == step
            assert cur.key() == items[pos][0]
        assert cur.walk(10**6) == len(items) - 1 - pos
        assert cur.eof
        for i in [0, 1, 1499, 2999]:
            assert cur.seek_index(i) and cur.key() == items[i][0] and cur.index() == i
        assert not cur.seek_index(3000)


def test_cursor_bytes_round_trip_everywhere(medium_db):
    path, items = medium_db
    with lmdbio.open(path) as db, lmdbio.open(path, pin_snapshot=False) as other:
        cur = db.cursor()
        ok = cur.first()
        i = 0
        while ok:
            blob = cur.to_bytes()
            again = other.cursor_from_bytes(blob)
            assert again.key() == items[i][0]
            assert again.stack == cur.stack
            if i % 97 == 0 and again.next():
                assert again.key() == items[i + 1][0]
            ok = cur.next()
            i += 1
        assert i == len(items)
        # an exhausted and an unpositioned cursor survive the trip too
        assert other.cursor_from_bytes(cur.to_bytes()).eof
        assert not other.cursor_from_bytes(db.cursor().to_bytes()).initialized


def test_cursor_from_another_snapshot_is_refused(tmp_path):
    write_db(tmp_path, random_items(100, 50))
    with lmdbio.open(tmp_path) as db:
        cur = db.cursor()
        cur.seek_index(10)
        blob = cur.to_bytes()
    env = lmdb.open(str(tmp_path))
    with env.begin(write=True) as txn:
        txn.put(b"new", b"record")
    env.close()
    with lmdbio.open(tmp_path) as db2:
        with pytest.raises(LmdbioError, match="another snapshot"):
            db2.cursor_from_bytes(blob)
        with pytest.raises(LmdbioError, match="not a serialized"):
            db2.cursor_from_bytes(b"X" * 60)


def test_cursor_with_addresses_needs_same_mapping(medium_db):
    path, _ = medium_db
    with lmdbio.open(path) as db:
        db.address = 0x7F0000000000  # as a symmetric mapping would set it
        cur = db.cursor()
        cur.seek_index(42)
        blob = cur.to_bytes()
        assert db.cursor_from_bytes(blob).stack == cur.stack
        with lmdbio.open(path, pin_snapshot=False) as plain, \
                pytest.raises(LmdbioError, match="page addresses"):
            plain.cursor_from_bytes(blob)


def test_accounting_counts_pages(medium_db):
    path, _ = medium_db
    with lmdbio.open(path, accounting=True) as db:
        db.leaf_directory()
        tree_pages = db.accounting.count()
        assert tree_pages == db.stat()["branch_pages"] + db.stat()["leaf_pages"]
        db.accounting.reset()
        t = db.record_table()
        db.accounting.reset()
        gather(db, [0])
        first, last = t.val_off[0] // db.psize, (t.val_off[0] + t.val_len[0] - 1) // db.psize
        assert set(db.accounting.pages()) == set(range(first, last + 1))


@pytest.mark.parametrize("seed", range(6))
def test_account_records_equals_the_set_operations(seed):
    """The compiled per-iteration accounting gives what numpy's set operations give (pages
    touched, pages of the records: leaves and every value page, touched beyond them), or-s
    the totals and leaves its scratch bitmap zeroed."""
    from lmdbio.lmdb.kernels import account_records

    rng = np.random.default_rng(seed)
    npages, psize, n = 300, 4096, int(rng.integers(0, 40))
    touched = (rng.random(npages) < 0.2).astype(np.uint8)
    leaf_pg = rng.integers(2, npages, n)
    val_off = rng.integers(2 * psize, (npages - 10) * psize, n)
    val_len = rng.integers(0, 5 * psize, n)
    scratch, tot_t, tot_o = (np.zeros(npages, np.uint8) for _ in range(3))
    tot_o[5] = 1
    got = account_records(touched, scratch, tot_t, tot_o, leaf_pg, val_off, val_len, psize)
    first = val_off // psize
    last = (val_off + np.maximum(val_len, 1) - 1) // psize
    own = set(leaf_pg.tolist()).union(*(range(a, b + 1) for a, b in zip(first, last, strict=True)))
    pages = set(np.flatnonzero(touched).tolist())
    assert got == (len(pages), len(own), len(pages - own))
    assert not scratch.any()
    assert set(np.flatnonzero(tot_t).tolist()) == pages
    assert set(np.flatnonzero(tot_o).tolist()) == own | {5}


def test_snapshot_pin(tmp_path):
    write_db(tmp_path, random_items(10, 10))  # py-lmdb leaves lock.mdb behind
    assert (tmp_path / "lock.mdb").exists()
    with lmdbio.open(tmp_path) as db:
        st = db.stat()
        assert st["snapshot_pinned"], st["snapshot_pin"]
        # the pin lives in another process: py-lmdb can still open the env here
        assert len(read_pylmdb(tmp_path)) == 10
    (tmp_path / "lock.mdb").unlink()
    with lmdbio.open(tmp_path) as db:
        st = db.stat()
        assert not st["snapshot_pinned"] and "no lock file" in st["snapshot_pin"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and SCHED_IDLE")
def test_snapshot_pin_child_is_idle_keeps_no_descriptor_and_exits_on_close(tmp_path):
    write_db(tmp_path, random_items(10, 10))
    stray = os.open(tmp_path / "data.mdb", os.O_RDONLY)  # as a C library may leave one
    os.set_inheritable(stray, True)
    try:
        with lmdbio.open(tmp_path) as db:
            pinned, why = db._pin_obj.status()
            assert pinned, why
            pid = db._pin_obj._pid
            # the child's start takes only otherwise idle CPU (lmdbio.lmdb.pin)
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE
            targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            # its stdin and stdout pipes, stderr on /dev/null, py-lmdb's own files; not ours
            assert os.readlink(f"/proc/{pid}/fd/2") == os.devnull
            assert sum(t == str(tmp_path / "data.mdb") for t in targets) <= 1
            assert len(targets) <= 5, targets
        assert not os.path.exists(f"/proc/{pid}")  # closing ended and reaped the child
    finally:
        os.close(stray)


def test_snapshot_pin_starts_its_child_after_the_constructor_returns(tmp_path, monkeypatch):
    """posix_spawn waits for the child's exec: the pinning rank must not wait with it (it
    holds up the collective that rank takes part in next). A spawn that fails on the
    starting thread is reported by status(), not raised there."""
    import threading

    from lmdbio.lmdb import pin

    write_db(tmp_path, random_items(10, 10))
    returned = threading.Event()
    real_spawn = pin._spawn

    def spawn_after_return(argv):
        if not returned.wait(10):
            raise OSError("the constructor waited for the spawn")
        return real_spawn(argv)

    monkeypatch.setattr(pin, "_spawn", spawn_after_return)
    with lmdbio.open(tmp_path, pin_snapshot=False) as db:
        txnid = db.meta.txnid
    held = pin.SnapshotPin(tmp_path / "data.mdb", txnid)
    returned.set()
    try:
        pinned, why = held.status()
        assert pinned, why
    finally:
        held.close()

    def failing(argv):
        raise ValueError("no interpreter")

    monkeypatch.setattr(pin, "_spawn", failing)
    held = pin.SnapshotPin(tmp_path / "data.mdb", 1)
    pinned, why = held.status()
    assert not pinned and "no interpreter" in why
    held.close()


def test_walk_collect_and_locate_match_the_record_table(medium_db):
    path, items = medium_db
    with lmdbio.open(path) as db:
        t = db.record_table()
        cur = db.cursor()
        cur.seek_index(100)
        refs, wraps, at_end = db.walk_collect(cur, 500)
        np.testing.assert_array_equal(refs.val_off, t.val_off[100:600])
        assert cur.index() == 600 and wraps == 0 and not at_end
        # past the end: wraps to the start when asked
        cur.seek_index(len(items) - 3)
        refs, wraps, _ = db.walk_collect(cur, 10, wrap=True)
        expect = np.r_[t.val_off[-3:], t.val_off[:7]]
        np.testing.assert_array_equal(refs.val_off, expect)
        assert wraps == 1 and cur.index() == 7
        cur.seek_index(len(items) - 3)
        refs, wraps, at_end = db.walk_collect(cur, 10, wrap=False)
        assert len(refs) == 3 and at_end
        idx = np.array([2999, 0, 5, 1500, 5])
        loc = db.locate(idx)
        np.testing.assert_array_equal(loc.val_off, t.val_off[idx])
        buf, off = gather_refs(db, loc)
        for j, i in enumerate(idx):
            assert bytes(buf[off[j]:off[j + 1]]) == items[i][1]


def test_locate_runs_of_consecutive_records_across_leaves_and_the_end(medium_db):
    """Runs of consecutive records (located leaf to leaf without a search) match the
    record table across every leaf boundary, to the last record, and after a jump back."""
    path, _ = medium_db
    with lmdbio.open(path) as db:
        t = db.record_table()
        n = len(db)
        idx = np.r_[np.arange(n), np.arange(3), np.arange(n - 5, n), 7, 8, 8, 9, 2, 3]
        loc = db.locate(idx)
        for f in ("val_off", "val_len", "leaf_pg", "key_off", "key_len"):
            np.testing.assert_array_equal(getattr(loc, f), getattr(t, f)[idx], err_msg=f)


@pytest.mark.parametrize(("start", "n", "wrap"), [
    (0, 1, False), (100, 500, False), (0, 3000, False), (2990, 10, False),
    (2997, 10, False), (2997, 10, True), (1234, 7000, True), (5, 0, True)])
def test_walk_skip_moves_as_walk_collect_over_the_same_pages(medium_db, start, n, wrap):
    """Skipping ``n`` records leaf by leaf ends where collecting them does, with the same
    wrap count, end flag and pages read, over a multi-level tree and around its end."""
    path, _ = medium_db
    with lmdbio.open(path) as db:
        db.accounting.enable()
        moved = []
        for walk in (db.walk_collect, db.walk_skip):
            cur = db.cursor()
            cur.seek_index(start)
            db.accounting.reset()
            got, wraps, at_end = walk(cur, n, wrap=wrap)
            count = got if isinstance(got, int) else len(got)
            moved.append((count, wraps, at_end, cur.stack, cur.eof,
                          db.accounting.pages().tolist()))
        assert moved[0] == moved[1]
        assert moved[1][0] == (n if wrap else min(n, len(db) - start))


def test_located_records_carry_their_keys(medium_db):
    path, items = medium_db
    with lmdbio.open(path) as db:
        cur = db.cursor()
        cur.seek_index(10)
        refs, _, _ = db.walk_collect(cur, 20)
        koffs, kdata = gather_keys(db, refs)
        assert [bytes(kdata[koffs[i]:koffs[i + 1]]) for i in range(20)] == \
            [k for k, _ in items[10:30]]
        koffs, kdata = gather_keys(db, db.locate(np.array([7, 3])))
        assert bytes(kdata[koffs[0]:koffs[1]]) == items[7][0]


def test_gather_batch_equals_gather_refs_and_keys_of(medium_db):
    path, items = medium_db
    with lmdbio.open(path) as db:
        idx = np.array([2999, 0, 5, 1500, 5, 17])
        refs = db.locate(idx)
        buf, off = gather_refs(db, refs)
        koffs, kdata = gather_keys(db, refs)
        payload = np.full(int(off[-1]) + 10, 0xEE, np.uint8)
        keys = np.full(int(koffs[-1]) + 3, 0xEE, np.uint8)
        offsets = np.full(idx.size + 1, -7, np.int64)
        key_offsets = np.full(idx.size + 1, -7, np.int64)
        nbytes, kbytes = gather_batch(db, refs, payload, offsets, keys, key_offsets)
        assert (nbytes, kbytes) == (int(off[-1]), int(koffs[-1]))
        np.testing.assert_array_equal(offsets, off)
        np.testing.assert_array_equal(key_offsets, koffs)
        assert bytes(payload[:nbytes]) == bytes(buf) and (payload[nbytes:] == 0xEE).all()
        assert bytes(keys[:kbytes]) == bytes(kdata) and (keys[kbytes:] == 0xEE).all()
        for j, i in enumerate(idx):
            assert bytes(keys[key_offsets[j]:key_offsets[j + 1]]) == items[i][0]
        # too small outputs: named, nothing read outside them
        with pytest.raises(LmdbioError, match=f"values holds {nbytes - 1} bytes, {nbytes}"):
            gather_batch(db, refs, payload[:nbytes - 1], offsets, keys, key_offsets)
        with pytest.raises(LmdbioError, match=f"keys holds {kbytes - 1} bytes, {kbytes}"):
            gather_batch(db, refs, payload, offsets, keys[:kbytes - 1], key_offsets)
        with pytest.raises(LmdbioError, match="offset tables"):
            gather_batch(db, refs, payload, offsets[:-1], keys, key_offsets)


def test_gather_batch_names_a_bad_overflow_page(tmp_path):
    import shutil

    src = tmp_path / "src"
    write_db(src, [(b"k%03d" % i, bytes([i]) * 5000) for i in range(4)])
    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    with lmdbio.open(dst) as db:
        refs = db.locate(np.arange(4))
        pg = int((refs.val_off[2] - db.layout.header_size) // db.psize)
    with open(dst / "data.mdb", "r+b") as f:  # the run's first page claims another number
        f.seek(pg * 4096)
        f.write((pg + 1000).to_bytes(8, "little"))
    with lmdbio.open(dst) as db:
        refs = db.locate(np.arange(4))
        out = np.empty(30000, np.uint8)
        offs = np.empty(5, np.int64)
        with pytest.raises(LmdbFormatError, match=f"page {pg}"):
            gather_batch(db, refs, out, offs, np.empty(100, np.uint8), offs.copy())


@pytest.mark.parametrize("damage", ["pgno", "flags", "count"])
def test_check_value_spans_names_a_bad_overflow_page(tmp_path, damage):
    """A consumer handed value spans checks their overflow page headers as a copying
    reader does (gather_batch): the page number, the overflow flag and the run's page count;
    inline values (spans inside a leaf page) and an intact file pass."""
    import shutil

    src = tmp_path / "src"
    # values 0-3 in overflow runs of two pages, 4-5 inline in a leaf
    items = [(b"k%03d" % i, bytes([i]) * (5000 if i < 4 else 40)) for i in range(6)]
    write_db(src, items)
    with lmdbio.open(src) as db:
        refs = db.locate(np.arange(6))
        assert (refs.ovf_pages[:4] == 2).all() and (refs.ovf_pages[4:] == 0).all()
        check_value_spans(db, refs.val_off, refs.val_len)  # intact: nothing raised
        pg = int((refs.val_off[2] - db.layout.header_size) // db.psize)
        layout = db.layout
    dst = tmp_path / "bad"
    shutil.copytree(src, dst)
    with open(dst / "data.mdb", "r+b") as f:
        if damage == "pgno":  # the run's first page claims another number
            f.seek(pg * 4096)
            f.write((pg + 1000).to_bytes(8, "little"))
        elif damage == "flags":  # a leaf's flags instead of P_OVERFLOW
            f.seek(pg * 4096 + layout.flags_off)
            f.write((0x02).to_bytes(2, "little"))
        else:  # a run of one page for a value of two
            f.seek(pg * 4096 + layout.lower_off)
            f.write((1).to_bytes(4, "little"))
    with lmdbio.open(dst) as db:
        spans = (refs.val_off.copy(), refs.val_len.copy())
        with pytest.raises(LmdbFormatError, match=f"page {pg}.*overflow page header"):
            check_value_spans(db, *spans)
        # the records before and after the damaged one pass alone, inline ones too
        keep = np.array([0, 1, 3, 4, 5])
        check_value_spans(db, spans[0][keep], spans[1][keep])


def test_leaf_value_runs_match_the_record_table(medium_db):
    """One entry per record on some leaf pages (key order): its overflow run, or its leaf
    page and 0 for an inline value; the pages read are counted; a page that is not a leaf
    is refused with its number."""
    path, _items = medium_db
    with lmdbio.open(path, accounting=True) as db:
        t = db.record_table()
        leaves = db.leaves()
        pick = leaves[[1, 2, len(leaves) // 2]]
        order = np.concatenate([np.flatnonzero(t.leaf_pg == pg) for pg in pick])
        big = t.ovf_pages[order] > 0
        assert 0 < big.sum() < order.size  # the file mixes inline and overflow values
        db.accounting.reset()
        first, counts = db.leaf_value_runs(pick)
        want = np.where(big, (t.val_off[order] - db.layout.header_size) // db.psize,
                        t.leaf_pg[order])
        np.testing.assert_array_equal(first, want)
        np.testing.assert_array_equal(counts, t.ovf_pages[order])
        assert np.flatnonzero(db.accounting.touched).tolist() == sorted(pick.tolist())
        branch = db.db.root
        with pytest.raises(LmdbioError, match=f"page {branch}"):
            db.leaf_value_runs(np.array([pick[0], branch]))


def _tree_and_value_pages(db) -> np.ndarray:
    """Every page the main tree uses: branch, leaf and overflow pages."""
    t = db.record_table()
    big = t.ovf_pages > 0
    first = (t.val_off[big] - db.layout.header_size) // db.psize
    values = np.repeat(first, t.ovf_pages[big]) + (
        np.arange(int(t.ovf_pages[big].sum())) - np.repeat(
            np.cumsum(t.ovf_pages[big]) - t.ovf_pages[big], t.ovf_pages[big]))
    db.accounting.enable()
    db.accounting.reset()
    db._walk(db.db)  # every branch and leaf page, marked
    tree = np.flatnonzero(db.accounting.touched)
    db.accounting.reset()
    return np.union1d(tree, values)


def _mass_delete(path, version: int) -> None:
    """2,000 values of 3 KB, then 1,500 of them deleted in one commit: that commit's
    free-page record lists ~1,500 pages (12 KB: overflow pages), then two more commits."""
    items = write_db(path, random_items(2000, 3072, seed=2), version=version,
                     commit_every=500, map_size=1 << 26)
    kw = {"lib_version": 1} if version == 3 else {}
    env = lmdb.open(str(path), map_size=1 << 26, **kw)
    with env.begin(write=True) as txn:
        for k, _ in items[200:1700]:
            txn.delete(k)
    for extra in range(2):
        with env.begin(write=True) as txn:
            txn.put(b"z%d" % extra, b"v" * 3000)
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("history", ["churn", "mass-delete"])
def test_free_list_and_the_trees_cover_the_file(tmp_path, version, history):
    """After thousands of small commits with deletes (free pages reused) or one commit
    that deleted 1,500 values (a free-page record in overflow pages), every page of the
    file is a meta page, a page of the main tree or of its values, a page of the
    free-page database, or a page it lists as free, and each is only one of them; the
    free database's pages are marked as read."""
    if history == "churn":
        churn_db(tmp_path, commits=1500, seed=3, version=version)
    else:
        _mass_delete(tmp_path, version)
    with lmdbio.open(tmp_path, pin_snapshot=False) as db:
        if history == "mass-delete":
            assert db.meta.free_db.overflow_pages > 0
        used = _tree_and_value_pages(db)
        db.accounting.enable()
        db.accounting.reset()
        free, own = free_list(db)
        assert free.size and own.size
        assert np.flatnonzero(db.accounting.touched).tolist() == own.tolist()
        parts = [np.array([0, 1]), used, own, free]
        everything = np.concatenate(parts)
        assert np.unique(everything).size == everything.size  # disjoint
        assert np.array_equal(np.sort(everything), np.arange(db.meta.last_pg + 1))


def test_free_list_of_a_file_written_in_one_commit_is_empty(tmp_path):
    write_db(tmp_path, random_items(50, 100, seed=1), commit_every=50)
    with lmdbio.open(tmp_path, pin_snapshot=False) as db:
        free, own = free_list(db)
        assert free.size == 0 and own.size == 0


def test_tree_levels_name_every_page_and_refuse_a_page_named_twice(tmp_path):
    """A three-level tree's levels from its root, each in key order, and each leaf's
    parent, reading branch pages only; a root that names one child twice (a corrupt
    file) is refused with its page, not followed into levels that grow without bound."""
    from lmdbio.lmdb import kernels as k

    path = tmp_path / "db"
    write_db(path, random_items(300, 3072, seed=4, key_fmt="%0400d"), commit_every=300)
    with lmdbio.open(path, pin_snapshot=False, accounting=True) as db:
        assert db.db.depth == 3
        leaves = db.leaves()
        db.accounting.reset()
        levels, parents = db.tree_levels()
        assert [lv.size for lv in levels][:1] == [1] and levels[0][0] == db.db.root
        np.testing.assert_array_equal(levels[-1], leaves)
        assert parents.size == levels[-1].size and set(parents.tolist()) == set(levels[1].tolist())
        branches = np.concatenate(levels[:-1])
        assert np.flatnonzero(db.accounting.touched).tolist() == sorted(branches.tolist())
        root, psize, fmt = db.db.root, db.psize, db.fmt
        second = k.node_offset(db.buf, fmt, root * psize, 1)
        first_child = int(levels[1][0])
    data = bytearray((path / "data.mdb").read_bytes())
    data[second:second + 6] = (first_child & 0xFFFF).to_bytes(2, "little") + \
        ((first_child >> 16) & 0xFFFF).to_bytes(2, "little") + \
        ((first_child >> 32) & 0xFFFF).to_bytes(2, "little")
    (path / "data.mdb").write_bytes(bytes(data))
    with lmdbio.open(path, pin_snapshot=False) as db, \
            pytest.raises(LmdbFormatError, match=f"page {root}: page reached twice"):
        db.tree_levels()
