"""A PyTorch adapter: the loader as an ``IterableDataset`` yielding tensors.

``torch`` is imported only when :func:`to_torch` or :class:`TorchBatches` is used, so lmdbio
does not depend on it. Arrays cross by DLPack (no copy for numpy on the CPU or cupy on the
GPU). Use it with ``torch.utils.data.DataLoader(dataset, batch_size=None)``: batching,
sharding, shuffling and prefetching already happened in lmdbio, so the DataLoader must not
add its own (and must run with ``num_workers=0``: the loader is an MPI rank's, not a
process pool's).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from loaders.loader import Loader


def to_torch(array: Any) -> torch.Tensor:
    """A torch tensor sharing ``array``'s memory (DLPack), for numpy and cupy arrays."""
    import torch

    if hasattr(array, "__dlpack__"):
        try:
            return torch.from_dlpack(array)
        except (BufferError, RuntimeError, TypeError):
            pass  # read-only or non-contiguous: copy below
    return torch.as_tensor(np.array(array))


def _torch_dataset_base() -> type:
    import torch

    return torch.utils.data.IterableDataset


class TorchBatches:
    """Wraps a :class:`loaders.Loader`; iterating yields ``(data, label)`` tensors per batch,
    or whole dicts with ``as_dict=True`` (adds keys, ids, padding, epoch, iteration).
    ``set_epoch`` and ``epochs()`` are the loader's (:meth:`loaders.Loader.epochs` runs
    the job's epochs and stops at its ``max_iterations``).

    It is an instance of ``torch.utils.data.IterableDataset`` (the class is built on first
    use so that importing this module does not import torch).
    """

    def __new__(cls, loader: Loader, as_dict: bool = False) -> Any:  # not a TorchBatches
        base = _torch_dataset_base()
        impl = type("LmdbioIterableDataset", (base,), {
            "__init__": _init, "__iter__": _iter, "__len__": _len,
            "set_epoch": _set_epoch, "epochs": _epochs, "__doc__": cls.__doc__})
        return impl(loader, as_dict)


class _Batches(Protocol):
    """What the methods below find on the dataset built by :class:`TorchBatches`."""

    loader: Loader
    as_dict: bool


def _init(self: _Batches, loader: Loader, as_dict: bool = False) -> None:
    self.loader = loader
    self.as_dict = as_dict


def _len(self: _Batches) -> int:
    return len(self.loader)


def _set_epoch(self: _Batches, epoch: int, stop_iteration: int | None = None) -> None:
    self.loader.set_epoch(epoch, stop_iteration)


def _epochs(self: _Batches) -> Iterator[int]:
    """The job's epochs, each set before it is yielded (:meth:`loaders.Loader.epochs`)."""
    return self.loader.epochs()


def _iter(self: _Batches
          ) -> Iterator[tuple[torch.Tensor, torch.Tensor] | dict[str, Any]]:
    import torch

    for batch in self.loader:
        data, label = to_torch(batch.data), to_torch(batch.label)
        if not self.as_dict:
            yield data, label
            continue
        yield {"data": data, "label": label, "keys": batch.keys,
               "ids": torch.as_tensor(batch.ids), "padding": torch.as_tensor(batch.padding),
               "epoch": batch.epoch, "iteration": batch.iteration}
