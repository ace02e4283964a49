"""lmdbio.io.prefetch: touch, madvise, fadvise, pread prefetch, mincore and O_DIRECT reads.

Page-cache tests work on a real file in pytest's tmp directory. Where that directory is on a
file system without an evictable page cache (tmpfs: the cache *is* the file), the tests that
need eviction are skipped, because nothing there can become non-resident.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdbio.errors import LmdbioError
from lmdbio.io import prefetch as pf
from lmdbio.io.symmap import map_file
from tests.page_tables import in_page_tables, needs_populate

PAGE = pf.OS_PAGE_SIZE
N_PAGES = 600


def _fs_type(path: Path) -> str:
    best, fstype = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            _, mnt, typ, *_ = line.split()
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, fstype = mnt, typ
    return fstype


def _eventually(check, timeout: float = 15.0) -> bool:
    """Poll ``check()`` until true or ``timeout``: read-ahead advice is asynchronous."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A generated file of N_PAGES OS pages plus 100 bytes of random data."""
    path = tmp_path_factory.mktemp("prefetch") / "generated.bin"
    arr = np.random.default_rng(11).integers(0, 256, N_PAGES * PAGE + 100, dtype=np.uint8)
    arr.tofile(path)
    return path, arr


@pytest.fixture()
def cold(data) -> tuple[Path, np.ndarray]:
    """The data file evicted from the page cache (skip where eviction is impossible)."""
    path, arr = data
    pf.drop_cache(path)
    if pf.resident_count(path) != 0:
        pytest.skip(f"{_fs_type(path) or 'this file system'} keeps the file resident")
    return path, arr


def test_touch_checksum_is_one_byte_per_page(data) -> None:
    path, arr = data
    with map_file(path) as m:
        expected = int(arr[::PAGE].astype(np.uint64).sum())
        assert pf.touch(m) == expected
        # an unaligned range: its first byte, then the first byte of every later page
        start, stop = 1000, 5 * PAGE + 17
        idx = [start, *range(PAGE, stop, PAGE)]
        assert pf.touch(m, start, stop - start) == int(arr[idx].astype(np.uint64).sum())
        assert pf.touch(m, 10, 0) == 0
        # works on any contiguous uint8 array too
        assert pf.touch(arr) == expected
        with pytest.raises(LmdbioError, match="outside"):
            pf.touch(m, len(arr) - 1, 2)
        with pytest.raises(LmdbioError, match="uint8"):
            pf.touch(np.zeros(10, dtype=np.int32))


def test_touch_faults_pages_in(cold) -> None:
    path, _ = cold
    with map_file(path) as m:
        pf.touch_pages(m, 10, 20, PAGE)
        resident = pf.resident_pages(m)
        assert resident.shape == (N_PAGES + 1,)
        assert resident[10:30].all() and resident.sum() >= 20
        # the query through a path sees the same page cache
        assert pf.resident_pages(path)[10:30].all()


def test_touch_page_ranges(data) -> None:
    path, arr = data
    psize = 2 * PAGE  # a database page size larger than the OS page
    with map_file(path) as m:
        starts, counts = [0, 100, 50], [2, 3, 0]
        pages = [0, 1, 2, 3, 200, 201, 202, 203, 204, 205]  # OS pages covered
        want = int(arr[[p * PAGE for p in pages]].astype(np.uint64).sum())
        assert pf.touch_page_ranges(m, starts, counts, psize) == want
        with pytest.raises(LmdbioError, match="range 1"):
            pf.touch_page_ranges(m, [0, N_PAGES], [1, 1], psize)
        with pytest.raises(LmdbioError, match="range 0"):
            pf.touch_page_ranges(m, [-1], [1], psize)
        with pytest.raises(LmdbioError, match="2 starts but 1 counts"):
            pf.touch_page_ranges(m, [0, 1], [1], psize)


def test_madvise_willneed_and_dontneed(cold) -> None:
    path, _ = cold
    with map_file(path) as m:
        pf.advise(m, 100 * PAGE + 5, 40 * PAGE)  # unaligned start: rounded down
        # WILLNEED starts read-ahead and returns; the pages arrive asynchronously
        assert _eventually(lambda: pf.resident_pages(m, 100 * PAGE, 40 * PAGE).all())
        pf.advise(m, advice=pf.MADV_RANDOM)
        with pytest.raises(LmdbioError, match="outside"):
            pf.advise(m, 0, len(m) + 1)


def test_prefetch_makes_ranges_resident(cold) -> None:
    path, arr = cold
    with map_file(path) as m:
        # returns only when the pages are there (the touch waits for the advised reads)
        assert pf.prefetch(m, 7 * PAGE, 9 * PAGE) == int(
            arr[7 * PAGE : 16 * PAGE : PAGE].astype(np.uint64).sum()
        )
        res = pf.resident_pages(m)
        assert res[7:16].all()
        psize = 2 * PAGE
        starts, counts = [200, 201, 100, 150], [3, 1, 2, 0]  # overlapping, unsorted, empty
        want = pf.touch_page_ranges(arr, starts, counts, psize)
        assert pf.prefetch_pages(m, starts, counts, psize) == want
        res = pf.resident_pages(m)
        assert res[400:406].all() and res[200:204].all()
        with pytest.raises(LmdbioError, match="range 1"):
            pf.prefetch_pages(m, [0, N_PAGES], [1, 1], PAGE)


def test_advise_page_ranges_reads_runs_without_read_around(cold) -> None:
    """WILLNEED on the array over a mapping (as strategies hold it) makes exactly the merged
    runs resident, with the mapping's read-around off (LMDB's MDB_NORDAHEAD), without
    touching a page; one madvise per merged run."""
    path, _ = cold
    psize = 2 * PAGE
    with map_file(path) as m:
        pf.advise(m, advice=pf.MADV_RANDOM)
        assert pf.resident_pages(m).sum() == 0
        starts, counts = [60, 10, 12, 40], [4, 2, 3, 0]  # [10,15) merged, [60,64), empty
        assert pf.advise_page_ranges(m.array, starts, counts, psize) == 2
        want = np.zeros(N_PAGES + 1, bool)  # the file's last, partial OS page included
        want[20:30] = want[120:128] = True
        assert _eventually(lambda: (pf.resident_pages(m) == want).all())
        with pytest.raises(LmdbioError, match="range 1"):
            pf.advise_page_ranges(m.array, [0, N_PAGES], [1, 1], PAGE)
        assert pf.advise_page_ranges(m.array, [], [], psize) == 0


def test_advice_in_pieces_no_larger_than_one_willneed_reads(cold) -> None:
    """Runs larger than what one WILLNEED call reads (the kernel cuts it to the device's
    read-ahead limit) are advised in pieces of at most that: the whole run is read."""
    path, _ = cold
    limit = pf.readahead_limit(path)
    assert limit >= PAGE and limit % PAGE == 0
    with map_file(path) as m:
        pf.advise(m, advice=pf.MADV_RANDOM)
        # 3 pieces of 4 pages, plus 1 page: 4 calls (the split itself is checked by the
        # count; a limit that is not whole pages is rounded down to them)
        assert pf.advise_page_ranges(m.array, [20], [13], PAGE, max_bytes=4 * PAGE) == 4
        assert pf.advise_page_ranges(m.array, [20], [13], PAGE,
                                     max_bytes=5 * PAGE - 100) == 4
        want = np.zeros(N_PAGES + 1, bool)
        want[20:33] = True
        assert _eventually(lambda: (pf.resident_pages(m) == want).all())


@pytest.mark.parametrize("samples", [16, 1, None])
def test_pages_resident_sees_the_page_cache(cold, samples) -> None:
    """A cold file's pages are not resident; once one range is read it is, the ranges around
    it still are not (whether every page is checked or a sample); no pages count as
    resident; bad ranges raise."""
    path, _ = cold
    with map_file(path) as m:
        pf.advise(m, advice=pf.MADV_RANDOM)
        assert not pf.pages_resident(m.array, [10], [8], PAGE, samples=samples)
        pf.touch_page_ranges(m.array, [10], [8], PAGE)
        assert pf.pages_resident(m.array, [10, 12], [8, 2], PAGE, samples=samples)
        assert pf.pages_resident(m.array, [10, 40], [8, 0], PAGE, samples=samples)
        assert pf.pages_resident(m.array, [], [], PAGE, samples=samples)
        if samples != 1:  # one sample looks at the first page only
            assert not pf.pages_resident(m.array, [10, 60], [8, 1], PAGE, samples=samples)
            assert not pf.pages_resident(m.array, [4], [7], PAGE, samples=samples)
        with pytest.raises(LmdbioError, match="range 0"):
            pf.pages_resident(m.array, [N_PAGES], [1], PAGE, samples=samples)


def test_pages_resident_samples_spread_over_the_ranges(cold) -> None:
    """More pages than samples: the sample spans every range and includes the last page (where
    an estimate runs out), so a missing last page or a missing page a pick lands on is seen."""
    path, _ = cold
    with map_file(path) as m:
        pf.advise(m, advice=pf.MADV_RANDOM)
        pf.touch_page_ranges(m.array, [10, 13], [2, 27], PAGE)  # pages 10-11, 13-39
        assert pf.pages_resident(m.array, [10, 13], [2, 27], PAGE, samples=16)
        assert not pf.pages_resident(m.array, [10, 13], [2, 28], PAGE, samples=16)  # 40
        # 30 pages, 16 picks at (2i + 1) * 30 // 32: the second is page 12, not resident
        assert not pf.pages_resident(m.array, [10], [30], PAGE, samples=16)
        assert not pf.pages_resident(m.array, [10], [30], PAGE, samples=None)


def test_readahead_limit_falls_back_without_a_block_device(tmp_path: Path) -> None:
    assert pf.readahead_limit(tmp_path / "missing") == pf.DEFAULT_READAHEAD_LIMIT
    assert pf.readahead_limit("/proc/self/status") == pf.DEFAULT_READAHEAD_LIMIT


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 30)), max_size=8),
       st.integers(1, 9))
def test_split_runs_cover_each_run_in_pieces(runs: list[tuple[int, int]], chunk: int) -> None:
    starts = np.array([a for a, _ in runs], dtype=np.int64)
    stops = np.array([a + n for a, n in runs], dtype=np.int64)
    first, last = pf._split_runs(starts, stops, chunk)
    assert ((last - first) <= chunk).all() and ((last - first) > 0).all()
    pieces = iter(zip(first.tolist(), last.tolist(), strict=True))
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        at = a
        while at < b:  # the run's pieces, in order, back to back
            got = next(pieces)
            assert got[0] == at
            at = got[1]
        assert at == b


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), max_size=12))
def test_merge_ranges_is_the_union(ranges: list[tuple[int, int]]) -> None:
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    stops = np.array([a + n for a, n in ranges], dtype=np.int64)
    ms, me = pf.merge_ranges(starts, stops)
    covered = set()
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        covered.update(range(a, b))
    merged = set()
    for a, b in zip(ms.tolist(), me.tolist(), strict=True):
        assert a < b
        merged.update(range(a, b))
    assert merged == covered
    assert (ms[1:] > me[:-1]).all()  # disjoint, sorted, not even touching


def test_fadvise_and_pread_prefetch(cold) -> None:
    path, arr = cold
    pf.fadvise_willneed(path, 0, 8 * PAGE)
    assert _eventually(lambda: pf.resident_pages(path)[:8].all())
    pf.drop_cache(path)
    n = pf.pread_prefetch(path, [300 * PAGE, 400 * PAGE + 7], [10 * PAGE, 3 * PAGE], chunk=PAGE)
    assert n == 13 * PAGE
    res = pf.resident_pages(path)  # pread is synchronous: resident on return
    assert res[300:310].all() and res[400:404].all()
    with pytest.raises(LmdbioError, match="outside"):
        pf.pread_prefetch(path, [len(arr) - 10], [11])


def test_drop_cache_evicts_mapped_file(cold) -> None:
    path, _ = cold
    with map_file(path) as m:
        pf.touch(m)
        assert pf.resident_count(m) == N_PAGES + 1
        pf.drop_cache(m)  # drops this process's mappings first, then the cache
        assert pf.resident_count(m) == 0


def test_resident_pages_of_empty_and_missing(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert pf.resident_pages(empty).shape == (0,)
    with pytest.raises(LmdbioError):
        pf.drop_cache(tmp_path / "missing")


# --------------------------------------------------------------------------- O_DIRECT


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(0, N_PAGES * PAGE + 99), length=st.integers(0, 3 * PAGE + 1))
def test_direct_reader_reads_exact_bytes(data, offset: int, length: int) -> None:
    path, arr = data
    length = min(length, len(arr) - offset)
    with pf.DirectReader(path) as r:
        got = r.read(offset, length)
        assert np.array_equal(got, arr[offset : offset + length])
        if length and r.direct:  # whole aligned blocks were read from the device
            first = offset // PAGE * PAGE
            last = min(-(-(offset + length) // PAGE) * PAGE, len(arr))
            assert r.bytes_read == last - first


def test_direct_reader_bypasses_page_cache(cold) -> None:
    path, arr = cold
    with pf.DirectReader(path) as r:
        if not r.direct:
            pytest.skip("the file system refuses O_DIRECT")
        got = r.read_pages(50, 30, PAGE)
        assert np.array_equal(got, arr[50 * PAGE : 80 * PAGE])
        assert r.bytes_read == 30 * PAGE
        assert pf.resident_count(path) == 0  # nothing went through the page cache


def test_direct_reader_bounds_and_out(data) -> None:
    path, arr = data
    with pf.DirectReader(path) as r:
        tail = r.read(len(arr) - 100, 100)  # the unaligned end of the file
        assert np.array_equal(tail, arr[-100:])
        out = np.zeros(5000, dtype=np.uint8)
        view = r.read(3, 4000, out=out)
        assert view.base is out or view is out or np.shares_memory(view, out)
        assert np.array_equal(out[:4000], arr[3:4003])
        assert r.read(7, 0).shape == (0,)
        with pytest.raises(LmdbioError, match="outside"):
            r.read(len(arr) - 10, 11)
        with pytest.raises(LmdbioError, match="bad page range"):
            r.read_pages(-1, 1, PAGE)
    with pytest.raises(LmdbioError, match="closed"):
        r.read(0, 1)
    r.close()  # twice is fine
    with pytest.raises(LmdbioError, match="power of two"):
        pf.DirectReader(path, alignment=3000)


def test_direct_reader_fallback_when_refused(
    data, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path, arr = data

    def refuse(p: str) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(pf, "open_direct", refuse)
    with caplog.at_level(logging.WARNING, logger="lmdbio.io.prefetch"):
        r = pf.DirectReader(path)
    assert r.direct is False
    assert "refuses O_DIRECT" in caplog.text and "falling back" in caplog.text
    assert np.array_equal(r.read(12345, 20000), arr[12345:32345])
    r.close()
    with pytest.raises(LmdbioError, match="refuses O_DIRECT"):
        pf.DirectReader(path, fallback=False)


def test_direct_reader_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LmdbioError, match="cannot open"):
        pf.DirectReader(tmp_path / "missing")


def _sampled_reference(resident: np.ndarray, starts: list[int], counts: list[int],
                       samples: int) -> bool:
    """The sample :func:`pages_resident` takes, page by page: ``samples`` picks centred among
    the ranges' pages, the last pick on the last page."""
    pages = [s + i for s, c in zip(starts, counts, strict=True) for i in range(c)]
    if not pages:
        return True
    k = min(samples, len(pages))
    picks = [(2 * j + 1) * len(pages) // (2 * k) for j in range(k - 1)] + [len(pages) - 1]
    return all(resident[pages[p]] for p in picks)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 70), st.integers(0, 12)), max_size=6),
       st.sets(st.integers(0, 79), max_size=80), st.integers(1, 20))
def test_pages_resident_sample_is_the_documented_one(ranges, touched, samples) -> None:
    """The compiled sample answers as the picks it documents, over anonymous memory whose
    written pages are the resident ones (pages never written are not)."""
    import mmap

    region = mmap.mmap(-1, 80 * PAGE)
    try:
        arr = np.frombuffer(region, dtype=np.uint8)
        for p in touched:
            arr[p * PAGE] = 1
        resident = pf.libc.mincore(arr.ctypes.data, 80 * PAGE)
        assert resident[sorted(touched)].all() if touched else True
        starts = [a for a, _ in ranges]
        counts = [min(n, 80 - a) for a, n in ranges]
        assert pf.pages_resident(arr, starts, counts, PAGE, samples=samples) == \
            _sampled_reference(resident, starts, counts, samples)
        del arr
    finally:
        region.close()


@pytest.fixture()
def warm(data) -> tuple[Path, np.ndarray]:
    """The data file read through, so that its pages are in the page cache."""
    path, arr = data
    assert path.read_bytes()[-1] == arr[-1]
    return path, arr


@needs_populate
def test_populate_puts_a_warm_file_in_the_page_tables(warm) -> None:
    path, arr = warm
    pages = -(-arr.shape[0] // PAGE)
    with map_file(path) as m:
        addr = pf._as_array(m).ctypes.data
        assert not in_page_tables(addr, pages).any()  # a fresh mapping: nothing yet
        assert pf.populate_if_resident(m, path)
        assert in_page_tables(addr, pages).all()
        assert pf.touch(m) == int(arr[::PAGE].astype(np.uint64).sum())


@needs_populate
def test_populate_leaves_a_file_over_the_limit_to_its_faults(warm) -> None:
    path, arr = warm
    with map_file(path) as m:
        addr = pf._as_array(m).ctypes.data
        assert not pf.populate_if_resident(m, path, max_bytes=arr.shape[0] - 1)
        assert not in_page_tables(addr, -(-arr.shape[0] // PAGE)).any()


@needs_populate
def test_populate_leaves_a_cold_file_unread(cold) -> None:
    path, arr = cold
    with map_file(path) as m:
        addr = pf._as_array(m).ctypes.data
        assert not pf.populate_if_resident(m, path)
        assert not in_page_tables(addr, -(-arr.shape[0] // PAGE)).any()
        assert pf.resident_count(path) == 0  # the decision read nothing either


class _OsAs:
    """The ``os`` module as :mod:`lmdbio.io.prefetch` sees it, with ``euid``, the file's
    owner and ``access``'s answer set (the real module is left alone: pytest uses it)."""

    def __init__(self, euid: int, owner: int | None = None, writable: bool = False) -> None:
        self.euid, self.owner, self.writable = euid, owner, writable

    def __getattr__(self, name: str):
        return getattr(os, name)

    def geteuid(self) -> int:
        return self.euid

    def stat(self, path):
        st = os.stat(path)
        return st if self.owner is None else type("Stat", (), {"st_uid": self.owner})()

    def access(self, *args, **kwargs) -> bool:
        return self.writable


def test_residency_is_trusted_only_where_mincore_reports_it(warm, monkeypatch) -> None:
    """mincore reports a file's pages only to its owner or a writer (else every page
    resident): populate must not trust it for another user's read-only file, which would
    be read whole however cold; nor for root without the capability to override file
    permissions (a container's root)."""
    path, _ = warm
    assert pf.residency_is_reported(path)  # the test's own file
    assert not pf.residency_is_reported(path.with_name("missing.bin"))
    owner = path.stat().st_uid
    monkeypatch.setattr(pf, "os", _OsAs(euid=owner + 12345))
    assert not pf.residency_is_reported(path)
    asked = []
    monkeypatch.setattr(pf.libc, "madvise", lambda *a: asked.append(a))
    with map_file(path) as m:
        assert not pf.populate_if_resident(m, path)
    assert asked == []
    monkeypatch.setattr(pf, "os", _OsAs(euid=owner + 12345, writable=True))
    assert pf.residency_is_reported(path)  # a writer: reported
    monkeypatch.setattr(pf, "os", _OsAs(euid=0, owner=1000))  # root, not the owner
    assert not pf.residency_is_reported(path)
    monkeypatch.setattr(pf, "os", _OsAs(euid=0, owner=1000, writable=True))
    assert pf.residency_is_reported(path)


def test_populate_never_raises_on_a_buffer_it_cannot_map(warm) -> None:
    path, _ = warm
    assert not pf.populate_if_resident(np.zeros((4, 4), np.int32), path)
