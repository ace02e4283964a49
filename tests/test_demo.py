"""``make run`` (``lmdbio demo``), the first thing anyone sees (issue 36, point 8): data
derived from real digits and big enough to measure, said so; a trainer whose step does real
work, timed in steady state, so that the share of the loader means something; one line
against the per-rank py-lmdb loop in the same run; configs/quickstart.yaml and the
README's Python example reading what it wrote."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmdbio.commands import demo, demo_train
from lmdbio.config import load_config
from lmdbio.datasets import Dataset

REPO = Path(__file__).resolve().parents[1]


def test_shifted_moves_the_digit_and_fills_zeros() -> None:
    img = np.zeros((1, 5, 5), np.uint8)
    img[0, 2, 2] = 9
    img[0, 0, 0] = 7  # shifted out of the frame to the left and up
    out = demo._shifted(img, 1, -1)
    assert out[0, 3, 1] == 9 and out.sum() == 9
    assert (demo._shifted(img, 0, 0) == img).all()
    assert demo._shifted(img, -2, 2)[0, 0, 4] == 9


def test_the_data_is_the_real_digits_at_every_position(tmp_path: Path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    real = Dataset("fake:digits", rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
                   np.arange(10, dtype=np.int64) % 3, ["0", "1", "2"], "image", "ten digits")
    monkeypatch.setattr("lmdbio.datasets.load_dataset", lambda name: real)
    made = demo.make_arrays(tmp_path / "d.npz")
    assert made == {"images": 10 * len(demo.SHIFTS), "real": 10, "provenance": "ten digits"}
    with np.load(tmp_path / "d.npz") as z:
        X, y = z["X"], z["y"]
    assert X.shape == (10 * len(demo.SHIFTS), 28, 28) and X.dtype == np.uint8
    assert np.bincount(y).tolist() == (np.bincount(real.labels) * len(demo.SHIFTS)).tolist()
    every = {(int(lab), img.tobytes()) for img, lab in zip(X, y, strict=True)}
    for dy, dx in demo.SHIFTS:  # each real digit at each position, nothing else
        for img, lab in zip(demo._shifted(real.data, dy, dx), real.labels, strict=True):
            assert (int(lab), img.tobytes()) in every
    assert not (y[:10] == real.labels).all()  # shuffled


def test_quickstart_config_reads_the_demo_data_as_it_is() -> None:
    cfg = load_config(REPO / "configs" / "quickstart.yaml")
    assert cfg.dataset.path == os.path.normpath(REPO / demo.dataset_path(demo.DEFAULT_WORKDIR))
    assert 255 * cfg.transform.scale <= 1.0  # 0..255 pixels to [0, 1]


def test_the_training_summary_is_steady_state_with_the_first_batch_apart() -> None:
    worker = {"worker": True, "samples": 6400, "seconds": 10.0, "steady_steps": 95,
              "steady_samples": 6080, "steady_seconds": 0.38, "first_batch_seconds": 2.5,
              "loader_seconds": 0.019, "compute_seconds": 0.3, "allreduce_seconds": 0.061,
              "loader_fraction": 0.05}
    s = demo_train.summarize([worker, {**worker, "loader_fraction": 0.03}, {
        "worker": False, "seconds": 10.1, "first_batch_seconds": None}], [0.9, 0.4])
    assert s["workers"] == 2 and s["ranks"] == 3 and s["samples"] == 12800
    assert s["loader_fraction_mean"] == pytest.approx(0.04)
    assert s["loader_ms_per_step"] == pytest.approx(1e3 * 0.038 / 190)
    line = demo_train.summary_line(s)
    assert "loss 0.900 -> 0.400" in line and "4.0% of the time in the loader" in line
    assert "The first batch came 2.50 s after the loader opened" in line


def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block and "configs/quickstart.yaml" in block.group(1)
    return block.group(1)


@pytest.mark.mpiexec
@pytest.mark.slow
def test_make_run_shows_real_data_the_loader_and_the_baseline(tmp_path: Path) -> None:
    """The whole demo in a fresh work folder, then the README's Python example against
    what it wrote (laid out as in the checkout: configs/ beside build/demo/)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMDBIO_")}
    env.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    work = tmp_path / "build" / "demo"
    done = subprocess.run([sys.executable, "-m", "lmdbio.cli", "demo", "--workdir",
                           str(work), "--epochs", "1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=280, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "derived from real MNIST digits" in out and "60,000 images" in out
    assert "records: 60000 x Caffe Datum, 1x28x28 (CxHxW), raw uint8 pixels" in out
    assert re.search(r"\[train\] epoch 1: mean loss \d", out), out
    assert re.search(r"training: loss [\d.]+ -> [\d.]+ over 1 epoch, [\d,]+ samples/s in "
                     r"steady state; [\d.]+% of each step in the loader", out), out
    assert re.search(r"loading alone, best steady state, this run: lmdbio [\d,]+ samples/s .*"
                     r"vs the per-rank py-lmdb loop [\d,]+ samples/s .*: [\d.]+x the rate",
                     out), out
    # README: make run, then its Python example, as written, from the project root
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "quickstart.yaml", tmp_path / "configs")
    example = subprocess.run([sys.executable, "-c", _readme_example()], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    assert example.returncode == 0, example.stderr


def test_data_of_an_earlier_demo_is_made_again(tmp_path: Path) -> None:
    """``build/demo/digits-datum`` of the demo before (scikit-learn's 8x8 digits) is not
    taken for the new data set."""
    import json

    db = tmp_path / "digits-datum"
    db.mkdir()
    (db / "data.mdb").write_bytes(b"")
    meta = {"source": "sklearn:digits", "records": 1797, "shape": [1, 8, 8]}
    (db / "lmdbio.json").write_text(json.dumps(meta))
    assert not demo.is_current(db)
    meta = {"source": str(tmp_path / demo.ARRAYS), "records": demo.IMAGES, "shape": [1, 28, 28]}
    (db / "lmdbio.json").write_text(json.dumps(meta))
    assert demo.is_current(db)
