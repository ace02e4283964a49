"""``lmdbio bench read`` end to end under ``mpiexec``: the command the reading engine is
judged by, with its default options (the job's ring slot size, accounting on).

Each case runs the console command on 4 ranks as 2 simulated nodes for two epochs of a
generated CIFAR-like database (3 KB values, one overflow page each, committed in several
transactions) and checks the JSON document rank 0 writes: the fields the issue names;
every epoch's records, over all consumers, are each record exactly once plus the declared
padding (``--last pad``), with the same number of records on every consumer; the
``iterations`` entries (one per ring slot) cover the requested iterations; indexed reads no
page beyond its records; the DM chains report their symmetric-mapping attempts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_harness import CLI_RUNS_SCRIPT, CLI_SCRIPT, run_mpi

from bench.lmdbgen import random_items, uneven_key_items, write_db
from bench.targets_check import check_document
from lmdbio.plan.epoch import iterations_per_epoch

pytestmark = [pytest.mark.timeout(240), pytest.mark.mpiexec]

RECORDS, BATCH, RANKS, NODES = 300, 8, 4, 2

CASES = [
    ("naive-stride", []),
    ("lmm", []),
    ("dm-serial", []),
    ("dm-spec", []),
    ("indexed", ["--shuffle", "block", "--seed", "5"]),
    ("dm-spec", ["--mode", "dedicated"]),
    ("dm-spec", ["--batches-per-slot", "1", "--no-symmetric"]),
    ("dm-spec", ["--transfer", "copy"]),
]


@pytest.fixture(scope="module")
def cifar_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench-cli") / "cifar"
    write_db(path, random_items(RECORDS, 3072, seed=21), commit_every=64)
    return path


def run_bench(db: Path, out: Path, strategy: str, extra: list[str], iters: int) -> dict:
    run_mpi(RANKS, CLI_SCRIPT, bench_argv(db, out, strategy, extra, iters), timeout=120)
    return json.loads(out.read_text())


def bench_argv(db: Path, out: Path, strategy: str, extra: list[str], iters: int) -> list[str]:
    return ["bench", "read", str(db), "--strategy", strategy, "--batch-size", str(BATCH),
            "--iters", str(iters), "--simulate-nodes", str(NODES), "--json", str(out),
            *extra]


def case_consumers(strategy: str, extra: list[str]) -> int:
    """Colocated by default: every rank consumes; dedicated: one consumer per 2-rank node."""
    dedicated = "dedicated" in extra
    return NODES if dedicated and not strategy.startswith("naive") else RANKS


@pytest.fixture(scope="module")
def case_documents(cifar_like: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> list[dict]:
    """The JSON document of ``lmdbio bench read`` for every case of CASES (two epochs
    each), all run by one 4-rank job."""
    out = tmp_path_factory.mktemp("bench-cli-docs")
    runs = [bench_argv(cifar_like, out / f"{k}.json", strategy, extra,
                       2 * iterations_per_epoch(RECORDS, case_consumers(strategy, extra),
                                                BATCH, "pad"))
            for k, (strategy, extra) in enumerate(CASES)]
    run_mpi(RANKS, CLI_RUNS_SCRIPT, [json.dumps(runs)], timeout=60 + 30 * len(runs))
    return [json.loads((out / f"{k}.json").read_text()) for k in range(len(CASES))]


@pytest.mark.parametrize(("strategy", "extra"), CASES,
                         ids=[" ".join([s, *e]) for s, e in CASES])
def test_bench_read_json(case_documents: list[dict], strategy: str,
                         extra: list[str]) -> None:
    dedicated = "dedicated" in extra
    consumers = case_consumers(strategy, extra)
    per_epoch = iterations_per_epoch(RECORDS, consumers, BATCH, "pad")
    doc = case_documents[CASES.index((strategy, extra))]

    assert (doc["strategy"], doc["ranks"], doc["nodes"]) == (strategy, RANKS, NODES)
    assert doc["mode"] == ("dedicated" if dedicated else "colocated")
    # the targets bench/targets.py sweeps: every epoch's records exactly once with the
    # declared padding, indexed without extra pages, dm-spec without missed pages
    assert check_document(doc) == []
    totals = doc["totals"]
    for key in ("records_per_second", "bytes_per_second", "extra_pages", "needed_pages",
                "setup_pages", "symmetric_mapping_attempts", "load_kernels_seconds"):
        assert key in totals, key
    assert totals["records_delivered"] == 2 * per_epoch * consumers * BATCH
    assert totals["records_per_second"] > 0

    # node rings carry record spans by default, records copied when asked
    spans = strategy != "naive-stride" and "copy" not in extra
    assert doc["transfer"] == ("spans" if spans else "copy")
    # the default slot size groups iterations (per-slot figures): batches of 8 records are
    # 64 to a slot of spans (the most), 16 to a slot of copied records; one per slot when
    # asked; either way the entries cover every iteration once
    grouped = strategy != "naive-stride" and "--batches-per-slot" not in extra
    its = doc["iterations"]
    assert sum(s["batches"] for s in its) == 2 * per_epoch
    assert [s["iteration"] for s in its] == \
        [sum(t["batches"] for t in its[:k]) for k in range(len(its))]
    assert (max(s["batches"] for s in its) > 1) == grouped
    assert doc["batches_per_slot"] == ((64 if spans else 16) if grouped else 1)

    workers = [r for r in doc["per_rank"] if r["worker"]]
    assert len(workers) == consumers
    for r in workers:  # every record's 3,072 bytes, as spans or copied
        assert r["bytes_delivered"] == 3072 * len(r["records"])
    for r in doc["per_rank"]:
        for key in ("rank", "node", "records", "pages_touched", "own_pages", "extra_pages",
                    "setup_pages", "bytes_delivered", "seconds"):
            assert key in r, key
        assert r["node"] == r["rank"] // (RANKS // NODES)
        # each rank's CPU time in its setup and loop (a loop that copied records used some)
        assert r["cpu_seconds"]["setup"] >= 0 and r["cpu_seconds"]["loop"] > 0
    for key in ("setup", "loop"):  # the totals sum the ranks'
        assert totals["cpu_seconds"][key] == pytest.approx(
            sum(r["cpu_seconds"][key] for r in doc["per_rank"]))
    # every epoch's records exactly once with the declared padding: check_document above
    for r in workers:
        assert len(r["records"]) == 2 * per_epoch * BATCH

    readers = [r for r in doc["per_rank"] if r["reader"]]
    assert totals["needed_pages"] == sum(r["own_pages"] for r in readers) > 0
    for r in readers:  # the records' pages are read (by the workers, for spans) and counted
        assert r["pages_touched"] >= r["own_pages"]
    if strategy == "indexed":
        assert totals["extra_pages"] == 0
    if strategy.startswith("dm"):
        symmetric = "--no-symmetric" not in extra
        assert totals["symmetric_mapping"] is symmetric
        assert totals["symmetric_mapping_attempts"] == (1 if symmetric else 0)


def test_dm_spec_prefetches_exactly_what_a_share_needed_in_an_earlier_epoch(
        tmp_path: Path) -> None:
    """On a file of mixed value sizes (inline and 1-2 overflow pages, in several commits)
    the first epoch's estimates miss some pages and prefetch some too many; every later
    epoch reads the same shares, and dm-spec prefetches exactly the pages each needed the
    first time: no missed and no redundant page, the run's last, shorter slot included
    (the first part of a share it read before)."""
    db = tmp_path / "mixed"
    n = 700
    write_db(db, random_items(n, (100, 5000), seed=3), commit_every=100)
    per_epoch = iterations_per_epoch(n, RANKS, BATCH, "pad")
    iters = 2 * per_epoch + per_epoch // 2  # two epochs and a half
    doc = run_bench(db, tmp_path / "out.json", "dm-spec",
                    ["--batches-per-slot", "4"], iters)
    later = [it for it in doc["iterations"] if it["iteration"] >= per_epoch]
    assert later and later[-1]["batches"] < 4  # the run stops inside a slot group
    assert [(it["missed_pages"], it["redundant_pages"]) for it in later] == \
        [(0, 0)] * len(later), later


def test_setup_pages_report_the_leaf_directory_once(tmp_path: Path) -> None:
    """The pages read outside every iteration are reported (``setup_pages``): indexed's
    readers building the leaf directory read each branch and leaf page once between them
    (reader 0 the branch pages, every reader the headers of its share of the leaves); the
    next run takes the directory from the sidecar, checking a few of its leaves against
    the file. dm-spec's readers, on leaves of uneven counts, take the same directory
    from the sidecar and read the tree's branch pages and a few leaf headers at the first
    epoch: far fewer pages than the leaves."""
    from lmdbio.lmdb import Database
    from lmdbio.plan.strategies.indexed import sidecar_path

    path = tmp_path / "uneven"
    write_db(path, uneven_key_items(3000, seed=5, random_values=False), commit_every=200)
    with Database(path) as db:
        leaves, branches = db.leaves().size, db.db.branch_pages
        assert not sidecar_path(db).exists()
    # three runs, one after another, in one job
    runs = [bench_argv(path, tmp_path / f"{name}.json", strategy, [], 4)
            for name, strategy in (("a", "indexed"), ("b", "indexed"), ("c", "dm-spec"))]
    run_mpi(RANKS, CLI_RUNS_SCRIPT, [json.dumps(runs)], timeout=150)
    built, again, spec = (json.loads((tmp_path / f"{name}.json").read_text())["totals"]
                          ["setup_pages"] for name in "abc")
    assert built == leaves + branches
    assert 0 < again <= 8  # the sidecar's spot check: up to 8 leaves, on reader 0
    assert 0 < spec < leaves // 2


def test_a_run_that_stops_inside_a_slot_group_walks_no_other_nodes_records(
        tmp_path: Path) -> None:
    """``--iters`` stopping inside a ring slot (here the second epoch's fifth of ten
    iterations, every epoch one slot group): the plan cuts that group where the run stops,
    so each DM reader reaches its records without walking past the part of the other
    node's block nobody reads. On records five to a leaf, dm-spec's walk then reads no
    page outside its prefetch (before: the leaves of ~40 records of the other node), and
    the stopped epoch delivers no record twice."""
    path = tmp_path / "inline"
    write_db(path, random_items(RECORDS, 700, seed=3), commit_every=100)
    per_epoch = iterations_per_epoch(RECORDS, RANKS, BATCH, "pad")
    iters = per_epoch + per_epoch // 2
    doc = run_bench(path, tmp_path / "out.json", "dm-spec", [], iters)
    assert doc["batches_per_slot"] > per_epoch  # every epoch is one slot group
    its = doc["iterations"]
    assert [s["batches"] for s in its] == [per_epoch, per_epoch // 2]
    assert [s["missed_walk_pages"] for s in its] == [0, 0], its
    assert its[-1]["pages_touched"] <= its[-1]["own_pages"] + 2 * NODES  # + branch pages
    second = [rec for r in doc["per_rank"] if r["worker"]
              for rec, pad in zip(r["records"][per_epoch * BATCH:],
                                  r["padding"][per_epoch * BATCH:], strict=True) if not pad]
    assert len(second) == len(set(second)) == (per_epoch // 2) * RANKS * BATCH


def test_a_run_that_stops_inside_a_known_slot_group_prefetches_only_its_head(
        tmp_path: Path) -> None:
    """A run stopping one batch into a slot group that an earlier epoch read whole: the
    head's prefetch is placed in the leaves, not taken from the whole group's pages, whose
    walk crossed into another parent's leaves (63 records under keys of 1-500 bytes, a
    three-level tree: one branch page prefetched for nothing before)."""
    import random

    import lmdb

    rng = random.Random(63)
    items = [(rng.randbytes(rng.randint(1, 500)), rng.randbytes(784)) for _ in range(63)]
    path = tmp_path / "db"
    with lmdb.open(str(path), map_size=1 << 26) as env, env.begin(write=True) as txn:
        for k, v in items:
            txn.put(k, v)
    argv = ["bench", "read", str(path), "--strategy", "dm-spec", "--batch-size", "3",
            "--iters", "31", "--last", "drop", "--batches-per-slot", "3",
            "--json", str(tmp_path / "out.json")]
    run_mpi(1, CLI_SCRIPT, argv, timeout=120)
    its = json.loads((tmp_path / "out.json").read_text())["iterations"]
    assert its[-1]["batches"] == 1  # the cut group: 31 = 21 + 9 + 1
    assert [(s["missed_pages"], s["redundant_pages"]) for s in its] == [(0, 0)] * len(its)
