"""What the service benchmark relies on: the float32 Datum decoding an identity transform
uses, the loader's output with and without slot checksums, the steady-state accounting of
``lmdbio run`` (--step-seconds, --warmup), and the py-lmdb baseline (DistributedSampler
order, the Datum parse a PyTorch Dataset does)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loaders
from bench.lmdbgen import write_db
from lmdbio.codecs.datum import (
    Datum,
    datum_from_array,
    decode_datum,
    decode_datum_batch,
    encode_datum,
)
from lmdbio.codecs.record_batch import pack_values
from lmdbio.commands.run import SteadyMeter, process_age, totals
from loaders.decode import make_decoder, uniform_datums_float32
from tests.mpi_harness import OPENMPI_ENV, require_mpiexec

# ------------------------------------------------------------------------ float32 decoding


def _batch(shapes_labels, seed=0):
    rng = np.random.default_rng(seed)
    values = [encode_datum(datum_from_array(rng.integers(0, 256, s, dtype=np.uint8), lab))
              for s, lab in shapes_labels]
    buf, offsets, _ = pack_values(values)
    bounds = np.zeros(len(values) + 1, np.int64)
    bounds[1:] = offsets + np.array([len(v) for v in values])
    return buf, bounds, values


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), c=st.integers(1, 3), h=st.integers(1, 7), w=st.integers(1, 7),
       labels=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=9, max_size=9),
       seed=st.integers(0, 1000))
def test_float32_decoding_equals_decode_then_convert(n, c, h, w, labels, seed):
    buf, bounds, _ = _batch([((c, h, w), labels[i]) for i in range(n)], seed)
    got = uniform_datums_float32(buf, bounds)
    assert got is not None
    ref = decode_datum_batch(buf, bounds)
    assert got[0].dtype == np.float32 and got[0].shape == (n, c, h, w)
    np.testing.assert_array_equal(got[0], ref.data.astype(np.float32))
    np.testing.assert_array_equal(got[1], ref.labels)
    ro = buf.copy()
    ro.flags.writeable = False  # slots reach the decoder as read-only views
    np.testing.assert_array_equal(uniform_datums_float32(ro, bounds)[0], got[0])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), src_off=st.integers(0, 70), dst_off=st.integers(0, 17),
       streaming=st.booleans(), seed=st.integers(0, 1000))
def test_widening_writes_exactly_the_row_at_any_alignment(n, src_off, dst_off, streaming,
                                                          seed):
    """Streaming stores cover the 64-byte-aligned middle of a row; the scalar head and tail
    the rest: every length and misalignment gives ``astype(float32)`` and leaves the
    neighbours of the row untouched."""
    from lmdbio.kernel_args import read_only
    from lmdbio.kernels import widen_u8_f32

    src = np.random.default_rng(seed).integers(0, 256, src_off + n + 5, dtype=np.uint8)
    dst = np.full(dst_off + n + 20, -1.0, np.float32)
    # same thread: no fence
    widen_u8_f32(read_only(src), src_off, dst[dst_off:dst_off + n], streaming)
    np.testing.assert_array_equal(dst[dst_off:dst_off + n],
                                  src[src_off:src_off + n].astype(np.float32))
    assert (dst[:dst_off] == -1).all() and (dst[dst_off + n:] == -1).all()


@pytest.mark.parametrize("policy", ["always", "never"], ids=["streaming", "ordinary"])
def test_float32_batches_equal_with_streaming_and_ordinary_stores(monkeypatch, policy):
    """Both store kinds the decoder writes with (LMDBIO_STREAMING_STORES, loaders.stores)
    give the reference pixels, also for rows whose length is no multiple of a cache
    line."""
    import loaders.decode as dec
    import loaders.stores

    monkeypatch.setattr(loaders.stores, "STORES", loaders.stores.StoreChoice(policy))
    for shape in [(3, 32, 32), (3, 17, 13), (1, 1, 1)]:
        buf, bounds, _ = _batch([(shape, i) for i in range(7)], seed=sum(shape))
        got = dec.uniform_datums_float32(buf, bounds, lambda s, d: np.full(s, np.nan, d))
        ref = decode_datum_batch(buf, bounds)
        np.testing.assert_array_equal(got[0], ref.data.astype(np.float32))
        np.testing.assert_array_equal(got[1], ref.labels)


def test_float32_decoding_declines_what_is_not_the_common_case():
    buf, bounds, values = _batch([((3, 4, 4), 1), ((3, 4, 5), 2)])  # two shapes
    assert uniform_datums_float32(buf, bounds) is None
    floats = encode_datum(datum_from_array(np.ones((1, 2, 2), np.float32), 0))
    encoded = encode_datum(Datum(data=b"\x89PNG", label=0, encoded=True))
    good = values[0]
    for odd in (floats, encoded, good[:len(good) // 2]):  # float_data, encoded, truncated
        b, _, _ = pack_values([good, odd])
        bounds = np.array([0, len(good), len(good) + len(odd)], np.int64)
        assert uniform_datums_float32(b, bounds) is None
    assert uniform_datums_float32(np.zeros(0, np.uint8), np.zeros(1, np.int64)) is None
    huge = encode_datum(Datum(channels=207_061_291, height=2, width=4356, data=bytes(8)))
    b, _, _ = pack_values([huge, good])  # a corrupt header: 1.64 TiB claimed, 8 B held
    bounds = np.array([0, len(huge), len(huge) + len(good)], np.int64)
    assert uniform_datums_float32(b, bounds) is None


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_float32_decoder_falls_back_to_the_checked_path(on_error):
    cfg = SimpleNamespace(dataset=SimpleNamespace(layout="caffe-datum"), on_error=on_error)
    fast, general = make_decoder(cfg, float32=True), make_decoder(cfg)
    buf, bounds, values = _batch([((1, 3, 3), i) for i in range(5)])
    data, labels, valid, errors = fast(buf, bounds, None)
    assert data.dtype == np.float32 and valid.all() and not errors
    ref = general(buf, bounds, None)
    np.testing.assert_array_equal(data, ref[0].astype(np.float32))
    np.testing.assert_array_equal(labels, ref[1])
    bad = [*values[:2], values[2][:len(values[2]) // 2], *values[3:]]  # data cut short
    b, _, _ = pack_values(bad)
    bb = np.zeros(6, np.int64)
    bb[1:] = np.cumsum([len(v) for v in bad])
    if on_error == "raise":
        with pytest.raises(Exception, match="bad Caffe Datum"):
            fast(b, bb, lambda i: b"key%d" % i)
        return
    d2, _, v2, e2 = fast(b, bb, lambda i: b"key%d" % i)
    assert list(v2) == [True, True, False, True, True] and len(e2) == 1
    assert "key2" in str(e2[0])
    np.testing.assert_array_equal(d2[v2], ref[0][[0, 1, 3, 4]])


# ------------------------------------------------------------------------ the loader


@pytest.fixture(scope="module")
def small_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("service-bench-db")
    rng = np.random.default_rng(3)
    items = [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (3, 5, 4), dtype=np.uint8), i % 11))) for i in range(50)]
    write_db(path, items)
    return path, {k: decode_datum(v) for k, v in items}


@pytest.mark.parametrize("checksum", [True, "crc32", False])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_loader_batches_are_the_pixels_as_float32(small_db, checksum, scale):
    path, truth = small_db
    cfg = {"dataset": {"path": str(path), "layout": "caffe-datum"},
           "batch": {"size": 8, "last": "pad"}, "readers": {"strategy": "indexed"},
           "shuffle": {"mode": "global", "seed": 4}, "transform": {"scale": scale},
           "metrics": {"every": 0}, "workers": {"device": "cpu"}}  # compared with numpy
    seen = 0
    with loaders.open(cfg, slot_checksum=checksum) as loader:
        for batch in loader:
            assert batch.data.dtype == np.float32
            for key, img, label in zip(batch.keys, batch.data, batch.label, strict=True):
                d = truth[key]
                np.testing.assert_array_equal(
                    img, d.to_array().astype(np.float32) * np.float32(scale))
                assert int(label) == d.label
            seen += int((~batch.padding).sum())
    assert seen == len(truth)


# ------------------------------------------------------------------------ lmdbio run figures


def test_steady_meter_leaves_out_the_warmup():
    m = SteadyMeter(2)
    metrics = SimpleNamespace(samples=0, wait_seconds=0.0, blocked_seconds=0.0)
    m.begin(metrics)
    for i in range(1, 6):
        metrics.samples, metrics.wait_seconds = 10 * i, 0.5 * i
        metrics.blocked_seconds = 0.1 * i
        m.in_loader += 1.0
        m.mark(metrics)
    m.finish()
    d = m.as_dict()
    assert d["batches"] == 3 and d["samples"] == 30
    assert d["wait_seconds"] == pytest.approx(1.5) and d["loader_seconds"] == pytest.approx(3.0)
    assert d["blocked_seconds"] == pytest.approx(0.3)  # the window's share only
    assert d["blocked_fraction"] == pytest.approx(0.3 / d["seconds"])
    assert d["cpu_seconds"] >= 0
    short = SteadyMeter(5)
    short.mark(metrics)
    assert short.as_dict() is None  # not past the warmup: no steady state to report
    zero = SteadyMeter(0)
    zero.begin(metrics)
    zero.mark(metrics)
    zero.finish()
    assert zero.as_dict()["batches"] == 1


def test_totals_sum_workers_and_count_reader_cpu():
    def rank(worker, samples, seconds, cpu, reader_cpu=None):
        steady = {"samples": samples, "seconds": seconds, "seconds_per_batch": 0.1,
                  "stall_fraction": 0.2, "loader_fraction": 0.3, "cpu_seconds": cpu,
                  "blocked_fraction": 0.01 * samples / 100} if worker else None
        return {"worker": worker, "samples": samples, "seconds": seconds + 1,
                "stall_fraction": 0.2, "steady": steady, "loop": {"cpu_seconds": 1.0},
                "reader_steady": {"cpu_seconds": reader_cpu} if reader_cpu else None,
                "startup": {"to_open": 1.0, "open_seconds": 2.0, "to_first_batch": 0.5}}
    t = totals([rank(False, 0, 0, 0, reader_cpu=2.0), rank(True, 100, 2.0, 1.0),
                rank(True, 300, 4.0, 1.0)], 1, "indexed", "dedicated", 0.0)
    st_ = t["steady"]
    assert st_["samples"] == 400 and st_["seconds"] == 4.0
    assert st_["samples_per_second"] == 100.0 and st_["samples_per_second_per_worker"] == 50.0
    assert st_["cpu_microseconds_per_sample"] == pytest.approx(1e6 * 4.0 / 400)
    assert st_["blocked_fraction_mean"] == pytest.approx(0.02)
    assert st_["blocked_fraction_max"] == pytest.approx(0.03)
    assert t["startup"] == {"to_open": 1.0, "open_seconds": 2.0, "to_first_batch": 0.5}


def test_process_age_is_the_time_since_this_process_started():
    age = process_age()
    if age is None:
        pytest.skip("no /proc here")
    assert 0 < age < 24 * 3600


def _launch_env() -> dict[str, str]:
    """This environment for a child ``mpiexec``, without the Open MPI settings an in-process
    singleton (the loader tests above) exported for itself (``OMPI_MCA_btl=self``)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    return {**env, **OPENMPI_ENV}


@pytest.mark.mpiexec
def test_lmdbio_run_reports_steady_state_with_a_training_step(small_db, tmp_path):
    mpiexec = require_mpiexec()
    path, truth = small_db
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"dataset: {{path: {path}, layout: caffe-datum}}\n"
                   "batch: {size: 4}\nreaders: {strategy: indexed, mode: dedicated}\n"
                   "topology: {simulate_nodes: 1}\nepochs: 2\nmetrics: {every: 0}\n")
    out = tmp_path / "m.json"
    proc = subprocess.run(
        [str(mpiexec), "-n", "3", sys.executable, "-m", "lmdbio.cli", "run", str(cfg),
         "--step-seconds", "0.002", "--warmup", "3", "--slot-checksum", "none",
         "--metrics-json", str(out)],
        env=_launch_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    t = res["totals"]
    assert t["workers"] == 2 and t["step_seconds"] == 0.002 and t["slot_checksum"] == "none"
    batches = -(-len(truth) // 4) * 2  # per worker: 13 iterations per epoch, 2 epochs
    workers = [r for r in res["per_rank"] if r["worker"]]
    assert [w["batches"] for w in workers] == [batches, batches]
    assert all(w["steady"]["batches"] == batches - 3 for w in workers)
    # each steady batch includes the 2 ms step (a lower bound: time.sleep never returns
    # early, so a busy machine cannot break it)
    assert all(w["steady"]["seconds"] >= 0.002 * (batches - 3) for w in workers)
    assert all(0 <= w["steady"]["loader_fraction"] <= 1 for w in workers)
    reader = next(r for r in res["per_rank"] if not r["worker"])
    assert reader["reader_steady"]["batches"] == batches - 3
    assert t["steady"]["samples"] == 2 * 2 * (batches - 3)


# ------------------------------------------------------------------------ the baseline


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 9), seed=st.integers(0, 50),
       epoch=st.integers(0, 3))
def test_baseline_sampler_is_distributed_samplers_order(n, world, seed, epoch):
    from lmdbio.pylmdb_per_rank import sampler_indices

    parts = [sampler_indices(n, world, r, seed, epoch) for r in range(world)]
    per = -(-n // world)
    assert all(p.shape == (per,) for p in parts)
    everything = np.concatenate(parts)
    assert set(everything.tolist()) == set(range(n))  # every record, padding repeats some
    order = np.random.default_rng(seed + epoch).permutation(n)
    padded = np.concatenate([order, np.resize(order, per * world - n)])
    for r in range(world):  # DistributedSampler: indices[rank:total_size:num_replicas]
        np.testing.assert_array_equal(parts[r], padded[r::world])


@pytest.mark.parametrize("kind", ["protobuf", "python"])
def test_baseline_getitem_parses_datums_like_lmdbio(kind):
    from lmdbio import pylmdb_per_rank as sb

    if kind == "protobuf" and sb.protobuf_datum_class() is None:
        pytest.skip("protobuf is not installed")
    _, getitem = sb.make_getitem(kind)
    rng = np.random.default_rng(0)
    for shape, label in (((3, 4, 5), 7), ((1, 1, 1), -3), ((2, 9, 2), 2**31 - 1)):
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        arr, lab = getitem(encode_datum(datum_from_array(img, label)))
        np.testing.assert_array_equal(arr, img)
        assert lab == label


def test_baseline_runs_the_same_batches(small_db, tmp_path):
    from lmdbio import pylmdb_per_rank as sb

    pytest.importorskip("mpi4py")
    path, _ = small_db
    p = argparse.ArgumentParser()
    sb.add_arguments(p)
    out = tmp_path / "b.json"
    args = p.parse_args([str(path), "--batch-size", "8", "--batches", "9", "--warmup", "2",
                         "--json", str(out)])
    assert sb.main(args) == 0
    res = json.loads(Path(out).read_text())
    r = res["per_rank"][0]
    assert r["batches"] == 9 and r["samples"] == 72  # drop_last: every batch is full
    assert r["steady"]["batches"] == 7 and 0 < r["steady"]["loader_fraction"] <= 1
    with pytest.raises(SystemExit, match="larger than a rank's share"):
        sb.main(p.parse_args([str(path), "--batch-size", "51", "--batches", "1"]))


@pytest.mark.parametrize(("uint8", "scale"), [(True, None), (False, None), (False, 0.25)])
def test_baseline_batches_are_what_the_options_say(uint8, scale):
    """pylmdb_per_rank.collate: stacked uint8 (--uint8), float32, or float32 scaled (--scale):
    the last the output lmdbio's workers deliver under transform.scale."""
    from lmdbio import pylmdb_per_rank as sb

    images = [np.full((1, 2, 2), v, np.uint8) for v in (4, 8)]
    got = sb.collate(images, uint8, None if scale is None else np.float32(scale))
    want = np.stack(images)
    if not uint8:
        want = want.astype(np.float32) * np.float32(scale or 1.0)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
