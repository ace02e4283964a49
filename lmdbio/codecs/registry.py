"""Batch codecs: the interface they share (:class:`BatchCodec`) and the registry that names
them (``codec.name`` of a job).

A batch codec compresses many rows at once, for storage (an LMDB layout of the same name)
or for transport (between a node's reader and its workers, through the node's ring). Its
interface is numcodecs' ``Codec``, so the same classes also serve zarr and friends; the
record codecs (Caffe Datum, tensor, PCR, sparse rows) follow it too.

Everything that needs the list of batch codecs (the configuration's allowed values and its
generated reference, the loader) reads :data:`BATCH_CODECS`. Codec classes are named
``"module:Class"`` and imported on first use, so that importing this module (the job
configuration does) imports nothing else.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lmdbio.errors import ConfigError

__all__ = ["BATCH_CODECS", "BatchCodec", "BatchCodecSpec", "get_batch_codec"]


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

    def codec_class(self) -> type[BatchCodec] | None:
        """The codec class (imported now), or None for ``none``."""
        if self.codec is None:
            return None
        module, _, attr = self.codec.partition(":")
        cls: type[BatchCodec] = getattr(importlib.import_module(module), attr)
        return cls


BATCH_CODECS: dict[str, BatchCodecSpec] = {
    spec.name: spec
    for spec in (
        BatchCodecSpec("none", "batches travel as raw arrays", None, transport=True),
        BatchCodecSpec("ibp", "invariant bit packing (lossless; decodable on the GPU)",
                       "lmdbio.codecs.ibp.codec:IBPCodec", transport=True),
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
