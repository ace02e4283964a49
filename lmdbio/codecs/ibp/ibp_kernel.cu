// lmdbio: IBP (invariant bit packing) decompression on the GPU.
//
// Compiled at run time by cupy.RawModule (NVRTC) from lmdbio/codecs/ibp/cuda.py, and by the
// tests with `nvcc -ptx` where nvcc is installed. Its CPU model, lane by lane, is
// lmdbio.codecs.ibp.kernels.decode_rows_mirror: keep the two in step.
//
// Format (see lmdbio/codecs/ibp/packed.py): a compressed row is ceil(n/W) words of
// participation bits (bit j = bit j%W of word j/W, 1 = chunk compressed), then a bit stream:
// every chunk's free bits (compressed) or all W bits (raw), MSB to LSB, packed MSB-first into
// little-endian words. A raw row is n words, as is.
//
// Work split: one warp per row (blocks of 128 threads = 4 warps, grid-stride over rows).
// Per round of 32 chunks, lane l owns chunk r+l:
//   1. reads its participation bit, computes its bit length (W - popcount(mask) or W);
//   2. the warp does an exclusive scan of the lengths (__shfl_up_sync): bit offsets;
//   3. the warp loads the 128-byte aligned segments of the source that cover the round's
//      words into its 512-byte shared-memory ring (each lane one aligned 4-byte word, so a
//      segment is one coalesced transaction; bytes past the end of the source read as 0);
//   4. every lane extracts its bits from the ring (at most two words) and deposits them into
//      the free positions of its mask, ORed with the bit values; raw chunks are copied.
// A row's words never leave the ring before the round that needs them: a round spans at
// most 33 words (<= 264 bytes), plus up to 127 bytes of alignment slack and one segment of
// read-ahead, which is less than the ring.
//
// Errors (corrupt payloads) set error[0] to a code and error[1] to the row; the host raises.

#define IBP_WARP 32
#define IBP_WARPS_PER_BLOCK 4
#define IBP_RING 512
#define IBP_SEGMENT 128
#define IBP_FULL 0xffffffffu

typedef unsigned long long ibp_u64;
typedef long long ibp_i64;

__device__ __forceinline__ int ibp_clz(unsigned int x) { return __clz(x); }
__device__ __forceinline__ int ibp_clz(ibp_u64 x) { return __clzll(x); }
__device__ __forceinline__ int ibp_popc(unsigned int x) { return __popc(x); }
__device__ __forceinline__ int ibp_popc(ibp_u64 x) { return __popcll(x); }

__device__ __forceinline__ void ibp_fail(int* error, int code, ibp_i64 row) {
    if (atomicCAS(error, 0, code) == 0) {
        error[1] = (int)row;
    }
}

// Deposit the k low bits of `bits` into the set bits of `freem`, highest bit first, one run
// of consecutive free bits at a time (software PDEP).
template <typename T>
__device__ __forceinline__ T ibp_deposit(T bits, T freem, int k) {
    const int W = (int)sizeof(T) * 8;
    T out = 0;
    int rem = k;
    while (freem) {
        const int hb = W - 1 - ibp_clz(freem);
        const T below = (T)(~freem) & (T)((((T)1) << hb) - 1);
        const int lo = below ? (W - ibp_clz(below)) : 0;
        const int len = hb - lo + 1;
        rem -= len;
        const T lenmask = (len == W) ? (T)(~(T)0) : (T)((((T)1) << len) - 1);
        out |= ((bits >> rem) & lenmask) << lo;
        freem &= lo ? (T)((((T)1) << lo) - 1) : (T)0;
    }
    return out;
}

template <typename T>
__device__ __forceinline__ T ibp_load(const unsigned char* p) {
    return *reinterpret_cast<const T*>(p);
}

template <typename T>
__device__ void ibp_decompress_impl(
    const unsigned char* __restrict__ src,   // data section (C-aligned)
    ibp_i64 src_len,                         // its length in bytes
    const ibp_i64* __restrict__ row_off,     // byte offset of every row in src
    const int* __restrict__ row_len,         // condensed: words of every row (n = raw)
    const unsigned char* __restrict__ bitmask,  // in-place: bit i = row i compressed
    const int* __restrict__ cluster,         // cluster id of every row (if clustered)
    int condensed, int clustered,
    const T* __restrict__ masks,             // [clusters][n]
    const T* __restrict__ bitvals,           // [clusters][n]
    ibp_i64 nrows, int n,
    T* __restrict__ dst,                     // [nrows][n]
    int* __restrict__ error)
{
    const int W = (int)sizeof(T) * 8;
    const int C = (int)sizeof(T);
    __shared__ __align__(16) unsigned char ring_all[IBP_WARPS_PER_BLOCK * IBP_RING];
    const int lane = threadIdx.x & (IBP_WARP - 1);
    unsigned char* ring = ring_all + (threadIdx.x / IBP_WARP) * IBP_RING;
    const ibp_i64 warp = ((ibp_i64)blockIdx.x * blockDim.x + threadIdx.x) / IBP_WARP;
    const ibp_i64 nwarps = ((ibp_i64)gridDim.x * blockDim.x) / IBP_WARP;
    const int meta_words = (n + W - 1) / W;
    const ibp_u64 base_addr = (ibp_u64)src;

    for (ibp_i64 i = warp; i < nrows; i += nwarps) {
        const int c = clustered ? cluster[i] : 0;
        const T* mrow = masks + (ibp_i64)c * n;
        const T* brow = bitvals + (ibp_i64)c * n;
        const ibp_i64 rstart = row_off[i];
        int rowlen;
        bool comp;
        if (condensed) {
            rowlen = row_len[i];
            comp = rowlen < n;
        } else {
            rowlen = n;
            comp = (bitmask[i >> 3] >> (i & 7)) & 1;
        }
        T* out = dst + i * (ibp_i64)n;
        if (rstart < 0 || rowlen > n || (comp && rowlen < meta_words) ||
            rstart + (ibp_i64)rowlen * C > src_len) {
            if (lane == 0) ibp_fail(error, comp ? 6 : 1, i);
            continue;  // uniform across the warp
        }
        if (!comp) {
            for (int j = lane; j < n; j += IBP_WARP) {
                out[j] = ibp_load<T>(src + rstart + (ibp_i64)j * C);
            }
            continue;
        }
        const ibp_u64 stream_start = base_addr + (ibp_u64)rstart + (ibp_u64)meta_words * C;
        ibp_u64 loaded_end = stream_start & ~(ibp_u64)(IBP_SEGMENT - 1);
        ibp_i64 bitpos = 0;
        for (int r = 0; r < n; r += IBP_WARP) {
            const int j = r + lane;
            int k = 0;
            bool part = false;
            T m = 0;
            if (j < n) {
                part = (src[rstart + (j >> 3)] >> (j & 7)) & 1;
                m = mrow[j];
                k = part ? W - ibp_popc(m) : W;
            }
            int incl = k;
#pragma unroll
            for (int d = 1; d < IBP_WARP; d <<= 1) {
                const int t = __shfl_up_sync(IBP_FULL, incl, d);
                if (lane >= d) incl += t;
            }
            const int total = __shfl_sync(IBP_FULL, incl, IBP_WARP - 1);
            const ibp_i64 p = bitpos + incl - k;
            const ibp_i64 end_bits = bitpos + total;
            const ibp_u64 need_end = stream_start + (ibp_u64)((end_bits + W - 1) / W) * C;
            while (loaded_end < need_end) {  // uniform: every lane has the same values
                const ibp_u64 a = loaded_end + 4u * lane;
                const ibp_i64 off = (ibp_i64)(a - base_addr);
                unsigned int v = 0;
                if (off >= 0 && off + 4 <= src_len) {
                    v = ibp_load<unsigned int>(src + off);
                } else {
                    for (int b = 0; b < 4; ++b) {
                        if (off + b >= 0 && off + b < src_len) {
                            v |= (unsigned int)src[off + b] << (8 * b);
                        }
                    }
                }
                *reinterpret_cast<unsigned int*>(ring + (a & (IBP_RING - 1))) = v;
                loaded_end += IBP_SEGMENT;
            }
            __syncwarp();
            if (j < n) {
                const ibp_i64 q = p / W;
                const int o = (int)(p % W);
                const ibp_u64 aq = stream_start + (ibp_u64)q * C;
                const T hi = ibp_load<T>(ring + (aq & (IBP_RING - 1)));
                const T lo = (o + k > W) ? ibp_load<T>(ring + ((aq + C) & (IBP_RING - 1)))
                                         : (T)0;
                const T v = o ? (T)((hi << o) | (lo >> (W - o))) : hi;
                const T bits = k ? (T)(v >> (W - k)) : (T)0;
                out[j] = part ? (T)(ibp_deposit<T>(bits, (T)(~m), k) | brow[j]) : bits;
            }
            __syncwarp();  // the next round may overwrite the ring
            bitpos = end_bits;
        }
        if (lane == 0) {
            const ibp_i64 used = meta_words + (bitpos + W - 1) / W;
            if ((!condensed && used >= n) || (condensed && used != rowlen)) {
                ibp_fail(error, 2, i);
            } else {
                if (n % W) {
                    const T pw = ibp_load<T>(src + rstart + (ibp_i64)(meta_words - 1) * C);
                    if (pw >> (n % W)) ibp_fail(error, 5, i);
                }
                const int rem = (int)(bitpos % W);
                if (rem) {
                    const T lw = ibp_load<T>(src + rstart + (meta_words + bitpos / W) * C);
                    if (lw & (T)((((T)1) << (W - rem)) - 1)) ibp_fail(error, 5, i);
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(IBP_WARP * IBP_WARPS_PER_BLOCK)
ibp_decompress_u32(const unsigned char* src, long long src_len, const long long* row_off,
                   const int* row_len, const unsigned char* bitmask, const int* cluster,
                   int condensed, int clustered, const unsigned int* masks,
                   const unsigned int* bitvals, long long nrows, int n, unsigned int* dst,
                   int* error)
{
    ibp_decompress_impl<unsigned int>(src, src_len, row_off, row_len, bitmask, cluster,
                                      condensed, clustered, masks, bitvals, nrows, n, dst,
                                      error);
}

extern "C" __global__ void __launch_bounds__(IBP_WARP * IBP_WARPS_PER_BLOCK)
ibp_decompress_u64(const unsigned char* src, long long src_len, const long long* row_off,
                   const int* row_len, const unsigned char* bitmask, const int* cluster,
                   int condensed, int clustered, const unsigned long long* masks,
                   const unsigned long long* bitvals, long long nrows, int n,
                   unsigned long long* dst, int* error)
{
    ibp_decompress_impl<unsigned long long>(src, src_len, row_off, row_len, bitmask, cluster,
                                            condensed, clustered, masks, bitvals, nrows, n,
                                            dst, error);
}
