"""Cursor bytes made on one rank, used on the next one (what the DM chain does).

argv[1]: the database path (or call :func:`main`, as tests/mpi/read_epochs.py does for a
case ``{"kind": "cursor"}``). Two mappings are tried in turn: a symmetric one (cursors carry
raw page addresses) and a private one on each rank (cursors carry page numbers). For each,
rank 0 positions cursors at a few records, serializes them and sends the bytes to rank 1,
which rebuilds them and reads key and value; rank 1 also sends the cursor it advanced back.
Every rank emits what it read. Finally rank 1 tries an address-carrying cursor on a database
mapped elsewhere, which must be refused.
"""

from __future__ import annotations

import sys
import zlib

from _result import emit
from mpi4py import MPI

from lmdbio.errors import LmdbioError
from lmdbio.io.symmap import map_file, map_symmetric
from lmdbio.lmdb import Database
from lmdbio.lmdb.snapshot import resolve_file
from lmdbio.mpiutil import abort_on_error

world = MPI.COMM_WORLD
rank = world.Get_rank()
STEPS = [0, 1, 100, 77, 3]  # walk this many records between positions (then 5 more)


def crc(cur) -> int:
    return zlib.crc32(bytes(cur.value()), zlib.crc32(cur.key()))


def trial(path: str, kind: str, extra: dict | None = None) -> None:
    file = resolve_file(path)
    mapping = map_symmetric(world, file) if kind == "symmetric" else map_file(file)
    db = Database(path, buffer=mapping.array,
                  address=mapping.address if mapping.symmetric else None)
    seen = []
    if rank == 0:
        cur = db.cursor()
        cur.first()
        for step in STEPS:
            cur.walk(step)
            seen.append([cur.index(), crc(cur)])
            world.send(cur.to_bytes(), dest=1, tag=1)
        back = db.cursor_from_bytes(world.recv(source=1, tag=2))
        seen.append([back.index(), crc(back)])
    elif rank == 1:
        for _ in STEPS:
            cur = db.cursor_from_bytes(world.recv(source=0, tag=1))
            seen.append([cur.index(), crc(cur)])
        cur.walk(5)
        world.send(cur.to_bytes(), dest=0, tag=2)
        seen.append([cur.index(), crc(cur)])
    emit({**(extra or {}), "kind": kind, "symmetric": bool(mapping.symmetric),
          "has_address": db.address is not None, "seen": seen})
    if kind == "symmetric" and rank == 1:
        # the same cursor bytes on a private mapping elsewhere must be refused
        other = map_file(file)
        odb = Database(path, buffer=other.array)
        try:
            odb.cursor_from_bytes(cur.to_bytes())
            refused = ""
        except LmdbioError as exc:
            refused = str(exc)
        emit({**(extra or {}), "kind": "mismatch", "refused": refused})
        odb.close()
        del odb
        other.close()
    db.close()
    del db
    mapping.close()


def main(path: str, extra: dict | None = None) -> None:
    """Both trials (collective over the world)."""
    trial(path, "symmetric", extra)
    trial(path, "private", extra)
    world.Barrier()


if __name__ == "__main__":
    with abort_on_error():
        main(sys.argv[1])
