"""Small building blocks for numba kernels shared across lmdbio.

``copy_bytes`` copies a byte range between two contiguous arrays with LLVM's memcpy: a
numba slice assignment compiles to an element loop that runs about 3.5x slower (measured
here: 2.0 vs 7.5 GB/s for 3 KB values). Callers check the bounds: it does not.
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def copy_bytes(typingctx, dst, dst_off, src, src_off, nbytes):
    """``dst[dst_off:dst_off+nbytes] = src[src_off:src_off+nbytes]`` for uint8 arrays."""

    def codegen(context, builder, sig, args):
        d, doff, s, soff, count = args
        dst_arr = context.make_array(sig.args[0])(context, builder, d)
        src_arr = context.make_array(sig.args[2])(context, builder, s)
        cgutils.raw_memcpy(builder, builder.gep(dst_arr.data, [doff]),
                           builder.gep(src_arr.data, [soff]), count, 1)
        return context.get_dummy_value()

    return types.void(dst, types.int64, src, types.int64, types.int64), codegen
