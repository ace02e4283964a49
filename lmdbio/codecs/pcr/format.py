"""Progressive Compressed Records (PCR): read a record at the fidelity chosen at read time.

Images are stored as progressive JPEGs cut at their scan boundaries. One LMDB value holds a
group of images: a header (labels, keys, per-image per-scan byte lengths), then scan group 1
of every image, then scan group 2 of every image, and so on. Reading fidelity ``k`` means
reading the value's first :func:`pcr_prefix_bytes` ``(value, k)`` bytes: one sequential read
that is shorter for lower fidelity; the header alone says how long. ``k`` may change between
epochs: nothing is re-encoded.

Value layout (all little-endian), shared by JPEG groups (kind 1) and the byte-plane tensors of
:mod:`lmdbio.codecs.pcr.progressive_tensor` (kind 2)::

    off 0    4 bytes  magic b"LPCR"
    off 4    uint8    kind (1 = JPEG images, 2 = byte-plane tensor)
    off 5    uint8    layout version (1)
    off 6    uint16   G = number of scan groups
    off 8    uint32   N = number of items (images)
    off 12   uint32   H = header bytes (group 1 starts at H)
    off 16   uint64   group_end[G]: offset in the value where group g (1-based) ends
                      -> pcr_prefix_bytes(value, k) = group_end[min(k, G) - 1]
    kind 1, at 16 + 8G:
             int64    labels[N]
             uint32   piece_len[N][G]  bytes of image i in group g (0 once image i has no
                      more scans: a greyscale JPEG has 6 scans, a colour one 10)
             uint32   key_len[N], then the keys back to back
             zero padding up to H (a multiple of 8)
    group g (g = 1..G) = piece g of image 0, piece g of image 1, ..., piece g of image N-1

Piece 1 of an image is its bytes from SOI through the end of its first scan (headers, tables,
scan 1), piece s its bytes from there to the end of scan s (including any tables in between),
the last piece runs to the EOI marker. Image i at fidelity k = pieces 1..k + FF D9: a valid
progressive JPEG that decodes to a coarser picture; at k >= its scan count it is the
transcoded file itself, byte for byte. The bytes of image i at fidelity k are a prefix of its
bytes at fidelity k + 1.

Conversion to progressive JPEG: a JPEG source is transcoded losslessly in the DCT domain
(the same quantised coefficients, re-entropy-coded as progressive scans: the pixels decode
identically). Two tools are supported:

* ``jpegtran`` from libjpeg-turbo (Debian package ``libjpeg-turbo-progs``): the tool the PCR
  authors used; libjpeg's standard progression script (10 scans for colour, 6 for grey).
* ``mozjpeg`` via the PyPI wheel ``mozjpeg-lossless-optimization`` (bundles MozJPEG): also
  lossless, in-process, but with MozJPEG's own scan script (10 colour scans with another
  split of the coefficients, so its group sizes differ from the paper's).

``auto`` picks ``jpegtran`` when it is on PATH, else ``mozjpeg``. Other formats (PNG, raw
pixels) are encoded once with Pillow at ``quality`` as progressive JPEG (libjpeg's standard
script, the same scan structure as ``jpegtran``). APPn/COM metadata (EXIF, ICC) is not kept.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from lmdbio.errors import CodecError
from lmdbio.kernel_cache import kernel_module

MAGIC = b"LPCR"
LAYOUT_VERSION = 1
KIND_JPEG = 1
KIND_TENSOR = 2
#: the fixed part of every value's header (offsets 0-15): magic, kind, layout version,
#: G scan groups (uint16), N items, H header bytes (uint32 each); the group table follows
FIXED_HEAD = struct.Struct("<4sBBHII")
FIXED = FIXED_HEAD.size  # bytes of the fixed part of the header (16)
#: the group count G alone, at its place in :data:`FIXED_HEAD` (read per record by the
#: reader's value prefix: not the whole head into a named tuple)
_GROUPS = struct.Struct("<H")
_GROUPS_AT = struct.calcsize("<4sBB")
#: kind 2, before the labels: the dtype string (NUL-padded), ndim, reserved (0); then
#: ndim x uint64 shape
TENSOR_HEAD = struct.Struct("<8sII")
MAX_SCANS = 256
EOI = b"\xff\xd9"

_J_TEXT = {
    1: "does not start with an SOI marker (FF D8)",
    2: "expected a marker (FF xx)",
    3: "a segment or scan runs past the end of the data",
    4: "segment length below 2",
    5: f"more than {MAX_SCANS} scans",
    6: "data ends without an EOI marker (FF D9)",
    7: "EOI before any scan",
}


def _pil_image() -> ModuleType:
    """Pillow's ``PIL.Image``, imported on first use (Pillow is optional: the ``images``
    extra)."""
    from PIL import Image

    return Image


# ------------------------------------------------------------------------ JPEG scan split
@dataclass(frozen=True)
class JpegScans:
    """Where the scans of a JPEG file end.

    ``bounds[s]`` (s = 0..n-1) is the end of piece s + 1: ``bounds[:-1]`` are the scan ends
    (offset of the marker after each scan's entropy-coded data), ``bounds[-1]`` the offset of
    the EOI marker. ``frame`` is the SOF marker code (0xC2 = progressive Huffman).
    """

    bounds: np.ndarray
    frame: int

    @property
    def n_scans(self) -> int:
        return int(self.bounds.shape[0])

    @property
    def progressive(self) -> bool:
        return self.frame in (0xC2, 0xC6, 0xCA, 0xCE)


def jpeg_scans(data: bytes | memoryview | np.ndarray) -> JpegScans:
    """Parse the marker structure of a JPEG (SOS segments, entropy-coded data with FF 00
    stuffing and RST markers) and return the piece boundaries. Raises CodecError."""
    buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    ends = np.empty(MAX_SCANS, np.int64)
    info = np.zeros(2, np.int64)
    st, ns, off = kernel_module("lmdbio.codecs.pcr").jpeg_scans(buf, ends, info)
    if st != 0:
        raise CodecError(f"JPEG ({buf.shape[0]} bytes), byte offset {off}: {_J_TEXT[st]}")
    bounds = ends[:ns].copy()
    bounds[-1] = info[1]  # the last piece runs to the EOI marker
    return JpegScans(bounds, int(info[0]))


def jpeg_prefix(data: bytes | memoryview, k: int, scans: JpegScans | None = None) -> bytes:
    """The JPEG made of the first ``k`` scans of ``data`` plus EOI (for tests and tools)."""
    scans = scans or jpeg_scans(data)
    k = max(1, min(k, scans.n_scans))
    return bytes(memoryview(data)[:int(scans.bounds[k - 1])]) + EOI


# ----------------------------------------------------------------------- transcoding
def is_jpeg(data: bytes | memoryview) -> bool:
    return bytes(data[:3]) == b"\xff\xd8\xff"


def available_tools() -> list[str]:
    """Lossless JPEG transcoders usable here, preferred first."""
    tools = []
    if shutil.which("jpegtran"):
        tools.append("jpegtran")
    try:
        import mozjpeg_lossless_optimization  # noqa: F401

        tools.append("mozjpeg")
    except ImportError:
        pass
    return tools


def resolve_tool(tool: str = "auto") -> str:
    """The transcoder to use for ``tool`` (``auto``, ``jpegtran`` or ``mozjpeg``)."""
    tools = available_tools()
    if tool == "auto":
        if not tools:
            raise CodecError(
                "no lossless JPEG transcoder: install Debian's libjpeg-turbo-progs (jpegtran) "
                "or `pip install mozjpeg-lossless-optimization`")
        return tools[0]
    if tool not in ("jpegtran", "mozjpeg"):
        raise CodecError(f"unknown JPEG tool {tool!r} (auto, jpegtran or mozjpeg)")
    if tool not in tools:
        raise CodecError(f"JPEG tool {tool!r} is not installed here (available: {tools})")
    return tool


def transcode_progressive(jpeg: bytes, tool: str = "auto") -> bytes:
    """Losslessly transcode a JPEG to progressive JPEG in the DCT domain."""
    tool = resolve_tool(tool)
    if tool == "jpegtran":
        proc = subprocess.run(["jpegtran", "-copy", "none", "-optimize", "-progressive"],
                              input=bytes(jpeg), capture_output=True, check=False)
        if proc.returncode != 0 or not proc.stdout:
            raise CodecError("jpegtran failed: " + proc.stderr.decode(errors="replace").strip())
        return proc.stdout
    import mozjpeg_lossless_optimization as moz

    try:
        return moz.optimize(bytes(jpeg))
    except Exception as exc:  # the wrapper raises ValueError/MemoryError on bad input
        raise CodecError(f"mozjpeg transcode failed: {exc}") from exc


def encode_progressive(image: Any, quality: int = 90) -> bytes:
    """Encode pixels (a PIL image or a uint8 array HxW / HxWx3) as progressive JPEG."""
    Image = _pil_image()

    im = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
    if im.mode not in ("L", "RGB"):
        im = im.convert("L" if im.mode in ("1", "I", "I;16", "F", "LA") else "RGB")
    out = io.BytesIO()
    im.save(out, format="JPEG", quality=int(quality), progressive=True, optimize=True)
    return out.getvalue()


def to_progressive(data: bytes, quality: int = 90, tool: str = "auto") -> tuple[bytes, bool]:
    """Progressive JPEG for an encoded image: ``(bytes, lossless)``. JPEG sources are
    transcoded losslessly; anything Pillow reads is encoded at ``quality``."""
    if is_jpeg(data):
        return transcode_progressive(data, tool), True
    Image = _pil_image()

    try:
        im = Image.open(io.BytesIO(data))
        im.load()
    except (Image.UnidentifiedImageError, OSError) as exc:
        raise CodecError(f"not an image Pillow can read ({len(data)} bytes): {exc}") from exc
    return encode_progressive(im, quality), False


# ------------------------------------------------------------------------- the record
@dataclass
class PCRHeader:
    """The parsed header of a PCR value."""

    kind: int
    n_groups: int
    n_items: int
    header_bytes: int
    group_end: np.ndarray  # uint64[G]
    labels: np.ndarray  # int64[N]
    keys: list[bytes]
    piece_len: np.ndarray | None = None  # uint32[N, G] (kind 1)
    dtype: np.dtype | None = None  # kind 2
    item_shape: tuple[int, ...] = ()  # kind 2

    def group_start(self) -> np.ndarray:
        """Offset where each group begins."""
        s = np.empty(self.n_groups, np.int64)
        s[0] = self.header_bytes
        s[1:] = self.group_end[:-1].astype(np.int64)
        return s

    def prefix_bytes(self, k: int) -> int:
        return _prefix_from_ends(self.group_end, k)


def _prefix_from_ends(group_end: np.ndarray, k: int) -> int:
    if k < 1:
        raise CodecError(f"scan group k must be >= 1, got {k}")
    return int(group_end[min(k, group_end.shape[0]) - 1])


class FixedHeader(NamedTuple):
    """The fixed part of a PCR value's header, as stored (:data:`FIXED_HEAD`)."""

    magic: bytes
    kind: int
    version: int
    n_groups: int
    n_items: int
    header_bytes: int


def unpack_fixed(buf: Any) -> FixedHeader:
    """The fixed header of the value starting ``buf`` as stored, not checked (what
    ``lmdbio inspect`` looks at; :func:`parse_header` checks it). Raises
    :class:`~lmdbio.errors.CodecError` when ``buf`` is shorter than :data:`FIXED`."""
    return FixedHeader._make(_fixed_fields(buf))


def _fixed_fields(buf: Any) -> tuple[bytes, int, int, int, int, int]:
    """:func:`unpack_fixed` as a plain tuple (the reader's once-a-record path)."""
    if len(buf) < FIXED:
        raise CodecError(f"PCR value: {len(buf)} bytes, the fixed header needs {FIXED}")
    return FIXED_HEAD.unpack_from(buf, 0)


def _fixed(buf: memoryview) -> tuple[int, int, int, int]:
    """``(kind, G, N, H)`` of a value's fixed header, checked: magic, version, kind, G.
    Called once per record by the reader (:func:`pcr_prefix_bytes`): a plain tuple, not
    :func:`unpack_fixed`'s named one."""
    magic, kind, ver, g, n, h = _fixed_fields(buf)
    if magic != MAGIC:
        raise CodecError(f"PCR value: bad magic {magic!r} (expected {MAGIC!r})")
    if ver != LAYOUT_VERSION:
        raise CodecError(f"PCR value: layout version {ver} (this build reads {LAYOUT_VERSION})")
    if kind not in (KIND_JPEG, KIND_TENSOR):
        raise CodecError(f"PCR value: unknown kind {kind}")
    if g < 1:
        raise CodecError("PCR value: zero scan groups")
    return kind, g, n, h


def read_group_prefix_length(value_header: bytes | memoryview | np.ndarray, k: int) -> int:
    """Bytes of a PCR value needed for scan groups 1..k, from its first ``16 + 8 * G`` bytes
    (``G`` = number of groups; 16 + 8 * 255 bytes always suffice). ``k`` above ``G`` means
    the whole value."""
    mv = memoryview(value_header).cast("B")
    _, g, _, h = _fixed(mv)
    need = FIXED + 8 * g
    if len(mv) < need:
        raise CodecError(f"PCR value header: {len(mv)} bytes given, {need} needed for {g} "
                         "group offsets")
    ends = np.frombuffer(mv, "<u8", g, FIXED)
    if (g > 1 and np.any(ends[1:] < ends[:-1])) or int(ends[0]) < h:
        raise CodecError("PCR value header: group offsets are not ascending from the header")
    return _prefix_from_ends(ends, k)


def pcr_prefix_bytes(value: bytes | memoryview | np.ndarray, k: int) -> int:
    """How many leading bytes of ``value`` scan groups 1..k need. Reads only the header's
    fixed part and group table (the first page of a value), never the image data."""
    mv = memoryview(value).cast("B") if not isinstance(value, memoryview) else value
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    if len(mv) < FIXED:
        raise CodecError(f"PCR value: {len(mv)} bytes, the fixed header needs {FIXED}")
    (g,) = _GROUPS.unpack_from(mv, _GROUPS_AT)
    return read_group_prefix_length(mv[:FIXED + 8 * g], k)


def parse_header(value_prefix: bytes | memoryview | np.ndarray) -> PCRHeader:
    """Parse the full header (all metadata) of a PCR value; needs its first ``H`` bytes."""
    mv = memoryview(value_prefix)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    kind, g, n, h = _fixed(mv)
    if len(mv) < h:
        raise CodecError(f"PCR value: {len(mv)} bytes given, its header needs {h}")
    if h % 8 or h < FIXED + 8 * g:
        raise CodecError(f"PCR value: header length {h} is impossible for {g} groups")
    ends = np.frombuffer(mv, "<u8", g, FIXED)
    if int(ends[0]) < h or (g > 1 and np.any(ends[1:] < ends[:-1])):
        raise CodecError("PCR value: group offsets are not ascending from the header")
    p = FIXED + 8 * g
    dtype = None
    shape: tuple[int, ...] = ()
    piece = None
    try:
        if kind == KIND_TENSOR:
            dstr, ndim, _ = TENSOR_HEAD.unpack_from(mv, p)
            p += TENSOR_HEAD.size
            dtype = np.dtype(dstr.rstrip(b"\0 ").decode("ascii"))
            shape = tuple(int(x) for x in np.frombuffer(mv, "<u8", ndim, p))
            p += 8 * ndim
        labels = np.frombuffer(mv, "<i8", n, p).astype(np.int64)
        p += 8 * n
        if kind == KIND_JPEG:
            piece = np.frombuffer(mv, "<u4", n * g, p).reshape(n, g).astype(np.int64)
            p += 4 * n * g
        klen = np.frombuffer(mv, "<u4", n, p).astype(np.int64)
        p += 4 * n
    except (ValueError, TypeError, struct.error) as exc:
        raise CodecError(f"PCR value: header truncated or malformed ({exc})") from None
    koff = np.concatenate(([0], np.cumsum(klen))) + p
    if int(koff[-1]) > h:
        raise CodecError(f"PCR value: keys run past the header end ({int(koff[-1])} > {h})")
    raw = bytes(mv[p:int(koff[-1])])
    keys = [raw[a - p:b - p] for a, b in zip(koff[:-1].tolist(), koff[1:].tolist(), strict=True)]
    hdr = PCRHeader(kind, g, n, h, ends.astype(np.uint64), labels, keys, piece, dtype, shape)
    if kind == KIND_JPEG:
        sizes = np.diff(np.concatenate(([h], ends.astype(np.int64))))
        if not np.array_equal(piece.sum(axis=0), sizes):
            raise CodecError("PCR value: per-image scan lengths do not add up to the group sizes")
    return hdr


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def build_header(kind: int, group_sizes: Sequence[int], labels: np.ndarray, keys: Sequence[bytes],
                 middle: bytes = b"", tail: bytes = b"") -> bytes:
    """Header bytes for a value whose groups have ``group_sizes`` bytes. ``middle`` goes
    before the labels (kind 2: dtype and shape), ``tail`` after them (kind 1: piece lengths)."""
    g = len(group_sizes)
    n = len(keys)
    if g < 1 or g > 65535:
        raise CodecError(f"a PCR value needs 1..65535 groups, got {g}")
    labels = np.asarray(labels, dtype="<i8").reshape(-1)
    if labels.shape[0] != n:
        raise CodecError(f"{labels.shape[0]} labels for {n} keys")
    body = (middle + labels.tobytes() + tail
            + np.array([len(k) for k in keys], "<u4").tobytes() + b"".join(keys))
    h = _pad8(FIXED + 8 * g + len(body))
    ends = h + np.cumsum(np.asarray(group_sizes, dtype=np.int64))
    fixed = FIXED_HEAD.pack(MAGIC, kind, LAYOUT_VERSION, g, n, h)
    out = fixed + ends.astype("<u8").tobytes() + body
    return out + b"\0" * (h - len(out))


def encode_pcr_images(jpegs: Sequence[bytes], labels: Sequence[int] | np.ndarray,
                      keys: Sequence[bytes]) -> bytes:
    """One PCR value from progressive JPEGs (already transcoded), with labels and keys."""
    n = len(jpegs)
    if n == 0 or len(keys) != n:
        raise CodecError(f"a PCR value needs >= 1 image and one key per image ({n} images, "
                         f"{len(keys)} keys)")
    scans = [jpeg_scans(j) for j in jpegs]
    g = max(s.n_scans for s in scans)
    piece = np.zeros((n, g), np.int64)
    for i, s in enumerate(scans):
        b = s.bounds
        piece[i, :b.shape[0]] = np.diff(np.concatenate(([0], b)))
    if piece.max() >= 2**32:
        raise CodecError("an image piece is larger than 4 GiB")
    mvs = [memoryview(j) for j in jpegs]
    parts = []
    for gi in range(g):
        for i, s in enumerate(scans):
            if gi < s.n_scans:
                a = 0 if gi == 0 else int(s.bounds[gi - 1])
                parts.append(mvs[i][a:int(s.bounds[gi])])
    header = build_header(KIND_JPEG, piece.sum(axis=0).tolist(), np.asarray(labels), list(keys),
                          tail=piece.astype("<u4").tobytes())
    return header + b"".join(parts)


def image_bytes(value_prefix: bytes | memoryview | np.ndarray, k: int,
                header: PCRHeader | None = None) -> list[memoryview]:
    """The JPEG of every image of a PCR value at fidelity ``k`` (pieces 1..k + EOI).

    ``value_prefix`` needs at least :func:`pcr_prefix_bytes` ``(value, k)`` bytes.
    """
    buf = value_prefix if isinstance(value_prefix, np.ndarray) else \
        np.frombuffer(value_prefix, np.uint8)
    hdr = header or parse_header(buf)
    if hdr.kind != KIND_JPEG:
        raise CodecError("PCR value holds a tensor, not images")
    kk = max(1, min(int(k), hdr.n_groups))
    need = hdr.prefix_bytes(kk)
    if buf.shape[0] < need:
        raise CodecError(f"PCR value prefix has {buf.shape[0]} bytes; scan groups 1..{kk} need "
                         f"{need}")
    piece = hdr.piece_len
    src = hdr.group_start()[None, :] + np.cumsum(piece, axis=0) - piece
    total = int(piece[:, :kk].sum()) + 2 * hdr.n_items
    out = np.empty(total, np.uint8)
    off = np.empty(hdr.n_items + 1, np.int64)
    st, i, g = kernel_module("lmdbio.codecs.pcr").assemble(buf, src, piece, kk, out, off)
    if st != 0:
        raise CodecError(f"PCR value: piece {g + 1} of image {i} lies outside the value")
    mv = memoryview(out)
    o = off.tolist()
    return [mv[o[i]:o[i + 1]] for i in range(hdr.n_items)]


def decode_jpeg(data: bytes | memoryview, mode: str | None = None, reduce: int = 1) -> np.ndarray:
    """Decode a JPEG with Pillow to a uint8 array (HxW for grey, HxWx3 for colour; CMYK and
    others are converted to RGB). ``reduce`` in 1, 2, 4, 8 decodes at 1/reduce scale via
    libjpeg's DCT scaling (cheap at low fidelity)."""
    Image = _pil_image()

    try:
        im = Image.open(io.BytesIO(data))
        if reduce > 1:
            im.draft(im.mode, (max(1, im.width // reduce), max(1, im.height // reduce)))
        im.load()
    except (OSError, ValueError, SyntaxError) as exc:
        raise CodecError(f"JPEG decode failed ({len(data)} bytes): {exc}") from exc
    want = mode or (im.mode if im.mode in ("L", "RGB") else "RGB")
    if im.mode != want:
        im = im.convert(want)
    return np.asarray(im)


def decode_pcr_value(value_prefix: bytes | memoryview | np.ndarray, k: int, *,
                     mode: str | None = None, reduce: int = 1
                     ) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray, list[bytes]]:
    """Decode a PCR value (or its first :func:`pcr_prefix_bytes` bytes) at fidelity ``k``.

    Returns ``(items, labels int64[N], keys)``. For a JPEG group, ``items`` is a list of uint8
    arrays (each image rebuilt from its first ``k`` scans + EOI and decoded by Pillow); for a
    byte-plane tensor (kind 2), an array ``(N, *item_shape)`` at the precision of ``k`` planes.
    """
    buf = value_prefix if isinstance(value_prefix, np.ndarray) else \
        np.frombuffer(value_prefix, np.uint8)
    hdr = parse_header(buf)
    if hdr.kind == KIND_TENSOR:
        from lmdbio.codecs.pcr import progressive_tensor

        return progressive_tensor.decode_planes_value(buf, k, hdr), hdr.labels, hdr.keys
    images = [decode_jpeg(b, mode, reduce) for b in image_bytes(buf, k, hdr)]
    return images, hdr.labels, hdr.keys
