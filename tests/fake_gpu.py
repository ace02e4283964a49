"""A stand-in for cupy with one device, so that the GPU-host behaviour of the loader is
tested where no GPU exists: ``workers.device: auto`` then picks it, and batches come out as
:class:`DeviceArray`, which, like cupy's arrays, refuses an implicit conversion to numpy
(``np.asarray(batch.label)`` raises; ``.get()`` copies to the host).

The module answers every numpy function by running it on the host arrays inside the
device arrays (``xp.subtract(a, b, out=c)``, ``xp.lib.stride_tricks...``), so device code
written against the array API (``xp``) runs unchanged; :attr:`transfers` logs the dtype
and size of every host-to-device copy (``asarray`` of a host array), which is what a test
checks to see what would cross PCIe.

Used by :func:`install` (a pytest ``monkeypatch``), and by ``LMDBIO_TEST_FAKE_GPU=1``
(``tests/conftest.py``), which installs it for a whole in-process test run: the run a GPU
host gives, minus the device.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np


def _unwrap(x: Any) -> Any:
    if isinstance(x, DeviceArray):
        return x._host
    if isinstance(x, tuple):
        return tuple(_unwrap(i) for i in x)
    if isinstance(x, list):
        return [_unwrap(i) for i in x]
    return x


def _wrap(x: Any) -> Any:
    return DeviceArray(x, copy=False) if isinstance(x, np.ndarray) else x


class DeviceArray:
    """A host array posing as device memory: no implicit ``__array__``; ``.get()``."""

    def __init__(self, host: np.ndarray, copy: bool = True) -> None:
        self._host = np.array(host, copy=True) if copy else host

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)
    size = property(lambda self: self._host.size)

    def __len__(self) -> int:
        return len(self._host)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def get(self) -> np.ndarray:
        return self._host.copy()

    def __getitem__(self, item: Any) -> Any:
        return _wrap(self._host[_unwrap(item)])

    def __setitem__(self, item: Any, value: Any) -> None:
        self._host[_unwrap(item)] = _unwrap(value)

    def astype(self, dtype: Any, copy: bool = True) -> DeviceArray:
        return DeviceArray(self._host.astype(dtype, copy=copy), copy=False)

    def reshape(self, *shape: Any) -> DeviceArray:
        return DeviceArray(self._host.reshape(*shape), copy=False)


class _Namespace(types.ModuleType):
    """numpy (or one of its submodules) with every function run on unwrapped arrays."""

    def __init__(self, name: str, target: Any) -> None:
        super().__init__(name)
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if isinstance(attr, types.ModuleType):
            return _Namespace(f"{self.__name__}.{name}", attr)
        if isinstance(attr, type) or not callable(attr):
            return attr  # dtypes (xp.float32), constants

        def call(*args: Any, **kwargs: Any) -> Any:
            return _wrap(attr(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

        return call


def make_module() -> types.ModuleType:
    """A ``cupy`` module with one device: numpy underneath (see the module docstring)."""
    cupy = _Namespace("cupy", np)
    cupy.__dict__["__fake_gpu__"] = True
    cupy.__dict__["transfers"] = []  # (dtype, nbytes) of every host-to-device copy
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1,
                                    hostRegister=lambda ptr, size, flags: None)

    class Device:
        def __init__(self, index: int = 0) -> None:
            self.index = index

        def use(self) -> None:
            cupy.__dict__["current_device"] = self.index

    cupy.__dict__["cuda"] = types.SimpleNamespace(runtime=runtime, Device=Device)
    cupy.__dict__["ndarray"] = DeviceArray

    def asarray(a: Any, dtype: Any = None) -> DeviceArray:
        if isinstance(a, DeviceArray):
            return a if dtype is None else a.astype(dtype)
        host = np.asarray(a, dtype)
        cupy.__dict__["transfers"].append((host.dtype, host.nbytes))
        return DeviceArray(host)

    cupy.__dict__["asarray"] = asarray
    return cupy


def install(monkeypatch: Any) -> types.ModuleType:
    """Put the stand-in in ``sys.modules['cupy']`` for one test."""
    module = make_module()
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def to_host(a: Any) -> np.ndarray:
    """``a`` as a numpy array whether it is on the host or on the (stand-in) device."""
    return a.get() if isinstance(a, DeviceArray) else np.asarray(a)
