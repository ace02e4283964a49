"""Turning a worker's part of a slot into arrays, per dataset layout.

A decoder takes the raw values of the records a worker received (one buffer + offsets, the
keys) and returns ``(data, labels, valid)``: ``valid`` is False for records that failed to
decode under a ``skip``/``substitute`` policy (with ``raise`` the first failure raises a
:class:`~lmdbio.errors.RecordError` naming the key).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lmdbio.errors import ConfigError, RecordError

Decoder = Callable[[np.ndarray, np.ndarray, list[bytes]], tuple[Any, np.ndarray, np.ndarray,
                                                               list[RecordError]]]


def _batch_decoder(cfg: Any, decode_batch: Callable[..., Any]) -> Decoder:
    """A decoder over one of the compiled batch decoders (Datum, tensor records)."""
    mode = "raise" if cfg.on_error == "raise" else "mask"

    def decode(payload, offsets, keys):
        b = decode_batch(payload, offsets, keys=keys, errors=mode)
        return b.data, b.labels, b.valid, b.errors

    return decode


def _caffe_datum(cfg: Any) -> Decoder:
    from lmdbio.codecs.datum import decode_datum_batch

    return _batch_decoder(cfg, decode_datum_batch)


def _tensor(cfg: Any) -> Decoder:
    from lmdbio.codecs.tensor import decode_tensor_batch

    return _batch_decoder(cfg, decode_tensor_batch)


def _toc(cfg: Any) -> Decoder:
    from lmdbio.codecs.toc import decode_batch_value

    def decode(payload, offsets, keys):
        if offsets.shape[0] != 2:
            raise ConfigError("dataset.layout toc: each TOC record is a whole mini-batch, so "
                              "each worker must receive exactly one record per batch "
                              f"(got {offsets.shape[0] - 1}); set batch.size to the number of "
                              "worker ranks")
        matrix, labels = decode_batch_value(payload[offsets[0]:offsets[1]])
        return matrix, np.asarray(labels), np.ones(labels.shape[0], bool), []

    return decode


def _ibp(cfg: Any, dataset_path: str) -> Decoder:
    from lmdbio.codecs.ibp.storage import decode_record, load_dataset_model

    model = load_dataset_model(dataset_path)

    def decode(payload, offsets, keys):
        rows, labels = [], []
        for i in range(offsets.shape[0] - 1):  # one record = a group of many rows
            r, lab = decode_record(payload[offsets[i]:offsets[i + 1]], model)
            rows.append(r)
            labels.append(lab if lab is not None else np.zeros(r.shape[0], np.int64))
        data = np.concatenate(rows) if rows else np.empty((0,))
        lab = np.concatenate(labels) if labels else np.empty(0, np.int64)
        return data, lab, np.ones(lab.shape[0], bool), []

    return decode


def _pcr(cfg: Any, k: int | None) -> Decoder:
    from lmdbio.codecs.pcr import decode_pcr_value

    k = 1 << 30 if k is None else k  # None: every scan group

    def decode(payload, offsets, keys):
        images, labels = [], []
        for i in range(offsets.shape[0] - 1):  # one record = a group of images
            imgs, labs, _ = decode_pcr_value(payload[offsets[i]:offsets[i + 1]], k)
            images.extend(imgs)
            labels.extend(int(x) for x in labs)
        lab = np.asarray(labels, np.int64)
        if isinstance(images, list) and images and all(
                im.shape == images[0].shape for im in images):
            stacked = np.stack(images)  # (N, H, W) grey or (N, H, W, C) colour
            images = stacked[:, None] if stacked.ndim == 3 else stacked.transpose(0, 3, 1, 2)
        return images, lab, np.ones(lab.shape[0], bool), []

    return decode


def make_decoder(cfg: Any, scan_groups: int | None = None) -> Decoder:
    """The decoder for ``cfg.dataset.layout``."""
    layout = cfg.dataset.layout
    if layout == "caffe-datum":
        return _caffe_datum(cfg)
    if layout == "tensor":
        return _tensor(cfg)
    if layout == "toc":
        return _toc(cfg)
    if layout == "ibp":
        return _ibp(cfg, cfg.dataset.path)
    if layout == "pcr":
        return _pcr(cfg, scan_groups if scan_groups is not None else cfg.dataset.scan_groups)
    raise ConfigError(f"dataset.layout: the loader has no decoder for {layout!r}")
