"""From a job's configuration to what its loader runs with, checked before anything opens.

The reader mode the topology is built for, the worker's array module (numpy, or cupy on
its device), the records each worker's batch holds, and the read options of the session:
each a small function of the configuration (and the topology where it needs the ranks),
each raising :class:`~lmdbio.errors.ConfigError` with the setting to change.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from lmdbio.errors import ConfigError, LmdbioError

log = logging.getLogger("lmdbio.loader")


def slot_checksum(value: bool | str) -> bool | str:
    """The ring's checksum setting for ``readers.checksum`` (``"none"`` -> off)."""
    return False if value == "none" else value


def reader_mode(cfg: Any) -> str:
    """``readers.mode`` for the topology: ``auto`` means colocated where the workers use
    GPUs (each rank drives a device: a rank that only reads would leave one idle); the
    topology resolves ``auto`` by node size otherwise (:func:`lmdbio.topology.auto_mode`)."""
    mode = cfg.readers.mode
    if mode == "auto" and gpu_workers(cfg):
        return "colocated"
    return str(mode)


def gpu_workers(cfg: Any) -> bool:
    """Whether workers will run on a GPU (``workers.device`` cuda, or auto and cupy finds
    one): asked before the topology is built, so the same on every rank of a host."""
    want = cfg.workers.device
    if want == "cpu":
        return False
    if want == "cuda":
        return True
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no cupy, no driver, no device
        return False


def worker_device(cfg: Any, topo: Any) -> Any:
    """numpy, or cupy with the device picked from the worker's local index."""
    want = cfg.workers.device
    if want == "cpu":
        return np
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no cupy, no driver, no device
        if want == "cuda":
            raise LmdbioError(f"workers.device is cuda but no GPU is usable here ({exc})") \
                from None
        return np
    if n == 0:
        if want == "cuda":
            raise LmdbioError("workers.device is cuda but cupy finds no device")
        return np
    cupy.cuda.Device(max(topo.device_index, 0) % n).use()
    return cupy


def resolve_transfer(cfg: Any) -> str:
    """``readers.transfer`` resolved: ``auto`` is ``spans`` (records handed out as stored)
    where the layout allows it and nothing re-encodes them, ``copy`` otherwise. An explicit
    ``spans`` the job cannot serve is refused by :func:`lmdbio.config.load_config`."""
    from lmdbio.layouts import LAYOUTS

    transfer = cfg.readers.transfer
    if transfer == "auto":
        layout = LAYOUTS.get(cfg.dataset.layout)
        as_stored = layout is not None and layout.spans and cfg.codec.name == "none"
        transfer = "spans" if as_stored else "copy"
    return str(transfer)


def records_per_worker(cfg: Any, topo: Any, shared: bool) -> int:
    """Records in each worker's batch: ``batch.size`` images split over the consuming
    ranks (the workers of a shared strategy, every rank otherwise), in records (a PCR, IBP
    or TOC record holds several images). Rank 0 warns where the split is not exact."""
    from loaders.decode import records_per_batch

    consumers = topo.n_workers if shared else topo.size
    if cfg.batch.size < consumers:
        raise ConfigError(f"batch.size {cfg.batch.size} is smaller than the number of "
                          f"consuming ranks ({consumers}); every rank needs a record")
    per_worker = cfg.batch.size // consumers
    if per_worker * consumers != cfg.batch.size and topo.rank == 0:
        log.warning("batch.size %d is not a multiple of the %d consuming ranks: the global "
                    "batch is %d", cfg.batch.size, consumers, per_worker * consumers)
    per_worker, note = records_per_batch(cfg, per_worker, consumers)
    if note and topo.rank == 0:
        log.warning("%s", note)
    return int(per_worker)


def read_options(cfg: Any, per_worker: int, transfer: str,
                 checksum: bool | str | None = None) -> Any:
    """The session's :class:`~lmdbio.reader.ReadOptions`; ``checksum`` overrides
    ``readers.checksum``. Page accounting is off (it is for ``lmdbio bench read``)."""
    from lmdbio.reader import ReadOptions

    return ReadOptions(
        strategy=cfg.readers.strategy, batch_size=per_worker, last=cfg.batch.last,
        shuffle=cfg.shuffle.mode, seed=cfg.shuffle.seed,
        block_pages=cfg.shuffle.block_pages, window_blocks=cfg.shuffle.window,
        prefetch_depth=cfg.readers.prefetch_depth,
        batches_per_slot=cfg.readers.batches_per_slot, subdb=cfg.dataset.subdb,
        codec=cfg.codec.name, codec_options=cfg.codec.options_dict(), accounting=False,
        checksum=slot_checksum(cfg.readers.checksum if checksum is None else checksum),
        transfer=transfer)
