// Skinny GEMM C[M, N] = A[M, K] . W[N, K]^T for M <= 32 (decode projections), on matrix cores.
//
// The weight matrix is the big operand, so it plays the 16-row "A" side of the matrix instruction
// and the few activation rows play the narrow side (C^T = W A^T). Each lane loads 16 contiguous
// bytes of one weight row straight into registers (no shared memory) and the activations at the
// same k positions: a dot product does not care in which order k is visited, so the lane's k
// "slots" in the instruction layout are simply mapped onto the bytes it loaded.
//
// Work split: a warp owns MT tiles of 16 weight rows; the WARPS_K warps of a block share those
// rows and split the block's K range (interleaved runs of UNROLL k-blocks, all loads issued
// before the math); grid.y splits K further. Warps are reduced through shared memory in a fixed
// order; with grid.y > 1 each split writes fp32 partials and `skinny_splitk_reduce` sums them
// in split order, so results never depend on timing.
//
// Epilogues (template argument EP, one per kernel path, the main loop shared): plain store; residual
// (out = residual + C, fp32 then one rounding, in place when out == residual); SwiGLU over interleaved
// gate/up weight rows (prepare_gate_up: each 16-row tile holds 8 gate rows then the 8 matching up
// rows, so one lane -- NVIDIA -- or a lane and its partner 32 lanes away -- AMD -- holds both halves
// of an output) writing silu(g) * u as fp16/bf16 or as FP8 with a static scale. With grid split-K the
// reduce kernel owns the epilogue, so the residual is added once and the [M, 2I] result stays in fp32
// partials.
//
// Paths: NVIDIA mma.sync (m16n8k16 bf16/f16, m16n8k32 e4m3); AMD MFMA 16x16x16 bf16/f16
// (gfx90a+) and 16x16x32 fp8 (gfx942 e4m3fnuz, gfx950 e4m3fn). FP8 on gfx90a has no matrix
// instruction: there fp8 is widened to f16 in registers (the host prefers gemv.hip's portable kernel).
#include <hip/hip_runtime.h>
#include "rocjit/types.h"   // __half / __hip_bfloat16 on every compiler (hipRTC included)
#include "rocjit/fp8.h"
#include "rocjit/stream.h"  // read-once weight loads, programmatic dependent launch
#include "rocjit/device.h"
#include "rocjit/mbarrier.h"  // the stream kernels' copy / multiply pipelines
#include "rocjit/mma_fp8.h"   // cp.async copies
#include "rocjit/wgmma.h"     // the TMA kernel's warpgroup MMAs
#include "rocjit/tma.h"
#include "rocjit/epilogue.h"  // skinny::epilogue, ep_store / ep_residual / ep_swiglu (shared with gemv.hip)

// The weight stream's load hint (rocjit/stream.h: 0 no L1 allocation, 1 / 2 + L2 prefetch of 128 / 256
// bytes, 3 evict-first, 4 = 2 + L2 evict-first policy); a config's "hint" (rocjit/ops/_gemm.py) or -D
// overrides it. H100, FP8 13312 x 16384, M = 1, alone: 86 us with 0 or 3, 78 us with 1 or 2 (the 64-byte
// row pieces a warp asks for become 256-byte DRAM reads). Inside a model the prefetch alone is not enough:
// after a cuBLAS GEMM in the same stream, hint 2 ran 20-32% slower at every weight of 50 MB or more (bf16
// 28672 x 4096, M = 1: 112 us against 82 alone), hint 4 as fast as alone (80 us) -- so 4 is the default.
#ifndef SKINNY_W_HINT
#define SKINNY_W_HINT 4
#endif
// Programmatic dependent launch (sm_90+; rocjit launches this file's kernels with it, see `rocjit:pdl`
// below): each block asks L2 for its first weights (a prefetch reads no value, so it is safe even where
// the kernel ahead writes the weights), then waits for the kernel ahead before its first load or write;
// weights stream while that kernel's tail runs. The next kernel is let in once the main loop is done
// (launch_dependents after it, not at the start: a persistent or one-wave grid would otherwise share
// its SMs with waiting blocks for its whole run).
// rocjit:pdl

#if defined(__AMDGCN__)
#define SKINNY_AMD 1
#if defined(__gfx942__) || defined(__gfx950__)
#define SKINNY_AMD_FP8 1
#endif
#else
#define SKINNY_NV 1
#endif

namespace skinny {

// Element kinds of A and W (both operands share one kind).
struct bf16_t { typedef __hip_bfloat16 storage; static constexpr int per16 = 8; };
struct f16_t { typedef __half storage; static constexpr int per16 = 8; };
struct e4m3_t { typedef unsigned char storage; static constexpr int per16 = 16; };

// Weights are read once: no L1 line, and (SKINNY_W_HINT, see rocjit/stream.h) an L2 prefetch size / policy.
__device__ __forceinline__ uint4 load16_stream(const void* p) { return rocjit::load16_once<SKINNY_W_HINT>(p); }

#if defined(SKINNY_NV)
// ---- NVIDIA: warp of 32 = 8 row groups x 4 chunk lanes; a lane holds rows g and g+8 ----
constexpr int kWarp = 32;
constexpr int kRowsPerLane = 2;
constexpr int kNTileRows = 8;   // activation rows per mma (n = 8)
constexpr int kAcc = 4;         // accumulators per lane per (m-tile, n-tile)

__device__ __forceinline__ int lane_row() { return (threadIdx.x & 31) >> 2; }
__device__ __forceinline__ int lane_chunk() { return threadIdx.x & 3; }

template <class E> __device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2,
                                                       unsigned a3, unsigned b0, unsigned b1);
template <> __device__ __forceinline__ void mma<bf16_t>(float* c, unsigned a0, unsigned a1, unsigned a2,
                                                        unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<f16_t>(float* c, unsigned a0, unsigned a1, unsigned a2,
                                                       unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<e4m3_t>(float* c, unsigned a0, unsigned a1, unsigned a2,
                                                        unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 16-byte chunk per row = two instructions. Register 2s of the chunk fills the lane's
// low k slots and register 2s+1 its high k slots (same mapping for the activations).
template <class E>
__device__ __forceinline__ void mma_chunk(float* c, const uint4 (&w)[kRowsPerLane], uint4 x) {
    mma<E>(c, w[0].x, w[1].x, w[0].y, w[1].y, x.x, x.y);
    mma<E>(c, w[0].z, w[1].z, w[0].w, w[1].w, x.z, x.w);
}
#if ROCJIT_SM >= 900 && ROCJIT_SM < 1000 && !defined(SKINNY_PTXAS_FP8)
// Hopper has no FP8 mma.sync in hardware: ptxas expands each m16n8k32 e4m3 into e4m3 -> f16 conversions of both
// operands, two f16 m16n8k16 instructions into temporaries and fp32 adds into the accumulators (SASS of the
// (1, 4, 2) build at 4 activation tiles: 112 F2FP, 112 FADD, 32 HMMA; with this: 112, 48 -- the warps' reduction
// and the epilogue --, 32). Here the 16 bytes are widened (side-effect-free asm: the compiler shares a weight
// chunk's conversions among the activation tiles) and multiplied by four f16 instructions accumulating in place:
// byte 4 i + 2 s .. + 1 of every operand is the lane's k pair s of instruction i (K order does not matter to the
// dot product). tests/test_skinny_weight_stream_cpu.py counts the SASS. On an H100 (FP8,
// weights rotated beyond L2, one run, best config each) 13312 x 16384 at M = 32 ran in 85.6 us against 91.8 with
// ptxas's expansion (cuBLASLt 82.2), 16384 x 6656 at M = 32 in 46.1 against 47.3 and at M = 1 in 34.8 against 36.0.
// -DSKINNY_PTXAS_FP8 restores the expansion, for comparison. (rocjit::widen_e4m3x4: rocjit/fp8.h.)
template <>
__device__ __forceinline__ void mma_chunk<e4m3_t>(float* c, const uint4 (&w)[kRowsPerLane], uint4 x) {
    const unsigned g[4] = {w[0].x, w[0].y, w[0].z, w[0].w}, e[4] = {w[1].x, w[1].y, w[1].z, w[1].w};
    const unsigned b[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        unsigned g0, g1, e0, e1, b0, b1;
        rocjit::widen_e4m3x4(g[i], g0, g1);
        rocjit::widen_e4m3x4(e[i], e0, e1);
        rocjit::widen_e4m3x4(b[i], b0, b1);
        mma<f16_t>(c, g0, e0, g1, e1, b0, b1);
    }
}
#endif

// Accumulator r of (m-tile t, n-tile j) -> (weight row within the warp's tiles, activation row).
__device__ __forceinline__ int acc_wrow(int t, int r) { return 16 * t + lane_row() + 8 * (r >> 1); }
__device__ __forceinline__ int acc_arow(int j, int r) { return kNTileRows * j + 2 * lane_chunk() + (r & 1); }
// The accumulator 8 weight rows below accumulator r (rows g, g+8 of a lane): the SwiGLU up partner.
__device__ __forceinline__ float row_plus8(const float* c, int r) { return c[(r + 2) & 3]; }
#endif

#if defined(SKINNY_AMD)
// ---- AMD CDNA: wave of 64 = 16 rows x 4 chunk lanes; MFMA 16x16 with 16 activation rows ----
constexpr int kWarp = 64;
constexpr int kRowsPerLane = 1;
constexpr int kNTileRows = 16;
constexpr int kAcc = 4;

typedef float floatx4 __attribute__((ext_vector_type(4)));
typedef short shortx4 __attribute__((ext_vector_type(4)));
typedef _Float16 halfx4 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ int lane_row() { return threadIdx.x & 15; }
__device__ __forceinline__ int lane_chunk() { return (threadIdx.x & 63) >> 4; }

template <class V> __device__ __forceinline__ V as_vec(unsigned lo, unsigned hi) {
    unsigned long long bits = (unsigned long long)lo | ((unsigned long long)hi << 32);
    return __builtin_bit_cast(V, bits);
}

template <class E> __device__ __forceinline__ void mfma(float* c, unsigned alo, unsigned ahi, unsigned blo, unsigned bhi);
template <> __device__ __forceinline__ void mfma<bf16_t>(float* c, unsigned alo, unsigned ahi, unsigned blo, unsigned bhi) {
    floatx4 acc = {c[0], c[1], c[2], c[3]};
    acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(as_vec<shortx4>(alo, ahi), as_vec<shortx4>(blo, bhi), acc, 0, 0, 0);
    c[0] = acc[0]; c[1] = acc[1]; c[2] = acc[2]; c[3] = acc[3];
}
template <> __device__ __forceinline__ void mfma<f16_t>(float* c, unsigned alo, unsigned ahi, unsigned blo, unsigned bhi) {
    floatx4 acc = {c[0], c[1], c[2], c[3]};
    acc = __builtin_amdgcn_mfma_f32_16x16x16f16(as_vec<halfx4>(alo, ahi), as_vec<halfx4>(blo, bhi), acc, 0, 0, 0);
    c[0] = acc[0]; c[1] = acc[1]; c[2] = acc[2]; c[3] = acc[3];
}
#if defined(SKINNY_AMD_FP8)
template <> __device__ __forceinline__ void mfma<e4m3_t>(float* c, unsigned alo, unsigned ahi, unsigned blo, unsigned bhi) {
    floatx4 acc = {c[0], c[1], c[2], c[3]};
    acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(as_vec<long>(alo, ahi), as_vec<long>(blo, bhi), acc, 0, 0, 0);
    c[0] = acc[0]; c[1] = acc[1]; c[2] = acc[2]; c[3] = acc[3];
}
#else
// gfx90a has no FP8 matrix instruction: widen e4m3fnuz (ROCm's FP8 on CDNA) to f16 exactly
// (the 7 exponent+mantissa bits land in f16's, then scale by 2^(15-8)) and use the f16 MFMA.
__device__ __forceinline__ halfx4 fnuz4_to_half4(unsigned v) {
    halfx4 h;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        unsigned b = (v >> (8 * i)) & 0xFFu;
        unsigned short bits = (unsigned short)(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7));
        h[i] = __builtin_bit_cast(_Float16, bits) * (_Float16)128.0f;
    }
    return h;
}
template <> __device__ __forceinline__ void mfma<e4m3_t>(float* c, unsigned alo, unsigned ahi, unsigned blo, unsigned bhi) {
    floatx4 acc = {c[0], c[1], c[2], c[3]};
    acc = __builtin_amdgcn_mfma_f32_16x16x16f16(fnuz4_to_half4(alo), fnuz4_to_half4(blo), acc, 0, 0, 0);
    acc = __builtin_amdgcn_mfma_f32_16x16x16f16(fnuz4_to_half4(ahi), fnuz4_to_half4(bhi), acc, 0, 0, 0);
    c[0] = acc[0]; c[1] = acc[1]; c[2] = acc[2]; c[3] = acc[3];
}
#endif

template <class E>
__device__ __forceinline__ void mma_chunk(float* c, const uint4 (&w)[kRowsPerLane], uint4 x) {
    mfma<E>(c, w[0].x, w[0].y, x.x, x.y);
    mfma<E>(c, w[0].z, w[0].w, x.z, x.w);
}

__device__ __forceinline__ int acc_wrow(int t, int r) { return 16 * t + 4 * lane_chunk() + r; }
__device__ __forceinline__ int acc_arow(int j, int r) { return kNTileRows * j + lane_row(); }
// Rows 4*chunk + r: row + 8 sits in the lane two chunks on (32 lanes away), same activation row.
__device__ __forceinline__ float row_plus8(const float* c, int r) { return __shfl_xor(c[r], 32); }
#endif

// A lane's scale factors for its accumulators (acc * a[j][r] * w[t][r]; w8: the SwiGLU up partner's row, 8 rows
// below). load_scales reads them the way `scaled` does (1 where a pointer is null, one scale per tensor unless
// modes says per row / column); rows and columns outside M / N read index 0 and their values are dropped.
// skinny_gemm_kernel issues these loads right behind its last step's, so that the epilogue does not wait for one
// more L2 round trip after the last multiply. H100, FP8 with per-column weight scales, best of 5 configs each:
// 16384 x 6656 at M = 16 37.9 us against 42.3 with the loads in the epilogue, at M = 32 45.9 against 48.9;
// 13312 x 16384 at M = 32 90.8 against 93.7. Loaded right after the grid-dependency wait instead, the values were
// held (registers, a load scoreboard) through the whole main loop: the decode MLP chain at M = 1 then ran 120.5 us
// against 116.3; loaded after the main loop, 118.0.
template <bool UP, int MT, int NT> struct lane_scales {
    float w[MT][kAcc], w8[UP ? MT : 1][kAcc], a[NT][kAcc];
    __device__ __forceinline__ float of(int t, int j, int r, int, int) const { return a[j][r] * w[t][r]; }
    __device__ __forceinline__ float up(int t, int j, int r, int, int) const { return a[j][r] * w8[t][r]; }
};
// The same factors, loaded where they are used (kernels whose accumulators' rows are known only at the end).
template <class OT> struct scales_here {
    const epilogue<OT>& p;
    __device__ __forceinline__ float of(int, int, int, int m, int n) const {
        return scale_at(p.scale_a, p.modes & 2, m) * scale_at(p.scale_w, p.modes & 1, n);
    }
    __device__ __forceinline__ float up(int t, int j, int r, int m, int n) const { return of(t, j, r, m, n + 8); }
};
template <class EP, int MT, int NT, class OT>
__device__ __forceinline__ lane_scales<EP::kind == 2, MT, NT> load_scales(const epilogue<OT>& p, int row_base) {
    lane_scales<EP::kind == 2, MT, NT> s;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < kAcc; ++r) {
            const int n = row_base + acc_wrow(t, r);
            s.w[t][r] = scale_at(p.scale_w, p.modes & 1, n < p.N ? n : 0);
            if constexpr (EP::kind == 2) s.w8[t][r] = scale_at(p.scale_w, p.modes & 1, n + 8 < p.N ? n + 8 : 0);
        }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < kAcc; ++r) {
            const int m = acc_arow(j, r);
            s.a[j][r] = scale_at(p.scale_a, p.modes & 2, m < p.M ? m : 0);
        }
    return s;
}

// A warp's finished accumulators: tile t covers weight rows row_base + 16t .. +15 (row_base % 16 == 0), sc their
// scales (load_scales).
// Two passes: every load (the residual) is issued before the first store. `out` may be `residual`
// itself, so interleaved, a load after a store could not start before it. (This did not close the residual
// epilogue's gap on an H100: FP8 16384 x 6656 at M = 32 with the same config, 50.0 - 50.6 us against 45.5 for
// the plain store; an L2 prefetch of the residual at the kernel's start did not either.)
template <class EP, class OT, int MT, int NT, class S>
__device__ __forceinline__ void write_acc(const float (&acc)[MT][NT][kAcc], int row_base, const epilogue<OT>& p,
                                          const S& sc) {
    float v[MT][NT][kAcc], up[EP::kind == 2 ? MT : 1][NT][kAcc];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) {
                const int n = row_base + acc_wrow(t, r);
                const int m = acc_arow(j, r);
                if constexpr (EP::kind == 2) {
                    const float u = row_plus8(acc[t][j], r);        // every lane takes part (AMD shuffle)
                    const bool live = !(n & 8) && n < p.N && m < p.M && (n >> 4) * 8 + (n & 7) < p.ldo;
                    v[t][j][r] = live ? acc[t][j][r] * sc.of(t, j, r, m, n) : 0.f;
                    up[t][j][r] = live ? u * sc.up(t, j, r, m, n) : 0.f;
                } else {
                    v[t][j][r] = n < p.N && m < p.M ? p.template value<EP>(m, n, acc[t][j][r] * sc.of(t, j, r, m, n)) : 0.f;
                }
            }
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) {
                const int n = row_base + acc_wrow(t, r);
                const int m = acc_arow(j, r);
                if constexpr (EP::kind == 2) {
                    const int col = (n >> 4) * 8 + (n & 7);
                    if ((n & 8) || n >= p.N || m >= p.M || col >= p.ldo) continue;
                    p.template put_swiglu<EP>(m, col, v[t][j][r], up[t][j][r]);
                } else {
                    if (n >= p.N || m >= p.M) continue;
                    p.store(m, n, v[t][j][r]);
                }
            }
}
template <class EP, class OT, int MT, int NT>
__device__ __forceinline__ void write_acc(const float (&acc)[MT][NT][kAcc], int row_base, const epilogue<OT>& p) {
    write_acc<EP>(acc, row_base, p, scales_here<OT>{p});
}
// The same accumulators' raw sums to `slab`, one [M, N] slab of a split-K / stream-K workspace: a reduce kernel
// (skinny_splitk_reduce, skinny_streamk_reduce) adds the slabs and runs the epilogue.
template <int MT, int NT>
__device__ __forceinline__ void store_partial(const float (&acc)[MT][NT][kAcc], int row_base, float* slab, int M,
                                              int N) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) {
                const int n = row_base + acc_wrow(t, r);
                const int m = acc_arow(j, r);
                if (n < N && m < M) slab[(size_t)m * N + n] = acc[t][j][r];
            }
}

// The copy side of a kernel whose blocks hold a whole SM (skinny_stream_kernel, skinny_tma_kernel), ROWS the
// activation rows its build holds: once every copy is issued it lets the next kernel in early only above 16 rows;
// with fewer, only the block's end does (its own launch_dependents). A grid of many small blocks let in while these
// blocks drain is placed on the SMs in the order they empty, each filled to its limit. H200, graph replays, weights
// rotated: the seed's fused MLP chain (rms_norm, gate/up on skinny_gemm_kernel, down on skinny_tma_kernel) took
// 133.6 / 128.5 us at M = 8 / 16 with the early trigger, 88.8 / 90.6 without; the down projection on
// skinny_stream_kernel's configs at M = 16 117.4 - 158.2 against 108.0 - 118.4 (alone 4 us slower without it). At 32
// rows the seed's neighbours are skinny_tma_kernel too, whose one-block-per-SM grid fills evenly in any order: its
// gate/up then down pair 87.4 us with the early trigger, 90.1 without.
template <int ROWS>
__device__ __forceinline__ void copies_issued_launch_dependents() {
    if constexpr (ROWS > 16) rocjit::launch_dependents();
}

}  // namespace skinny

// E: element kind; OT: output type; MT: 16-row weight tiles per warp; NT: activation tiles
// (M <= NT * kNTileRows); WARPS_K: warps splitting K inside a block; UNROLL: k-blocks in flight;
// MINB: blocks per multiprocessor the registers must allow (launch bounds: a grid of one full wave);
// PIPE: 1 keeps a second register set of loads in flight while a step multiplies (software pipelining).
// A k-block is 4 chunks of 16 bytes per row (32 bf16/f16 or 64 fp8 values).
// EP: the epilogue (ep_store, ep_residual, ep_swiglu<Q>); ldo: columns of out (N, or I for SwiGLU).
// partial == nullptr: out gets EP of acc * scale_a * scale_w (scale_modes: which are per row / column);
// else partial[split][M][N] = acc and skinny_splitk_reduce runs the epilogue.
template <class E, class OT, int MT, int NT, int WARPS_K, int UNROLL, int MINB, int PIPE, class EP>
__launch_bounds__(WARPS_K * skinny::kWarp, MINB) __global__ void
skinny_gemm_kernel(const typename E::storage* __restrict__ a, const typename E::storage* __restrict__ w,
                   OT* out, float* __restrict__ partial, const OT* residual, const float* __restrict__ out_scale,
                   const float* __restrict__ scale_a, const float* __restrict__ scale_w, int scale_modes,
                   int M, int N, int K, int kblocks_per_split, int ldo) {
    using namespace skinny;
    constexpr int kPer16 = E::per16;
    constexpr int kBlockK = 4 * kPer16;                 // elements of K per k-block
    const int warp = threadIdx.x / kWarp;
    const int row0 = blockIdx.x * (16 * MT);
    const int nkb = (K + kBlockK - 1) / kBlockK;
    const int kb_begin = blockIdx.y * kblocks_per_split;
    const int kb_end = min(nkb, kb_begin + kblocks_per_split);

    // Pointers of the rows this lane reads; rows past N read row 0 and are dropped in the epilogue.
    const typename E::storage* wrow[MT][kRowsPerLane];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int h = 0; h < kRowsPerLane; ++h) {
            int n = row0 + 16 * t + lane_row() + 8 * h;
            wrow[t][h] = w + (size_t)(n < N ? n : 0) * K + lane_chunk() * kPer16;
        }
    const typename E::storage* arow[NT];
    bool a_live[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        int m = kNTileRows * j + lane_row();
        a_live[j] = m < M;
        arow[j] = a + (size_t)(a_live[j] ? m : 0) * K + lane_chunk() * kPer16;
    }

    float acc[MT][NT][kAcc];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) acc[t][j][r] = 0.f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
#if ROCJIT_HAS_PDL
    for (int u = 0; u < UNROLL; ++u) {
        const int kb = kb_begin + warp * UNROLL + u;
        if (kb < kb_end && kb * kBlockK + lane_chunk() * kPer16 < K)
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int h = 0; h < kRowsPerLane; ++h) rocjit::prefetch_l2_early(wrow[t][h] + (size_t)kb * kBlockK);
    }
    rocjit::grid_dependency_wait();
#endif
    // The epilogue's scales (and FP8 SwiGLU's out_scale) are loaded behind the last step's loads (see load_scales).
    lane_scales<EP::kind == 2, MT, NT> sc;
    epilogue<OT> ep;
    auto load_epilogue = [&]() {
        ep = make_epilogue<EP>(out, residual, out_scale, scale_a, scale_w, scale_modes, M, N, ldo);
        sc = load_scales<EP, MT, NT>(ep, row0);
    };
    // One step: UNROLL k-blocks of this warp, every load issued before any math (UNROLL * MT * 16 rows * 64
    // bytes of weights in flight, then the activations at the same k); k-blocks past the range load zeros.
    auto load_step = [&](int kb0, uint4 (&wv)[UNROLL][MT][kRowsPerLane], uint4 (&av)[UNROLL][NT]) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int kb = kb0 + u;
            const int k = kb * kBlockK + lane_chunk() * kPer16;
            const bool live = kb < kb_end && k < K;
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int h = 0; h < kRowsPerLane; ++h)
                    wv[u][t][h] = live ? load16_stream(wrow[t][h] + (size_t)kb * kBlockK) : zero;
#pragma unroll
            for (int j = 0; j < NT; ++j)
                av[u][j] = (live && a_live[j]) ? rocjit::load16_dep(arow[j] + (size_t)kb * kBlockK) : zero;
        }
    };
    auto math_step = [&](const uint4 (&wv)[UNROLL][MT][kRowsPerLane], const uint4 (&av)[UNROLL][NT]) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma_chunk<E>(acc[t][j], wv[u][t], av[u][j]);
    };
    constexpr int kStep = WARPS_K * UNROLL;
    if constexpr (PIPE) {
        // Two register sets: the next step's loads are in flight while this step multiplies (the loop is
        // unrolled by two so that each set keeps fixed registers).
        uint4 wv0[UNROLL][MT][kRowsPerLane], wv1[UNROLL][MT][kRowsPerLane], av0[UNROLL][NT], av1[UNROLL][NT];
        int kb0 = kb_begin + warp * UNROLL;
        load_step(kb0, wv0, av0);
        while (kb0 < kb_end) {
            load_step(kb0 + kStep, wv1, av1);
            math_step(wv0, av0);
            kb0 += kStep;
            if (kb0 >= kb_end) break;
            load_step(kb0 + kStep, wv0, av0);
            math_step(wv1, av1);
            kb0 += kStep;
        }
        if (!partial) load_epilogue();      // split-K: the reduce kernel applies them
    } else {
        // The last step apart: its loads first, then the epilogue's, in flight together.
        int kb0 = kb_begin + warp * UNROLL;
        for (; kb0 + kStep < kb_end; kb0 += kStep) {
            uint4 wv[UNROLL][MT][kRowsPerLane];
            uint4 av[UNROLL][NT];
            load_step(kb0, wv, av);
            math_step(wv, av);
        }
        uint4 wv[UNROLL][MT][kRowsPerLane];
        uint4 av[UNROLL][NT];
        load_step(kb0, wv, av);          // zeros for a warp with no k-blocks
        if (!partial) load_epilogue();
        math_step(wv, av);
    }
    // Only now may the next kernel's blocks take room on the SMs: in a grid of one wave, blocks waiting from
    // the start would sit beside this one's for its whole run.
    rocjit::launch_dependents();

    // Fixed-order reduction of the WARPS_K warps through shared memory.
    constexpr int kVals = MT * NT * kAcc;
    float* dst = &acc[0][0][0];
    if (WARPS_K > 1) {
        __shared__ float red[WARPS_K - 1 > 0 ? WARPS_K - 1 : 1][kVals][kWarp];
        const int lane = threadIdx.x % kWarp;
        if (warp > 0) {
#pragma unroll
            for (int v = 0; v < kVals; ++v) red[warp - 1][v][lane] = dst[v];
        }
        __syncthreads();
        if (warp != 0) return;
        for (int s = 0; s < WARPS_K - 1; ++s)
#pragma unroll
            for (int v = 0; v < kVals; ++v) dst[v] += red[s][v][lane];
    }

    if (partial) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int r = 0; r < kAcc; ++r) {
                    const int n = row0 + acc_wrow(t, r);
                    const int m = acc_arow(j, r);
                    if (n < N && m < M) partial[((size_t)blockIdx.y * M + m) * N + n] = acc[t][j][r];
                }
        return;
    }
    write_acc<EP>(acc, row0, ep, sc);
}

// FP8 (e4m3 / e4m3fnuz) C[M, N] = A[M, K] W[N, K]^T with blockwise scales, 1 x 128 on A and 128 x 128 on W:
//   C[m, n] = sum over the 128-wide K blocks kb of (A W^T)_kb * sa[m * sa_m + kb * sa_k] * sw[(n / 128) * sw_n + kb * sw_k]
// gemm_fp8_blockwise's layout NT for M <= 32 rows (decode), skinny_gemm_kernel's loads and work split.
// Each pair of 64-byte k-blocks of a step (one 128-wide K block: UNROLL and kblocks_per_split even) multiplies into
// fresh partials, added to the accumulators times the block's scales, which are loaded before the step's weights.
// Rows of A and W are K bytes apart (K % 16 == 0; a K tail inside the last block is zero-filled). partial != nullptr:
// the split's scaled sums go to partial[split][M][N] for skinny_splitk_reduce (scale_modes 0).
// (Its own body, not skinny_gemm_kernel's with a switch: sharing one body cost the SwiGLU epilogue's builds 6 - 56
// registers on sm_90a, and an occupancy step.)
template <class OT, int MT, int NT, int WARPS_K, int UNROLL, int MINB>
__launch_bounds__(WARPS_K * skinny::kWarp, MINB) __global__ void
skinny_gemm_blockwise_kernel(const unsigned char* __restrict__ a, const unsigned char* __restrict__ w, OT* out,
                             float* __restrict__ partial, const float* __restrict__ sa, const float* __restrict__ sw,
                             int M, int N, int K, int kblocks_per_split, int ldo, int sa_m, int sa_k, int sw_n,
                             int sw_k) {
    using namespace skinny;
    static_assert(UNROLL % 2 == 0 && 128 % (16 * MT) == 0, "whole 128-wide K blocks per step, rows in one scale block");
    constexpr int kPairs = UNROLL / 2;
    const int warp = threadIdx.x / kWarp;
    const int row0 = blockIdx.x * (16 * MT);
    const int nkb = (K + 63) / 64, nkbl = (K + 127) / 128;
    const int kb_begin = blockIdx.y * kblocks_per_split;
    const int kb_end = min(nkb, kb_begin + kblocks_per_split);
    const unsigned char* wrow[MT][kRowsPerLane];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int h = 0; h < kRowsPerLane; ++h) {
            const int n = row0 + 16 * t + lane_row() + 8 * h;
            wrow[t][h] = w + (size_t)(n < N ? n : 0) * K + lane_chunk() * 16;
        }
    const unsigned char* arow[NT];
    bool a_live[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int m = kNTileRows * j + lane_row();
        a_live[j] = m < M;
        arow[j] = a + (size_t)(a_live[j] ? m : 0) * K + lane_chunk() * 16;
    }
    float acc[MT][NT][kAcc];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) acc[t][j][r] = 0.f;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#if ROCJIT_HAS_PDL
    for (int u = 0; u < UNROLL; ++u) {
        const int kb = kb_begin + warp * UNROLL + u;
        if (kb < kb_end && kb * 64 + lane_chunk() * 16 < K)
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int h = 0; h < kRowsPerLane; ++h) rocjit::prefetch_l2_early(wrow[t][h] + (size_t)kb * 64);
    }
    rocjit::grid_dependency_wait();
#endif
    for (int kb0 = kb_begin + warp * UNROLL; kb0 < kb_end; kb0 += WARPS_K * UNROLL) {
        float bsw[kPairs], bsa[kPairs][NT][kAcc];         // the step's scales (rows >= M, blocks past K: 0)
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
            const int kbl = kb0 / 2 + p;
            const bool live = kb0 + 2 * p < kb_end && kbl < nkbl;
            bsw[p] = live ? __ldg(sw + (size_t)(row0 / 128) * sw_n + (size_t)kbl * sw_k) : 0.f;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int r = 0; r < kAcc; ++r) {
                    const int m = acc_arow(j, r);
                    bsa[p][j][r] = live && m < M ? rocjit::load_dep_l1(sa + (size_t)m * sa_m + (size_t)kbl * sa_k) : 0.f;
                }
        }
        uint4 wv[UNROLL][MT][kRowsPerLane];
        uint4 av[UNROLL][NT];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int kb = kb0 + u;
            const int k = kb * 64 + lane_chunk() * 16;
            const bool live = kb < kb_end && k < K;
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int h = 0; h < kRowsPerLane; ++h)
                    wv[u][t][h] = live ? load16_stream(wrow[t][h] + (size_t)kb * 64) : zero;
#pragma unroll
            for (int j = 0; j < NT; ++j) av[u][j] = (live && a_live[j]) ? rocjit::load16_dep(arow[j] + (size_t)kb * 64) : zero;
        }
#pragma unroll
        for (int p = 0; p < kPairs; ++p)
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    float part[kAcc] = {0.f, 0.f, 0.f, 0.f};
                    mma_chunk<e4m3_t>(part, wv[2 * p][t], av[2 * p][j]);
                    mma_chunk<e4m3_t>(part, wv[2 * p + 1][t], av[2 * p + 1][j]);
#pragma unroll
                    for (int r = 0; r < kAcc; ++r) acc[t][j][r] += part[r] * (bsw[p] * bsa[p][j][r]);
                }
    }
    rocjit::launch_dependents();
    constexpr int kVals = MT * NT * kAcc;
    float* dst = &acc[0][0][0];
    if (WARPS_K > 1) {   // fixed-order reduction of the warps, as skinny_gemm_kernel's
        __shared__ float red[WARPS_K - 1 > 0 ? WARPS_K - 1 : 1][kVals][kWarp];
        const int lane = threadIdx.x % kWarp;
        if (warp > 0) {
#pragma unroll
            for (int v = 0; v < kVals; ++v) red[warp - 1][v][lane] = dst[v];
        }
        __syncthreads();
        if (warp != 0) return;
        for (int s = 0; s < WARPS_K - 1; ++s)
#pragma unroll
            for (int v = 0; v < kVals; ++v) dst[v] += red[s][v][lane];
    }
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) {
                const int n = row0 + acc_wrow(t, r);
                const int m = acc_arow(j, r);
                if (n >= N || m >= M) continue;
                if (partial) partial[((size_t)blockIdx.y * M + m) * N + n] = acc[t][j][r];
                else store_out<OT>(out + (size_t)m * ldo + n, acc[t][j][r]);
            }
}

namespace skinny {
// Output (m, col) = EP of (sum over slabs s = 0, 1, ..., slabs - 1 of partial[s, m, n]) * scale_a[m] * scale_w[n]
// (see scale_modes): the residual is added once, SwiGLU sums its gate and up columns here.
template <class OT, class EP>
__device__ __forceinline__ void reduce_output(const float* __restrict__ partial, OT* out, const OT* residual,
                                              const float* __restrict__ out_scale, const float* __restrict__ scale_a,
                                              const float* __restrict__ scale_w, int scale_modes, int M, int N,
                                              int ldo, int m, int col, int slabs) {
    const auto p = make_epilogue<EP>(out, residual, out_scale, scale_a, scale_w, scale_modes, M, N, ldo);
    const float* src = partial + (size_t)m * N;
    if constexpr (EP::kind == 2) {
        const int n = (col >> 3) * 16 + (col & 7);
        float g = 0.f, u = 0.f;
        for (int s = 0; s < slabs; ++s, src += (size_t)M * N) { g += src[n]; u += src[n + 8]; }
        p.template put_swiglu<EP>(m, col, p.scaled(g, m, n), p.scaled(u, m, n + 8));
    } else {
        float v = 0.f;
        for (int s = 0; s < slabs; ++s, src += (size_t)M * N) v += src[col];
        p.template put<EP>(m, col, p.scaled(v, m, col));
    }
}
}  // namespace skinny

// Grid split-K's sums: one thread per output of the M x ldo result, partial [splits, M, N] (reduce_output).
template <class OT, class EP>
__global__ void skinny_splitk_reduce(const float* __restrict__ partial, OT* out, const OT* residual,
                                     const float* __restrict__ out_scale, const float* __restrict__ scale_a,
                                     const float* __restrict__ scale_w, int scale_modes, int M, int N, int splits,
                                     int ldo) {
    rocjit::grid_dependency_sync();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * ldo) return;
    skinny::reduce_output<OT, EP>(partial, out, residual, out_scale, scale_a, scale_w, scale_modes, M, N, ldo, i / ldo,
                                  i % ldo, splits);
}

// ---------------------------------------------------------------------------------------------
// Streamed variant (NVIDIA sm_90+): persistent, stream-K, weights fed through a shared-memory ring.
//
// The weight matrix is cut into tiles of R = 16*MT*CW rows, each tile into chunks of BK bytes of K;
// the tiles x chunks sequence is split into gridDim.x equal contiguous ranges, one per block, so
// every block streams the same number of bytes (no partial last wave). In a block, PW producer
// warps copy each chunk's R weight rows and M activation rows into a STAGES-deep ring of shared
// memory with 16-byte cp.async (each producer thread arrives on the stage's mbarrier once its
// copies land; loads in flight hold no registers); CW consumer warps run
// mma.sync on 16*MT rows each. A tile covered by one block is written directly; a tile shared by
// blocks (at most two per block: its first and last) goes through fp32 partials in `ws`, and the
// block that arrives last on the tile's ticket sums them in block order (deterministic), writes
// the output and resets the ticket for the next launch.
#if defined(SKINNY_NV) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#define SKINNY_ASYNC 1
#endif
// L2 prefetch size of the stream kernel's weight copies (0, 128 or 256 bytes; 256 measured 1-2% faster
// than 0 on the H100 at the seed shapes); -D overrides it.
#ifndef SKINNY_STREAM_PF
#define SKINNY_STREAM_PF 256
#endif

namespace skinny {
#if defined(SKINNY_ASYNC)
// 16 bytes global -> shared through the async copy unit (no registers held while in flight);
// src_bytes 0 writes zeros (rows past N, k past K). The L2 hint marks streamed weights evict-first.
__device__ __forceinline__ void async_copy16(void* dst, const void* src, unsigned src_bytes, unsigned long long policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;"
                 :: "r"(rocjit::smem_u32(dst)), "l"(src), "r"(src_bytes), "l"(policy) : "memory");
}
// The weights' copy: with SKINNY_STREAM_PF 256 (128) L2 also fetches the surrounding 256 (128) bytes.
__device__ __forceinline__ void async_copy16_w(void* dst, const void* src, unsigned src_bytes, unsigned long long policy) {
#if SKINNY_STREAM_PF == 256
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;"
                 :: "r"(rocjit::smem_u32(dst)), "l"(src), "r"(src_bytes), "l"(policy) : "memory");
#elif SKINNY_STREAM_PF == 128
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;"
                 :: "r"(rocjit::smem_u32(dst)), "l"(src), "r"(src_bytes), "l"(policy) : "memory");
#else
    async_copy16(dst, src, src_bytes, policy);
#endif
}
__device__ __forceinline__ uint4 lds16(const unsigned char* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void consumers_sync(int threads) {
    asm volatile("bar.sync 1, %0;" :: "r"(threads) : "memory");
}
#endif
// First chunk of block b's range and the block owning chunk f, for `total` chunks over `blocks`.
__device__ __forceinline__ long long range_start(long long b, long long total, long long blocks) {
    return b * total / blocks;
}
__device__ __forceinline__ int range_owner(long long f, long long total, long long blocks) {
    return (int)(((f + 1) * blocks - 1) / total);
}
#if defined(SKINNY_ASYNC)
// Stream-K fix-up at the end of this block's segment of `tile` (nk chunks per tile, `total` chunks split evenly
// over the grid). A tile that one block covers is written by it. Otherwise every block of the tile stores its
// partials (V floats for each of THREADS consumer threads, ct this thread's index, synchronised by named barrier
// 1) in `ws` slot 0 (the tile its range starts in) or 1; the block that takes the tile's last ticket sums them in
// block order (deterministic), resets the ticket for the next launch and returns true with `vals` the sum.
template <int V, int THREADS, int BATCH = 1>
__device__ __forceinline__ bool streamk_fixup(float (&vals)[V], int ct, float* __restrict__ ws, int* tickets, int tile,
                                              int nk, long long total) {
    static_assert(BATCH >= 1, "BATCH: blocks' partials loaded at once, at least 1");
    __shared__ int last_flag;
    const long long t0 = (long long)tile * nk;
    const int first = range_owner(t0, total, gridDim.x), last = range_owner(t0 + nk - 1, total, gridDim.x);
    if (first == last) return true;
    const int slot = (int)(range_start(blockIdx.x, total, gridDim.x) / nk) == tile ? 0 : 1;
    float* mine = ws + ((size_t)blockIdx.x * 2 + slot) * V * THREADS + ct;
#pragma unroll
    for (int v = 0; v < V; ++v) __stcg(mine + v * THREADS, vals[v]);
    __threadfence();
    consumers_sync(THREADS);
    if (ct == 0) {
        const int ticket = atomicAdd(&tickets[tile], 1);
        last_flag = ticket == last - first;
        if (last_flag) { tickets[tile] = 0; __threadfence(); }
    }
    consumers_sync(THREADS);
    if (!last_flag) return false;
#pragma unroll
    for (int v = 0; v < V; ++v) vals[v] = 0.f;
    // BATCH blocks' partials are loaded before any of them is added (then added in block order, as one at a time):
    // a round trip to L2 per BATCH blocks, where the loop over blocks waited for each in turn.
    for (int b0 = first; b0 <= last; b0 += BATCH) {
        float part[BATCH][V];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int b = b0 + j;
            if (b > last) break;
            const int bslot = (int)(range_start(b, total, gridDim.x) / nk) == tile ? 0 : 1;
            const float* src = ws + ((size_t)b * 2 + bslot) * V * THREADS + ct;
#pragma unroll
            for (int v = 0; v < V; ++v) part[j][v] = __ldcg(src + v * THREADS);
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            if (b0 + j > last) break;
#pragma unroll
            for (int v = 0; v < V; ++v) vals[v] += part[j][v];
        }
    }
    return true;
}
#endif
}  // namespace skinny

// E, OT, EP as above; MT 16-row tiles per consumer warp; NT activation tiles of 8 rows; CW consumer
// warps; BK bytes of K per chunk (multiple of 64); STAGES chunks in the ring; PW producer warps.
// ws: gridDim.x * 2 * CW*32 * MT*NT*4 floats; tickets: one zeroed int per tile (self-resetting).
template <class E, class OT, int MT, int NT, int CW, int BK, int STAGES, int PW, class EP>
__launch_bounds__((CW + PW) * 32, 1) __global__ void
skinny_stream_kernel(const typename E::storage* __restrict__ a, const typename E::storage* __restrict__ w,
                     OT* out, float* __restrict__ ws, int* __restrict__ tickets, const OT* residual,
                     const float* __restrict__ out_scale, const float* __restrict__ scale_a,
                     const float* __restrict__ scale_w, int scale_modes, int M, int N, int K, int ldo) {
#if defined(SKINNY_ASYNC)
    using namespace skinny;
    constexpr int kRows = 16 * MT * CW;                    // weight rows per tile
    constexpr int kARows = 8 * NT;                         // activation rows kept in shared memory
    constexpr int kPitch = BK + 16;                        // padded row: conflict-free 16-byte reads
    constexpr int kStage = (kRows + kARows) * kPitch;
    constexpr int kConsumers = CW * 32;
    constexpr int kVals = MT * NT * kAcc;
    static_assert(BK % 64 == 0, "BK is a multiple of the 64-byte k-block");
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + STAGES * kStage);
    unsigned long long* empty = full + STAGES;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long kbytes = (long long)K * sizeof(typename E::storage);
    const int nk = (int)((kbytes + BK - 1) / BK);
    const int tiles = (N + kRows - 1) / kRows;
    const long long total = (long long)tiles * nk;
    const long long begin = range_start(blockIdx.x, total, gridDim.x);
    const long long end = range_start(blockIdx.x + 1, total, gridDim.x);

    // Activation rows >= M stay zero for the whole kernel (never copied).
    for (int i = threadIdx.x; i < STAGES * (kARows - min(M, kARows)) * (kPitch / 16); i += blockDim.x) {
        const int per = (kARows - M) * (kPitch / 16);
        const int st = i / per, r = i % per;
        *reinterpret_cast<uint4*>(smem + st * kStage + (kRows + M) * kPitch + r * 16) = make_uint4(0, 0, 0, 0);
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) { rocjit::mbar_init(&full[s], PW * 32); rocjit::mbar_init(&empty[s], CW); }
        rocjit::mbar_init_fence();
    }
    __syncthreads();

#if ROCJIT_HAS_PDL
    if (warp >= CW && begin < end) {   // the producers' first STAGES chunks of weights into L2 (no values read)
        const int pt = threadIdx.x - CW * 32;
        for (long long f = begin; f < end && f < begin + STAGES; ++f) {
            const int tile = (int)(f / nk), rows = min(kRows, N - tile * kRows);
            const long long k0 = (f % nk) * (long long)BK;
            const unsigned char* wsrc = reinterpret_cast<const unsigned char*>(w) + (size_t)tile * kRows * kbytes + k0;
            for (int q = pt; q < kRows * (BK / 16); q += PW * 32) {
                const int r = q / (BK / 16), col = (q % (BK / 16)) * 16;
                if (r < rows && k0 + col < kbytes) rocjit::prefetch_l2_early(wsrc + (size_t)r * kbytes + col);
            }
        }
    }
    rocjit::grid_dependency_wait();    // before any load or write
#endif
    if (warp >= CW) {
        // ---- producers: 16-byte granules, consecutive threads along a row (coalesced) ----
        constexpr int kGran = BK / 16;                     // granules per row and chunk
        const int pt = threadIdx.x - CW * 32;
        const unsigned long long wpol = rocjit::l2_evict_first_policy(), apol = rocjit::l2_evict_last_policy();
        for (long long f = begin; f < end; ++f) {
            const int i = (int)(f - begin), s = i % STAGES;
            const int tile = (int)(f / nk);
            const long long k0 = (f % nk) * (long long)BK;
            rocjit::mbar_wait(&empty[s], ((i / STAGES) & 1) ^ 1);
            unsigned char* st = smem + s * kStage;
            const unsigned char* wsrc = reinterpret_cast<const unsigned char*>(w) + (size_t)tile * kRows * kbytes + k0;
            const int rows = min(kRows, N - tile * kRows);
            if (rows == kRows && k0 + BK <= kbytes && (PW * 32) % kGran == 0) {
                // whole tile and chunk: each thread keeps one column and walks rows (no predicates)
                constexpr int kStep = (PW * 32) / kGran > 0 ? (PW * 32) / kGran : 1;
                const int col = (pt % kGran) * 16;
                const unsigned char* src = wsrc + (size_t)(pt / kGran) * kbytes + col;
                unsigned char* dst = st + (pt / kGran) * kPitch + col;
#pragma unroll 8
                for (int r = pt / kGran; r < kRows; r += kStep, src += kStep * kbytes, dst += kStep * kPitch)
                    async_copy16_w(dst, src, 16u, wpol);
            } else {
                for (int q = pt; q < kRows * kGran; q += PW * 32) {
                    const int r = q / kGran, col = (q % kGran) * 16;
                    const bool live = r < rows && k0 + col < kbytes;
                    async_copy16_w(st + r * kPitch + col, live ? wsrc + (size_t)r * kbytes + col : wsrc - k0,
                                   live ? 16u : 0u, wpol);
                }
            }
            const unsigned char* asrc = reinterpret_cast<const unsigned char*>(a) + k0;
            for (int q = pt; q < M * kGran; q += PW * 32) {
                const int m = q / kGran, col = (q % kGran) * 16;
                const bool live = k0 + col < kbytes;
                async_copy16(st + (kRows + m) * kPitch + col, live ? asrc + (size_t)m * kbytes + col : asrc - k0, live ? 16u : 0u,
                             apol);
            }
            rocjit::cp_async_arrive(&full[s]);
        }
        copies_issued_launch_dependents<kARows>();
        return;
    }

    // ---- consumers ----
    const int g = lane_row(), c = lane_chunk();
    const auto ep = make_epilogue<EP>(out, residual, out_scale, scale_a, scale_w, scale_modes, M, N, ldo);
    float acc[MT][NT][kAcc];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) acc[t][j][r] = 0.f;

    for (long long f = begin; f < end; ++f) {
        const int i = (int)(f - begin), s = i % STAGES;
        const int tile = (int)(f / nk), kc = (int)(f % nk);
        rocjit::mbar_wait(&full[s], (i / STAGES) & 1);
        const unsigned char* st = smem + s * kStage;
        const unsigned char* wbase = st + (16 * MT * warp + g) * kPitch + c * 16;
        const unsigned char* abase = st + (kRows + g) * kPitch + c * 16;
#pragma unroll 2
        for (int kb = 0; kb < BK / 64; ++kb) {             // granules past K were zero-filled
            uint4 wv[MT][2], av[NT];
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) wv[t][h] = lds16(wbase + (16 * t + 8 * h) * kPitch + kb * 64);
#pragma unroll
            for (int j = 0; j < NT; ++j) av[j] = lds16(abase + 8 * j * kPitch + kb * 64);
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma_chunk<E>(acc[t][j], wv[t], av[j]);
        }
        __syncwarp();
        if (lane == 0) rocjit::mbar_arrive(&empty[s]);

        if (kc != nk - 1 && f != end - 1) continue;       // tile segment goes on
        // ---- end of this block's segment of `tile` ----
        const int row_base = tile * kRows + 16 * MT * warp;
        const bool write = streamk_fixup<kVals, kConsumers>(reinterpret_cast<float (&)[kVals]>(acc), threadIdx.x, ws,
                                                            tickets, tile, nk, total);
        if (write) write_acc<EP>(acc, row_base, ep);
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int r = 0; r < kAcc; ++r) acc[t][j][r] = 0.f;
    }
    rocjit::launch_dependents();
#else
    rocjit::unsupported_on_target();   // built for NVIDIA sm_90+ only; the host picks skinny_gemm_kernel elsewhere
#endif
}

// ---------------------------------------------------------------------------------------------
// Hopper variant (sm_90a): the stream kernel's persistent stream-K schedule, with the weights copied by the
// Tensor Memory Accelerator and multiplied by warpgroup MMAs straight from shared memory.
//
// Tiles of R = 64 * SLABS * WG weight rows; a chunk is KB boxes of R rows x 128 bytes of K, copied by TMA in
// boxes of 32 rows (tensor map `wmap` over W as N rows of K * sizeof(E) bytes, box 32 x 128, 128B swizzle, zeros
// outside W) that complete on the stage's mbarrier, plus the same K bytes of the NB activation rows, also by TMA (tensor
// map `amap` over A as M rows of K * sizeof(E) bytes, box NB x 128 bytes: rows M..NB-1 and K past the end read as
// zeros) on the same mbarrier. Warpgroup 0 copies, warpgroups 1..WG
// multiply: each owns SLABS slabs of 64 weight rows and runs wgmma m64nNBk32 (e4m3) / k16 (bf16, f16) per 32
// bytes of K with the slab as A and the activation rows as B, so C^T's 64 x NB tile sits in the mma.sync
// accumulator layout and leaves through the same epilogues (write_acc) and the same fix-up as the stream kernel.
// No lane loads a weight or an activation: one thread issues a chunk's copies. (The activations used to come by
// cp.async, 16 bytes a lane, which made every stage wait for 128 threads' copies and every multiplying warpgroup
// fence the generic proxy's writes against wgmma's reads.)
#if ROCJIT_HAS_WGMMA
namespace skinny {
template <class E, int NB> struct wg_mma;
#define SKINNY_WG(E, NB, FN)                                                                                    \
    template <> struct wg_mma<E, NB> {                                                                         \
        static ROCJIT_INLINE void run(float (&d)[NB / 2], unsigned long long a, unsigned long long b) {         \
            rocjit::wgmma::FN(d, a, b);                                                                        \
        }                                                                                                       \
    };
SKINNY_WG(e4m3_t, 8, e4m3_n8) SKINNY_WG(e4m3_t, 16, e4m3_n16) SKINNY_WG(e4m3_t, 32, e4m3_n32)
SKINNY_WG(bf16_t, 8, bf16_n8) SKINNY_WG(bf16_t, 16, bf16_n16) SKINNY_WG(bf16_t, 32, bf16_n32)
SKINNY_WG(f16_t, 8, f16_n8) SKINNY_WG(f16_t, 16, f16_n16) SKINNY_WG(f16_t, 32, f16_n32)
#undef SKINNY_WG
}  // namespace skinny
#endif

// Rows per TMA copy. On an H100 (FP8 13312 x 16384, M = 32) 32-row boxes issued row group by row group, the KB
// boxes of a group back to back, ran 86-88 us against 88-93 for one box of the tile's R rows per 128 bytes of K.
#define SKINNY_TMA_BOX_ROWS 32

// skinny_tma_kernel's stream-K sums without its fix-up (its splits < 0): slab j of partial [slabs, M, N] holds the
// raw sums of the j-th of the blocks that share the tile (`rows` weight rows, nk chunks, `blocks` blocks in all) of
// an output's column; they are added in block order, as the fix-up adds them, and the epilogue applied.
template <class OT, class EP>
__global__ void skinny_streamk_reduce(const float* __restrict__ partial, OT* out, const OT* residual,
                                      const float* __restrict__ out_scale, const float* __restrict__ scale_a,
                                      const float* __restrict__ scale_w, int scale_modes, int M, int N, int ldo,
                                      int rows, int nk, int blocks) {
    rocjit::grid_dependency_sync();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * ldo) return;
    const int col = i % ldo;
    const int n = EP::kind == 2 ? (col >> 3) * 16 + (col & 7) : col;
    const long long t0 = (long long)(n / rows) * nk, total = (long long)((N + rows - 1) / rows) * nk;
    const int slabs = skinny::range_owner(t0 + nk - 1, total, blocks) - skinny::range_owner(t0, total, blocks) + 1;
    skinny::reduce_output<OT, EP>(partial, out, residual, out_scale, scale_a, scale_w, scale_modes, M, N, ldo, i / ldo,
                                  col, slabs);
}

// NB activation rows in shared memory (8, 16 or 32; M <= NB); SLABS 64-row slabs per multiplying warpgroup;
// WG multiplying warpgroups; KB 128-byte boxes of K per chunk; STAGES chunks in the ring.
// Shared memory: 1024 bytes of alignment slack, STAGES x (KB x (R + NB) x 128 + (R + NB) x 4) bytes, 2 x STAGES
// mbarriers. A stage that ends a block's segment of a tile also carries that tile's R weight scales and the NB
// activation scales (copied with it, so the epilogue does not wait for them): loaded in the epilogue, under the
// full weight stream, they cost an H200 6.5 us (FP8 13312 x 16384, M = 32: 66.8 against 60.3 with no scales).
template <class E, class OT, int NB, int SLABS, int WG, int KB, int STAGES, class EP>
__launch_bounds__((WG + 1) * 128, 1) __global__ void
skinny_tma_kernel(ROCJIT_GRID_CONSTANT const rocjit::tensor_map wmap, ROCJIT_GRID_CONSTANT const rocjit::tensor_map amap,
                  const typename E::storage* __restrict__ a,
                  OT* out, float* __restrict__ ws, int* __restrict__ tickets, const OT* residual,
                  const float* __restrict__ out_scale, const float* __restrict__ scale_a,
                  const float* __restrict__ scale_w, int scale_modes, int M, int N, int K, int ldo, int splits) {
#if ROCJIT_HAS_WGMMA
    using namespace skinny;
    constexpr int kRows = 64 * SLABS * WG;
    constexpr int kBox = 128;
    constexpr int kWBytes = kRows * kBox, kABytes = NB * kBox;
    constexpr int kStage = KB * (kWBytes + kABytes);
    constexpr int kChunk = KB * kBox;                     // bytes of K per chunk
    constexpr int kConsumers = WG * 128;
    constexpr int kVals = SLABS * NB / 2;
    constexpr int kBoxRows = SKINNY_TMA_BOX_ROWS;         // rows per TMA copy (the host's tensor map box)
    static_assert(NB == 8 || NB == 16 || NB == 32, "NB: 8, 16 or 32 activation rows");
    constexpr int kScales = kRows + NB;                   // a stage's scale_w of its tile's rows, then scale_a
    // Partials the fix-up loads at once (streamk_fixup): 64 registers' worth with one multiplying warpgroup, 32 with
    // two, one with two and the SwiGLU epilogue (more spill at the 168 registers of 384 threads). H200, M = 32,
    // about 7 blocks a tile (2304 x 16384, graph replays, same sums): FP8 20.5 -> 20.0 us (2 warpgroups), 19.6 ->
    // 18.9 (1); bf16 31.5 -> 30.8.
    constexpr int kFixupRegs = WG == 1 ? 64 : EP::kind == 2 ? 0 : 32;
    constexpr int kFixupBatch = kFixupRegs / kVals > 1 ? kFixupRegs / kVals : 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (rocjit::smem_u32(smem_raw) & 1023u)) & 1023u);
    float* scales = reinterpret_cast<float*>(smem + STAGES * kStage);
    unsigned long long* full = reinterpret_cast<unsigned long long*>(scales + STAGES * kScales);
    unsigned long long* empty = full + STAGES;
    auto wtile = [&](int s, int j) { return smem + s * kStage + j * kWBytes; };
    auto atile = [&](int s, int j) { return smem + s * kStage + KB * kWBytes + j * kABytes; };

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long kbytes = (long long)K * sizeof(typename E::storage);
    const int nk = (int)((kbytes + kChunk - 1) / kChunk);
    const int tiles = (N + kRows - 1) / kRows;
    const long long total = (long long)tiles * nk;
    // splits == 0: stream-K over every chunk, tiles shared between blocks summed by the fix-up (tickets); splits >= 2:
    // block b owns split b % splits of tile b / splits (a range of whole chunks) and writes its raw sums to
    // ws [splits, M, N], which skinny_splitk_reduce adds in split order and finishes with the epilogue (no tickets);
    // splits < 0: stream-K, each segment's raw sums to ws slab (block - the tile's first block), summed by
    // skinny_streamk_reduce (no tickets, no fix-up round trips in the kernel).
    long long begin, end;
    if (splits > 0) {                                     // split sp's share of its tile's nk chunks
        const long long t0 = (long long)(blockIdx.x / splits) * nk;
        const int sp = blockIdx.x % splits;
        begin = t0 + range_start(sp, nk, splits);
        end = t0 + range_start(sp + 1, nk, splits);
    } else {
        begin = range_start(blockIdx.x, total, gridDim.x);
        end = range_start(blockIdx.x + 1, total, gridDim.x);
    }

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) { rocjit::mbar_init(&full[s], 128); rocjit::mbar_init(&empty[s], WG * 4); }
        rocjit::mbar_init_fence();
    }
    __syncthreads();

    if (warp < 4) {
        // ---- copy warpgroup: thread 0 issues the weight and activation boxes, all 128 threads the scales ----
        const int pt = threadIdx.x;
        if (pt == 0) {
            rocjit::tma::prefetch(&wmap);
            rocjit::tma::prefetch(&amap);
            for (long long f = begin; f < end && f < begin + STAGES; ++f)   // weights do not depend on the kernel ahead
                for (int j = 0; j < KB; ++j)
                    rocjit::tma::prefetch_2d_l2(&wmap, (int)((f % nk) * kChunk + j * kBox), (int)(f / nk) * kRows);
        }
        rocjit::grid_dependency_wait();                   // before the first activation read
        // SKINNY_W_HINT 3 and 4 (the default): the weights' lines are the first L2 evicts (read once); others: no policy
        const unsigned long long wpol = rocjit::l2_evict_first_policy();
        for (long long f = begin; f < end; ++f) {
            const int i = (int)(f - begin), s = i % STAGES;
            const int tile = (int)(f / nk);
            const long long k0 = (f % nk) * kChunk;
            rocjit::mbar_wait(&empty[s], ((i / STAGES) & 1) ^ 1);
            if (pt == 0) {   // boxes of 32 rows, all KB of a row group back to back: longer runs along each row
                rocjit::tma::expect_bytes(&full[s], KB * (kWBytes + kABytes));
                for (int j = 0; j < KB; ++j)
                    rocjit::tma::load_2d(atile(s, j), &amap, (int)(k0 + j * kBox), 0, &full[s]);
                for (int g = 0; g < kRows / kBoxRows; ++g)
                    for (int j = 0; j < KB; ++j) {
                        unsigned char* dst = wtile(s, j) + g * kBoxRows * kBox;
                        const int x = (int)(k0 + j * kBox), y = tile * kRows + g * kBoxRows;
                        if constexpr (SKINNY_W_HINT >= 3)
                            rocjit::tma::load_2d_hint(dst, &wmap, x, y, &full[s], wpol);
                        else
                            rocjit::tma::load_2d(dst, &wmap, x, y, &full[s]);
                    }
            }
            if (f % nk == nk - 1 || f == end - 1) {      // a segment ends here: its epilogue's scales ride along
                for (int q = pt; q < kScales; q += 128) {
                    const float* src = q < kRows ? scale_w : scale_a;
                    const int i = q < kRows ? ((scale_modes & 1) ? tile * kRows + q : 0) : ((scale_modes & 2) ? q - kRows : 0);
                    const bool live = src != nullptr && (q < kRows ? i < N : i < M);
                    rocjit::mma8::copy4(scales + s * kScales + q, live ? src + i : reinterpret_cast<const float*>(a), live);
                }
            }
            rocjit::cp_async_arrive(&full[s]);
        }
        copies_issued_launch_dependents<NB>();
        return;
    }

    // ---- multiplying warpgroups ----
    const int ct = threadIdx.x - 128, cg = ct / 128, wq = (ct / 32) % 4;
    const auto ep = make_epilogue<EP>(out, residual, out_scale, scale_a, scale_w, scale_modes, M, N, ldo);
    float acc[SLABS][NB / 2];
#pragma unroll
    for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
        for (int v = 0; v < NB / 2; ++v) acc[sl][v] = 0.f;

    for (long long f = begin; f < end; ++f) {
        const int i = (int)(f - begin), s = i % STAGES;
        const int tile = (int)(f / nk), kc = (int)(f % nk);
        rocjit::mbar_wait(&full[s], (i / STAGES) & 1);
#pragma unroll
        for (int j = 0; j < KB; ++j) {
            // Each k32 step into fresh partials, then added to acc in fp32: FP8 wgmma keeps only about 14 bits of
            // its running sum (DeepSeek-V3 reports it for Hopper). Partials over a whole 128-byte box still put one
            // SwiGLU output in 36 000 (cancelling gate sums) an FP8 rounding away from the float64 reference.
            float part[kBox / 32][SLABS][NB / 2];
#pragma unroll
            for (int ks = 0; ks < kBox / 32; ++ks)
#pragma unroll
                for (int sl = 0; sl < SLABS; ++sl) {
#pragma unroll
                    for (int v = 0; v < NB / 2; ++v) part[ks][sl][v] = 0.f;
                    rocjit::wgmma::fence_operands(part[ks][sl]);
                }
            rocjit::wgmma::fence();
            const unsigned long long db = rocjit::wgmma::desc_sw128(rocjit::smem_u32(atile(s, j)));
#pragma unroll
            for (int ks = 0; ks < kBox / 32; ++ks)
#pragma unroll
                for (int sl = 0; sl < SLABS; ++sl) {
                    const unsigned long long da =
                        rocjit::wgmma::desc_sw128(rocjit::smem_u32(wtile(s, j) + (cg * SLABS + sl) * 64 * kBox));
                    wg_mma<E, NB>::run(part[ks][sl], rocjit::wgmma::desc_advance(da, 32 * ks),
                                       rocjit::wgmma::desc_advance(db, 32 * ks));
                }
            rocjit::wgmma::commit();
            rocjit::wgmma::wait<0>();
#pragma unroll
            for (int ks = 0; ks < kBox / 32; ++ks)
#pragma unroll
                for (int sl = 0; sl < SLABS; ++sl) {
                    rocjit::wgmma::fence_operands(part[ks][sl]);
#pragma unroll
                    for (int v = 0; v < NB / 2; ++v) acc[sl][v] += part[ks][sl][v];
                }
        }
        const bool seg_end = kc == nk - 1 || f == end - 1;
        lane_scales<EP::kind == 2, 1, NB / 8> sc[SLABS];
        if (seg_end) {
            const float* ss = scales + s * kScales;
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl) {
#pragma unroll
                for (int r = 0; r < kAcc; ++r) {
                    const int i = (cg * SLABS + sl) * 64 + 16 * wq + acc_wrow(0, r);
                    sc[sl].w[0][r] = scale_w ? ss[(scale_modes & 1) ? i : 0] : 1.f;
                    if constexpr (EP::kind == 2)
                        sc[sl].w8[0][r] = scale_w ? ss[(scale_modes & 1) ? min(i + 8, kRows - 1) : 0] : 1.f;
                }
#pragma unroll
                for (int j = 0; j < NB / 8; ++j)
#pragma unroll
                    for (int r = 0; r < kAcc; ++r)
                        sc[sl].a[j][r] = scale_a ? ss[kRows + ((scale_modes & 2) ? acc_arow(j, r) : 0)] : 1.f;
            }
        }
        __syncwarp();
        if (lane == 0) rocjit::mbar_arrive(&empty[s]);

        if (!seg_end) continue;                           // tile segment goes on
        if (splits != 0) {                                // this split's / segment's raw sums; a reduce kernel scales them
            const int sp = splits > 0 ? (int)blockIdx.x % splits
                                      : (int)blockIdx.x - range_owner((long long)tile * nk, total, gridDim.x);
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
                store_partial(reinterpret_cast<const float (&)[1][NB / 8][kAcc]>(acc[sl]),
                              tile * kRows + (cg * SLABS + sl) * 64 + 16 * wq, ws + (size_t)sp * M * N, M, N);
        } else if (streamk_fixup<kVals, kConsumers, kFixupBatch>(reinterpret_cast<float (&)[kVals]>(acc), ct, ws,
                                                                  tickets, tile, nk, total)) {
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
                write_acc<EP>(reinterpret_cast<const float (&)[1][NB / 8][kAcc]>(acc[sl]),
                              tile * kRows + (cg * SLABS + sl) * 64 + 16 * wq, ep, sc[sl]);
        }
#pragma unroll
        for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
            for (int v = 0; v < NB / 2; ++v) acc[sl][v] = 0.f;
    }
    rocjit::launch_dependents();
#else
    rocjit::unsupported_on_target();   // TMA and wgmma need sm_90a: the host picks another kernel elsewhere
#endif
}

// ---------------------------------------------------------------------------------------------
// Hopper warpgroup path (sm_90a) for 9 - 32 activation rows: skinny_gemm_kernel's weight stream and work split,
// with mma.sync replaced by the asynchronous warpgroup MMA. At 32 activation rows the synchronous matrix
// instructions set skinny_gemm_kernel's time (H100, FP8 13312 x 16384: 92.1 us, 79.2 with them replaced by one
// integer op).
//
// Each warpgroup owns 64 * SLABS weight rows (warp w of the group rows 16 w .. 16 w + 15 of each slab); the WG
// warpgroups of a block split the block's K range in interleaved steps of KB * 128 bytes and are reduced through
// shared memory in a fixed order; grid.y splits K further (fp32 partials and skinny_splitk_reduce, as there).
// A lane loads 16 contiguous bytes of its two rows per 64 bytes of K and hands them to wgmma as its register A
// operand, so no weight byte passes through shared memory. The instruction wants lane c of a quad to hold K words
// c, 4 + c (one k32 step) and 8 + c, 12 + c (the next) of a 64-byte block, where it loaded words 4 c .. 4 c + 3:
// a 4 x 4 transpose across the quad (four shuffles). The activation rows (B) go to shared memory in their own
// order by cp.async, kStages steps ahead, in the 128B-swizzled layout of rocjit/wgmma.h. Each k32 step multiplies
// into fresh partials added to fp32 accumulators (FP8 wgmma keeps only about 14 bits of its running sum). The
// accumulators sit in the mma.sync layout, so write_acc and the reduce kernel's epilogues serve as they are.
// Shared memory (static): 1024 bytes of alignment slack + WG x kStages x KB x NB x 128 bytes.
#if ROCJIT_HAS_WGMMA
namespace skinny {
template <class E, int NB> struct wg_rs;
#define SKINNY_WG_RS(E, NB, FN)                                                                                 \
    template <> struct wg_rs<E, NB> {                                                                          \
        static ROCJIT_INLINE void run(float (&d)[NB / 2], unsigned a0, unsigned a1, unsigned a2, unsigned a3,   \
                                      unsigned long long b) {                                                   \
            rocjit::wgmma::FN(d, a0, a1, a2, a3, b);                                                           \
        }                                                                                                       \
    };
SKINNY_WG_RS(e4m3_t, 8, e4m3_rs_n8) SKINNY_WG_RS(e4m3_t, 16, e4m3_rs_n16) SKINNY_WG_RS(e4m3_t, 32, e4m3_rs_n32)
SKINNY_WG_RS(bf16_t, 8, bf16_rs_n8) SKINNY_WG_RS(bf16_t, 16, bf16_rs_n16) SKINNY_WG_RS(bf16_t, 32, bf16_rs_n32)
SKINNY_WG_RS(f16_t, 8, f16_rs_n8) SKINNY_WG_RS(f16_t, 16, f16_rs_n16) SKINNY_WG_RS(f16_t, 32, f16_rs_n32)
#undef SKINNY_WG_RS
// Lane c of each quad holds words 4 c .. 4 c + 3 of a 16-word block; afterwards words c, 4 + c, 8 + c, 12 + c.
__device__ __forceinline__ uint4 quad_transpose(uint4 x) {
    const int c = threadIdx.x & 3;
    const bool hi2 = c & 2, hi1 = c & 1;
    // exchange column pairs with lane c ^ 2: keep columns (c & 2), (c & 2) + 1 of rows c & 1 ("lo") and + 2 ("hi")
    const unsigned r0 = __shfl_xor_sync(0xffffffffu, hi2 ? x.x : x.z, 2);
    const unsigned r1 = __shfl_xor_sync(0xffffffffu, hi2 ? x.y : x.w, 2);
    const unsigned own0 = hi2 ? x.z : x.x, own1 = hi2 ? x.w : x.y;
    const unsigned c0lo = hi2 ? r0 : own0, c0hi = hi2 ? own0 : r0, c1lo = hi2 ? r1 : own1, c1hi = hi2 ? own1 : r1;
    // exchange rows with lane c ^ 1: keep column c of all four rows
    const unsigned u0 = __shfl_xor_sync(0xffffffffu, hi1 ? c0lo : c1lo, 1);
    const unsigned u1 = __shfl_xor_sync(0xffffffffu, hi1 ? c0hi : c1hi, 1);
    return hi1 ? make_uint4(u0, c1lo, u1, c1hi) : make_uint4(c0lo, u0, c0hi, u1);
}
// Barrier of warpgroup g (0..3) alone: named barrier 1 + g over its 128 threads (constant IDs, so ptxas reserves
// only those).
__device__ __forceinline__ void group_sync(int g) {
    switch (g) {
    case 0: asm volatile("bar.sync 1, 128;" ::: "memory"); break;
    case 1: asm volatile("bar.sync 2, 128;" ::: "memory"); break;
    case 2: asm volatile("bar.sync 3, 128;" ::: "memory"); break;
    default: asm volatile("bar.sync 4, 128;" ::: "memory"); break;
    }
}
}  // namespace skinny
#endif

// NB activation rows per step (8, 16 or 32; M <= NB); SLABS 64-row slabs per warpgroup; WG warpgroups splitting
// K; KB 128-byte boxes of K per step. steps_per_split: steps of grid.y's slices. Arguments as skinny_gemm_kernel's.
template <class E, class OT, int NB, int SLABS, int WG, int KB, class EP>
__launch_bounds__(WG * 128, 1) __global__ void
skinny_wgmma_kernel(const typename E::storage* __restrict__ a, const typename E::storage* __restrict__ w, OT* out,
                    float* __restrict__ partial, const OT* residual, const float* __restrict__ out_scale,
                    const float* __restrict__ scale_a, const float* __restrict__ scale_w, int scale_modes,
                    int M, int N, int K, int steps_per_split, int ldo) {
#if ROCJIT_HAS_WGMMA
    using namespace skinny;
    constexpr int kStages = 4;                            // activation steps in the ring
    constexpr int kBox = 128, kStep = KB * kBox;
    constexpr int kTile = NB * kBox;                      // one box of the activation rows: a multiple of 1024
    constexpr int kBuf = KB * kTile;                      // one step's activations
    constexpr int kVals = SLABS * NB / 2;
    static_assert(NB == 8 || NB == 16 || NB == 32, "NB: 8, 16 or 32 activation rows");
    static_assert(WG <= 4, "named barriers 1..4: one per warpgroup");
    static_assert((WG - 1) * SLABS * NB * 512 <= WG * kStages * kBuf, "the warpgroups' reduction fits in the ring");
    __shared__ __align__(16) unsigned char smem_raw[WG * kStages * kBuf + 1024];
    unsigned char* smem = smem_raw + ((1024u - (rocjit::smem_u32(smem_raw) & 1023u)) & 1023u);
    const int cg = threadIdx.x / 128, ct = threadIdx.x % 128, wq = ct / 32;
    unsigned char* const ring = smem + cg * kStages * kBuf;
    const unsigned char* const abytes = reinterpret_cast<const unsigned char*>(a);
    const long long kbytes = (long long)K * sizeof(typename E::storage);
    const int nsteps = (int)((kbytes + kStep - 1) / kStep);
    const int s_begin = blockIdx.y * steps_per_split;
    const int s_end = min(nsteps, s_begin + steps_per_split);
    const int row0 = blockIdx.x * 64 * SLABS;
    const uint4 zero = make_uint4(0, 0, 0, 0);

    // This lane's weight rows (rows past N read row 0; the epilogue drops them), at its 16-byte chunk.
    const unsigned char* wrow[SLABS][2];
#pragma unroll
    for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int n = row0 + 64 * sl + 16 * wq + lane_row() + 8 * h;
            wrow[sl][h] = reinterpret_cast<const unsigned char*>(w) + (size_t)(n < N ? n : 0) * kbytes + 16 * lane_chunk();
        }
    for (int i = ct; i < kStages * KB * NB * 8; i += 128) {   // activation rows >= M: zero for good
        const int row = (i / 8) % NB, box = i / (8 * NB);
        if (row >= M) *reinterpret_cast<uint4*>(ring + box * kTile + row * kBox + (i % 8) * 16) = zero;
    }

    auto load_w = [&](int s, uint4 (&wv)[SLABS][KB][2][2]) {
#pragma unroll
        for (int j = 0; j < KB; ++j)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const long long k = (long long)s * kStep + j * kBox + b * 64;
                const bool live = s < s_end && k + 16 * lane_chunk() < kbytes;
#pragma unroll
                for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
                    for (int h = 0; h < 2; ++h) wv[sl][j][b][h] = live ? load16_stream(wrow[sl][h] + k) : zero;
            }
    };
    // Step s's activations into ring slot `slot` (rows < M; granules past K zero-filled), one commit group.
    auto copy_a = [&](int s, int slot) {
        if (s < s_end) {
            for (int q = ct; q < M * KB * 8; q += 128) {
                const int m = q / (KB * 8), j = (q / 8) % KB, c = q % 8;
                const long long k = (long long)s * kStep + j * kBox + c * 16;
                const bool live = k < kbytes;
                rocjit::mma8::copy16(ring + slot * kBuf + j * kTile + m * kBox + ((c ^ (m & 7)) << 4),
                                     live ? abytes + (size_t)m * kbytes + k : abytes, live);
            }
        }
        rocjit::mma8::copy_commit();
    };

    float acc[SLABS][NB / 2];
#pragma unroll
    for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
        for (int v = 0; v < NB / 2; ++v) acc[sl][v] = 0.f;
    auto math = [&](uint4 (&wv)[SLABS][KB][2][2], const unsigned char* buf) {
#pragma unroll
        for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
            for (int j = 0; j < KB; ++j)
#pragma unroll
                for (int b = 0; b < 2; ++b)
#pragma unroll
                    for (int h = 0; h < 2; ++h) wv[sl][j][b][h] = quad_transpose(wv[sl][j][b][h]);
#pragma unroll
        for (int j = 0; j < KB; ++j) {
            float part[4][SLABS][NB / 2];
            rocjit::wgmma::fence();                       // the A registers were written by other instructions
            const unsigned long long db = rocjit::wgmma::desc_sw128(rocjit::smem_u32(buf + j * kTile));
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int sl = 0; sl < SLABS; ++sl) {
                    const uint4& r0 = wv[sl][j][t / 2][0];
                    const uint4& r1 = wv[sl][j][t / 2][1];
                    if (t % 2 == 0)
                        wg_rs<E, NB>::run(part[t][sl], r0.x, r1.x, r0.y, r1.y, rocjit::wgmma::desc_advance(db, 32 * t));
                    else
                        wg_rs<E, NB>::run(part[t][sl], r0.z, r1.z, r0.w, r1.w, rocjit::wgmma::desc_advance(db, 32 * t));
                }
            rocjit::wgmma::commit();
            rocjit::wgmma::wait<0>();
#pragma unroll
            for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
                for (int b = 0; b < 2; ++b)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        rocjit::wgmma::fence_operand(wv[sl][j][b][h].x); rocjit::wgmma::fence_operand(wv[sl][j][b][h].y);
                        rocjit::wgmma::fence_operand(wv[sl][j][b][h].z); rocjit::wgmma::fence_operand(wv[sl][j][b][h].w);
                    }
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int sl = 0; sl < SLABS; ++sl) {
                    rocjit::wgmma::fence_operands(part[t][sl]);
#pragma unroll
                    for (int v = 0; v < NB / 2; ++v) acc[sl][v] += part[t][sl][v];
                }
        }
    };

#if ROCJIT_HAS_PDL
    {   // the first step's weights into L2 (no value read), then wait for the kernel ahead
        const int s = s_begin + cg;
#pragma unroll
        for (int j = 0; j < KB; ++j)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const long long k = (long long)s * kStep + j * kBox + b * 64;
                if (s < s_end && k + 16 * lane_chunk() < kbytes)
#pragma unroll
                    for (int sl = 0; sl < SLABS; ++sl)
#pragma unroll
                        for (int h = 0; h < 2; ++h) rocjit::prefetch_l2_early(wrow[sl][h] + k);
            }
    }
    rocjit::grid_dependency_wait();
#endif
    // Activations kStages - 1 steps ahead in the ring; weights one step ahead in a second register set (the
    // loop is unrolled by two so that each set keeps fixed registers).
    const int s0 = s_begin + cg;
#pragma unroll
    for (int p = 0; p < kStages - 1; ++p) copy_a(s0 + p * WG, p);
    uint4 w0[SLABS][KB][2][2], w1[SLABS][KB][2][2];
    load_w(s0, w0);
    auto step = [&](int s, int i, uint4 (&cur)[SLABS][KB][2][2], uint4 (&next)[SLABS][KB][2][2]) {
        copy_a(s + (kStages - 1) * WG, (i + kStages - 1) % kStages);
        load_w(s + WG, next);
        rocjit::mma8::copy_wait<kStages - 1>();           // this thread's copies of step s are complete
        rocjit::wgmma::fence_proxy_async();               // ... and visible to wgmma
        group_sync(cg);                                   // ... and so are the other threads'
        math(cur, ring + (i % kStages) * kBuf);
    };
    int s = s0, i = 0;
    while (s < s_end) {
        step(s, i, w0, w1);
        s += WG, ++i;
        if (s >= s_end) break;
        step(s, i, w1, w0);
        s += WG, ++i;
    }
    rocjit::mma8::copy_wait<0>();                         // no copy may land in the ring after this
    rocjit::launch_dependents();

    float* dst = &acc[0][0];
    if constexpr (WG > 1) {                               // fixed-order reduction of the warpgroups
        __syncthreads();                                  // every warpgroup is done with its ring
        float* red = reinterpret_cast<float*>(smem);
        if (cg > 0) {
#pragma unroll
            for (int v = 0; v < kVals; ++v) red[((cg - 1) * kVals + v) * 128 + ct] = dst[v];
        }
        __syncthreads();
        if (cg != 0) return;
        for (int g = 0; g < WG - 1; ++g)
#pragma unroll
            for (int v = 0; v < kVals; ++v) dst[v] += red[(g * kVals + v) * 128 + ct];
    }
    if (partial) {
#pragma unroll
        for (int sl = 0; sl < SLABS; ++sl)
            store_partial(reinterpret_cast<const float (&)[1][NB / 8][kAcc]>(acc[sl]), row0 + 64 * sl + 16 * wq,
                          partial + (size_t)blockIdx.y * M * N, M, N);
        return;
    }
    const auto ep = make_epilogue<EP>(out, residual, out_scale, scale_a, scale_w, scale_modes, M, N, ldo);
#pragma unroll
    for (int sl = 0; sl < SLABS; ++sl)
        write_acc<EP>(reinterpret_cast<const float (&)[1][NB / 8][kAcc]>(acc[sl]), row0 + 64 * sl + 16 * wq, ep);
#else
    rocjit::unsupported_on_target();   // wgmma needs sm_90a: the host picks skinny_gemm_kernel elsewhere
#endif
}

// rocjit:check skinny_gemm_kernel<skinny::bf16_t, __hip_bfloat16, 1, 1, 8, 2, 0, 0, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::f16_t, __half, 2, 2, 4, 2, 0, 0, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 1, 8, 2, 0, 0, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 1, 4, 2, 0, 0, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 2, 4, 4, 2, 0, 0, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 4, 4, 2, 4, 0, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, unsigned char, 1, 1, 8, 2, 0, 0, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, unsigned char, 2, 4, 4, 2, 0, 0, skinny::ep_swiglu<rocjit::e4m3fnuz>>
// rocjit:check skinny_gemm_kernel<skinny::bf16_t, __hip_bfloat16, 2, 4, 4, 2, 0, 0, skinny::ep_swiglu<skinny::no_quant>>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 4, 8, 2, 0, 0, skinny::ep_residual>
// rocjit:check skinny_gemm_kernel<skinny::f16_t, __half, 2, 2, 4, 2, 0, 0, skinny::ep_residual>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 1, 4, 2, 0, 1, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 4, 4, 2, 0, 1, skinny::ep_store>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 4, 4, 2, 0, 1, skinny::ep_residual>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, unsigned char, 1, 2, 4, 2, 0, 1, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check skinny_gemm_kernel<skinny::bf16_t, __hip_bfloat16, 1, 4, 4, 2, 0, 1, skinny::ep_store>
// rocjit:check skinny_splitk_reduce<__hip_bfloat16, skinny::ep_store>
// rocjit:check skinny_splitk_reduce<__hip_bfloat16, skinny::ep_residual>
// rocjit:check skinny_splitk_reduce<unsigned char, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check skinny_splitk_reduce<__half, skinny::ep_swiglu<skinny::no_quant>>
// rocjit:check skinny_streamk_reduce<__hip_bfloat16, skinny::ep_store>
// rocjit:check skinny_streamk_reduce<__hip_bfloat16, skinny::ep_residual>
// rocjit:check skinny_streamk_reduce<unsigned char, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check skinny_stream_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 1, 4, 512, 6, 4, skinny::ep_store>
// rocjit:check skinny_stream_kernel<skinny::e4m3_t, __hip_bfloat16, 2, 4, 4, 256, 5, 4, skinny::ep_store>
// rocjit:check skinny_stream_kernel<skinny::bf16_t, __hip_bfloat16, 1, 2, 8, 256, 5, 4, skinny::ep_store>
// rocjit:check skinny_stream_kernel<skinny::bf16_t, __hip_bfloat16, 1, 1, 4, 512, 6, 2, skinny::ep_store>
// rocjit:check skinny_stream_kernel<skinny::e4m3_t, unsigned char, 1, 1, 4, 512, 6, 4, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check skinny_stream_kernel<skinny::e4m3_t, __hip_bfloat16, 2, 4, 4, 256, 5, 4, skinny::ep_residual>
// rocjit:check skinny_stream_kernel<skinny::bf16_t, __hip_bfloat16, 1, 2, 8, 256, 5, 4, skinny::ep_swiglu<skinny::no_quant>>
// rocjit:check skinny_gemm_blockwise_kernel<__hip_bfloat16, 1, 1, 8, 2, 0>
// rocjit:check skinny_gemm_blockwise_kernel<__hip_bfloat16, 2, 2, 4, 2, 0>
// rocjit:check skinny_gemm_blockwise_kernel<__hip_bfloat16, 1, 1, 4, 4, 0>
// rocjit:check skinny_gemm_blockwise_kernel<float, 1, 4, 8, 2, 0>
// rocjit:check skinny_gemm_blockwise_kernel<float, 2, 4, 4, 2, 0>
// rocjit:check skinny_tma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 1, 1, 4, 4, skinny::ep_store>
// rocjit:check skinny_tma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 1, 2, 4, 2, skinny::ep_store>
// rocjit:check skinny_tma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 1, 1, 8, 2, skinny::ep_residual>
// rocjit:check skinny_tma_kernel<skinny::e4m3_t, unsigned char, 32, 1, 2, 2, 5, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check skinny_tma_kernel<skinny::bf16_t, __hip_bfloat16, 32, 1, 2, 2, 5, skinny::ep_store>
// rocjit:check skinny_tma_kernel<skinny::f16_t, __half, 32, 1, 1, 4, 4, skinny::ep_swiglu<skinny::no_quant>>
// rocjit:check skinny_tma_kernel<skinny::e4m3_t, __hip_bfloat16, 8, 1, 2, 4, 3, skinny::ep_store>
// rocjit:check skinny_tma_kernel<skinny::bf16_t, __hip_bfloat16, 16, 1, 2, 2, 5, skinny::ep_residual>
// rocjit:check skinny_wgmma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 1, 1, 1, skinny::ep_store>
// rocjit:check skinny_wgmma_kernel<skinny::e4m3_t, __hip_bfloat16, 32, 2, 1, 1, skinny::ep_store>
// rocjit:check skinny_wgmma_kernel<skinny::e4m3_t, __hip_bfloat16, 16, 2, 1, 1, skinny::ep_residual>
// rocjit:check skinny_wgmma_kernel<skinny::e4m3_t, unsigned char, 32, 1, 2, 1, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check skinny_wgmma_kernel<skinny::bf16_t, __hip_bfloat16, 32, 1, 2, 1, skinny::ep_store>
// rocjit:check skinny_wgmma_kernel<skinny::f16_t, __half, 16, 1, 1, 2, skinny::ep_swiglu<skinny::no_quant>>
