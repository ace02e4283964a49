"""A stand-in for cupy with one device, so that the GPU-host behaviour of the loader is
tested where no GPU exists: ``workers.device: auto`` then picks it, and batches come out as
:class:`DeviceArray`, which, like cupy's arrays, refuses an implicit conversion to numpy
(``np.asarray(batch.label)`` raises; ``.get()`` copies to the host).

Used by :func:`install` (a pytest ``monkeypatch``), and by ``LMDBIO_TEST_FAKE_GPU=1``
(``tests/conftest.py``), which installs it for a whole in-process test run: the run a GPU
host gives, minus the device.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np


class DeviceArray:
    """A host array posing as device memory: no implicit ``__array__``, ``.get()``."""

    def __init__(self, host: np.ndarray) -> None:
        self._host = np.array(host, copy=True)

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)

    def __len__(self) -> int:
        return len(self._host)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def get(self) -> np.ndarray:
        return self._host.copy()

    def __getitem__(self, item: Any) -> DeviceArray:
        return DeviceArray(self._host[item])


def make_module() -> types.ModuleType:
    """A ``cupy`` module with the surface the loader touches: one device."""
    cupy = types.ModuleType("cupy")
    cupy.__dict__["__fake_gpu__"] = True
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1,
                                    hostRegister=lambda ptr, size, flags: None)

    class Device:
        def __init__(self, index: int = 0) -> None:
            self.index = index

        def use(self) -> None:
            cupy.__dict__["current_device"] = self.index

    cupy.cuda = types.SimpleNamespace(runtime=runtime, Device=Device)  # type: ignore[attr-defined]
    cupy.ndarray = DeviceArray  # type: ignore[attr-defined]
    cupy.float32, cupy.int64, cupy.uint8 = np.float32, np.int64, np.uint8  # type: ignore[attr-defined]

    def asarray(a: Any, dtype: Any = None) -> DeviceArray:
        if isinstance(a, DeviceArray):
            return a
        return DeviceArray(np.asarray(a, dtype))

    cupy.asarray = asarray  # type: ignore[attr-defined]
    return cupy


def install(monkeypatch: Any) -> types.ModuleType:
    """Put the stand-in in ``sys.modules['cupy']`` for one test."""
    module = make_module()
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def to_host(a: Any) -> np.ndarray:
    """``a`` as a numpy array whether it is on the host or on the (stand-in) device."""
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
