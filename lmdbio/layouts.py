"""The layouts: how the values of an LMDB encode records, one registry entry each.

A layout is the name a job gives as ``dataset.layout`` and ``lmdbio convert --layout``.
Its entry says what the records are (capabilities the job's rules and the loader read),
which function builds the loader's decoder and which module writes it. Everything that
needs the list of layouts (the configuration's allowed values and its generated reference,
``lmdbio convert``, the loader) reads :data:`LAYOUTS`; a new layout is one entry here.

Decoders and converters are named ``"module:function"`` and ``"module"`` and imported on
first use, so that importing this module (the job configuration does) imports nothing
else.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from lmdbio.codecs.registry import load_named
from lmdbio.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from loaders.decode import Decoder

__all__ = ["LAYOUTS", "Layout", "get_layout", "layout_names"]


@dataclass(frozen=True)
class Layout:
    """One layout: its name, what its records hold, its decoder and its converter."""

    #: the registered name (``dataset.layout``, ``lmdbio convert --layout``)
    name: str
    #: one line for the configuration reference (``docs/configuration.md``)
    summary: str
    #: a few words (``lmdbio convert --help``)
    title: str
    #: converter: the module of :mod:`lmdbio.convert` that writes it (``add_arguments``,
    #: ``convert``)
    converter: str
    #: the loader's decoder factory, ``"module:function"`` (see
    #: :func:`loaders.decode.make_decoder`); None: the loader does not read this layout
    decoder: str | None = None
    #: records are images (C, H, W): the loader applies Caffe's transform (crop, mirror,
    #: mean, scale: ``transform``) to their batches; the job refuses it for other layouts
    image: bool = False
    #: an identity transform still widens the images to float32, as Caffe's
    #: ``DataTransformer`` does; otherwise (False) it is skipped, and batches keep the
    #: records' stored dtype unless the transform changes their values
    widens: bool = False
    #: CPU workers may go from the records' bytes to the transformed float32 batch in one
    #: compiled pass (:meth:`loaders.assemble.BatchAssembler.fused_batch`): Caffe Datums
    fused_datum: bool = False
    #: the loader's decoder gives one output row per record, in record order, so the
    #: records of several batches may be decoded in one call
    row_per_record: bool = False
    #: workers can decode the records straight from the database mapping, as stored
    #: (``readers.transfer: spans``, without a batch codec)
    spans: bool = False
    #: read at a lower fidelity by reading less (``dataset.scan_groups``)
    progressive: bool = False
    #: a record holds several items (images, rows): the ``lmdbio.json`` field that says
    #: how many (``batch.size`` counts items); None: one item per record
    items_field: str | None = None
    #: what one record holds, with ``{per}`` for the count (messages about ``batch.size``)
    items_note: str | None = None
    #: one record is one stored mini-batch: each worker rank takes exactly one per batch
    batch_per_record: bool = False

    def decoder_factory(self) -> Callable[..., Decoder] | None:
        """The loader's decoder factory (imported now), or None where there is none."""
        if self.decoder is None:
            return None
        factory: Callable[..., Decoder] = load_named(self.decoder)
        return factory

    def converter_module(self) -> ModuleType:
        """The module that writes this layout (imported now)."""
        return importlib.import_module(self.converter)


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout(
            "caffe-datum",
            summary="serialized `caffe.Datum` messages, as written by Caffe's "
            "`convert_imageset` or `lmdbio convert --layout caffe-datum`",
            title="Caffe Datum records",
            converter="lmdbio.convert.datum",
            decoder="loaders.decode:caffe_datum_decoder",
            image=True, widens=True, fused_datum=True, row_per_record=True, spans=True,
        ),
        Layout(
            "tensor",
            summary="lmdbio tensor records (`LTNS` header + raw C-order array)",
            title="lmdbio tensor records",
            converter="lmdbio.convert.tensor",
            decoder="loaders.decode:tensor_decoder",
            image=True, row_per_record=True, spans=True,
        ),
        Layout(
            "toc",
            summary="tuple-oriented compressed mini-batches of sparse rows",
            title="TOC-compressed mini-batches",
            converter="lmdbio.convert.toc",
            decoder="loaders.decode:toc_decoder",
            items_field="batch_size",
            items_note="each TOC record is a stored mini-batch of {per} rows (convert "
            "--batch-size)",
            batch_per_record=True,
        ),
        Layout(
            "ibp",
            summary="invariant-bit-packed rows",
            title="IBP-compressed rows",
            converter="lmdbio.convert.ibp",
            decoder="loaders.decode:ibp_decoder",
            items_field="rows_per_record",
            items_note="each IBP record holds {per} rows (convert --rows-per-record)",
        ),
        Layout(
            "pcr",
            summary="progressive compressed records (groups of progressive-JPEG scans)",
            title="Progressive Compressed Records",
            converter="lmdbio.convert.pcr",
            decoder="loaders.decode:pcr_decoder",
            image=True, widens=True, progressive=True,
            items_field="group_size",
            items_note="each PCR record holds a group of {per} images (convert --group-size)",
        ),
        Layout(
            "btable",
            summary="BTables sparse labelled binary rows",
            title="sparse rows of a BTable file",
            converter="lmdbio.convert.btable",
        ),
    )
}


def get_layout(name: str) -> Layout:
    """The layout registered as ``name``; a :class:`~lmdbio.errors.ConfigError` naming the
    registered ones otherwise."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigError(f"dataset.layout: unknown layout {name!r}; known: "
                          f"{', '.join(LAYOUTS)}") from None


def layout_names(**capabilities: bool) -> tuple[str, ...]:
    """The names of the layouts with these capabilities, in registry order:
    ``layout_names(image=True)`` -> ``("caffe-datum", "tensor", "pcr")``."""
    for key in capabilities:
        if key not in Layout.__dataclass_fields__:
            raise TypeError(f"layout_names: Layout has no field {key!r}")
    return tuple(name for name, layout in LAYOUTS.items()
                 if all(getattr(layout, k) == v for k, v in capabilities.items()))
