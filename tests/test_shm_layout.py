"""The batch-slot format in-process (no MPI): layout, round trips, capacity errors,
corruption detection and bounds checks on forged headers. Data are generated, not real."""

from __future__ import annotations

import mmap
import os
import random
import tempfile
import zlib
from typing import ClassVar

import numpy as np
import pytest
import structfuzz
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdbio.errors import ConfigError, LmdbioError
from lmdbio.shm import (
    FLAG_LAST_IN_EPOCH,
    RingError,
    SlotCapacityError,
    SlotCorruptError,
    SlotLayout,
    SlotWriter,
    payload_bytes_for,
)
from lmdbio.shm.cleanup import backing_file, mapping_path, unlink_quietly
from lmdbio.shm.layout import (
    HEADER_DTYPE,
    PAGE,
    PART_DTYPE,
    SlotBuffers,
)
from lmdbio.shm.view import read_slot

SETTINGS = settings(max_examples=60, deadline=None)


def new_slot(n_parts=3, max_records=32, payload=8192, keys=512):
    layout = SlotLayout(n_parts, max_records, payload, keys)
    mem = np.zeros(layout.slot_size, dtype=np.uint8)
    return layout, SlotBuffers(layout, mem)


def gen_batch(rng, n, max_size=300):
    sizes = rng.integers(0, max_size, n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    payload = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    labels = rng.integers(-1, 10**6, n)
    keys = [b"key-%06d" % int(i) + b"x" * int(rng.integers(0, 5)) for i in range(n)]
    return payload, offsets, labels, keys


def write(bufs, payload, offsets, labels=None, keys=None, counts=None, balance="records",
          checksum=True, **publish):
    w = SlotWriter(bufs, slot=0, seq=7, epoch=2, iteration=11, checksum=checksum)
    w.write(payload, offsets, labels, keys)
    if counts is not None or balance != "records":
        w.set_parts(counts, balance=balance)
    w.seal(**publish)
    return w


def read_all(bufs, layout, verify=True):
    return [read_slot(bufs, part=p, slot=0, seq=7, verify=verify) for p in range(layout.n_parts)]


# ------------------------------------------------------------------ layout
@pytest.mark.parametrize(("parts", "records", "payload", "keys"),
                         [(1, 1, 0, 0), (3, 100, 12345, 999), (8, 4096, 1 << 20, 1 << 16)])
def test_layout_sections_are_aligned_and_disjoint(parts, records, payload, keys):
    lo = SlotLayout(parts, records, payload, keys)
    names = ["parts", "offsets", "labels", "key_offsets", "keys", "payload"]
    sizes = [parts * PART_DTYPE.itemsize, (records + 1) * 8, records * 8, (records + 1) * 8,
             keys, payload]
    end = HEADER_DTYPE.itemsize
    for name, size in zip(names, sizes, strict=True):
        off = lo.offset(name)
        assert off % 64 == 0 and off >= end, (name, off, end)
        end = off + size
    assert lo.offset("payload") % PAGE == 0
    assert lo.slot_size % PAGE == 0 and lo.slot_size >= end
    assert lo.window_bytes(3) == 3 * lo.slot_size


@pytest.mark.parametrize("bad", [dict(n_parts=0), dict(max_records=0), dict(payload_capacity=-1),
                                 dict(key_capacity=-5), dict(max_records=2.5),
                                 dict(n_parts=True)])
def test_layout_rejects_bad_sizes(bad):
    args = dict(n_parts=2, max_records=4, payload_capacity=100, key_capacity=0) | bad
    with pytest.raises(ConfigError):
        SlotLayout(**args)


# ------------------------------------------------------------------ payload_bytes_for
@SETTINGS
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=200), st.integers(1, 50),
       st.randoms(use_true_random=False))
def test_payload_bytes_for_bounds_every_batch(sizes, batch, rnd):
    bound = payload_bytes_for(np.array(sizes), batch)
    assert bound == sum(sorted(sizes, reverse=True)[:batch])  # tight: the worst batch
    order = list(range(len(sizes)))
    rnd.shuffle(order)
    for start in range(0, len(order), batch):
        assert sum(sizes[i] for i in order[start : start + batch]) <= bound


def test_payload_bytes_for_rejects_bad_input():
    with pytest.raises(ConfigError):
        payload_bytes_for(np.array([1.5, 2.0]), 2)
    with pytest.raises(ConfigError):
        payload_bytes_for(np.array([1, -2]), 1)
    with pytest.raises(ConfigError):
        payload_bytes_for(np.array([1, 2]), 0)
    assert payload_bytes_for(np.array([], dtype=np.int64), 4) == 0


# ------------------------------------------------------------------ round trip
@SETTINGS
@given(n=st.integers(0, 32), n_parts=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       balance=st.sampled_from(["records", "bytes", "explicit"]),
       with_keys=st.sampled_from(["list", "pair", "none"]), with_labels=st.booleans(),
       checksum=st.sampled_from(["xxh64", "crc32", "none"]))
def test_round_trip_every_part(n, n_parts, seed, balance, with_keys, with_labels, checksum):
    rng = np.random.default_rng(seed)
    layout, bufs = new_slot(n_parts=n_parts)
    payload, offsets, labels, keys = gen_batch(rng, n, max_size=250)
    counts = None
    if balance == "explicit":
        cuts = np.sort(rng.integers(0, n + 1, n_parts - 1))
        counts = np.diff(np.concatenate(([0], cuts, [n])))
    key_arg = None
    if with_keys == "list":
        key_arg = keys
    elif with_keys == "pair":
        lens = np.array([len(k) for k in keys], dtype=np.int64)
        key_arg = (np.concatenate(([0], np.cumsum(lens))), b"".join(keys))
    write(bufs, payload, offsets, labels if with_labels else None, key_arg, counts=counts,
          balance="records" if balance == "explicit" else balance, checksum=checksum,
          codec="none", flags=FLAG_LAST_IN_EPOCH, first_sample=99)
    views = read_all(bufs, layout)
    nxt = 0
    for p, v in enumerate(views):
        assert (v.epoch, v.iteration, v.seq, v.slot, v.part) == (2, 11, 7, 0, p)
        assert v.first == nxt and v.batch_records == n and v.first_sample == 99
        assert v.last_in_epoch and not v.encoded and v.codec == "none"
        a, b = v.first, v.first + v.count
        lo, hi = int(offsets[a]), int(offsets[b])
        assert np.array_equal(v.payload, payload[lo:hi])
        assert np.array_equal(v.offsets, offsets[a : b + 1] - lo)
        exp_labels = labels[a:b] if with_labels else np.full(b - a, -1)
        assert np.array_equal(v.labels, exp_labels)
        assert v.keys() == (keys[a:b] if with_keys != "none" else [b""] * (b - a))
        if counts is not None:
            assert v.count == counts[p]
        elif balance == "records":
            assert v.count in (n // n_parts, n // n_parts + 1)
        nxt = b
    assert nxt == n


def test_views_are_zero_copy_and_read_only():
    _, bufs = new_slot(n_parts=2)
    rng = np.random.default_rng(1)
    payload, offsets, labels, keys = gen_batch(rng, 10)
    write(bufs, payload, offsets, labels, keys)
    v = read_slot(bufs, part=1, slot=0, seq=7)
    assert np.shares_memory(v.payload, bufs.mem) and np.shares_memory(v.labels, bufs.mem)
    with pytest.raises(ValueError):
        v.payload[0] = 1
    assert bytes(v.record(-1)) == payload[offsets[9] : offsets[10]].tobytes()
    with pytest.raises(IndexError):
        v.record(v.count)
    d = v.to_device()  # numpy: the same zero-copy views
    assert d.payload is v.payload and np.array_equal(d.labels, v.labels)
    released = []
    v._release_cb = released.append
    with v:
        pass
    assert released == [v] and v.released
    with pytest.raises(RingError, match="already released"):
        v.payload  # noqa: B018
    v.release()  # idempotent
    assert released == [v]


class FakeCupy:
    """A stand-in with cupy's surface, to check the pinning logic runs once per window."""

    class cuda:  # noqa: N801 - mirrors cupy.cuda
        class runtime:  # noqa: N801
            registered: ClassVar[list] = []

            @staticmethod
            def hostRegister(ptr, size, flags):  # noqa: N802
                FakeCupy.cuda.runtime.registered.append((ptr, size, flags))

        class _Stream:
            synced = 0

            def synchronize(self):
                FakeCupy.cuda._Stream.synced += 1

        @staticmethod
        def get_current_stream():
            return FakeCupy.cuda._Stream()

    @staticmethod
    def asarray(a):
        return np.array(a, copy=True)


def test_to_device_pins_and_copies():
    _, bufs = new_slot(n_parts=1)
    payload, offsets, labels, keys = gen_batch(np.random.default_rng(2), 5)
    write(bufs, payload, offsets, labels, keys)
    pins = []
    v = read_slot(bufs, part=0, slot=0, seq=7, pin=pins.append)
    d = v.to_device(FakeCupy)
    assert pins == [FakeCupy] and FakeCupy.cuda._Stream.synced == 1
    assert not np.shares_memory(d.payload, bufs.mem)
    assert np.array_equal(d.payload, payload) and np.array_equal(d.labels, labels)


def test_part_encoded_round_trip():
    layout, bufs = new_slot(n_parts=3, payload=4096)
    rng = np.random.default_rng(3)
    n = 12
    raw = [bytes([i % 7]) * int(rng.integers(50, 400)) for i in range(n)]  # compressible
    offsets = np.concatenate(([0], np.cumsum([len(r) for r in raw])))
    assert offsets[-1] > 2000
    w = SlotWriter(bufs, slot=0, seq=7, epoch=0, iteration=0)
    w.set_records(offsets, np.arange(n), decoded=True)
    w.set_parts([5, 0, 7])
    counts = [5, 0, 7]
    starts = [0, 5, 5]
    blobs = [zlib.compress(b"".join(raw[s : s + c])) for s, c in zip(starts, counts,
                                                                        strict=True)]
    w.write_part_blobs(blobs)
    w.seal(codec="zlib")
    for p, v in enumerate(read_all(bufs, layout)):
        assert v.encoded and v.codec == "zlib" and v.count == counts[p]
        decoded = zlib.decompress(v.payload.tobytes())
        recs = [decoded[a:b] for a, b in zip(v.offsets[:-1], v.offsets[1:], strict=True)]
        assert recs == raw[starts[p] : starts[p] + counts[p]]
        with pytest.raises(RingError, match="decoding"):
            v.record(0)



@SETTINGS
@given(n=st.integers(0, 32), n_parts=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       checksum=st.sampled_from(["xxh64", "crc32", "none"]))
def test_records_written_in_place_read_back_as_written(n, n_parts, seed, checksum):
    """A producer that fills the slot's buffers itself (the reader's compiled gather) gets
    the same slot as one that hands its arrays to write()."""
    rng = np.random.default_rng(seed)
    layout, bufs = new_slot(n_parts=n_parts)
    _, ref = new_slot(n_parts=n_parts)
    payload, offsets, labels, keys = gen_batch(rng, n, max_size=250)
    write(ref, payload, offsets, labels, keys, checksum=checksum)
    w = SlotWriter(bufs, slot=0, seq=7, epoch=2, iteration=11, checksum=checksum)
    pay, offs, kbuf, koffs = w.record_buffers(n)
    assert offs.size == koffs.size == n + 1
    pay[: offsets[-1]] = payload
    offs[:] = offsets
    kd = b"".join(keys)
    kbuf[: len(kd)] = np.frombuffer(kd, np.uint8)
    koffs[0] = 0
    np.cumsum([len(k) for k in keys], out=koffs[1:])
    w.records_written(n, labels, int(offsets[-1]), len(kd))
    w.seal()
    for got, want in zip(read_all(bufs, layout), read_all(ref, layout), strict=True):
        assert np.array_equal(got.payload, want.payload)
        assert np.array_equal(got.offsets, want.offsets)
        assert np.array_equal(got.labels, want.labels)
        assert got.keys() == want.keys() and got.count == want.count
    assert bytes(bufs.mem[: layout.slot_size]) == bytes(ref.mem[: layout.slot_size])


def test_records_written_checks_the_ends_it_is_told():
    _, bufs = new_slot(n_parts=2, max_records=4, payload=100, keys=8)
    w = SlotWriter(bufs, slot=0, seq=0, epoch=0, iteration=0)
    with pytest.raises(SlotCapacityError, match="needs 5 records"):
        w.record_buffers(5)
    _, offs, _, koffs = w.record_buffers(2)
    offs[:] = [0, 10, 30]
    koffs[:] = [0, 1, 2]
    with pytest.raises(RingError, match="do not run from 0 to 31 payload"):
        w.records_written(2, [1, 2], 31, 2)
    with pytest.raises(RingError, match="1 labels for 2 records"):
        w.records_written(2, [1], 30, 2)
    offs[:] = [0, 60, 120]
    with pytest.raises(SlotCapacityError, match="needs 120 payload bytes"):
        w.records_written(2, [1, 2], 120, 2)

# ------------------------------------------------------------------ errors on the writer
def test_capacity_errors_name_sizes():
    _, bufs = new_slot(n_parts=2, max_records=4, payload=100, keys=8)
    w = SlotWriter(bufs, slot=1, seq=5, epoch=3, iteration=9)
    with pytest.raises(SlotCapacityError, match=r"epoch 3, iteration 9\): batch needs 150 "
                                                r"payload bytes but a ring slot holds 100") as e:
        w.write(bytes(150), [0, 150])
    assert (e.value.needed, e.value.available) == (150, 100)
    with pytest.raises(SlotCapacityError, match=r"needs 5 records .* holds 4"):
        w.set_records(np.arange(6))
    with pytest.raises(SlotCapacityError, match="needs 9 key bytes"):
        w.write(bytes(4), [0, 2, 4], keys=[b"abcd", b"efghi"])
    with pytest.raises(SlotCapacityError):
        w.payload(101)
    assert w.payload(100).size == 100
    w.set_records([0, 500, 900], decoded=True)  # decoded sizes may exceed the slot ...
    with pytest.raises(SlotCapacityError, match="needs 101 payload bytes"):
        w.write_part_blobs([b"x" * 60, b"y" * 41])  # ... the stored blobs may not
    assert isinstance(e.value, LmdbioError)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda w: w.write(bytes(4), [1, 4]), r"offsets\[0\] must be 0"),
        (lambda w: w.write(bytes(4), [0, 3, 2]), "must not decrease"),
        (lambda w: w.write(bytes(4), [0, 2, 4], labels=[1]), "1 labels for 2 records"),
        (lambda w: w.write(bytes(4), [0, 2, 4], keys=[b"a"]), "1 keys for 2 records"),
        (lambda w: w.write(bytes(2), [0, 2, 4]), "only 2 bytes"),
        (lambda w: w.write(bytes(4), np.array([0.0, 4.0])), "integer"),
        (lambda w: w.set_parts([1, 1]), "set_records before set_parts"),
        (lambda w: w.seal(), "nothing to publish"),
        (lambda w: (w.write(bytes(4), [0, 4]), w.set_parts([1, 1, 0])), "summing to 1"),
        (lambda w: (w.write(bytes(4), [0, 4]), w.seal(codec="x" * 17)), "longer than 16"),
        (lambda w: (w.write(bytes(4), [0, 4]), w.seal(flags=4)), "FLAG_PART_ENCODED"),
        (lambda w: (w.set_records([0, 4], decoded=True), w.seal()), "no part blobs"),
        (lambda w: (w.write(bytes(4), [0, 4]), w.publish(), w.payload()), "already published"),
    ],
)
def test_writer_misuse_is_a_clear_error(call, match):
    _, bufs = new_slot(n_parts=2)
    w = SlotWriter(bufs, slot=0, seq=0, epoch=0, iteration=0)
    with pytest.raises(RingError, match=match):
        call(w)


# ------------------------------------------------------------------ corruption
def used_regions(layout, n, payload_bytes, key_bytes):
    """(start, stop) of every byte a reader of some part looks at."""
    return [
        (0, HEADER_DTYPE.itemsize),
        (layout.offset("parts"), layout.offset("parts") + layout.n_parts * PART_DTYPE.itemsize),
        (layout.offset("offsets"), layout.offset("offsets") + (n + 1) * 8),
        (layout.offset("labels"), layout.offset("labels") + n * 8),
        (layout.offset("key_offsets"), layout.offset("key_offsets") + (n + 1) * 8),
        (layout.offset("keys"), layout.offset("keys") + key_bytes),
        (layout.offset("payload"), layout.offset("payload") + payload_bytes),
    ]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), pick=st.floats(0, 1, exclude_max=True),
       bit=st.integers(0, 7), checksum=st.sampled_from(["xxh64", "crc32"]))
def test_any_flipped_bit_is_detected_by_its_reader(seed, pick, bit, checksum):
    rng = np.random.default_rng(seed)
    layout, bufs = new_slot(n_parts=3)
    n = int(rng.integers(3, 20))
    payload, offsets, labels, keys = gen_batch(rng, n, max_size=200)
    write(bufs, payload, offsets, labels, keys, checksum=checksum)
    good = [(v.payload.tobytes(), v.offsets.tolist(), v.labels.tolist(), v.keys())
            for v in read_all(bufs, layout)]
    regions = used_regions(layout, n, int(offsets[-1]), sum(map(len, keys)))
    total = sum(b - a for a, b in regions)
    k = int(pick * total)
    for a, b in regions:
        if k < b - a:
            pos = a + k
            break
        k -= b - a
    bufs.mem[pos] ^= np.uint8(1 << bit)
    detected = 0
    for p in range(layout.n_parts):
        try:
            v = read_slot(bufs, part=p, slot=0, seq=7)
        except SlotCorruptError as exc:
            assert exc.part == p and exc.slot == 0 and exc.seq == 7
            detected += 1
            continue
        # an undetected flip must be outside what this part reads: its data are intact
        assert (v.payload.tobytes(), v.offsets.tolist(), v.labels.tolist(), v.keys()) \
            == good[p]
    assert detected >= 1, f"flip at byte {pos} bit {bit} went unnoticed by every part"


@pytest.mark.parametrize("checksum", ["xxh64", "crc32"])
def test_deferred_verification_detects_what_the_immediate_one_does(checksum):
    """``defer=True`` validates the header and ranges at once and leaves the part checksum
    to ``view.verify()`` (a worker's decoding thread), which raises on a changed byte."""
    _, bufs = new_slot(n_parts=2)
    payload, offsets, labels, keys = gen_batch(np.random.default_rng(9), 10)
    write(bufs, payload, offsets, labels, keys, checksum=checksum)
    v = read_slot(bufs, part=1, slot=0, seq=7, defer=True)
    assert not v.verified
    v.verify()
    assert v.verified
    v.verify()  # once verified, a no-op
    bufs.payload[int(offsets[-1]) - 1] ^= 0x01  # the last byte: part 1's
    v = read_slot(bufs, part=1, slot=0, seq=7, defer=True)  # the header is intact
    with pytest.raises(SlotCorruptError, match="checksum mismatch") as e:
        v.verify()
    assert e.value.part == 1
    with pytest.raises(SlotCorruptError, match="checksum mismatch"):
        read_slot(bufs, part=1, slot=0, seq=7)  # what the immediate check says


@pytest.mark.parametrize("checksum", ["xxh64", "crc32"])
def test_the_writers_own_part_is_not_checksummed(checksum):
    """A colocated reader reads its own part in the process that wrote it: the writer
    computes no checksum for that part (0 in the part table), the other parts keep theirs."""
    layout, bufs = new_slot(n_parts=3)
    payload, offsets, labels, keys = gen_batch(np.random.default_rng(11), 12)
    w = SlotWriter(bufs, slot=0, seq=7, epoch=2, iteration=11, checksum=checksum, own_part=1)
    w.write(payload, offsets, labels, keys)
    w.seal()
    stored = [int(e["checksum"]) for e in bufs.parts[: layout.n_parts]]
    assert stored[1] == 0 and stored[0] != 0 and stored[2] != 0
    for p in (0, 2):
        read_slot(bufs, part=p, slot=0, seq=7)  # verified
    own = read_slot(bufs, part=1, slot=0, seq=7, verify=False)
    whole = read_all(bufs, layout, verify=False)
    assert own.payload.tobytes() == whole[1].payload.tobytes()
    with pytest.raises(SlotCorruptError, match="checksum mismatch"):
        read_slot(bufs, part=1, slot=0, seq=7)  # nothing stored to verify against


def test_checksum_off_still_checks_the_header():
    _, bufs = new_slot(n_parts=1)
    payload, offsets, labels, keys = gen_batch(np.random.default_rng(5), 8)
    write(bufs, payload, offsets, labels, keys, checksum=False)
    bufs.payload[0] ^= 0xFF  # payload changes go unnoticed without checksums ...
    v = read_slot(bufs, part=0, slot=0, seq=7)
    assert v.payload[0] == payload[0] ^ 0xFF
    bufs.header["n_records"] += 1  # ... header changes never do
    with pytest.raises(SlotCorruptError, match="header checksum"):
        read_slot(bufs, part=0, slot=0, seq=7)


def test_wrong_sequence_or_magic_is_named():
    _, bufs = new_slot(n_parts=1)
    payload, offsets, labels, keys = gen_batch(np.random.default_rng(6), 4)
    write(bufs, payload, offsets, labels, keys)
    with pytest.raises(SlotCorruptError, match="overwritten before it was released") as e:
        read_slot(bufs, part=0, slot=0, seq=8)
    assert (e.value.epoch, e.value.iteration) == (2, 11)
    bufs.header["magic"] = 0
    with pytest.raises(SlotCorruptError, match="bad magic"):
        read_slot(bufs, part=0, slot=0, seq=7)
    _, fresh = new_slot(n_parts=1)
    with pytest.raises(SlotCorruptError, match="never written"):
        read_slot(fresh, part=0, slot=0, seq=0)


def reseal_header(bufs):
    """Recompute header_crc so that only the bounds checks stand between a forged header
    and the reader (the strongest attack on the reader's bounds checks)."""
    from lmdbio.shm.layout import header_crc

    bufs.header["header_crc"] = header_crc(bufs.header.tobytes(), bufs.parts.tobytes())


#: seeds of cases that once found a bug (none yet: the reader held); always run
SLOT_REGRESSION_SEEDS: tuple[int, ...] = ()
_SLOT_HEADER_FIELDS = ("n_records", "payload_bytes", "key_bytes", "n_parts", "flags",
                       "checksum", "first_sample")
_PART_FIELDS = ("first", "count", "byte_start", "byte_end", "key_start", "key_end")
#: a slot's size is fixed by its ring: no whole-buffer truncation or extension
_SLOT_KINDS = {**structfuzz.KINDS, "truncate": 0, "extend": 0}


def _slot_parts(layout: SlotLayout, mem: np.ndarray, n: int) -> structfuzz.Parsed:
    """A written slot as its header and part-table integers, its record and key offset
    tables (one field per entry) and its sections (used payload, used key bytes, labels);
    ``build`` writes them into a copy of the slot and recomputes the header crc, so only
    ``read_slot``'s bounds checks stand between a forged slot and a worker."""
    from lmdbio.shm.layout import header_crc

    base = SlotBuffers(layout, mem.copy())
    fields: dict[str, int] = {k: int(base.header[k][0]) for k in _SLOT_HEADER_FIELDS}
    limits = {k: structfuzz.int_limits(HEADER_DTYPE[k].itemsize, HEADER_DTYPE[k].kind == "i")
              for k in _SLOT_HEADER_FIELDS}
    for w in range(layout.n_parts):
        for k in _PART_FIELDS:
            fields[f"p{w}_{k}"] = int(base.parts[w][k])
            limits[f"p{w}_{k}"] = structfuzz.int_limits(8, signed=True)
    for i in range(n + 1):
        fields[f"off{i}"], limits[f"off{i}"] = int(base.offsets[i]), structfuzz.int_limits(8, True)
        fields[f"koff{i}"] = int(base.key_offsets[i])
        limits[f"koff{i}"] = structfuzz.int_limits(8, True)
    pay, kb = int(base.header["payload_bytes"][0]), int(base.header["key_bytes"][0])
    sections = {"payload": base.payload[:pay].tobytes(), "keys": base.keys[:kb].tobytes(),
                "labels": base.labels[:n].tobytes()}

    def build(f: dict[str, int], sec: dict[str, bytes]) -> bytes:
        b = SlotBuffers(layout, mem.copy())
        for k in _SLOT_HEADER_FIELDS:
            b.header[k] = f[k]
        for w in range(layout.n_parts):
            for k in _PART_FIELDS:
                b.parts[w][k] = f[f"p{w}_{k}"]
        for i in range(n + 1):
            b.offsets[i], b.key_offsets[i] = f[f"off{i}"], f[f"koff{i}"]
        for name, area in (("payload", b.payload), ("keys", b.keys),
                           ("labels", b.labels.view(np.uint8))):
            data = sec[name][:area.size]
            area[:len(data)] = np.frombuffer(data, np.uint8)
        b.header["header_crc"] = header_crc(b.header.tobytes(), b.parts.tobytes())
        return b.mem.tobytes()

    return structfuzz.Parsed(fields, limits, sections, build)


@pytest.mark.parametrize("seed", structfuzz.fuzz_seeds(SLOT_REGRESSION_SEEDS))
def test_structured_fuzz_reaches_the_workers(seed):
    """Slots written by SlotWriter with Caffe Datum records, one header, part-table or
    offset field or one section forged (header crc recomputed), read by every worker from
    a buffer that ends at an unreadable page: a SlotCorruptError, or a view that lies inside
    the slot and is self-consistent, whose records the worker's Datum decoder turns into
    rows or RecordErrors (the original rows when nothing changed). Most forged slots are
    accepted by at least one worker and reach its decoder."""
    from lmdbio.codecs.datum import datum_from_array, decode_datum_batch, encode_datum
    from lmdbio.errors import CodecError, RecordError

    rng = random.Random(seed)
    tally = structfuzz.Tally("slot", seed)
    layout = SlotLayout(2, 8, 4096, 256)
    for case in range(80):
        nrng = np.random.default_rng(rng.getrandbits(32))
        n = rng.randint(1, 8)
        shape = (rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 4))
        px = nrng.integers(0, 256, (n, *shape), dtype=np.uint8)
        vals = [encode_datum(datum_from_array(px[i], i)) for i in range(n)]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum([len(v) for v in vals], out=offsets[1:])
        bufs = SlotBuffers(layout, np.zeros(layout.slot_size, np.uint8))
        write(bufs, np.frombuffer(b"".join(vals), np.uint8), offsets, np.arange(n),
              [b"k%d" % i for i in range(n)], checksum=rng.choice([False, "crc32", "xxh64"]))
        mut = structfuzz.mutate(_slot_parts(layout, bufs.mem, n), rng, _SLOT_KINDS)

        def one(mut=mut, px=px):
            fb = SlotBuffers(layout, structfuzz.guarded(mut.data))
            outcome = "error:header"
            for p in range(layout.n_parts):
                try:
                    v = read_slot(fb, part=p, slot=0, seq=7, verify=rng.random() < 0.5)
                except SlotCorruptError:
                    continue
                for arr in (v.payload, v.labels, v.key_data):
                    assert np.shares_memory(arr, fb.mem) or arr.size == 0
                assert v.offsets[0] == 0 and np.all(np.diff(v.offsets) >= 0)
                assert v.offsets[-1] == v.payload.size
                assert v.key_offsets[-1] == v.key_data.size
                assert v.first >= 0 and v.first + v.count <= layout.max_records
                assert len(v.keys()) == v.count
                batch = decode_datum_batch(v.payload, v.offsets, errors="mask")
                assert batch.data.shape[0] == v.count
                if mut.benign and v.count:
                    assert batch.valid.all()
                    assert np.array_equal(batch.data, px[v.first:v.first + v.count])
                    assert v.labels.tolist() == list(range(v.first, v.first + v.count))
                outcome = "ok" if outcome != "error:decode" and batch.valid.all() \
                    else "error:decode"
            return outcome

        tally.add(structfuzz.run_case("slot", seed, case, mut.what, one,
                                      (SlotCorruptError, CodecError, RecordError)))
    tally.require(("ok", "error:decode"), 0.5)


# ------------------------------------------------------------------ checksums
def test_xxh64_matches_the_reference_vectors():
    from lmdbio.kernel_args import read_only
    from lmdbio.shm.kernels import xxh64

    def h(data: bytes, seed: int = 0) -> int:
        return int(xxh64(np.frombuffer(data, dtype=np.uint8), np.uint64(seed)))

    # published XXH64 values (xxHash test suite / python-xxhash README)
    assert h(b"") == 0xEF46DB3751D8E999
    assert h(b"a") == 0xD24EC4F1A98C6E5B
    assert h(b"abc") == 0x44BC2CF5AD770999
    assert h(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1
    # every tail length and any alignment give the same value as a fresh aligned copy
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 300, dtype=np.uint8)
    for start in range(9):
        for n in (0, 1, 3, 4, 7, 8, 31, 32, 33, 63, 64, 65, 200):
            view = raw[start : start + n]
            assert int(xxh64(read_only(view), np.uint64(5))) == h(view.tobytes(), 5)
    assert h(b"abc", 1) != h(b"abc", 0)


@pytest.mark.parametrize(("value", "kind"), [(True, 2), ("xxh64", 2), ("CRC32", 1),
                                             (False, 0), (None, 0), ("none", 0), (1, 1)])
def test_checksum_kind_names(value, kind):
    from lmdbio.shm.layout import checksum_kind

    assert checksum_kind(value) == kind


@pytest.mark.parametrize("bad", ["md5", 7, 2.0])
def test_checksum_kind_rejects_unknown(bad):
    from lmdbio.shm.layout import checksum_kind

    with pytest.raises(ConfigError, match="checksum must be"):
        checksum_kind(bad)


# ------------------------------------------------------------------ backing files
def test_backing_file_follows_the_name():
    d = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="lmdbio-test-", dir=d)
    try:
        os.ftruncate(fd, PAGE)
        m = mmap.mmap(fd, PAGE)
        arr = np.frombuffer(m, dtype=np.uint8)
        addr = arr.ctypes.data
        assert backing_file(addr) == path
        assert unlink_quietly(path) and not os.path.exists(path)
        assert backing_file(addr) is None  # unlinked: nothing left to clean
        assert mapping_path(addr).endswith("(deleted)")
        assert not unlink_quietly(path)
        del arr
        m.close()
    finally:
        os.close(fd)
        unlink_quietly(path)
    anon = mmap.mmap(-1, PAGE)
    a = np.frombuffer(anon, dtype=np.uint8)
    assert backing_file(a.ctypes.data) is None
    del a
    anon.close()


@SETTINGS
@given(n=st.integers(0, 30), n_parts=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       checksum=st.sampled_from(["xxh64", "crc32", "none"]))
def test_by_reference_slots_carry_spans_labels_and_keys(n, n_parts, seed, checksum):
    """``set_spans``: each part reads back its records' (start, length) spans, labels and
    keys; no record byte is in the slot, and ``record()`` says so."""
    rng = np.random.default_rng(seed)
    layout, bufs = new_slot(n_parts=n_parts)
    starts = rng.integers(0, 10**9, n)
    lengths = rng.integers(0, 10**6, n)  # far beyond the payload capacity: not copied
    labels = rng.integers(-1, 10**6, n)
    keys = [b"k%05d" % i for i in range(n)]
    w = SlotWriter(bufs, slot=0, seq=7, epoch=2, iteration=11, checksum=checksum)
    w.set_spans(starts, lengths, labels, keys)
    w.seal()
    got_s, got_l, got_lab, got_k = [], [], [], []
    for v in read_all(bufs, layout):
        assert v.by_reference and not v.encoded
        s, ln = v.spans
        got_s += s.tolist()
        got_l += ln.tolist()
        got_lab += v.labels.tolist()
        got_k += v.keys()
        if v.count:
            with pytest.raises(RingError, match="by-reference"):
                v.record(0)
    assert (got_s, got_l, got_lab, got_k) == (starts.tolist(), lengths.tolist(),
                                              labels.tolist(), keys)


@SETTINGS
@given(n=st.integers(0, 30), n_parts=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       checksum=st.sampled_from(["xxh64", "crc32", "none"]))
def test_keys_by_reference_travel_as_spans_in_8_bytes_a_record(n, n_parts, seed, checksum):
    """``set_spans(key_spans=...)``: each part reads back its keys' (start, length) spans;
    the key area holds 8 bytes per record whatever the key lengths (LMDB's 511 included)."""
    rng = np.random.default_rng(seed)
    layout, bufs = new_slot(n_parts=n_parts, max_records=32, keys=8 * 32)
    starts, lengths = rng.integers(0, 10**9, n), rng.integers(0, 10**6, n)
    kstarts, klengths = rng.integers(0, 10**9, n), rng.integers(0, 512, n)
    w = SlotWriter(bufs, slot=0, seq=7, epoch=2, iteration=11, checksum=checksum)
    w.set_spans(starts, lengths, np.arange(n), key_spans=(kstarts, klengths))
    w.seal()
    got_s, got_l = [], []
    for v in read_all(bufs, layout):
        assert v.by_reference and v.keys_by_reference
        s, ln = v.key_spans
        got_s += s.tolist()
        got_l += ln.tolist()
        with pytest.raises(RingError, match="key_spans"):
            v.keys()
    assert (got_s, got_l) == (kstarts.tolist(), klengths.tolist())


@pytest.mark.parametrize("checksum", ["xxh64", "crc32"])
def test_a_changed_key_span_is_detected_and_misplaced_tables_refused(checksum):
    _, bufs = new_slot(n_parts=2)
    w = SlotWriter(bufs, slot=0, seq=7, epoch=0, iteration=0, checksum=checksum)
    w.set_spans([4096, 8192, 12288, 20000], [100, 200, 300, 400], [1, 2, 3, 4],
                key_spans=([4000, 8100, 12200, 19900], [8, 8, 9, 9]))
    w.seal()
    bufs.keys[8 * 2] ^= 1  # a byte of record 2's key start (part 1)
    assert read_slot(bufs, part=0, slot=0, seq=7).key_spans[0].tolist() == [4000, 8100]
    with pytest.raises(SlotCorruptError, match="checksum mismatch"):
        read_slot(bufs, part=1, slot=0, seq=7)
    bufs.key_offsets[3] += 1  # a key length (part 1): covered as well
    with pytest.raises(SlotCorruptError, match="checksum mismatch"):
        read_slot(bufs, part=1, slot=0, seq=7)
    with pytest.raises(RingError, match="not both"):
        w2 = SlotWriter(bufs, slot=0, seq=8, epoch=0, iteration=0)
        w2.set_spans([1], [1], keys=[b"k"], key_spans=([1], [1]))
    with pytest.raises(SlotCapacityError, match="key bytes"):
        _, small = new_slot(n_parts=1, max_records=32, keys=8 * 3)
        SlotWriter(small, slot=0, seq=1, epoch=0, iteration=0).set_spans(
            [1, 2, 3, 4], [1, 1, 1, 1], key_spans=([1, 2, 3, 4], [1, 1, 1, 1]))


@pytest.mark.parametrize("checksum", ["xxh64", "crc32"])
def test_a_changed_span_is_detected(checksum):
    _, bufs = new_slot(n_parts=2)
    w = SlotWriter(bufs, slot=0, seq=7, epoch=0, iteration=0, checksum=checksum)
    w.set_spans([4096, 8192, 12288, 20000], [100, 200, 300, 400], [1, 2, 3, 4])
    w.seal()
    bufs.payload[8 * 3 + 1] ^= 1  # a byte of record 3's start (part 1)
    assert read_slot(bufs, part=0, slot=0, seq=7).spans[0].tolist() == [4096, 8192]
    with pytest.raises(SlotCorruptError, match="checksum mismatch") as info:
        read_slot(bufs, part=1, slot=0, seq=7)
    assert info.value.part == 1


def test_spans_that_are_not_spans_are_refused():
    _, bufs = new_slot(n_parts=1)
    w = SlotWriter(bufs, slot=0, seq=7, epoch=0, iteration=0)
    with pytest.raises(RingError, match="negative"):
        w.set_spans([-1], [10])
    with pytest.raises(RingError, match="lengths"):
        w.set_spans([1, 2], [10])
    plain = SlotWriter(bufs, slot=0, seq=7, epoch=0, iteration=0)
    plain.write(np.zeros(10, np.uint8), [0, 10])
    plain.seal()
    with pytest.raises(RingError, match="not spans"):
        _ = read_slot(bufs, part=0, slot=0, seq=7).spans
