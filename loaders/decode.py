"""Turning a worker's part of a slot into arrays, per dataset layout.

A decoder takes the raw values of the records a worker received (one buffer + offsets, the
keys) and returns ``(data, labels, valid)``: ``valid`` is False for records that failed to
decode under a ``skip``/``substitute`` policy (with ``raise`` the first failure raises a
:class:`~lmdbio.errors.RecordError` naming the key).

Each layout names its decoder factory in the registry :data:`lmdbio.layouts.LAYOUTS`
(``caffe_datum_decoder`` ...); :func:`make_decoder` looks it up. A factory is called as
``factory(cfg, scan_groups=..., float32=..., alloc=...)`` and ignores what it does not use.
A layout's codec is imported when its decoder is made, and the numba kernels on first use,
so that ``import loaders`` loads neither.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from lmdbio.codecs.record_batch import as_spans, as_u8, key_of
from lmdbio.config import setting_error
from lmdbio.errors import ConfigError, LmdbioError, RecordError
from lmdbio.kernel_cache import kernel_module
from lmdbio.layouts import LAYOUTS, get_layout, layout_names
from loaders import stores
from loaders.transform import RaggedImages, fused_kernel_wrote

if TYPE_CHECKING:  # pragma: no cover
    from lmdbio.codecs.datum.batch import DatumHeaders
    from lmdbio.codecs.record_batch import KeySource
    from lmdbio.config import JobConfig

#: layouts whose decoders give one output row per record, in record order: the loader may
#: decode the records of several batches in one call and split the rows (PCR, IBP and TOC
#: records each hold many rows); from the registry (``Layout.row_per_record``)
ROW_PER_RECORD_LAYOUTS = frozenset(layout_names(row_per_record=True))

#: ``alloc(shape, dtype)``: an uninitialised C-contiguous array (``np.empty`` or a pool's)
Allocator = Callable[[tuple[int, ...], DTypeLike], np.ndarray]
#: a decoder's ``(data, labels, valid, errors)``: ``data`` is an array (numpy), a
#: :class:`~loaders.transform.RaggedImages`, a TOC matrix or a list, by layout
Decoded = tuple[Any, np.ndarray, np.ndarray, list[RecordError]]
#: ``decode(payload, offsets, keys, lengths=None)``: ``offsets`` are the ``N + 1`` record
#: bounds in ``payload``, or with ``lengths`` (by-reference slots) the ``N`` record starts
Decoder = Callable[..., Decoded]


def _batch_decoder(cfg: JobConfig, decode_batch: Callable[..., Any]) -> Decoder:
    """A decoder over one of the compiled batch decoders (Datum, tensor records)."""
    mode = "raise" if cfg.on_error == "raise" else "mask"

    def decode(payload, offsets, keys, lengths=None):
        b = decode_batch(payload, offsets, lengths, keys=keys, errors=mode)
        return b.data, b.labels, b.valid, b.errors

    return decode


def _image_rules(cfg: JobConfig) -> tuple[int, bool]:
    """``(crop_size, has a mean file)`` of the job's transform: what decides whether a
    batch of images of several sizes can be read (Caffe crops each image on its own)."""
    t = getattr(cfg, "transform", None)
    return int(getattr(t, "crop_size", 0) or 0), getattr(t, "mean_file", None) is not None


def caffe_datum_decoder(cfg: JobConfig, *, float32: bool = False,
                        alloc: Allocator = np.empty, **_: object) -> Decoder:
    """Caffe Datums (``float32``: see :func:`make_decoder`)."""
    from lmdbio.codecs.datum import decode_datum_batch

    mode = "raise" if cfg.on_error == "raise" else "mask"
    crop, mean_file = _image_rules(cfg)

    def general(payload, offsets, keys, lengths=None):
        # the batch decoder takes records of one shape; a batch whose records differ in
        # size (image folders converted with --keep-sizes) is read as Caffe reads it,
        # each image cropped on its own, or refused with the reason (ragged_datum_batch)
        try:
            b = decode_datum_batch(payload, offsets, lengths, keys=keys, errors=mode)
        except RecordError:
            ragged = ragged_datum_batch(payload, offsets, lengths, keys, crop=crop,
                                        mean_file=mean_file, errors=mode)
            if ragged is None:
                raise
            return ragged
        if b.errors:
            ragged = ragged_datum_batch(payload, offsets, lengths, keys, crop=crop,
                                        mean_file=mean_file, errors=mode)
            if ragged is not None:
                return ragged
        return b.data, b.labels, b.valid, b.errors

    if not float32:
        return general

    def decode(payload, offsets, keys, lengths=None):
        fast = uniform_datums_float32(payload, offsets, alloc, lengths)
        if fast is not None:
            return fast[0], fast[1], np.ones(fast[1].shape[0], bool), []
        return general(payload, offsets, keys, lengths)  # anything unusual: checked path

    return decode


def _size_rule(shapes: np.ndarray, rows: np.ndarray, crop: int, mean_file: bool,
               name: Callable[[int], str], fix: str) -> tuple[int, str] | None:
    """The first of ``rows`` (images of ``shapes`` (N, 3) = (C, H, W), in batch order) that
    Caffe's data layer would refuse in one batch with these images, and why: another channel
    count than the first; without ``crop_size``, or with a mean file, another shape; with
    it, a side smaller than the crop. ``None`` when every image may be read. ``name(i)``
    names an image; ``fix`` says how to convert them to one kind."""
    if not rows.size:
        return None
    first = int(rows[0])
    s0 = tuple(int(x) for x in shapes[first])
    sub = shapes[rows]
    odd = np.flatnonzero(sub[:, 0] != s0[0])
    if odd.size:
        i = int(rows[odd[0]])
        return i, (f"{int(shapes[i, 0])} channel(s), {name(first)} has {s0[0]}: grey and "
                   f"colour images mixed in one batch (Caffe refuses them too); {fix}")
    if not crop or mean_file:
        odd = np.flatnonzero((sub != np.asarray(s0)).any(axis=1))
        if not odd.size:
            return None
        i = int(rows[odd[0]])
        why = ("transform.mean_file holds one image size and Caffe requires every image to "
               "have it: use transform.mean_values" if crop else
               "images of several sizes need transform.crop_size, which crops each one as "
               "Caffe does")
        return i, (f"shape {tuple(int(x) for x in shapes[i])} differs from {s0}, the shape "
                   f"of {name(first)}; {why}, or convert the images to one size (lmdbio "
                   "convert --resize H W)")
    small = np.flatnonzero((sub[:, 1] < crop) | (sub[:, 2] < crop))
    if small.size:
        i = int(rows[small[0]])
        return i, (f"its {int(shapes[i, 1])}x{int(shapes[i, 2])} image is smaller than "
                   f"transform.crop_size {crop} (Caffe refuses it too)")
    return None


def check_crop_size(cfg: JobConfig) -> None:
    """Refuse, when the job opens, a ``transform.crop_size`` larger than the smallest image
    of a data set converted with images of several sizes (its ``lmdbio.json`` names that
    image): Caffe would stop at that image, maybe hours into the run."""
    crop, _ = _image_rules(cfg)
    if not crop:
        return
    try:
        small = dataset_meta(cfg).get("smallest_image")
    except LmdbioError:
        return  # an unreadable sidecar: the images are checked as they are read
    if not isinstance(small, dict):
        return
    h, w = small.get("height"), small.get("width")
    if isinstance(h, int) and isinstance(w, int) and crop > min(h, w):
        raise setting_error(cfg.origin, "transform.crop_size", f"{crop} is larger than the "
                            f"smallest image of {cfg.dataset.path}, {small.get('name')!r} "
                            f"({h}x{w}, from its lmdbio.json): Caffe would stop at it; use a "
                            f"crop_size of at most {min(h, w)}, or convert the images to one "
                            "size (--resize H W)")


def ragged_datum_batch(payload: Any, offsets: np.ndarray, lengths: np.ndarray | None,
                       keys: KeySource, *, crop: int = 0,
                       mean_file: bool = False, errors: str = "raise"
                       ) -> tuple[RaggedImages, np.ndarray, np.ndarray, list[RecordError]] | None:
    """A batch of Caffe Datums of several shapes as a :class:`~loaders.transform.
    RaggedImages` (``(data, labels, valid, errors)`` like the other decoders), for a
    transform with ``crop_size`` to crop each one as Caffe does; ``None`` when the
    records that decode have one shape (then the batch decoder's verdict stands).

    Raises :class:`~lmdbio.errors.RecordError` naming the first record Caffe would refuse
    in this batch (:func:`_size_rule`), whatever ``errors`` says: a grey image among colour
    ones, or a size that the job cannot take, is not a damaged record to skip but a data
    set that does not fit the job. Damaged records are raised or masked as by
    :func:`~lmdbio.codecs.datum.decode_datum_batch`. Raw uint8 records are gathered in one
    compiled pass; encoded, float_data and damaged ones are decoded one by one."""
    from lmdbio.codecs.datum import parse_datum_headers
    u8 = as_u8(payload)
    off, ln = as_spans(offsets, lengths)
    n = off.shape[0]
    if n < 2:
        return None
    h = parse_datum_headers(u8, off, ln)
    shapes = np.stack([h.channels, h.height, h.width], axis=1)
    claimed = np.prod(shapes.astype(np.float64), axis=1)  # exact below 2**53: no overflow
    fits = ((h.error == 0) & ~h.encoded & (shapes > 0).all(axis=1)
            & (h.data_len > 0) & (h.data_len == claimed))
    images, bad = _decode_misfits(u8, off, ln, keys, shapes, fits)
    ok = np.ones(n, bool)
    ok[list(bad)] = False
    good = np.flatnonzero(ok)
    if not good.size or (shapes[good] == shapes[good[0]]).all():
        return None
    _raise_first_refused(shapes, good, bad, keys, crop, mean_file, errors)
    out_shapes = shapes.copy()
    out_shapes[~ok] = shapes[good[0]]  # masked records: zeros of the first one's shape
    pixels, starts = _pack_pixels(u8, h, np.flatnonzero(fits), images, out_shapes, bool(bad))
    errs = [bad[i] for i in sorted(bad)]
    return RaggedImages(pixels, starts, out_shapes), h.label.copy(), ok, errs


def _decode_misfits(u8: np.ndarray, off: np.ndarray, ln: np.ndarray, keys: KeySource,
                    shapes: np.ndarray, fits: np.ndarray
                    ) -> tuple[dict[int, np.ndarray], dict[int, RecordError]]:
    """Decode the records the compiled gather cannot take (encoded, float_data or damaged)
    one by one: ``(images, bad)`` by batch index; ``shapes`` gets the decoded images'."""
    from lmdbio.codecs.datum import decode_datum_batch
    images: dict[int, np.ndarray] = {}
    bad: dict[int, RecordError] = {}
    for i in np.flatnonzero(~fits).tolist():
        one = decode_datum_batch(u8, off[i:i + 1], ln[i:i + 1], keys=[key_of(keys, i)],
                                 errors="mask")
        if one.valid[0]:
            images[i] = one.data[0]
            shapes[i] = one.data[0].shape
        else:
            bad[i] = one.errors[0]
    return images, bad


def _raise_first_refused(shapes: np.ndarray, good: np.ndarray, bad: dict[int, RecordError],
                         keys: KeySource, crop: int, mean_file: bool, errors: str) -> None:
    """Raise for the first record, in batch order, that Caffe would refuse (:func:`_size_rule`,
    whatever ``errors`` says) or, with ``errors="raise"``, that is damaged."""
    n = shapes.shape[0]

    def name(i: int) -> str:
        return f"record {key_of(keys, i)!r}"

    refused = _size_rule(shapes, good, crop, mean_file, name,
                         "convert the images to one kind (lmdbio convert makes colour images "
                         "unless --gray)")
    first_bad = min(bad) if bad and errors == "raise" else n
    if refused is not None and refused[0] < first_bad:
        raise RecordError(key_of(keys, refused[0]), f"bad Caffe Datum: {refused[1]}")
    if first_bad < n:
        raise bad[first_bad]


def _pack_pixels(u8: np.ndarray, h: DatumHeaders, raw: np.ndarray, images: dict[int, np.ndarray],
                 out_shapes: np.ndarray, any_bad: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels, starts)``: every record's pixels end to end (uint8, or float32 when a
    decoded image is), the ``raw`` uint8 records gathered in one compiled pass where the
    output is uint8; records in neither ``raw`` nor ``images`` stay zero."""
    gather_pixels = kernel_module("loaders").gather_pixels

    n = out_shapes.shape[0]
    sizes = out_shapes.prod(axis=1)
    starts = np.zeros(n, np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    floats = any(im.dtype != np.uint8 for im in images.values())
    dtype = np.float32 if floats else np.uint8
    total = int(sizes.sum())
    pixels = np.zeros(total, dtype) if any_bad else np.empty(total, dtype)
    if not floats:
        gather_pixels(u8, h.table, raw, starts[raw], pixels)
    else:
        for i in raw.tolist():
            a = int(h.data_offset[i])
            pixels[starts[i]:starts[i] + sizes[i]] = u8[a:a + int(sizes[i])]
    for i, im in images.items():
        pixels[starts[i]:starts[i] + sizes[i]] = im.reshape(-1)
    return pixels, starts


#: ``header_fmt`` of the fused Datum kernels when no overflow page header is to be checked
#: (records copied into a slot, or spans whose headers were checked already)
NO_HEADER_CHECK = np.zeros(0, np.int64)



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
    k = kernel_module("lmdbio.codecs.datum")

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
                           alloc: Allocator = np.empty, lengths: np.ndarray | None = None,
                           *, header_fmt: np.ndarray | None = None
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
    ``header_fmt``: the database's page format when the records are spans of its mapping
    whose overflow page headers are still to be checked: a bad one gives ``None`` too (the
    caller's exact check then names the page).
    """
    k = kernel_module("lmdbio.codecs.datum")
    widen_datums = kernel_module("loaders").widen_datums

    spans = offsets if isinstance(offsets, DatumSpans) else \
        datum_spans(payload, offsets, lengths)
    if spans is None:
        return None
    n = len(spans)
    out = alloc((n, *spans.shape), np.float32)
    labels = np.empty(n, np.int64)
    table = np.empty((n, k.NCOLS), np.int64)
    fmt = NO_HEADER_CHECK if header_fmt is None else header_fmt
    shape, flat = spans.shape_array(), out.reshape(n, -1)
    if stores.write(out.nbytes, lambda streaming: widen_datums(
            payload, spans.starts, spans.lengths, shape, flat, labels, table, fmt,
            streaming), wrote=fused_kernel_wrote) >= 0:
        return None
    return out, labels


def tensor_decoder(cfg: JobConfig, **_: object) -> Decoder:
    """lmdbio tensor records."""
    from lmdbio.codecs.tensor import decode_tensor_batch

    return _batch_decoder(cfg, decode_tensor_batch)


def _copied_records_only(lengths: np.ndarray | None) -> None:
    """Layouts whose records are whole groups (TOC, IBP, PCR) are decoded from records
    copied into the slot; the loader never hands them out as spans (``readers.transfer``)."""
    if lengths is not None:
        raise ConfigError(f"readers.transfer: spans applies to "
                          f"{' and '.join(layout_names(spans=True))} records; "
                          "this layout's records must be copied into the ring")


def toc_decoder(cfg: JobConfig, **_: object) -> Decoder:
    """TOC records, one stored mini-batch each."""
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


def ibp_decoder(cfg: JobConfig, **_: object) -> Decoder:
    """IBP records, a group of rows each, with the model of the data set's sidecar."""
    from lmdbio.codecs.ibp.format import decode_record, load_model

    model = load_model(cfg.dataset.path)

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


def dataset_meta(cfg: JobConfig) -> Mapping[str, Any]:
    """The ``lmdbio.json`` sidecar of the job's data set (empty where there is none),
    read-only. Opening a loader asks for it several times (crop and shape checks, items per
    record, the PCR decoder): the file is read once and kept while its inode, modification
    time and size stay the same, so every rank stats it instead of reading it again."""
    from lmdbio.dataset_meta import META_FILE, dataset_dir

    path = getattr(getattr(cfg, "dataset", None), "path", None)
    if not path:
        return _NO_META
    try:
        st = (dataset_dir(path) / META_FILE).stat()
    except FileNotFoundError:
        return _NO_META
    return _sidecar(str(path), (st.st_ino, st.st_mtime_ns, st.st_size))


_NO_META: Mapping[str, Any] = MappingProxyType({})


@functools.lru_cache(maxsize=8)
def _sidecar(path: str, stamp: tuple[int, int, int]) -> Mapping[str, Any]:
    """The sidecar of ``path`` as it was at ``stamp`` (inode, mtime, size)."""
    from lmdbio.dataset_meta import read_dataset_meta

    return MappingProxyType(read_dataset_meta(path))


def items_per_record(cfg: JobConfig) -> int:
    """How many images (or rows) one record of the job's data set holds: a PCR group, the
    rows of an IBP record or of a TOC mini-batch (from the ``lmdbio.json`` sidecar); 1 for
    the layouts of one image or row per record, and where the sidecar does not say."""
    layout = LAYOUTS.get(cfg.dataset.layout)
    field = layout.items_field if layout is not None else None  # the sidecar's field
    if field is None:
        return 1
    value = dataset_meta(cfg).get(field)
    return value if isinstance(value, int) and value >= 1 else 1


def records_per_batch(cfg: JobConfig, items: int, consumers: int) -> tuple[int, str | None]:
    """``batch.size`` counts images (rows) for every layout: the records each of the
    ``consumers`` worker ranks takes per batch to get ``items`` images, and a warning where
    ``items`` is not a whole number of records (rounded down). Raises
    :class:`~lmdbio.errors.ConfigError` where one record holds more than ``items``, and for
    TOC (one stored mini-batch per worker and batch) where it does not hold exactly
    ``items``; and, from the data set's sidecar, a crop larger than its smallest image
    (:func:`check_crop_size`). Called by the loader when it opens, before anything is
    made."""
    check_crop_size(cfg)  # (here: before the job makes its ring)
    per = items_per_record(cfg)
    if per == 1:
        return items, None
    spec = get_layout(cfg.dataset.layout)
    what = (spec.items_note or "each record holds {per} items").format(per=per)
    unit = "images" if spec.image else "rows"
    if (spec.batch_per_record and items != per) or items < per:
        need = per * consumers
        exact = "exactly" if spec.batch_per_record else "a multiple of"
        raise setting_error(cfg.origin, "batch.size", f"{cfg.batch.size} counts {unit}: "
                            f"{items} per worker rank ({consumers} consuming ranks), but "
                            f"{what}; set batch.size to {exact} {need} ({per} {unit} x "
                            f"{consumers} ranks)")
    records = items // per
    note = None
    if records * per != items:
        note = (f"batch.size {cfg.batch.size} counts {unit}; {what}, so each of the "
                f"{consumers} consuming ranks takes {records} records = {records * per} "
                f"{unit} per batch (the global batch is {records * per * consumers} {unit})")
    return records, note


def pcr_decoder(cfg: JobConfig, *, scan_groups: int | None = None, **_: object) -> Decoder:
    """PCR records, a group of images each, read to ``scan_groups`` scan groups (None:
    the job's ``dataset.scan_groups``; every group where that is null too)."""
    from lmdbio.codecs.pcr import decode_pcr_value
    k = scan_groups if scan_groups is not None else cfg.dataset.scan_groups
    k = 1 << 30 if k is None else k  # None: every scan group
    meta = dataset_meta(cfg)
    #: convert --color / --gray: every image decoded with 3 channels / 1 (Caffe's is_color)
    mode = meta.get("decode_mode") if meta.get("decode_mode") in ("RGB", "L") else None
    crop, mean_file = _image_rules(cfg)

    def decode(payload: Any, offsets: np.ndarray, keys: KeySource,
               lengths: np.ndarray | None = None) -> Decoded:
        _copied_records_only(lengths)
        images: list[np.ndarray] = []
        tensors: list[np.ndarray] = []
        labels: list[int] = []
        names: list[tuple[int, bytes]] = []  # (record, image key) of every image
        for i in range(offsets.shape[0] - 1):  # one record = a group of images
            imgs, labs, ikeys = decode_pcr_value(payload[offsets[i]:offsets[i + 1]], k,
                                                 mode=mode)
            if isinstance(imgs, np.ndarray):  # a byte-plane tensor group (N, *item)
                tensors.append(imgs)
            else:
                images.extend(imgs)
                names.extend((i, ik) for ik in ikeys)
            labels.extend(int(x) for x in labs)
        lab = np.asarray(labels, np.int64)
        valid = np.ones(lab.shape[0], bool)
        if tensors:
            if images:
                raise RecordError(key_of(keys, 0), "PCR records of images and of tensors mixed")
            return np.concatenate(tensors), lab, valid, []
        chw = [im[None] if im.ndim == 2 else im.transpose(2, 0, 1) for im in images]
        if not chw:
            return np.empty((0, 0, 0, 0), np.uint8), lab, valid, []
        if all(x.shape == chw[0].shape for x in chw):
            return np.stack(chw), lab, valid, []  # (N, C, H, W), C = 1 grey, 3 RGB

        def name(j: int) -> str:
            return f"image {names[j][1]!r}"

        shapes = np.array([x.shape for x in chw], np.int64)
        refused = _size_rule(shapes, np.arange(len(chw)), crop, mean_file, name,
                             "convert with --color (every image decoded in colour, as "
                             "Caffe's is_color) or --gray")
        if refused is not None:
            j, why = refused
            raise RecordError(names[j][1], f"bad PCR image (record {key_of(keys, names[j][0])!r})"
                                           f": {why}")
        return RaggedImages.from_list(chw, np.uint8), lab, valid, []

    return decode


def make_decoder(cfg: JobConfig, scan_groups: int | None = None, *, float32: bool = False,
                 alloc: Allocator = np.empty) -> Decoder:
    """The decoder for ``cfg.dataset.layout`` (its factory named in
    :data:`lmdbio.layouts.LAYOUTS`).

    ``scan_groups``: PCR records read to this many scan groups (None: the job's
    ``dataset.scan_groups``). ``float32``: Caffe Datum batches may come out as float32
    directly (for an identity transform, which would only convert them): one pass instead
    of decode + convert; its output array comes from ``alloc(shape, dtype)``.
    """
    layout = cfg.dataset.layout
    spec = LAYOUTS.get(layout)
    factory = spec.decoder_factory() if spec is not None else None
    if factory is None:
        raise ConfigError(f"dataset.layout: the loader has no decoder for {layout!r}")
    decoder: Decoder = factory(cfg, scan_groups=scan_groups, float32=float32, alloc=alloc)
    return decoder
