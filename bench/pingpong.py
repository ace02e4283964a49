"""Ping-pong between 2 ranks: the DM cursor hand-off's latency and what its waiting costs.

Rank 0 sends 72 bytes (a cursor's size) to rank 1; rank 1 works ``delay`` seconds
(spinning) and sends them back; each rank waits for its message in one of these ways
(:data:`POLICIES`):

* ``chain``: as a DM reader waits for its cursor, :func:`lmdbio.plan.strategies.dm.
  wait_for_cursor` (whatever lmdbio's policy is when this runs);
* ``poll-<cap>us-<slack>``: :func:`lmdbio.mpiutil.wait_with_timeout` with sleeps from 50 us
  doubling to ``cap`` and the thread's timer slack ``slack`` ("default": the system's,
  50 us on Linux) while it sleeps: the policies compared in docs/findings/
  scaling-calibration-2026-11-28.md;
* ``blocking``: ``Request.wait`` (Open MPI spins: the waiting rank burns its core).

Per policy and partner work (0, 1, 5 and 20 ms) it keeps the round trip less the work
(median and quartiles over the rounds) and the CPU seconds rank 0 spent waiting per second
it waited (``process_time`` over wall time: 1 is a core burnt). The model's wait costs
come from the ``chain`` cases (:func:`wait_costs`): ``mpi_latency_s``, half the blocking
round trip without work, and ``poll_overshoot_s``, how much longer than asked each sleep
lasts (measured on the chain's own sleeps, alone: :func:`sleep_overshoot`).

Run: .venv/bin/python -m bench.pingpong OUT.json [--policies chain,blocking] [--share 1]
(starts ``mpiexec -n 2`` itself; ``--worker`` is what each rank runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import BIN, MPI_ENV, write_json
from lmdbio.scale import Costs
from lmdbio.scale.model import poll_delay

#: the partner's work before it replies (seconds), and the rounds of each case
DELAYS = ((0.0, 200), (1e-3, 200), (5e-3, 200), (20e-3, 60))
#: the ways of waiting compared: name -> (longest sleep, timer slack while sleeping);
#: ``chain`` and ``blocking`` are handled apart
POLICIES: dict[str, tuple[float, float | None]] = {
    "poll-500us-default": (5e-4, None),
    "poll-500us-1us": (5e-4, 1e-6),
    "poll-200us-1us": (2e-4, 1e-6),
    "poll-100us-1us": (1e-4, 1e-6),
    "poll-100us-default": (1e-4, None),
    "poll-50us-1us": (5e-5, 1e-6),
}


def wait_once(req: Any, policy: str) -> None:
    """Wait for ``req`` as ``policy`` says (see the module docstring)."""
    from lmdbio.mpiutil import wait_with_timeout
    from lmdbio.plan.strategies.dm import wait_for_cursor

    if policy == "chain":
        wait_for_cursor(req, 30.0, "ping-pong")
    elif policy == "blocking":
        req.wait()
    else:
        cap, slack = POLICIES[policy]
        wait_with_timeout(req, 30.0, "ping-pong", max_sleep=cap, sleep_slack=slack)


def sleep_overshoot(policy: str, rounds: int = 100) -> dict[str, float]:
    """How much longer than asked the sleeps of ``policy``'s schedule last (50 us
    doubling to its longest sleep, at its timer slack), each size slept ``rounds`` times
    in a row: the median overshoot per size, and ``median_s`` over all of them. What the
    model calls ``poll_overshoot_s``, measured on the sleeps themselves."""
    from lmdbio.plan.strategies import dm
    from lmdbio.timerslack import timer_slack

    cap, slack = (dm.CURSOR_MAX_SLEEP_S, dm.CURSOR_SLEEP_SLACK_S) if policy == "chain" \
        else POLICIES[policy]
    out: dict[str, float] = {}
    every = []
    sleep = 5e-5
    with timer_slack(slack):
        while True:
            late = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                time.sleep(sleep)
                late.append(time.perf_counter() - t0 - sleep)
            out[f"{sleep * 1e6:g}us"] = float(np.median(late))
            every += late
            if sleep >= cap:
                break
            sleep = min(sleep * 2, cap)
    out["median_s"] = float(np.median(every))
    return out


def worker(out: Path, policies: list[str], share: float = 1.0) -> None:
    """One rank's side of every case (run under ``mpiexec -n 2``), ``share`` of each
    case's rounds (at least 5); rank 0 writes ``out``."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me, msg = comm.Get_rank(), bytes(72)
    result: dict[str, Any] = {}
    for policy in policies:
        for delay, all_rounds in DELAYS:
            rounds = max(5, round(all_rounds * share))
            samples, cpu, waited = [], 0.0, 0.0
            for _ in range(rounds):
                comm.Barrier()
                t0 = time.perf_counter()
                if me == 0:
                    comm.send(msg, dest=1)
                req = comm.irecv(source=1 - me)
                w0, c0 = time.perf_counter(), time.process_time()
                wait_once(req, policy)
                cpu += time.process_time() - c0
                waited += time.perf_counter() - w0
                if me == 1:
                    end = time.perf_counter() + delay
                    while time.perf_counter() < end:
                        pass
                    comm.send(msg, dest=0)
                samples.append(time.perf_counter() - t0 - delay)
            q = np.percentile(samples, [25, 50, 75]).tolist()
            wait = policy if policy in ("chain", "blocking") else "poll"
            result[f"{policy}-{delay * 1e3:g}ms"] = {
                "wait": wait, "policy": policy, "partner_work_s": delay,
                "round_trip_less_work_s": q[1], "q25_s": q[0], "q75_s": q[2],
                "rounds": rounds, "waiter_cpu_per_wait_s": cpu / max(waited, 1e-12)}
    comm.Barrier()
    if me == 0:
        result["sleep_overshoot"] = {p: sleep_overshoot(p, max(5, round(100 * share)))
                                     for p in policies if p != "blocking"}
        result["policies"] = {p: ({"max_sleep_s": POLICIES[p][0], "sleep_slack_s":
                                   POLICIES[p][1]} if p in POLICIES else None)
                              for p in policies}
        write_json(out, result)


def run(out: Path, policies: list[str], share: float = 1.0) -> dict:
    """The ping-pong under ``mpiexec -n 2`` into ``out`` (kept: reused if there), with
    each case's hand-off latency (its round trip less the work, less the other way's
    one-way time: half the same policy's round trip without work), the model's wait
    costs (:func:`wait_costs`) and their check (:func:`model_check`)."""
    if not out.exists():
        cmd = [str(BIN / "mpiexec"), "-n", "2", str(BIN / "python"), "-m", "bench.pingpong",
               str(out), "--worker", "--policies", ",".join(policies), "--share",
               str(share)]
        subprocess.run(cmd, env=dict(os.environ, **MPI_ENV), check=True, timeout=300)
    data = json.loads(out.read_text())
    for case in cases(data):
        policy = case.setdefault("policy", case["wait"])  # files of 2026-11-28 00:20
        back = data[f"{policy}-0ms"]["round_trip_less_work_s"] / 2
        case["handoff_s"] = case["round_trip_less_work_s"] - back
    if "chain-0ms" in data and "blocking-0ms" in data:
        costs = wait_costs(data)
        data["model_costs"] = costs
        data["model_check"] = model_check(data, Costs().replace(**costs))
    data["loadavg"] = os.getloadavg()
    return data


def cases(data: dict) -> list[dict]:
    """The measured cases of a ping-pong result (not its summaries)."""
    return [v for v in data.values() if isinstance(v, dict) and "partner_work_s" in v]


def wait_costs(pingpong: dict) -> dict[str, float]:
    """The model's message and wait costs on this host, from the ping-pong:
    ``mpi_latency_s``, half the round trip without work with a blocking ``recv`` (or with
    the chain's wait when that is shorter: a spinning ``recv`` competes with the sender
    for the cores on a loaded host), and ``poll_overshoot_s``, the median overshoot of
    the chain's sleeps measured on the sleeps themselves (:func:`sleep_overshoot`); in a
    file from before that measurement (2026-11-28 00:20), the chain's round trip without
    work less the first sleep (taken as one sleep: the partner answers at once)."""
    first = Costs().poll_first_sleep_s
    chain0 = pingpong["chain-0ms"]["round_trip_less_work_s"]
    block0 = pingpong["blocking-0ms"]["round_trip_less_work_s"]
    slept = pingpong.get("sleep_overshoot", {}).get("chain")
    return {"mpi_latency_s": min(block0, chain0) / 2,
            "poll_overshoot_s": slept["median_s"] if slept else max(0.0, chain0 - first)}


def model_check(pingpong: dict, costs: Costs) -> dict[str, dict[str, float]]:
    """Per chain case with work, the round trip less the work the model's
    :func:`~lmdbio.scale.model.poll_delay` gives (the answer arrives two latencies after
    the work; the waiting rank notices it at its next test), beside the measured median
    and quartiles."""
    out = {}
    for name, case in pingpong.items():
        if not isinstance(case, dict) or case.get("wait") != "chain" or \
                not case.get("partner_work_s"):
            continue
        arrives = case["partner_work_s"] + 2 * costs.mpi_latency_s
        model = arrives + poll_delay(arrives, costs) - case["partner_work_s"]
        out[name] = {"model_s": model, "measured_s": case["round_trip_less_work_s"],
                     "q25_s": case["q25_s"], "q75_s": case["q75_s"]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--policies", default=",".join(["chain", "blocking", *POLICIES]))
    parser.add_argument("--share", type=float, default=1.0,
                        help="share of each case's rounds to run (a quick check: 0.1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    policies = args.policies.split(",")
    unknown = set(policies) - {"chain", "blocking", *POLICIES}
    if unknown:
        parser.error(f"unknown policies: {', '.join(sorted(unknown))}")
    if args.worker:
        worker(Path(args.out), policies, args.share)
        return 0
    data = run(Path(args.out), policies, args.share)
    write_json(args.out, data, default=float)
    for case in cases(data):
        print(f"{case['policy']:20s} work {case['partner_work_s'] * 1e3:4g} ms  round trip "
              f"less work {case['round_trip_less_work_s'] * 1e6:7.1f} us (quartiles "
              f"{case['q25_s'] * 1e6:.0f}-{case['q75_s'] * 1e6:.0f})  waiter CPU "
              f"{case['waiter_cpu_per_wait_s']:.3f} s per s waited", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
