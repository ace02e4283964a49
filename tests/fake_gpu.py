"""A stand-in for cupy with one device, so that the GPU-host behaviour of the loader is
tested where no GPU exists: ``workers.device: auto`` then picks it, and batches come out as
:class:`DeviceArray`, which, like cupy's arrays, refuses an implicit conversion to numpy
(``np.asarray(batch.label)`` raises; ``.get()`` copies to the host).

The module answers every numpy function by running it on the host arrays inside the
device arrays (``xp.subtract(a, b, out=c)``, ``xp.lib.stride_tricks...``), so device code
written against the array API (``xp``) runs unchanged; :attr:`transfers` logs the dtype
and size of every host-to-device copy (``asarray`` of a host array), which is what a test
checks to see what would cross PCIe; :attr:`copies` adds whether each came from pinned
memory (``cuda.alloc_pinned_memory``). ``cuda.Stream``, ``cuda.Event`` and ``ndarray.set(arr,
stream=...)`` are there for :mod:`loaders.device_feed`: synchronous, unless
``cupy.cuda.deferred`` is set, when a stream's copies wait until an event recorded after
them is synchronized (what an asynchronous copy from pinned memory would do, made visible).

Used by :func:`install` (a pytest ``monkeypatch``), and by ``LMDBIO_TEST_FAKE_GPU=1``
(``tests/conftest.py``), which installs it for a whole in-process test run: the run a GPU
host gives, minus the device.
"""

from __future__ import annotations

import sys
import types
import weakref
from typing import Any, ClassVar

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

    # numpy scalars and arrays leave operators with a device array to it (as with cupy)
    __array_ufunc__ = None

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

    def view(self, dtype: Any) -> DeviceArray:
        return DeviceArray(self._host.view(dtype), copy=False)

    def copy(self) -> DeviceArray:
        return DeviceArray(self._host)

    nbytes = property(lambda self: self._host.nbytes)
    T = property(lambda self: DeviceArray(self._host.T, copy=False))

    def __bool__(self) -> bool:
        return bool(self._host)

    def __int__(self) -> int:
        return int(self._host)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """cupy's ``ndarray.set``: copy the host array ``arr`` (same shape and dtype) in;
        on ``stream`` when given (deferred until that stream runs, see :class:`Stream`).
        The copy reads ``arr`` when it runs, as a DMA from pinned memory would."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"set() takes a numpy array, not {type(arr).__name__}")
        if arr.shape != self._host.shape or arr.dtype != self._host.dtype:
            raise ValueError(f"set(): {arr.dtype}{arr.shape} into "
                             f"{self._host.dtype}{self._host.shape}")
        cupy = _MODULE[0]
        cupy.__dict__["transfers"].append((arr.dtype, arr.nbytes))
        cupy.__dict__["copies"].append((arr.dtype, arr.nbytes, _is_pinned(arr)))

        def copy() -> None:
            np.copyto(self._host, arr)

        (stream if stream is not None else cupy.cuda.get_current_stream())._enqueue(copy)


def _operator(name: str) -> Any:
    def op(self: DeviceArray, *args: Any) -> Any:
        return _wrap(getattr(self._host, name)(*_unwrap(args)))

    op.__name__ = name
    return op


# arithmetic, bitwise and comparison operators run on the host arrays (array-API code such
# as lmdbio.codecs.ibp.xpdecode runs unchanged)
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "and", "or", "xor",
              "lshift", "rshift"):
    setattr(DeviceArray, f"__{_name}__", _operator(f"__{_name}__"))
    setattr(DeviceArray, f"__r{_name}__", _operator(f"__r{_name}__"))
for _name in ("lt", "le", "gt", "ge", "eq", "ne", "neg", "invert"):
    setattr(DeviceArray, f"__{_name}__", _operator(f"__{_name}__"))


#: the module :func:`make_module` made last (DeviceArray.set logs its copies there)
_MODULE: list[Any] = []


class PinnedMemory(bytearray):
    """``cupy.cuda.alloc_pinned_memory``'s result: a buffer ``np.frombuffer`` can view."""


def _is_pinned(arr: np.ndarray) -> bool:
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, PinnedMemory)


class Stream:
    """A stream of the stand-in. The current (default) stream runs everything at once; a
    stream made with ``Stream()`` does too unless the module's ``cuda.deferred`` is True:
    then its work waits in a queue until an event recorded after it, or the stream,
    is synchronized, which lets tests see what an asynchronous copy would do."""

    _stack: ClassVar[list[Stream]] = []

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int = 0,
                 *, immediate: bool = False) -> None:
        self.non_blocking = non_blocking
        self._immediate = immediate or null
        self._ops: list[Any] = []
        self._ran = 0

    def _enqueue(self, op: Any) -> None:
        if self._immediate or not _MODULE[0].cuda.deferred:
            self.synchronize()
            op()
            self._ops.append(None)
            self._ran = len(self._ops)
        else:
            self._ops.append(op)

    def _run(self, upto: int) -> None:
        while self._ran < upto:
            op = self._ops[self._ran]
            self._ran += 1
            if op is not None:
                op()

    def synchronize(self) -> None:
        self._run(len(self._ops))

    @property
    def done(self) -> bool:
        return self._ran >= len(self._ops)

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """Later work on this stream runs after ``event``'s."""
        self._enqueue(event.synchronize)

    def __enter__(self) -> Stream:
        Stream._stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        Stream._stack.pop()


class Event:
    """An event of the stand-in: ``done`` once the work before its record ran."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self._stream: Stream | None = None
        self._mark = 0
        self.synchronized = 0  # times a host waited on it

    def record(self, stream: Stream | None = None) -> None:
        self._stream = stream if stream is not None else _MODULE[0].cuda.get_current_stream()
        self._mark = len(self._stream._ops)

    @property
    def done(self) -> bool:
        return self._stream is None or self._stream._ran >= self._mark

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized += 1
        if self._stream is not None:
            self._stream._run(self._mark)


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
    #: (dtype, nbytes, from pinned memory) of every ``ndarray.set``
    cupy.__dict__["copies"] = []
    _MODULE[:] = [cupy]
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1,
                                    hostRegister=lambda ptr, size, flags: None)
    null = Stream(null=True)
    pinned = {"live": 0}  # pinned bytes allocated and not yet freed

    def alloc_pinned_memory(nbytes: int) -> PinnedMemory:
        mem = PinnedMemory(int(nbytes))
        pinned["live"] += len(mem)
        _finalize(mem, pinned, len(mem))
        return mem

    class Device:
        def __init__(self, index: int = 0) -> None:
            self.index = index

        def use(self) -> None:
            cupy.__dict__["current_device"] = self.index

    cupy.__dict__["cuda"] = types.SimpleNamespace(
        runtime=runtime, Device=Device, Stream=Stream, Event=Event,
        alloc_pinned_memory=alloc_pinned_memory,
        get_current_stream=lambda: Stream._stack[-1] if Stream._stack else null,
        deferred=False,  # streams made with Stream() queue their work (see Stream)
        pinned=pinned)
    cupy.__dict__["get_default_pinned_memory_pool"] = lambda: types.SimpleNamespace(
        free_all_blocks=lambda: None)
    cupy.__dict__["ndarray"] = DeviceArray

    def asarray(a: Any, dtype: Any = None) -> DeviceArray:
        if isinstance(a, DeviceArray):
            return a if dtype is None else a.astype(dtype)
        host = np.asarray(a, dtype)
        cupy.__dict__["transfers"].append((host.dtype, host.nbytes))
        cupy.__dict__["copies"].append((host.dtype, host.nbytes, _is_pinned(host)))
        return DeviceArray(host)

    cupy.__dict__["asarray"] = asarray
    return cupy


def _finalize(mem: PinnedMemory, pinned: dict[str, int], nbytes: int) -> None:
    def free() -> None:
        pinned["live"] -= nbytes

    weakref.finalize(mem, free)


def install(monkeypatch: Any) -> types.ModuleType:
    """Put the stand-in in ``sys.modules['cupy']`` for one test."""
    module = make_module()
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def to_host(a: Any) -> np.ndarray:
    """``a`` as a numpy array whether it is on the host or on the (stand-in) device."""
    return a.get() if isinstance(a, DeviceArray) else np.asarray(a)
