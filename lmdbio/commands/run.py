"""``lmdbio run CONFIG [--set key.path=value ...]``: run a data-loading job.

Run it under ``mpiexec`` (or ``lmdbio launch``) for several ranks, or alone for one. Every
epoch of the configuration is delivered to the workers, which consume the batches (no
model: this measures and checks the data path). ``--step-seconds S`` makes every worker
sleep ``S`` seconds per batch, standing in for a trainer's compute step (a sleep leaves the
CPU to the readers, as a GPU step does), so the stall fraction says how much of a training
step would be spent waiting for data. ``--record-log DIR`` writes, per worker rank, the
keys it received in order with their labels; ``--metrics-json OUT`` the summary of every
rank, written by rank 0.

Figures are reported twice: over the whole run (from opening the loader: setup included)
and in steady state (after each worker's first ``--warmup`` batches, which carry the
one-off costs: compiled-kernel cache loads, the first page faults, the first read-ahead).
Startup (interpreter and imports, opening the loader, the first batch) is reported apart.

Errors: a mistake every rank finds (a bad configuration, a missing or corrupt file) is
reported once, by rank 0, and the command exits 2 on every rank; Ctrl-C exits 130
("interrupted"); an error on some ranks only ends the whole job (see
``lmdbio.mpiutil.fail_together``).

Progress: one bar, drawn by the first worker (rank 0, or in dedicated mode the first
rank that is not a reader: its batches are the trainer's), of the samples the job
delivers (the epochs' batches, cut at ``max_iterations``, times the batch size and the
workers), where :func:`lmdbio.commands.progress.wanted` says someone watches. The loader's
``metrics.every`` lines are then turned off (the bar says the same, in place), as under
``--quiet``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdbio.config
from lmdbio.commands import progress
from lmdbio.commands.argtypes import non_negative_float, non_negative_int, output_file
from lmdbio.mpiutil import fail_together, quiet_cleanup_warnings
from lmdbio.plan.epoch import job_epochs
from lmdbio.stages import READER_STAGES, WORKER_STAGES, merged, per_sample

DESCRIPTION = """\
Run a data-loading job described by a YAML file (docs/configuration.md lists every key)
and report what it delivered. Every epoch of the job is read and handed to the workers,
which take the batches without a model: this measures and checks the data path. Run it
alone for one process, or under mpiexec or lmdbio launch for several ranks (every rank
runs the same command).

On a terminal a progress bar shows the samples delivered, the rate and the time left.
The last line is the summary: the steady-state samples/s (after each worker's first
--warmup batches, which carry one-off costs) is the figure to compare between runs and
with other loaders; the whole run's figure, setup included, follows it.

Exit status: 0 done, 2 an error (reported once, by rank 0), 130 interrupted (Ctrl-C)."""

EXAMPLES = """\
lmdbio run configs/quickstart.yaml
lmdbio run JOB.yaml --set batch.size=128 --set epochs=3
lmdbio run JOB.yaml --step-seconds 0.005   # a 5 ms step: do workers wait?
lmdbio run JOB.yaml --metrics-json run.json --stages
lmdbio launch -n 4 --simulate-nodes 2 JOB.yaml -- lmdbio run JOB.yaml
mpiexec -n 8 lmdbio run JOB.yaml --record-log logs/"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML job configuration")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE",
                        help="override a configuration value, e.g. --set batch.size=128 "
                             "(repeatable)")
    parser.add_argument("--metrics-json", metavar="OUT", default=None, type=output_file,
                        help="write the job's figures to OUT as JSON: the totals (whole run "
                             "and steady state, startup, stages) and every rank's own "
                             "(written by rank 0)")
    parser.add_argument("--record-log", metavar="DIR", default=None,
                        help="write each worker's received keys, in order, to DIR")
    parser.add_argument("--step-seconds", type=non_negative_float, default=0.0, metavar="S",
                        help="workers sleep S seconds per batch to simulate the trainer's "
                        "compute; the stall fraction is the share of time spent waiting for "
                        "data")
    parser.add_argument("--slot-checksum",
                        choices=list(typing.get_args(lmdbio.config.SlotChecksum)), default=None,
                        help="checksum of each worker's part of a node batch in shared memory "
                        "(overrides readers.checksum, default xxh64; none where the batch path "
                        "is trusted)")
    parser.add_argument("--stages", action="store_true",
                        help="time every stage of the data path (CPU and idle microseconds "
                        "per sample, by role, in the summary and --metrics-json); costs about "
                        "two microseconds per stage and batch")
    parser.add_argument("--warmup", type=non_negative_int, default=2, metavar="N",
                        help="batches per worker left out of the steady-state figures "
                        "(default 2)")
    progress.add_arguments(parser)


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``), or None where unknown.

    Lets the startup cost (interpreter, imports, compiled-kernel cache loads) be reported
    apart from the data path.
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); 3 fields precede the split
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def minor_page_faults() -> int:
    """Minor page faults of this process so far (mapping pages: a cost of fresh memory)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


class SteadyMeter:
    """A rank's steady-state figures: what happened after its first ``warmup`` batches.

    Workers call :meth:`mark` after each consumed batch with the loader's cumulative metrics;
    dedicated readers after each iteration they published (see :func:`count_reads`). The
    window opens at the ``warmup``-th mark (at once with ``warmup`` 0) and closes at the last.
    ``in_loader`` accumulates the time the trainer spent inside the loader's iterator
    (waiting for the ring, decoding, transforming): the time a training step waits for data.
    CPU time is the process's (``time.process_time``), so it does not depend on how the OS
    shared oversubscribed cores; it is read only where the window opens and in
    :meth:`finish` (a system call per batch would be a preemption point of its own).
    """

    def __init__(self, warmup: int) -> None:
        self.warmup = max(0, int(warmup))
        self.count = 0
        self.in_loader = 0.0
        self.start: tuple[float, float, int, float, float, float] | None = None
        self.end: tuple[float, float, int, float, float, float] | None = None
        self.first_batch_at: float | None = None

    def begin(self, metrics: Any = None) -> None:
        """Open the window at once when there is no warmup."""
        if self.warmup == 0 and self.start is None:
            self.start = self._snap(metrics, cpu=True)

    def _snap(self, m: Any, cpu: bool = False) -> tuple[float, float, int, float, float, float]:
        samples, wait, blocked = (m.samples, m.wait_seconds, m.blocked_seconds) \
            if m is not None else (0, 0.0, 0.0)
        return (time.perf_counter(), time.process_time() if cpu else 0.0, samples, wait,
                self.in_loader, blocked)

    def mark(self, metrics: Any = None) -> None:
        self.count += 1
        if self.count == self.warmup:
            self.start = self._snap(metrics, cpu=True)
        self.end = self._snap(metrics)

    def finish(self) -> None:
        """Close the window's CPU time (after the last mark)."""
        if self.end is not None:
            self.end = (self.end[0], time.process_time(), *self.end[2:])

    def as_dict(self) -> dict[str, float] | None:
        if self.start is None or self.end is None or self.count <= self.warmup:
            return None
        seconds = self.end[0] - self.start[0]
        cpu = self.end[1] - self.start[1]
        samples = self.end[2] - self.start[2]
        wait = self.end[3] - self.start[3]
        in_loader = self.end[4] - self.start[4]
        blocked = self.end[5] - self.start[5]
        batches = self.count - self.warmup
        return {
            "batches": batches, "samples": samples, "seconds": seconds, "cpu_seconds": cpu,
            "wait_seconds": wait, "loader_seconds": in_loader,
            "samples_per_second": samples / seconds if seconds > 0 else 0.0,
            "seconds_per_batch": seconds / batches,
            "stall_fraction": wait / seconds if seconds > 0 else 0.0,
            "blocked_seconds": blocked,
            "blocked_fraction": blocked / seconds if seconds > 0 else 0.0,
            "loader_fraction": in_loader / seconds if seconds > 0 else 0.0,
        }


def count_reads(session: Any, meter: SteadyMeter) -> None:
    """Mark ``meter`` once per iteration a dedicated reader publishes, when it publishes it
    (a slot of several iterations marks them all; measurement only: a hook of the
    session's :attr:`~lmdbio.reader.ReadSession.on_read_group`). The session's stage clock
    restarts where the steady window opens."""

    def counted(first: int, count: int) -> None:
        for _ in range(count):
            meter.mark()
            if meter.count == meter.warmup:
                session.stages.reset()

    session.on_read_group.append(counted)


def totals(summaries: list[dict[str, Any]], nodes: int, strategy: str, mode: str,
           step: float) -> dict[str, Any]:
    """Job-wide figures from every rank's summary (rank 0, after the gather)."""
    workers = [s for s in summaries if s["worker"]]
    n = max(len(workers), 1)
    total: dict[str, Any] = {
        "ranks": len(summaries), "nodes": nodes, "strategy": strategy, "mode": mode,
        "workers": len(workers), "step_seconds": step,
        "samples": sum(s["samples"] for s in workers),
        "seconds": max(s["seconds"] for s in summaries),
        "stall_fraction_mean": sum(s["stall_fraction"] for s in workers) / n,
    }
    total["samples_per_second"] = total["samples"] / total["seconds"]
    steady = [s["steady"] for s in workers if s.get("steady")]
    if steady and len(steady) == len(workers):
        seconds = max(s["seconds"] for s in steady)
        samples = sum(s["samples"] for s in steady)
        total["steady"] = {
            "samples": samples, "seconds": seconds,
            "samples_per_second": samples / seconds if seconds > 0 else 0.0,
            "samples_per_second_per_worker": samples / seconds / n if seconds > 0 else 0.0,
            "seconds_per_batch_mean": sum(s["seconds_per_batch"] for s in steady) / n,
            "stall_fraction_mean": sum(s["stall_fraction"] for s in steady) / n,
            "stall_fraction_max": max(s["stall_fraction"] for s in steady),
            "blocked_fraction_mean": sum(s["blocked_fraction"] for s in steady) / n,
            "blocked_fraction_max": max(s["blocked_fraction"] for s in steady),
            "loader_fraction_mean": sum(s["loader_fraction"] for s in steady) / n,
            "loader_fraction_max": max(s["loader_fraction"] for s in steady),
        }
        readers = [s["reader_steady"] for s in summaries if s.get("reader_steady")]
        cpu = sum(s["cpu_seconds"] for s in steady) + sum(r["cpu_seconds"] for r in readers)
        total["steady"]["cpu_seconds"] = cpu  # workers' and dedicated readers' processes
        total["steady"]["cpu_microseconds_per_sample"] = 1e6 * cpu / max(samples, 1)
    total["cpu_seconds"] = sum(s["loop"]["cpu_seconds"] for s in summaries)
    total["cpu_microseconds_per_sample"] = 1e6 * total["cpu_seconds"] / max(total["samples"], 1)
    # per sample of the steady window, where the stage clocks were restarted
    by_role = stages_by_role(summaries, total.get("steady", total)["samples"])
    if by_role:
        total["stages_us_per_sample"] = by_role
    ages = [s["startup"] for s in summaries if s.get("startup")]
    if ages:
        total["startup"] = {k: max(a[k] for a in ages if a.get(k) is not None)
                            for k in ("to_open", "open_seconds", "to_first_batch")
                            if any(a.get(k) is not None for a in ages)}
    return total


def stages_by_role(summaries: list[dict[str, Any]], samples: int
                   ) -> dict[str, dict[str, dict[str, float]]]:
    """The job's CPU and idle microseconds per delivered sample, by role (``reader``: every
    rank's reader stages, dedicated or colocated; ``worker``: every worker's) and stage;
    empty when no rank timed its stages."""
    parts = [s.get("stages") or {} for s in summaries]
    out = {}
    for role, names in (("reader", READER_STAGES), ("worker", WORKER_STAGES)):
        mine = merged([{k: v for k, v in p.items() if k in names} for p in parts])
        if mine:
            out[role] = per_sample({k: mine[k] for k in names if k in mine}, samples)
    return out


def stage_lines(by_role: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """One line per role: each stage's CPU (and idle) microseconds per sample."""
    return [f"[lmdbio] {role} per sample: " + ", ".join(
        f"{name} {s['cpu_us']:.2f} us CPU ({s['idle_us']:.2f} idle)"
        for name, s in stages.items()) for role, stages in by_role.items()]


def summary_line(total: dict[str, Any], warmup: int) -> str:
    """The job's one summary line: the steady-state rate first (the figure to compare: it
    leaves out the one-off costs of the first batches), then the whole run's, labelled."""
    workers = total["workers"]
    head = f"[lmdbio] done: {total['samples']} samples to {workers} worker" + \
        ("s" if workers != 1 else "")
    whole = (f"whole run {total['samples_per_second']:,.0f} samples/s over "
             f"{total['seconds']:.2f} s, setup included")
    st = total.get("steady")
    if st is None:
        return (f"{head}; {whole} (no steady-state figure: no worker got more than "
                f"--warmup {warmup} batches)")
    line = (f"{head}; steady state {st['samples_per_second']:,.0f} samples/s (the figure "
            f"to compare: after {warmup} warm-up batches per worker)")
    if total.get("step_seconds"):
        line += (f", workers waited for data {100 * st['stall_fraction_mean']:.1f}% of "
                 f"the time (blocked on the ring {100 * st['blocked_fraction_mean']:.1f}%)")
    return f"{line}; {whole}"


class _Bar:
    """The progress of the samples a job delivers, drawn by one rank (see the module's
    doc): each of this worker's batches counts for every worker's (they get as many)."""

    def __init__(self, tqdm_bar: Any, workers: int, batch_size: int, epochs: int) -> None:
        self._bar = tqdm_bar
        self.workers = workers
        self.epochs = epochs  #: the job's last epoch, counted from 1
        self._batch_size = batch_size
        self._first = True

    def set_description_str(self, text: str, refresh: bool = True) -> None:
        self._bar.set_description_str(text, refresh=refresh)

    def batch(self, samples: int) -> None:
        """One batch of ``samples`` delivered to this worker (and to every other)."""
        if self._first:
            self._first = False
            if self._bar.total and samples != self._batch_size and self._batch_size:
                # records holding several samples (PCR groups, IBP and TOC rows)
                self._bar.total = self._bar.total * samples // self._batch_size
        self._bar.update(samples * self.workers)

    def close(self) -> None:
        self._bar.close()


def delivery_bar(loader: Any, show: bool) -> _Bar:
    """The bar of :func:`main`'s loop: total = the job's iterations (every epoch, cut at
    ``max_iterations``) x batch size x workers; a disabled one on every other rank."""
    here = show and loader.is_worker and loader.topo.worker_rank == 0
    workers = max(int(getattr(loader.session, "consumers", 1) or 1), 1)
    total, last = None, loader.cfg.epochs
    if here:
        per = loader.session.epoch_iterations
        schedule = job_epochs(loader.cfg.epochs, loader.cfg.max_iterations, per)
        total = sum(stop or per for _, stop in schedule) * loader.cfg.batch.size * workers
        last = schedule[-1][0] + 1 if schedule else last
    return _Bar(progress.bar(total, "run", " samples", show=here, unit_scale=True),
                workers, loader.cfg.batch.size, last)


@contextlib.contextmanager
def _quiet_on_error() -> Iterator[None]:
    """Silence lmdbio's cleanup warnings once the block raised (the error is reported)."""
    try:
        yield
    except BaseException:
        quiet_cleanup_warnings()
        raise


def main(args: argparse.Namespace) -> int:
    """``lmdbio run``: open the loader, deliver every batch of the job (optionally logging
    them and sleeping a training step each), then rank 0 reports the job's figures."""
    from loaders import open as open_loader

    step = float(getattr(args, "step_seconds", 0.0) or 0.0)
    warmup = int(getattr(args, "warmup", 2))
    show = progress.wanted(args)
    overrides = loader_overrides(args, show)
    # an error on every rank (a bad config, a missing or corrupt file) is reported once, by
    # rank 0, and every rank exits 2 (130 interrupted); an error on some ranks only ends
    # the job (Abort) after a short grace; one process starts MPI only if it gets that far
    with fail_together():
        age0 = process_age()
        t_open = time.perf_counter()
        checksum = getattr(args, "slot_checksum", None)
        loader = open_loader(args.config, overrides, slot_checksum=checksum)
        checksum = loader.cfg.readers.checksum if checksum is None else checksum
        open_seconds = time.perf_counter() - t_open
        # an error inside is reported by fail_together: the warnings of the ring's abort
        # on the way out (the loader's __exit__, after _quiet_on_error's) would repeat it
        with loader, _quiet_on_error():
            summary = run_job(args, loader, show, step, warmup)
            summary["startup"] = {"to_open": age0, "open_seconds": open_seconds,
                                  **summary["startup"]}
            summaries = loader.topo.world.gather(summary, root=0)
            if loader.topo.rank == 0:
                assert summaries is not None  # gathered at the root
                report(args, loader, summaries, checksum, step, warmup)
    return 0


def loader_overrides(args: argparse.Namespace, show: bool) -> list[str]:
    """The configuration overrides the loader opens with: ``args.overrides``, and no
    periodic metrics lines when the bar shows (it says the same, in place) or ``--quiet``.

    The same on every rank, decided before the loader opens.
    """
    overrides = list(args.overrides)
    if show or getattr(args, "quiet", False):
        overrides.append("metrics.every=0")
    return overrides


def open_record_log(record_log: str | None, loader: Any) -> typing.TextIO | None:
    """This worker's ``rank-NNNNN.log`` in the ``--record-log`` folder (made if needed), its
    header written; None without ``--record-log`` or on a rank that does not train."""
    if not record_log or not loader.is_worker:
        return None
    d = Path(record_log)
    d.mkdir(parents=True, exist_ok=True)
    log = open(d / f"rank-{loader.topo.rank:05d}.log", "w")  # noqa: SIM115
    log.write("# epoch iteration key label padding\n")
    return log


def log_batch(log: typing.TextIO, epoch: int, batch: Any) -> None:
    """One line per record of ``batch``: epoch, iteration, key (hex), label, padding.

    Flushed at once: a job killed later leaves every delivered batch in the log.
    """
    labels = [int(x) for x in batch.label.tolist()] \
        if hasattr(batch.label, "tolist") else list(batch.label)
    log.write("".join(
        f"{epoch} {batch.iteration} {key.hex()} {label} {int(pad)}\n"
        for key, label, pad in zip(batch.keys, labels, batch.padding.tolist(), strict=False)))
    log.flush()


def run_job(args: argparse.Namespace, loader: Any, show: bool, step: float,
            warmup: int) -> dict[str, Any]:
    """Deliver every batch of the job and return this rank's summary (the loader's, with the
    loop's time, CPU and page faults, the ring's counters and the steady-state meters)."""
    log = open_record_log(args.record_log, loader)
    loader.stages.enabled = bool(getattr(args, "stages", False))
    meter = SteadyMeter(warmup)
    meter.begin(loader.metrics)
    reader_meter = None
    if loader.session.reads and not loader.is_worker:  # a dedicated reader
        reader_meter = SteadyMeter(warmup)
        reader_meter.begin()
        count_reads(loader.session, reader_meter)
    bar = delivery_bar(loader, show)
    t_loop, cpu_loop = time.perf_counter(), time.process_time()
    faults_loop = minor_page_faults()
    try:
        deliver(loader, meter, bar, log, step, warmup)
    finally:
        bar.close()
        if log is not None:
            log.close()
    meter.finish()
    if reader_meter is not None:
        reader_meter.finish()
    loop_seconds = time.perf_counter() - t_loop
    loop_cpu = time.process_time() - cpu_loop
    summary = loader.summary()
    # CPU time of this process over every epoch (all threads): what the data path
    # costs, apart from how the OS shared the cores among oversubscribed ranks
    summary["loop"] = {"seconds": loop_seconds, "cpu_seconds": loop_cpu,
                       "minor_page_faults": minor_page_faults() - faults_loop}
    ring = getattr(loader.session, "ring", None)
    summary["ring"] = ring.stats.as_dict() if ring is not None else None
    summary["steady"] = meter.as_dict() if loader.is_worker else None
    summary["reader_steady"] = reader_meter.as_dict() if reader_meter else None
    summary["startup"] = {
        "to_first_batch": (meter.first_batch_at - t_loop)
        if meter.first_batch_at is not None else None,
    }
    return summary


def deliver(loader: Any, meter: SteadyMeter, bar: _Bar, log: typing.TextIO | None,
            step: float, warmup: int) -> None:
    """The loop a trainer runs: every epoch's batches (``cfg.epochs``, cut at
    ``cfg.max_iterations``), timed in ``meter`` (time inside the loader apart), logged,
    then ``step`` seconds of sleep for the training step. Stages are timed in the steady
    window only (reset after ``warmup`` batches)."""
    for epoch in loader.epochs():
        bar.set_description_str(f"epoch {epoch + 1}/{bar.epochs}", refresh=False)
        batches = iter(loader)
        while True:
            t0 = time.perf_counter()
            batch = next(batches, None)
            meter.in_loader += time.perf_counter() - t0
            if batch is None:
                break
            if meter.first_batch_at is None:
                meter.first_batch_at = time.perf_counter()
            if log is not None:
                log_batch(log, epoch, batch)
            if step > 0:
                time.sleep(step)
            meter.mark(loader.metrics)
            bar.batch(len(batch))
            if meter.count == warmup and loader.is_worker:
                loader.stages.reset()


def report(args: argparse.Namespace, loader: Any, summaries: list[dict[str, Any]],
           checksum: Any, step: float, warmup: int) -> None:
    """Rank 0's report: the job's totals over every rank's summary, printed as one line
    (and the stage lines), and with ``--metrics-json`` written with the per-rank ones."""
    total = totals(summaries, loader.topo.host_nodes, loader.cfg.readers.strategy,
                   loader.topo.mode, step)
    total["node_rings"] = loader.topo.n_nodes  # reader groups: a ring and a reader each
    total["slot_checksum"] = checksum
    result = {"totals": total, "per_rank": summaries}
    line = summary_line(total, warmup)
    print(line, flush=True)
    for text in stage_lines(total.get("stages_us_per_sample", {})):
        print(text, flush=True)
    if args.metrics_json:
        Path(args.metrics_json).write_text(json.dumps(result, indent=2) + "\n")
