"""Record codecs (Caffe Datum, tensor records, BTable rows, PCR groups) and batch codecs
(IBP, TOC) for storage and transport.

Batch codecs share one small interface compatible with numcodecs' ``Codec``: ``encode(buf)``,
``decode(buf, out=None)``, ``get_config()`` and ``from_config(config)``; decoders that can run
on a GPU take ``xp`` (numpy or cupy).
"""
