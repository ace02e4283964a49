"""Clustered IBP: one mask/bitval per cluster of similar rows, a cluster id per row.

Rows are clustered by k-means under the Hamming distance of their bits (k-means++ seeding,
centroid = the majority value of every bit); each cluster then gets its own fitted mask.
Then ``refine`` rounds reassign every row to the mask that stores it in the fewest words and
refit the masks on their rows. Compression always picks, per row, the cheapest mask.

The gain has a price: ``2 * n * C`` bytes of masks and bit values per cluster and one id per
row; :func:`cluster_report` counts both in the net saving, as the paper's Figure 14 does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.ibp.model import (
    IBPModel,
    check_chunk_bytes,
    model_from_bits,
    popcount,
    row_plan,
    rows_to_words,
    sample_rows,
    search_mask,
)
from lmdbio.errors import CodecError
from lmdbio.kernel_cache import kernel_module


def _majority(words: np.ndarray, labels: np.ndarray, k: int, width: int) -> tuple[np.ndarray,
                                                                                  np.ndarray]:
    kernels = kernel_module("lmdbio.codecs.ibp")

    n = words.shape[1]
    counts = np.zeros((k, width, n), np.int64)
    kernels.bit_count_rows(words, labels, counts)
    counts = counts.transpose(0, 2, 1)
    sizes = np.bincount(labels, minlength=k).astype(np.int64)
    bits = counts * 2 > sizes[:, None, None]
    weights = np.uint64(1) << np.arange(width, dtype=np.uint64)
    cent = (bits.astype(np.uint64) * weights).sum(axis=2, dtype=np.uint64)
    return cent.astype(words.dtype), sizes


def hamming_kmeans(words: np.ndarray, k: int, *, iters: int = 10,
                   seed: int = 0) -> np.ndarray:
    """Cluster labels (int64) of the rows of ``words`` (N x n chunk words)."""
    kernels = kernel_module("lmdbio.codecs.ibp")

    nrows = words.shape[0]
    width = words.dtype.itemsize * 8
    k = max(1, min(int(k), nrows))
    rng = np.random.default_rng(seed)
    centroids = np.empty((k, words.shape[1]), words.dtype)
    centroids[0] = words[rng.integers(nrows)]
    labels = np.zeros(nrows, np.int64)
    dist = np.empty(nrows, np.int64)
    best = np.full(nrows, np.iinfo(np.int64).max, np.int64)
    lab1 = np.empty(nrows, np.int64)
    got = 1
    for c in range(1, k):
        kernels.hamming_assign(words, centroids[c - 1:c], lab1, dist)
        np.minimum(best, dist, out=best)
        total = best.sum()
        if total == 0:
            break  # every row equals a centroid already
        centroids[c] = words[rng.choice(nrows, p=best / total)]
        got += 1
    centroids = centroids[:got]
    k = got
    for it in range(max(1, iters)):
        new_labels = np.empty(nrows, np.int64)
        kernels.hamming_assign(words, centroids, new_labels, dist)
        if it > 0 and np.array_equal(new_labels, labels):
            break
        labels = new_labels
        centroids, sizes = _majority(words, labels, k, width)
        for c in np.flatnonzero(sizes == 0):  # re-seed empty clusters with the farthest row
            far = int(np.argmax(dist))
            centroids[c] = words[far]
            dist[far] = -1
    return labels


def fit_clusters(rows: Any, k: int, chunk_bytes: int = 4, *, sample: float | None = None,
                 seed: int = 0, iters: int = 10, refine: int = 2,
                 search: str = "auto") -> IBPModel:
    """Fit a clustered :class:`IBPModel` with up to ``k`` masks (empty clusters are dropped)."""
    chunk_bytes = check_chunk_bytes(chunk_bytes)
    if not 1 <= int(k) <= 65535:
        raise CodecError(f"IBP clusters must be 1..65535, not {k}")
    words, dtype, row_shape = rows_to_words(rows, chunk_bytes)
    words = sample_rows(words, sample, seed)
    nrows, n = words.shape
    if nrows == 0:
        raise CodecError("IBP cannot fit a model on zero rows")
    width = 8 * chunk_bytes
    meta_words = -(-n // width)
    labels = hamming_kmeans(words, k, iters=iters, seed=seed)

    def fit_masks(lab: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        masks, bitvals = [], []
        for c in np.unique(lab):
            member = np.ascontiguousarray(words[lab == c])
            best = search_mask(member, width, meta_words, search, 1)
            masks.append(best.mask)
            bitvals.append(best.bitval)
        return np.array(masks, np.uint64), np.array(bitvals, np.uint64)

    labels = np.unique(labels, return_inverse=True)[1].reshape(-1)
    masks, bitvals = fit_masks(labels)
    for _ in range(max(0, refine)):
        rw, _, cid = row_plan(words, masks, bitvals, popcount(masks), meta_words, width)
        # compressed rows move to their cheapest mask, raw rows keep their cluster
        new = np.where(rw < n, cid, labels)
        if np.array_equal(new, labels):
            break
        labels = np.unique(new, return_inverse=True)[1].reshape(-1)
        masks, bitvals = fit_masks(labels)
    return model_from_bits(dtype, row_shape, chunk_bytes, masks, bitvals)


def cluster_report(model: IBPModel, rows: Any) -> dict[str, Any]:
    """Sizes of ``rows`` packed in place with ``model``: payload (prefixes, bitmask, cluster
    ids), model metadata (masks + bit values) and the net saving counting both."""
    packed = model.compress(rows, "inplace")
    raw = packed.nrows * model.row_bytes
    cids = 0 if packed.cluster_ids is None else packed.cluster_ids.nbytes
    meta = model.metadata_nbytes
    return {
        "clusters": model.nclusters,
        "raw_bytes": raw,
        "payload_bytes": packed.nbytes,
        "cluster_id_bytes": cids,
        "model_bytes": meta,
        "saving": 1.0 - packed.nbytes / raw if raw else 0.0,
        "net_saving": 1.0 - (packed.nbytes + meta) / raw if raw else 0.0,
        "ratio": raw / packed.nbytes if packed.nbytes else float("inf"),
        "net_ratio": raw / (packed.nbytes + meta) if packed.nbytes + meta else float("inf"),
    }
