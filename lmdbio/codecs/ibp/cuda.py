"""Host side of the CUDA decoder (``lmdbio/codecs/ibp/ibp_kernel.cu``), through cupy.

The compressed data section is copied to the device (only the compressed bytes cross PCIe;
already there when :func:`lmdbio.codecs.ibp.device.decompress_pinned` sent the frame through
a pinned ring),
row offsets are the prefix sums of the condensed lengths (or ``i * stride`` in place), and
``ibp_decompress_u32``/``_u64`` decode with one warp per row. Structural checks (lengths,
cluster ids) were done when the frame was parsed; per-row content errors come back from the
kernel as a code and a row and are raised as :class:`~lmdbio.errors.CodecError`.

This path needs a CUDA device; on machines without one it is never called (tests skip it).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import numpy as np

from lmdbio.codecs.ibp.model import IBPModel
from lmdbio.codecs.ibp.packed import IBPPacked, raise_decode_error

KERNEL_FILE = "ibp_kernel.cu"
THREADS_PER_BLOCK = 128  # 4 warps, as the kernel's shared ring is sized
WARPS_PER_BLOCK = THREADS_PER_BLOCK // 32


def kernel_source() -> str:
    """The CUDA source shipped as package data."""
    return resources.files("lmdbio.codecs.ibp").joinpath(KERNEL_FILE).read_text()


@functools.cache
def _module() -> Any:
    import cupy

    return cupy.RawModule(code=kernel_source(), options=("--std=c++14",))


@functools.lru_cache(maxsize=64)
def _device_tables(model_id: bytes, masks: bytes, bitvals: bytes, dtype: str,
                   shape: tuple[int, int]) -> tuple[Any, Any]:
    import cupy

    m = cupy.asarray(np.frombuffer(masks, dtype).reshape(shape))
    b = cupy.asarray(np.frombuffer(bitvals, dtype).reshape(shape))
    return m, b


def decode_words_cuda(model: IBPModel, packed: IBPPacked, cp: Any) -> Any:
    """(N, n) chunk words of ``packed`` decoded on the current CUDA device."""
    n = model.nchunks
    nrows = packed.nrows
    out = cp.empty((nrows, n), dtype=model.words_dtype)
    if nrows == 0:
        return out
    wd = model.words_dtype
    masks, bitvals = _device_tables(model.model_id, model.masks.tobytes(),
                                    model.bitvals.tobytes(), wd.str, model.masks.shape)
    # a device array already where the frame came through a pinned ring (ibp.device)
    src = packed.data if not isinstance(packed.data, np.ndarray) \
        else cp.asarray(np.ascontiguousarray(packed.data))
    condensed = packed.layout == "condensed"
    if condensed:
        lengths = cp.asarray(packed.lengths).astype(cp.int32)
        row_off = (cp.cumsum(lengths, dtype=cp.int64) - lengths) * model.chunk_bytes
        bitmask = cp.zeros(1, cp.uint8)
    else:
        lengths = cp.zeros(1, cp.int32)
        row_off = cp.arange(nrows, dtype=cp.int64) * model.padded_bytes
        bitmask = cp.asarray(packed.bitmask)
    clustered = packed.cluster_ids is not None
    cluster = (cp.asarray(packed.cluster_ids).astype(cp.int32) if clustered
               else cp.zeros(1, cp.int32))
    error = cp.zeros(2, cp.int32)
    name = "ibp_decompress_u32" if model.chunk_bytes == 4 else "ibp_decompress_u64"
    kernel = _module().get_function(name)
    blocks = int(min(-(-nrows // WARPS_PER_BLOCK), 1 << 20))
    kernel((blocks,), (THREADS_PER_BLOCK,),
           (src, np.int64(src.nbytes), row_off, lengths, bitmask, cluster,
            np.int32(condensed), np.int32(clustered), masks, bitvals, np.int64(nrows),
            np.int32(n), out, error))
    code, row = (int(v) for v in error.get())
    if code:
        raise_decode_error(code, row)
    return out
