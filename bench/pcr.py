"""Full PCR figure set: build a tiled photo data set, convert it, run ``lmdbio bench pcr``.

The images are crops of the photographs bundled with scikit-learn (china, flower) and
scikit-image (astronaut, chelsea, coffee, rocket, hubble_deep_field, immunohistochemistry,
retina, camera, coins, moon), loaded offline: random crops of 160-320 px per side, random
horizontal flips, saved as baseline JPEG at quality 90 into one sub-folder per source photo
(the "class"). They are tiled from 12 photos, not a real data set of independent images:
the output says so. The JPEGs are converted losslessly to PCR (``jpegtran`` when available),
then the benchmark measures bytes, pages, cold-cache read throughput, decode speed and
PSNR/SSIM per scan group. A second part measures byte-plane progressive tensors on
scikit-learn's digits (real) and on generated normal float32 data.

Usage: ``python -m bench.pcr [--images 3000] [--out bench/results]`` (from the repository root)
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import REPO, RESULTS, json_safe, use_numba_cache, write_json

use_numba_cache()  # before numba is imported: it reads the variable once

from bench.kinds import pcr as bench_pcr  # noqa: E402
from lmdbio.codecs import pcr  # noqa: E402

PHOTOS = ["china", "flower", "astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina", "camera", "coins", "moon"]


def load_photo(name: str) -> np.ndarray:
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return load_sample_image(f"{name}.jpg")
    import skimage.data

    return getattr(skimage.data, name)()


def build_images(root: Path, n: int, seed: int = 0) -> dict[str, int]:
    """Write ``n`` baseline JPEG crops (quality 90) into ``root/<photo>/``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    photos = {}
    for name in PHOTOS:
        try:
            photos[name] = load_photo(name)
        except Exception as exc:  # a photo that needs a download is skipped, and said so
            print(f"skipping {name}: {exc}", file=sys.stderr)
    counts = dict.fromkeys(photos, 0)
    names = sorted(photos)
    for i in range(n):
        name = names[i % len(names)]
        img = photos[name]
        h, w = img.shape[:2]
        ch = int(rng.integers(160, min(320, h) + 1))
        cw = int(rng.integers(160, min(320, w) + 1))
        y = int(rng.integers(0, h - ch + 1))
        x = int(rng.integers(0, w - cw + 1))
        crop = img[y:y + ch, x:x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        (root / name).mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(crop)).save(buf, format="JPEG", quality=90)
        (root / name / f"{i:06d}.jpg").write_bytes(buf.getvalue())
        counts[name] += 1
    return counts


def convert(src: Path, dst: Path, tool: str, group: int) -> dict:
    from lmdbio.convert import pcr as convert_pcr

    args = argparse.Namespace(group_size=group, quality=90, jpeg_tool=tool, workers=2,
                              shuffle_seed=0, labels=None, overwrite=True, format_version=1)
    t0 = time.perf_counter()
    summary = convert_pcr.convert(str(src), str(dst), args)
    summary["convert_s"] = time.perf_counter() - t0
    return summary


def tensor_part(work: Path) -> dict:
    """Byte-plane progressive tensors: digits (real, float32) and generated normal float32."""
    from sklearn.datasets import load_digits

    from lmdbio.convert import pcr as convert_pcr

    out = {}
    rng = np.random.default_rng(0)
    sets = {"digits_float32 (sklearn load_digits, real)": load_digits().data.astype(np.float32),
            "normal_float32 (generated, 20000 x 64)":
                rng.standard_normal((20000, 64)).astype(np.float32)}
    for name, x in sets.items():
        npy = work / "x.npy"
        np.save(npy, x)
        dst = work / "planes"
        args = argparse.Namespace(group_size=256, overwrite=True, format_version=1, labels=None)
        convert_pcr.convert(str(npy), str(dst), args)
        out[name] = bench_pcr.run(str(dst), repeat=3,
                                  methods=("pread-willneed", "pread-noreadahead", "pread"),
                                  decode_values=8,
                                  quality_images=0, cold=True)
        bench_pcr.print_table(out[name])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--work", default=str(REPO / "build" / "bench-pcr"))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = Path(a.work)
    src = work / "images"
    if src.exists():
        import shutil

        shutil.rmtree(src)
    counts = build_images(src, a.images)
    print(f"data: {a.images} JPEG crops (160-320 px, q90) tiled from {len(counts)} bundled "
          f"photographs: {counts}")
    results = {"data": f"{a.images} crops tiled from bundled photographs (not independent "
               "images): " + ", ".join(counts), "crops_per_photo": counts, "tools": {}}
    for tool in pcr.available_tools():
        dst = work / f"pcr-{tool}"
        summary = convert(src, dst, tool, a.group_size)
        print(f"\n== {tool}: converted {summary['items']} images in {summary['convert_s']:.1f} s"
              f" (source {summary['source_bytes']} B -> progressive {summary['pcr_image_bytes']}"
              " B)")
        res = bench_pcr.run(str(dst), repeat=a.repeat, decode_values=16, quality_images=256)
        bench_pcr.print_table(res)
        results["tools"][tool] = {"convert": summary, "bench": res}
    results["tensors"] = tensor_part(work)
    written = write_json(Path(a.out) / "pcr.json", json_safe(results), indent=2)
    print(f"\nwrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
