"""The page engine reads LMDB files of every page size LMDB writes, not only 4 KiB ones.

LMDB sizes the pages of a new file from the system page size (``sysconf(_SC_PAGE_SIZE)``
in mdb.c's ``GET_PAGESIZE``), capped at ``MAX_PAGESIZE``: 32 KiB for LMDB 0.9 (data format
v1, what Caffe writes), 64 KiB for LMDB 1.0 (v3). Files written on ARM64 or POWER
clusters with 64 KiB pages therefore hold 32 or 64 KiB pages. Here py-lmdb writes such
files on this machine with an ``LD_PRELOAD`` shim (``tests/shims/pagesize.c``, compiled at
test time) that makes ``sysconf`` report the page size a test asks for, in a subprocess.

Each file holds small records, values just under and over the largest inline node of its
page size, values that fill 1, 2 or 3 overflow pages exactly or by one byte more or
less, multi-page values, Caffe ``Datum`` records, and enough long keys for a tree three or
more levels deep. The engine must give py-lmdb's records, py-lmdb's tree statistics from
its own walk, and per-record overflow page counts equal to an independent oracle: a page
walker written here from LMDB's structures (it does not import lmdbio), which reads each
overflow run's length from LMDB's own ``mp_pages`` and checks it against ``OVPAGES``
(mdb.c: ``(PAGEHDRSZ - 1 + size) / psize + 1``, with ``PAGEHDRSZ`` 16 in v1 and 24 in
v3). Mutated files of these page sizes go through the fuzzer of ``test_lmdb_fuzz.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import lmdb
import numpy as np
import pytest

import lmdbio
from bench.lmdbgen import random_items, read_pylmdb
from lmdbio.codecs.datum import datum_from_array, encode_datum
from lmdbio.io.gather import gather
from tests.test_lmdb_fuzz import run_fuzzer

REPO = Path(__file__).resolve().parents[1]
SHIM_SOURCE = REPO / "tests" / "shims" / "pagesize.c"
STAT_KEYS = ("psize", "depth", "branch_pages", "leaf_pages", "overflow_pages", "entries")

# LMDB's structures (mdb.c), for the oracle below: MDB_page header size (PAGEHDRSZ) and
# where mp_flags / mp_lower (mp_pages on overflow pages) / mp_upper sit, per data format
# version; v3 (LMDB 1.0) adds mp_txnid and counts mp_ptrs/mp_lower from the page body.
PAGEHDRSZ = {1: 16, 3: 24}
FLAGS_OFF = {1: 10, 3: 18}
LOWER_OFF = {1: 12, 3: 20}
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
F_BIGDATA = 0x01
MDB_MAGIC = 0xBEEFC0DE


@dataclass(frozen=True)
class Case:
    """One file to write: the system page size the shim reports to LMDB, the data format
    version (1: LMDB 0.9, 3: LMDB 1.0), and the page size LMDB then writes."""

    name: str
    system_psize: int
    version: int
    psize: int


CASES = [
    # 4096 also goes through the shim, so that it is 4 KiB on a 64 KiB-page host too
    Case("4k-v1", 4096, 1, 4096),
    Case("8k-v1", 8192, 1, 8192),
    Case("16k-v1", 16384, 1, 16384),
    Case("32k-v1", 65536, 1, 32768),  # LMDB 0.9 on a 64 KiB-page system: MAX_PAGESIZE
    Case("64k-v3", 65536, 3, 65536),  # LMDB 1.0 keeps the 64 KiB
]


# ------------------------------------------------------------------ the shim and the writer
def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@pytest.fixture(scope="session")
def pagesize_shim() -> Path:
    """``tests/shims/pagesize.c`` compiled into a shared library under ``build/`` (named
    by the hash of its source, so it is compiled once per change); skipped without a C
    compiler."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the page size shim is an LD_PRELOAD library: Linux only")
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build the LD_PRELOAD page size shim")
    source = SHIM_SOURCE.read_bytes()
    out_dir = REPO / "build" / "test-shims"
    out = out_dir / f"pagesize-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if not out.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp),
                               str(SHIM_SOURCE), "-ldl"], capture_output=True, text=True)
        assert proc.returncode == 0, f"compiling the shim failed:\n{proc.stderr}"
        os.replace(tmp, out)  # atomic: a concurrent session sees a whole file or none
    return out


_WRITER = """
import json, os, pickle, sys
import lmdb
from bench.lmdbgen import write_db
path, spec = sys.argv[1], sys.argv[2]
with open(spec, "rb") as f:
    kw = pickle.load(f)
write_db(path, **kw)
env = lmdb.open(path, readonly=True, lock=False, max_dbs=8)
print(json.dumps({"sysconf": os.sysconf("SC_PAGESIZE"), "stat": env.stat()}))
env.close()
"""


def write_with_page_size(shim: Path, path: Path, system_psize: int, **write_db_kw) -> dict:
    """Write a database with :func:`bench.lmdbgen.write_db` (``write_db_kw``) in a
    subprocess whose ``sysconf(_SC_PAGESIZE)`` reports ``system_psize``; returns what that
    subprocess saw: ``{"sysconf": ..., "stat": py-lmdb's env.stat()}``."""
    path.mkdir(parents=True, exist_ok=True)
    spec = path.parent / f"{path.name}.spec.pickle"
    spec.write_bytes(pickle.dumps(write_db_kw))
    path_entries = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, LD_PRELOAD=str(shim), LMDBIO_FAKE_PAGESIZE=str(system_psize),
               PYTHONPATH=os.pathsep.join(path_entries))
    proc = subprocess.run([sys.executable, "-c", _WRITER, str(path), str(spec)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    spec.unlink()
    assert proc.returncode == 0, f"writer failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ what the files hold
def nodemax(psize: int, version: int) -> int:
    """LMDB's largest inline leaf node (mdb.c: ``me_nodemax = (((psize - PAGEHDRSZ) /
    MDB_MINKEYS) & -2) - sizeof(indx_t)``): a node of 8 header bytes, key and value larger
    than this moves its value to overflow pages."""
    return (((psize - PAGEHDRSZ[version]) // 2) & ~1) - 2


def ovpages(size: int, psize: int, version: int) -> int:
    """mdb.c's ``OVPAGES``: the overflow pages a value of ``size`` bytes needs (the first
    page starts with a page header)."""
    return (PAGEHDRSZ[version] - 1 + size) // psize + 1


def case_items(psize: int, version: int) -> list[tuple[bytes, bytes]]:
    """The records of one file, in a shuffled (insertion) order: small values (some empty),
    values around the inline limit of ``psize``, overflow values of exactly and about 1, 2
    and 3 pages, larger multi-page values, Caffe Datums of 3x32x32 and 3x64x64 pixels, and
    2500 keys of 389 to 508 bytes with values of 1/16 page that make the tree at least
    three levels deep (few records fit a leaf, a branch page holds fewer than 150 keys)."""
    rng = np.random.default_rng(psize + version)
    hdr = PAGEHDRSZ[version]
    items = [(b"s-" + k, v) for k, v in random_items(200, (0, 200), seed=psize)]
    edge = nodemax(psize, version) - 8 - 8  # node header, 8-byte key
    for delta in range(-4, 5):
        key = b"e-%+06d" % delta  # 8 bytes: even, so v3 pads nothing either
        items.append((key, rng.integers(0, 256, edge + delta, dtype=np.uint8).tobytes()))
    for pages in (1, 2, 3):
        for delta in (-1, 0, 1):
            size = pages * psize - hdr + delta
            items.append((b"o-%d%+d" % (pages, delta),
                          rng.integers(0, 256, size, dtype=np.uint8).tobytes()))
    for i, size in enumerate((7 * psize + 123, 300_001)):
        items.append((b"m-%d" % i, rng.integers(0, 256, size, dtype=np.uint8).tobytes()))
    for side in (32, 64):
        for i in range(30):
            img = rng.integers(0, 256, (3, side, side), dtype=np.uint8)
            items.append((b"d-%08d_img%d.png" % (i, side), encode_datum(datum_from_array(img, i))))
    for i in range(2500):  # few records a leaf, many a branch: more leaves than a branch holds
        key = b"t-%06d-" % i + b"k" * int(rng.integers(380, 500))
        items.append((key, bytes([i % 251]) * (psize // 16)))
    order = rng.permutation(len(items))
    return [items[i] for i in order]


@dataclass
class Written:
    """A file written for one :class:`Case`: where, what (key order), and what the writing
    process saw."""

    case: Case
    path: Path
    items: list[tuple[bytes, bytes]]
    writer: dict


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def written(request: pytest.FixtureRequest, pagesize_shim: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Written:
    """The file of one :class:`Case`, written once per module in two commits (the second
    copies the pages it changes, so the file also holds a free list)."""
    case: Case = request.param
    path = tmp_path_factory.mktemp(case.name)
    items = case_items(case.psize, case.version)
    seen = write_with_page_size(pagesize_shim, path / "db", case.system_psize, items=items,
                                version=case.version, commit_every=1500, map_size=1 << 30)
    return Written(case, path / "db", sorted(items), seen)


# ------------------------------------------------------------------ the independent oracle
@dataclass
class OracleRecord:
    """One leaf node as the oracle reads it."""

    key: bytes
    value: bytes
    bigdata: bool
    val_off: int  # file offset of the value's first byte
    ovf_pages: int  # mp_pages of the first overflow page (0 inline)


@dataclass
class OracleTree:
    """The main tree as the oracle walks it."""

    psize: int
    version: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int  # md_entries of the live meta page
    records: list[OracleRecord]


def _u16(buf: bytes, off: int) -> int:
    return struct.unpack_from("<H", buf, off)[0]


def oracle_walk(data_mdb: Path) -> OracleTree:
    """Walk the main tree of ``data_mdb`` from LMDB's structures alone (no lmdbio): the live
    meta page (larger txnid), then branch pages level by level to the leaves, every leaf
    at the same level; each ``F_BIGDATA`` node's overflow run is read from its first page
    (own page number, ``P_OVERFLOW``, ``mp_pages``), and its value bytes follow the page
    header."""
    buf = data_mdb.read_bytes()
    version = next(v for v in (1, 3) if struct.unpack_from("<II", buf, PAGEHDRSZ[v])
                   == (MDB_MAGIC, v))
    hdr = PAGEHDRSZ[version]
    psize = struct.unpack_from("<I", buf, hdr + 24)[0]  # MDB_meta.mm_dbs[FREE_DBI].md_pad
    metas = []
    for page in (0, 1):
        m = page * psize + hdr
        # mm_dbs[MAIN_DBI] at +72: pad, flags, depth, branch, leaf, overflow, entries, root
        _pad, _fl, depth, _b, _l, _o, entries, root = struct.unpack_from("<IHHQQQQQ", buf, m + 72)
        txnid = struct.unpack_from("<Q", buf, m + 128)[0]
        metas.append((txnid, depth, entries, root))
    _txnid, depth, entries, root = max(metas)
    flags_off, lower_off = FLAGS_OFF[version], LOWER_OFF[version]
    ptr_base, lower_base = (0, 16) if version == 1 else (24, 0)

    def nodes(pg: int) -> list[int]:
        base = pg * psize
        assert struct.unpack_from("<Q", buf, base)[0] == pg
        n = (_u16(buf, base + lower_off) - lower_base) // 2
        return [base + ptr_base + _u16(buf, base + hdr + 2 * i) for i in range(n)]

    level, branches, levels = [root], 0, 1
    while _u16(buf, level[0] * psize + flags_off) & P_BRANCH:
        assert all(_u16(buf, pg * psize + flags_off) & P_BRANCH for pg in level)
        branches += len(level)
        level = [_u16(buf, n) | _u16(buf, n + 2) << 16 | _u16(buf, n + 4) << 32
                 for pg in level for n in nodes(pg)]
        levels += 1
    records, overflow = [], 0
    for pg in level:
        assert _u16(buf, pg * psize + flags_off) & P_LEAF
        for n in nodes(pg):
            dsize = _u16(buf, n) | _u16(buf, n + 2) << 16
            nflags, ksize = _u16(buf, n + 4), _u16(buf, n + 6)
            key = buf[n + 8:n + 8 + ksize]
            data = n + 8 + ksize + (ksize & 1 if version == 3 else 0)
            if nflags & F_BIGDATA:
                opg = struct.unpack_from("<Q", buf, data)[0]
                base = opg * psize
                assert struct.unpack_from("<Q", buf, base)[0] == opg
                assert _u16(buf, base + flags_off) & P_OVERFLOW
                npages = struct.unpack_from("<I", buf, base + lower_off)[0]
                overflow += npages
                off = base + hdr
            else:
                npages, off = 0, data
            records.append(OracleRecord(key, buf[off:off + dsize], bool(nflags & F_BIGDATA),
                                        off, npages))
    return OracleTree(psize, version, levels, branches, len(level), overflow, entries, records)


def pylmdb_stat(path: Path) -> dict:
    """py-lmdb's ``env.stat()`` of the file, read in this process (this system's page
    size: reading, LMDB takes the page size from the meta page)."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        return env.stat()
    finally:
        env.close()


# ------------------------------------------------------------------ the tests
def test_the_file_has_the_page_size_asked_for(written: Written):
    """The shim worked: the writer's sysconf reported the fake size, and LMDB wrote pages
    of the size expected from it (py-lmdb's stat in the writer, the meta page's psize)."""
    case = written.case
    assert written.writer["sysconf"] == case.system_psize
    assert written.writer["stat"]["psize"] == case.psize
    head = (written.path / "data.mdb").read_bytes()[:256]
    hdr = PAGEHDRSZ[case.version]
    assert struct.unpack_from("<II", head, hdr) == (MDB_MAGIC, case.version)
    assert struct.unpack_from("<I", head, hdr + 24)[0] == case.psize
    assert (written.path / "data.mdb").stat().st_size % case.psize == 0


def test_records_match_pylmdb(written: Written):
    """Every key and value, through items, gather, ranges of the record table, lookups and
    a cursor both ways, equals what was written and what py-lmdb reads."""
    expected = written.items
    assert read_pylmdb(written.path) == expected
    with lmdbio.open(written.path) as db:
        assert db.psize == written.case.psize
        assert len(db) == len(expected)
        assert [(k, bytes(v)) for k, v in db.items()] == expected
        buf, off = gather(db, range(len(db)))
        assert all(bytes(buf[off[i]:off[i + 1]]) == v for i, (_k, v) in enumerate(expected))
        for start, stop in ((0, 1), (150, 1700), (len(db) - 5, len(db))):
            part = db.record_table(start, stop)
            assert [bytes(db.mv[o:o + n]) for o, n in zip(part.val_off, part.val_len,
                                                          strict=True)] == \
                [v for _k, v in expected[start:stop]]
        for k, v in expected[::97] + [kv for kv in expected if kv[0][:2] in (b"e-", b"o-")]:
            assert bytes(db.get(k)) == v
        assert db.get(b"t-999999") is None
        cur, forward = db.cursor(), []
        ok = cur.first()
        while ok:
            forward.append(cur.key())
            ok = cur.next()
        assert forward == [k for k, _v in expected]
        ok, backward = cur.last(), []
        while ok:
            backward.append(cur.key())
            ok = cur.prev()
        assert backward == forward[::-1]


def test_tree_shape_matches_pylmdb(written: Written):
    """The engine's own walk (branch levels, leaves, overflow runs of the record table)
    counts the branch, leaf and overflow pages and the depth py-lmdb's stat gives, and so
    does the oracle; the tree is at least three levels deep and holds values both inline
    and in overflow pages."""
    ref = pylmdb_stat(written.path)
    oracle = oracle_walk(written.path / "data.mdb")
    with lmdbio.open(written.path) as db:
        st = db.stat()
        assert {k: st[k] for k in STAT_KEYS} == {k: ref[k] for k in STAT_KEYS}
        levels, _parents = db.tree_levels()
        np.testing.assert_array_equal(levels[-1], db.leaves())
        t = db.record_table()
        walked = {"psize": db.psize, "depth": len(levels),
                  "branch_pages": sum(lv.size for lv in levels[:-1]),
                  "leaf_pages": int(db.leaves().size),
                  "overflow_pages": int(t.ovf_pages.sum()), "entries": len(t)}
    assert walked == {k: ref[k] for k in STAT_KEYS}
    assert {"psize": oracle.psize, "depth": oracle.depth,
            "branch_pages": oracle.branch_pages, "leaf_pages": oracle.leaf_pages,
            "overflow_pages": oracle.overflow_pages, "entries": len(oracle.records)} == \
        {k: ref[k] for k in STAT_KEYS}
    assert ref["depth"] >= 3
    assert 0 < sum(r.bigdata for r in oracle.records) < len(oracle.records)


def test_overflow_page_counts_match_an_independent_count(written: Written):
    """Per record, the engine's overflow run length equals LMDB's own ``mp_pages`` (read
    by the oracle) and ``OVPAGES`` of the value length; its value offset and inline /
    overflow decision equal the oracle's. The boundary records really straddle: values
    just under and over the inline limit land on both sides, exactly where
    ``nodemax`` says, and overflow values of about n pages take n and n + 1 pages."""
    case = written.case
    oracle = oracle_walk(written.path / "data.mdb")
    assert [(r.key, r.value) for r in oracle.records] == written.items
    want_pages = np.array([r.ovf_pages for r in oracle.records])
    lengths = np.array([len(r.value) for r in oracle.records])
    big = np.array([r.bigdata for r in oracle.records])
    formula = np.where(big, (PAGEHDRSZ[case.version] - 1 + lengths) // case.psize + 1, 0)
    np.testing.assert_array_equal(want_pages, formula)  # LMDB's mp_pages is OVPAGES
    with lmdbio.open(written.path) as db:
        t = db.record_table()
        np.testing.assert_array_equal(t.ovf_pages, want_pages)
        np.testing.assert_array_equal(t.val_off, [r.val_off for r in oracle.records])
        np.testing.assert_array_equal(t.val_len, lengths)
    by_key = {r.key: r for r in oracle.records}
    edges = [r for r in oracle.records if r.key.startswith(b"e-")]
    assert len(edges) == 9 and all(len(r.key) == 8 for r in edges)
    assert {r.bigdata for r in edges} == {False, True}
    for r in edges:  # overflow exactly when the node (8-byte key: no padding) > nodemax
        assert r.bigdata == (8 + len(r.key) + len(r.value) > nodemax(case.psize, case.version))
    for pages in (1, 2, 3):
        assert by_key[b"o-%d-1" % pages].ovf_pages == pages
        assert by_key[b"o-%d+0" % pages].ovf_pages == pages
        assert by_key[b"o-%d+1" % pages].ovf_pages == pages + 1
    assert by_key[b"m-0"].ovf_pages == ovpages(7 * case.psize + 123, case.psize, case.version)


FUZZ_CASES = [c for c in CASES if c.psize in (32768, 65536)]


@pytest.mark.slow
def test_mutated_large_page_files_never_crash_or_hang(pagesize_shim, tmp_path):
    """The fuzzer of test_lmdb_fuzz.py over 32 KiB (v1) and 64 KiB (v3) page files (with
    a named sub-database, overflow values and several leaves, as its own 4 KiB bases):
    every mutated file reads as data or an LmdbioError, never a crash, a hang or another
    exception, and both outcomes occur."""
    bases = []
    for case in FUZZ_CASES:
        path = tmp_path / case.name
        seen = write_with_page_size(
            pagesize_shim, path, case.system_psize,
            items=random_items(120, (1, case.psize), seed=case.psize), version=case.version,
            commit_every=30, subdbs={b"named": random_items(20, 30, seed=9)})
        assert seen["stat"]["psize"] == case.psize and seen["stat"]["depth"] >= 2
        bases += ["--base", str(path / "data.mdb")]
    ok, errors = run_fuzzer(["--examples", "100", *bases], timeout=120)
    assert ok > 0 and errors > 0
