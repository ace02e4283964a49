"""The worker side of a node's ring (:mod:`lmdbio.slot_receiver`), on one rank (its own
reader and worker): slots received through the read session as they were published (through
the ring, or, for slots of spans, handed over in process), and a by-reference slot whose
spans lie outside the worker's mapping refused before any read, naming the file, its slot
released."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from bench.lmdbgen import read_pylmdb, write_db
from lmdbio.config import load_config
from lmdbio.lmdb import Database
from lmdbio.reader import ReadSession
from lmdbio.run_plan import RunPlan
from lmdbio.shm import SlotCorruptError
from lmdbio.slot_receiver import Delivered, SlotReceiver
from lmdbio.topology import Topology


def _session(path: Path, topo: Topology, transfer: str, *, ring: bool = True) -> ReadSession:
    """A one-rank session (a short timeout: a slot never released fails, not waits);
    ``ring``: its slots go through its ring, though it is their only worker."""
    cfg = load_config({"dataset": {"path": str(path), "layout": "tensor"},
                       "batch": {"size": 4}, "readers": {"strategy": "indexed",
                                                         "transfer": transfer,
                                                         "batches_per_slot": 1}})
    plan = dataclasses.replace(RunPlan.resolve(cfg, topo), timeout=20.0)
    session = ReadSession(str(path), topo, plan)
    assert session.alone_on_ring
    session.alone_on_ring = not ring
    return session


def _values(got: Delivered) -> list[bytes]:
    if got.lengths is None:
        return [bytes(got.payload[a:b]) for a, b in itertools.pairwise(got.offsets)]
    return [bytes(got.payload[a:a + n]) for a, n in zip(got.offsets, got.lengths, strict=True)]


@pytest.mark.parametrize("ring", [True, False], ids=["ring", "in-process"])
@pytest.mark.parametrize("transfer", ["copy", "spans"])
def test_each_slot_is_received_as_it_was_published(ibp_rows_db: Path, one_rank_topology: Topology,
                                                   transfer: str, ring: bool):
    """Slots of copies always travel through the ring; slots of spans that this rank
    reads for itself are handed over in process unless it is told to use the ring."""
    records = read_pylmdb(ibp_rows_db)
    session = _session(ibp_rows_db, one_rank_topology, transfer, ring=ring)
    try:
        assert isinstance(session.receiver, SlotReceiver)
        assert session.by_reference == (transfer == "spans")
        assert session.hands_to_itself == (transfer == "spans" and not ring)
        held = []
        session.begin_epoch(0)
        assert not session.poll()
        for it in range(3):
            session.read_group(it, 1)
            assert session.poll()
            got = session.receive(timeout=30)
            assert got is not None and (got.epoch, got.iteration, got.batches) == (0, it, 1)
            assert (got.lengths is not None) == (transfer == "spans") and got.values_checked
            assert _values(got) == [records[i][1] for i in got.ids.tolist()]
            assert got.keys() == [records[i][0] for i in got.ids.tolist()]
            assert (got.view is None) == session.hands_to_itself  # nothing of the ring
            sizes = [len(v) for v in _values(got)]
            n = len(sizes)
            assert got.value_bytes(1, n) == sum(sizes[1:])
            assert got.value_bytes_at(np.array([0, 1, n])).tolist() == \
                [0, sizes[0], sum(sizes)]
            got.release()
            held.append(got)  # in process: nothing to give back, no slot to run out of
        assert not session.poll()
    finally:
        session.stop()
        session.close()
    assert session.receiver is None


def test_spans_outside_the_mapping_are_refused_and_the_slot_released(
        ibp_rows_db: Path, one_rank_topology: Topology, tmp_path: Path):
    """A worker whose mapping of the file is smaller than its reader's (a truncated copy):
    the slot's spans are checked before any read."""
    small = tmp_path / "small"
    write_db(small, [])  # two meta pages: every record of the other file lies past them
    session = _session(ibp_rows_db, one_rank_topology, "spans")
    try:
        assert session.ring is not None
        session.begin_epoch(0)
        with Database(small) as other:
            receiver = SlotReceiver(session.ring, other, None)
            session.read_group(0, 1)
            size = other.buf.shape[0]
            with pytest.raises(SlotCorruptError, match=f"span lies outside the {size}-byte "
                                                       f"mapping of {other.path}"):
                receiver.receive(timeout=30)
        # the refused slot was released: the reader fills every slot of the ring again
        for it in range(1, session.run_plan.prefetch_depth + 2):
            session.read_group(it, 1)
            got = session.receive(timeout=30)
            assert got is not None and got.iteration == it
            got.release()
    finally:
        session.stop()
        session.close()
