"""lmdbio's codecs in zarr v3 arrays (``zarr>=3.1``, optional).

zarr v3 names a numcodecs codec ``"numcodecs.<id>"`` in an array's metadata and runs it
through its numcodecs bridge (``zarr.codecs.numcodecs``), which knows numcodecs' own codecs
only. Importing this module registers the bridge classes of lmdbio's array codecs with
zarr, so that they can be named at creation and found again when an array is opened:

* :class:`IBP` (``"numcodecs.ibp"``), array-to-bytes: rows along the chunk's first axis;
  ``IBP()`` fits each chunk and stores its model in the frame (nothing but the layout
  in the metadata), ``IBP(model=...)`` carries a fitted model (base64) in the metadata;
* :class:`Toc` (``"numcodecs.lmdbio_toc"``), array-to-bytes: each chunk as a TOC matrix.

``zarr.create_array(store, shape=..., dtype=..., serializer=IBP())``; zarr warns that
numcodecs codecs are outside the zarr v3 specification (other implementations need the
same codec to read the array).
"""

from __future__ import annotations

from zarr.codecs.numcodecs._codecs import _NumcodecsArrayBytesCodec
from zarr.registry import register_codec

import lmdbio.codecs.ibp.codec  # registers "ibp" with numcodecs
import lmdbio.codecs.toc.codec  # noqa: F401  (registers "lmdbio_toc" with numcodecs)

__all__ = ["IBP", "Toc"]


class IBP(_NumcodecsArrayBytesCodec, codec_name="ibp"):
    """:class:`lmdbio.codecs.ibp.IBPCodec` as a zarr v3 array-to-bytes codec."""


class Toc(_NumcodecsArrayBytesCodec, codec_name="lmdbio_toc"):
    """:class:`lmdbio.codecs.toc.codec.TocCodec` as a zarr v3 array-to-bytes codec."""


register_codec("numcodecs.ibp", IBP)
register_codec("numcodecs.lmdbio_toc", Toc)
