"""loaders.device_feed: the GPU worker's pinned staging ring, copy stream and events, run
against the numpy stand-in of tests/fake_gpu.py (nothing here touches a GPU). With
``cupy.cuda.deferred`` the stand-in's stream queues its copies until an event recorded
after them is synchronized, so a copy that read its pinned buffer after the feed refilled
it, or a consumer that read a device array before its copy, shows as wrong values."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import loaders
from bench.lmdbgen import write_db
from lmdbio.codecs.datum import datum_from_array, encode_datum
from lmdbio.codecs.tensor import encode_tensor
from loaders.device_feed import ALIGN, DeviceFeed, DeviceFeedError
from tests import fake_gpu


@pytest.fixture()
def cupy(monkeypatch):
    return fake_gpu.install(monkeypatch)


def test_submit_copies_from_pinned_memory_and_keeps_values(cupy):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (5, 3, 7, 9), dtype=np.uint8)
    labels = rng.integers(-5, 5, 5).astype(np.int64)
    strided = np.arange(60, dtype=np.float64).reshape(6, 10)[:, ::3]  # not contiguous
    with DeviceFeed(cupy, depth=2) as feed:
        got = feed.submit(data, labels, strided).arrays()
        for dev, host in zip(got, (data, labels, strided), strict=True):
            assert isinstance(dev, fake_gpu.DeviceArray)
            assert dev.dtype == host.dtype and dev.shape == host.shape
            np.testing.assert_array_equal(dev.get(), host)
        assert feed.submitted == 1 and feed.bytes_copied == data.nbytes + labels.nbytes \
            + strided.nbytes
    assert [pinned for _, _, pinned in cupy.copies] == [True, True, True]


def test_consumer_stream_waits_for_the_copy(cupy):
    """The copy is queued on the feed's stream; ``arrays()`` makes the consumer's stream
    wait on its event (no host wait needed); ``wait='none'`` leaves that to the caller."""
    cupy.cuda.deferred = True
    data = np.arange(1000, dtype=np.int32)
    with DeviceFeed(cupy) as feed:
        batch = feed.submit(data)
        assert not batch.done  # the copy is only queued
        dev, = batch.arrays(wait="none")
        assert not batch.done
        dev, = batch.arrays()  # the consumer's (stand-in, immediate) stream waits on it
        assert batch.done
        np.testing.assert_array_equal(dev.get(), data)
        batch2 = feed.submit(data + 1)
        batch2.arrays(wait="host")
        assert batch2.done and batch2.event.synchronized >= 1
        with pytest.raises(DeviceFeedError, match="stream, host or none"):
            batch2.arrays(wait="later")


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_pinned_buffer_is_not_refilled_while_its_copy_is_pending(cupy, depth):
    """Batches submitted faster than they are copied: the feed waits on the one event of
    the buffer it refills; every batch arrives intact."""
    cupy.cuda.deferred = True
    batches = [np.full((4, 1000), i, np.uint8) for i in range(7)]
    with DeviceFeed(cupy, depth=depth) as feed:
        sent = [feed.submit(b) for b in batches]
        assert feed.waits == len(batches) - depth  # one wait per refill of a busy buffer
        assert not sent[-1].done
        for s, b in zip(sent, batches, strict=True):
            np.testing.assert_array_equal(s.arrays()[0].get(), b)


def test_double_buffering_copies_the_next_batch_during_the_step(cupy):
    """The trainer's loop with one batch prefetched: batch i + 1's copy is in flight while
    step i runs, and with two buffers the host never waits on a copy."""
    cupy.cuda.deferred = True
    batches = [np.full((8, 100), i, np.uint8) for i in range(6)]
    with DeviceFeed(cupy, depth=2) as feed:
        nxt = feed.submit(batches[0])
        for i, expected in enumerate(batches):
            cur = nxt
            data, = cur.arrays()  # the trainer receives batch i
            if i + 1 < len(batches):
                nxt = feed.submit(batches[i + 1])
                assert not nxt.done  # queued on the feed's stream during step i
            np.testing.assert_array_equal(data.get(), expected)  # step i
        assert feed.waits == 0


def test_the_stand_in_sees_a_buffer_refilled_too_early(cupy, monkeypatch):
    """The check above has teeth: a feed that believed every event complete would refill a
    buffer whose copy had not run, and the stand-in delivers the later batch's bytes."""
    cupy.cuda.deferred = True
    monkeypatch.setattr(fake_gpu.Event, "done", property(lambda self: True))
    with DeviceFeed(cupy, depth=1) as feed:
        first = feed.submit(np.zeros(64, np.uint8))
        feed.submit(np.ones(64, np.uint8))
        assert first.arrays()[0].get().tolist() == [1] * 64  # corrupted, as expected


def test_ring_memory_is_bounded_and_close_frees_it(cupy):
    rng = np.random.default_rng(2)
    feed = DeviceFeed(cupy, depth=2)
    biggest = 0
    for n in rng.integers(1, 50_000, 40).tolist():
        a = np.ones(n, np.uint8)
        biggest = max(biggest, n)
        feed.submit(a, np.zeros(3, np.int64)).arrays()
        assert feed.pinned_nbytes <= 2 * (biggest * 5 // 4 + 4 * ALIGN)
    assert cupy.cuda.pinned["live"] == feed.pinned_nbytes > 0
    feed.close()
    feed.close()  # idempotent
    assert feed.closed and feed.pinned_nbytes == 0
    gc.collect()
    assert cupy.cuda.pinned["live"] == 0
    with pytest.raises(DeviceFeedError, match="after close"):
        feed.submit(np.zeros(3))


def test_max_nbytes_caps_every_buffer(cupy):
    with DeviceFeed(cupy, depth=3, max_nbytes=4096) as feed:
        for n in (10, 1000, 4000, 3000):
            feed.submit(np.zeros(n, np.uint8))
        assert feed.pinned_nbytes <= 3 * 4096
        with pytest.raises(DeviceFeedError, match="exceeds max_nbytes 4096"):
            feed.submit(np.zeros(5000, np.uint8))


def test_clear_errors(cupy):
    with pytest.raises(DeviceFeedError, match="depth must be at least 1"):
        DeviceFeed(cupy, depth=0)
    with pytest.raises(DeviceFeedError, match="max_nbytes must be >= 0"):
        DeviceFeed(cupy, max_nbytes=-1)
    with DeviceFeed(cupy) as feed:
        with pytest.raises(DeviceFeedError, match="at least one array"):
            feed.submit()
        with pytest.raises(DeviceFeedError, match=r"numpy \(host\) arrays, not tests\.fake_gpu"):
            feed.submit(cupy.asarray(np.zeros(3)))
        with pytest.raises(DeviceFeedError, match="dtype object"):
            feed.submit(np.array([None, 1], dtype=object))


# ------------------------------------------------------------------ the loader's device path
@pytest.fixture(scope="module")
def datum_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("feed-datum")
    rng = np.random.default_rng(3)
    items = [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (3, 6, 5), dtype=np.uint8), i))) for i in range(37)]
    write_db(path, items)
    return path


@pytest.fixture(scope="module")
def tensor_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("feed-tensor")
    rng = np.random.default_rng(4)
    items = [(b"%08d" % i, encode_tensor(rng.standard_normal((4, 3)).astype(np.float32), i))
             for i in range(29)]
    write_db(path, items)
    return path


def _job(path, layout, device, **over):
    return {"dataset": {"path": str(path), "layout": layout}, "batch": {"size": 8,
            "last": "pad"}, "readers": {"strategy": "indexed"}, "metrics": {"every": 0},
            "shuffle": {"mode": "global", "seed": 5}, "epochs": 2,
            "workers": {"device": device}, **over}


def _run(cfg):
    with loaders.open(cfg) as loader:
        out = [(fake_gpu.to_host(b.data), fake_gpu.to_host(b.label), b.ids.copy())
               for b in loader]
        feed = loader.feed
    return out, feed


@pytest.mark.parametrize("layout", ["caffe-datum", "tensor"])
@pytest.mark.parametrize("transform", [{}, {"scale": 0.5, "mean_values": [3, 1, 2]},
                                       {"crop_size": 4, "mirror": True, "scale": 0.25,
                                        "mean_values": [100]}])
def test_loader_cuda_workers_feed_through_the_pinned_ring(datum_db, tensor_db, cupy,
                                                          layout, transform):
    """``workers.device: cuda`` batches (copies deferred: the consumer's stream waits on
    each) equal the CPU run's bit for bit; every copy of batch data came from pinned
    memory, Datum pixels as uint8 (never float32), and the feed is closed with the
    loader."""
    if layout == "tensor" and transform:
        pytest.skip("Caffe's transform applies to Datum layouts")
    path = datum_db if layout == "caffe-datum" else tensor_db
    cpu, feed = _run(_job(path, layout, "cpu", transform=transform))
    assert feed is None
    cupy.cuda.deferred = True
    gpu, feed = _run(_job(path, layout, "cuda", transform=transform))
    assert len(gpu) == len(cpu) > 0
    for (gd, gl, gi), (cd, cl, ci) in zip(gpu, cpu, strict=True):
        assert gd.dtype == cd.dtype and gd.shape == cd.shape
        np.testing.assert_array_equal(gd, cd)  # bit for bit
        np.testing.assert_array_equal(gl, cl)
        np.testing.assert_array_equal(gi, ci)
    assert feed.closed and feed.submitted == len(gpu)
    pixels = [(d, n, pinned) for d, n, pinned in cupy.copies if n > 8 * 8]
    assert pixels and all(pinned for _, _, pinned in pixels)
    if layout == "caffe-datum":
        assert all(np.dtype(d) == np.uint8 for d, _, _ in pixels)


# ------------------------------------------------------------------ IBP from pinned memory
def _ibp_rows(kind: str) -> np.ndarray:
    from sklearn.datasets import load_breast_cancer, load_digits

    if kind == "digits":
        return load_digits().data.astype(np.float32)
    if kind == "cancer":
        return load_breast_cancer().data.astype(np.float32)
    rng = np.random.default_rng(6)  # MNIST-like: mostly zero pixels, a few bright ones
    x = rng.integers(0, 256, (300, 784)).astype(np.float32)
    x[rng.random(x.shape) < 0.8] = 0
    return x


@pytest.mark.parametrize("kind", ["digits", "cancer", "mnist-like"])
@pytest.mark.parametrize("chunk", [4, 8])
@pytest.mark.parametrize("layout", ["inplace", "condensed"])
def test_ibp_frame_decodes_on_the_device_from_the_pinned_ring(cupy, kind, chunk, layout):
    """The whole frame crosses once, from pinned memory (no pageable staging), and the
    array-API decoder on the (stand-in) device gives the rows back bit for bit."""
    from lmdbio.codecs import ibp
    from lmdbio.codecs.ibp.device import decompress_pinned

    x = _ibp_rows(kind)
    model = ibp.fit(x, chunk_bytes=chunk)
    frame = np.frombuffer(model.compress(x, layout).to_bytes(), np.uint8)
    slot = np.concatenate([frame, np.full(37, 0xEE, np.uint8)])  # trailing slot bytes
    cupy.cuda.deferred = True
    with DeviceFeed(cupy) as feed:
        got = decompress_pinned(model, slot, feed, nrows=len(x), method="xp")
        assert isinstance(got, fake_gpu.DeviceArray)
        np.testing.assert_array_equal(got.get().view(np.uint8), x.view(np.uint8))
    big = [(n, pinned) for _, n, pinned in cupy.copies if n >= frame.nbytes]
    assert big == [(frame.nbytes, True)]  # one copy of the frame, from pinned memory


def test_ibp_device_checks_name_the_row(cupy):
    """The per-row checks run on the device and say what the host check says."""
    from lmdbio.codecs import ibp
    from lmdbio.codecs.ibp.device import decompress_pinned
    from lmdbio.errors import CodecError

    x = _ibp_rows("digits")
    model = ibp.fit(x, chunk_bytes=4)
    packed = model.compress(x, "condensed")
    too_long = packed.lengths.copy()
    too_long[7] = model.nchunks + 3
    bad = dataclasses_replace(packed, lengths=too_long)
    frame = np.frombuffer(bad.to_bytes(), np.uint8)
    with DeviceFeed(cupy) as feed:
        with pytest.raises(CodecError, match=r"row 7: length \d+ words exceeds the raw row"):
            decompress_pinned(model, frame, feed, method="xp")
        with pytest.raises(CodecError, match="holds 1797 rows, expected 5"):
            decompress_pinned(model, packed.to_bytes(), feed, nrows=5, method="xp")
        with pytest.raises(CodecError, match="method must be kernel or xp"):
            decompress_pinned(model, packed.to_bytes(), feed, method="mirror")


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_auto_transport_rule():
    from lmdbio.codecs.ibp.device import DEFAULT_MIN_RATIO, transport_compressed
    from lmdbio.errors import CodecError

    assert not transport_compressed(1.19)  # breast-cancer rows: raw
    assert transport_compressed(4.76) and transport_compressed(5.83)  # digits, MNIST
    assert transport_compressed(DEFAULT_MIN_RATIO)
    assert not transport_compressed(3.0, min_ratio=3.5)
    with pytest.raises(CodecError, match="min_ratio must be > 0"):
        transport_compressed(2.0, min_ratio=0)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["kernel", "xp"])
def test_ibp_pinned_path_on_a_real_device(method):
    """The same on a GPU (skipped elsewhere): the CUDA kernel reads the frame the pinned
    ring delivered, no pageable copy."""
    import cupy as cp

    from lmdbio.codecs import ibp
    from lmdbio.codecs.ibp.device import decompress_pinned

    x = _ibp_rows("digits")
    for chunk in (4, 8):
        model = ibp.fit(x, chunk_bytes=chunk)
        for layout in ("inplace", "condensed"):
            frame = model.compress(x, layout).to_bytes()
            with DeviceFeed(cp) as feed:
                got = cp.asnumpy(decompress_pinned(model, frame, feed, method=method))
            assert np.array_equal(got.view(np.uint8), x.view(np.uint8))


@pytest.mark.gpu
def test_feed_on_a_real_device():
    import cupy as cp

    rng = np.random.default_rng(8)
    batches = [rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8) for _ in range(6)]
    with DeviceFeed(cp, depth=2) as feed:
        sent = [feed.submit(b, np.arange(64)) for b in batches]
        for s, b in zip(sent, batches, strict=True):
            data, labels = s.arrays()
            assert np.array_equal(cp.asnumpy(data), b)
            assert np.array_equal(cp.asnumpy(labels), np.arange(64))


@pytest.mark.slow
def test_gpu_bench_runs_end_to_end_on_the_stand_in(tmp_path):
    """python -m bench.gpu --fake-gpu: every section runs, the JSON says the figures are the
    stand-in's, and the values checked inside are bit-exact."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "gpu.json"
    env = {k: v for k, v in os.environ.items() if k != "LMDBIO_TEST_FAKE_GPU"}
    res = subprocess.run([sys.executable, "-m", "bench.gpu", "--fake-gpu",
                          "--out", str(out)], capture_output=True, text=True, timeout=300,
                         cwd=repo, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stand-in: figures meaningless" in res.stdout
    got = json.loads(out.read_text())
    assert got["stand_in"] is True and "figures meaningless" in got["note"]
    assert set(got["transfers"]) == {"digits", "mnist", "breast_cancer"}
    for name, t in got["transfers"].items():
        assert t["bit_exact"], name
        assert set(t["gb_per_s"]) == {"pageable", "raw_pinned", "pinned_ring", "ibp_pinned",
                                      "ibp_pageable", "auto"}
        assert t["vs_pageable"]["pageable"] == 1.0
    assert not got["transfers"]["breast_cancer"]["auto"]["compressed"]  # 1.19x: raw
    assert got["transfers"]["digits"]["auto"]["compressed"]
    assert got["loader_datum"]["bit_exact_first_batches"]
