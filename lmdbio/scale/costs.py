"""The cost parameters of the scaling model, and loading them from YAML.

Every cost is a number with a unit in its name (seconds, bytes, bytes per second), so a
file of them can be read without this module. The file system's figures describe one
client node and the whole file system (the shared limit every node's reads divide); the
CPU figures are per record, per page or per byte of one core of the machine that runs the
readers, and are what ``bench/scale_calibrate.py`` fits from measured runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmdbio.errors import ConfigError


@dataclass(frozen=True)
class Costs:
    """Costs of one epoch's work (see the module docstring; defaults: this project's host,
    warm page cache, so the file system costs nothing)."""

    #: latency of one read request to the file system (a page fault's read, an RPC)
    fs_latency_s: float = 0.0
    #: read bandwidth one client node can get from the file system
    fs_node_bandwidth_bps: float = float("inf")
    #: read bandwidth of the whole file system, shared by every node reading at once
    fs_aggregate_bandwidth_bps: float = float("inf")
    #: the kernel's read-around on a page fault of a mapping (strategies that do not ask
    #: for their pages ahead: the naive ones, LMM, dm-serial); one page means none
    readahead_bytes: int = 4096
    #: the largest single read request (asked-for runs are split into these)
    fs_max_request_bytes: int = 1 << 20
    #: asynchronous requests one node keeps in flight (asked-for reads)
    fs_async_depth: int = 8
    #: one MPI message (the DM cursor hand-off): latency and bandwidth
    mpi_latency_s: float = 2e-6
    mpi_bandwidth_bps: float = 3e9
    #: how a DM reader waits for its cursor (``DmSerial.receive_cursor`` through
    #: :func:`lmdbio.mpiutil.wait_with_timeout`): it tests the request, then sleeps
    #: ``poll_first_sleep_s``, doubling up to ``poll_max_sleep_s``, between tests, so a
    #: cursor is noticed at the first test after it arrived, not when it arrived
    poll_first_sleep_s: float = 5e-5
    poll_max_sleep_s: float = 1e-4
    #: how much longer than asked each of those sleeps lasts (the thread's timer slack,
    #: which the DM readers set to 1 us while they wait, and the wake-up; measured by
    #: bench/pingpong.py on the sleeps alone: 14 us on this project's quiet host, 62-84 us
    #: at Linux's default slack of 50 us)
    poll_overshoot_s: float = 1.4e-5
    #: CPU per record a cursor steps over one at a time (walk_collect)
    cpu_walk_s: float = 0.0
    #: CPU per record passed leaf by leaf (walk_skip, the DM chain)
    cpu_skip_s: float = 0.0
    #: CPU per record located through the leaf directory (indexed)
    cpu_locate_s: float = 0.0
    #: CPU per read, whatever its size (a slot of a node's reader, a naive rank's batch:
    #: the calls around the compiled kernels)
    cpu_step_s: float = 0.0
    #: CPU per distinct page a read touches (mapping it, parsing a leaf)
    cpu_page_s: float = 0.0
    #: CPU per read per page of the *file*: ``bench read``'s page accounting (on by
    #: default there, off in a training job) clears and scans a bitmap of every page of
    #: the file at each read, whatever the read's size. Measured apart from the fit
    #: (bench/scale_calibrate.py ``--only copy``: about 1 ns a page on this host); 0 for a
    #: job that does not count pages
    cpu_account_s_per_file_page: float = 0.0
    #: CPU per read of a reader that speculates (dm-spec), besides its walk: estimating
    #: the next share's pages, checking whether they are resident before asking for
    #: them, and observing what the walk read (the estimators, dm-spec's compiled
    #: bookkeeping pass), whether or not any page is then read
    cpu_speculate_s: float = 0.0
    #: a consumer copying its records into its own memory, per byte
    copy_s_per_byte: float = 0.0
    #: a consumer decoding one record (0: ``bench read`` does not decode)
    decode_s_per_record: float = 0.0
    #: a consumer taking one record, besides copying and decoding it (its reference, the
    #: delivery's bookkeeping): what every delivered record costs however it was found
    consume_s_per_record: float = 0.0
    #: a ring slot handed from a node's reader to one of its workers (shared memory)
    handoff_s_per_slot: float = 0.0
    #: CPU per slot of a node-level strategy besides the ring's hand-off and the read's
    #: ``cpu_step_s``, whatever the slot's size: the reader finding its node's share of
    #: the slot and the records' spans, asking ahead for the next slot, filling the
    #: slot's tables; the worker taking the slot apart. Slots of 2,000-4,000 records hide
    #: it (bench/scale_calibrate.py fits it on runs at 1 and 4 batches a slot too)
    cpu_slot_s: float = 0.0
    #: every CPU cost above is multiplied by this: how much longer the same work takes a
    #: core when the host's other cores are busy too (shared caches, memory bandwidth).
    #: The CPU costs are fitted on one rank with the host's other core idle (1); a job
    #: with a rank on every core runs at the factor bench/scale_calibrate.py measures by
    #: running two one-rank jobs at once
    cpu_contention_factor: float = 1.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"costs: {f.name} must be a number, got {v!r}")
            if v != v or v < 0:
                raise ConfigError(f"costs: {f.name} must be >= 0, got {v!r}")
        for name in ("fs_node_bandwidth_bps", "fs_aggregate_bandwidth_bps",
                     "mpi_bandwidth_bps", "readahead_bytes", "fs_max_request_bytes",
                     "fs_async_depth", "poll_first_sleep_s", "poll_max_sleep_s",
                     "cpu_contention_factor"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"costs: {name} must be > 0, got {getattr(self, name)!r}")
        if self.poll_max_sleep_s < self.poll_first_sleep_s:
            raise ConfigError(f"costs: poll_max_sleep_s ({self.poll_max_sleep_s!r}) must be "
                              f">= poll_first_sleep_s ({self.poll_first_sleep_s!r})")

    def replace(self, **changes: Any) -> Costs:
        """A copy with ``changes`` (checked as any other)."""
        return dataclasses.replace(self, **changes)

    def blocking_cursor_wait(self) -> Costs:
        """A copy whose DM readers notice their cursor as it arrives (within 1 ns), as a
        reader blocked in MPI's receive would, instead of testing between sleeps: what the
        chain would cost without ``poll_*``'s delays."""
        return self.replace(poll_first_sleep_s=1e-9, poll_max_sleep_s=1e-9,
                            poll_overshoot_s=0.0)

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def costs_from_mapping(data: Any, base: Costs | None = None, what: str = "costs") -> Costs:
    """``base`` (default :class:`Costs`) with the fields of mapping ``data``; unknown
    fields and non-numbers are :class:`~lmdbio.errors.ConfigError` naming them. A
    ``costs:`` key holding the mapping is accepted too (files with ``source:`` notes)."""
    if isinstance(data, dict) and isinstance(data.get("costs"), dict):
        data = data["costs"]  # a file with notes: ``source:``, ``ranges:`` beside it
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: expected a mapping of cost names to numbers, got "
                          f"{type(data).__name__}")
    known = {f.name for f in dataclasses.fields(Costs)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{what}: unknown cost(s) {', '.join(map(str, unknown))}; known: "
                          f"{', '.join(sorted(known))}")
    values = {}
    for k, v in data.items():
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise ConfigError(f"{what}: {k} must be a number, got {v!r}") from None
        values[k] = v
    return dataclasses.replace(base or Costs(), **values)


def _read_yaml(path: str | Path) -> Any:
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the cost file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    return data if data is not None else {}


def load_costs(path: str | Path, base: Costs | None = None) -> Costs:
    """The costs of a YAML file (a mapping, or one under ``costs:``) over ``base``."""
    return costs_from_mapping(_read_yaml(path), base, what=str(path))


def load_ranges(path: str | Path) -> dict[str, tuple[float, float]]:
    """The ``ranges:`` of a cost file: ``name: [low, high]`` per uncertain cost."""
    data = _read_yaml(path)
    raw = data.get("ranges", {}) if isinstance(data, dict) else {}
    known = {f.name for f in dataclasses.fields(Costs)}
    out = {}
    for k, v in (raw or {}).items():
        if k not in known or not isinstance(v, list) or len(v) != 2:
            raise ConfigError(f"{path}: ranges.{k}: expected a known cost and [low, high]")
        out[k] = (float(v[0]), float(v[1]))
    return out
