"""loaders.caffe_trainer in one process: its loader figure is steady state (the run's first
batch, which waits for the readers to start, reported apart) and is the wall time spent in
the loader's iterator (what colocated reading and inline decoding cost too), not only the
loader's own receive wait."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bench.lmdbgen import write_db
from lmdbio.codecs.datum import datum_from_array, encode_datum
from loaders import caffe_trainer
from loaders.loader import Loader

FIRST_BATCH_S = 0.6  # the first next() of the run: a reader starting up
LATER_BATCH_S = 0.01  # every later next(): reading inline, outside the loader's wait figure


def test_the_loader_figure_is_steady_state_time_in_the_iterator(tmp_path: Path, monkeypatch,
                                                                capsys) -> None:
    rng = np.random.default_rng(3)
    write_db(tmp_path / "db", [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (1, 4, 4), dtype=np.uint8), i % 3))) for i in range(40)])
    config = tmp_path / "job.yaml"
    config.write_text(f"dataset: {{path: {tmp_path / 'db'}, layout: caffe-datum}}\n"
                      "workers: {device: cpu}\nbatch: {size: 8}\nepochs: 2\n"
                      "metrics: {every: 0}\n")
    real_iter = Loader.__iter__
    calls = {"n": 0}

    def slow_iter(self):  # each batch costs time inside next(), as inline reading does
        for batch in real_iter(self):
            calls["n"] += 1
            time.sleep(FIRST_BATCH_S if calls["n"] == 1 else LATER_BATCH_S)
            yield batch

    monkeypatch.setattr(Loader, "__iter__", slow_iter)
    out = tmp_path / "summary.json"
    assert caffe_trainer.main([str(config), "--summary-json", str(out)]) == 0
    summary = json.loads(out.read_text())
    steady_batches = 2 * 5 - 1  # 40 records in batches of 8, two epochs; the first apart
    assert calls["n"] == steady_batches + 1
    assert summary["first_batch_seconds"] >= FIRST_BATCH_S
    waited = summary["mean_seconds_waiting_for_data"]
    assert steady_batches * LATER_BATCH_S <= waited < FIRST_BATCH_S, summary
    assert summary["steady_samples"] == steady_batches * 8
    assert 0 < summary["waiting_fraction"] <= 1
    assert summary["waiting_fraction"] == waited / summary["steady_seconds"]
    line = capsys.readouterr().out
    assert "after each worker's first batch" in line and "in the loader" in line, line
