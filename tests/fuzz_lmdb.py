"""Fuzz the page engine with mutated LMDB files (run in a subprocess by test_lmdb_fuzz.py).

Each example takes a real database (generated here with py-lmdb, v1 and v3, or the files
``--base`` names: test_page_sizes.py passes 32 and 64 KiB-page ones), truncates it or
overwrites bytes (biased towards page headers, node pointer arrays, node headers and
meta fields), then opens and reads it fully: every record, cursors both ways, seeks,
serialized cursors and gathers. The only acceptable outcomes are data or an
``LmdbioError``; anything else (another exception, a crash, a hang) fails. The parent
process sees crashes as a signal exit code and hangs as its timeout; before each example
the mutation is written to stderr so a crash can be reproduced.
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lmdbio
from bench.lmdbgen import random_items, write_db
from lmdbio.errors import LmdbioError
from lmdbio.io.gather import gather
from lmdbio.lmdb.format import LAYOUTS, sniff_version
from lmdbio.lmdb.free_pages import free_list

OUTCOMES = {"ok": 0, "error": 0}


def exercise(path: Path) -> None:
    with lmdbio.open(path, pin_snapshot=False, accounting=True) as db:
        for _k, v in db.items():
            bytes(v[:16])
        gather(db, range(len(db)))
        db.leaf_value_runs(db.leaves())
        free_list(db)
        db.tree_levels()
        cur = db.cursor()
        ok = cur.last()
        steps = 0
        while ok and steps < 10_000:
            ok = cur.prev()
            steps += 1
        if db.cursor().first():
            c = db.cursor()
            c.walk(len(db) // 2 + 1)
            if not c.eof:
                k = c.key()
                c2 = db.cursor()
                c2.set_range(k[:-1] if k else k)
                db.cursor_from_bytes(c.to_bytes())
        db.stat()
        lmdbio.list_databases(path)


def make_bases(root: Path) -> list[bytes]:
    bases = []
    for version in (1, 3):
        d = root / f"base-v{version}"
        d.mkdir()
        items = random_items(300, (1, 4000), seed=version)
        write_db(d, items, version=version, commit_every=40,
                 subdbs={b"named": random_items(20, 30, seed=9)})
        bases.append((d / "data.mdb").read_bytes())
    return bases


class Mutated(bytes):
    """The mutated file; its repr stays short in hypothesis' failure reports."""

    def __repr__(self) -> str:
        return f"<{len(self)} bytes>"


def page_size(data: bytes) -> int:
    """The page size meta page 0 of ``data`` gives (4096 when it is not readable: the
    mutations then aim at 4 KiB pages)."""
    version = sniff_version(data[:256])
    if version is None:
        return 4096
    psize = struct.unpack_from("<I", data, LAYOUTS[version].header_size + 24)[0]
    return psize if 512 <= psize <= 65536 and not psize & (psize - 1) else 4096


def mutation(bases: list[bytes]):
    sizes = [page_size(b) for b in bases]

    @st.composite
    def draw(draw_fn):
        base = draw_fn(st.sampled_from(range(len(bases))))
        data = bytearray(bases[base])
        psize = sizes[base]  # offsets inside a page scale with it (4096: the cases of old)
        npages = len(data) // psize
        kind = draw_fn(st.sampled_from(["truncate", "header", "ptrs", "node", "meta", "u64",
                                        "random"]))
        edits = []
        if kind == "truncate":
            cut = draw_fn(st.integers(0, len(data) - 1))
            return base, kind, [(cut,)], Mutated(data[:cut])
        for _ in range(draw_fn(st.integers(1, 4))):
            page = draw_fn(st.integers(0, npages - 1))
            if kind == "header":
                off = page * psize + draw_fn(st.integers(0, 23))
            elif kind == "ptrs":
                off = page * psize + draw_fn(st.integers(16, 80))
            elif kind == "node":  # nodes sit at the end of a page
                off = page * psize + draw_fn(st.integers(psize - 1096, psize - 1))
            elif kind == "meta":
                off = draw_fn(st.sampled_from([0, psize])) + draw_fn(st.integers(0, 180))
            elif kind == "u64":
                off = page * psize + draw_fn(st.integers(0, psize - 8))
                val = draw_fn(st.sampled_from([0, 1, 2, npages - 1, npages, 2**32, 2**63,
                                               2**64 - 1, page]))
                data[off:off + 8] = struct.pack("<Q", val)
                edits.append((off, val))
                continue
            else:
                off = draw_fn(st.integers(0, len(data) - 1))
            byte = draw_fn(st.integers(0, 255))
            data[off] = byte
            edits.append((off, byte))
        return base, kind, edits, Mutated(data)

    return draw()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--random", action="store_true",
                        help="explore new cases (default: the same cases every run, for CI)")
    parser.add_argument("--seed", type=int, default=None,
                        help="explore the cases of this seed (replays a --random run)")
    parser.add_argument("--base", action="append", type=Path, default=[],
                        help="mutate this data.mdb (repeatable; any page size) instead of "
                        "the generated 4 KiB-page v1 and v3 files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bases = [p.read_bytes() for p in args.base] or make_bases(root)
        target = root / "mutated" / "data.mdb"
        target.parent.mkdir()

        explore = args.random or args.seed is not None

        @settings(max_examples=args.examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), derandomize=not explore)
        @given(mutation(bases))
        def run(case):
            base, kind, edits, data = case
            print(f"case base={base} kind={kind} edits={edits[:4]} len={len(data)}",
                  file=sys.stderr, flush=True)
            target.write_bytes(data)
            try:
                exercise(target)
                OUTCOMES["ok"] += 1
            except LmdbioError:
                OUTCOMES["error"] += 1

        if args.seed is not None:
            run = seed(args.seed)(run)
        run()
    print(f"RESULT ok={OUTCOMES['ok']} error={OUTCOMES['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
