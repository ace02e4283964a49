"""Batch codecs through a node's ring, reached through the batch codec registry: the ring
transports it names (:class:`~lmdbio.codecs.registry.RingTransport`), IBP's, the refusals
that name the file and the record, and a reader that knows no codec by name (one rank: its
own reader and worker)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from bench.lmdbgen import read_pylmdb, write_db
from lmdbio.codecs import registry
from lmdbio.codecs.ibp.transport import compress_parts, fit_transport_model
from lmdbio.codecs.registry import BATCH_CODECS, BatchCodecSpec, RingCodec
from lmdbio.config import load_config
from lmdbio.errors import ConfigError
from lmdbio.io.gather import gather_keys, gather_refs
from lmdbio.lmdb import Database
from lmdbio.plan.strategies import node_level
from lmdbio.reader import ReadSession
from lmdbio.run_plan import RunPlan
from lmdbio.topology import Topology


def _rows(db: Database, n: int) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """The first ``n`` values back to back, their bounds, and their keys (bounds, bytes)."""
    refs = db.record_table(0, n).refs()
    payload, offsets = gather_refs(db, refs)
    return payload, offsets, gather_keys(db, refs)


def test_ring_transports_are_named_by_transport_codecs_only():
    assert BATCH_CODECS["none"].ring_transport() is None  # raw batches
    for spec in BATCH_CODECS.values():
        if spec.ring is not None:
            assert spec.transport, spec.name
            transport = spec.ring_transport()
            assert transport is not None and isinstance(transport.title, str)
    with pytest.raises(ValueError, match="transport=False"):
        BatchCodecSpec("x", "a storage format", None, transport=False, ring="m:T")


def test_each_ring_codec_encodes_parts_its_rebuilt_copy_decodes(ibp_rows_db: Path):
    """Fitted on the reader, rebuilt from its bytes on a worker: each part decodes to its
    own records; the slot size covers every part."""
    with Database(ibp_rows_db) as db:
        payload, offsets, keys = _rows(db, 10)
        for spec in BATCH_CODECS.values():
            transport = spec.ring_transport()
            if transport is None:
                continue
            fitted = transport.fit(db, {})
            assert isinstance(fitted, RingCodec)
            worker = transport.from_bytes(fitted.to_bytes())
            counts = np.array([4, 6])
            blobs = fitted.encode_parts(payload, offsets, counts, keys=keys, where="x")
            assert len(blobs) == 2
            assert sum(b.nbytes for b in blobs) <= fitted.slot_bytes(10, 2,
                                                                     int(offsets[-1]))
            got = [worker.decode_part(b, int(c)) for b, c in zip(blobs, counts, strict=True)]
            assert np.array_equal(np.concatenate(got), payload[:int(offsets[-1])])


def test_ibp_refusals_name_the_file_the_keys_and_what_was_expected(tmp_path: Path,
                                                                   ibp_rows_db: Path):
    empty = tmp_path / "empty"
    write_db(empty, [])
    with Database(empty) as db, pytest.raises(ConfigError, match=f"{empty}.*no records"):
        fit_transport_model(db, {})
    mixed = tmp_path / "mixed"
    write_db(mixed, [(b"a", b"x" * 8), (b"b", b"x" * 8), (b"c", b"x" * 9)])
    with Database(mixed) as db, pytest.raises(ConfigError) as err:
        fit_transport_model(db, {})
    assert str(mixed) in str(err.value) and "fixed-size" in str(err.value)
    assert "key b'a' holds 8 bytes, key b'c' 9" in str(err.value)
    with Database(ibp_rows_db) as db:
        model = fit_transport_model(db, {})
        payload, offsets, keys = _rows(db, 3)
    short = offsets.copy()
    short[2:] -= 1  # the second record one byte short
    with pytest.raises(ConfigError, match=r"key b'000001' in f\.mdb holds 127 bytes, the "
                                          r"transport model's rows 128"):
        compress_parts(model, payload, short, np.array([3]), keys=keys, where="f.mdb")
    with pytest.raises(ConfigError, match="record 1 of the batch in the database"):
        compress_parts(model, payload, short, np.array([3]))
    offset_sum = offsets.copy()
    offset_sum[2] -= 1  # the second record one byte short, the third one byte long: the
    # total is right, only every record's size tells
    with pytest.raises(ConfigError, match="record 1 of the batch in the database holds 127"):
        compress_parts(model, payload, offset_sum, np.array([3]))


def test_a_ring_codec_needs_a_node_level_strategy(ibp_rows_db: Path, one_rank_topology: Topology):
    """A plan built in code past the configuration's check: the reader refuses it, naming
    the registry's node-level strategies."""
    assert node_level() == ("lmm", "dm-serial", "dm-spec", "indexed")
    plan = dataclasses.replace(_plan(ibp_rows_db, one_rank_topology), strategy="naive-stride")
    names = ", ".join(node_level())
    with pytest.raises(ConfigError, match=f"codec ibp .* node-level strategy \\({names}\\)"):
        ReadSession(str(ibp_rows_db), one_rank_topology, plan)


class _XorRing:
    """A second ring codec, known to nothing but the registry: every byte XOR 0x5A."""

    title: ClassVar[str] = "XOR"

    @classmethod
    def fit(cls, db: Any, options: dict[str, Any]) -> _XorRing:
        return cls()

    @classmethod
    def from_bytes(cls, blob: bytes) -> _XorRing:
        assert blob == b"xor"
        return cls()

    def to_bytes(self) -> bytes:
        return b"xor"

    def slot_bytes(self, rows: int, parts: int, raw_bytes: int) -> int:
        return raw_bytes

    def encode_parts(self, payload, offsets, counts, *, keys=None, where=""):
        bounds = np.concatenate(([0], np.cumsum(counts)))
        return [payload[offsets[a]:offsets[b]] ^ np.uint8(0x5A)
                for a, b in itertools.pairwise(bounds)]

    def decode_part(self, blob, count):
        return np.asarray(blob) ^ np.uint8(0x5A)


def _plan(path: Path, topo: Topology) -> RunPlan:
    cfg = load_config({"dataset": {"path": str(path), "layout": "tensor"},
                       "batch": {"size": 4}, "readers": {"strategy": "indexed"},
                       "codec": {"name": "ibp"}})
    return RunPlan.resolve(cfg, topo)


@pytest.mark.parametrize("codec", ["ibp", "xor"])
def test_the_reader_carries_any_registered_ring_codec(ibp_rows_db: Path,
                                                      one_rank_topology: Topology,
                                                      monkeypatch, codec: str):
    """The reader fits, shares and applies the codec its registry entry names, and the
    slot header carries its name: a second ring codec is one registry entry."""
    monkeypatch.setitem(registry.BATCH_CODECS, "xor", BatchCodecSpec(
        "xor", "test", None, transport=True, ring=f"{__name__}:_XorRing"))
    plan = dataclasses.replace(_plan(ibp_rows_db, one_rank_topology), codec=codec)
    values = [v for _, v in read_pylmdb(ibp_rows_db)]
    session = ReadSession(str(ibp_rows_db), one_rank_topology, plan)
    try:
        assert session.slot_codec == codec and isinstance(session.ring_codec, RingCodec)
        session.begin_epoch(0)
        for it in range(3):
            session.read_group(it, 1)
            got = session.receive(timeout=30)
            assert got is not None and got.view.codec == codec and got.view.encoded
            rows = [bytes(got.payload[a:b]) for a, b in itertools.pairwise(got.offsets)]
            assert rows == [values[i] for i in got.ids.tolist()]
            got.release()
            del got
    finally:
        session.stop()
        session.close()
