"""Batch codecs: the interface they share (:class:`BatchCodec`) and the registry that names
them (``codec.name`` of a job).

A batch codec compresses many rows at once, for storage (an LMDB layout of the same name)
or for transport (between a node's reader and its workers, through the node's ring). Its
interface is numcodecs' ``Codec``, so the same classes also serve zarr and friends; the
record codecs (Caffe Datum, tensor, PCR, sparse rows) follow it too.

Everything that needs the list of batch codecs (the configuration's allowed values and its
generated reference, the loader, the reader) reads :data:`BATCH_CODECS`. A codec a node's
ring carries encoded names its :class:`RingTransport` (:attr:`BatchCodecSpec.ring`): the
reader fits it, shares it with the node's workers and encodes each worker's part of a slot
with it, knowing no codec by name. Codec classes are named ``"module:Class"`` and imported
on first use, so that importing this module (the job configuration does) imports nothing
else.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lmdbio.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from lmdbio.lmdb import Database

__all__ = ["BATCH_CODECS", "BatchCodec", "BatchCodecSpec", "RingCodec", "RingTransport",
           "get_batch_codec"]


@runtime_checkable
class BatchCodec(Protocol):
    """What every codec class provides (numcodecs' ``Codec`` interface)."""

    #: the codec's id in its config (and numcodecs' registry)
    codec_id: str

    def encode(self, buf: Any) -> bytes:
        """The encoded bytes of ``buf`` (an array or buffer)."""
        ...

    def decode(self, buf: Any, out: Any = None) -> Any:
        """The values ``buf`` encodes; copied into ``out`` when given."""
        ...

    def get_config(self) -> dict[str, Any]:
        """A JSON-able config, ``{"id": codec_id, ...options}``."""
        ...

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BatchCodec:
        """The codec :meth:`get_config` describes."""
        ...


@runtime_checkable
class RingCodec(Protocol):
    """A batch codec fitted for one job's node rings: the node's reader encodes each
    worker's part of a slot separately (:meth:`encode_parts`), so that each worker decodes
    only its own (:meth:`decode_part`). A :class:`RingTransport` makes it."""

    def to_bytes(self) -> bytes:
        """What the reader sends its node's workers (:meth:`RingTransport.from_bytes`)."""
        ...

    def slot_bytes(self, rows: int, parts: int, raw_bytes: int) -> int:
        """Payload bytes a slot needs for any ``rows`` rows encoded as ``parts`` parts
        (their worst case, headers included), ``raw_bytes`` being what the rows take
        unencoded."""
        ...

    def encode_parts(self, payload: np.ndarray, offsets: np.ndarray, counts: np.ndarray, *,
                     keys: tuple[np.ndarray, np.ndarray] | None = None,
                     where: str = "the database") -> list[np.ndarray]:
        """One encoded blob per worker part of a gathered batch: the records ``offsets``
        bounds in ``payload``, ``counts`` per part in order. ``keys`` (the batch's key
        bounds and bytes) and ``where`` (the file) name a record the codec refuses."""
        ...

    def decode_part(self, blob: np.ndarray, count: int) -> np.ndarray:
        """One worker part's ``count`` records, back to back, as one uint8 buffer."""
        ...


class RingTransport(Protocol):
    """How a :class:`RingCodec` is made: fitted by a node's reader on the database, rebuilt
    from its bytes on every rank of the node (a class with two class methods will do)."""

    #: how the reader's waits and errors name it ("fitting the IBP transport model")
    @property
    def title(self) -> str: ...

    def fit(self, db: Database, options: dict[str, Any]) -> RingCodec:
        """The codec fitted on ``db``'s records with the job's ``codec`` options; a
        :class:`~lmdbio.errors.ConfigError` when the records do not suit it."""
        ...

    def from_bytes(self, blob: bytes) -> RingCodec:
        """The codec whose :meth:`RingCodec.to_bytes` gave ``blob``."""
        ...


def load_named(name: str) -> Any:
    """The object ``"module:attr"`` names, its module imported now (how every registry of
    lmdbio names what it loads lazily: codecs here, decoders in :mod:`lmdbio.layouts`)."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class BatchCodecSpec:
    """One registered batch codec: its name, what it is for and its class."""

    #: the registered name (``codec.name``)
    name: str
    #: one line for the configuration reference (``docs/configuration.md``)
    summary: str
    #: ``"module:Class"`` implementing :class:`BatchCodec`; None: batches travel as raw
    #: arrays
    codec: str | None
    #: a node's ring can carry batches encoded with it (reader to workers); otherwise it
    #: is a storage format only (read it as ``dataset.layout`` of the same name)
    transport: bool
    #: ``"module:attr"`` of its :class:`RingTransport`: how the ring carries its batches
    #: encoded (a transport codec's; None for ``none``, whose batches travel raw)
    ring: str | None = None

    def __post_init__(self) -> None:
        if self.ring is not None and not self.transport:
            raise ValueError(f"batch codec {self.name!r}: a ring transport for a codec the "
                             "ring does not carry (transport=False)")

    def codec_class(self) -> type[BatchCodec] | None:
        """The codec class (imported now), or None for ``none``."""
        if self.codec is None:
            return None
        cls: type[BatchCodec] = load_named(self.codec)
        return cls

    def ring_transport(self) -> RingTransport | None:
        """How a node's ring carries this codec's batches (imported now), or None where
        they travel raw (``none``) or the ring does not carry it."""
        if self.ring is None:
            return None
        transport: RingTransport = load_named(self.ring)
        return transport


BATCH_CODECS: dict[str, BatchCodecSpec] = {
    spec.name: spec
    for spec in (
        BatchCodecSpec("none", "batches travel as raw arrays", None, transport=True),
        BatchCodecSpec("ibp", "invariant bit packing (lossless; decodable on the GPU)",
                       "lmdbio.codecs.ibp.codec:IBPCodec", transport=True,
                       ring="lmdbio.codecs.ibp.transport:IBPRingCodec"),
        BatchCodecSpec("toc", "tuple-oriented compression (lossless; for sparse rows)",
                       "lmdbio.codecs.toc.codec:TocCodec", transport=False),
    )
}


def get_batch_codec(name: str) -> BatchCodecSpec:
    """The batch codec registered as ``name``; a :class:`~lmdbio.errors.ConfigError`
    naming the registered ones otherwise."""
    try:
        return BATCH_CODECS[name]
    except KeyError:
        raise ConfigError(f"codec.name: unknown batch codec {name!r}; known: "
                          f"{', '.join(BATCH_CODECS)}") from None
