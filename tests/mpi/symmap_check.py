"""Map files symmetrically, one case after another, and emit what every rank saw.

argv[1]: a JSON list of cases ``{"path": ..., "kwargs": {...}}``; ``{rank}`` in a path is
replaced by the world rank (to give ranks different or missing files); ``kwargs`` go to
``map_symmetric``.

Per case it emits ``address``, ``symmetric``, ``attempts``, the SHA-256 of the bytes read
through the zero-copy view, whether sampled slices equal ``os.pread`` of the file, and - to
show why the symmetric address matters - whether a pointer computed by rank 0 names the same
file offset here; then whether ``close`` refused while a view was alive. A case that raises
emits the error text. A final barrier shows that no rank was left behind in a collective.
"""

import hashlib
import json
import logging
import os
import sys

from _result import emit
from mpi4py import MPI

from lmdbio.io.symmap import map_symmetric

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
comm = MPI.COMM_WORLD
rank = comm.Get_rank()


def check(case: int, path: str, kwargs: dict) -> None:
    try:
        m = map_symmetric(comm, path, **kwargs)
    except Exception as exc:
        emit({"case": case, "error": f"{type(exc).__name__}: {exc}"})
        return
    arr = m.array
    digest = hashlib.sha256(arr).hexdigest()
    fd = os.open(path, os.O_RDONLY)
    samples_ok = True
    for off in (0, 1, m.length // 3, m.length - 7):
        n = min(4096, m.length - off)
        samples_ok &= bytes(arr[off : off + n]) == os.pread(fd, n, off)
    os.close(fd)
    # rank 0 sends a raw pointer (what a serialized cursor contains); receivers decode it
    off0 = m.length // 2
    ptr = comm.bcast(m.pointer(off0) if rank == 0 else None, root=0)
    try:
        decoded = m.offset(ptr)
    except Exception:
        decoded = None
    try:
        m.close()
        close_refused = False
    except BufferError:
        close_refused = True  # arr is still alive
    del arr
    m.close()
    m.close()
    emit(
        {
            "case": case,
            "address": m.address,
            "length": m.length,
            "symmetric": m.symmetric,
            "attempts": m.attempts,
            "sha256": digest,
            "samples_ok": bool(samples_ok),
            "pointer_decodes": decoded == off0,
            "close_refused_with_view": close_refused,
            "closed": m.closed,
        }
    )


for i, case in enumerate(json.loads(sys.argv[1])):
    check(i, case["path"].format(rank=rank), case.get("kwargs", {}))
comm.Barrier()
