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

#: layouts whose decoders give one output row per record, in record order: the loader may
#: decode the records of several batches in one call and split the rows (PCR, IBP and TOC
#: records each hold many rows)
ROW_PER_RECORD_LAYOUTS = frozenset({"caffe-datum", "tensor"})

#: ``alloc(shape, dtype)``: an uninitialised C-contiguous array (``np.empty`` or a pool's)
Allocator = Callable[[tuple[int, ...], Any], np.ndarray]
#: ``decode(payload, offsets, keys, lengths=None)``: ``offsets`` are the ``N + 1`` record
#: bounds in ``payload``, or with ``lengths`` (by-reference slots) the ``N`` record starts
Decoder = Callable[..., tuple[Any, np.ndarray, np.ndarray, list[RecordError]]]


def _batch_decoder(cfg: Any, decode_batch: Callable[..., Any]) -> Decoder:
    """A decoder over one of the compiled batch decoders (Datum, tensor records)."""
    mode = "raise" if cfg.on_error == "raise" else "mask"

    def decode(payload, offsets, keys, lengths=None):
        b = decode_batch(payload, offsets, lengths, keys=keys, errors=mode)
        return b.data, b.labels, b.valid, b.errors

    return decode


def _caffe_datum(cfg: Any, float32: bool = False, alloc: Allocator = np.empty) -> Decoder:
    from lmdbio.codecs.datum import decode_datum_batch

    general = _batch_decoder(cfg, decode_datum_batch)
    if not float32:
        return general

    def decode(payload, offsets, keys, lengths=None):
        fast = uniform_datums_float32(payload, offsets, alloc, lengths)
        if fast is not None:
            return fast[0], fast[1], np.ones(fast[1].shape[0], bool), []
        return general(payload, offsets, keys, lengths)  # anything unusual: checked path

    return decode


#: float32 batches at least this large are written with streaming (non-temporal) stores:
#: larger than a core's L2 cache, and with several workers per host larger than their share
#: of the last-level cache, so ordinary stores would only evict (``bench/widen.py``)
STREAMING_MIN_BYTES = 8 << 20


class DatumSpans:
    """Where a slot's Caffe Datum records lie in a buffer, and the shape the fused kernels
    expect every one of them to have: the first record's, when it is a raw uint8 Datum.
    Rows ``a:b`` (:meth:`rows`) are one batch; the kernels (:func:`uniform_datums_float32`,
    :meth:`loaders.transform.DataTransformer.datums`) parse and check each batch's records
    as they read them, and give up (``None``) on a batch with any other record. A plain
    class with slots: one is made per batch, on the hot path."""

    __slots__ = ("lengths", "shape", "starts")

    def __init__(self, starts: np.ndarray, lengths: np.ndarray,
                 shape: tuple[int, int, int]) -> None:
        self.starts = starts  # int64 (N,): where each record starts
        self.lengths = lengths  # int64 (N,)
        self.shape = shape  # (C, H, W)

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def rows(self, a: int, b: int) -> DatumSpans:
        """Records ``a .. b - 1`` (views)."""
        return DatumSpans(self.starts[a:b], self.lengths[a:b], self.shape)

    def shape_array(self) -> np.ndarray:
        return np.asarray(self.shape, np.int64)


def datum_spans(payload: np.ndarray, offsets: np.ndarray,
                lengths: np.ndarray | None = None) -> DatumSpans | None:
    """The :class:`DatumSpans` of records in ``payload``, or ``None`` when the first one is
    not a raw uint8 Datum (encoded, float_data, a bad record: the general decoder handles
    and explains those). ``offsets`` are the ``N + 1`` record bounds in ``payload``, or with
    ``lengths`` the ``N`` record starts (records anywhere in ``payload``, e.g. spans of the
    database mapping). Only the first record is parsed here."""
    from lmdbio.codecs import _record_kernels as k

    if lengths is None:
        bounds = np.ascontiguousarray(offsets, np.int64)
        starts, lens = bounds[:-1], bounds[1:] - bounds[:-1]
    else:
        starts = np.ascontiguousarray(offsets, np.int64)
        lens = np.ascontiguousarray(lengths, np.int64)
        if lens.shape != starts.shape:
            return None
    if starts.shape[0] <= 0 or payload.dtype != np.uint8 or payload.ndim != 1:
        return None
    head = np.empty((1, k.NCOLS), np.int64)
    if k.parse_datums(payload, starts[:1], lens[:1], head):
        return None
    row = head[0]
    shape = (int(row[k.COL_CHANNELS]), int(row[k.COL_HEIGHT]), int(row[k.COL_WIDTH]))
    if row[k.COL_ENCODED] or min(shape) <= 0 or int(row[k.COL_DATA_LEN]) != \
            shape[0] * shape[1] * shape[2]:
        return None  # a header that claims more than its pixels is never allocated
    return DatumSpans(starts, lens, shape)


def uniform_datums_float32(payload: np.ndarray, offsets: np.ndarray | DatumSpans,
                           alloc: Allocator = np.empty, lengths: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray] | None:
    """``(N, C, H, W)`` float32 pixels and int64 labels of a batch of raw uint8 Datums of
    one shape, in one compiled pass (each record parsed, then its pixels widened as they
    are gathered); ``None`` when the batch is anything else (encoded, float_data, mixed
    shapes, a bad record), which the general decoder then handles and explains.

    The values equal :func:`~lmdbio.codecs.datum.decode_datum_batch` followed by
    ``astype(np.float32)``: what an identity Caffe transform produces. ``alloc(shape,
    dtype)`` provides the uninitialised pixel array (e.g. :meth:`BufferPool.take
    <loaders.buffer_pool.BufferPool.take>`). ``offsets`` are the ``N + 1`` record bounds in
    ``payload``, or with ``lengths`` the ``N`` record starts (records anywhere in
    ``payload``, e.g. spans of the database mapping), or the records' :class:`DatumSpans`.
    """
    from lmdbio.codecs import _record_kernels as k
    from loaders._decode_kernels import widen_datums

    spans = offsets if isinstance(offsets, DatumSpans) else \
        datum_spans(payload, offsets, lengths)
    if spans is None:
        return None
    n = len(spans)
    out = alloc((n, *spans.shape), np.float32)
    labels = np.empty(n, np.int64)
    streaming = out.nbytes >= STREAMING_MIN_BYTES
    table = np.empty((n, k.NCOLS), np.int64)
    if widen_datums(payload, spans.starts, spans.lengths, spans.shape_array(),
                    out.reshape(n, -1), labels, table, streaming) >= 0:
        return None
    return out, labels


def _tensor(cfg: Any) -> Decoder:
    from lmdbio.codecs.tensor import decode_tensor_batch

    return _batch_decoder(cfg, decode_tensor_batch)


def _copied_records_only(lengths: Any) -> None:
    """Layouts whose records are whole groups (TOC, IBP, PCR) are decoded from records
    copied into the slot; the loader never hands them out as spans (``readers.transfer``)."""
    if lengths is not None:
        raise ConfigError("readers.transfer: spans applies to caffe-datum and tensor records; "
                          "this layout's records must be copied into the ring")


def _toc(cfg: Any) -> Decoder:
    from lmdbio.codecs.toc import decode_batch_value

    def decode(payload, offsets, keys, lengths=None):
        _copied_records_only(lengths)
        if offsets.shape[0] != 2:
            raise ConfigError("dataset.layout toc: each TOC record is a whole mini-batch, so "
                              "each worker must receive exactly one record per batch "
                              f"(got {offsets.shape[0] - 1}); set batch.size to the number of "
                              "worker ranks")
        matrix, labels = decode_batch_value(payload[offsets[0]:offsets[1]])
        return matrix, np.asarray(labels), np.ones(labels.shape[0], bool), []

    return decode


def _ibp(cfg: Any, dataset_path: str) -> Decoder:
    from lmdbio.convert.ibp import decode_record, load_model

    model = load_model(dataset_path)

    def decode(payload, offsets, keys, lengths=None):
        _copied_records_only(lengths)
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

    def decode(payload, offsets, keys, lengths=None):
        _copied_records_only(lengths)
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


def make_decoder(cfg: Any, scan_groups: int | None = None, *, float32: bool = False,
                 alloc: Allocator = np.empty) -> Decoder:
    """The decoder for ``cfg.dataset.layout``.

    ``float32``: Caffe Datum batches may come out as float32 directly (for an identity
    transform, which would only convert them): one pass instead of decode + convert; its
    output array comes from ``alloc(shape, dtype)``.
    """
    layout = cfg.dataset.layout
    if layout == "caffe-datum":
        return _caffe_datum(cfg, float32, alloc)
    if layout == "tensor":
        return _tensor(cfg)
    if layout == "toc":
        return _toc(cfg)
    if layout == "ibp":
        return _ibp(cfg, cfg.dataset.path)
    if layout == "pcr":
        return _pcr(cfg, scan_groups if scan_groups is not None else cfg.dataset.scan_groups)
    raise ConfigError(f"dataset.layout: the loader has no decoder for {layout!r}")
