// Blockwise-scaled FP8 GEMM (DeepSeek-V3 / Primus-Turbo recipe): C[M, N] = sum_kb (A_kb B_kb^T) * sa[m, kb] * sb[n, kb]
// with 128-wide K blocks kb. A [M, K] and B [N, K] are e4m3, K-major (row stride lda / ldb bytes, a multiple
// of 16); sa is one fp32 scale per row of A and K block (1 x 128), sb one per 128 x 128 tile of B
// (sb(n, kb) = sb[(n / 128) * sb_n + kb * sb_k]) or, SB_ROWS, one per row of B and K block
// (sb[n * sb_n + kb * sb_k]: wgrad, where B is an activation). Scales are read through strides, so the
// column-major scale layouts of cuBLASLt and of the quantizers' transposed outputs need no copy.
//
// A block owns a BM x BN output tile; WM x WN warps (waves on AMD) own (BM/WM) x (BN/WN). Every main-loop
// iteration is one K block of 128: A and B tiles plus their scales arrive in a STAGES-deep shared-memory
// ring (cp.async on NVIDIA), the warp multiplies its tile into fresh fp32 partials (4 steps of k = 32),
// then promotes them: acc += partial * sa[row] * sb[col]. Rows past M / N and k past K are zero-filled
// by the copies (K % 16 == 0 is the host's contract), so tails need no masks in the math; EVEN_K
// (K % 128 == 0) drops the k bound test from the copies.
// Epilogue: the tile goes through shared memory and leaves as 16-byte stores along C's rows, or with
// TRANS_C along C^T's rows (C^T [N, M], the transposed-store epilogue of wgrad-style outputs).
#include <hip/hip_runtime.h>
#include "rocjit/types.h"
#include "rocjit/mma_fp8.h"

using namespace rocjit;

namespace gemm8 {

template <class OT> ROCJIT_INLINE void store8(OT* p, const float (&v)[8]);
template <> ROCJIT_INLINE void store8<float>(float* p, const float (&v)[8]) {
    store_vec<4>(p, vec<float, 4>{{v[0], v[1], v[2], v[3]}});
    store_vec<4>(p + 4, vec<float, 4>{{v[4], v[5], v[6], v[7]}});
}
template <> ROCJIT_INLINE void store8<bf16>(bf16* p, const float (&v)[8]) {
    vec<bf16, 8> o;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = from_float<bf16>(v[i]);
    store_vec<8>(p, o);
}
template <> ROCJIT_INLINE void store8<f16>(f16* p, const float (&v)[8]) {
    vec<f16, 8> o;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = from_float<f16>(v[i]);
    store_vec<8>(p, o);
}

// Tiles of the grid in groups of GROUP_M tile rows, so blocks running together share A and B in L2.
constexpr int kGroupM = 8;

}  // namespace gemm8

template <class OT, int BM, int BN, int WM, int WN, int STAGES, bool EVEN_K, bool SB_ROWS, bool TRANS_C, bool VEC_OUT>
__launch_bounds__(WM * WN * kWaveSize) __global__ void gemm_fp8_blockwise_kernel(
    OT* __restrict__ c, const unsigned char* __restrict__ a, const unsigned char* __restrict__ b,
    const float* __restrict__ sa, const float* __restrict__ sb, int M, int N, int K, long long lda, long long ldb,
    long long ldc, long long sa_m, long long sa_k, long long sb_n, long long sb_k) {
    using namespace mma8;
    constexpr int kThreads = WM * WN * kWaveSize;
    constexpr int TM = BM / WM, TN = BN / WN;          // warp tile
    constexpr int MI = TM / kTile, NI = TN / kTile;    // 16 x 16 fragments per warp
    static_assert(MI * kTile * WM == BM && NI * kTile * WN == BN, "tiles: multiples of 16 per warp");
    constexpr int kStageBytes = (BM + BN) * kRowBytes + (BM + BN) * 4;
    extern __shared__ __align__(16) unsigned char smem[];

    // grouped raster: consecutive blocks walk down GROUP_M tile rows before moving right
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int per_group = gemm8::kGroupM * tiles_n;
    const int group = blockIdx.x / per_group;
    const int first_m = group * gemm8::kGroupM;
    const int rows_in_group = min(tiles_m - first_m, gemm8::kGroupM);
    const int tm = first_m + (blockIdx.x % per_group) % rows_in_group;
    const int tn = (blockIdx.x % per_group) / rows_in_group;
    const int m0 = tm * BM, n0 = tn * BN;
    const int kblocks = (K + kRowBytes - 1) / kRowBytes;

    auto stage_a = [&](int s) { return smem + s * kStageBytes; };
    auto stage_b = [&](int s) { return smem + s * kStageBytes + BM * kRowBytes; };
    auto stage_sa = [&](int s) { return reinterpret_cast<float*>(smem + s * kStageBytes + (BM + BN) * kRowBytes); };
    auto stage_sb = [&](int s) { return stage_sa(s) + BM; };

    auto load_stage = [&](int s, int kb) {
        const int k0 = kb * kRowBytes;
        unsigned char* as = stage_a(s);
        unsigned char* bs = stage_b(s);
#pragma unroll
        for (int i = threadIdx.x; i < BM * 8; i += kThreads) {
            const int row = i >> 3, ch = i & 7;
            const bool ok = m0 + row < M && (EVEN_K || k0 + ch * 16 < K);
            copy16(as + swizzle(row, ch), ok ? a + (long long)(m0 + row) * lda + k0 + ch * 16 : a, ok);
        }
#pragma unroll
        for (int i = threadIdx.x; i < BN * 8; i += kThreads) {
            const int row = i >> 3, ch = i & 7;
            const bool ok = n0 + row < N && (EVEN_K || k0 + ch * 16 < K);
            copy16(bs + swizzle(row, ch), ok ? b + (long long)(n0 + row) * ldb + k0 + ch * 16 : b, ok);
        }
        for (int i = threadIdx.x; i < BM + BN; i += kThreads) {
            if (i < BM) {
                const bool ok = m0 + i < M;
                copy4(stage_sa(s) + i, ok ? sa + (long long)(m0 + i) * sa_m + (long long)kb * sa_k : sa, ok);
            } else {
                const int n = n0 + i - BM;
                const long long nrow = SB_ROWS ? n : n / 128;
                copy4(stage_sb(s) + i - BM, n < N ? sb + nrow * sb_n + (long long)kb * sb_k : sb, n < N);
            }
        }
    };

    const int warp = threadIdx.x / kWaveSize;
    const int wm = warp / WN, wn = warp % WN;
    float acc[MI][NI][kAcc];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < kAcc; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < kblocks) load_stage(s, s);
        copy_commit();
    }

    for (int kb = 0; kb < kblocks; ++kb) {
        copy_wait<STAGES - 2>();
        __syncthreads();   // stage kb landed for every thread; stage kb - 1 is free for the prefetch
        if (kb + STAGES - 1 < kblocks) load_stage((kb + STAGES - 1) % STAGES, kb + STAGES - 1);
        copy_commit();

        const int s = kb % STAGES;
        const unsigned char* as = stage_a(s);
        const unsigned char* bs = stage_b(s);
        float part[MI][NI][kAcc];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int e = 0; e < kAcc; ++e) part[i][j][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kRowBytes / kStepK; ++ks) {
            frag_a fa[MI];
            frag_b fb[NI];
#pragma unroll
            for (int i = 0; i < MI; ++i) load_a(fa[i], as, wm * TM + i * kTile, ks);
#pragma unroll
            for (int j = 0; j < NI; ++j) load_b(fb[j], bs, wn * TN + j * kTile, ks);
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma(part[i][j], fa[i], fb[j]);
        }
        // promote this K block: its scales were copied with its tiles
        const float* ssa = stage_sa(s) + wm * TM;
        const float* ssb = stage_sb(s) + wn * TN;
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            float ra[kAcc];
#pragma unroll
            for (int e = 0; e < kAcc; ++e) ra[e] = ssa[i * kTile + acc_row(e)];
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int e = 0; e < kAcc; ++e)
                    acc[i][j][e] = fmaf(part[i][j][e], ra[e] * ssb[j * kTile + acc_col(e)], acc[i][j][e]);
        }
    }
    copy_wait<0>();
    __syncthreads();   // the ring is free: reuse it for the output tile

    constexpr int kLd = BN + 1;
    float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < kAcc; ++e)
                cs[(wm * TM + i * kTile + acc_row(e)) * kLd + wn * TN + j * kTile + acc_col(e)] = acc[i][j][e];
    __syncthreads();

    // 8 consecutive outputs per thread and step, along C's rows (or C^T's rows with TRANS_C)
    constexpr int kOuter = TRANS_C ? BN : BM, kInner = TRANS_C ? BM : BN;
    const int outer_limit = TRANS_C ? N - n0 : M - m0, inner_limit = TRANS_C ? M - m0 : N - n0;
    OT* base = c + (TRANS_C ? (long long)n0 * ldc + m0 : (long long)m0 * ldc + n0);
    for (int idx = threadIdx.x; idx < kOuter * kInner / 8; idx += kThreads) {
        const int o = idx / (kInner / 8), in = (idx % (kInner / 8)) * 8;
        if (o >= outer_limit || in >= inner_limit) continue;
        float v[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) v[t] = TRANS_C ? cs[(in + t) * kLd + o] : cs[o * kLd + in + t];
        OT* p = base + (long long)o * ldc + in;
        if (VEC_OUT && in + 8 <= inner_limit) {
            gemm8::store8<OT>(p, v);
        } else {
            for (int t = 0; t < 8 && in + t < inner_limit; ++t) p[t] = from_float<OT>(v[t]);
        }
    }
}

// rocjit:check gemm_fp8_blockwise_kernel<__hip_bfloat16, 128, 128, 2, 4, 4, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_kernel<__half, 128, 64, 4, 2, 3, false, false, false, false>
// rocjit:check gemm_fp8_blockwise_kernel<__hip_bfloat16, 64, 64, 2, 2, 4, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_kernel<float, 128, 128, 2, 4, 3, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_kernel<__hip_bfloat16, 64, 128, 2, 2, 4, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_kernel<__hip_bfloat16, 128, 64, 4, 2, 4, true, true, true, true>
