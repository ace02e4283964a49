"""The data-loading service end to end, under mpiexec: exactly-once delivery with Caffe's
labels, equal batch counts, exact resume, a killed rank ending the job, no shared memory left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench.lmdbgen import read_pylmdb, write_db
from lmdbio.codecs.datum import datum_from_array, decode_datum, encode_datum
from tests.mpi_harness import CLI_SCRIPT, OPENMPI_ENV, require_mpiexec, run_mpi
from tests.page_tables import needs_populate

pytestmark = pytest.mark.mpiexec  # every test here starts mpiexec jobs

N_RECORDS = 203  # not a multiple of any batch used below: the last batch matters


@pytest.fixture(scope="module")
def datum_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("datum-db")
    rng = np.random.default_rng(5)
    items = []
    for i in range(N_RECORDS):
        img = rng.integers(0, 256, (3, 6, 5), dtype=np.uint8)
        items.append((b"%08d_img%d.png" % (i, i), encode_datum(datum_from_array(img, i % 7))))
    write_db(path, items, commit_every=50)
    return path


def expected_labels(db: Path) -> dict[str, int]:
    return {k.hex(): decode_datum(v).label for k, v in read_pylmdb(db)}


def expected_pixels(db: Path) -> dict[str, int]:
    """CRC-32 of each record's pixels as float32 (an identity transform), by py-lmdb and
    the reference Datum decoder."""
    return {k.hex(): zlib.crc32(decode_datum(v).to_array().astype(np.float32))
            for k, v in read_pylmdb(db)}


def worker_batches(run) -> dict[int, list[dict]]:
    return {r: res[-1]["batches"] for r, res in run.results.items() if res[-1]["worker"]}


def sets(overrides: list[str]) -> list[str]:
    """``--set`` arguments of ``tests/mpi/loader_job.py`` for config overrides."""
    return [a for o in overrides for a in ("--set", o)]


class CaseRun:
    """One case of a shared ``loader_job.py --cases`` run: each rank's results, as
    :func:`run_mpi`'s ``results`` give them (the case's result last)."""

    def __init__(self, results: dict[int, list[dict]]) -> None:
        self.results = results


class CaseRuns(dict):
    """:class:`CaseRun` by case: ``runs[(ranks, arguments)]``."""

    def __getitem__(self, case: tuple[int, list[str]]) -> CaseRun:
        n, args = case
        return super().__getitem__((n, *args))


def run_loader_cases(db: Path, cases: list[tuple[int, list[str]]]) -> CaseRuns:
    """Every ``(ranks, loader_job arguments)`` case, run with one mpiexec job per rank
    count (``loader_job.py --cases``: the start-up of 2-4 interpreters, their imports and
    compiled kernels, paid once instead of once per case); ``(ranks, *arguments)`` ->
    its :class:`CaseRun` (look it up with the case). A case that fails ends its job,
    failing the cases run with it."""
    by_ranks: dict[int, list[tuple[str, ...]]] = {}
    for n, args in cases:
        group = by_ranks.setdefault(n, [])
        if tuple(args) not in group:
            group.append(tuple(args))
    out = CaseRuns()
    for n, group in by_ranks.items():
        run = run_mpi(n, "loader_job.py", [str(db), "--cases", json.dumps(group)],
                      timeout=120 + 30 * len(group))  # bounds a hang only
        for k, args in enumerate(group):
            dict.__setitem__(out, (n, *args), CaseRun(
                {r: [x for x in res if x.get("case") == k] for r, res in run.results.items()}))
    return out


def every_record_case(nprocs: int, overrides: list[str]) -> tuple[int, list[str]]:
    return nprocs, sets([*overrides, "batch.size=16", "batch.last=pad"])


def equal_counts_case(last: str) -> tuple[int, list[str]]:
    return 4, [*sets(["batch.size=24", f"batch.last={last}", "readers.strategy=indexed",
                      "topology.simulate_nodes=2"]), "--epochs", "1"]


def resume_case(strategy: str, per_slot: int) -> tuple[int, list[str]]:
    shuffle = "global" if strategy == "indexed" else "none"
    return 4, [*sets(["batch.size=16", f"readers.strategy={strategy}",
                      "topology.simulate_nodes=2", f"shuffle.mode={shuffle}",
                      f"readers.batches_per_slot={per_slot}"]), "--resume-at", "3"]


def stop_case(nprocs: int, overrides: list[str], stop: int, extra: list[str]
              ) -> tuple[int, list[str]]:
    return nprocs, [*sets([*overrides, "batch.size=16", "batch.last=pad"]), "--stop",
                    str(stop), *extra]


def resume_stop_case(overrides: list[str]) -> tuple[int, list[str]]:
    return 4, [*sets([*overrides, "batch.size=16", "topology.simulate_nodes=2"]), "--stop",
               "5", "--resume-at", "2"]


def leave_cases(overrides: list[str]) -> tuple[tuple[int, list[str]], tuple[int, list[str]]]:
    """The job that leaves epoch 0 after 2 batches, and the one that does not."""
    args = sets([*overrides, "batch.size=16", "topology.simulate_nodes=2"])
    return (4, [*args, "--break-at", "2"]), (4, args)


def ahead_cases(per_slot: int) -> tuple[tuple[int, list[str]], tuple[int, list[str]]]:
    """The job whose workers decode the next epoch's first slot ahead, and the one that
    does not."""
    args = [*sets(["readers.strategy=indexed", "shuffle.mode=global", "batch.size=16",
                   "transform.crop_size=4", "transform.mirror=true",
                   f"readers.batches_per_slot={per_slot}"]), "--epochs", "3"]
    return (2, [*args, "--await-next-epoch"]), (2, [*args, "--no-epoch-look-ahead"])


#: one reader per node and two reader groups, colocated: the same batches on every worker
GROUPS_CASES = [(4, ["readers.strategy=indexed", "shuffle.mode=global", "readers.mode=colocated",
                     f"readers.per_node={k}"]) for k in (1, 2)]
CASES = [
    (4, ["readers.strategy=indexed", "topology.simulate_nodes=2", "shuffle.mode=global"]),
    (4, ["readers.strategy=dm-spec", "topology.simulate_nodes=2"]),
    # records copied into the slots (the default hands these records out as spans)
    (4, ["readers.strategy=indexed", "topology.simulate_nodes=2", "shuffle.mode=global",
         "readers.transfer=copy"]),
    (4, ["readers.strategy=dm-spec", "topology.simulate_nodes=2", "readers.transfer=copy"]),
    (4, ["readers.strategy=lmm", "topology.simulate_nodes=2", "readers.mode=colocated"]),
    (2, ["readers.strategy=dm-serial", "topology.simulate_nodes=2"]),
    (1, ["readers.strategy=indexed", "shuffle.mode=block"]),
    (3, ["readers.strategy=naive-stride"]),
    (2, ["readers.strategy=naive-contig"]),
    # one batch per ring slot, and a few (the default packs whole epochs of this database)
    (4, ["readers.strategy=indexed", "topology.simulate_nodes=2", "shuffle.mode=global",
         "readers.batches_per_slot=1"]),
    (4, ["readers.strategy=dm-spec", "topology.simulate_nodes=2", "readers.mode=colocated",
         "readers.batches_per_slot=3"]),
    (4, ["readers.strategy=lmm", "topology.simulate_nodes=2", "readers.batches_per_slot=2",
         "readers.prefetch_depth=1"]),
    # one reader for both ranks of a colocated node (the default gives each its own)
    (4, ["readers.strategy=dm-spec", "topology.simulate_nodes=2", "readers.mode=colocated",
         "readers.batches_per_slot=3", "readers.transfer=copy", "readers.per_node=1"]),
    # reader groups: one host cut into two nodes of one reader each (dedicated: a DM
    # cursor chain through both groups' readers)
    (4, ["readers.strategy=dm-spec", "readers.per_node=2"]),
    *GROUPS_CASES,
]

LASTS = ["pad", "drop", "partial"]
RESUME_PARAMS = [("indexed", 0), ("dm-spec", 0), ("lmm", 0), ("indexed", 2), ("dm-spec", 2)]
RESUME_STOP_OVERRIDES = [
    ["readers.strategy=indexed", "shuffle.mode=global", "readers.batches_per_slot=3"],
    ["readers.strategy=dm-spec", "readers.mode=colocated", "readers.batches_per_slot=3"],
]
LEAVE_OVERRIDES = [
    ["readers.strategy=indexed", "shuffle.mode=global"],
    ["readers.strategy=dm-spec", "readers.mode=colocated", "readers.batches_per_slot=2"],
]
AHEAD_PER_SLOT = [1, 2]


@pytest.mark.parametrize(("nprocs", "overrides"), CASES, ids=lambda c: str(c))
def test_every_record_once_per_epoch_with_caffe_labels(datum_db, loader_runs, nprocs,
                                                       overrides):
    run = loader_runs[every_record_case(nprocs, overrides)]
    labels = expected_labels(datum_db)
    pixels = expected_pixels(datum_db)
    per_worker = worker_batches(run)
    assert per_worker, "no worker rank reported"
    counts = {len(b) for b in per_worker.values()}
    assert len(counts) == 1, f"workers got different batch counts: {counts}"
    for epoch in (0, 1):
        seen = Counter()
        for batches in per_worker.values():
            for b in (x for x in batches if x["epoch"] == epoch):
                for key, label, pad, pix in zip(b["keys"], b["labels"], b["padding"],
                                                b["pixels"], strict=True):
                    assert labels[key] == label
                    assert pixels[key] == pix, key
                    if not pad:
                        seen[key] += 1
        assert set(seen) == set(labels) and set(seen.values()) == {1}, epoch


def test_reader_groups_deliver_the_batches_of_one_reader(loader_runs):
    """``readers.per_node: 2`` spreads the reading over two groups of a node; a
    random-access plan does not depend on who reads, so every worker gets exactly the
    batches (records, keys, pixels) that one reader per node gave it."""
    one, two = (worker_batches(loader_runs[every_record_case(*c)]) for c in GROUPS_CASES)
    assert sorted(one) == sorted(two) == [0, 1, 2, 3]
    for rank in one:
        assert [(b["ids"], b["keys"], b["pixels"]) for b in one[rank]] == \
            [(b["ids"], b["keys"], b["pixels"]) for b in two[rank]], rank


def test_only_a_rank_alone_on_its_ring_hands_its_slots_to_itself(loader_runs):
    """A colocated rank with a reader of its own hands its slots of spans to itself in
    process; a ring with several workers (one reader per node, reader groups of two
    ranks) or a dedicated reader hands them through the ring."""

    def handed(case):
        run = loader_runs[every_record_case(*case)]
        return sorted({res[-1]["hands_to_itself"] for res in run.results.values()})

    assert handed((4, ["readers.strategy=lmm", "topology.simulate_nodes=2",
                       "readers.mode=colocated"])) == [True]
    for case in (*GROUPS_CASES, (4, ["readers.strategy=indexed", "topology.simulate_nodes=2",
                                     "shuffle.mode=global"])):
        assert handed(case) == [False], case


@needs_populate
def test_only_ranks_that_read_the_mapping_populate_it(loader_runs):
    """The database (small, just written: in the page cache) is put in the page tables of
    the ranks that read it: readers, and workers of record spans; not workers of copied
    records, which never touch the mapping."""

    def populated(case):
        run = loader_runs[every_record_case(*case)]
        return {(r[-1]["reader"], r[-1]["worker"]): r[-1]["populated"]
                for r in run.results.values()}

    spans, copies = CASES[0], CASES[2]
    assert "readers.transfer=copy" in copies[1] and "readers.transfer=copy" not in spans[1]
    assert populated(spans) == {(True, False): True, (False, True): True}
    assert populated(copies) == {(True, False): True, (False, True): False}


@pytest.mark.parametrize("last", LASTS)
def test_equal_batch_counts(loader_runs, last):
    run = loader_runs[equal_counts_case(last)]
    per_worker = worker_batches(run)
    lengths = {r: [len(b["ids"]) for b in batches] for r, batches in per_worker.items()}
    assert len({len(v) for v in lengths.values()}) == 1  # same number of batches everywhere
    total_real = sum(len(b["ids"]) - sum(b["padding"]) for bs in per_worker.values()
                     for b in bs)
    if last == "pad":
        assert all(set(v) == {12} for v in lengths.values())
        assert total_real == N_RECORDS
    elif last == "drop":
        assert all(set(v) == {12} for v in lengths.values())
        assert total_real == (N_RECORDS // 24) * 24
    else:
        assert total_real == N_RECORDS


@pytest.mark.parametrize(("strategy", "per_slot"), RESUME_PARAMS)
def test_resume_mid_epoch_delivers_exactly_the_rest(loader_runs, strategy, per_slot):
    run = loader_runs[resume_case(strategy, per_slot)]
    for r, res in run.results.items():
        out = res[-1]
        if not out["worker"]:
            continue
        full = [b["ids"] for b in out["batches"]]
        resumed = [b["ids"] for b in out["resumed"]]
        assert out["state"]["iteration"] == 3
        assert resumed == full[3:], f"rank {r}"
        # and the records read are those records (the keys come from the file)
        assert [b["keys"] for b in out["resumed"]] == [b["keys"] for b in out["batches"][3:]]


STOP_CASES = [
    # (ranks, overrides, stop, extra arguments)
    (4, ["readers.strategy=indexed", "topology.simulate_nodes=2", "shuffle.mode=global",
         "readers.batches_per_slot=3"], 5, []),
    (4, ["readers.strategy=dm-spec", "topology.simulate_nodes=2", "readers.mode=colocated",
         "readers.batches_per_slot=3"], 7, []),
    # the whole epoch in one slot, cut in its first slot; workers wait at epoch 0's last
    # batch until the dedicated reader has published it, so it is decoded ahead (as the
    # whole slot, which it is not)
    (4, ["readers.strategy=dm-spec", "topology.simulate_nodes=2"], 4, ["--await-next-epoch"]),
    (2, ["readers.strategy=naive-stride"], 5, []),
]


@pytest.mark.parametrize(("nprocs", "overrides", "stop", "extra"), STOP_CASES,
                         ids=lambda c: str(c))
def test_a_stop_inside_an_epoch_is_where_reading_ends(datum_db, loader_runs, nprocs,
                                                      overrides, stop, extra):
    """``set_epoch(e, stop_iteration=K)``: every worker gets the epoch's first K batches,
    each record at most once, decoded as py-lmdb reads them, and the readers read no slot
    group past K (a reader used to read the whole slot group holding K, then the groups
    ahead of it up to the prefetch depth)."""
    run = loader_runs[stop_case(nprocs, overrides, stop, extra)]
    labels, pixels = expected_labels(datum_db), expected_pixels(datum_db)
    per_worker = worker_batches(run)
    seen = Counter()
    for batches in per_worker.values():
        assert [b["iteration"] for b in batches if b["epoch"] == 1] == list(range(stop))
        for b in (x for x in batches if x["epoch"] == 1):
            assert b["batch_epoch"] == 1
            for key, label, pad, pix in zip(b["keys"], b["labels"], b["padding"], b["pixels"],
                                            strict=True):
                assert labels[key] == label and pixels[key] == pix, key
                assert not pad
                seen[key] += 1
    assert set(seen.values()) == {1} and sum(seen.values()) == 16 * stop
    readers = [res[-1]["reads"] for res in run.results.values() if res[-1]["reader"]]
    assert readers
    for reads in readers:
        cut = [(first, count) for epoch, first, count in reads if epoch == 1]
        assert sum(count for _, count in cut) == stop, reads
        assert max(first + count for first, count in cut) == stop, reads


@pytest.mark.parametrize("overrides", RESUME_STOP_OVERRIDES, ids=["dedicated", "colocated"])
def test_resume_inside_an_epoch_with_a_stop_delivers_the_rest_up_to_it(loader_runs,
                                                                       overrides):
    """The state of an epoch that stops at batch 5 keeps the stop: the resumed run
    (``set_epoch(0)`` after ``load_state_dict``) delivers exactly batches 2-4 of the
    straight run, which a stop changes (its slot group is laid out for the part read)."""
    run = loader_runs[resume_stop_case(overrides)]
    for r, res in run.results.items():
        out = res[-1]
        if not out["worker"]:
            continue
        assert out["state"]["stop_iteration"] == 5 and out["state"]["iteration"] == 2
        assert [b["iteration"] for b in out["batches"]] == list(range(5))
        assert [b["ids"] for b in out["resumed"]] == [b["ids"] for b in out["batches"][2:]], \
            f"rank {r}"
        assert [b["keys"] for b in out["resumed"]] == [b["keys"] for b in out["batches"][2:]]


@pytest.mark.parametrize("overrides", LEAVE_OVERRIDES, ids=["dedicated", "colocated"])
def test_set_epoch_after_leaving_an_epoch_delivers_that_epoch(loader_runs, overrides):
    """A trainer that leaves epoch 0 early and calls ``set_epoch(1)`` gets epoch 1, in the
    order of a run that did not leave early (leaving an epoch moved on to the epoch after
    the one set: batches of epoch 1's records came labelled epoch 2)."""
    left_case, full_case = leave_cases(overrides)
    left = worker_batches(loader_runs[left_case])
    full = worker_batches(loader_runs[full_case])
    for r, batches in left.items():
        first = [b["ids"] for b in batches if b["epoch"] == 0]
        assert first == [b["ids"] for b in full[r] if b["epoch"] == 0][:2]
        second = [b for b in batches if b["epoch"] == 1]
        assert {b["batch_epoch"] for b in second} == {1}, f"rank {r}"
        assert [b["ids"] for b in second] == \
            [b["ids"] for b in full[r] if b["epoch"] == 1], f"rank {r}"


@pytest.mark.parametrize("per_slot", AHEAD_PER_SLOT)
def test_next_epoch_decoded_ahead_gives_the_same_batches(loader_runs, per_slot):
    """A dedicated worker decodes the next epoch's first slot during the previous epoch's
    last step (the reader is ahead: the job waits at each epoch's last batch until the
    reader has published the next epoch's first slot). The batches - ids, epoch labels,
    transformed pixels (random crops and mirrors seeded by epoch) - equal those of the same
    job without it."""
    ahead_case, inline_case = ahead_cases(per_slot)
    ahead = loader_runs[ahead_case].results
    inline = loader_runs[inline_case].results
    worker = next(r for r, res in ahead.items() if res[-1]["worker"])
    got, ref = ahead[worker][-1], inline[worker][-1]
    assert got["epochs_decoded_ahead"] == 2 and ref["epochs_decoded_ahead"] == 0
    assert len(got["batches"]) == 3 * got["iterations"]
    for a, b in zip(got["batches"], ref["batches"], strict=True):
        assert a["batch_epoch"] == b["batch_epoch"] == a["epoch"]
        for key in ("iteration", "ids", "padding", "keys", "labels", "pixels"):
            assert a[key] == b[key], (a["epoch"], a["iteration"], key)


@pytest.mark.parametrize("setting", ["transform: {crop_size: 9}",  # larger than 6x5
                                     "transform: {mean_values: [1, 2]}"])  # 3 channels
def test_an_error_while_decoding_ends_a_dedicated_job_promptly(datum_db, tmp_path, setting):
    """A worker that raises while decoding (here: a transform that does not fit the images,
    found only at the first decode) aborts the node's ring; the dedicated reader, blocked
    on a full ring, raises at once instead of both waiting out the ring's 120 s timeout."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"dataset: {{path: {datum_db}, layout: caffe-datum}}\n"
                   f"batch: {{size: 4}}\nreaders: {{strategy: indexed, prefetch_depth: 1, "
                   f"mode: dedicated}}\n"
                   f"epochs: 50\nmetrics: {{every: 0}}\n{setting}\n")
    snippet = f"import sys\nfrom lmdbio.cli import main\nsys.exit(main(['run', {str(cfg)!r}]))\n"
    run = run_mpi(2, snippet, timeout=90, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 2, run.output()  # both ranks failed: one report, exit 2
    assert "lmdbio run: error: rank 1: transform." in out, run.output()
    # waiting out the ring's 120 s timeout would overrun the run's 90 s bound and fail it
    assert "RingTimeoutError" not in out, run.output()


def _wait_for_batches(proc: subprocess.Popen, logs, workers: int, seconds: float) -> None:
    """Until ``workers`` record logs in ``logs`` hold a whole batch each (a header line and
    a batch's lines), polling; fails with the job's output if it ends or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        files = sorted(logs.glob("rank-*.log")) if logs.exists() else []
        if len(files) >= workers and all(len(f.read_text().splitlines()) > 2 for f in files):
            return
        time.sleep(0.2)
    raise AssertionError(f"no batch logged by {workers} workers in {seconds:g} s")


def _launch_folder(launcher: int) -> str | None:
    """The /dev/shm folder ``lmdbio launch`` (process ``launcher``) gave its mpiexec, read
    from that child's environment (``OMPI_MCA_btl_sm_backing_directory``, its ``btl``)."""
    children = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True,
                              text=True).stdout.split()
    for pid in children:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        btl = env.get(b"OMPI_MCA_btl_sm_backing_directory")
        if btl:
            return os.path.dirname(btl.decode())
    return None


def test_killed_rank_ends_the_job_and_leaves_no_shared_memory(datum_db, tmp_path):
    mpiexec = require_mpiexec()
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"dataset: {{path: {datum_db}, layout: caffe-datum}}\n"
                   "batch: {size: 4}\nreaders: {strategy: dm-spec, mode: dedicated}\n"
                   "topology: {simulate_nodes: 2}\nepochs: 100000\nmetrics: {every: 0}\n")
    env = {**os.environ, **OPENMPI_ENV}
    logs = tmp_path / "records"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmdbio.cli", "launch", "-n", "4", "--mpiexec", str(mpiexec),
         str(cfg), "--", sys.executable, "-m", "lmdbio.cli", "run", str(cfg),
         "--record-log", str(logs)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # let the job get going: every worker has logged a batch (a fixed wait was too
        # short when other suites loaded the machine)
        _wait_for_batches(proc, logs, workers=2, seconds=120)
        folder = _launch_folder(proc.pid)
        ranks = subprocess.run(["pgrep", "-f", f"lmdbio.cli run {cfg}"], capture_output=True,
                               text=True).stdout.split()
        launcher = {proc.pid, *(int(p) for p in subprocess.run(
            ["pgrep", "-f", "lmdbio.cli launch"], capture_output=True, text=True).stdout.split())}
        victims = [int(p) for p in ranks if int(p) not in launcher]
        assert victims, "no rank process found"
        os.kill(victims[-1], signal.SIGKILL)
        proc.wait(timeout=60)  # bounds a hang: the job must end, not wait out a timeout
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # the launcher runs Open MPI with its shared-memory files (the node ring's window
    # included) in a private folder of /dev/shm and removes it however the job ends; other
    # jobs on this machine (another suite's launches too) may be adding files to /dev/shm
    # meanwhile, so look at this job's folder, read from its mpiexec's environment
    assert folder is not None and folder.startswith("/dev/shm/lmdbio-job-"), folder
    assert not os.path.exists(folder), folder
    # the workers' record logs hold whole batches only: each is written and flushed before
    # the next batch is asked for, so no kill leaves a line or a batch cut short
    files = sorted(logs.glob("rank-*.log"))
    assert files
    for f in files:
        lines = f.read_text().splitlines()[1:]
        assert lines, f
        per_batch = Counter(tuple(line.split()[:2]) for line in lines)
        assert all(len(line.split()) == 5 for line in lines), f
        assert set(per_batch.values()) == {2}, (f, per_batch)  # 4 records, 2 workers


@pytest.mark.parametrize("readers", [
    "{strategy: dm-spec, mode: dedicated}",
    "{strategy: indexed, mode: colocated, batches_per_slot: 2}",
], ids=["dm-spec-dedicated", "indexed-colocated"])
def test_lmdbio_run_ends_at_max_iterations(datum_db, tmp_path, readers):
    """``max_iterations: 16`` with 13 iterations an epoch (203 records, global batch 16):
    ``lmdbio run`` runs epoch 0 whole and stops epoch 1 after 3 iterations, each record of
    it at most once, and reports that many samples."""
    cfg = tmp_path / "job.yaml"
    shuffle = "global" if "indexed" in readers else "none"
    cfg.write_text(f"dataset: {{path: {datum_db}, layout: caffe-datum}}\n"
                   f"batch: {{size: 16, last: pad}}\nreaders: {readers}\n"
                   f"shuffle: {{mode: {shuffle}}}\ntopology: {{simulate_nodes: 2}}\n"
                   "epochs: 3\nmax_iterations: 16\nmetrics: {every: 0}\n")
    logs, out = tmp_path / "records", tmp_path / "metrics.json"
    run_mpi(4, CLI_SCRIPT, ["run", str(cfg), "--record-log", str(logs), "--metrics-json",
                            str(out)], timeout=120)
    files = sorted(logs.glob("rank-*.log"))
    assert len(files) == (4 if "colocated" in readers else 2)
    labels = expected_labels(datum_db)
    per_epoch: dict[int, Counter] = {0: Counter(), 1: Counter()}
    for f in files:
        rows = [line.split() for line in f.read_text().splitlines()[1:]]
        batches = sorted({(int(e), int(i)) for e, i, *_ in rows})
        assert batches == [(0, i) for i in range(13)] + [(1, i) for i in range(3)], f
        for e, _, key, label, pad in rows:
            assert labels[key] == int(label), key
            if pad == "0":
                per_epoch[int(e)][key] += 1
    assert set(per_epoch[0]) == set(labels) and set(per_epoch[0].values()) == {1}
    assert len(per_epoch[1]) == 3 * 16 and set(per_epoch[1].values()) == {1}
    assert json.loads(out.read_text())["totals"]["samples"] == 16 * 16


LEAVE_EARLY = """
import json
import loaders
from lmdbio.mpiutil import abort_on_error
from tests.mpi._result import emit
import sys
with abort_on_error():
    for case, (mode, per_slot) in enumerate(json.loads(sys.argv[2])):
        cfg = {"dataset": {"path": sys.argv[1], "layout": "caffe-datum"},
               "metrics": {"every": 0}, "batch": {"size": 8},
               "readers": {"mode": mode, "strategy": "indexed", "batches_per_slot": per_slot},
               "topology": {"simulate_nodes": 2}}
        with loaders.open(cfg) as loader:
            got = []
            for epoch in range(3):
                loader.set_epoch(epoch)
                for k, batch in enumerate(loader):
                    got.append((epoch, batch.iteration))
                    if k == 2:
                        break  # leave every epoch early: the next must start cleanly
        emit({"got": got, "worker": loader.is_worker, "case": case})
"""
LEAVE_EARLY_CASES = [(mode, per_slot) for mode in ("dedicated", "colocated")
                     for per_slot in (1, 2, 0)]


@pytest.fixture(scope="module")
def left_early(datum_db) -> dict[int, list[dict]]:
    """Every case of LEAVE_EARLY_CASES in one 4-rank job: per rank, its results."""
    return run_mpi(4, LEAVE_EARLY, [str(datum_db), json.dumps(LEAVE_EARLY_CASES)],
                   timeout=240).results


@pytest.mark.parametrize(("mode", "per_slot"), LEAVE_EARLY_CASES)
def test_leaving_an_epoch_early_keeps_ranks_in_step(left_early, mode, per_slot):
    case = LEAVE_EARLY_CASES.index((mode, per_slot))
    for res in left_early.values():
        out = next(x for x in res if x["case"] == case)
        if out["worker"]:
            assert out["got"] == [[e, i] for e in range(3) for i in range(3)]


IBP_TRANSPORT = """
import sys
import lmdb
import numpy as np
import loaders
from lmdbio.codecs.tensor import decode_tensor
from lmdbio.mpiutil import abort_on_error
from tests.mpi._result import emit
env = lmdb.open(sys.argv[1], readonly=True, lock=False)
for strategy in sys.argv[2:]:  # one epoch each, one after another
    cfg = {"dataset": {"path": sys.argv[1], "layout": "tensor"}, "metrics": {"every": 0},
           "batch": {"size": 16}, "readers": {"strategy": strategy},
           "topology": {"simulate_nodes": 2}, "codec": {"name": "ibp"}}
    checked, keys = 0, []
    with abort_on_error(), loaders.open(cfg) as loader, env.begin() as txn:
        for batch in loader:
            for key, row, label, pad in zip(batch.keys, batch.data, batch.label,
                                            batch.padding):
                want, want_label = decode_tensor(txn.get(key))
                assert np.array_equal(row, want) and label == want_label, key
                checked += 1
                if not pad:
                    keys.append(key.hex())
    emit({"strategy": strategy, "checked": checked, "keys": keys,
          "worker": loader.is_worker})
"""
IBP_STRATEGIES = ["indexed", "dm-spec"]


@pytest.fixture(scope="module")
def tensor_db(tmp_path_factory) -> Path:
    from tests.engine_helpers import ibp_rows

    path = tmp_path_factory.mktemp("tensor-db")
    write_db(path, ibp_rows(150))
    return path


@pytest.fixture(scope="module")
def ibp_transport_runs(tensor_db) -> list[dict]:
    """What every rank emitted for each of IBP_STRATEGIES, all run by one 4-rank job."""
    run = run_mpi(4, IBP_TRANSPORT, [str(tensor_db), *IBP_STRATEGIES], timeout=240)
    return [r for rank in run.results.values() for r in rank]


@pytest.mark.parametrize("strategy", IBP_STRATEGIES)
def test_ibp_transport_delivers_the_exact_records(tensor_db, ibp_transport_runs, strategy):
    """Every record of the epoch reaches exactly one worker once, through IBP-compressed
    slots, equal to py-lmdb's value and label (checked inside the job)."""
    workers = [r for r in ibp_transport_runs if r["strategy"] == strategy and r["worker"]]
    assert len(workers) == 4  # 2 ranks per node: colocated (readers.mode auto)
    assert sum(w["checked"] for w in workers) >= 150
    delivered = Counter(k for w in workers for k in w["keys"])
    assert delivered == Counter(k.hex() for k, _ in read_pylmdb(tensor_db))


# ------------------------------------------------------------- the shared loader_job runs



def all_loader_cases() -> list[tuple[int, list[str]]]:
    """Every ``loader_job.py`` case of this module's parametrized tests."""
    return [*(every_record_case(n, o) for n, o in CASES),
            *(equal_counts_case(last) for last in LASTS),
            *(resume_case(s, p) for s, p in RESUME_PARAMS),
            *(stop_case(*c) for c in STOP_CASES),
            *(resume_stop_case(o) for o in RESUME_STOP_OVERRIDES),
            *(c for o in LEAVE_OVERRIDES for c in leave_cases(o)),
            *(c for p in AHEAD_PER_SLOT for c in ahead_cases(p))]


@pytest.fixture(scope="module")
def loader_runs(datum_db: Path) -> CaseRuns:
    """Every case of :func:`all_loader_cases`, run once for the module (one job per rank
    count), looked up by ``(ranks, *arguments)``."""
    return run_loader_cases(datum_db, all_loader_cases())
