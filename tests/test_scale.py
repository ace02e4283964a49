"""lmdbio.scale: the traced page sets, the model's sanity, the cost files, plan-scale."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.lmdbgen import random_items, write_db
from lmdbio.errors import ConfigError
from lmdbio.lmdb import Database
from lmdbio.scale import Costs, epoch_time, load_costs, trace
from lmdbio.scale.costs import costs_from_mapping
from lmdbio.scale.model import actor_cpu_seconds

FS = Costs(fs_latency_s=5e-4, fs_node_bandwidth_bps=2e9, fs_aggregate_bandwidth_bps=2e10,
           readahead_bytes=128 << 10, cpu_walk_s=1e-7, cpu_skip_s=1e-8, cpu_page_s=1e-7,
           cpu_step_s=1e-5, copy_s_per_byte=1e-10, handoff_s_per_slot=1e-5)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory) -> Path:
    """3,000 records of 3,072 B (one overflow page each), 1,000 a commit."""
    d = tmp_path_factory.mktemp("scale") / "cifar"
    d.mkdir()
    write_db(d, random_items(3000, 3072, seed=3), map_size=1 << 28, commit_every=1000)
    return d


def _table(path: Path):
    with Database(path, pin_snapshot=False) as db:
        return db.record_table(), db.psize, db.leaves()


def test_indexed_reads_exactly_its_records_pages(cifar: Path) -> None:
    """Independent count from the record table: a reader of ``indexed`` touches its
    records' leaves and value pages, nothing else."""
    tr = trace(cifar, "indexed", 4, 2, 16, iterations=10, batches_per_slot=1)
    table, psize, _ = _table(cifar)
    for a in tr.actors:
        steps = tr.actor_steps(a.index)
        touched = np.unique(np.concatenate([np.r_[s.tree_pages, s.value_pages]
                                            for s in steps]))
        # node a.node's consumers are ranks 2a, 2a+1: 32 consecutive records an iteration
        ids = np.concatenate([np.arange(it * 64 + 32 * a.node, it * 64 + 32 * a.node + 32)
                              for it in range(10)])
        first = table.val_off[ids] // psize
        last = (table.val_off[ids] + table.val_len[ids] - 1) // psize
        expect = np.unique(np.r_[table.leaf_pg[ids], first, last])
        assert np.array_equal(touched, expect)
    assert all(p["extra_pages"] == 0 for p in tr.page_totals())


def test_lmm_walks_the_leaves_of_every_record_before_its_last(cifar: Path) -> None:
    """LMM's reader 1 walks record by record from the first record: its leaf pages are
    those of records 0 .. its last one (and at most the next leaf, where the cursor
    stops)."""
    tr = trace(cifar, "lmm", 4, 4, 8, iterations=6, batches_per_slot=1)
    table, _, leaves = _table(cifar)
    a = tr.actors[1]
    steps = tr.actor_steps(a.index)
    got = np.intersect1d(np.unique(np.concatenate([s.tree_pages for s in steps])), leaves)
    last = 5 * 32 + 8 + 7  # iteration 5, node 1's 8 records
    expect = np.unique(table.leaf_pg[:last + 1])
    assert np.isin(expect, got).all()
    assert np.setdiff1d(got, expect).size <= 1


def test_pages_match_the_strategies_own_counts(cifar: Path) -> None:
    """The traced totals agree with the counts the strategies report (dm-spec's own
    prefetch figures come from the strategy itself) and are consistent."""
    for s in ("naive-stride", "naive-contig", "lmm", "dm-serial", "dm-spec", "indexed"):
        tr = trace(cifar, s, 4, 2, 8, iterations=8, batches_per_slot=1)
        for p in tr.page_totals():
            assert p["pages_touched"] == p["own_pages"] + p["extra_pages"]
        assert sum(st.records for st in tr.steps) == 8 * 4 * 8


def test_lmm_extra_pages_grow_with_readers_dm_stay_near_zero(cifar: Path) -> None:
    def extra(strategy: str, readers: int) -> int:
        tr = trace(cifar, strategy, readers, readers, max(1, 256 // readers),
                   iterations=8, batches_per_slot=1)
        return sum(p["extra_pages"] for p in tr.page_totals())

    lmm = [extra("lmm", r) for r in (2, 4, 8)]
    assert lmm[0] < lmm[1] < lmm[2]
    for s in ("dm-serial", "dm-spec"):
        assert all(extra(s, r) <= 2 * r for r in (2, 8))  # the leaf the cursor stops on
    assert extra("indexed", 8) == 0


def test_model_sanity(cifar: Path) -> None:
    tr = trace(cifar, "dm-serial", 8, 4, 8, iterations=8, batches_per_slot=1)
    free = epoch_time(tr, Costs(mpi_latency_s=0.0, mpi_bandwidth_bps=float("inf")))
    assert free.seconds == 0.0
    slow = epoch_time(tr, FS.replace(fs_latency_s=2e-3)).seconds
    assert slow > epoch_time(tr, FS).seconds > 0
    spec = epoch_time(trace(cifar, "dm-spec", 8, 4, 8, iterations=8, batches_per_slot=1),
                      FS)
    assert spec.seconds < epoch_time(tr, FS).seconds  # the prefetch takes I/O off the chain
    # every node reads at least the pages of its own records
    assert sum(free.node_fs_bytes) >= sum(p["own_pages"] for p in free.pages) * tr.psize
    lmm4 = epoch_time(trace(cifar, "lmm", 4, 4, 8, iterations=8, batches_per_slot=1), FS)
    assert lmm4.breakdown["io"] > 0 and lmm4.samples_per_second > 0


def test_cpu_per_actor_is_what_the_calibration_fits_on(cifar: Path) -> None:
    """``actor_cpu_seconds`` is linear in the CPU costs (the fit's premise); on one rank
    with a free file system it is the whole critical path, and every delivered record
    pays ``consume_s_per_record`` once."""
    cpu = Costs(mpi_latency_s=0.0, cpu_walk_s=1e-7, cpu_step_s=1e-5, copy_s_per_byte=1e-10,
                consume_s_per_record=5e-7)
    one = trace(cifar, "lmm", 1, 1, 16, iterations=12, batches_per_slot=4)
    got = actor_cpu_seconds(one, cpu)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(epoch_time(one, cpu).extra["traced_seconds"])
    halves = [actor_cpu_seconds(one, cpu.replace(**{k: getattr(cpu, k) / 2}))
              for k in ("cpu_walk_s", "cpu_step_s", "copy_s_per_byte", "consume_s_per_record")]
    assert sum(h[0] for h in halves) == pytest.approx(3.5 * got[0])  # 4 less half of 1
    records = sum(s.records for s in one.steps)
    only = actor_cpu_seconds(one, Costs(consume_s_per_record=1.0))
    assert only[0] == pytest.approx(records)
    two = trace(cifar, "naive-stride", 2, 2, 16, iterations=12)
    assert actor_cpu_seconds(two, cpu).shape == (2,)


def test_cost_files(tmp_path: Path) -> None:
    good = tmp_path / "fs.yaml"
    good.write_text("source: a note\ncosts:\n  fs_latency_s: 0.001\n  readahead_bytes: 8192\n")
    c = load_costs(good)
    assert c.fs_latency_s == 0.001 and c.readahead_bytes == 8192
    for text, msg in (("fs_latncy_s: 1\n", "unknown cost"), ("fs_latency_s: -1\n", ">= 0"),
                      ("fs_latency_s: fast\n", "must be a number"), ("[1, 2\n", "YAML"),
                      ("- 1\n", "mapping"), ("fs_async_depth: 0\n", "> 0")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=msg):
            load_costs(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_costs(tmp_path / "none.yaml")
    with pytest.raises(ConfigError):
        costs_from_mapping({"cpu_walk_s": True})


def test_bad_jobs(cifar: Path) -> None:
    with pytest.raises(ConfigError, match="nodes"):
        trace(cifar, "lmm", 2, 3, 8)
    with pytest.raises(ConfigError, match="unknown strategy"):
        trace(cifar, "fast", 2, 1, 8)
    with pytest.raises(ConfigError, match="ranks"):
        trace(cifar, "lmm", 0, 1, 8)


def test_plan_scale_cli(cifar: Path, tmp_path: Path, capsys) -> None:
    from lmdbio.cli import main

    out = tmp_path / "p.json"
    assert main(["plan-scale", str(cifar), "--ranks", "8", "--nodes", "2",
                 "--iterations", "4", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["strategies"]) == {"naive-stride", "naive-contig", "lmm", "dm-serial",
                                      "dm-spec", "indexed"}
    for r in doc["strategies"].values():
        assert r["epoch_seconds"] > 0 and r["samples_per_second"] > 0
        assert len(r["fs_bytes_per_node"]) == 2
    assert doc["job"]["global_batch"] == 8 * 512
    assert "samples/s" in capsys.readouterr().out
    assert main(["plan-scale", str(cifar), "--ranks", "2", "--nodes", "4"]) == 2
    assert "more than --ranks" in capsys.readouterr().err
    assert main(["plan-scale", str(tmp_path / "nodb"), "--ranks", "2", "--nodes", "1"]) == 2
    assert "no such LMDB" in capsys.readouterr().err
    fs = tmp_path / "fs.yaml"
    fs.write_text("fs_latncy_s: 1\n")
    assert main(["plan-scale", str(cifar), "--ranks", "2", "--nodes", "1",
                 "--fs", str(fs)]) == 2
    assert "unknown cost" in capsys.readouterr().err
    assert main(["plan-scale", str(cifar), "--ranks", "2", "--nodes", "1",
                 "--strategies", "lmm,fast"]) == 2


def test_a_read_around_window_ends_at_the_files_last_page() -> None:
    """A fault near the end reads its aligned window only up to the file's last page (the
    model counted one page past it, 31.50 against 31.49 MiB read by a real 2-host run)."""
    from lmdbio.scale.model import NodePageCache

    node = NodePageCache(10)  # pages 0 .. 9
    assert node.fault(np.array([9]), 4) == (2, 1)  # the window 8 .. 11 holds pages 8, 9
    assert node.fault(np.array([1]), 4) == (4, 1)


def test_a_waiting_reader_notices_its_cursor_at_its_next_test() -> None:
    """``poll_delay`` follows ``wait_with_timeout``'s schedule: tests at 0, then after
    sleeps of 50, 100, 200 and 400 us, each longer by the overshoot; past them, sleeps of
    500 us (plus the overshoot) in a random phase: half of one on average."""
    from lmdbio.scale.model import poll_delay

    exact = Costs(poll_first_sleep_s=50e-6, poll_max_sleep_s=500e-6, poll_overshoot_s=0.0)
    for waited, delay in ((0.0, 0.0), (-1.0, 0.0), (30e-6, 20e-6), (50e-6, 0.0),
                          (60e-6, 90e-6), (700e-6, 50e-6), (1e-3, 250e-6),
                          (10.1e-3, 250e-6)):
        assert poll_delay(waited, exact) == pytest.approx(delay, abs=1e-12), waited
    slack = exact.replace(poll_overshoot_s=10e-6)  # tests at 60, 170, 380, 790 us, ...
    assert poll_delay(700e-6, slack) == pytest.approx(90e-6)
    assert poll_delay(1e-3, slack) == pytest.approx(255e-6)
    with pytest.raises(ConfigError, match="poll_max_sleep_s"):
        Costs(poll_first_sleep_s=1e-3, poll_max_sleep_s=5e-4)


def test_the_model_waits_for_the_cursor_as_the_dm_readers_do() -> None:
    """The model's default polling is lmdbio's own (``dm.wait_for_cursor``): the same
    longest sleep, and an overshoot that is more than the timer slack the readers ask for
    (the slack is how late a sleep may end; the wake-up comes on top)."""
    from lmdbio.plan.strategies import dm

    costs = Costs()
    assert costs.poll_max_sleep_s == dm.CURSOR_MAX_SLEEP_S
    assert costs.poll_first_sleep_s == 5e-5  # wait_with_timeout's first sleep
    if dm.CURSOR_SLEEP_SLACK_S is not None:
        assert costs.poll_overshoot_s >= dm.CURSOR_SLEEP_SLACK_S


def test_the_chain_pays_for_polling_one_reader_does_not(cifar: Path) -> None:
    """Longer sleeps between a waiting reader's tests slow a chain of readers that wait
    for each other, never a lone reader (it receives no cursor)."""
    costs = FS.replace(cpu_skip_s=1e-6)  # a walk long enough that the next reader waits
    coarse = costs.replace(poll_first_sleep_s=1e-3, poll_max_sleep_s=1e-2)
    chain = trace(cifar, "dm-serial", 4, 4, 8, iterations=8, batches_per_slot=1)
    assert epoch_time(chain, coarse).seconds > epoch_time(chain, costs).seconds
    alone = trace(cifar, "dm-serial", 1, 1, 32, iterations=8, batches_per_slot=1)
    assert epoch_time(alone, coarse).seconds == epoch_time(alone, costs).seconds


def test_speculation_costs_dm_spec_per_read_and_contention_scales_all_cpu(cifar: Path
                                                                          ) -> None:
    """``cpu_speculate_s`` is paid once per read by dm-spec's readers and by no other
    strategy; ``cpu_contention_factor`` multiplies every CPU cost."""
    per_read = Costs(cpu_speculate_s=1.0)
    spec = trace(cifar, "dm-spec", 2, 2, 16, iterations=6, batches_per_slot=2)
    assert spec.speculates
    got = actor_cpu_seconds(spec, per_read)
    assert list(got) == [len(spec.actor_steps(a.index)) for a in spec.actors]
    for s in ("dm-serial", "indexed", "lmm"):
        other = trace(cifar, s, 2, 2, 16, iterations=6, batches_per_slot=2)
        assert not other.speculates and not actor_cpu_seconds(other, per_read).any()
    cpu = FS.replace(cpu_speculate_s=1e-4, consume_s_per_record=1e-7)
    assert actor_cpu_seconds(spec, cpu.replace(cpu_contention_factor=1.5)) == \
        pytest.approx(1.5 * actor_cpu_seconds(spec, cpu))


def test_a_cached_trace_is_the_trace_and_the_model_gives_the_same_epoch(
        cifar: Path, tmp_path: Path) -> None:
    """``cached_trace`` keeps a trace per database and arguments and gives it back
    unchanged; other arguments are another trace. Evaluating a trace twice (its page
    unions kept from the first) gives the same epoch."""
    from lmdbio.scale.trace import cached_trace

    cache = tmp_path / "traces"
    first = cached_trace(cache, cifar, "lmm", 4, 2, 16, iterations=6)
    assert len(list(cache.glob("*.pickle"))) == 1
    again = cached_trace(cache, cifar, "lmm", 4, 2, 16, iterations=6)
    assert again.page_totals() == first.page_totals() == \
        trace(cifar, "lmm", 4, 2, 16, iterations=6).page_totals()
    cached_trace(cache, cifar, "lmm", 4, 2, 16, iterations=5)
    assert len(list(cache.glob("*.pickle"))) == 2
    a, b = epoch_time(again, FS), epoch_time(again, FS)
    assert a.seconds == b.seconds == epoch_time(first, FS).seconds
    assert a.pages == b.pages


def test_page_accounting_costs_every_read_the_files_pages(cifar: Path) -> None:
    """``cpu_account_s_per_file_page`` is paid once per read per page of the file (bench
    read's accounting scans a bitmap of the whole file at every read), by every strategy,
    whatever the read's size."""
    per_page = Costs(cpu_account_s_per_file_page=1.0)
    for s in ("naive-stride", "lmm", "dm-spec", "indexed"):
        tr = trace(cifar, s, 2, 2, 16, iterations=6, batches_per_slot=2)
        got = actor_cpu_seconds(tr, per_page)
        assert list(got) == [tr.n_pages * len(tr.actor_steps(a.index)) for a in tr.actors]


def test_the_ring_probe_line_and_the_costs_the_fit_takes_as_known() -> None:
    """bench/ring_handoff.py's per-slot intercept and per-record slope come from a line
    over its slot sizes; the fit takes that intercept (median over the databases) and the
    page accounting as known, and fits neither (issue 38, third pass)."""
    from bench import ring_handoff, scale_calibrate

    sizes = [{"records_per_slot": n, "cpu_s_per_slot": 2e-4 + 5e-8 * n}
             for n in ring_handoff.SLOT_RECORDS]
    line = ring_handoff.fit_line(sizes)
    assert line["intercept_s"] == pytest.approx(2e-4)
    assert line["slope_s_per_record"] == pytest.approx(5e-8)
    assert line["worst_residual"] < 1e-9
    probe = {"slots": 400, "cifar": {"fit": {"intercept_s": 1e-4}},
             "mnist": {"fit": {"intercept_s": 3e-4}}, "imagenet": {"fit": {"intercept_s": 2e-4}}}
    assert ring_handoff.handoff_s_per_slot(probe) == pytest.approx(2e-4)
    assert "handoff_s_per_slot" in scale_calibrate.MEASURED_APART
    assert not set(scale_calibrate.MEASURED_APART) & set(scale_calibrate.FITTED)
    dbs = {"cifar": Path("c"), "mnist": Path("m")}
    known = scale_calibrate.measured_apart_costs(
        {"copy": {"cifar": {"account_s_per_file_page": 1e-9},
                  "mnist": {"account_s_per_file_page": 3e-9}},
         "ring": {"handoff_s_per_slot": 2e-4}}, dbs)
    assert known is not None
    assert known.cpu_account_s_per_file_page == pytest.approx(2e-9)
    assert known.handoff_s_per_slot == pytest.approx(2e-4)
    assert scale_calibrate.measured_apart_costs({}, dbs) is None
    # the configurations a rerun of the held-out runs measures again
    held = [c for c in scale_calibrate.time_configs(False, sizes=True)
            if scale_calibrate.held_out_somewhere(c)]
    assert {(c.db, c.ranks) for c in held} == {("cifar", 2), ("mnist", 2), ("imagenet", 1),
                                               ("imagenet", 2)}


def test_a_node_rings_slot_costs_once_per_slot_and_the_fit_varies_the_slot(cifar: Path
                                                                            ) -> None:
    """``cpu_slot_s`` is charged once per slot a node-level strategy's reader builds,
    whatever the slot's size, and never to a naive rank; the calibration's fit set holds
    1-rank runs at several slot sizes so that it can tell that cost from a cost per
    record, and none of them is held out by any split."""
    from bench import scale_calibrate

    per_slot = Costs(mpi_latency_s=0.0, cpu_slot_s=1.0)
    for slot in (1, 4):
        lmm = trace(cifar, "lmm", 1, 1, 16, iterations=12, batches_per_slot=slot)
        assert actor_cpu_seconds(lmm, per_slot)[0] == pytest.approx(12 / slot)
    naive = trace(cifar, "naive-stride", 1, 1, 16, iterations=12)
    assert actor_cpu_seconds(naive, per_slot)[0] == 0.0
    assert "cpu_slot_s" in scale_calibrate.FITTED
    sized = [c for c in scale_calibrate.time_configs(False, sizes=True) if c.batches_per_slot]
    assert {c.batches_per_slot for c in sized} == set(scale_calibrate.FIT_SLOT_SIZES)
    assert {c.strategy for c in sized} == set(scale_calibrate.NODE_STRATEGIES)
    assert all(c.role(split) == "fit" for c in sized for split in scale_calibrate.SPLITS)
    assert len({c.file("time", 3) for c in scale_calibrate.time_configs(False, sizes=True)}
               ) == len(scale_calibrate.time_configs(False, sizes=True))


def test_the_ring_hand_off_is_charged_only_to_nodes_of_several_ranks(cifar: Path) -> None:
    """A node of one rank hands its slots of spans to itself in process
    (``ReadSession.hands_to_itself``): no ring hand-off; a node of two ranks pays one per
    slot (its CPU shared by the node's two consumers, as the consuming is)."""
    handoff = Costs(mpi_latency_s=0.0, handoff_s_per_slot=1.0)
    alone = trace(cifar, "indexed", 2, 2, 16, iterations=12, batches_per_slot=4)
    assert alone.node_ranks == (1, 1)
    assert actor_cpu_seconds(alone, handoff).tolist() == [0.0, 0.0]
    shared = trace(cifar, "indexed", 2, 1, 16, iterations=12, batches_per_slot=4)
    assert shared.node_ranks == (2,)
    assert actor_cpu_seconds(shared, handoff)[0] == pytest.approx(12 / 4)
