"""What a loader decides before its run plan: the reader mode the topology is built for,
the worker's array module (numpy, or cupy on its device) and Caffe's transform for the
job's layout.

The settings of the run itself (transfer, slot checksum, records per worker, the read
settings of the session) are resolved by :meth:`lmdbio.run_plan.RunPlan.resolve`.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from lmdbio.config import setting_error
from lmdbio.errors import LmdbioError
from lmdbio.layouts import get_layout
from loaders.decode import dataset_meta
from loaders.transform import DataTransformer

if TYPE_CHECKING:  # pragma: no cover

    from lmdbio.config import JobConfig
    from lmdbio.topology import Topology


def reader_mode(cfg: JobConfig) -> str:
    """``readers.mode`` for the topology: ``auto`` means colocated where the workers use
    GPUs (each rank drives a device: a rank that only reads would leave one idle); the
    topology resolves ``auto`` by node size otherwise (:func:`lmdbio.topology.auto_mode`)."""
    mode = cfg.readers.mode
    if mode == "auto" and gpu_workers(cfg):
        return "colocated"
    return str(mode)


def readers_per_node(cfg: JobConfig) -> int:
    """``readers.per_node`` for the topology: as set, or for 0 (chosen) 0 with a node-level
    strategy - the topology then gives a colocated node a reader per rank and a dedicated
    one a single reader (:func:`lmdbio.topology.reader_groups`) - and 1 for the naive
    strategies, whose ranks read for themselves anyway (the configuration refuses another
    value for them)."""
    if cfg.readers.per_node:
        return int(cfg.readers.per_node)
    from lmdbio.plan.strategies import strategy_class

    return 0 if strategy_class(cfg.readers.strategy).shared else 1


def assembles_batchwise(cfg: JobConfig) -> bool:
    """Whether this job's workers assemble each batch from a slot's records as it is asked
    for (:meth:`loaders.assemble.BatchAssembler.fused_batch`: Caffe Datums on CPU
    workers) rather than decoding the slot whole; asked before the topology is built,
    the same on every rank of a host (:func:`gpu_workers`)."""
    return get_layout(cfg.dataset.layout).fused_datum and not gpu_workers(cfg)


def transformer(cfg: JobConfig) -> DataTransformer | None:
    """Caffe's transform of the job's batches, or None where there is none to apply: a
    layout of other records than images (the configuration refuses a transform for them),
    or the identity for a layout whose batches keep their stored dtype
    (:attr:`lmdbio.layouts.Layout.widens`).

    Refuses, at the key's line, a transform for a data set whose ``lmdbio.json`` says its
    records are not ``(C, H, W)`` images (tensor records stored as rows): the first batch
    would fail."""
    layout = get_layout(cfg.dataset.layout)
    active = cfg.transform.active_keys()
    if not layout.image or not (active or layout.widens):
        return None
    if active:
        _check_image_records(cfg, active[0])
    return DataTransformer.from_config(cfg.transform)


def _check_image_records(cfg: JobConfig, key: str) -> None:
    """Refuse transform key ``key`` where the data set's sidecar gives one record shape
    that is not ``(C, H, W)``; a data set that does not say is checked batch by batch."""
    try:
        shape = dataset_meta(cfg).get("shape")
    except LmdbioError:
        return  # an unreadable sidecar: each batch's shape is checked as it is transformed
    if isinstance(shape, list) and len(shape) != 3:
        raise setting_error(
            cfg.origin, f"transform.{key}",
            f"applies to (C, H, W) images; the records of {cfg.dataset.path} are "
            f"{tuple(shape)} (from its lmdbio.json): remove the transform settings")


def gpu_workers(cfg: JobConfig) -> bool:
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


def worker_device(cfg: JobConfig, topo: Topology) -> ModuleType:
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
