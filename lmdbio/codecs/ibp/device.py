"""IBP frames decoded on a GPU straight from pinned memory, and when to send them compressed.

:func:`decompress_pinned` parses a frame's header on the host (a few dozen bytes: no pass
over its rows), sends the whole frame -- header, per-row lengths or bitmask, cluster ids
and data section, one contiguous range -- to the device through a
:class:`loaders.device_feed.DeviceFeed` (one ``memcpy`` into a pinned buffer, then an
asynchronous copy on the feed's stream), and decodes it there with views into that one
device buffer. The per-row checks :meth:`IBPPacked.validate_rows` does on the host (cluster
ids below the number of masks, lengths within the raw row and adding up to the data section)
run on the device, with one small read-back of their verdict. Before, the device path staged
the data section through pageable memory (``cp.asarray(np.ascontiguousarray(packed.data))``)
after a host pass over the rows.

:func:`transport_compressed` is the ``auto`` rule: compressed transport pays only where the
compression ratio exceeds what it costs, i.e. where (compressed bytes over the link + the
decode) takes less than the raw bytes over the link. ``DEFAULT_MIN_RATIO`` is a parameter,
not a measurement: on one H200 a pageable-staged IBP path reached 45.9 GB/s of output at
ratio 5.83 against 54.9 GB/s for a raw pinned copy (issue 35); the pinned path here has not
been measured on a GPU yet. ``bench/gpu.py`` measures the break-even ratio on a device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from lmdbio.codecs.ibp.cuda import decode_words_cuda
from lmdbio.codecs.ibp.model import IBPModel
from lmdbio.codecs.ibp.packed import (
    HEAD,
    IBPPacked,
    check_compatible,
    section_layout,
)
from lmdbio.codecs.ibp.transport import as_uint8
from lmdbio.codecs.ibp.xpdecode import decode_words_xp
from lmdbio.errors import CodecError

#: the ``auto`` rule's threshold: send IBP frames where the sample's ratio is at least this
#: (breast-cancer rows compress 1.19x: raw; digits 4.76x and MNIST 5.83x: compressed). Not
#: measured on a GPU with the pinned path; ``bench/gpu.py`` reports the break-even ratio.
DEFAULT_MIN_RATIO = 2.0


def transport_compressed(ratio: float, min_ratio: float = DEFAULT_MIN_RATIO) -> bool:
    """The ``auto`` rule: whether batches compressing ``ratio``:1 should cross compressed."""
    if not min_ratio > 0:
        raise CodecError(f"IBP auto transport: min_ratio must be > 0, not {min_ratio}")
    return bool(ratio >= min_ratio)


@dataclasses.dataclass(eq=False)
class DevicePacked(IBPPacked):
    """An :class:`IBPPacked` whose sections are device arrays (views into one copy)."""

    def data_words(self) -> Any:
        # the data section starts 8-aligned in the frame, and the device buffer is aligned
        return self.data.view(np.dtype("<u4") if self.chunk_bytes == 4 else np.dtype("<u8"))


def to_device(packed: IBPPacked, frame: np.ndarray, feed: Any) -> tuple[DevicePacked, Any]:
    """``packed`` (parsed from the host ``frame``) on the device: the frame's bytes cross in
    one asynchronous copy through ``feed``; returns the device twin and the
    :class:`~loaders.device_feed.DeviceBatch` of the copy."""
    first, cids, _, data_off = section_layout(packed.layout, packed.nrows, packed.nchunks,
                                              packed.nclusters)
    total = data_off + packed.data.nbytes
    batch = feed.submit(frame[:total])
    dev, = batch.arrays()
    meta = HEAD.size

    def section(start: int, nbytes: int, dtype: Any) -> Any:
        # a copy on the device: the section may sit at an offset its dtype is not aligned to
        return dev[start:start + nbytes].copy().view(dtype)

    bitmask = lengths = cluster_ids = None
    if packed.layout == "inplace":
        bitmask = section(meta, first, np.uint8)
    else:
        assert packed.lengths is not None
        lengths = section(meta, first, packed.lengths.dtype)
    if cids:
        assert packed.cluster_ids is not None
        cluster_ids = section(meta + first, cids, packed.cluster_ids.dtype)
    twin = DevicePacked(packed.layout, packed.nrows, packed.nchunks, packed.chunk_bytes,
                        packed.nclusters, packed.model_id, dev[data_off:total],
                        bitmask=bitmask, lengths=lengths, cluster_ids=cluster_ids,
                        nbytes=packed.nbytes)
    return twin, batch


def validate_on_device(packed: Any, xp: Any) -> None:
    """:meth:`IBPPacked.validate_rows` on the device: the same checks and messages, one
    read-back of five integers."""
    verdict = [0, 0, 0, 0, packed.data.nbytes // packed.chunk_bytes]
    parts = []
    if packed.cluster_ids is not None and packed.nrows:
        bad = packed.cluster_ids.astype(xp.int64) >= packed.nclusters
        parts += [xp.any(bad).astype(xp.int64), xp.argmax(bad).astype(xp.int64)]
    else:
        parts += [xp.zeros((), xp.int64)] * 2
    if packed.lengths is not None and packed.nrows:
        lengths = packed.lengths.astype(xp.int64)
        bad = lengths > packed.nchunks
        parts += [xp.any(bad).astype(xp.int64), xp.argmax(bad).astype(xp.int64),
                  xp.sum(lengths)]
    else:
        parts += [xp.zeros((), xp.int64)] * 2 + [xp.asarray(np.int64(verdict[4]))]
    verdict = [int(v) for v in xp.stack(parts).get().tolist()]
    if verdict[0]:
        cid = int(packed.cluster_ids[verdict[1]:verdict[1] + 1].get()[0])
        raise CodecError(f"IBP frame: row {verdict[1]}: cluster id {cid} >= "
                         f"{packed.nclusters}")
    if verdict[2]:
        n = int(packed.lengths[verdict[3]:verdict[3] + 1].get()[0])
        raise CodecError(f"IBP frame: row {verdict[3]}: length {n} words exceeds the raw "
                         f"row ({packed.nchunks})")
    if packed.lengths is not None and verdict[4] * packed.chunk_bytes != packed.data.nbytes:
        raise CodecError(f"IBP frame: row lengths add up to {verdict[4] * packed.chunk_bytes} "
                         f"bytes, data section has {packed.data.nbytes}")


def decompress_pinned(model: IBPModel, buffer: Any, feed: Any, nrows: int | None = None,
                      method: str = "kernel") -> Any:
    """Rows of the IBP frame at the start of ``buffer`` (host memory; trailing bytes are
    ignored), decoded on the device of ``feed`` (a :class:`~loaders.device_feed.DeviceFeed`)
    after one copy of the frame through its pinned ring. ``method``: ``"kernel"`` (the CUDA
    kernel, :mod:`lmdbio.codecs.ibp.cuda`) or ``"xp"`` (the array-API decoder)."""
    if method not in ("kernel", "xp"):
        raise CodecError(f"IBP decompress_pinned: method must be kernel or xp, not {method!r}")
    frame = as_uint8(buffer)
    packed = IBPPacked.from_bytes(frame, exact=False, validate=False)
    if nrows is not None and packed.nrows != nrows:
        raise CodecError(f"IBP frame holds {packed.nrows} rows, expected {nrows}")
    check_compatible(model, packed)
    xp = feed.cp
    dev, batch = to_device(packed, frame, feed)
    validate_on_device(dev, xp)
    if method == "xp":
        words = decode_words_xp(model, dev, xp)
    else:
        words = decode_words_cuda(model, dev, xp)
    batch.release()  # the frame's readers are queued
    return model.words_as_rows(words, xp)
