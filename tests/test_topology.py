"""lmdbio.topology: node / reader / worker splits at 1, 2 and 4 ranks, real and simulated nodes.

The MPI cases run ``tests/mpi/topology_check.py`` under ``mpiexec`` (one run per world size,
many configurations per run) and compare every rank's view - and the membership of the
communicators themselves - with tables written out by hand from the specification.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_harness import run_mpi

from lmdbio.errors import ConfigError
from lmdbio.topology import (
    DEDICATED_FROM_RANKS,
    auto_mode,
    reader_groups,
    simulated_node_bounds,
)

# --------------------------------------------------------------------------- pure


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.data())
def test_simulated_node_bounds_partition(world: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, world))
    bounds = simulated_node_bounds(world, k)
    assert len(bounds) == k
    assert bounds[0][0] == 0 and bounds[-1][1] == world
    for (_, hi), (lo, _) in itertools.pairwise(bounds):
        assert hi == lo  # consecutive, no gap, no overlap
    sizes = [hi - lo for lo, hi in bounds]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger nodes come first


def test_auto_mode_is_colocated_on_small_nodes_and_dedicated_on_large_ones() -> None:
    assert DEDICATED_FROM_RANKS == 8
    assert [auto_mode(n) for n in range(1, 8)] == ["colocated"] * 7
    assert [auto_mode(n) for n in (8, 16, 64)] == ["dedicated"] * 3


@pytest.mark.parametrize(("mode", "device", "gpus", "want"), [
    ("auto", "cpu", 1, "auto"),           # the topology resolves it by node size
    ("auto", "cuda", 0, "colocated"),     # every rank drives a device
    ("auto", "auto", 2, "colocated"),
    ("auto", "auto", 0, "auto"),
    ("dedicated", "cuda", 1, "dedicated"),  # asked for: kept
    ("colocated", "cpu", 0, "colocated"),
])
def test_the_loader_asks_for_colocated_readers_for_gpu_workers(monkeypatch, mode, device,
                                                              gpus, want) -> None:
    import sys
    import types

    from lmdbio.config import load_config
    from loaders.options import reader_mode

    runtime = types.SimpleNamespace(getDeviceCount=lambda: gpus)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=runtime)))
    cfg = load_config({"dataset": {"path": "/data/x", "layout": "caffe-datum"},
                       "readers": {"mode": mode}, "workers": {"device": device}})
    assert reader_mode(cfg) == want


def test_reader_groups_chosen_per_node() -> None:
    assert [reader_groups(0, "colocated", n) for n in (1, 2, 7)] == [1, 2, 7]
    assert [reader_groups(0, "dedicated", n) for n in (2, 8, 16)] == [1, 1, 1]
    assert [reader_groups(k, "dedicated", 4) for k in (1, 2, 4, 9)] == [1, 2, 4, 4]


def test_simulated_node_bounds_examples() -> None:
    assert simulated_node_bounds(4, 3) == [(0, 2), (2, 3), (3, 4)]
    assert simulated_node_bounds(7, 2) == [(0, 4), (4, 7)]
    assert simulated_node_bounds(5, 5) == [(i, i + 1) for i in range(5)]


@pytest.mark.parametrize("k", [0, -1, 5, 9])
def test_simulated_node_bounds_rejects(k: int) -> None:
    with pytest.raises(ConfigError, match="simulate_nodes"):
        simulated_node_bounds(4, k)


# --------------------------------------------------------------------------- MPI

# Each case: build() kwargs -> expected per-rank
# (node_index, local_rank, is_reader, is_worker, mode) and the world ranks of the readers and
# workers communicators, plus n_nodes.
CASES_4 = [
    (
        {},  # one real node of 4, dedicated, one reader
        [(0, 0, True, False, "dedicated"), (0, 1, False, True, "dedicated"),
         (0, 2, False, True, "dedicated"), (0, 3, False, True, "dedicated")],
        [0], [1, 2, 3], 1,
    ),
    (
        {"mode": "colocated"},
        [(0, 0, True, True, "colocated"), (0, 1, False, True, "colocated"),
         (0, 2, False, True, "colocated"), (0, 3, False, True, "colocated")],
        [0], [0, 1, 2, 3], 1,
    ),
    (
        {"simulate_nodes": 2},
        [(0, 0, True, False, "dedicated"), (0, 1, False, True, "dedicated"),
         (1, 0, True, False, "dedicated"), (1, 1, False, True, "dedicated")],
        [0, 2], [1, 3], 2,
    ),
    (
        {"simulate_nodes": 2, "mode": "colocated"},
        [(0, 0, True, True, "colocated"), (0, 1, False, True, "colocated"),
         (1, 0, True, True, "colocated"), (1, 1, False, True, "colocated")],
        [0, 2], [0, 1, 2, 3], 2,
    ),
    (
        {"simulate_nodes": 3},  # uneven: 2 + 1 + 1; single-rank nodes fall back
        [(0, 0, True, False, "dedicated"), (0, 1, False, True, "dedicated"),
         (1, 0, True, True, "colocated"), (2, 0, True, True, "colocated")],
        [0, 2, 3], [1, 2, 3], 3,
    ),
    (
        {"simulate_nodes": 4},
        [(i, 0, True, True, "colocated") for i in range(4)],
        [0, 1, 2, 3], [0, 1, 2, 3], 4,
    ),
    (
        {"simulate_nodes": 1, "readers_per_node": 2},  # two reader groups of two
        [(0, 0, True, False, "dedicated"), (0, 1, False, True, "dedicated"),
         (1, 0, True, False, "dedicated"), (1, 1, False, True, "dedicated")],
        [0, 2], [1, 3], 2,
    ),
    (
        {"readers_per_node": 2, "mode": "colocated"},  # a real node cut in two groups
        [(0, 0, True, True, "colocated"), (0, 1, False, True, "colocated"),
         (1, 0, True, True, "colocated"), (1, 1, False, True, "colocated")],
        [0, 2], [0, 1, 2, 3], 2,
    ),
    (
        {"readers_per_node": 3, "mode": "colocated"},  # uneven: 2 + 1 + 1
        [(0, 0, True, True, "colocated"), (0, 1, False, True, "colocated"),
         (1, 0, True, True, "colocated"), (2, 0, True, True, "colocated")],
        [0, 2, 3], [0, 1, 2, 3], 3,
    ),
    (
        {"simulate_nodes": 2, "readers_per_node": 2},  # groups of one: dedicated falls back
        [(0, 0, True, True, "colocated"), (1, 0, True, True, "colocated"),
         (2, 0, True, True, "colocated"), (3, 0, True, True, "colocated")],
        [0, 1, 2, 3], [0, 1, 2, 3], 4,
    ),
    (
        {"readers_per_node": 9, "mode": "colocated"},  # clamped: a group per rank
        [(i, 0, True, True, "colocated") for i in range(4)],
        [0, 1, 2, 3], [0, 1, 2, 3], 4,
    ),
    (
        {"readers_per_node": 0, "mode": "auto"},  # chosen: 4 ranks run colocated, a reader each
        [(i, 0, True, True, "colocated") for i in range(4)],
        [0, 1, 2, 3], [0, 1, 2, 3], 4,
    ),
    (
        {"readers_per_node": 0},  # chosen on a dedicated node: its one reader
        [(0, 0, True, False, "dedicated"), (0, 1, False, True, "dedicated"),
         (0, 2, False, True, "dedicated"), (0, 3, False, True, "dedicated")],
        [0], [1, 2, 3], 1,
    ),
]
CASES_2 = [
    ({}, [(0, 0, True, False, "dedicated"), (0, 1, False, True, "dedicated")], [0], [1], 1),
    ({"readers_per_node": 2, "mode": "colocated"},
     [(0, 0, True, True, "colocated"), (1, 0, True, True, "colocated")], [0, 1], [0, 1], 2),
    ({"mode": "colocated"},
     [(0, 0, True, True, "colocated"), (0, 1, False, True, "colocated")], [0], [0, 1], 1),
    ({"simulate_nodes": 2},
     [(0, 0, True, True, "colocated"), (1, 0, True, True, "colocated")], [0, 1], [0, 1], 2),
]
CASES_1 = [
    ({}, [(0, 0, True, True, "colocated")], [0], [0], 1),  # dedicated falls back
    ({"simulate_nodes": 1, "mode": "colocated"}, [(0, 0, True, True, "colocated")], [0], [0], 1),
]
# (kwargs, expected message, smallest world size where it is an error)
ERRORS = [
    ({"simulate_nodes": 99}, "topology.simulate_nodes (--simulate-nodes) = 99 is more than the", 1),
    ({"mode": "bogus"}, "mode must be one of", 1),
    ({"readers_per_node": -1}, "readers_per_node must be >= 0", 1),
    # rank 0 differs from the others: must raise everywhere, not deadlock
    ({"per_rank": {"readers_per_node": [2, 1, 1, 1]}}, "got different arguments", 2),
]


def _host_node(n: int, kwargs: dict, rank: int) -> list[int]:
    """The world ranks of ``rank``'s node before reader groups: its simulated node, or the
    one host."""
    bounds = simulated_node_bounds(n, kwargs.get("simulate_nodes") or 1)
    return next(list(range(lo, hi)) for lo, hi in bounds if lo <= rank < hi)


def _check_case(run, n: int, index: int, case) -> None:
    kwargs, per_rank, readers, workers, n_nodes = case
    for rank in range(n):
        objs = [o for o in run.results[rank] if o.get("case") == index]
        got, closed = objs[0], objs[1]
        d = got["describe"]
        node_index, local_rank, is_reader, is_worker, mode = per_rank[rank]
        ctx = f"case {kwargs} rank {rank}: {d}"
        assert d["rank"] == rank and d["size"] == n, ctx
        assert (d["node_index"], d["local_rank"], d["is_reader"], d["is_worker"], d["mode"]) == (
            node_index, local_rank, is_reader, is_worker, mode), ctx
        assert d["n_nodes"] == n_nodes, ctx
        assert d["simulated"] == bool(kwargs.get("simulate_nodes")), ctx
        node_members = [r for r in range(n) if per_rank[r][0] == node_index]
        assert got["members"]["node"] == node_members, ctx
        assert d["node_world_ranks"] == node_members, ctx
        assert d["local_size"] == len(node_members), ctx
        # the communicators really contain the expected ranks, in world-rank order
        assert got["members"].get("readers") == (readers if is_reader else None), ctx
        assert got["members"].get("workers") == (workers if is_worker else None), ctx
        assert d["n_readers"] == len(readers) and d["n_workers"] == len(workers), ctx
        assert d["reader_rank"] == (readers.index(rank) if is_reader else -1), ctx
        assert d["worker_rank"] == (workers.index(rank) if is_worker else -1), ctx
        local_workers = [per_rank[r][1] for r in node_members if per_rank[r][3]]
        assert d["node_workers"] == local_workers, ctx
        host = _host_node(n, kwargs, rank)
        assert d["readers_per_node"] == len({per_rank[r][0] for r in host}), ctx
        assert d["simulated"] == bool(kwargs.get("simulate_nodes")), ctx
        assert d["host_nodes"] == (kwargs.get("simulate_nodes") or 1), ctx
        bounds = simulated_node_bounds(n, kwargs.get("simulate_nodes") or 1)
        assert d["host_node"] == next(i for i, (lo, hi) in enumerate(bounds)
                                      if lo <= rank < hi), ctx
        # the device: this worker's index among the workers of its host (or simulated)
        # node, whatever reader groups cut it into
        host_workers = [r for r in _host_node(n, kwargs, rank) if per_rank[r][3]]
        assert d["device_index"] == (host_workers.index(rank) if is_worker else -1), ctx
        # the launcher is seen as Open MPI with the same world rank
        assert d["launcher"]["name"] == "openmpi" and d["launcher"]["rank"] == rank, ctx
        assert closed == {"case": index, "closed": True, "node_null": True, "rank": rank}


@pytest.mark.parametrize(
    ("n", "cases"), [(1, CASES_1), (2, CASES_2), (4, CASES_4)], ids=["1rank", "2ranks", "4ranks"]
)
@pytest.mark.mpiexec
def test_topology_splits(n: int, cases) -> None:
    errors = [e for e in ERRORS if n >= e[2]]
    configs = [c[0] for c in cases] + [e[0] for e in errors]
    run = run_mpi(n, "topology_check.py", [json.dumps(configs)], timeout=60)
    for i, case in enumerate(cases):
        _check_case(run, n, i, case)
    for j, (_, message, _) in enumerate(errors):
        index = len(cases) + j
        for rank in range(n):
            obj = next(o for o in run.results[rank] if o.get("case") == index)
            assert obj.get("error", "").startswith("ConfigError"), obj
            assert message in obj["error"], obj
    # every world size has a dedicated case that falls back; the fallback is logged, but
    # not in a job of one process, which has no other way to run
    assert ("runs in colocated mode" in run.stderr) == (n > 1), run.stderr
