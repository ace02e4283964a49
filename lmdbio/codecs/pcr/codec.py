"""The numcodecs codecs of Progressive Compressed Records: :class:`PCRCodec` (a group of
images, kind 1) and :class:`ProgressiveTensorCodec` (byte-plane tensors, kind 2), registered
with numcodecs on import when numcodecs is installed (it is optional)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.codecs.numcodecs_base import ConfigEquality, as_input, fill_out, refuse_object_out
from lmdbio.codecs.pcr.format import (
    decode_pcr_value,
    encode_pcr_images,
    encode_progressive,
    parse_header,
)
from lmdbio.codecs.pcr.progressive_tensor import decode_planes_value, encode_planes_value
from lmdbio.errors import CodecError

__all__ = ["PCRCodec", "ProgressiveTensorCodec", "register"]


class PCRCodec(ConfigEquality):
    """numcodecs-style codec of one PCR value of same-sized images.

    ``encode`` takes a uint8 array ``(N, H, W)`` or ``(N, H, W, 3)`` and stores each image as
    a progressive JPEG at ``quality`` (lossy, once); ``decode`` returns the stacked images at
    ``scan_groups`` (``None`` = all) from a value or any prefix holding those groups.
    """

    codec_id = "lmdbio.pcr"

    def __init__(self, scan_groups: int | None = None, quality: int = 90) -> None:
        self.scan_groups = scan_groups
        self.quality = int(quality)

    def encode(self, buf: Any) -> bytes:
        a = as_input(buf, "PCRCodec")
        if a.dtype != np.uint8 or a.ndim not in (3, 4):
            raise CodecError(f"PCRCodec encodes uint8 (N, H, W[, 3]) arrays, got {a.dtype} "
                             f"{a.shape}")
        jpegs = [encode_progressive(x, self.quality) for x in a]
        keys = [b"%d" % i for i in range(a.shape[0])]
        return encode_pcr_images(jpegs, np.zeros(a.shape[0], np.int64), keys)

    def decode(self, buf: Any, out: np.ndarray | None = None) -> np.ndarray:
        refuse_object_out(out, "PCRCodec")
        k = self.scan_groups or 65535
        images, _, _ = decode_pcr_value(np.frombuffer(buf, np.uint8), k)
        stacked = np.stack(images)
        if out is not None:
            out[...] = stacked.reshape(out.shape)
            return out
        return stacked

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "scan_groups": self.scan_groups, "quality": self.quality}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PCRCodec:
        return cls(config.get("scan_groups"), config.get("quality", 90))

    def __repr__(self) -> str:
        return f"PCRCodec(scan_groups={self.scan_groups}, quality={self.quality})"


class ProgressiveTensorCodec(ConfigEquality):
    """numcodecs-style codec: an array (axis 0 = items) <-> a kind-2 PCR value.

    ``decode`` uses ``planes`` planes (``None`` = all), or fewer when ``buf`` is a prefix that
    holds fewer complete planes: a prefix decodes at the precision it carries.
    """

    codec_id = "lmdbio.progressive_tensor"

    def __init__(self, planes: int | None = None, fill: str = "mid") -> None:
        self.planes = planes
        self.fill = fill

    def encode(self, buf: Any) -> bytes:
        a = as_input(buf, "progressive tensor codec")
        return encode_planes_value(a.reshape(1, *a.shape) if a.ndim == 0 else a)

    def decode(self, buf: Any, out: np.ndarray | None = None) -> np.ndarray:
        refuse_object_out(out, "progressive tensor codec")
        b = np.frombuffer(buf, np.uint8)
        hdr = parse_header(b)
        complete = int(np.searchsorted(hdr.group_end.astype(np.int64), b.shape[0], "right"))
        if complete < 1:
            raise CodecError(f"prefix of {b.shape[0]} bytes holds no complete plane")
        k = min(self.planes or hdr.n_groups, complete)
        a = decode_planes_value(b, k, hdr, self.fill)
        if out is not None:
            return fill_out(a, out, "progressive tensor codec")
        return a

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "planes": self.planes, "fill": self.fill}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ProgressiveTensorCodec:
        return cls(config.get("planes"), config.get("fill", "mid"))

    def __repr__(self) -> str:
        return f"ProgressiveTensorCodec(planes={self.planes}, fill={self.fill!r})"


def register() -> None:
    """Register both codecs with numcodecs (nothing when it is not installed)."""
    try:
        from numcodecs.registry import register_codec
    except ImportError:  # numcodecs is optional
        return
    register_codec(PCRCodec)  # type: ignore[arg-type]
    register_codec(ProgressiveTensorCodec)  # type: ignore[arg-type]


register()
