"""IBP -- invariant bit packing (Kamath et al., EuroSys '26), lossless for every bit pattern.

Bits that (almost) every row shares are found once per data set (:func:`fit`, optionally on a
random sample, or :func:`fit_clusters` for one mask per cluster of rows) and removed from each
row; a row whose chunks do not match keeps them raw, and a row that would not shrink is stored
raw. Decoding reinserts the bits: on the CPU with a numba kernel, on a GPU with the CUDA
kernel in ``ibp_kernel.cu`` (in this package), or anywhere with whole-array code on numpy or cupy.

>>> from lmdbio.codecs import ibp
>>> model = ibp.fit(rows, chunk_bytes=4)            # doctest: +SKIP
>>> packed = model.compress(rows, "condensed")      # doctest: +SKIP
>>> same = model.decompress(packed)                 # doctest: +SKIP

Formats: :mod:`lmdbio.codecs.ibp.model` (model bytes), :mod:`lmdbio.codecs.ibp.packed` (rows,
layouts and frames), :mod:`lmdbio.codecs.ibp.format` (an IBP dataset's LMDB records and the
model in its sidecar). Transport between a node's reader and its workers:
:mod:`lmdbio.codecs.ibp.transport` (:func:`compress_into`, :func:`decompress_from`).
Importing this package does not import numba; the kernels compile on first use.
"""

from __future__ import annotations

from lmdbio.codecs.ibp.cluster import cluster_report, fit_clusters, hamming_kmeans
from lmdbio.codecs.ibp.codec import IBPCodec, register
from lmdbio.codecs.ibp.cuda import kernel_source
from lmdbio.codecs.ibp.model import IBPModel, bit_counts, fit, threshold_mask
from lmdbio.codecs.ibp.packed import IBPPacked, max_frame_nbytes
from lmdbio.codecs.ibp.transport import compress_into, decompress_from, max_packed_nbytes

__all__ = [
    "IBPCodec",
    "IBPModel",
    "IBPPacked",
    "bit_counts",
    "cluster_report",
    "compress_into",
    "decompress_from",
    "fit",
    "fit_clusters",
    "hamming_kmeans",
    "kernel_source",
    "max_frame_nbytes",
    "max_packed_nbytes",
    "register",
    "threshold_mask",
]
