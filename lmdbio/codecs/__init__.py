"""Record codecs (Caffe Datum, tensor records, BTable rows, PCR groups) and batch codecs
(IBP, TOC) for storage and transport.

One package per data representation: :mod:`.datum`, :mod:`.tensor`, :mod:`.pcr`,
:mod:`.btable`, :mod:`.ibp` and :mod:`.toc`. Each holds its format (layout, dtypes,
constants), its compiled kernels in ``kernels.py`` (imported on first use, so importing a
package does not import numba) and its numcodecs codec in ``codec.py``. Shared here:
:mod:`.numcodecs_base` (what every codec class shares), :mod:`.record_batch` (buffer and
key helpers of the batch record decoders), :mod:`.protobuf` (the protobuf wire primitives of
Caffe's messages), :mod:`.binaryproto` (Caffe mean files, for every image layout),
:mod:`.zarr3` (IBP and TOC as zarr v3 codecs) and :mod:`.registry` (the batch codecs a job
names).

Batch codecs share one small interface compatible with numcodecs' ``Codec``: ``encode(buf)``,
``decode(buf, out=None)``, ``get_config()`` and ``from_config(config)``; decoders that can run
on a GPU take ``xp`` (numpy or cupy).
"""
