"""The run plan: a job's configuration resolved, with its topology, into frozen settings.

A :class:`~lmdbio.config.JobConfig` says what the user asked for, with ``auto`` and ``0``
meaning "choose"; a :class:`RunPlan` says what the job runs with. :meth:`RunPlan.resolve`
is the one place that turns the first into the second: it re-checks the configuration's
combinations (:func:`~lmdbio.config.check_combinations`), resolves the transfer, the slot
checksum and the records each consuming rank takes per batch (which needs the topology),
and refuses what cannot run with a :class:`~lmdbio.errors.ConfigError` naming the setting
and, where the configuration came from a file, the file and line it was written at
(:func:`~lmdbio.config.setting_error`), before any MPI work starts. It computes the same on
every rank from the same configuration and topology, with no collective, so every rank
refuses alike. Every later stage (:class:`~lmdbio.reader.ReadSession`, the loader,
``lmdbio bench read``) reads the plan and nothing else.

Two purposes share the vocabulary: ``"train"`` (the loader: ``batch.size`` counts the images
of a global batch, page accounting off) and ``"bench"`` (``lmdbio bench read``: ``batch.size``
counts the records each consuming rank takes, its ``--batch-size``; page accounting on unless
the tuning turns it off). What varies during a run (PCR's value prefix, set by
``Loader.set_scan_groups``) is session state, not part of the plan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol, get_args

from lmdbio.config import (
    ConfigOrigin,
    ConfigProblem,
    JobConfig,
    check_combinations,
    setting_error,
    was_loaded,
)
from lmdbio.errors import ConfigError
from lmdbio.layouts import LAYOUTS
from lmdbio.plan.strategies import strategy_class
from lmdbio.shm.layout import CHECKSUM_NAMES

#: the loader's logger: the batch-split warnings are the loader's, as they always were
log = logging.getLogger("lmdbio.loader")

#: what a plan is resolved for: a training job's loader, or ``lmdbio bench read``
Purpose = Literal["train", "bench"]
PURPOSES: tuple[str, ...] = get_args(Purpose)
#: the kernel read-around choices of :attr:`ReadTuning.read_around`
READ_AROUND_MODES: tuple[str, ...] = ("auto", "on", "off")


class RankCounts(Protocol):
    """What a plan reads of the topology (:class:`~lmdbio.topology.Topology` has it; a
    test or a tool may pass any object with these three)."""

    @property
    def rank(self) -> int:
        """This rank in the world communicator."""

    @property
    def size(self) -> int:
        """The ranks of the job."""

    @property
    def n_workers(self) -> int:
        """The ranks that train (consume batches)."""


@dataclass(frozen=True)
class ReadTuning:
    """Settings of a read that a job configuration does not carry: the knobs
    ``lmdbio bench read`` and the tests vary. A training job keeps these defaults."""

    #: seconds a rank waits for a peer (ring slot, node barrier) before it gives up
    timeout: float = 120.0
    #: readers that hand cursors around map the file at one address (:mod:`lmdbio.io.symmap`)
    symmetric: bool = True
    #: per-iteration page accounting, where the purpose keeps it (``bench`` only): a pass
    #: over a bitmap of the whole file per iteration and a record per iteration kept forever
    accounting: bool = True
    #: every (simulated) node reads the file into its own cache with O_DIRECT reads
    #: (:mod:`lmdbio.io.direct`); implies page accounting
    direct_io: bool = False
    #: readers that know their pages ahead (dm-spec, indexed) ask the kernel for them
    #: (``MADV_WILLNEED``); off, the pages are faulted in as read
    prefetch_advice: bool = True
    #: the kernel's read-around on the readers' mapping: "on", "off" (``MADV_RANDOM``) or
    #: "auto" (off for the strategies that ask for their pages themselves, else on)
    read_around: str = "auto"


@dataclass(frozen=True)
class RunPlan:
    """The resolved, checked settings of one run, equal on every rank: what every stage
    after the configuration reads (no ``auto`` or ``0`` left to choose, except
    :attr:`batches_per_slot`, which the readers agree on from the file's record sizes)."""

    #: the read strategy (:data:`lmdbio.plan.strategies.STRATEGIES`)
    strategy: str
    #: records each consuming rank takes per batch (images resolved to records)
    batch_size: int
    #: the consuming ranks a batch is split over (the workers of a node-level strategy,
    #: every rank of a naive one)
    consumers: int
    last: str
    shuffle: str
    seed: int
    #: block shuffle: leaf pages per block, and the shuffle window in blocks
    block_pages: int
    window_blocks: int
    #: ring slots a reader may fill ahead of the consumers
    prefetch_depth: int
    #: consecutive batches per ring slot (0: the readers choose from the record sizes, see
    #: :func:`lmdbio.ring_setup.choose_batches_per_slot`)
    batches_per_slot: int
    subdb: str | None
    #: batch codec between reader and workers ("none" or "ibp") and its options (read-only)
    codec: str
    codec_options: Mapping[str, Any]
    #: slot checksum: "xxh64", "crc32" or "none"
    checksum: str
    #: how a node ring carries records: "copy" or "spans" (``readers.transfer`` resolved)
    transfer: str
    timeout: float
    symmetric: bool
    #: per-iteration page accounting (``bench`` only)
    accounting: bool
    direct_io: bool
    prefetch_advice: bool
    read_around: str
    #: where the settings were written (:attr:`~lmdbio.config.JobConfig.origin`), for the
    #: refusals a later stage makes (a batch larger than the data set) at their file:line
    origin: ConfigOrigin
    #: the workers assemble each batch from the slot as it is asked for, never a whole
    #: slot at once (Caffe Datums on CPU workers): slots of record spans may then hold
    #: many more records (:func:`lmdbio.ring_setup.choose_batches_per_slot`)
    batchwise_assembly: bool = False

    @classmethod
    def resolve(cls, cfg: JobConfig, topo: RankCounts, *, purpose: Purpose = "train",
                checksum: bool | str | None = None, tuning: ReadTuning | None = None,
                batchwise_assembly: bool = False) -> RunPlan:
        """The plan of ``cfg`` on ``topo`` (a :class:`~lmdbio.topology.Topology`, or any
        object with its ``rank``, ``size`` and ``n_workers``).

        ``purpose`` "train": ``batch.size`` counts images over the consuming ranks, each
        rank's share rounded to whole records of the layout; page accounting off.
        ``purpose`` "bench": ``batch.size`` counts the records of each consuming rank; page
        accounting as ``tuning.accounting``. ``checksum`` (True / "xxh64", "crc32", False / "none")
        overrides ``readers.checksum``. ``batchwise_assembly``: what the loader's workers
        do (:attr:`batchwise_assembly`; the caller knows its workers). Raises
        :class:`~lmdbio.errors.ConfigError` for every combination the run would refuse, at
        its file and line where ``cfg`` was read from a file."""
        if purpose not in PURPOSES:
            raise ConfigError(f"run plan purpose must be one of {PURPOSES}, got {purpose!r}")
        tuning = tuning if tuning is not None else ReadTuning()
        if not was_loaded(cfg):  # load_config checked its own (330 us a rank saved)
            check_combinations(cfg)
        _check_tuning(tuning)
        consumers = consuming_ranks(cfg.readers.strategy, topo)
        per_worker = _records_per_consumer(cfg, topo, consumers, purpose)
        return cls(
            strategy=cfg.readers.strategy, batch_size=per_worker, consumers=consumers,
            last=cfg.batch.last, shuffle=cfg.shuffle.mode, seed=cfg.shuffle.seed,
            block_pages=cfg.shuffle.block_pages, window_blocks=cfg.shuffle.window,
            prefetch_depth=cfg.readers.prefetch_depth,
            batches_per_slot=cfg.readers.batches_per_slot, subdb=cfg.dataset.subdb,
            codec=cfg.codec.name, codec_options=MappingProxyType(cfg.codec.options_dict()),
            checksum=slot_checksum(cfg.readers.checksum if checksum is None else checksum),
            transfer=resolve_transfer(cfg), timeout=tuning.timeout,
            symmetric=tuning.symmetric, accounting=purpose == "bench" and tuning.accounting,
            direct_io=tuning.direct_io, prefetch_advice=tuning.prefetch_advice,
            read_around=tuning.read_around, origin=cfg.origin,
            batchwise_assembly=batchwise_assembly)


def consuming_ranks(strategy: str, topo: RankCounts) -> int:
    """The ranks a batch is split over: the workers of a node-level strategy (its readers
    hand them node batches), every rank of one in which each rank reads for itself."""
    return int(topo.n_workers if strategy_class(strategy).shared else topo.size)


def slot_checksum(value: bool | str) -> str:
    """The slot checksum's name (:data:`~lmdbio.shm.layout.CHECKSUM_NAMES`) for a
    ``readers.checksum`` value or an override: True is XXH64, False none."""
    if isinstance(value, bool):
        return "xxh64" if value else "none"
    if isinstance(value, str) and value in CHECKSUM_NAMES:
        return value
    *rest, last = (repr(name) for name in CHECKSUM_NAMES)
    problem = ConfigProblem("readers.checksum", f"must be {', '.join(rest)} or {last} (or "
                            f"True / False), got {value!r}")  # an override: no line of the file
    raise ConfigError(f"invalid job configuration: {problem}")


def resolve_transfer(cfg: JobConfig) -> str:
    """``readers.transfer`` resolved: ``auto`` is ``spans`` (records handed out as stored)
    where the layout allows it and nothing re-encodes them, ``copy`` otherwise. An explicit
    ``spans`` the job cannot serve is refused by :func:`lmdbio.config.load_config`."""
    transfer = cfg.readers.transfer
    if transfer == "auto":
        layout = LAYOUTS.get(cfg.dataset.layout)
        as_stored = layout is not None and layout.spans and cfg.codec.name == "none"
        transfer = "spans" if as_stored else "copy"
    return str(transfer)


def _records_per_consumer(cfg: JobConfig, topo: RankCounts, consumers: int, purpose: str) -> int:
    """Records in each consuming rank's batch: for a bench, ``batch.size``; for training,
    ``batch.size`` split over ``consumers``, in records of the layout (a PCR, IBP or TOC
    record holds several images). Rank 0 warns where the split is not exact."""
    if purpose == "bench":  # lmdbio bench read counts each rank's records
        return cfg.batch.size
    if cfg.batch.size < consumers:
        raise setting_error(cfg.origin, "batch.size", f"{cfg.batch.size} is smaller than the "
                            f"number of consuming ranks ({consumers}); every rank needs a record")
    per_worker = cfg.batch.size // consumers
    if per_worker * consumers != cfg.batch.size and topo.rank == 0:
        log.warning("batch.size %d is not a multiple of the %d consuming ranks: the global "
                    "batch is %d", cfg.batch.size, consumers, per_worker * consumers)
    from loaders.decode import records_per_batch  # the layout's records (its sidecar)

    per_worker, note = records_per_batch(cfg, per_worker, consumers)
    if note and topo.rank == 0:
        log.warning("%s", note)
    return int(per_worker)


def _check_tuning(tuning: ReadTuning) -> None:
    """Refuse tuning values no session can run with."""
    if tuning.read_around not in READ_AROUND_MODES:
        raise ConfigError(f"read_around must be 'auto', 'on' or 'off', got "
                          f"{tuning.read_around!r}")
    if not tuning.timeout > 0:
        raise ConfigError(f"timeout must be positive, got {tuning.timeout!r}")

