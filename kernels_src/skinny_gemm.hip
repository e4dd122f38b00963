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
// Paths: NVIDIA mma.sync (m16n8k16 bf16/f16, m16n8k32 e4m3); AMD MFMA 16x16x16 bf16/f16
// (gfx90a+) and 16x16x32 fp8 (gfx942 e4m3fnuz, gfx950 e4m3fn). FP8 on gfx90a has no matrix
// instruction: there fp8 is widened to f16 in registers (the host prefers gemv.hip's portable kernel).
#include <hip/hip_runtime.h>
#include "rocjit/types.h"   // __half / __hip_bfloat16 on every compiler (hipRTC included)

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

template <class T> __device__ __forceinline__ void store_out(T* p, float v);
template <> __device__ __forceinline__ void store_out<float>(float* p, float v) { *p = v; }
template <> __device__ __forceinline__ void store_out<__half>(__half* p, float v) { *p = __float2half_rn(v); }
template <> __device__ __forceinline__ void store_out<__hip_bfloat16>(__hip_bfloat16* p, float v) {
    *p = __float2bfloat16(v);
}

__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
// Weights are read once: keep them from evicting the activations in L1/L2 (a hint only).
__device__ __forceinline__ uint4 load16_stream(const void* p) {
#if defined(SKINNY_NV)
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));
    u32x4 v = __builtin_nontemporal_load(reinterpret_cast<const u32x4*>(p));
    return make_uint4(v[0], v[1], v[2], v[3]);
#endif
}

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

// Accumulator r of (m-tile t, n-tile j) -> (weight row within the warp's tiles, activation row).
__device__ __forceinline__ int acc_wrow(int t, int r) { return 16 * t + lane_row() + 8 * (r >> 1); }
__device__ __forceinline__ int acc_arow(int j, int r) { return kNTileRows * j + 2 * lane_chunk() + (r & 1); }
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
#endif

}  // namespace skinny

// E: element kind; OT: output type; MT: 16-row weight tiles per warp; NT: activation tiles
// (M <= NT * kNTileRows); WARPS_K: warps splitting K inside a block; UNROLL: k-blocks in flight.
// A k-block is 4 chunks of 16 bytes per row (32 bf16/f16 or 64 fp8 values).
// partial == nullptr: write out[M, N] = acc * scale_a * scale_w; else partial[split][M][N] = acc.
template <class E, class OT, int MT, int NT, int WARPS_K, int UNROLL>
__launch_bounds__(WARPS_K * skinny::kWarp) __global__ void
skinny_gemm_kernel(const typename E::storage* __restrict__ a, const typename E::storage* __restrict__ w,
                   OT* __restrict__ out, float* __restrict__ partial,
                   const float* __restrict__ scale_a, const float* __restrict__ scale_w, int scale_w_per_row,
                   int M, int N, int K, int kblocks_per_split) {
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
    for (int kb0 = kb_begin + warp * UNROLL; kb0 < kb_end; kb0 += WARPS_K * UNROLL) {
        uint4 wv[UNROLL][MT][kRowsPerLane];
        uint4 av[UNROLL][NT];
        // Issue every load of this step before any math: UNROLL * MT * 16 rows * 64 bytes in flight.
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
                av[u][j] = (live && a_live[j]) ? load16(arow[j] + (size_t)kb * kBlockK) : zero;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int t = 0; t < MT; ++t)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma_chunk<E>(acc[t][j], wv[u][t], av[u][j]);
    }

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

    const float sa = scale_a ? scale_a[0] : 1.f;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < kAcc; ++r) {
                const int n = row0 + acc_wrow(t, r);
                const int m = acc_arow(j, r);
                if (n >= N || m >= M) continue;
                if (partial) {
                    partial[((size_t)blockIdx.y * M + m) * N + n] = acc[t][j][r];
                } else {
                    const float sw = scale_w ? scale_w[scale_w_per_row ? n : 0] : 1.f;
                    store_out<OT>(out + (size_t)m * N + n, acc[t][j][r] * sa * sw);
                }
            }
}

// out[m, n] = (sum over splits s = 0, 1, ... of partial[s, m, n]) * scale_a * scale_w[n].
template <class OT>
__global__ void skinny_splitk_reduce(const float* __restrict__ partial, OT* __restrict__ out,
                                     const float* __restrict__ scale_a, const float* __restrict__ scale_w,
                                     int scale_w_per_row, int M, int N, int splits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    const int n = i % N;
    float s = 0.f;
    for (int p = 0; p < splits; ++p) s += partial[(size_t)p * M * N + i];
    const float sa = scale_a ? scale_a[0] : 1.f;
    const float sw = scale_w ? scale_w[scale_w_per_row ? n : 0] : 1.f;
    skinny::store_out<OT>(out + i, s * sa * sw);
}

// rocjit:check skinny_gemm_kernel<skinny::bf16_t, __hip_bfloat16, 1, 1, 8, 2>
// rocjit:check skinny_gemm_kernel<skinny::f16_t, __half, 2, 2, 4, 2>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 1, 1, 8, 2>
// rocjit:check skinny_gemm_kernel<skinny::e4m3_t, __hip_bfloat16, 2, 4, 4, 2>
// rocjit:check skinny_splitk_reduce<__hip_bfloat16>
