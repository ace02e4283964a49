"""Mini-batch SGD on TOC-compressed batches, read from a TOC LMDB, never decompressed.

Fits one of three models with the operations of :class:`lmdbio.codecs.toc.TocMatrix` only:

- ``logreg``: logistic regression, one-vs-rest over the classes: ``A·w`` and ``v·A`` per
  class (binary labels: one model);
- ``svm``: linear SVM (hinge loss + L2), one-vs-rest, same operations;
- ``mlp``: one hidden layer (tanh) and a softmax output; the first layer is ``A·W1``
  (``matmat``) forward and ``dZᵀ·A`` (``rmatmat``) backward.

Features are scaled into [-1, 1] with ``A.scale(1 / max|A|)``, a sparse-safe operation that
rewrites the first tree layer only. The same trainer runs on dense (numpy) and CSR (scipy)
batches through the same four-operation interface, so ``--compare`` shows the loss curves
side by side; they agree up to floating-point summation order.

Usage::

    lmdbio convert sklearn:digits build/digits-toc --layout toc --batch-size 250
    python examples/toc_train.py build/digits-toc --model mlp --epochs 5 --compare dense,csr
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class BatchOps(Protocol):
    """What the trainer needs of a batch ``A`` (rows = examples)."""

    shape: tuple[int, int]

    def matvec(self, v: np.ndarray) -> np.ndarray: ...
    def rmatvec(self, v: np.ndarray) -> np.ndarray: ...
    def matmat(self, M: np.ndarray) -> np.ndarray: ...
    def rmatmat(self, M: np.ndarray) -> np.ndarray: ...
    def scale(self, c: float) -> BatchOps: ...


class DenseBatch:
    """A dense numpy batch behind the TOC operation interface (the baseline)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = np.ascontiguousarray(a, dtype=np.float64)
        self.shape = self.a.shape

    def matvec(self, v: np.ndarray) -> np.ndarray:
        return self.a @ v

    def rmatvec(self, v: np.ndarray) -> np.ndarray:
        return v @ self.a

    def matmat(self, M: np.ndarray) -> np.ndarray:
        return self.a @ M

    def rmatmat(self, M: np.ndarray) -> np.ndarray:
        return M @ self.a

    def scale(self, c: float) -> DenseBatch:
        return DenseBatch(self.a * c)


class CsrBatch:
    """A scipy CSR batch behind the same interface."""

    def __init__(self, a: Any) -> None:
        import scipy.sparse as sp

        self.a = sp.csr_matrix(a, dtype=np.float64)
        self.shape = self.a.shape

    def matvec(self, v: np.ndarray) -> np.ndarray:
        return self.a @ v

    def rmatvec(self, v: np.ndarray) -> np.ndarray:
        return self.a.T @ v

    def matmat(self, M: np.ndarray) -> np.ndarray:
        return self.a @ M

    def rmatmat(self, M: np.ndarray) -> np.ndarray:
        return (self.a.T @ M.T).T

    def scale(self, c: float) -> CsrBatch:
        return CsrBatch(self.a * c)


@dataclass
class Result:
    """Per-step training losses (loss of the batch before its update) and timings."""

    model: str
    representation: str
    losses: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _classes(batches: Sequence[tuple[Any, np.ndarray]]) -> np.ndarray:
    return np.unique(np.concatenate([np.asarray(y).ravel() for _, y in batches]))


def train(batches: Sequence[tuple[Any, np.ndarray]], *, model: str = "logreg",
          epochs: int = 3, lr: float = 0.5, l2: float = 1e-4, hidden: int = 32,
          seed: int = 0, scale: float = 1.0, representation: str = "toc",
          decode: Any = None) -> Result:
    """Mini-batch SGD over ``batches`` (each ``(A, labels)``) in order, ``epochs`` times.

    ``A`` offers ``matvec``/``rmatvec``/``matmat``/``rmatmat``/``scale``; ``decode``, when
    given, turns each stored batch into such an object at every step (e.g. parsing TOC bytes,
    so epochs time the compressed path end to end). Deterministic for a given ``seed``.
    """
    classes = _classes(batches)
    k = len(classes)
    n_features = (decode(batches[0][0]) if decode else batches[0][0]).shape[1]
    rng = np.random.default_rng(seed)
    res = Result(model, representation)
    ovr = 1 if k == 2 else k  # binary: one model for the larger label
    if model in ("logreg", "svm"):
        W = np.zeros((ovr, n_features))
        b = np.zeros(ovr)
    elif model == "mlp":
        W1 = rng.normal(0.0, 1.0 / np.sqrt(n_features), (n_features, hidden))
        b1 = np.zeros(hidden)
        W2 = rng.normal(0.0, 1.0 / np.sqrt(hidden), (hidden, k))
        b2 = np.zeros(k)
    else:
        raise ValueError(f"unknown model {model!r} (logreg, svm, mlp)")
    for _epoch in range(epochs):
        t0 = time.perf_counter()
        for stored, y in batches:
            A = decode(stored) if decode else stored
            if scale != 1.0:
                A = A.scale(scale)
            y = np.asarray(y).ravel()
            n = A.shape[0]
            yi = np.searchsorted(classes, y)
            if model in ("logreg", "svm"):
                loss = 0.0
                for c in range(ovr):
                    target = (yi == (c if ovr > 1 else 1)).astype(np.float64)
                    z = A.matvec(W[c]) + b[c]
                    if model == "logreg":
                        loss += float(np.mean(np.logaddexp(0.0, z) - target * z))
                        g = (_sigmoid(z) - target) / n
                    else:
                        s = 2.0 * target - 1.0
                        margin = s * z
                        loss += float(np.mean(np.maximum(0.0, 1.0 - margin)))
                        g = np.where(margin < 1.0, -s, 0.0) / n
                    loss += 0.5 * l2 * float(W[c] @ W[c])
                    W[c] -= lr * (A.rmatvec(g) + l2 * W[c])
                    b[c] -= lr * float(g.sum())
                res.losses.append(loss / ovr)
            else:
                Z1 = A.matmat(W1) + b1
                H = np.tanh(Z1)
                logits = H @ W2 + b2
                logits -= logits.max(axis=1, keepdims=True)
                logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
                res.losses.append(float(-logp[np.arange(n), yi].mean()))
                d = np.exp(logp)
                d[np.arange(n), yi] -= 1.0
                d /= n
                gW2 = H.T @ d
                dZ1 = (d @ W2.T) * (1.0 - H * H)
                gW1 = A.rmatmat(dZ1.T).T
                W2 -= lr * gW2
                b2 -= lr * d.sum(axis=0)
                W1 -= lr * gW1
                b1 -= lr * dZ1.sum(axis=0)
        res.epoch_seconds.append(time.perf_counter() - t0)
    return res


def read_toc_batches(path: str) -> tuple[list[tuple[bytes, np.ndarray]], dict[str, Any]]:
    """Every batch of a TOC LMDB as ``(TOC bytes, labels)``, plus the dataset metadata.

    The bytes stay compressed in memory; the trainer parses them at each step.
    """
    from lmdbio.codecs.toc import split_batch_value
    from lmdbio.convert.toc import iter_batch_values
    from lmdbio.dataset_meta import read_dataset_meta

    out = []
    for _key, value in iter_batch_values(path):
        toc, labels = split_batch_value(value)
        out.append((bytes(toc), labels))
    return out, read_dataset_meta(path)


def run(path: str, *, model: str, epochs: int, lr: float, hidden: int, seed: int,
        compare: Sequence[str] = ()) -> dict[str, Any]:
    """Train on the TOC batches of ``path`` and on the same batches as ``compare`` formats."""
    from lmdbio.codecs.toc import TocMatrix

    batches, meta = read_toc_batches(path)
    max_abs = float(meta.get("max_abs") or max(
        float(np.abs(TocMatrix.from_bytes(b).to_dense()).max(initial=0.0)) for b, _ in batches))
    scale = 1.0 / max_abs if max_abs > 0 else 1.0
    kw = dict(model=model, epochs=epochs, lr=lr, hidden=hidden, seed=seed, scale=scale)
    results = {"toc": train(batches, representation="toc", decode=TocMatrix.from_bytes, **kw)}
    for rep in compare:
        if rep == "dense":
            conv = [(DenseBatch(TocMatrix.from_bytes(b).to_dense()), y) for b, y in batches]
        elif rep == "csr":
            conv = [(CsrBatch(TocMatrix.from_bytes(b).to_csr()), y) for b, y in batches]
        else:
            raise ValueError(f"unknown representation {rep!r} (dense, csr)")
        results[rep] = train(conv, representation=rep, **kw)
    base = np.asarray(results["toc"].losses)
    summary: dict[str, Any] = {"path": path, "model": model, "epochs": epochs,
                               "batches": len(batches), "scale": scale}
    for rep, r in results.items():
        losses = np.asarray(r.losses)
        summary[rep] = {
            "first_loss": float(losses[0]), "last_loss": float(losses[-1]),
            "epoch_seconds": [round(s, 4) for s in r.epoch_seconds],
            "max_rel_diff_vs_toc": float(np.max(np.abs(losses - base) /
                                                np.maximum(np.abs(base), 1e-300))),
        }
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", help="TOC LMDB written by `lmdbio convert ... --layout toc`")
    p.add_argument("--model", choices=("logreg", "svm", "mlp"), default="logreg")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", default="dense",
                   help="comma-separated baselines on the same batches: dense, csr, or ''")
    args = p.parse_args(argv)
    compare = [c for c in args.compare.split(",") if c]
    summary = run(args.path, model=args.model, epochs=args.epochs, lr=args.lr,
                  hidden=args.hidden, seed=args.seed, compare=compare)
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
