"""What a loader decides about the host before its run plan: the reader mode the topology
is built for and the worker's array module (numpy, or cupy on its device).

The settings of the run itself (transfer, slot checksum, records per worker, the read
settings of the session) are resolved by :meth:`lmdbio.run_plan.RunPlan.resolve`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmdbio.errors import LmdbioError


def reader_mode(cfg: Any) -> str:
    """``readers.mode`` for the topology: ``auto`` means colocated where the workers use
    GPUs (each rank drives a device: a rank that only reads would leave one idle); the
    topology resolves ``auto`` by node size otherwise (:func:`lmdbio.topology.auto_mode`)."""
    mode = cfg.readers.mode
    if mode == "auto" and gpu_workers(cfg):
        return "colocated"
    return str(mode)


def readers_per_node(cfg: Any) -> int:
    """``readers.per_node`` for the topology: as set, or for 0 (chosen) 0 with a node-level
    strategy - the topology then gives a colocated node a reader per rank and a dedicated
    one a single reader (:func:`lmdbio.topology.reader_groups`) - and 1 for the naive
    strategies, whose ranks read for themselves anyway."""
    if cfg.readers.per_node:
        return int(cfg.readers.per_node)
    from lmdbio.plan.strategies import strategy_class

    return 0 if strategy_class(cfg.readers.strategy).shared else 1


def assembles_batchwise(cfg: Any) -> bool:
    """Whether this job's workers assemble each batch from a slot's records as it is asked
    for (:meth:`loaders.assemble.BatchAssembler.fused_batch`: Caffe Datums on CPU
    workers) rather than decoding the slot whole; asked before the topology is built,
    the same on every rank of a host (:func:`gpu_workers`)."""
    return cfg.dataset.layout == "caffe-datum" and not gpu_workers(cfg)


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
