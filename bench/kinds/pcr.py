"""``lmdbio bench pcr DST``: what each scan group costs and buys, against full fidelity.

For every scan group k = 1..G of a PCR LMDB (``lmdbio convert ... --layout pcr``):

* bytes: the sum over values of ``pcr_prefix_bytes(value, k)``; pages: distinct 4 KiB pages
  of ``data.mdb`` covered by those prefixes (value offsets from the page engine's record
  table); both also as fractions of the full records (k = G, the baseline, same run);
* cold read: the page cache of ``data.mdb`` is dropped (``posix_fadvise(DONTNEED)``) before
  each run, then every value's prefix is read as a loader would: ``pread`` of the header, then
  of the rest of the prefix (``pread``), or page faults on a fresh ``mmap`` (``mmap``), each
  with the kernel's read-ahead or without it (``-noreadahead``: ``POSIX_FADV_RANDOM`` /
  ``MADV_RANDOM``; read-ahead fetches the skipped tails of values too), or queued up front
  (``pread-willneed``: all headers, then all prefixes, announced with
  ``POSIX_FADV_WILLNEED`` so the device sees many requests at once); time, MB/s, images/s
  and the bytes the kernel really fetched from disk (``/proc/self/io`` read_bytes, read-ahead
  included); the median of ``--repeat`` runs;
* decode: Pillow decode time of the images of ``--decode-values`` values at k (warm data);
* quality against full fidelity: PSNR and SSIM (``skimage.metrics``) over
  ``--quality-images`` images; for byte-plane tensors, relative errors instead.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import json_safe, write_json
from lmdbio.codecs import pcr
from lmdbio.commands import progress

PAGE = 4096
#: pread: header then rest of the prefix, default kernel read-ahead; -noreadahead: with
#: POSIX_FADV_RANDOM / MADV_RANDOM, so the kernel fetches only the bytes asked for;
#: pread-willneed: no read-ahead, but every header and then every prefix is queued with
#: POSIX_FADV_WILLNEED before it is read (many requests in flight, as a prefetching loader)
METHODS = ("pread-willneed", "pread-noreadahead", "pread", "mmap", "mmap-noreadahead")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a PCR LMDB (directory or data.mdb)")
    parser.add_argument("--repeat", type=int, default=3, help="cold runs per group and method")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated read methods: " + ", ".join(METHODS))
    parser.add_argument("--decode-values", type=int, default=8,
                        help="values whose images are decoded for timing (default 8)")
    parser.add_argument("--quality-images", type=int, default=128,
                        help="images compared with full fidelity (PSNR/SSIM)")
    parser.add_argument("--no-cold", action="store_true",
                        help="skip the cold-cache reads (e.g. on tmpfs)")
    parser.add_argument("--json", metavar="OUT", default=None, help="write the result here")


# ---------------------------------------------------------------------- record geometry
def value_table(path: str | os.PathLike) -> tuple[Path, np.ndarray, np.ndarray, list[bytes]]:
    """(data.mdb, value offsets in the file, value lengths, value headers) in key order.

    Offsets come from the page engine's record table; the header of each value (its first
    ``16 + 8 * G`` bytes) is copied for the prefix computation."""
    import lmdbio

    with lmdbio.open(path, pin_snapshot=False) as db:
        t = db.record_table()
        off = t.val_off.astype(np.int64).copy()
        ln = t.val_len.astype(np.int64).copy()
        heads = []
        for i in range(len(t)):
            v = db.value(i)
            g = pcr.unpack_fixed(v).n_groups if len(v) >= pcr.FIXED else 0
            heads.append(bytes(v[:pcr.FIXED + 8 * g]))
        mdb = Path(db.path)
    return mdb, off, ln, heads


def distinct_pages(offsets: np.ndarray, lengths: np.ndarray, page: int = PAGE) -> int:
    """Number of distinct ``page``-byte pages covered by the byte ranges (whole-array)."""
    keep = lengths > 0
    first = offsets[keep] // page
    last = (offsets[keep] + lengths[keep] - 1) // page
    order = np.argsort(first, kind="stable")
    first, last = first[order], last[order]
    if first.shape[0] == 0:
        return 0
    prev_max = np.maximum.accumulate(last)
    start = first.copy()
    start[1:] = np.maximum(first[1:], prev_max[:-1] + 1)
    return int(np.clip(last - start + 1, 0, None).sum())


# ----------------------------------------------------------------------------- cold read
def drop_cache(path: Path) -> None:
    """Write back and evict ``path``'s pages from the page cache (the file must not be
    mapped by this process at the time)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_read_bytes() -> int | None:
    """Bytes this process caused to be fetched from storage (``/proc/self/io``)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def resident(path: Path) -> int | None:
    try:
        from lmdbio.io.prefetch import resident_count

        return resident_count(str(path))
    except Exception:  # optional measurement: absent module or mincore refused
        return None


def read_prefixes(mdb: Path, off: np.ndarray, ln: np.ndarray, k: int, method: str,
                  head_bytes: int) -> tuple[float, int, int | None]:
    """Read every value's prefix for group ``k``; returns (seconds, bytes, disk bytes)."""
    biggest = int(ln.max())
    out = np.empty(biggest, np.uint8)
    offs, lens = off.tolist(), ln.tolist()
    d0 = disk_read_bytes()
    t0 = time.perf_counter()
    total = 0
    if method in ("pread", "pread-noreadahead"):
        fd = os.open(mdb, os.O_RDONLY)
        try:
            if method == "pread-noreadahead":  # the kernel reads exactly what is asked
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            omv = memoryview(out)
            for o, n in zip(offs, lens, strict=True):
                h = min(head_bytes, n)
                os.preadv(fd, [omv[:h]], o)
                need = pcr.pcr_prefix_bytes(omv[:h], k)
                if need > h:
                    os.preadv(fd, [omv[h:need]], o + h)
                total += need
        finally:
            os.close(fd)
    elif method == "pread-willneed":
        fd = os.open(mdb, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            heads = [min(head_bytes, n) for n in lens]
            for o, h in zip(offs, heads, strict=True):  # queue every header read at once
                os.posix_fadvise(fd, o, h, os.POSIX_FADV_WILLNEED)
            needs = []
            hbuf = np.empty(head_bytes, np.uint8)
            for o, h in zip(offs, heads, strict=True):
                os.preadv(fd, [memoryview(hbuf)[:h]], o)
                need = pcr.pcr_prefix_bytes(memoryview(hbuf)[:h], k)
                needs.append(need)
                if need > h:  # queue the rest of this prefix
                    os.posix_fadvise(fd, o + h, need - h, os.POSIX_FADV_WILLNEED)
            omv = memoryview(out)
            for o, need in zip(offs, needs, strict=True):
                os.preadv(fd, [omv[:need]], o)
                total += need
        finally:
            os.close(fd)
    elif method in ("mmap", "mmap-noreadahead"):
        with open(mdb, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if method == "mmap-noreadahead":
                mm.madvise(mmap.MADV_RANDOM)
            mv = memoryview(mm)
            try:
                for o, n in zip(offs, lens, strict=True):
                    v = mv[o:o + n]
                    need = pcr.pcr_prefix_bytes(v, k)
                    out[:need] = np.frombuffer(v[:need], np.uint8)  # touch = page faults
                    total += need
                    v.release()
            finally:
                mv.release()
    else:
        raise ValueError(f"unknown read method {method!r}")
    dt = time.perf_counter() - t0
    d1 = disk_read_bytes()
    return dt, total, (d1 - d0) if d0 is not None and d1 is not None else None


# ------------------------------------------------------------------------------- quality
def _image_quality(low: list[np.ndarray], full: list[np.ndarray]) -> dict[str, float]:
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    psnr, ssim = [], []
    for a, b in zip(low, full, strict=True):
        if a.shape != b.shape:
            continue
        if np.array_equal(a, b):
            psnr.append(float("inf"))
            ssim.append(1.0)
            continue
        psnr.append(float(peak_signal_noise_ratio(b, a, data_range=255)))
        win = min(7, min(a.shape[:2]) // 2 * 2 - 1)
        ssim.append(float(structural_similarity(
            b, a, data_range=255, win_size=max(win, 3),
            channel_axis=-1 if a.ndim == 3 else None)))
    finite = [p for p in psnr if np.isfinite(p)]
    return {"psnr_mean_db": float(np.mean(finite)) if finite else float("inf"),
            "psnr_median_db": float(np.median(psnr)) if psnr else float("nan"),
            "ssim_mean": float(np.mean(ssim)) if ssim else float("nan"),
            "identical_fraction": float(np.mean([not np.isfinite(p) for p in psnr]))
            if psnr else float("nan"), "images": len(psnr)}


def _tensor_quality(low: np.ndarray, full: np.ndarray) -> dict[str, float]:
    a = low.astype(np.float64).reshape(-1)
    b = full.astype(np.float64).reshape(-1)
    ok = np.isfinite(b)
    a, b = a[ok], b[ok]
    err = np.abs(a - b)
    nz = b != 0
    rel = err[nz] / np.abs(b[nz])
    scale = float(np.std(b)) or 1.0
    return {"max_abs_error": float(err.max(initial=0.0)),
            "rmse_over_std": float(np.sqrt(np.mean(err**2)) / scale) if err.size else 0.0,
            "max_rel_error": float(rel.max(initial=0.0)),
            "median_rel_error": float(np.median(rel)) if rel.size else 0.0,
            "exact_fraction": float(np.mean(err == 0)) if err.size else 1.0}


# ---------------------------------------------------------------------------------- main
def run(path: str, repeat: int = 3, methods: tuple[str, ...] = METHODS,
        decode_values: int = 8, quality_images: int = 128, cold: bool = True) -> dict[str, Any]:
    from lmdbio.dataset_meta import read_dataset_meta

    meta = read_dataset_meta(path)
    mdb, off, ln, heads = value_table(path)
    if not heads:
        raise SystemExit(f"{path}: no records")
    fixed = [pcr.unpack_fixed(h) for h in heads]
    g_max = max(f.n_groups for f in fixed)
    head_bytes = pcr.FIXED + 8 * g_max
    prefix = np.array([[pcr.read_group_prefix_length(h, k) for k in range(1, g_max + 1)]
                       for h in heads], np.int64)  # (values, G)
    n_items = sum(f.n_items for f in fixed)
    kind = fixed[0].kind
    file_pages = -(-mdb.stat().st_size // PAGE)

    # decode sample: full fidelity first (the reference), then every k
    import lmdbio

    sample_values: list[bytes] = []
    with lmdbio.open(path, pin_snapshot=False) as db:
        step = max(1, len(heads) // max(1, decode_values))
        for i in range(0, len(heads), step)[:decode_values]:
            sample_values.append(bytes(db.value(i)))
    full_items = [pcr.decode_pcr_value(v, g_max)[0] for v in sample_values]

    groups = []
    for k in progress.steps(range(1, g_max + 1), "scan groups", unit=" groups"):
        need = prefix[:, k - 1]
        row: dict[str, Any] = {
            "k": k, "bytes": int(need.sum()), "pages": distinct_pages(off, need)}
        t0 = time.perf_counter()
        items = [pcr.decode_pcr_value(memoryview(v)[:pcr.pcr_prefix_bytes(v, k)], k)[0]
                 for v in sample_values]
        dt = time.perf_counter() - t0
        if kind == pcr.KIND_JPEG:
            n_dec = sum(len(x) for x in items)
            row["decode_images_per_s"] = n_dec / dt
            low = [im for x in items for im in x][:quality_images]
            ref = [im for x in full_items for im in x][:quality_images]
            row.update(_image_quality(low, ref))
        else:
            n_dec = sum(x.shape[0] for x in items)
            row["decode_items_per_s"] = n_dec / dt
            row.update(_tensor_quality(np.concatenate(items), np.concatenate(full_items)))
        row["decode_s"] = dt
        groups.append(row)

    if cold:
        for method in methods:
            for row in groups:
                times, disk, res = [], [], []
                for _ in range(repeat):
                    drop_cache(mdb)
                    res.append(resident(mdb))
                    dt, total, dbytes = read_prefixes(mdb, off, ln, row["k"], method, head_bytes)
                    assert total == row["bytes"]
                    times.append(dt)
                    disk.append(dbytes)
                t = statistics.median(times)
                row[f"cold_{method}_s"] = t
                row[f"cold_{method}_MBps"] = row["bytes"] / t / 1e6
                row[f"cold_{method}_items_per_s"] = n_items / t
                row[f"cold_{method}_disk_bytes"] = (statistics.median(disk)
                                                    if None not in disk else None)
                row[f"cold_{method}_resident_pages_before"] = res[0]

    full = groups[-1]
    best_full = min((full[f"cold_{m}_s"] for m in methods), default=None) if cold else None
    for row in groups:
        row["bytes_fraction"] = row["bytes"] / full["bytes"]
        row["pages_fraction"] = row["pages"] / full["pages"]
        for method in (methods if cold else ()):
            row[f"cold_{method}_speedup_vs_full"] = full[f"cold_{method}_s"] / row[
                f"cold_{method}_s"]
        if cold:  # against the fastest way of reading the full records (any method)
            best = min(row[f"cold_{m}_s"] for m in methods)
            row["cold_best_s"] = best
            row["cold_best_method"] = min(methods, key=lambda m: row[f"cold_{m}_s"])
            row["cold_best_speedup_vs_best_full"] = best_full / best
    return {"benchmark": "pcr", "path": str(path), "dataset": meta, "kind": int(kind),
            "values": len(heads), "items": n_items, "scan_groups": g_max,
            "file_pages": file_pages, "baseline": "full records (k = scan_groups), same run",
            "decode_sample_values": len(sample_values), "groups": groups}


def print_table(result: dict[str, Any]) -> None:
    methods = [m for m in METHODS if f"cold_{m}_s" in result["groups"][0]]
    head = f"{'k':>3} {'bytes':>12} {'frac':>6} {'pages':>8} {'frac':>6}"
    for m in methods:
        head += f" {m.replace('noreadahead', 'nora') + ' MB/s':>16} {'x':>5}"
    q = "psnr_mean_db" if result["kind"] == pcr.KIND_JPEG else "max_rel_error"
    if methods:
        head += f" {'best/full':>9}"
    head += f" {q:>13} {'ssim' if result['kind'] == pcr.KIND_JPEG else 'rmse/std':>9}"
    print(f"{result['items']} items in {result['values']} values, {result['scan_groups']} groups")
    print(head)
    for r in result["groups"]:
        line = (f"{r['k']:>3} {r['bytes']:>12} {r['bytes_fraction']:>6.3f} {r['pages']:>8} "
                f"{r['pages_fraction']:>6.3f}")
        for m in methods:
            line += f" {r[f'cold_{m}_MBps']:>16.1f} {r[f'cold_{m}_speedup_vs_full']:>5.2f}"
        if methods:
            line += f" {r['cold_best_speedup_vs_best_full']:>9.2f}"
        second = r.get("ssim_mean", r.get("rmse_over_std", float("nan")))
        line += f" {r[q]:>13.4g} {second:>9.4f}"
        print(line)


def main(args: argparse.Namespace) -> int:
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    result = run(args.path, args.repeat, methods, args.decode_values, args.quality_images,
                 cold=not args.no_cold)
    print_table(result)
    if args.json:
        write_json(args.json, json_safe(result), indent=2)
    return 0
