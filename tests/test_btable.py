"""BTables: fixtures written by the original library, round trips, malformed input, LMDB layout.

An independent, deliberately slow pure-Python ``struct`` reader/writer below is the oracle:
the compiled reader must agree with it on every input (same matrix, or both reject).
"""

from __future__ import annotations

import argparse
import math
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import structfuzz
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdbio.codecs import btable
from lmdbio.codecs.btable import BTableError
from lmdbio.codecs.btable import kernels as btable_kernels
from lmdbio.codecs.btable import rows as btable_rows
from lmdbio.errors import CodecError

SEP = "\x1f"


# ----------------------------------------------------------------------------- the oracle
class SlowError(Exception):
    pass


def slow_read(raw: bytes) -> tuple[list[str], list[list[tuple[int, float]]]]:
    """Parse a BTable with struct, one value at a time; raise SlowError on anything wrong."""
    if len(raw) < 8:
        raise SlowError("short header")
    version, n_units = struct.unpack_from(">ii", raw, 0)
    if version != 0 or n_units < 0 or 8 + 2 * n_units > len(raw):
        raise SlowError("bad header")
    units = struct.unpack_from(f">{n_units}H", raw, 8)
    try:
        text = b"".join(struct.pack(">H", u) for u in units).decode("utf-16-be")
    except UnicodeDecodeError as exc:
        raise SlowError("bad utf-16") from exc
    labels = text.split(SEP)
    pos = 8 + 2 * n_units
    rows = []
    while pos < len(raw):
        if len(raw) - pos < 4:
            raise SlowError("truncated count")
        (nnz,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        if nnz < 0 or len(raw) - pos < 12 * nnz:
            raise SlowError("bad count")
        row = []
        prev = -1
        for _ in range(nnz):
            col, val = struct.unpack_from(">id", raw, pos)
            pos += 12
            if col < 0 or col >= len(labels) or col <= prev:
                raise SlowError("bad column")
            prev = col
            row.append((col, val))
        rows.append(row)
    return labels, rows


def slow_write(labels: list[str], dense_rows: list[list[float]]) -> bytes:
    """What the original Java writer emits: UTF-16 code units, values != 0.0 only."""
    text = SEP.join(labels)
    units = text.encode("utf-16-be")
    out = [struct.pack(">ii", 0, len(units) // 2), units]
    for row in dense_rows:
        nz = [(i, v) for i, v in enumerate(row) if v != 0.0]
        out.append(struct.pack(">i", len(nz)))
        for i, v in nz:
            out.append(struct.pack(">id", i, v))
    return b"".join(out)


def same_rows(m: sp.csr_matrix, rows: list[list[tuple[int, float]]]) -> bool:
    if m.shape[0] != len(rows):
        return False
    for r, row in enumerate(rows):
        a, b = m.indptr[r], m.indptr[r + 1]
        cols = m.indices[a:b].tolist()
        vals = m.data[a:b].tolist()
        if cols != [c for c, _ in row]:
            return False
        for x, (_, y) in zip(vals, row, strict=True):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
            if struct.pack(">d", x) != struct.pack(">d", y):  # bit-exact, NaN payloads too
                return False
    return True


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def table_path(shared_testdata: Path) -> Path:
    return shared_testdata / "btable" / "table.btable"


@pytest.fixture(scope="module")
def unicode_path(shared_testdata: Path) -> Path:
    return shared_testdata / "btable" / "unicode.btable"


def test_fixture_counts_and_values(table_path: Path) -> None:
    labels, m = btable.read(table_path)
    assert len(labels) == 100
    assert m.shape == (5000, 100)
    assert m.nnz == 33324
    slow_labels, slow_rows = slow_read(table_path.read_bytes())
    assert labels == slow_labels
    assert same_rows(m, slow_rows)
    # a few values pinned independently of both readers (struct at a hand-computed offset):
    raw = table_path.read_bytes()
    start = 8 + 2 * struct.unpack_from(">i", raw, 4)[0]
    nnz0, col0, val0 = struct.unpack_from(">iid", raw, start)
    assert m.indptr[1] == nnz0
    assert m.indices[0] == col0 and m.data[0] == val0
    assert btable.read_labels(table_path) == labels
    assert btable.info(table_path)["rows"] == 5000
    assert btable.info(table_path, chunk_bytes=1000)["nnz"] == 33324


def test_fixtures_rewrite_byte_identical(table_path: Path, unicode_path: Path,
                                         tmp_path: Path) -> None:
    for p in (table_path, unicode_path):
        labels, m = btable.read(p)
        out = tmp_path / p.name
        btable.write(out, labels, m)
        assert out.read_bytes() == p.read_bytes()
        # the dense path writes the same bytes
        btable.write(out, labels, m.toarray())
        assert out.read_bytes() == p.read_bytes()


def test_unicode_fixture(unicode_path: Path) -> None:
    labels, m = btable.read(unicode_path)
    assert labels == ["\u901a"]
    assert struct.unpack_from(">i", unicode_path.read_bytes(), 4)[0] == 1  # code units
    assert m.shape == (1, 1) and m.toarray().tolist() == [[1.0]]


def test_non_bmp_labels_count_utf16_code_units(tmp_path: Path) -> None:
    p = tmp_path / "emoji.btable"
    labels = ["\U0001f600", "a"]
    btable.write(p, labels, np.array([[0.0, 2.5]]))
    raw = p.read_bytes()
    assert raw[:8] == struct.pack(">ii", 0, 4)  # surrogate pair (2) + separator + "a"
    assert raw[8:16] == bytes.fromhex("d83dde00001f0061")
    assert raw == slow_write(labels, [[0.0, 2.5]])
    assert btable.read(p)[0] == labels


def test_zero_handling_nan_kept_negative_zero_dropped(tmp_path: Path) -> None:
    p = tmp_path / "z.btable"
    rows = [[0.0, -0.0, np.nan], [0.0, 0.0, 0.0], [1.0, -2.0, np.inf]]
    btable.write(p, ["a", "b", "c"], np.array(rows))
    assert p.read_bytes() == slow_write(["a", "b", "c"], rows)
    _, m = btable.read(p)
    assert m.indptr.tolist() == [0, 1, 1, 4]
    assert m.indices.tolist() == [2, 0, 1, 2]
    assert np.isnan(m.data[0])
    # a sparse input with explicit zeros, duplicates and unsorted columns is canonicalised
    s = sp.csr_matrix((np.array([0.0, 3.0, 1.0, 1.0]), np.array([0, 2, 1, 1]),
                       np.array([0, 4])), shape=(1, 3))
    btable.write(p, ["a", "b", "c"], s)
    assert p.read_bytes() == slow_write(["a", "b", "c"], [[0.0, 2.0, 3.0]])


def test_streaming_equals_whole_read(table_path: Path) -> None:
    _, m = btable.read(table_path)
    for chunk in (1000, 4096, 1 << 20):
        blocks = list(btable.iter_blocks(table_path, chunk_bytes=chunk))
        s = sp.vstack(blocks).tocsr()
        assert (s != m).nnz == 0 and s.shape == m.shape
    rows = list(btable.iter_rows(table_path, chunk_bytes=777))
    assert len(rows) == 5000
    for r in (0, 1, 2499, 4999):
        cols, vals = rows[r]
        a, b = m.indptr[r], m.indptr[r + 1]
        assert cols.tolist() == m.indices[a:b].tolist()
        assert vals.tolist() == m.data[a:b].tolist()


def test_streaming_writer_matches_whole_write(table_path: Path, tmp_path: Path) -> None:
    labels, m = btable.read(table_path)
    p = tmp_path / "s.btable"
    with btable.BTableWriter(p, labels) as w:
        for a in range(0, 5000, 333):
            w.write_rows(m[a:a + 333])
    assert p.read_bytes() == table_path.read_bytes()


# ------------------------------------------------------------------------ random round trips
label_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=SEP),
    max_size=6)


@st.composite
def tables(draw):
    n_cols = draw(st.integers(1, 7))
    labels = draw(st.lists(label_text, min_size=n_cols, max_size=n_cols))
    n_rows = draw(st.integers(0, 9))
    value = st.one_of(st.just(0.0), st.just(-0.0), st.just(math.nan),
                      st.floats(allow_nan=False, width=64))
    rows = draw(st.lists(st.lists(value, min_size=n_cols, max_size=n_cols),
                         min_size=n_rows, max_size=n_rows))
    return labels, rows


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_random_round_trip(tmp_path_factory, table) -> None:
    labels, rows = table
    n_cols = len(labels)
    p = tmp_path_factory.mktemp("rt") / "t.btable"
    dense = np.array(rows, dtype=np.float64).reshape(len(rows), n_cols)
    btable.write(p, labels, dense)
    raw = p.read_bytes()
    assert raw == slow_write(labels, rows)
    got_labels, m = btable.read(p)
    assert got_labels == labels
    assert same_rows(m, slow_read(raw)[1])
    blocks = list(btable.iter_blocks(p, chunk_bytes=16))  # rows longer than a chunk too
    assert sum(b.shape[0] for b in blocks) == len(rows)
    if blocks:
        s = sp.vstack(blocks).tocsr()
        assert s.indptr.tolist() == m.indptr.tolist()
        assert s.indices.tolist() == m.indices.tolist()
        assert s.data.tobytes() == m.data.tobytes()
    streamed = list(btable.iter_rows(p, chunk_bytes=16))
    assert len(streamed) == len(rows)


# ------------------------------------------------------------------------------ malformed
def _base() -> bytes:
    return slow_write(["a", "b", "c"], [[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 3.0, 0.0]])


HDR = 8 + 2 * 5  # header bytes of _base(): "a\x1fb\x1fc" is 5 code units


def _raises(tmp_path: Path, raw: bytes, row: int | None, offset: int | None, text: str) -> None:
    p = tmp_path / "bad.btable"
    p.write_bytes(raw)
    with pytest.raises(BTableError) as ei:
        btable.read(p)
    e = ei.value
    assert isinstance(e, CodecError)
    assert text in str(e)
    assert e.row == row and e.offset == offset, str(e)
    assert str(p) in str(e)
    # streaming reports the same place
    with pytest.raises(BTableError) as ei2:
        for _ in btable.iter_blocks(p, chunk_bytes=16):
            pass
    assert (ei2.value.row, ei2.value.offset) == (row, offset)


def test_malformed_header(tmp_path: Path) -> None:
    raw = _base()
    _raises(tmp_path, raw[:6], None, 0, "header needs 8")
    _raises(tmp_path, struct.pack(">i", 1) + raw[4:], None, 0, "unsupported version 1")
    _raises(tmp_path, raw[:4] + struct.pack(">i", -3) + raw[8:], None, 4, "negative label")
    _raises(tmp_path, raw[:4] + struct.pack(">i", 10_000) + raw[8:], None, 4, "past the end")
    lone = raw[:4] + struct.pack(">i", 1) + bytes.fromhex("d800")
    _raises(tmp_path, lone, None, 8, "not valid UTF-16")


def test_malformed_rows(tmp_path: Path) -> None:
    raw = _base()
    r1 = HDR + 4 + 24  # row 1 starts after row 0 (2 non-zeros)
    r2 = r1 + 4
    _raises(tmp_path, raw[:-1], 2, r2, "row truncated")
    _raises(tmp_path, raw + b"\x00\x00", 3, len(raw), "trailing byte")
    _raises(tmp_path, raw[:r1] + struct.pack(">i", -1) + raw[r1 + 4:], 1, r1, "negative")
    bad_col = raw[:HDR + 4] + struct.pack(">i", -5) + raw[HDR + 8:]
    _raises(tmp_path, bad_col, 0, HDR + 4, "negative column")
    big_col = raw[:HDR + 4] + struct.pack(">i", 2**31 - 1) + raw[HDR + 8:]
    _raises(tmp_path, big_col, 0, HDR + 4, "out of range")
    unsorted = raw[:HDR + 16] + struct.pack(">i", 0) + raw[HDR + 20:]
    _raises(tmp_path, unsorted, 0, HDR + 16, "duplicate column 0")
    swapped = (raw[:HDR + 4] + struct.pack(">id", 2, 2.0) + struct.pack(">id", 0, 1.0)
               + raw[HDR + 28:])
    _raises(tmp_path, swapped, 0, HDR + 16, "ascend")


def test_writer_rejects_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "w.btable"
    with pytest.raises(BTableError, match="separator"):
        btable.write(p, ["a\x1fb"], np.ones((1, 1)))
    with pytest.raises(BTableError, match="at least one label"):
        btable.write(p, [], np.ones((1, 0)))
    with pytest.raises(BTableError, match="columns"):
        btable.write(p, ["a"], np.ones((1, 2)))
    with pytest.raises(BTableError, match="UTF-16"):
        btable.write(p, ["\ud800"], np.ones((1, 1)))


def _check_agrees(path: Path, raw: bytes) -> None:
    path.write_bytes(raw)
    try:
        expected = slow_read(raw)
    except SlowError:
        expected = None
    try:
        labels, m = btable.read(path)
    except BTableError:
        assert expected is None, "the compiled reader rejected a file the oracle accepts"
        return
    assert expected is not None, "the compiled reader accepted a file the oracle rejects"
    assert labels == expected[0]
    assert same_rows(m, expected[1])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, len(_base())), flips=st.lists(
    st.tuples(st.integers(0, len(_base()) - 1), st.integers(0, 255)), max_size=3))
def test_fuzz_truncations_and_flips(tmp_path_factory, cut: int, flips) -> None:
    raw = bytearray(_base())
    for pos, val in flips:
        raw[pos] = val
    raw = bytes(raw[:cut]) if cut < len(raw) else bytes(raw)
    _check_agrees(tmp_path_factory.mktemp("fz") / "f.btable", raw)


#: seeds of cases that once found a bug (none yet: the reader held); always run
BTABLE_REGRESSION_SEEDS: tuple[int, ...] = ()


def _btable_parts(raw: bytes) -> structfuzz.Parsed:
    """A valid BTable as header and row integers (version, label length, every row's nnz
    and every column index; int32, signed) and sections (the label units, each row's
    ``(column, value)`` pairs). ``build`` writes the columns over the first 4 bytes of each
    12-byte pair that is still there, so a truncated or extended row stays a row."""
    _labels, rows = slow_read(raw)
    i32 = structfuzz.int_limits(4, signed=True)
    n_units = struct.unpack_from(">i", raw, 4)[0]
    fields = {"version": 0, "label_units": n_units}
    sections = {"labels": raw[8:8 + 2 * n_units]}
    pos = 8 + 2 * n_units
    for r, row in enumerate(rows):
        fields[f"nnz{r}"] = len(row)
        for j, (col, _v) in enumerate(row):
            fields[f"col{r}_{j}"] = col
        sections[f"row{r}"] = raw[pos + 4:pos + 4 + 12 * len(row)]
        pos += 4 + 12 * len(row)
    limits = dict.fromkeys(fields, i32)

    def build(f: dict[str, int], sec: dict[str, bytes]) -> bytes:
        out = [struct.pack(">ii", f["version"], f["label_units"]), sec["labels"]]
        for r, row in enumerate(rows):
            body = bytearray(sec[f"row{r}"])
            for j in range(len(row)):
                if 12 * j + 4 <= len(body):
                    struct.pack_into(">i", body, 12 * j, f[f"col{r}_{j}"])
            out += [struct.pack(">i", f[f"nnz{r}"]), bytes(body)]
        return b"".join(out)

    return structfuzz.Parsed(fields, limits, sections, build)


def _random_table(rng: random.Random) -> tuple[list[str], np.ndarray]:
    """1-6 labels (some outside ASCII) and 0-6 rows of few distinct values, NaN included."""
    labels = [rng.choice(["a", "bé", "漢", "x" * rng.randint(0, 3), "😀"])
              + str(i) for i in range(rng.randint(1, 6))]
    rows = np.array([[rng.choice([0.0, 0.0, 1.5, -2.0, math.nan]) for _ in labels]
                     for _ in range(rng.randint(0, 6))]).reshape(-1, len(labels))
    return labels, rows


@pytest.mark.parametrize("seed", structfuzz.fuzz_seeds(BTABLE_REGRESSION_SEEDS))
def test_structured_fuzz_reaches_the_kernels(seed: int, tmp_path: Path) -> None:
    """Tables written by ``btable.write`` over random labels and rows, one header/row field
    or section mutated: the compiled reader (whole file, streamed in small chunks, and its
    kernels on a buffer that ends at an unreadable page) agrees with the Python oracle --
    a BTableError exactly when the oracle rejects, else the same labels and rows. Most
    cases get past the header into the row kernels."""
    rng = random.Random(seed)
    tally = structfuzz.Tally("btable", seed)
    path = tmp_path / "fz.btable"
    for case in range(150):
        labels, rows = _random_table(rng)
        btable.write(path, labels, rows)
        mut = structfuzz.mutate(_btable_parts(path.read_bytes()), rng)
        chunk = rng.choice([16, 40, 1 << 16])

        def one(mut: structfuzz.Mutation = mut, chunk: int = chunk,
                labels: list[str] = labels, rows: np.ndarray = rows) -> str:
            raw = mut.data
            path.write_bytes(raw)
            try:
                expected = slow_read(raw)
            except SlowError:
                expected = None
            with structfuzz.stage("header"):
                got_labels = btable.read_labels(path)
            buf = structfuzz.guarded(raw)
            start = 8 + 2 * struct.unpack_from(">i", raw, 4)[0]
            st, n_rows, nnz, _end, _off, _bad = btable_rows.scan_btable_rows(buf, start, True)
            if st == btable_rows.OK:
                btable_rows.decode_btable_rows(buf, start, n_rows, nnz, len(got_labels))
            try:
                _labels, m = btable.read(path)
            except BTableError:
                assert expected is None, "the compiled reader rejected what the oracle reads"
                with pytest.raises(BTableError):
                    for _ in btable.iter_blocks(path, chunk_bytes=chunk):
                        pass
                raise
            assert expected is not None, "the compiled reader accepted what the oracle rejects"
            assert _labels == got_labels == expected[0]
            assert same_rows(m, expected[1])
            blocks = list(btable.iter_blocks(path, chunk_bytes=chunk))
            streamed = sp.vstack(blocks).tocsr() if blocks else sp.csr_matrix((0, m.shape[1]))
            assert same_rows(streamed, expected[1])
            if mut.benign:
                assert _labels == labels
                assert np.array_equal(m.toarray(), rows, equal_nan=True)
            return "ok"

        tally.add(structfuzz.run_case("btable", seed, case, mut.what, one, (BTableError,)))
    tally.require(("ok", "error:decode"), 0.5)


# ------------------------------------------------------------------------------ LMDB layout
def test_status_codes_match_kernels() -> None:
    for name in ("OK", "E_NEG_COUNT", "E_TRUNCATED", "E_COL_NEG", "E_COL_RANGE",
                 "E_COL_ORDER", "E_COL_DUP", "E_ZERO", "E_LENGTH"):
        assert getattr(btable_rows, name) == getattr(btable_kernels, name)


def test_lmdb_layout_round_trip(table_path: Path, tmp_path: Path) -> None:
    import lmdb

    from lmdbio.convert import btable as conv
    from lmdbio.dataset_meta import read_dataset_meta

    dst = tmp_path / "bt.lmdb"
    args = argparse.Namespace(chunk_mib=1, overwrite=False, format_version=1)
    summary = conv.convert(str(table_path), str(dst), args)
    assert summary["records"] == 5000 and summary["nnz"] == 33324
    meta = read_dataset_meta(dst)
    assert meta["layout"] == "btable" and len(meta["labels"]) == 100
    _labels, m = btable.read(table_path)
    env = lmdb.open(str(dst), readonly=True, lock=False)
    with env.begin() as txn:
        vals = [txn.get(conv.row_key(i)) for i in range(5000)]
        assert txn.stat()["entries"] == 5000
    env.close()
    # every record has the documented layout
    for r in (0, 17, 4999):
        v = vals[r]
        nnz, width = struct.unpack_from("<II", v, 0)
        a, b = m.indptr[r], m.indptr[r + 1]
        assert nnz == b - a and width == 100
        assert len(v) == 8 + 8 * ((nnz + 1) // 2) + 8 * nnz
        cols = np.frombuffer(v, "<i4", nnz, 8)
        data = np.frombuffer(v, "<f8", nnz, 8 + 8 * ((nnz + 1) // 2))
        assert cols.tolist() == m.indices[a:b].tolist()
        assert data.tolist() == m.data[a:b].tolist()
    dense = btable.rows_to_dense_tensor(vals, 100, dtype=np.float64)
    assert np.array_equal(dense, m.toarray())
    out = tmp_path / "back.btable"
    res = btable.export_lmdb(dst, out)
    assert res["rows"] == 5000
    assert out.read_bytes() == table_path.read_bytes()


def test_sparse_row_codec_and_bad_records() -> None:
    codec = btable.SparseRowCodec(5)
    row = np.array([0.0, -0.0, np.nan, 4.0, 0.0])
    enc = codec.encode(row)
    assert len(enc) == btable_rows.record_nbytes(2)
    dec = codec.decode(enc)
    assert np.isnan(dec[2]) and dec[3] == 4.0 and dec[[0, 1, 4]].tolist() == [0, 0, 0]
    assert type(codec).from_config(codec.get_config()).n_cols == 5
    bad = bytearray(enc)
    bad[8:12] = struct.pack("<i", 9)  # column 9 >= width 5
    with pytest.raises(CodecError, match="out of range"):
        codec.decode(bytes(bad))
    with pytest.raises(CodecError, match="length"):
        codec.decode(enc[:-1])
    zero = bytearray(enc)
    zero[-8:] = struct.pack("<d", 0.0)
    with pytest.raises(CodecError, match="zero"):
        codec.decode(bytes(zero))


@pytest.mark.parametrize(("offset", "length"), [(-1, 4), (0, -1), (1 << 62, 1 << 62),
                                                (0, 65)])
def test_row_records_outside_the_buffer_are_refused(offset: int, length: int) -> None:
    """Offsets and lengths are checked against the buffer before the kernel reads, a
    start and length whose sum wraps around int64 included."""
    buf = np.zeros(64, np.uint8)
    with pytest.raises(CodecError, match="outside the buffer"):
        btable_rows.decode_row_records(buf, np.array([offset]), np.array([length]), 4)


def test_row_head_is_declared_once_and_read_back() -> None:
    """A sparse row record's head (``ROW_HEAD``) and columns, as ``lmdbio inspect`` reads
    them, are what the compiled encoder wrote; a value shorter than the head is refused."""
    m = sp.csr_matrix(np.array([[0.0, 1.5, 0.0, 2.0, -1.0], [0.0] * 5]))
    buf, offsets = btable_rows.encode_row_records(m.indptr, m.indices, m.data, 5)
    first = memoryview(buf[offsets[0]:offsets[1]])
    assert btable_rows.read_row_head(first) == (3, 5)
    assert len(first) == btable_rows.record_nbytes(3)
    np.testing.assert_array_equal(btable_rows.row_columns(first, 3), [1, 3, 4])
    assert btable_rows.read_row_head(buf[offsets[1]:offsets[2]]) == (0, 5)
    with pytest.raises(CodecError, match="its head needs 8"):
        btable_rows.read_row_head(first[:7])
