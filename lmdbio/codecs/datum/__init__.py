"""Caffe ``Datum`` records: the message and its encoding (:mod:`.format`), compiled batch
decoding (:mod:`.batch`, kernels in :mod:`.kernels`) and the numcodecs codec
(:mod:`.codec`, registered on import)."""

from __future__ import annotations

from lmdbio.codecs.datum.batch import (
    DatumBatch,
    DatumHeaders,
    decode_datum_batch,
    parse_datum_headers,
)
from lmdbio.codecs.datum.codec import DatumCodec
from lmdbio.codecs.datum.format import (
    ChannelOrder,
    Datum,
    datum_from_array,
    datum_from_image,
    decode_datum,
    decode_image,
    encode_datum,
)

__all__ = [
    "ChannelOrder",
    "Datum",
    "DatumBatch",
    "DatumCodec",
    "DatumHeaders",
    "datum_from_array",
    "datum_from_image",
    "decode_datum",
    "decode_datum_batch",
    "decode_image",
    "encode_datum",
    "parse_datum_headers",
]
