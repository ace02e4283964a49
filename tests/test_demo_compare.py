"""lmdbio.commands.demo_compare: the per-rank loop gets the job's batch, seed and scale."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdbio.commands.demo_compare import baseline_arguments
from lmdbio.config import load_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("scale", [None, 0.00390625])
def test_the_baseline_delivers_what_the_job_delivers(tmp_path, scale):
    overrides = [] if scale is not None else ["transform.scale=1.0"]
    cfg = load_config(REPO / "configs" / "quickstart.yaml", overrides)
    args = baseline_arguments(cfg, 7, tmp_path / "out.json")
    assert (args.path, args.batch_size, args.batches, args.seed) == \
        (str(cfg.dataset.path), cfg.batch.size, 7, cfg.shuffle.seed)
    assert args.scale == scale and not args.uint8 and args.step_seconds == 0.0
    assert args.json == str(tmp_path / "out.json")
