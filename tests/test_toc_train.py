"""The example trainer: SGD on compressed batches gives the dense (and CSR) loss curve."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trainer():
    spec = importlib.util.spec_from_file_location("toc_train", REPO / "examples" / "toc_train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["toc_train"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits_db(tmp_path_factory):
    from lmdbio.convert import toc as ct

    p = argparse.ArgumentParser()
    ct.add_arguments(p)
    args = p.parse_args(["--batch-size", "150", "--seed", "1"])
    args.overwrite, args.format_version = False, 1
    dst = tmp_path_factory.mktemp("toc") / "digits"
    ct.convert("sklearn:digits", dst, args)
    return str(dst)


@pytest.mark.parametrize("model", ["logreg", "svm", "mlp"])
def test_loss_curves_agree(trainer, digits_db, model):
    summary = trainer.run(digits_db, model=model, epochs=2, lr=0.5, hidden=16, seed=3,
                          compare=("dense", "csr"))
    assert summary["batches"] == 12
    for rep in ("dense", "csr"):
        assert summary[rep]["max_rel_diff_vs_toc"] < 1e-9, (rep, summary[rep])
    # the model learns: the loss of the last batch is well below the first one
    assert summary["toc"]["last_loss"] < 0.7 * summary["toc"]["first_loss"]


def test_curves_are_step_by_step_equal(trainer, digits_db):
    """Compare every step's loss, not a summary."""
    from lmdbio.codecs.toc import TocMatrix

    batches, meta = trainer.read_toc_batches(digits_db)
    kw = dict(model="mlp", epochs=1, lr=0.5, hidden=8, seed=0, scale=1 / meta["max_abs"])
    toc = trainer.train(batches, decode=TocMatrix.from_bytes, **kw)
    dense = trainer.train(
        [(trainer.DenseBatch(TocMatrix.from_bytes(b).to_dense()), y) for b, y in batches], **kw)
    assert len(toc.losses) == len(batches) == 12
    np.testing.assert_allclose(toc.losses, dense.losses, rtol=1e-10)
