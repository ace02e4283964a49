"""Batch-ring scenarios run under mpiexec by tests/test_shm_ring.py.

usage: ring_scenarios.py NODES [--checksum=KIND] SCENARIO[:ARG] ...

COMM_WORLD is cut into NODES simulated nodes of consecutive ranks (each a sub-communicator of
one shared-memory host); every node runs the scenarios with its own ring, node rank 0 the
reader, checksums of KIND (default xxh64). Each rank emits one result per scenario
(tests/mpi/_result.py); an assertion failure raises, which fails the run. The batches are
generated (seeded numpy), never real data.

Scenarios: ``roundtrip:K`` (variable-size records through K slots, two epochs, a slow worker
re-checking its data after a pause, STOP at the end), ``hold:K`` (the reader fills exactly K
slots, then cannot overwrite: its acquire times out while the workers hold them),
``corrupt`` (a payload byte and a header field changed after publication are detected),
``capacity`` (batches too large for the slot give SlotCapacityError), ``resize`` (the node
regrows the ring for a batch that did not fit; refused while a slot is held), ``solo:K`` (a
single-rank node, reader and worker in one process), ``views`` (views kept past close()
keep the window mapped instead of dangling), ``config`` (bad configurations raise
ConfigError on every rank).
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
from _result import emit
from mpi4py import MPI

from lmdbio.errors import ConfigError
from lmdbio.shm import (
    FLAG_LAST_IN_EPOCH,
    BatchRing,
    RingError,
    RingTimeoutError,
    SlotCapacityError,
    SlotCorruptError,
)
from lmdbio.shm.cleanup import mapping_path

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

MAX_RECORDS = 24
MAX_SIZE = 700  # bytes per generated record (0 included)


def make_batch(epoch: int, it: int, n: int | None = None, min_size: int = 0):
    """A generated batch: payload, offsets, labels, keys (deterministic in epoch, it)."""
    rng = np.random.default_rng([12345, epoch, it])
    if n is None:
        n = int(rng.integers(0, MAX_RECORDS + 1))
    sizes = rng.integers(min_size, MAX_SIZE, n)
    sizes[rng.random(n) < 0.1] = min_size  # some empty records
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    payload = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    labels = rng.integers(-3, 1000, n)
    keys = [b"e%d/it%d/rec%05d" % (epoch, it, i) for i in range(n)]
    return payload, offsets, labels, keys


def part_bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    counts = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    return sum(counts[:index]), counts[index]


def check_view(view, ring: BatchRing, epoch: int, it: int, n: int | None = None,
               min_size: int = 0) -> None:
    payload, offsets, labels, keys = make_batch(epoch, it, n, min_size)
    nrec = offsets.size - 1
    assert (view.epoch, view.iteration) == (epoch, it), (view, epoch, it)
    assert view.batch_records == nrec, (view.batch_records, nrec)
    first, count = part_bounds(nrec, len(ring.workers), ring.worker_index)
    assert (view.first, view.count) == (first, count), (view, first, count)
    lo, hi = int(offsets[first]), int(offsets[first + count])
    assert np.array_equal(view.payload, payload[lo:hi]), f"payload differs in {view}"
    assert np.array_equal(view.offsets, offsets[first : first + count + 1] - lo)
    assert np.array_equal(view.labels, labels[first : first + count])
    assert view.keys() == keys[first : first + count]
    assert not view.payload.flags.writeable
    if count:
        i = count // 2
        assert bytes(view.record(i)) == payload[offsets[first + i] : offsets[first + i + 1]
                                                ].tobytes()


def publish_batch(ring: BatchRing, epoch: int, it: int, n: int | None = None,
                  flags: int = 0, timeout: float | None = None, min_size: int = 0) -> None:
    payload, offsets, labels, keys = make_batch(epoch, it, n, min_size)
    w = ring.acquire_slot(epoch, it, timeout=timeout)
    w.write(payload, offsets, labels=labels, keys=keys)
    w.publish(flags=flags, first_sample=it * MAX_RECORDS)


CHECKSUM = "xxh64"


def new_ring(node, k: int, **kw) -> BatchRing:
    kw.setdefault("checksum", CHECKSUM)
    kw.setdefault("payload_bytes", MAX_RECORDS * MAX_SIZE)
    kw.setdefault("max_records", MAX_RECORDS)
    kw.setdefault("timeout", 30.0)
    return BatchRing.create(node, 0, slots=k, **kw)


# ------------------------------------------------------------------ scenarios
def roundtrip(node, side, k: int) -> dict:
    iters, epochs = 20, 2
    with new_ring(node, k) as ring:
        if ring.is_reader:
            path = mapping_path(ring.address)
            for epoch in range(epochs):
                for it in range(iters):
                    publish_batch(ring, epoch, it,
                                  flags=FLAG_LAST_IN_EPOCH if it == iters - 1 else 0)
                    assert ring.in_flight <= k
            assert ring.stats.published == iters * epochs
            assert 1 <= ring.stats.max_in_flight <= k, ring.stats
            return {"published": ring.stats.published, "max_in_flight":
                    ring.stats.max_in_flight, "mapping": path,
                    "backing_file": ring.backing_file}
        seen = []
        for view in ring:
            epoch, it = divmod(len(seen), iters)
            check_view(view, ring, epoch, it)
            assert view.last_in_epoch == (it == iters - 1)
            assert view.first_sample == it * MAX_RECORDS
            if ring.worker_index == 0 and it % 3 == 0:
                time.sleep(0.003)  # a slow worker: the reader must wait, never overwrite
                check_view(view, ring, epoch, it)
            seen.append((view.epoch, view.iteration, view.seq))
        assert [s[2] for s in seen] == list(range(iters * epochs))
        assert ring.next_slot() is None  # stays stopped
        return {"consumed": len(seen)}


def hold(node, side, k: int) -> dict:
    with new_ring(node, k) as ring:
        if ring.is_reader:
            side.Barrier()  # B1: the workers saw next_slot time out on an empty ring
            for it in range(k):
                publish_batch(ring, 0, it, timeout=5)
            assert ring.in_flight == k
            try:
                ring.acquire_slot(0, k, timeout=0.3)
            except RingTimeoutError as exc:
                msg = str(exc)
                assert "release slot 0" in msg and "iteration" in msg, msg
            else:
                raise AssertionError("the reader overwrote a slot the workers still hold")
            side.Barrier()  # B2: the workers hold K slots and release them after this
            publish_batch(ring, 0, k, timeout=10)
            return {"timeout_message": msg}
        try:
            ring.next_slot(timeout=0.2)
        except RingTimeoutError as exc:
            empty_msg = str(exc)
            assert "slot sequence 0" in empty_msg, empty_msg
        else:
            raise AssertionError("next_slot returned on an empty ring")
        side.Barrier()  # B1
        views = [ring.next_slot(timeout=10) for _ in range(k)]
        for it, v in enumerate(views):
            check_view(v, ring, 0, it)
        try:
            ring.next_slot(timeout=10)
        except RingError as exc:
            assert "holds all" in str(exc), str(exc)
        else:
            raise AssertionError("a worker got more than K slots at once")
        side.Barrier()  # B2
        for v in reversed(views):
            v.release()
        v = ring.next_slot(timeout=10)
        assert v is not None and v.seq == k
        check_view(v, ring, 0, k)
        v.release()
        assert ring.next_slot(timeout=10) is None
        return {"empty_message": empty_msg}


def corrupt(node, side, k: int = 2) -> dict:
    n_workers = node.Get_size() - 1
    n = 2 * n_workers
    with new_ring(node, k) as ring:
        if ring.is_reader:
            publish_batch(ring, 0, 0, n=n, min_size=1)
            # a stray write into the last worker's part after publication (test-only poke)
            bufs = ring.slot_buffers(0)
            bs = int(bufs.parts[-1]["byte_start"])
            bufs.payload[bs] ^= 0xFF
            del bufs  # views kept past close() would keep the window mapped
            side.Barrier()  # B1
            publish_batch(ring, 0, 1, n=n, min_size=1)
            ring.slot_buffers(1).header["iteration"] += 1000  # a header changed after the seal
            side.Barrier()  # B2
            publish_batch(ring, 0, 2, n=n, min_size=1, timeout=10)  # slot 0 came back
            return {}
        out = {}
        side.Barrier()  # B1
        last = ring.worker_index == len(ring.workers) - 1
        if last:
            try:
                ring.next_slot(timeout=10)
            except SlotCorruptError as exc:
                assert "checksum mismatch" in str(exc), str(exc)
                assert (exc.slot, exc.seq, exc.epoch, exc.iteration, exc.part) == \
                    (0, 0, 0, 0, ring.worker_index), str(exc)
                out["payload_error"] = str(exc)
            else:
                raise AssertionError("a corrupted payload went undetected")
        else:
            with ring.next_slot(timeout=10) as v:
                check_view(v, ring, 0, 0, n=n, min_size=1)
        side.Barrier()  # B2
        try:
            ring.next_slot(timeout=10)
        except SlotCorruptError as exc:
            assert "header checksum mismatch" in str(exc), str(exc)
            out["header_error"] = str(exc)
        else:
            raise AssertionError("a modified header went undetected")
        with ring.next_slot(timeout=10) as v:
            check_view(v, ring, 0, 2, n=n, min_size=1)
        assert ring.next_slot(timeout=10) is None
        assert ring.stats.corrupt == (2 if last else 1)
        return out


def capacity(node, side, k: int = 2) -> dict:
    with new_ring(node, k, payload_bytes=1000, max_records=8, key_bytes=16) as ring:
        if ring.is_reader:
            w = ring.acquire_slot(3, 7)
            errors = {}
            try:
                w.write(bytes(1500), [0, 700, 1500])
            except SlotCapacityError as exc:
                assert (exc.what, exc.needed, exc.available) == ("payload bytes", 1500, 1000)
                assert "epoch 3, iteration 7" in str(exc) and "1500" in str(exc), str(exc)
                errors["payload"] = str(exc)
            try:
                w.set_records(np.arange(10))
            except SlotCapacityError as exc:
                assert (exc.what, exc.needed, exc.available) == ("records", 9, 8), str(exc)
                errors["records"] = str(exc)
            try:
                w.write(bytes(10), [0, 5, 10], keys=[b"k" * 10, b"j" * 10])
            except SlotCapacityError as exc:
                assert (exc.what, exc.needed, exc.available) == ("key bytes", 20, 16), str(exc)
                errors["keys"] = str(exc)
            assert len(errors) == 3, errors
            w.write(bytes(range(100)), [0, 40, 100], keys=[b"a", b"bb"])
            w.publish()
            return errors
        got = [(bytes(v.payload), v.keys()) for v in ring]
        assert len(got) == 1, got
        return {"got": len(got)}


def solo(node, side, k: int) -> dict:
    """A single-rank node: the reader is its own worker (colocated)."""
    assert node.Get_size() == 1
    with new_ring(node, k) as ring:
        assert ring.is_reader and ring.is_worker and ring.workers == (0,)
        for it in range(k):
            publish_batch(ring, 0, it)
        try:
            ring.acquire_slot(0, k, timeout=0.2)
        except RingTimeoutError:
            pass
        else:
            raise AssertionError("solo reader overwrote an unconsumed slot")
        for it in range(k):
            with ring.next_slot(timeout=5) as v:
                check_view(v, ring, 0, it)
        for it in range(k, 3 * k + 1):
            publish_batch(ring, 0, it, timeout=5)
            with ring.next_slot(timeout=5) as v:
                check_view(v, ring, 0, it)
        ring.stop()
        assert ring.next_slot(timeout=5) is None
        return {"slots": k}


def views(node, side, k: int = 2) -> dict:
    """Views kept past release and close stay readable (the window is not freed)."""
    ring = new_ring(node, k)
    if ring.is_reader:
        publish_batch(ring, 0, 0, n=6, min_size=1)
        kept = None
    else:
        v = ring.next_slot(timeout=10)
        kept = v.payload  # kept beyond release: the misuse close() must survive
        expect = kept.copy()
        v.release()
    ring.close()
    assert ring.closed
    if kept is not None:
        assert np.array_equal(kept, expect)  # still mapped, still the same bytes
    return {"kept": kept is not None}


def resize(node, side, k: int = 2) -> dict:
    """A batch too large for the slot; the node regrows the ring between batches."""
    with new_ring(node, k, payload_bytes=2000) as ring:
        if ring.is_reader:
            publish_batch(ring, 0, 0, n=2)
            w = ring.acquire_slot(0, 1)
            payload, offsets, labels, keys = make_batch(0, 1, n=20, min_size=200)
            try:
                w.write(payload, offsets, labels, keys)
            except SlotCapacityError as exc:
                needed = exc.needed
            else:
                raise AssertionError("a batch larger than the slot was accepted")
            w.discard()
            try:
                ring.resize(payload_bytes=needed)  # a worker still holds slot 0: refused
            except RingError as exc:
                refused = str(exc)
            else:
                raise AssertionError("resize went ahead while a worker held a slot")
            ring.resize(payload_bytes=needed)
            assert ring.layout.payload_capacity == needed
            publish_batch(ring, 0, 1, n=20, min_size=200)
            return {"needed": needed, "refused": refused}
        v = ring.next_slot(timeout=10)
        check_view(v, ring, 0, 0, n=2)
        try:
            ring.resize()
        except RingError as exc:
            assert f"node rank {ring.rank} still holds 1 slot" in str(exc), str(exc)
        else:
            raise AssertionError("resize went ahead while this worker held a slot")
        v.release()
        ring.resize()
        with ring.next_slot(timeout=10) as v:
            check_view(v, ring, 0, 1, n=20, min_size=200)
        assert ring.next_slot(timeout=10) is None
        return {}


def config(node, side, k: int = 2) -> dict:
    """Bad ring configurations raise ConfigError on every rank alike (nobody hangs)."""
    rank = node.Get_rank()
    attempts = {
        "mismatch": dict(reader_rank=rank % 2, slots=2, payload_bytes=100, max_records=4),
        "sizes": dict(reader_rank=0, slots=2),
        "workers": dict(reader_rank=0, slots=2, payload_bytes=100, max_records=4,
                        workers=[1, 1]),
        "slots": dict(reader_rank=0, slots=0, payload_bytes=100, max_records=4),
    }
    errors = {}
    for name, kw in attempts.items():
        try:
            BatchRing.create(node, **kw)
        except ConfigError as exc:
            errors[name] = str(exc)
        else:
            raise AssertionError(f"{name}: a bad ring configuration was accepted")
    with new_ring(node, k) as ring:  # the node is still in step afterwards
        if ring.is_reader:
            publish_batch(ring, 0, 0)
        else:
            with ring.next_slot(timeout=10) as v:
                check_view(v, ring, 0, 0)
    return errors


SCENARIOS = {"roundtrip": roundtrip, "hold": hold, "corrupt": corrupt, "capacity": capacity,
             "solo": solo, "views": views, "resize": resize, "config": config}


def main() -> None:
    global CHECKSUM
    args = sys.argv[2:]
    if args and args[0].startswith("--checksum="):
        CHECKSUM = args.pop(0).partition("=")[2]
    world = MPI.COMM_WORLD
    n_nodes = int(sys.argv[1])
    node_index = world.Get_rank() * n_nodes // world.Get_size()
    node = world.Split(node_index, world.Get_rank())
    side = node.Dup()  # the test's own synchronisation, apart from the ring's messages
    for spec in args:
        name, _, arg = spec.partition(":")
        t0 = time.perf_counter()
        result = SCENARIOS[name](node, side, *([int(arg)] if arg else []))
        emit({"scenario": spec, "node": node_index, "node_rank": node.Get_rank(),
              "seconds": round(time.perf_counter() - t0, 3), **result})
    side.Free()
    node.Free()


if __name__ == "__main__":
    main()
