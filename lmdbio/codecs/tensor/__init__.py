"""lmdbio's tensor records: the record format (:mod:`.format`), compiled batch decoding
(:mod:`.batch`, kernels in :mod:`.kernels`) and the numcodecs codec (:mod:`.codec`,
registered on import)."""

from __future__ import annotations

from lmdbio.codecs.tensor.batch import TensorBatch, decode_tensor_batch
from lmdbio.codecs.tensor.codec import TensorCodec
from lmdbio.codecs.tensor.format import (
    DTYPE_CODES,
    MAGIC,
    VERSION,
    TensorHeader,
    decode_tensor,
    dtype_code,
    encode_tensor,
    header_size,
    read_tensor_header,
)

__all__ = [
    "DTYPE_CODES",
    "MAGIC",
    "VERSION",
    "TensorBatch",
    "TensorCodec",
    "TensorHeader",
    "decode_tensor",
    "decode_tensor_batch",
    "dtype_code",
    "encode_tensor",
    "header_size",
    "read_tensor_header",
]
