// Blockwise-scaled FP8 GEMM on Hopper (sm_90a): the product of gemm_fp8_blockwise.hip, computed with warpgroup
// MMAs (wgmma.mma_async m64n{BN}k32 e4m3, operands read from shared memory) instead of mma.sync.
//   C[M, N] = sum_kb (A_kb B_kb^T) * sa[m, kb] * sb(n, kb)
// A [M, K] and B [N, K] e4m3, K-major (row stride lda / ldb bytes, a multiple of 16); sa one fp32 scale per row
// of A and 128-wide K block; sb one per 128 x 128 tile of B (sb[(n / 128) * sb_n + kb * sb_k]) or, SB_ROWS,
// one per row of B (sb[n * sb_n + kb * sb_k]). Same arguments, scale strides and output contract as
// gemm_fp8_blockwise_kernel (TRANS_C writes C^T [N, M]; VEC_OUT allows 16-byte stores).
//
// A block owns a BM x BN tile (BM = 64 per consumer warpgroup, BN 128 or 256: m64n128k32 per 128 columns). Each K block of 128 arrives in a
// STAGES-deep shared-memory ring as 128-byte rows in the 128B-swizzled layout wgmma's descriptors read
// (rocjit/wgmma.h), written by 16-byte cp.async copies that zero-fill rows past M / N and k past K.
// Per K block a consumer warpgroup runs 4 wgmma k32 steps into fresh fp32 partials, waits, and promotes
// them: acc += partial * sa[row] * sb[col] (the DeepSeek-V3 recipe: scales applied per K block in fp32).
// - WS false: every warp copies and multiplies; one __syncthreads per K block publishes a stage and frees the
//   previous one. The copies of stage kb + STAGES - 1 are issued while stage kb's wgmmas run.
// - WS true: warpgroup 0 only copies (its threads arrive on the stage's `full` mbarrier when their copies
//   land), the other warpgroups only multiply (one arrival per warp on the stage's `empty` mbarrier once
//   their wgmmas have read it), so consumers never wait on each other or on the copy issue.
// Epilogue: the tile goes through shared memory and leaves as 16-byte stores along C's (or C^T's) rows.
// Other targets compile the kernel with a trap; the host selects it only on sm_90a.
#include <hip/hip_runtime.h>
#include "rocjit/types.h"
#include "rocjit/mma_fp8.h"
#include "rocjit/wgmma.h"

using namespace rocjit;

namespace gemm8_sm90 {

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

constexpr int kGroupM = 8;       // grouped raster, as in gemm_fp8_blockwise.hip
constexpr int kRow = 128;        // bytes of one K block row

// Shared memory, from a 1024-byte aligned base: STAGES x [A BM x 128 | B BN x 128] tiles, then STAGES x
// [sa BM | sb BN] floats, then 2 x STAGES mbarriers. The host adds 1024 bytes of alignment slack.
template <int BM, int BN, int STAGES>
struct layout {
    static constexpr int kTileBytes = (BM + BN) * kRow;
    static constexpr int kTiles = STAGES * kTileBytes;
    static constexpr int kScales = STAGES * (BM + BN) * 4;
    static constexpr int kBytes = kTiles + kScales + 2 * STAGES * 8;
};

}  // namespace gemm8_sm90

template <class OT, int BM, int BN, int STAGES, bool WS, bool EVEN_K, bool SB_ROWS, bool TRANS_C, bool VEC_OUT>
__launch_bounds__((BM / 64 + WS) * 128, 1) __global__ void gemm_fp8_blockwise_sm90_kernel(
    OT* __restrict__ c, const unsigned char* __restrict__ a, const unsigned char* __restrict__ b,
    const float* __restrict__ sa, const float* __restrict__ sb, int M, int N, int K, long long lda, long long ldb,
    long long ldc, long long sa_m, long long sa_k, long long sb_n, long long sb_k) {
#if ROCJIT_HAS_WGMMA
    using namespace gemm8_sm90;
    using L = layout<BM, BN, STAGES>;
    constexpr int kConsumers = BM / 64;                         // warpgroups that multiply
    constexpr int kConsumerThreads = kConsumers * 128;
    constexpr int kCopyThreads = WS ? 128 : kConsumerThreads;
    constexpr int kHalves = BN / 128;                           // m64n128k32 column blocks of the tile
    constexpr int kSb = SB_ROWS ? BN : kHalves;                 // B scales per stage: per column, or per 128 columns
    static_assert(BM % 64 == 0 && (BN == 128 || BN == 256), "BM: 64 per warpgroup; BN 128 or 256");
    // 128 x 256 keeps 192 accumulators per thread: it fits the 255-register limit of 256 threads, not the
    // 168 of 384 (a copy warpgroup would spill)
    static_assert(!(WS && BN == 256 && BM == 128), "BM 128 x BN 256 runs without the copy warpgroup");
    static_assert(BM * (BN + 1) * 4 <= L::kTiles, "the epilogue tile reuses the ring");
    static_assert(BM * 8 % kCopyThreads == 0 && BN * 8 % kCopyThreads == 0, "copies split evenly");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    float* scales = reinterpret_cast<float*>(smem + L::kTiles);
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + L::kTiles + L::kScales);
    unsigned long long* empty = full + STAGES;

    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int per_group = kGroupM * tiles_n;
    const int group = blockIdx.x / per_group;
    const int first_m = group * kGroupM;
    const int rows_in_group = min(tiles_m - first_m, kGroupM);
    const int tm = first_m + (blockIdx.x % per_group) % rows_in_group;
    const int tn = (blockIdx.x % per_group) / rows_in_group;
    const int m0 = tm * BM, n0 = tn * BN;
    const int kblocks = (K + kRow - 1) / kRow;

    auto stage_a = [&](int s) { return smem + s * L::kTileBytes; };
    auto stage_b = [&](int s) { return smem + s * L::kTileBytes + BM * kRow; };
    auto stage_sa = [&](int s) { return scales + s * (BM + BN); };
    auto stage_sb = [&](int s) { return scales + s * (BM + BN) + BM; };

    // copies of K block kb into stage s by threads t = 0 .. kCopyThreads - 1
    auto load_stage = [&](int s, int kb, int t) {
        const int k0 = kb * kRow;
        unsigned char* as = stage_a(s);
        unsigned char* bs = stage_b(s);
        // fixed trip counts (the copy threads split the tile's 16-byte chunks evenly): unrolled, no loop branches
#pragma unroll
        for (int j = 0; j < BM * 8 / kCopyThreads; ++j) {
            const int i = t + j * kCopyThreads, row = i >> 3, ch = i & 7;
            const bool ok = m0 + row < M && (EVEN_K || k0 + ch * 16 < K);
            mma8::copy16(as + mma8::swizzle(row, ch), ok ? a + (long long)(m0 + row) * lda + k0 + ch * 16 : a, ok);
        }
#pragma unroll
        for (int j = 0; j < BN * 8 / kCopyThreads; ++j) {
            const int i = t + j * kCopyThreads, row = i >> 3, ch = i & 7;
            const bool ok = n0 + row < N && (EVEN_K || k0 + ch * 16 < K);
            mma8::copy16(bs + mma8::swizzle(row, ch), ok ? b + (long long)(n0 + row) * ldb + k0 + ch * 16 : b, ok);
        }
#pragma unroll
        for (int j = 0; j < (BM + kSb + kCopyThreads - 1) / kCopyThreads; ++j) {
            const int i = t + j * kCopyThreads;
            if (i >= BM + kSb) break;
            if (i < BM) {
                const bool ok = m0 + i < M;
                mma8::copy4(stage_sa(s) + i, ok ? sa + (long long)(m0 + i) * sa_m + (long long)kb * sa_k : sa, ok);
            } else {
                const int n = n0 + (i - BM) * (SB_ROWS ? 1 : 128);
                const long long nrow = SB_ROWS ? n : n / 128;
                mma8::copy4(stage_sb(s) + i - BM, n < N ? sb + nrow * sb_n + (long long)kb * sb_k : sb, n < N);
            }
        }
    };

    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int cg = warp / 4 - (WS ? 1 : 0);            // consumer warpgroup (-1: the copy warpgroup)
    const int row_in_tile = cg * 64 + (warp & 3) * 16 + (lane >> 2);   // this thread's first accumulator row
    const int col_in_8 = 2 * (lane & 3);

    if constexpr (WS) {
        if (threadIdx.x == 0) {
            for (int s = 0; s < STAGES; ++s) {
                mbar_init(&full[s], 128);
                mbar_init(&empty[s], kConsumers * 4);
            }
            mbar_init_fence();
        }
        __syncthreads();
        if (cg < 0) {                       // the copy warpgroup: fill the ring, then leave
            for (int kb = 0; kb < kblocks; ++kb) {
                const int s = kb % STAGES, round = kb / STAGES;
                if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                load_stage(s, kb, threadIdx.x);
                cp_async_arrive(&full[s]);
            }
            mma8::copy_wait<0>();
            return;
        }
    }

    float acc[kHalves][64], part[64];
#pragma unroll
    for (int e = 0; e < 64; ++e) {
#pragma unroll
        for (int h = 0; h < kHalves; ++h) acc[h][e] = 0.0f;
        part[e] = 0.0f;
    }

    auto mma_half = [&](int s, int h) {
        const unsigned long long da = wgmma::desc_sw128(smem_u32(stage_a(s) + cg * 64 * kRow));
        const unsigned long long db = wgmma::desc_sw128(smem_u32(stage_b(s) + h * 128 * kRow));
        wgmma::fence_operands(part);
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < kRow / wgmma::kStepK; ++ks)
            wgmma::mma_m64n128k32(part, wgmma::desc_advance(da, ks * wgmma::kStepK),
                                  wgmma::desc_advance(db, ks * wgmma::kStepK), ks);
        wgmma::commit();
    };
    auto promote = [&](int s, float (&ac)[64], int h) {
        wgmma::fence_operands(part);
        const float* ssa = stage_sa(s) + row_in_tile;
        const float ra0 = ssa[0], ra1 = ssa[8];
        if constexpr (!SB_ROWS) {
            const float bsc = stage_sb(s)[h];
            const float s0 = ra0 * bsc, s1 = ra1 * bsc;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                ac[4 * j + 0] = fmaf(part[4 * j + 0], s0, ac[4 * j + 0]);
                ac[4 * j + 1] = fmaf(part[4 * j + 1], s0, ac[4 * j + 1]);
                ac[4 * j + 2] = fmaf(part[4 * j + 2], s1, ac[4 * j + 2]);
                ac[4 * j + 3] = fmaf(part[4 * j + 3], s1, ac[4 * j + 3]);
            }
        } else {
            const float* ssb = stage_sb(s) + h * 128 + col_in_8;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const float2 bs = *reinterpret_cast<const float2*>(ssb + 8 * j);
                ac[4 * j + 0] = fmaf(part[4 * j + 0], ra0 * bs.x, ac[4 * j + 0]);
                ac[4 * j + 1] = fmaf(part[4 * j + 1], ra0 * bs.y, ac[4 * j + 1]);
                ac[4 * j + 2] = fmaf(part[4 * j + 2], ra1 * bs.x, ac[4 * j + 2]);
                ac[4 * j + 3] = fmaf(part[4 * j + 3], ra1 * bs.y, ac[4 * j + 3]);
            }
        }
    };

    if constexpr (!WS) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < kblocks) load_stage(s, s, threadIdx.x);
            mma8::copy_commit();
        }
        for (int kb = 0; kb < kblocks; ++kb) {
            mma8::copy_wait<STAGES - 2>();
            wgmma::fence_proxy_async();   // this thread's copies of stage kb, visible to wgmma
            __syncthreads();              // ... and everyone's; every warp has finished stage kb - 1
            const int s = kb % STAGES;
#pragma unroll
            for (int h = 0; h < kHalves; ++h) {
                mma_half(s, h);
                if (h == 0) {             // the copies of a later stage go out while the tensor cores work
                    if (kb + STAGES - 1 < kblocks) load_stage((kb + STAGES - 1) % STAGES, kb + STAGES - 1, threadIdx.x);
                    mma8::copy_commit();
                }
                wgmma::wait<0>();
                promote(s, acc[h], h);
            }
        }
        mma8::copy_wait<0>();
    } else {
        for (int kb = 0; kb < kblocks; ++kb) {
            const int s = kb % STAGES, round = kb / STAGES;
            mbar_wait(&full[s], round & 1);
            wgmma::fence_proxy_async();
#pragma unroll
            for (int h = 0; h < kHalves; ++h) {
                mma_half(s, h);
                wgmma::wait<0>();
                promote(s, acc[h], h);      // reads the stage's scales: release the stage after
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
        }
    }
    // the ring is free (every copy landed, every wgmma finished): it holds the output tile now
    wgmma::bar_sync<1, kConsumerThreads>();

    constexpr int kLd = BN + 1;
    float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            float* p = cs + row_in_tile * kLd + h * 128 + 8 * j + col_in_8;
            p[0] = acc[h][4 * j + 0];
            p[1] = acc[h][4 * j + 1];
            p[8 * kLd] = acc[h][4 * j + 2];
            p[8 * kLd + 1] = acc[h][4 * j + 3];
        }
    wgmma::bar_sync<1, kConsumerThreads>();

    constexpr int kOuter = TRANS_C ? BN : BM, kInner = TRANS_C ? BM : BN;
    const int outer_limit = TRANS_C ? N - n0 : M - m0, inner_limit = TRANS_C ? M - m0 : N - n0;
    OT* base = c + (TRANS_C ? (long long)n0 * ldc + m0 : (long long)m0 * ldc + n0);
    for (int idx = threadIdx.x - (WS ? 128 : 0); idx < kOuter * kInner / 8; idx += kConsumerThreads) {
        const int o = idx / (kInner / 8), in = (idx % (kInner / 8)) * 8;
        if (o >= outer_limit || in >= inner_limit) continue;
        float v[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) v[t] = TRANS_C ? cs[(in + t) * kLd + o] : cs[o * kLd + in + t];
        OT* p = base + (long long)o * ldc + in;
        if (VEC_OUT && in + 8 <= inner_limit) {
            gemm8_sm90::store8<OT>(p, v);
        } else {
            for (int t = 0; t < 8 && in + t < inner_limit; ++t) p[t] = from_float<OT>(v[t]);
        }
    }
#else
    (void)c; (void)a; (void)b; (void)sa; (void)sb; (void)M; (void)N; (void)K; (void)lda; (void)ldb; (void)ldc;
    (void)sa_m; (void)sa_k; (void)sb_n; (void)sb_k;
    unsupported_on_target();   // wgmma needs sm_90a: the host never launches this elsewhere
#endif
}

// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 128, 128, 6, true, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 128, 128, 4, false, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 64, 128, 4, false, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 128, 256, 4, false, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<float, 64, 128, 4, false, false, true, true, false>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<float, 128, 128, 6, true, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<float, 128, 256, 4, false, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__half, 128, 256, 4, false, false, true, false, true>
