"""lmdbio's cross-node paths on real hosts: namespaced hosts on this machine (bench/multihost.py).

Elsewhere the cross-node paths run on *simulated* nodes; here two hosts ``h1``, ``h2`` (own
network stack, host name and /dev/shm each; Open MPI's daemons started through a launch
agent, ranks talking TCP between hosts and shared memory inside one) and node detection by
the real ``Split_type(COMM_TYPE_SHARED)``, no ``simulate_nodes``:

* one launch of tests/mpi/read_epochs.py, 4 ranks mapped round robin (``--map-by node``:
  h1 has world ranks 0 and 2, h2 ranks 1 and 3, so neither node is a block of consecutive
  ranks, and the readers, ranks 0 and 1, are on different hosts): exactly once per epoch for
  the naive, LMM, DM and indexed strategies (every delivered record's key and value checked
  against what py-lmdb reads from the file), the cursor hand-off between the hosts, the
  symmetric mapping across hosts and its fallback;
* ``lmdbio launch --hosts h1:2,h2:2`` running ``lmdbio run``, as on a cluster (the agent
  and the private subnet given through ``--mpi-arg``; the Makefile's mapping policy in the
  environment): every epoch exactly once across the hosts' workers;
* the same job with host h2 killed mid-epoch (SIGKILL to its daemon and ranks): the job ends
  promptly, ``lmdbio launch`` exits non-zero naming h2, and h1 (the survivor) is left with
  nothing in its /dev/shm;
* ``lmdbio bench read --direct`` (naive-stride, both ranks of a host reading on their own
  into the host's O_DIRECT cache): each host reads its pages once per epoch, with and
  without read-around.

The first three launches cost 45-50 s on the 2-core project machine (17 + 16 + 11 s at a
load average of 7-9 from other jobs), the bench runs 10-20 s more; the hosts are made once
per module and removed whatever happens (bench/multihost.py sweeps what a killed run
left). The mpiexec lines of
``lmdbio launch --hosts`` and its lost-host report are also checked without hosts.
Skipped where network namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import check_cursor_hand_off, check_symmetric_mapping
from mpi_harness import REPO, CompletedRun, require_mpiexec, run_mpi
from test_read_strategies import Generated, check_case, check_pages

from bench.lmdbgen import random_items, read_pylmdb, write_db
from bench.multihost import Hosts, make_hosts, sweep_stale, unavailable
from launch import mpirun
from lmdbio.codecs.datum import datum_from_array, encode_datum
from lmdbio.errors import ConfigError

pytestmark = pytest.mark.timeout(300)
# tests on the hosts start mpiexec jobs: marked ``mpiexec`` (``make mpi``; ``make unit``
# leaves them out); the launch lines and the sweep of stale hosts start none

#: variables the ranks need (the agent starts the hosts' daemons in a clean environment,
#: as ssh does: only what ``-x`` exports reaches a rank)
EXPORTS = ("PYTHONPATH", "NUMBA_CACHE_DIR", "PYTHONUNBUFFERED", "MPI_HARNESS_RESULT_DIR")
#: Open MPI's shared-memory files in each host's own /dev/shm (a folder made on this host,
#: as the harness and ``lmdbio launch`` make for one-host jobs, does not exist on the others)
HOST_SHM = {"OMPI_MCA_btl_sm_backing_directory": "/dev/shm",
            "OMPI_MCA_osc_sm_backing_directory": "/dev/shm"}


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """Two hosts of two slots each, removed after the module (also when a test failed)."""
    why = unavailable()
    if why:
        pytest.skip(why)
    require_mpiexec()
    try:
        made = make_hosts(2, slots=2)
    except RuntimeError as exc:  # an ip step or the agent's probe failed: the environment
        pytest.skip(f"cannot make namespaced hosts here: {exc}")
    try:
        yield made
    finally:
        made.close()
        assert leftovers(made.tag) == [], "the hosts were not removed"


def leftovers(tag: str) -> list[str]:
    """Namespaces, links and folders whose names carry ``tag`` (a ``Hosts.tag``)."""
    found = [line.split()[0] for line in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout.splitlines() if tag in line]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=False).stdout
    found += [part.split(":")[1].strip() for part in links.splitlines() if tag in part]
    found += [str(p) for root in ("/dev/shm", "/tmp") for p in Path(root).glob(f"*{tag}*")]
    return found


def test_what_a_killed_run_left_is_swept() -> None:
    """A process that made hosts and was killed (SIGKILL: no finalizer ran) leaves its
    namespaces, bridge and folders; the next setup's sweep removes them, and leaves the
    hosts of a live process alone."""
    why = unavailable()
    if why:
        pytest.skip(why)
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from bench import multihost; "
            "h = multihost.make_hosts(2); print(h.tag, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, str(REPO)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        tag = child.stdout.readline().strip()
        assert tag, "the child made no hosts"
        assert len(leftovers(tag)) >= 5  # 2 namespaces, bridge, 2 veth ends, folders
        assert not any(tag in name for name in sweep_stale())  # alive: left alone
    finally:
        child.kill()
        child.wait()
    removed = sweep_stale()
    assert any(tag in name for name in removed)
    assert leftovers(tag) == []


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """203 records of 100..5000 random bytes (inline and overflow values; 203 is prime, so
    every tail policy has work), as tests/test_read_strategies.py's; the CRC-32 reference
    comes from py-lmdb and must equal what was written."""
    path = tmp_path_factory.mktemp("multihost") / "mixed"
    written = write_db(path, random_items(203, (100, 5000), seed=11), commit_every=50)
    items = read_pylmdb(path)
    assert items == sorted(written)
    # no lock file, so no snapshot pins: a pin is a child process under SCHED_IDLE that
    # must answer within 10 s, which a 2-core machine busy with 4 ranks (and other jobs)
    # may not give it; the pins are tests/test_read_strategies.py's subject
    (path / "lock.mdb").unlink()
    return Generated(path, items)


#: the node-level strategies (lmm, dm-*) and one of each rank-level kind (naive, indexed),
#: every tail policy, a slot of several batches, a global shuffle; all on the real nodes
#: (``nodes`` 0). Batches of 8: few iterations (each a cursor hand-off between the hosts
#: for dm-*), which keeps the launch short on a loaded 2-core machine
EPOCH_CASES: list[dict[str, Any]] = [
    {"strategy": "naive-stride", "last": "pad"},
    {"strategy": "lmm", "last": "pad"},
    {"strategy": "dm-serial", "last": "drop"},
    {"strategy": "dm-spec", "last": "partial"},
    {"strategy": "dm-spec", "last": "pad", "mode": "colocated", "per_slot": 3},
    {"strategy": "indexed", "last": "pad", "shuffle": "global", "seed": 3},
]


class EpochRun:
    """The one launch of tests/mpi/read_epochs.py on the hosts, and its cases."""

    def __init__(self, cases: list[dict], run: CompletedRun, hosts: Hosts) -> None:
        self.cases, self.run = cases, run
        self.shm_after = {h: hosts.shm_files(h) for h in hosts.names}

    def indices(self, role: str) -> list[int]:
        return [i for i, c in enumerate(self.cases) if c.get("role") == role]

    def results(self, index: int) -> list[dict]:
        out = []
        for rank in range(4):
            found = [o for o in self.run.results.get(rank, []) if o.get("case") == index]
            assert found, f"rank {rank} emitted nothing for case {index}\n{self.run.output()}"
            out.append(found[-1])
        return out


def run_on_hosts(hosts: Hosts, nprocs: int, script: str, args: list[str], timeout: float,
                 map_by: str) -> CompletedRun:
    """``run_mpi`` on the hosts; whatever a failed run left on them is killed after."""
    try:
        return run_mpi(nprocs, script, args, timeout=timeout, env={**hosts.mpi_env(),
                                                                    **HOST_SHM},
                       mpiexec_args=hosts.mpiexec_args(map_by=map_by, export=EXPORTS))
    finally:
        for h in hosts.names:
            if not hosts.wait_idle(h, timeout=10):
                hosts.kill(h)


@pytest.fixture(scope="module")
def epochs(hosts: Hosts, mixed: Generated) -> EpochRun:
    from lmdbio.io.symmap import FAIL_RANK_ENV

    cases: list[dict[str, Any]] = [{**c, "batch": 8, "role": "epochs"} for c in EPOCH_CASES]
    cases.append({"kind": "cursor", "role": "cursor"})
    # reader 1 (on h2) fails every symmetric-mapping attempt: both fall back
    cases.append({"strategy": "dm-spec", "batch": 8, "env": {FAIL_RANK_ENV: "1"},
                  "role": "fallback"})
    spec = json.dumps({"path": str(mixed.path), "cases": cases})
    run = run_on_hosts(hosts, 4, "read_epochs.py", [spec], timeout=240, map_by="node")
    return EpochRun(cases, run, hosts)


# --------------------------------------------------------------------------- read_epochs


@pytest.mark.mpiexec
def test_nodes_are_the_hosts(epochs: EpochRun) -> None:
    """``Split_type(COMM_TYPE_SHARED)`` finds one node per host: round robin, h1 holds world
    ranks 0 and 2, h2 ranks 1 and 3; the readers (local rank 0) are on different hosts."""
    for i in epochs.indices("epochs"):
        results = epochs.results(i)
        assert [r["hostname"] for r in results] == ["h1", "h2", "h1", "h2"]
        assert [r["node"] for r in results] == [0, 1, 0, 1]
        assert [r["local_rank"] for r in results] == [0, 0, 1, 1]
        assert not any(r["simulated"] for r in results)
        node_level = epochs.cases[i]["strategy"] in ("lmm", "dm-serial", "dm-spec")
        colocated = epochs.cases[i].get("mode") == "colocated"
        if node_level and not colocated:
            assert [r["reader"] for r in results] == [True, True, False, False]
            assert [r["consumer"] for r in results] == [None, None, 0, 1]
        elif node_level:
            # worker ranks node by node (h1's workers 0, 1; h2's 2, 3), not by world rank:
            # each node's plan share is a run of consecutive consumers (by world rank, h2
            # would have served consumers 1 and 2, one twice and consumer 3 never)
            assert [r["consumer"] for r in results] == [0, 2, 1, 3]


@pytest.mark.mpiexec
def test_every_strategy_delivers_each_epoch_exactly_once(epochs: EpochRun,
                                                         mixed: Generated) -> None:
    """Exactly the plan's records per consumer, each record once per epoch across the two
    hosts (pad, partial; at most once for drop), bytes equal to py-lmdb's, pages sane."""
    for i in epochs.indices("epochs"):
        case, results = epochs.cases[i], epochs.results(i)
        check_case(mixed, case, results)
        check_pages(case, results)


@pytest.mark.mpiexec
def test_cursor_hand_off_between_hosts(epochs: EpochRun, mixed: Generated) -> None:
    """Rank 0 (h1) sends cursor bytes to rank 1 (h2), which reads the same records and sends
    back the one it advanced to; with the symmetric mapping the bytes are addresses, valid on
    both hosts, and refused by a mapping elsewhere."""
    (index,) = epochs.indices("cursor")
    check_cursor_hand_off({rank: [o for o in epochs.run.results[rank]
                                  if o.get("case") == index] for rank in range(2)},
                          mixed.crc)


@pytest.mark.mpiexec
def test_symmetric_mapping_across_hosts_and_its_fallback(epochs: EpochRun,
                                                         mixed: Generated) -> None:
    """The DM readers on h1 and h2 map the file at one address (two address spaces of two
    hosts); when h2's reader cannot, both fall back to private mappings, cursors travel as
    page numbers, and every record still arrives intact."""
    dm = [i for i in epochs.indices("epochs") if epochs.cases[i]["strategy"] == "dm-spec"]
    for i in dm:
        readers = [r for r in epochs.results(i) if r["reader"]]
        assert len(readers) == 2 and {r["hostname"] for r in readers} == {"h1", "h2"}
        check_symmetric_mapping(readers, "symmetric", epochs.cases[i])
    (index,) = epochs.indices("fallback")
    case, results = epochs.cases[index], epochs.results(index)
    check_case(mixed, case, results)
    readers = [r for r in results if r["reader"]]
    assert len(readers) == 2
    check_symmetric_mapping(readers, "fallback", case)


@pytest.mark.mpiexec
def test_a_finished_job_leaves_the_hosts_clean(hosts: Hosts, epochs: EpochRun) -> None:
    """After the job, neither host runs anything or holds a file in its /dev/shm."""
    for h in hosts.names:
        assert hosts.wait_idle(h, timeout=20), (h, hosts.pids(h))
        assert hosts.shm_files(h) == [], (h, hosts.shm_files(h))
    assert epochs.run.returncode == 0


# --------------------------------------------------------------------------- bench read

#: ``lmdbio bench read`` runs one after another inside one job (one start-up)
BENCH_RUNS = """
import json, sys
from lmdbio.cli import main
for argv in json.loads(sys.argv[1]):
    if main(argv):
        sys.exit(1)
"""


@pytest.fixture(scope="module")
def direct_reads(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[int, dict[int, dict]]:
    """``bench read --direct`` of naive-stride on the hosts (map by slot: h1 runs consumers
    0 and 1, h2 2 and 3, each rank reading on its own into its host's O_DIRECT cache), two
    epochs of a CIFAR-like file (512 records of 3,072 B, one overflow page each), read-around
    0 and 128 KiB: the file's pages and the JSON document of each run."""
    out = tmp_path_factory.mktemp("multihost-direct")
    path = out / "cifar"
    write_db(path, random_items(512, 3072, seed=7), commit_every=64)
    runs = {kib: ["bench", "read", str(path), "--strategy", "naive-stride", "--mode",
                  "colocated", "--direct", "--direct-read-around", str(kib), "--batch-size",
                  "8", "--iters", "32", "--json", str(out / f"{kib}.json")]
            for kib in (0, 128)}
    run_on_hosts(hosts, 4, BENCH_RUNS, [json.dumps(list(runs.values()))], timeout=180,
                 map_by="slot")
    pages = (path / "data.mdb").stat().st_size // 4096
    return pages, {kib: json.loads((out / f"{kib}.json").read_text()) for kib in runs}


@pytest.mark.mpiexec
def test_each_host_reads_its_pages_once_per_epoch(direct_reads: tuple[int, dict[int, dict]]
                                                  ) -> None:
    """Each host's node reads, every epoch, exactly the pages its ranks touch, though its two
    ranks read on their own and change epoch at different times (one rank emptying the
    host's cache at its epoch boundary raced with the other: a host read anywhere between
    one and two epochs' worth). With 128 KiB of read-around, the records dealt one by one
    between the hosts make every host read the whole file each epoch."""
    file_pages, docs = direct_reads
    for kib, doc in docs.items():
        assert doc["direct"] and doc["direct_read_around_kib"] == kib
        assert doc["records_in_database"] == 512 and doc["iterations"]  # 16 an epoch
        for node in doc["totals"]["per_node"]:
            ranks = [r for r in doc["per_rank"] if r["node"] == node["node"]]
            assert len(ranks) == 2 and len({r["host"] for r in ranks}) == 1, ranks
            read = sum(r["direct_io"]["pages"] for r in ranks)
            assert all(r["direct_io"]["read_around_pages"] == max(kib // 4, 1)
                       for r in ranks)
            if kib == 0:
                # no shuffle: both epochs touch the same pages (a quarter of the leaves'
                # records per rank, every leaf)
                assert read == 2 * node["pages_touched"], (node, read)
                assert node["resident_pages"] == node["pages_touched"]
            else:
                # the last epoch held the whole file; each epoch read it, but for a window
                # a rank already in the next epoch read before the other rank needed it
                assert node["resident_pages"] == file_pages, node
                assert file_pages < read <= 2 * file_pages, (node, read)


# --------------------------------------------------------------------------- lmdbio launch

N_RECORDS = 48


@pytest.fixture(scope="module")
def datum_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Caffe Datum LMDB (``N_RECORDS`` 1x4x4 images) for ``lmdbio run``."""
    path = tmp_path_factory.mktemp("multihost-datum")
    rng = np.random.default_rng(3)
    write_db(path, [(b"%08d" % i, encode_datum(datum_from_array(
        rng.integers(0, 256, (1, 4, 4), dtype=np.uint8), i % 3))) for i in range(N_RECORDS)])
    return path


def write_job(path: Path, db: Path, epochs: int) -> Path:
    path.write_text(f"dataset: {{path: {db}, layout: caffe-datum}}\nworkers: {{device: cpu}}\n"
                    f"metrics: {{every: 0}}\nreaders: {{strategy: dm-spec}}\n"
                    f"batch: {{size: 4}}\nepochs: {epochs}\n")
    return path


def cluster_env() -> dict[str, str]:
    """A user's shell on a cluster's login node, plus the Makefile's mapping policy (the
    trap: alone it would put every rank on the first host) and the numba cache."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PRTE_", "PMIX_", "PMI_", "SLURM_", "LMDBIO_"))}
    env["PRTE_MCA_rmaps_default_mapping_policy"] = ":oversubscribe"
    env.setdefault("NUMBA_CACHE_DIR", str(REPO / "build" / "numba-cache"))
    return env


def launch(hosts: Hosts, job: Path, out: Path, *run_args: str) -> subprocess.Popen:
    """``lmdbio launch -n 4 --hosts h1:2,h2:2 --mpi-arg ... JOB -- lmdbio run JOB ...``:
    the agent and subnet settings and the exported numba cache go through ``--mpi-arg``,
    as a cluster's interconnect and variables would; output goes to ``out``.*."""
    mpi_args = [*hosts.mca_args(), "-x", "NUMBA_CACHE_DIR"]
    argv = [sys.executable, "-m", "lmdbio.cli", "launch", "-n", "4", "--hosts",
            hosts.host_list, *(f"--mpi-arg={a}" for a in mpi_args), str(job), "--",
            sys.executable, "-m", "lmdbio.cli", "run", str(job), *run_args]
    return subprocess.Popen(argv, cwd=REPO, env=cluster_env(), stdin=subprocess.DEVNULL,
                            stdout=open(f"{out}.out", "w"),
                            stderr=open(f"{out}.err", "w"),
                            start_new_session=True)


def finish(proc: subprocess.Popen, hosts: Hosts, timeout: float) -> int | None:
    """Wait for the launcher (kill it and the hosts' processes when it overruns); its exit
    code, ``None`` on a timeout."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return None
    finally:
        for h in hosts.names:
            if not hosts.wait_idle(h, timeout=10):
                hosts.kill(h)


def output(out: Path) -> str:
    return Path(f"{out}.out").read_text() + "\n--- stderr ---\n" + Path(f"{out}.err").read_text()


def delivered(logs: Path) -> dict[int, Counter]:
    """Per epoch, how often each key reached a worker (padding left out), from the record
    logs of every worker rank."""
    seen: dict[int, Counter] = defaultdict(Counter)
    for log in sorted(logs.glob("rank-*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("#"):
                continue
            epoch, _it, key, _label, pad = line.split()
            if pad == "0":
                seen[int(epoch)][bytes.fromhex(key)] += 1
    return seen


@pytest.mark.mpiexec
def test_lmdbio_launch_runs_a_job_on_the_hosts(hosts: Hosts, datum_db: Path,
                                               tmp_path: Path) -> None:
    """``lmdbio launch --hosts h1:2,h2:2`` maps by the host list (h1: ranks 0, 1; h2: 2, 3)
    despite the oversubscribe policy in the environment; ``lmdbio run`` sees two nodes and
    delivers every key of py-lmdb's once per epoch across the two hosts' workers."""
    job = write_job(tmp_path / "job.yaml", datum_db, epochs=2)
    logs, metrics = tmp_path / "records", tmp_path / "metrics.json"
    out = tmp_path / "launch"
    t0 = time.monotonic()
    code = finish(launch(hosts, job, out, "--record-log", str(logs), "--metrics-json",
                         str(metrics)), hosts, timeout=150)
    assert code == 0, (time.monotonic() - t0, output(out))
    result = json.loads(metrics.read_text())
    assert result["totals"]["nodes"] == 2, output(out)
    assert [r["node"] for r in result["per_rank"]] == [0, 0, 1, 1], output(out)
    keys = Counter(k for k, _ in read_pylmdb(datum_db))
    seen = delivered(logs)
    assert sorted(seen) == [0, 1] and all(seen[e] == keys for e in seen), output(out)
    for h in hosts.names:
        assert hosts.shm_files(h) == [], (h, hosts.shm_files(h))


@pytest.fixture(scope="module")
def resumed(hosts: Hosts, datum_db: Path) -> list[dict[int, dict]]:
    """One launch of tests/mpi/loader_job.py on the hosts (``--map-by node``, nodes from the
    real split): per strategy, epoch 0 straight, then a second loader resumed from the
    state a worker took after 3 batches."""
    cases = [["--set", "batch.size=8", "--set", f"readers.strategy={strategy}",
              "--set", f"shuffle.mode={shuffle}", "--set", "workers.device=cpu",
              "--resume-at", "3"]
             for strategy, shuffle in (("dm-spec", "none"), ("indexed", "global"))]
    run = run_on_hosts(hosts, 4, "loader_job.py", [str(datum_db), "--cases",
                                                     json.dumps(cases)],
                       timeout=240, map_by="node")
    return [{r: next(x for x in res if x.get("case") == k) for r, res in run.results.items()}
            for k in range(len(cases))]


@pytest.mark.mpiexec
@pytest.mark.parametrize("case", [0, 1], ids=["dm-spec", "indexed-shuffled"])
def test_resume_across_hosts_delivers_exactly_the_rest(resumed: list[dict[int, dict]],
                                                      datum_db: Path, case: int) -> None:
    """A job on two hosts resumed mid-epoch delivers exactly the batches after the saved
    one, the same records (keys) on every worker as the straight run; the straight epoch
    holds every key of py-lmdb's once across the hosts' workers."""
    workers = {r: out for r, out in resumed[case].items() if out["worker"]}
    assert len({out["node"] for out in workers.values()}) == 2  # both hosts consume
    seen: Counter = Counter()
    for r, out in workers.items():
        assert out["state"]["iteration"] == 3
        assert [b["keys"] for b in out["resumed"]] == [b["keys"] for b in out["batches"][3:]], \
            f"rank {r}"
        seen.update(k for b in out["batches"] for k, pad in zip(b["keys"], b["padding"],
                                                                  strict=True) if not pad)
    assert seen == Counter(k.hex() for k, _ in read_pylmdb(datum_db))


IBP_ON_HOSTS = """
import sys
import lmdb
import numpy as np
import loaders
from lmdbio.codecs.tensor import decode_tensor
from lmdbio.mpiutil import abort_on_error
from tests.mpi._result import emit
cfg = {"dataset": {"path": sys.argv[1], "layout": "tensor"}, "metrics": {"every": 0},
       "batch": {"size": 16}, "readers": {"strategy": "dm-spec"}, "codec": {"name": "ibp"},
       "workers": {"device": "cpu"}}
env = lmdb.open(sys.argv[1], readonly=True, lock=False)
keys = []
with abort_on_error(), loaders.open(cfg) as loader, env.begin() as txn:
    for batch in loader:
        for key, row, label, pad in zip(batch.keys, batch.data, batch.label, batch.padding):
            want, want_label = decode_tensor(txn.get(key))
            assert np.array_equal(row, want) and label == want_label, key
            if not pad:
                keys.append(key.hex())
emit({"keys": keys, "worker": loader.is_worker, "node": loader.topo.host_node})
"""


@pytest.mark.mpiexec
def test_ibp_transport_across_hosts_delivers_each_record_once(hosts: Hosts,
                                                              tmp_path: Path) -> None:
    """The IBP transport (each host's reader compresses its node's slots, the model fitted
    once and shared) on two real hosts: every record reaches one worker once, equal to
    py-lmdb's value and label (checked inside the job)."""
    from engine_helpers import ibp_rows

    items = ibp_rows(120)
    write_db(tmp_path / "tensor", items)
    run = run_on_hosts(hosts, 4, IBP_ON_HOSTS, [str(tmp_path / "tensor")], timeout=240,
                       map_by="node")
    workers = [res[-1] for res in run.results.values() if res[-1]["worker"]]
    assert {w["node"] for w in workers} == {0, 1}
    assert Counter(k for w in workers for k in w["keys"]) == \
        Counter(k.hex() for k, _ in items)


@pytest.mark.mpiexec
def test_a_host_killed_mid_epoch_ends_the_job_with_an_error(hosts: Hosts, datum_db: Path,
                                                            tmp_path: Path) -> None:
    """SIGKILL to everything on h2 (its daemon and ranks) while batches flow: the job ends
    within seconds, ``lmdbio launch`` exits non-zero with an error naming h2 (Open MPI's
    own mpiexec exits 0 here), and h1's /dev/shm is left empty."""
    job = write_job(tmp_path / "job.yaml", datum_db, epochs=100000)
    logs = tmp_path / "records"
    out = tmp_path / "launch"
    proc = launch(hosts, job, out, "--record-log", str(logs), "--step-seconds", "0.002")
    try:
        deadline = time.monotonic() + 120
        # rank 3 is a worker on h2: kill the host once its batches flow (mid-epoch)
        log = logs / "rank-00003.log"
        while not (log.exists() and len(log.read_text().splitlines()) > 30):
            assert proc.poll() is None, output(out)
            assert time.monotonic() < deadline, "no batch delivered in 120 s\n" + output(out)
            time.sleep(0.1)
        killed_at = time.monotonic()
        hosts.kill("h2")
        code = finish(proc, hosts, timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    text = output(out)
    assert code is not None and code != 0, text
    assert took < 20, (took, text)
    # (found within lines: under load another process's output may share the line)
    errors = [line for line in text.splitlines() if "lmdbio launch: error" in line]
    assert len(errors) == 1 and "lost host h2" in errors[0] and "h1" not in errors[0], text
    assert hosts.wait_idle("h1", timeout=20), hosts.pids("h1")
    assert hosts.shm_files("h1") == [], (hosts.shm_files("h1"), text)
    # no checksum error or other rank failure was made up on the survivors' side
    assert "Traceback" not in Path(f"{out}.out").read_text()



# --------------------------------------------------------------------------- launch lines
# (no hosts needed: the mpiexec lines and the lost-host report, with a stand-in mpiexec)


def test_hosts_line_maps_by_the_host_list(tmp_path: Path) -> None:
    def plan(**kw: Any) -> mpirun.LaunchPlan:
        return mpirun.build_launch(4, ["python", "t.py"], flavor="openmpi", mpiexec="m",
                                   cores=2, is_root=False, environ={}, **kw)

    several = plan(hosts="h1:2, h2:2")
    assert several.argv == ["m", "-n", "4", "--map-by", "slot", "--host", "h1:2,h2:2",
                            "python", "t.py"]
    assert not several.one_host and several.env == {}  # no private /dev/shm folder, UCX kept
    # the user's mapping wins; so does --per-node
    assert plan(hosts="h1:2,h2:2", mpi_args=["--map-by", "node"]).argv.count("--map-by") == 1
    assert plan(hosts="a,b", mpi_args=["--map-by=node"]).argv.count("--map-by") == 0
    assert plan(hosts="h1,h2", per_node=2).argv[3:5] == ["--map-by", "ppr:2:node"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1 slots=2\nh2 slots=2\n")
    assert plan(hostfile=hostfile).argv[3:5] == ["--map-by", "slot"]
    assert plan().one_host and not plan(per_node=2).one_host
    hydra = mpirun.build_launch(4, ["t"], flavor="mpich", mpiexec="m", cores=2,
                                is_root=True, environ={}, hosts="h1:2,h2:2")
    assert hydra.argv == ["m", "-n", "4", "-hosts", "h1:2,h2:2", "t"]


@pytest.mark.parametrize(("text", "message"), [
    ("", "HOST"), ("h1,,h2", "HOST"), ("h1:0", "not HOST or HOST:SLOTS"),
    ("h1:x", "not HOST or HOST:SLOTS"), ("h1:2,h1:2", "h1 more than once"),
])
def test_hosts_list_rejects(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        mpirun.parse_hosts(text)


def test_hosts_and_hostfile_exclude_each_other(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1\n")
    with pytest.raises(ConfigError, match="give one of them"):
        mpirun.build_launch(2, ["t"], flavor="openmpi", mpiexec="m", hosts="h1",
                            hostfile=hostfile)
    assert mpirun.parse_hosts("h1:2,node-2.cluster") == [("h1", 2), ("node-2.cluster", None)]


LOST = {
    "lost communication": "PRTE has lost communication with a remote daemon.\n\n"
                          "  HNP daemon   : [prterun-vm-1@0,0] on node vm\n"
                          "  Remote daemon: [prterun-vm-1@0,2] on node h2\n",
    "failed to report back": "A daemon failed to report back after being spawned. This\n"
                             "  Local host:    vm\n  Remote host:   h2\n"
                             "  Daemon exit status: 0\n",
}


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("banner", sorted(LOST))
def test_a_lost_host_is_a_non_zero_exit(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                        banner: str, stream: str) -> None:
    """A stand-in mpiexec prints PRRTE's banner (on either stream) and exits 0, as Open MPI 5
    does when a host dies: the launcher passes the output on, names the host, returns 1;
    a job on several hosts gets no /dev/shm folder of the launcher's."""
    fake = tmp_path / "mpiexec"
    fd = 1 if stream == "stdout" else 2
    fake.write_text("#!/bin/sh\necho \"dir=$OMPI_MCA_btl_sm_backing_directory\"\n"
                    f"cat >&{fd} <<'EOF'\n{LOST[banner]}EOF\nexit 0\n")
    fake.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", "")}
    assert mpirun.run_openmpi([str(fake)], dict(env), private_shm=False) == 1
    out, err = capfd.readouterr()
    assert "dir=\n" in out
    assert LOST[banner].splitlines()[0] in (out if stream == "stdout" else err)
    assert err.strip().splitlines()[-1].startswith("lmdbio launch: error: lost host h2:")
    # no banner: mpiexec's code as it is; one host: the private folder, removed after
    fake.write_text("#!/bin/sh\necho \"dir=$OMPI_MCA_btl_sm_backing_directory\"\nexit 3\n")
    assert mpirun.run_openmpi([str(fake)], dict(env)) == 3
    folder = capfd.readouterr().out.strip().removeprefix("dir=")
    assert folder.startswith("/dev/shm/lmdbio-job-") and not Path(folder).exists()
