"""``lmdbio bench decode PATH``: batch record decoding and the DataTransformer, against
per-record decoding in the same run.

The records of ``PATH`` (a ``caffe-datum`` or ``tensor`` LMDB, told apart by the first value)
are gathered once into one buffer with the page engine; then, per batch of ``--batch-size``:

* ``batch``: :func:`~lmdbio.codecs.datum.decode_datum_batch` /
  :func:`~lmdbio.codecs.tensor.decode_tensor_batch` (compiled parse and copy), allocating
  each output; ``batch_into_slots``: the same into reused output arrays (``out=``), as a
  loader does with its ring of batch slots;
* ``per_record`` (baseline): decode each record alone with the same library's one-record
  decoder (``decode_datum(v).to_array()`` / ``decode_tensor(v)``) and ``np.stack`` them, the
  way a loader that decodes record by record in Python works;
* ``copy_bound``: a plain numpy copy of the same number of pixel bytes, the speed limit of
  any decoder that must copy the pixels once.

``--transform`` also times :class:`loaders.transform.DataTransformer` (``--crop``, mirror,
per-channel means) on the decoded batches against a per-image numpy loop (crop slice, flip,
subtract, scale image by image). Reported: seconds, records/s and the ratios (> 1 means the
batch path is faster), the best of ``--repeat`` runs. ``--tile N`` repeats the records until
there are N (for small real files; the output says so).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from bench.common import best_seconds, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="LMDB directory of caffe-datum or tensor records")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tile", type=int, default=0, metavar="N",
                        help="repeat the records until there are N (0: as stored)")
    parser.add_argument("--transform", action="store_true", help="also time the transformer")
    parser.add_argument("--crop", type=int, default=0, help="transform crop size (0: none)")
    parser.add_argument("--json", metavar="OUT", default=None, help="write the result here")


def _gather(path: str, tile: int) -> tuple[np.ndarray, np.ndarray, int]:
    import lmdbio
    from lmdbio.io.gather import gather

    with lmdbio.open(path, pin_snapshot=False) as db:
        n = len(db)
        buf, offsets = gather(db, range(n))
    if tile and tile > n:
        reps = -(-tile // n)
        lens = np.diff(offsets)
        buf = np.tile(buf, reps)
        lens = np.tile(lens, reps)[:tile]
        offsets = np.concatenate([[0], np.cumsum(lens)])
        buf = buf[: offsets[-1]]
    return buf, offsets.astype(np.int64), n


def run(path: str, batch: int = 64, repeat: int = 3, tile: int = 0, transform: bool = False,
        crop: int = 0) -> dict[str, Any]:
    """The benchmark as a JSON-able dictionary."""
    from lmdbio.codecs import datum as dm
    from lmdbio.codecs import tensor as tn

    buf, offsets, stored = _gather(path, tile)
    n = offsets.shape[0] - 1
    is_tensor = bytes(buf[:4]) == tn.MAGIC
    spans = [(s, min(s + batch, n)) for s in range(0, n, batch)]
    mv = memoryview(buf)

    if is_tensor:
        def batched():
            return [tn.decode_tensor_batch(buf, offsets[a:b + 1]).data for a, b in spans]

        def per_record():
            return [np.stack([tn.decode_tensor(mv[offsets[i]:offsets[i + 1]])[0]
                              for i in range(a, b)]) for a, b in spans]
    else:
        def batched():
            return [dm.decode_datum_batch(buf, offsets[a:b + 1]).data for a, b in spans]

        def per_record():
            return [np.stack([dm.decode_datum(mv[offsets[i]:offsets[i + 1]]).to_array()
                              for i in range(a, b)]) for a, b in spans]

    got = batched()
    ref = per_record()
    if not all(np.array_equal(x, y) for x, y in zip(got, ref, strict=True)):
        raise RuntimeError("batch and per-record decoding disagree")
    shape = got[0].shape[1:]
    pixel_bytes = int(sum(x.nbytes for x in got))
    src = np.random.default_rng(0).integers(0, 256, pixel_bytes, dtype=np.uint8)
    dst = np.empty_like(src)

    outs = [np.empty_like(x) for x in got]  # reused output slots, as a loader's ring has

    if is_tensor:
        def into_slots():
            for (a, b), o in zip(spans, outs, strict=True):
                tn.decode_tensor_batch(buf, offsets[a:b + 1], out=o)
    else:
        def into_slots():
            for (a, b), o in zip(spans, outs, strict=True):
                dm.decode_datum_batch(buf, offsets[a:b + 1], out=o)

    t_slots = best_seconds(into_slots, repeat)
    t_batch = best_seconds(batched, repeat)
    t_rec = best_seconds(per_record, repeat)
    t_copy = best_seconds(lambda: np.copyto(dst, src), repeat)
    result: dict[str, Any] = {
        "benchmark": "decode",
        "path": path,
        "layout": "tensor" if is_tensor else "caffe-datum",
        "records_stored": stored,
        "records": n,
        "tiled": bool(tile and tile > stored),
        "record_shape": list(shape),
        "dtype": str(got[0].dtype),
        "batch_size": batch,
        "repeat": repeat,
        "batch": {"seconds": t_batch, "records_per_second": n / t_batch,
                  "pixel_bytes_per_second": pixel_bytes / t_batch},
        "batch_into_slots": {"seconds": t_slots, "records_per_second": n / t_slots,
                             "pixel_bytes_per_second": pixel_bytes / t_slots},
        "per_record": {"seconds": t_rec, "records_per_second": n / t_rec},
        "copy_bound": {"seconds": t_copy, "bytes_per_second": pixel_bytes / t_copy},
        "ratio_batch_over_per_record": t_rec / t_batch,
        "ratio_slots_over_per_record": t_rec / t_slots,
        "fraction_of_copy_bound": t_copy / t_slots,
    }
    if transform and len(shape) == 3:
        result["transform"] = _bench_transform(got, crop, repeat)
    return result


def _bench_transform(batches: list[np.ndarray], crop: int, repeat: int) -> dict[str, Any]:
    from loaders.transform import DataTransformer, transform_rng

    c = batches[0].shape[1]
    means = tuple(float(x) for x in np.linspace(100, 125, c))
    t = DataTransformer(scale=0.017, mean_values=means, crop_size=crop, mirror=True)
    draws = [t.draw(b.shape[0], b.shape[2], b.shape[3], transform_rng(0, 0, i, 0))
             for i, b in enumerate(batches)]
    outs = [np.empty((b.shape[0], *t.check(b.shape)), np.float32) for b in batches]
    mv = np.asarray(means, np.float32)[:, None, None]

    def whole():
        for b, d, o in zip(batches, draws, outs, strict=True):
            t(b, draw=d, out=o)

    def per_image():
        res = []
        for b, d in zip(batches, draws, strict=True):
            o = np.empty((b.shape[0], *t.check(b.shape)), np.float32)
            size = crop or b.shape[2]
            for i in range(b.shape[0]):
                h, w = int(d.h_off[i]), int(d.w_off[i])
                img = b[i, :, h:h + size, w:w + (crop or b.shape[3])].astype(np.float32)
                img = (img - mv) * np.float32(0.017)
                o[i] = img[..., ::-1] if d.mirror[i] else img
            res.append(o)
        return res

    whole()
    if not all(np.array_equal(x, y) for x, y in zip(outs, per_image(), strict=True)):
        raise RuntimeError("transformer and per-image loop disagree")
    n = sum(b.shape[0] for b in batches)
    tw = best_seconds(whole, repeat)
    tp = best_seconds(per_image, repeat)
    return {"crop": crop, "mirror": True, "mean_values": list(means), "scale": 0.017,
            "whole_batch": {"seconds": tw, "images_per_second": n / tw},
            "per_image": {"seconds": tp, "images_per_second": n / tp},
            "ratio_whole_over_per_image": tp / tw}


def main(args: argparse.Namespace) -> int:
    result = run(args.path, args.batch_size, args.repeat, args.tile, args.transform, args.crop)
    if args.json:
        write_json(args.json, result, indent=2)
    print(json.dumps(result, indent=2))
    return 0
