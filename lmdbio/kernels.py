"""Small building blocks for numba kernels shared across lmdbio (the kernel modules of its
packages, all named ``kernels.py``: see :mod:`lmdbio.kernel_cache`).

``copy_bytes`` copies a byte range between two contiguous arrays with LLVM's memcpy: a
numba slice assignment compiles to an element loop that runs about 3.5x slower (measured
here: 2.0 vs 7.5 GB/s for 3 KB values). Callers check the bounds: it does not.

``widen_u8_f32`` widens uint8 pixels to float32, optionally with *streaming* (non-temporal)
stores. A float32 batch of large images is written once and not read again by the decoder
(a 224x224 ImageNet batch of 32 is 19 MB); ordinary stores first read every destination
line into the cache (read for ownership) and evict what the other ranks of the host keep
there. Measured on the project's 2-core VM (``bench/widen.py``), two processes each cycling
through 4 such batches: 75-78 us per image with ordinary stores, 32-34 us with streaming
stores; with outputs that stay in the cache ordinary stores are as fast or faster, hence the
flag. ``store_transformed_line`` does the same for Caffe's transform (mean, scale, mirrored
rows): ImageNet-like batches of 32 (3x224x224, scale only) from the database mapping, one
process, the two kinds of store alternated 12 times: 87 -> 45 us of CPU per image.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: pixels per streaming store (16 float32 = one 64-byte cache line)
STREAM_PIXELS = 16


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


@intrinsic
def _store_widened_line(typingctx, src, src_off, dst, dst_off):
    """``dst[dst_off:dst_off+16] = src[src_off:src_off+16]`` widened from uint8 to float32,
    as one non-temporal store of a cache line. ``dst`` at ``dst_off`` must be 64-byte
    aligned; callers check that and the bounds."""

    def codegen(context, builder, sig, args):
        s, soff, d, doff = args
        src_arr = context.make_array(sig.args[0])(context, builder, s)
        dst_arr = context.make_array(sig.args[2])(context, builder, d)
        bytes16 = ir.VectorType(ir.IntType(8), STREAM_PIXELS)
        floats16 = ir.VectorType(ir.FloatType(), STREAM_PIXELS)
        sp = builder.bitcast(builder.gep(src_arr.data, [soff]), bytes16.as_pointer())
        dp = builder.bitcast(builder.gep(dst_arr.data, [doff]), floats16.as_pointer())
        line = builder.uitofp(builder.load(sp, align=1), floats16)
        store = builder.store(line, dp, align=64)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(src, types.int64, dst, types.int64), codegen


def _splat(builder, value, vec_type):
    """``value`` in every lane of ``vec_type``."""
    one = builder.insert_element(ir.Constant(vec_type, ir.Undefined), value,
                                 ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vec_type, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), STREAM_PIXELS),
                                              [0] * STREAM_PIXELS))


@intrinsic
def store_transformed_line(typingctx, src, src_off, mean, mean_off, sub, scale, dst, dst_off,
                           reverse):
    """Caffe's transform of 16 uint8 pixels into one cache line of float32, stored with a
    non-temporal store: ``(float32(src[src_off + w]) - m[w]) * scale`` for ``w`` in 0..15,
    where ``m`` is ``mean[mean_off:mean_off + 16]`` for a mean image (a float32 array of
    16 or more values) or ``sub`` in every lane for an empty ``mean``; lane ``w`` goes to
    ``dst[dst_off + w]``, or with ``reverse`` to ``dst[dst_off + 15 - w]`` (a mirrored row).
    The same float32 operations in the same order as the scalar loop, so the same values.
    ``dst`` at ``dst_off`` must be 64-byte aligned; callers check that and the bounds and
    issue :func:`store_fence` after their last store."""
    f32 = ir.FloatType()
    bytes16 = ir.VectorType(ir.IntType(8), STREAM_PIXELS)
    floats16 = ir.VectorType(f32, STREAM_PIXELS)

    def codegen(context, builder, sig, args):
        s, soff, m, moff, sub_v, scale_v, d, doff, rev = args
        src_arr = context.make_array(sig.args[0])(context, builder, s)
        mean_arr = context.make_array(sig.args[2])(context, builder, m)
        dst_arr = context.make_array(sig.args[6])(context, builder, d)
        sp = builder.bitcast(builder.gep(src_arr.data, [soff]), bytes16.as_pointer())
        x = builder.uitofp(builder.load(sp, align=1), floats16)
        with_image = builder.icmp_signed(">", cgutils.unpack_tuple(
            builder, mean_arr.shape, 1)[0], ir.Constant(ir.IntType(64), 0))
        mp = builder.bitcast(builder.gep(mean_arr.data, [moff]), floats16.as_pointer())
        with builder.if_else(with_image) as (image, values):
            with image:
                image_block = builder.block
                per_pixel = builder.load(mp, align=4)
            with values:
                values_block = builder.block
                same = _splat(builder, sub_v, floats16)
        sub_lanes = builder.phi(floats16)
        sub_lanes.add_incoming(per_pixel, image_block)
        sub_lanes.add_incoming(same, values_block)
        v = builder.fmul(builder.fsub(x, sub_lanes), _splat(builder, scale_v, floats16))
        reversed_v = builder.shuffle_vector(
            v, ir.Constant(floats16, ir.Undefined),
            ir.Constant(ir.VectorType(ir.IntType(32), STREAM_PIXELS),
                        list(range(STREAM_PIXELS - 1, -1, -1))))
        v = builder.select(builder.trunc(rev, ir.IntType(1)) if rev.type != ir.IntType(1)
                           else rev, reversed_v, v)
        dp = builder.bitcast(builder.gep(dst_arr.data, [doff]), floats16.as_pointer())
        store = builder.store(v, dp, align=64)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    sig = types.void(src, types.int64, mean, types.int64, types.float32, types.float32, dst,
                     types.int64, types.boolean)
    return sig, codegen


@intrinsic
def store_fence(typingctx):
    """A full memory fence: orders streaming stores before whatever follows (another
    thread or process reading the array once the kernel returns)."""

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def prefetch_line(typingctx, arr, offset):
    """Ask the CPU to bring the cache line holding ``arr[offset]`` (a 1-D array) into the
    cache ahead of its use (``llvm.prefetch``, read, high locality). A hint: it never
    faults, so an offset past the array's end is harmless; it only costs the instruction.
    Kernels that read records scattered over a mapping ask for the next record's lines
    while they work on the current one, so its cache misses overlap that work."""

    def codegen(context, builder, sig, args):
        a, off = args
        ary = context.make_array(sig.args[0])(context, builder, a)
        ptr = builder.bitcast(builder.gep(ary.data, [off]), ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), ir.IntType(32),
                                               ir.IntType(32), ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 3),
                          ir.Constant(ir.IntType(32), 1)])
        return context.get_dummy_value()

    return types.void(arr, types.int64), codegen


@njit(cache=True, nogil=True)
def widen_u8_f32(src, src_off, dst, streaming):
    """``dst[:] = src[src_off:src_off+dst.size]`` as float32 (``src`` uint8, ``dst`` a
    contiguous 1-D float32 array; callers check the bounds). With ``streaming`` the aligned
    middle is written with non-temporal stores; the caller issues :func:`store_fence` once
    after its last call."""
    n = dst.shape[0]
    row = src[src_off:src_off + n]  # indexing src[src_off + i] would not vectorize (4x slower)
    if not streaming:
        for i in range(n):
            dst[i] = np.float32(row[i])
        return
    i = 0
    addr = dst.ctypes.data
    while i < n and (addr + 4 * i) % 64 != 0:
        dst[i] = np.float32(row[i])
        i += 1
    while i + STREAM_PIXELS <= n:
        _store_widened_line(src, src_off + i, dst, i)
        i += STREAM_PIXELS
    while i < n:
        dst[i] = np.float32(row[i])
        i += 1
