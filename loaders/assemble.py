"""From a received slot to the worker's batches: decode per layout, ``on_error``, transform.

A slot carries one or more consecutive batches of this worker's records (packed values,
or spans of the database mapping). :class:`BatchAssembler` turns it into ``(Batch,
payload bytes)`` per batch, or the error that batch raises when it is taken: the records
decoded in one call where the layout has one output row per record, batch by batch
otherwise; records that fail go through the ``on_error`` policy; Caffe's transform runs on
the host, or on the worker's device after the pixels cross as they are. Raw Caffe Datums on
a CPU worker go from their bytes to the transformed float32 batch in one compiled pass
(:meth:`BatchAssembler.fused_batch`), each batch when it is asked for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from lmdbio.errors import LmdbioError, RecordError
from lmdbio.layouts import get_layout
from lmdbio.ring_setup import SLOT_TARGET_DECODED_BYTES
from lmdbio.stages import StageClock
from loaders.decode import (
    ROW_PER_RECORD_LAYOUTS,
    Allocator,
    DatumSpans,
    Decoded,
    Decoder,
    datum_spans,
    uniform_datums_float32,
)
from loaders.metrics import LoaderMetrics, Pace
from loaders.schedule import batch_bounds
from loaders.transform import DataTransformer, XpArray, transform_rng

if TYPE_CHECKING:  # pragma: no cover
    from lmdbio.config import JobConfig
    from lmdbio.plan.epoch import EpochPlan
    from lmdbio.slot_receiver import Delivered
    from loaders.device_feed import DeviceFeed

log = logging.getLogger("lmdbio.loader")


@dataclass
class Batch:
    """One worker's batch.

    ``data`` is ``(N, C, h, w)`` float32 for Caffe Datums (after Caffe's transform),
    ``(N, *shape)`` for tensor records (float32 ``(N, C, h, w)`` after a transform other
    than the identity), a :class:`~lmdbio.codecs.toc.TocMatrix` for TOC;
    numpy on CPU hosts, cupy on GPU workers. ``keys`` are the LMDB keys (traceability):
    key ``i`` is ``key_data[key_offsets[i]:key_offsets[i + 1]]`` (``key_data`` may be the
    packed keys of the whole slot the batch came in, shared by its batches: views, not a
    copy per batch). ``ids`` are the records' positions in key order, ``padding`` flags
    records repeated to fill the epoch's last batch (policy ``pad``).
    """

    data: Any  # an XpArray, or a TOC matrix (see above)
    label: XpArray
    ids: np.ndarray
    padding: np.ndarray
    epoch: int
    iteration: int
    key_offsets: np.ndarray
    key_data: np.ndarray

    def __len__(self) -> int:  # images (rows): a PCR, IBP or TOC record holds several
        return int(self.label.shape[0])

    @property
    def keys(self) -> list[bytes]:
        """The LMDB keys of the batch's records (built on demand: not on the hot path)."""
        ko, kd = self.key_offsets, self.key_data
        return [bytes(kd[ko[i]:ko[i + 1]]) for i in range(ko.shape[0] - 1)]


@dataclass(frozen=True)
class SlotRecords:
    """A received slot's records as the assembler reads them: ``payload`` and
    ``offsets`` (record starts in the payload; with ``lengths``, spans of the database
    mapping), the packed keys ``ko``/``kd``, the record ids and padding flags (copies: the
    slot may be released before a batch is used; each batch takes views of them) and, for
    fused Datums, their parsed spans."""

    got: Delivered
    payload: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray | None
    ko: np.ndarray
    kd: np.ndarray
    fused: DatumSpans | None
    ids: np.ndarray
    padding: np.ndarray


def keep_records(keep: np.ndarray, ko: np.ndarray, kd: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The packed keys (offsets, bytes) of records ``keep`` only (``on_error: skip``)."""
    lens = np.diff(ko)[keep]
    starts = ko[:-1][keep]
    kept = np.concatenate([kd[s:s + n] for s, n in zip(starts.tolist(), lens.tolist(),
                                                       strict=True)]
                          or [np.empty(0, np.uint8)])
    offsets = np.zeros(keep.size + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets, kept


#: what taking a batch gives: ``(batch, payload bytes)``, or the error taking it raised
Taken = tuple[Batch, int] | LmdbioError
#: a batch of :meth:`BatchAssembler.make_batches`: taken already, or (fused Datums) a
#: call that takes it when it is asked for
Made = Taken | Callable[[], Taken]


class BatchAssembler:
    """A worker's batches from its received slots (see the module docstring).

    ``decode`` is the layout's decoder (:func:`loaders.decode.make_decoder`), replaced
    when the records read change (PCR scan groups); ``transform`` Caffe's transform or
    None; ``xp`` numpy or cupy; ``feed`` a GPU worker's pinned staging ring; ``alloc``
    the pooled host arrays' allocator. Decode time and the ``on_error`` counts go to
    ``metrics``, fused assembly times to ``pace``.
    """

    def __init__(self, cfg: JobConfig, decode: Decoder, transform: DataTransformer | None,
                 xp: ModuleType, feed: DeviceFeed | None, alloc: Allocator, *, seed: int,
                 rank: int,
                 worker: int, metrics: LoaderMetrics, pace: Pace, stages: StageClock) -> None:
        self.layout, self.on_error = cfg.dataset.layout, cfg.on_error
        #: the layout's records may take the fused Datum path (``Layout.fused_datum``)
        self.fused_layout = get_layout(self.layout).fused_datum
        self.decode, self.transform, self.xp, self.feed = decode, transform, xp, feed
        self.alloc, self.seed, self.rank, self.worker = alloc, seed, rank, worker
        self.metrics, self.pace, self.stages = metrics, pace, stages
        #: (pixels, label) of this worker's last good record (``on_error: substitute``)
        self.last_good: tuple[Any, Any] | None = None

    @property
    def fuses_datums(self) -> bool:
        """Whether batches may be assembled by the fused Datum kernels (Caffe Datums
        with a transform, on the CPU): see :meth:`fused_batch`."""
        return self.transform is not None and self.xp is np and self.fused_layout

    # ----------------------------------------------------------------- a slot
    def make_batches(self, got: Delivered, first: int, epoch: int, plan: EpochPlan,
                     expected: int | None) -> list[Made]:
        """The batches of the received slot ``got``, iterations ``first ..`` of
        ``epoch`` (laid out by ``plan``; ``expected``: how many it must carry): ``(Batch,
        payload bytes)`` each, or the exception that batch raises when it is taken. Fused
        Datums give a ``partial`` per batch, called when the batch is asked for.

        The records of every batch of the slot are decoded in one call where the layout
        has one output row per record and all decode; otherwise (or when a record fails)
        batch by batch, which is exactly what one slot per batch gives (the ``on_error``
        policy, the substitute for a bad record, where a ``raise`` surfaces).
        """
        t0 = time.perf_counter()
        payload, offsets, lengths, fused = self.prepare(got)
        count = got.batches
        if got.iteration != first or (expected is not None and count != expected):
            raise LmdbioError(f"internal: slot of epoch {got.epoch} iteration {got.iteration} "
                              f"({count} batches) where iteration {first} was expected")
        ko, kd = got.packed_keys()  # copies: the slot is released before the batch is used
        rec = SlotRecords(got, payload, offsets, lengths, ko, kd, fused, got.ids.copy(),
                          got.padding.copy())
        n = offsets.shape[0] - (1 if lengths is None else 0)
        bounds = batch_bounds(plan.sizes, self.worker, first, count, n)
        if rec.fused is not None:  # each batch assembled when asked for, or just ahead of it
            # each batch's payload bytes now, in one pass (not a call per batch)
            nbytes = np.diff(got.value_bytes_at(bounds)).tolist()
            edges = bounds.tolist()
            self.metrics.decode_seconds += time.perf_counter() - t0
            return [partial(self.fused_batch, rec, first + j, edges[j], edges[j + 1], epoch,
                            nbytes[j]) for j in range(count)]
        out: list[Made] = []
        with self.stages.span("assemble"):
            # one decode call for the slot where its decoded records stay within what a
            # slot decoded ahead may take (slots of spans may hold far more records)
            whole = self.decode_whole(rec) if count > 1 and \
                4 * got.value_bytes(0, n) <= SLOT_TARGET_DECODED_BYTES else None
            for j in range(count):
                a, b = int(bounds[j]), int(bounds[j + 1])
                try:
                    part = None if whole is None else (whole[0][a:b], whole[1][a:b])
                    out.append(self.finish_batch(rec, first + j, a, b, part, epoch))
                except LmdbioError as exc:
                    out.append(exc)
        self.metrics.decode_seconds += time.perf_counter() - t0
        return out

    def prepare(self, got: Delivered
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, DatumSpans | None]:
        """The slot's ``(payload, offsets, lengths, fused spans)``, checked: its checksum
        (where receiving deferred it) and the overflow page headers of records by
        reference (fused batches check their own, as they read them)."""
        with self.stages.span("prepare"):
            got.verify()
            offsets = np.asarray(got.offsets, np.int64)
            payload = np.asarray(got.payload)
            lengths = got.lengths  # by reference: spans of the database mapping
            fused = self.parse_fused(got, payload, offsets, lengths)
            if fused is None:
                got.check_values()
        return payload, offsets, lengths, fused

    def decode_whole(self, rec: SlotRecords) -> Decoded | None:
        """Every record of a slot of several batches decoded in one call, where the
        layout has one output row per record and all decode; None otherwise."""
        if self.layout not in ROW_PER_RECORD_LAYOUTS:
            return None
        ko, kd = rec.ko, rec.kd
        try:
            whole = self.decode(rec.payload, rec.offsets,
                                lambda i: bytes(kd[ko[i]:ko[i + 1]]), rec.lengths)
        except LmdbioError:
            return None  # a bad record: batch by batch, where it belongs
        if isinstance(whole[0], list) or not whole[2].all():
            return None
        return whole

    def parse_fused(self, got: Delivered, payload: np.ndarray, offsets: np.ndarray,
                    lengths: np.ndarray | None) -> DatumSpans | None:
        """The slot's records as :class:`~loaders.decode.DatumSpans` where they may go
        from their bytes to the transformed float32 batch in one compiled pass (Caffe
        Datums whose first is raw uint8, a CPU worker); ``None`` otherwise."""
        if not self.fuses_datums:
            return None
        if lengths is not None:
            got.check_value_rows(0, 1)  # the first record's header, before it is parsed
        return datum_spans(payload, offsets, lengths)

    # ----------------------------------------------------------------- a batch
    def fused_batch(self, rec: SlotRecords, iteration: int, a: int, b: int,
                    epoch: int, nbytes: int) -> Taken:
        """Batch ``iteration`` (records ``a .. b - 1`` of the slot, parsed as
        :class:`~loaders.decode.DatumSpans`, ``nbytes`` of payload) as
        :meth:`make_batches` gives it: ``(Batch, payload bytes)``, or the error taking it
        raises. Reads the slot: it is held until its last batch is assembled."""
        t0 = time.perf_counter()
        try:
            with self.stages.span("assemble"):
                # the overflow page headers still to check are checked by the kernel as it
                # reads each value; a batch it gives up on gets the exact check, which names
                # a bad header's page, before the general path reads its values
                assert rec.fused is not None  # made by make_batches for fused slots only
                fmt = rec.got.header_format()
                part = self.assemble_datums(rec.payload, rec.fused.rows(a, b), iteration,
                                            epoch, fmt)
                self.pace.assembled(time.perf_counter() - t0)
                if part is None:  # a record of another kind or shape, or a bad one
                    if fmt is not None:
                        rec.got.check_value_rows(a, b)
                    return self.finish_batch(rec, iteration, a, b, None, epoch)
                # transformed, on the host (fused batches are CPU batches): what
                # finish_batch would do to it is only to wrap it, done here without its
                # general-path Python (a batch's Python runs against caches the kernel
                # has just swept: finish_batch's own time was ~13 us a CIFAR-like batch
                # under cProfile)
                return (Batch(part[0], part[1], rec.ids[a:b], rec.padding[a:b], epoch,
                              iteration, rec.ko[a:b + 1], rec.kd), nbytes)
        except LmdbioError as exc:
            return exc
        finally:
            self.metrics.decode_seconds += time.perf_counter() - t0

    def assemble_datums(self, payload: np.ndarray, spans: DatumSpans, iteration: int, epoch: int,
                        header_fmt: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray] | None:
        """One batch of :meth:`parse_fused`'s records, transformed, in pooled memory;
        ``None`` when one of them is not a raw uint8 Datum of the slot's shape, or (with
        ``header_fmt``, spans of the mapping) its overflow page header is wrong."""
        t = self.transform
        assert t is not None  # only called where fuses_datums: there is a transform
        if t.is_identity:  # widened only (streaming stores for large batches)
            return uniform_datums_float32(payload, spans, self.alloc, header_fmt=header_fmt)
        rng = self.transform_rng(iteration, epoch)
        return t.datums(payload, spans, rng, alloc=self.alloc, header_fmt=header_fmt)

    def finish_batch(self, rec: SlotRecords, iteration: int, a: int, b: int,
                     decoded: tuple[Any, Any] | None, epoch: int) -> tuple[Batch, int]:
        """Batch ``iteration`` of ``epoch`` from records ``a .. b - 1`` of the slot:
        decoded here unless ``decoded`` holds its rows already; then the ``on_error``
        policy and the transform; on the worker's device last."""
        got, payload, offsets, lengths = rec.got, rec.payload, rec.offsets, rec.lengths
        ko, kd = rec.ko[a:b + 1], rec.kd  # views: this batch's key bounds in the slot's keys
        if lengths is None:
            lo, hi = int(offsets[a]), int(offsets[b])
            nbytes = hi - lo
        else:
            nbytes = got.value_bytes(a, b)

        def key(i: int) -> bytes:
            return bytes(kd[ko[i]:ko[i + 1]])

        ids, padding = rec.ids[a:b], rec.padding[a:b]
        if decoded is not None:
            data, labels = decoded
        else:
            if lengths is not None:  # spans of the database mapping
                data, labels, valid, errors = self.decode(payload, offsets[a:b], key,
                                                          lengths[a:b])
            else:
                offs = offsets[a:b + 1] - lo if (a, b) != (0, offsets.shape[0] - 1) \
                    else offsets
                data, labels, valid, errors = self.decode(payload[lo:hi], offs, key)
            if not valid.all():
                keep = self.apply_policy(data, labels, valid, errors, key)
                if keep is not None:
                    data, labels, ids, padding = (data[keep], labels[keep], ids[keep],
                                                  padding[keep])
                    ko, kd = keep_records(keep, ko, kd)
        data, labels = self.place(data, labels, iteration, epoch)
        return Batch(data, labels, ids, padding, epoch, iteration, ko, kd), nbytes

    def place(self, data: Any, labels: Any, iteration: int, epoch: int) -> tuple[Any, Any]:
        """A decoded batch transformed and on the worker's device."""
        if self.transform is not None and not isinstance(data, list):
            if self.xp is not np and isinstance(data, np.ndarray):
                data, labels = self.transform_on_device(data, labels, iteration, epoch)
            else:
                data = self.transform_host(data, iteration, epoch)
        if self.xp is not np:
            data, labels = self.to_device(data, labels)
        return data, labels

    # ----------------------------------------------------------------- transform
    def transform_rng(self, iteration: int, epoch: int) -> np.random.Generator | None:
        """The random generator of one batch's transform decisions (None: it draws
        nothing)."""
        t = self.transform
        assert t is not None  # called only when the job has a transform
        if not (t.mirror or (t.crop_size and t.phase == "train")):
            return None
        return transform_rng(self.seed, epoch, iteration, self.rank)

    def transform_host(self, data: np.ndarray, iteration: int, epoch: int) -> np.ndarray:
        """Caffe's transform of a decoded batch (float32 out).

        The identity (no crop, mirror, mean or scale: the output is the pixels as float32)
        is one numpy conversion; the random generator is only seeded when the transform
        draws something (random crops or mirrors).
        """
        t = self.transform
        assert t is not None  # called only when the job has a transform
        if not data.shape[0] or t.is_identity:  # decoders return fresh arrays: no copy
            return data.astype(np.float32, copy=False)
        rng = self.transform_rng(iteration, epoch)
        out = None
        if self.xp is np and isinstance(data, np.ndarray) and data.ndim == 4:
            out = self.alloc((data.shape[0], *t.check(data.shape)), np.float32)
        return t(data, rng=rng, out=out)

    def transform_on_device(self, data: np.ndarray, labels: XpArray, iteration: int,
                            epoch: int) -> tuple[XpArray, XpArray]:
        """Caffe's transform of a decoded batch on the worker's device: the pixels cross
        as they are (uint8 for Datums: a quarter of float32's bytes; with the labels, from
        the pinned ring of :attr:`feed`), and crop, mirror, mean and scale run there
        (:func:`loaders.transform.transform_batch`, the same float32 operations in the same
        order as the CPU kernel, so the same values). The decisions are drawn on the host
        from the same generator as on a CPU worker. Returns (data, labels) on the device."""
        assert self.feed is not None  # a GPU worker's (xp is cupy): Loader made it
        copied = self.feed.submit(*[x for x in (data, labels) if isinstance(x, np.ndarray)])
        device, *rest = copied.arrays()
        labels = rest[0] if rest else labels
        if not data.shape[0]:
            out = device.astype(self.xp.float32)
        else:
            assert self.transform is not None  # called only when the job has a transform
            out = self.transform(device, self.transform_rng(iteration, epoch), xp=self.xp)
        copied.release()  # the raw pixels' reader (the transform) is queued
        return out, labels

    def to_device(self, data: Any, labels: Any) -> tuple[Any, Any]:
        """``data`` and ``labels`` on the worker's device: the host (numpy) ones through
        the pinned ring of :attr:`feed` in one asynchronous copy; others as they are."""
        if isinstance(labels, (list, tuple)):
            labels = np.asarray(labels)
        host = [i for i, x in enumerate((data, labels)) if isinstance(x, np.ndarray)]
        if not host:
            return data, labels
        pair = [data, labels]
        assert self.feed is not None  # a GPU worker's (xp is cupy): Loader made it
        got = self.feed.submit(*[pair[i] for i in host]).arrays()
        for i, dev in zip(host, got, strict=True):
            pair[i] = dev
        return pair[0], pair[1]

    # ----------------------------------------------------------------- on_error
    def apply_policy(self, data: Any, labels: Any, valid: np.ndarray, errors: list[RecordError],
                     key: Callable[[int], bytes]) -> np.ndarray | None:
        """Apply ``on_error`` to the records that failed: ``skip`` returns the indices to
        keep; ``substitute`` overwrites them in place and returns None."""
        policy = self.on_error
        for err in errors:
            log.warning("rank %d: %s (%s)", self.rank, err, policy)
        bad = np.flatnonzero(~valid)
        if policy == "skip":
            self.metrics.skipped += bad.size
            return np.flatnonzero(valid)
        # substitute: the previous good record of this worker takes the bad one's place
        good = np.flatnonzero(valid)
        for i in bad.tolist():
            prev = good[good < i]
            if prev.size:
                src_data, src_label = data[prev[-1]], labels[prev[-1]]
            elif self.last_good is not None:
                src_data, src_label = self.last_good
            else:
                raise LmdbioError(f"on_error substitute: record {key(i)!r} failed and no good "
                                  "record came before it to stand in") from None
            data[i], labels[i] = src_data, src_label
            self.metrics.substituted += 1
        if good.size:
            self.last_good = (data[good[-1]].copy(), labels[good[-1]])
        return None
