"""lmdbio.stages: per-stage CPU and wall time, and the loader's report of where time goes."""

from __future__ import annotations

import threading
import time

import numpy as np

import loaders
from bench.lmdbgen import write_db
from lmdbio.codecs.datum import datum_from_array, encode_datum
from lmdbio.commands.run import stages_by_role
from lmdbio.stages import READER_STAGES, WORKER_STAGES, StageClock, merged, per_sample


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_span_counts_its_threads_cpu_and_its_wall_time() -> None:
    clock = StageClock(enabled=True)
    with clock.span("assemble"):
        _spin(0.02)
    with clock.span("receive"):
        time.sleep(0.02)  # waiting: wall time, next to no CPU
    got = clock.as_dict()
    assert got["assemble"]["spans"] == 1 and got["receive"]["spans"] == 1
    assert got["assemble"]["cpu_seconds"] >= 0.02
    assert got["assemble"]["wall_seconds"] >= got["assemble"]["cpu_seconds"]
    assert got["receive"]["wall_seconds"] >= 0.02
    assert got["receive"]["cpu_seconds"] < got["assemble"]["cpu_seconds"]


def test_cpu_on_another_thread_is_not_the_waiting_threads() -> None:
    """The trainer's wait for a batch the decoding thread assembles costs the trainer's
    thread no CPU; the decoding thread's span has it."""
    clock = StageClock(enabled=True)

    def decode() -> None:
        with clock.span("assemble"):
            _spin(0.05)

    worker = threading.Thread(target=decode)
    with clock.span("handoff"):
        worker.start()
        worker.join()
    got = clock.as_dict()
    assert got["assemble"]["cpu_seconds"] >= 0.05
    assert got["handoff"]["wall_seconds"] >= 0.05
    assert got["handoff"]["cpu_seconds"] < 0.5 * got["assemble"]["cpu_seconds"]


def test_a_clock_that_is_off_measures_nothing_and_reset_forgets() -> None:
    clock = StageClock()
    with clock.span("locate"):
        _spin(0.001)
    assert clock.as_dict() == {}
    clock.enabled = True
    with clock.span("locate"):
        pass
    assert clock.as_dict()["locate"]["spans"] == 1
    clock.reset()
    assert clock.as_dict() == {}


def test_merged_and_per_sample_arithmetic() -> None:
    a = {"locate": {"cpu_seconds": 1.0, "wall_seconds": 3.0, "spans": 2}}
    b = {"locate": {"cpu_seconds": 0.5, "wall_seconds": 0.5, "spans": 1},
         "publish": {"cpu_seconds": 0.25, "wall_seconds": 0.5, "spans": 4}}
    m = merged([a, b])
    assert m == {"locate": {"cpu_seconds": 1.5, "wall_seconds": 3.5, "spans": 3},
                 "publish": {"cpu_seconds": 0.25, "wall_seconds": 0.5, "spans": 4}}
    assert per_sample(m, 1_000_000) == {"locate": {"cpu_us": 1.5, "idle_us": 2.0},
                                        "publish": {"cpu_us": 0.25, "idle_us": 0.25}}


def test_stages_by_role_splits_reader_and_worker_stages_of_every_rank() -> None:
    s = {"cpu_seconds": 1e-6, "wall_seconds": 1e-6, "spans": 1}
    ranks = [{"stages": {"locate": s, "publish": s}},  # a dedicated reader
             {"stages": {"receive": s, "assemble": s}},  # a worker
             {"stages": {"locate": s, "receive": s, "assemble": s}}]  # colocated
    got = stages_by_role(ranks, 1)
    assert list(got) == ["reader", "worker"]
    assert got["reader"]["locate"]["cpu_us"] == 2.0 and got["reader"]["publish"]["cpu_us"] == 1.0
    assert got["worker"] == {"receive": {"cpu_us": 2.0, "idle_us": 0.0},
                             "assemble": {"cpu_us": 2.0, "idle_us": 0.0}}
    assert stages_by_role([{"stages": {}}, {}], 10) == {}


def test_a_loader_times_every_stage_a_slot_and_a_batch_pass(tmp_path) -> None:
    """One process (reader and worker): with the clock on, each slot is located, filled
    and published once and received once; each batch assembled once."""
    rng = np.random.default_rng(0)
    write_db(tmp_path, [(b"%06d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (3, 6, 5), dtype=np.uint8), i % 10))) for i in range(96)])
    cfg = {"dataset": {"path": str(tmp_path), "layout": "caffe-datum"},
           "batch": {"size": 8}, "readers": {"strategy": "indexed",
                                              "batches_per_slot": 3},
           "transform": {"scale": 0.5}, "metrics": {"every": 0},
           "workers": {"device": "cpu"}}
    with loaders.open(cfg) as loader:
        loader.stages.enabled = True
        batches = list(loader)
        got = loader.summary()["stages"]
    assert len(batches) == 12
    slots = 12 // 3
    for name in ("locate", "slot_fill", "publish"):
        assert got[name]["spans"] == slots, name
    assert got["receive"]["spans"] == slots
    assert got["assemble"]["spans"] == 12
    assert set(got) <= set(READER_STAGES) | set(WORKER_STAGES)
    assert all(s["wall_seconds"] >= 0 and s["cpu_seconds"] >= 0 for s in got.values())
