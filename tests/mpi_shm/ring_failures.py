"""Batch-ring failure modes run under mpiexec by tests/test_shm_ring.py.

usage: ring_failures.py MODE [MARKER_DIR]

All ranks form one node (node rank 0 reads, the others work) with a ring timeout of 120 s,
far longer than the test's own deadline: the job can only end in time if the failure
propagates through ABORT messages, never by a timeout.

* ``worker-raises`` - node rank 2 raises inside ``with ring:`` at iteration 5.
* ``reader-raises`` - the reader raises inside ``with ring:`` at iteration 5.
* ``no-close`` - node rank 1 leaves the ring without closing it (the interpreter exits).
* ``loop`` - every rank prints ``RUNNING <node rank> <pid>`` and loops until signalled.

With MARKER_DIR, every rank writes ``shutdown-<node rank>`` there from an ``on_shutdown``
callback that runs after the ring's: the shutdown reason and the ring's abort reason.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from lmdbio.mpiutil import on_shutdown
from lmdbio.shm import BatchRing

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

mode = sys.argv[1]
node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
rank = node.Get_rank()
marker_dir = sys.argv[2] if len(sys.argv) > 2 else None


@on_shutdown
def _marker(reason: str) -> None:
    # registered before the ring, so it runs after the ring's own shutdown callback
    if marker_dir:
        with open(os.path.join(marker_dir, f"shutdown-{rank}"), "w") as f:
            f.write(f"{reason} {ring.aborted}")

ring = BatchRing.create(node, 0, slots=2, payload_bytes=1 << 16, max_records=16, timeout=120,
                        checksum="crc32")
payload = np.arange(4096, dtype=np.uint8)
offsets = np.linspace(0, 4096, 17).astype(np.int64)


def reader_loop(fail_at: int | None) -> None:
    for it in itertools.count():
        if it == fail_at:
            raise ValueError(f"injected failure in the reader at iteration {it}")
        w = ring.acquire_slot(0, it)
        w.write(payload, offsets, labels=np.full(16, it))
        w.publish()
        if it == 0 and mode == "loop":
            print(f"RUNNING {rank} {os.getpid()}", flush=True)
        if mode == "loop":
            time.sleep(0.005)


def worker_loop(fail_at: int | None, leave_at: int | None) -> None:
    for it, view in enumerate(ring):
        assert int(view.labels[0]) == it
        if it == fail_at:
            raise ValueError(f"injected failure in node rank {rank} at iteration {it}")
        if it == leave_at:
            view.release()
            sys.exit(0)  # no close(): the atexit hook must tell the others
        if it == 0 and mode == "loop":
            print(f"RUNNING {rank} {os.getpid()}", flush=True)


if mode == "no-close" and rank == 1:
    worker_loop(None, 3)
with ring:
    if ring.is_reader:
        reader_loop(5 if mode == "reader-raises" else None)
    else:
        worker_loop(5 if mode == "worker-raises" and rank == 2 else None, None)
