"""Arguments for compiled kernels, normalised so that each kernel compiles once.

numba compiles a kernel once per combination of argument types, and an array's type
includes its ``writeable`` flag. The same decoder called on bytes from a file mapping
(read-only) and on a fresh array (writable) is compiled twice; with three array inputs that
vary, up to eight times. Each compilation of a large kernel costs seconds of CPU on a job's
first run (a cold start compiled the IBP decoders three times each: about 50 s). Passing
every input array read-only keeps each kernel at one compilation.
"""

from __future__ import annotations

import numpy as np

__all__ = ["read_only"]


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` itself when it is read-only, else a read-only view of it (no copy)."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view
