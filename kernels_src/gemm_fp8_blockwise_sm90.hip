// Blockwise-scaled FP8 GEMM on Hopper (sm_90a): the product of gemm_fp8_blockwise.hip, computed with warpgroup
// MMAs (wgmma.mma_async m64n{BN}k32 e4m3, operands read from shared memory) instead of mma.sync.
//   C[M, N] = sum_kb (A_kb B_kb^T) * sa[m, kb] * sb(n, kb)
// A [M, K] and B [N, K] e4m3, K-major (row stride lda / ldb bytes, a multiple of 16); sa one fp32 scale per row
// of A and 128-wide K block; sb one per 128 x 128 tile of B (sb[(n / 128) * sb_n + kb * sb_k]) or, SB_ROWS,
// one per row of B (sb[n * sb_n + kb * sb_k]). Same arguments, scale strides and output contract as
// gemm_fp8_blockwise_kernel (TRANS_C writes C^T [N, M]; VEC_OUT allows 16-byte stores).
//
// A block owns a BM x BN tile (BM = 64 per consumer warpgroup, BN 128 or 256: m64n128k32 per 128 columns). Each
// K block of 128 arrives in a STAGES-deep shared-memory ring as 128-byte rows in the 128B-swizzled layout wgmma's
// descriptors read (rocjit/wgmma.h), written by 16-byte cp.async copies that zero-fill rows past M / N and k past K.
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
#include "rocjit/tma.h"
#include "rocjit/cluster.h"
#include "rocjit/warp.h"

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

// The tile (m0, n0) of block `bid`: grouped raster, kGroupM row tiles per group walked column by column, so the
// blocks of a wave share A rows and B columns in L2.
template <int BM, int BN>
ROCJIT_INLINE void tile_of(int bid, int M, int N, int& m0, int& n0) {
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int per_group = kGroupM * tiles_n;
    const int first_m = bid / per_group * kGroupM;
    const int rows_in_group = min(tiles_m - first_m, kGroupM);
    m0 = (first_m + (bid % per_group) % rows_in_group) * BM;
    n0 = (bid % per_group) / rows_in_group * BN;
}

// acc += part * sa(row) * sb(col) for one m64nN fragment of R = N / 2 floats (wgmma's accumulator layout): ra0 /
// ra1 the A scales of this thread's two rows (8 apart); SB_ROWS: ssb at the first of this thread's columns' B
// scales (pairs 8 apart), else `bsc` is the one B scale of the fragment's columns. promote() reads ra0 / ra1 at
// ssa[0] / ssa[8].
template <bool SB_ROWS, int R = 64>
ROCJIT_INLINE void promote_rows(float (&ac)[R], const float (&part)[R], float ra0, float ra1, const float* ssb,
                                float bsc) {
    if constexpr (!SB_ROWS) {
        const float s0 = ra0 * bsc, s1 = ra1 * bsc;
#pragma unroll
        for (int j = 0; j < R / 4; ++j) {
            ac[4 * j + 0] = fmaf(part[4 * j + 0], s0, ac[4 * j + 0]);
            ac[4 * j + 1] = fmaf(part[4 * j + 1], s0, ac[4 * j + 1]);
            ac[4 * j + 2] = fmaf(part[4 * j + 2], s1, ac[4 * j + 2]);
            ac[4 * j + 3] = fmaf(part[4 * j + 3], s1, ac[4 * j + 3]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < R / 4; ++j) {
            const float2 bs = *reinterpret_cast<const float2*>(ssb + 8 * j);
            ac[4 * j + 0] = fmaf(part[4 * j + 0], ra0 * bs.x, ac[4 * j + 0]);
            ac[4 * j + 1] = fmaf(part[4 * j + 1], ra0 * bs.y, ac[4 * j + 1]);
            ac[4 * j + 2] = fmaf(part[4 * j + 2], ra1 * bs.x, ac[4 * j + 2]);
            ac[4 * j + 3] = fmaf(part[4 * j + 3], ra1 * bs.y, ac[4 * j + 3]);
        }
    }
}
template <bool SB_ROWS>
ROCJIT_INLINE void promote(float (&ac)[64], const float (&part)[64], const float* ssa, const float* ssb, float bsc) {
    promote_rows<SB_ROWS>(ac, part, ssa[0], ssa[8], ssb, bsc);
}

// The same for a fragment of 192 columns (a tile's column block wider than a 128 x 128 B-scale block): its
// 8-column groups j < split take b0, the others b1 (the next scale block). split = the groups left in the first
// block, (128 - n0 % 128) / 8: 16 or 8 (n0 a multiple of 64); each has its own unrolled copy, so no group selects
// its scale at run time.
template <int R, int SPLIT>
ROCJIT_INLINE void promote_split(float (&ac)[R], const float (&part)[R], float ra0, float ra1, float b0, float b1) {
    const float s00 = ra0 * b0, s01 = ra1 * b0, s10 = ra0 * b1, s11 = ra1 * b1;
#pragma unroll
    for (int j = 0; j < R / 4; ++j) {
        const float s0 = j < SPLIT ? s00 : s10, s1 = j < SPLIT ? s01 : s11;
        ac[4 * j + 0] = fmaf(part[4 * j + 0], s0, ac[4 * j + 0]);
        ac[4 * j + 1] = fmaf(part[4 * j + 1], s0, ac[4 * j + 1]);
        ac[4 * j + 2] = fmaf(part[4 * j + 2], s1, ac[4 * j + 2]);
        ac[4 * j + 3] = fmaf(part[4 * j + 3], s1, ac[4 * j + 3]);
    }
}
ROCJIT_INLINE void promote_192(float (&ac)[96], const float (&part)[96], float ra0, float ra1, float b0, float b1,
                               int split) {
    if (split == 8) promote_split<96, 8>(ac, part, ra0, ra1, b0, b1);
    else promote_split<96, 16>(ac, part, ra0, ra1, b0, b1);
}

// One m64n128 fp32 fragment into the tile `cs` (row stride LD floats) at row `row` (this thread's first) and
// columns col0 + 8 * j, col0 + 8 * j + 1 (col0 = the 128-column block's start + 2 * (lane & 3)).
template <int LD>
ROCJIT_INLINE void stash_fragment(float* cs, const float (&acc)[64], int row, int col0) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        float* p = cs + row * LD + col0 + 8 * j;
        p[0] = acc[4 * j + 0];
        p[1] = acc[4 * j + 1];
        p[8 * LD] = acc[4 * j + 2];
        p[8 * LD + 1] = acc[4 * j + 3];
    }
}

// The BM x BN fp32 tile `cs` (row stride BN + 1) out to C at (m0, n0), or to C^T with TRANS_C, by `nthreads`
// threads (t = 0 .. nthreads - 1) in 8-element runs along the output's rows (16-byte stores with VEC_OUT).
template <class OT, int BM, int BN, bool TRANS_C, bool VEC_OUT>
ROCJIT_INLINE void store_tile(const float* cs, OT* c, int m0, int n0, int M, int N, long long ldc, int t,
                              int nthreads) {
    constexpr int kLd = BN + 1;
    constexpr int kOuter = TRANS_C ? BN : BM, kInner = TRANS_C ? BM : BN;
    const int outer_limit = TRANS_C ? N - n0 : M - m0, inner_limit = TRANS_C ? M - m0 : N - n0;
    OT* base = c + (TRANS_C ? (long long)n0 * ldc + m0 : (long long)m0 * ldc + n0);
    for (int idx = t; idx < kOuter * kInner / 8; idx += nthreads) {
        const int o = idx / (kInner / 8), in = (idx % (kInner / 8)) * 8;
        if (o >= outer_limit || in >= inner_limit) continue;
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = TRANS_C ? cs[(in + e) * kLd + o] : cs[o * kLd + in + e];
        OT* p = base + (long long)o * ldc + in;
        if (VEC_OUT && in + 8 <= inner_limit) {
            store8<OT>(p, v);
        } else {
            for (int e = 0; e < 8 && in + e < inner_limit; ++e) p[e] = from_float<OT>(v[e]);
        }
    }
}

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

    int m0, n0;
    tile_of<BM, BN>(blockIdx.x, M, N, m0, n0);
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
    auto promote_half = [&](int s, float (&ac)[64], int h) {
        wgmma::fence_operands(part);
        promote<SB_ROWS>(ac, part, stage_sa(s) + row_in_tile, stage_sb(s) + h * 128 + col_in_8,
                         SB_ROWS ? 0.0f : stage_sb(s)[h]);
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
                promote_half(s, acc[h], h);
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
                promote_half(s, acc[h], h);      // reads the stage's scales: release the stage after
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
        }
    }
    // the ring is free (every copy landed, every wgmma finished): it holds the output tile now
    wgmma::bar_sync<1, kConsumerThreads>();

    float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) stash_fragment<BN + 1>(cs, acc[h], row_in_tile, h * 128 + col_in_8);
    wgmma::bar_sync<1, kConsumerThreads>();
    store_tile<OT, BM, BN, TRANS_C, VEC_OUT>(cs, c, m0, n0, M, N, ldc, threadIdx.x - (WS ? 128 : 0),
                                            kConsumerThreads);
#else
    (void)c; (void)a; (void)b; (void)sa; (void)sb; (void)M; (void)N; (void)K; (void)lda; (void)ldb; (void)ldc;
    (void)sa_m; (void)sa_k; (void)sb_n; (void)sb_k;
    unsupported_on_target();   // wgmma needs sm_90a: the host never launches this elsewhere
#endif
}

// The same product fed by the Tensor Memory Accelerator (sm_90a): BM = 64 * MWG * SLABS rows x BN columns per tile (BN
// 128; or 192 / 64 with one slab; KSPLIT: 64 rows, the MWG math warpgroups taking turns over the K blocks of one
// slab), 384 threads (MWG = 2 math warpgroups; 512 with 3, 256 with 1), persistent (block b
// takes tiles b, b + gridDim.x, ...; with CLUSTER 2, the cluster takes pairs of tiles side by side along N). Warp 0 is
// the copy warp: per K block it waits for the ring stage to be free, has the TMA unit copy the A box (BM x 128 bytes)
// and the B box (BN x 128 bytes) into it, 128B-swizzled and zero-filled past M, N and K (tma_a / tma_b: tensor maps of
// the K-major operands, 128B swizzle, boxes of BM / CLUSTER and BN rows) and arrives on the stage's `full` barrier,
// whose phase completes when the bytes have landed (SB_ROWS: with the stage's per-column B scales, one bulk copy of
// their row of the K block, which the host lays out column-contiguous: quantize_fp8_dual(transpose_col=True)'s layout,
// or a copy into it), and the stage's A scales, one bulk copy of the tile's rows from M-major scales
// (quantize_fp8_dual's s_row layout, or a copy into it). The math warps read their rows' A scales from the stage and
// the tile's B scales 32 K blocks per warp load (BN 192: those of the two 128-column scale blocks the tile's columns
// fall in). The copy warp runs on into the next tile while the math warps store the last one. The copy warpgroup gives
// its registers to the math warpgroups (setmaxnreg; with one math warpgroup, 256 threads have all they can use), each
// of which owns SLABS m64 slabs of the tile: per K block and slab, 4 wgmma m64nBNk32 into fresh partials, then the
// promotion acc += partial * sa * sb. A math warpgroup releases a stage on its own (one arrival per warp on `empty`),
// so the two never wait for each other and one's promotion overlaps the other's wgmmas. PIPE (one slab): K block
// kb + 1's wgmmas are issued before kb's partials are promoted. CLUSTER 2: each block copies half of the A tile into
// both blocks' rings (TMA multicast), so a stage is free only once both blocks' math warps released it (they arrive on
// both `empty` barriers). The accumulators go straight from registers to C (pairs of elements; C^T with TRANS_C). The
// 192-column tile is for shapes whose 128-column tiles leave the last wave of blocks short (N = 2112: 17 column tiles
// of 128, 11 of 192).
// Split-K (splits > 1, for products with fewer tiles than multiprocessors and a long K: 128 x 2112 x 7168 is 17 tiles
// of 56 K blocks): each tile's K blocks are cut into `splits` ranges, each a work unit of its own, whose fp32
// partials go to ws [splits, M, N] (C^T's layout with TRANS_C); the host sums them in split order
// (gemm_fp8_splitk_sum), so the result does not depend on timing. splits == 1 writes C directly (ws unused).
// Tail split (tail > 1, for products whose tiles leave the grid's last round partly empty: 4096 x 4096 on 192 x 128
// tiles is 704 tiles, 5.33 rounds of 132 blocks): the tiles of the whole rounds run whole, the last round's are each
// cut into `tail` K ranges, whose partials (ws, one BM x BN slab per unit) gemm_fp8_tail_sum adds in range order.

namespace gemm8_sm90 {

// A read-only global load issued exactly here: asm volatile keeps it in program order with the wgmma and
// barrier instructions around it, so a scale fetched one K block ahead really is in flight during that block
// (as a plain load the compiler sank it next to its use and the math warps waited out its L2 latency).
ROCJIT_INLINE float ld_scale(const float* p) {
#if ROCJIT_NVIDIA
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#else
    return *p;
#endif
}

// wgmma m64n64k32 with D = A B written fresh (write-only outputs, as wgmma::mma_m64n128k32_fresh): the first k32
// step of a pipelined partial of a 64-column tile
#define GEMM8_OUT4(i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3])
ROCJIT_INLINE void mma_m64n64k32_fresh(float (&d)[32], unsigned long long desc_a, unsigned long long desc_b) {
#if ROCJIT_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1;\n}\n"
        : GEMM8_OUT4(0), GEMM8_OUT4(4), GEMM8_OUT4(8), GEMM8_OUT4(12), GEMM8_OUT4(16), GEMM8_OUT4(20),
          GEMM8_OUT4(24), GEMM8_OUT4(28)
        : "l"(desc_a), "l"(desc_b), "r"(0));
#else
    (void)d; (void)desc_a; (void)desc_b;
    unsupported_on_target();
#endif
}
#undef GEMM8_OUT4

template <class OT>
ROCJIT_INLINE void store_pair(OT* c, long long ldc, int r, int col, float v0, float v1, int M, int N, bool trans,
                              bool pairs) {
    if (r >= M) return;
    if (trans) {
        if (col < N) c[(long long)col * ldc + r] = from_float<OT>(v0);
        if (col + 1 < N) c[(long long)(col + 1) * ldc + r] = from_float<OT>(v1);
    } else if (pairs && col + 1 < N) {
        store_vec<2>(c + (long long)r * ldc + col, vec<OT, 2>{{from_float<OT>(v0), from_float<OT>(v1)}});
    } else {
        if (col < N) c[(long long)r * ldc + col] = from_float<OT>(v0);
        if (col + 1 < N) c[(long long)r * ldc + col + 1] = from_float<OT>(v1);
    }
}

// One m64nN fp32 fragment (R = N / 2 floats, wgmma's layout, see rocjit/wgmma.h) out to the rows r0, r0 + 8 of a
// 16-bit C at columns col0 .. col0 + N - 1, in 16-byte stores. In the fragment the four lanes of a quad hold 4 bytes
// each of one 16-byte column group of a row; a 4 x 4 transpose inside the quad (two butterfly exchanges) gives each
// lane a whole group (lane k: groups 4 g + k), so a warp stores 64 contiguous bytes per row per instruction instead
// of 16 (a quarter of the store instructions; the stores were a sixth of the 4096^3 kernel's time on an H100). Rows
// past M and columns past N are not written; a group that N cuts (or !VEC_OUT: rows not 16-byte aligned) is stored
// element by element.
template <class OT, bool VEC_OUT, int R>
ROCJIT_INLINE void store_fragment16(OT* c, long long ldc, const float (&acc)[R], int r0, int col0, int M, int N,
                                    int lane) {
    static_assert(R % 16 == 0, "whole quads of 8-column groups");
    static_assert(sizeof(OT) == 2, "16-bit outputs");
    const int k = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {               // the thread's two rows: r0 (acc 4 q, 4 q + 1), r0 + 8 (4 q + 2, 4 q + 3)
        const int r = r0 + 8 * h;
#pragma unroll
        for (int g = 0; g < R / 16; ++g) {
            unsigned w[4];                      // w[i]: this lane's 2 columns of group 4 g + i
#pragma unroll
            for (int i = 0; i < 4; ++i)
                w[i] = bit_cast<unsigned>(vec<OT, 2>{{from_float<OT>(acc[4 * (4 * g + i) + 2 * h]),
                                                       from_float<OT>(acc[4 * (4 * g + i) + 2 * h + 1])}});
#pragma unroll
            for (int bit = 1; bit <= 2; bit <<= 1) {   // swap w[i] with the partner's w[i ^ bit] where bit differs
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    if (i & bit) continue;
                    const bool hi = (k & bit) != 0;
                    const unsigned send = hi ? w[i] : w[i | bit];
                    const unsigned got = shfl_xor(send, bit);
                    if (hi) w[i] = got; else w[i | bit] = got;
                }
            }
            if (r >= M) continue;
            const int col = col0 + 8 * (4 * g + k);    // w[i]: columns col + 2 i, col + 2 i + 1
            OT* p = c + (long long)r * ldc + col;
            if (VEC_OUT && col + 8 <= N) {
                store_vec<4>(reinterpret_cast<unsigned*>(p), vec<unsigned, 4>{{w[0], w[1], w[2], w[3]}});
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const vec<OT, 2> two = bit_cast<vec<OT, 2>>(w[i]);
                    if (col + 2 * i < N) p[2 * i] = two[0];
                    if (col + 2 * i + 1 < N) p[2 * i + 1] = two[1];
                }
            }
        }
    }
}

template <class OT, int SLABS, int BN, int STAGES, bool PIPE, int CLUSTER, bool SB_ROWS, bool TRANS_C, bool VEC_OUT,
          int MWG = 2, bool KSPLIT = false>
ROCJIT_INLINE void tma_gemm(const tensor_map& tma_a, const tensor_map& tma_b, OT* __restrict__ c,
                            float* __restrict__ ws, int splits, int tail, const float* __restrict__ sa,
                            const float* __restrict__ sb, int M, int N, int K, long long ldc, long long sa_m,
                            long long sa_k, long long sb_n, long long sb_k) {
#if ROCJIT_HAS_WGMMA
    // KSPLIT: the MWG math warpgroups share one m64 slab and take turns over its K blocks, each a chain of its own:
    // warpgroup w takes the K blocks that land in ring stages w, w + MWG, ... (STAGES a multiple of MWG), so every
    // stage has one reader and its barrier phases follow each other as for a warpgroup of its own rows; warpgroup 0
    // sums the others' accumulators in warpgroup order at the end of a unit
    constexpr int kRowWGs = KSPLIT ? 1 : MWG;   // math warpgroups with rows of their own
    constexpr int BM = 64 * kRowWGs * SLABS;
    constexpr int kR = BN / 2;                  // accumulator floats per thread of one m64nBN fragment
    using L = layout<BM, BN, STAGES>;
    (void)sa_m;                                 // the A scales are M-major: sa_m == 1 (the host sees to it)
    // registers per thread after setmaxnreg (128 x copy + 256 x math <= 64K): two slabs, or two partial sets with
    // per-column B scales, need 232 in the math warps (224 spilled there)
    // 2 slabs, 2 partial sets with per-column B scales, or one wider than 128 columns
    constexpr bool kWide = SLABS == 2 || (PIPE && SB_ROWS) || BN > 128;
    // three math warpgroups (128 x 40 + 384 x 152 <= 64K): one slab each, one partial set
    constexpr int kCopyRegs = MWG == 3 ? 40 : kWide ? 40 : 56, kMathRegs = MWG == 3 ? 152 : kWide ? 232 : 224;
    static_assert(!KSPLIT || ((MWG == 2 || MWG == 3) && SLABS == 1 && !PIPE && CLUSTER == 1 && BN <= 128 &&
                              STAGES % MWG == 0),
                  "KSPLIT: 2 or 3 math warpgroups on one slab of at most 128 columns, no pipelined partials, no "
                  "cluster, STAGES a multiple of MWG");
    static_assert(MWG == 2 || (MWG == 3 && SLABS == 1 && !PIPE && (BN == 128 || KSPLIT) && CLUSTER == 1) ||
                      (MWG == 1 && SLABS == 1 && CLUSTER == 1),
                  "MWG: 2 math warpgroups, or 3 with one slab each, no pipelined partials, 128 columns, no cluster, "
                  "or 1 with one slab, no cluster");
    static_assert(SLABS == 1 || SLABS == 2, "SLABS: m64 slabs per math warpgroup, 1 or 2");
    static_assert(!(PIPE && SLABS == 2), "two partial sets fit one slab per math warpgroup");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "CLUSTER: 1, or 2 blocks sharing the A tile");
    // BN 192: one slab (partial and accumulator, 96 floats each), its columns on two B-scale blocks
    // BN 64: one slab, m64n64k32 (products of few rows: twice the tiles of BN 128, so fewer split-K ranges)
    static_assert(BN == 128 || (BN == 192 && SLABS == 1 && !PIPE && CLUSTER == 1) ||
                      (BN == 64 && SLABS == 1 && CLUSTER == 1),
                  "BN 128, or 192 with one slab, no pipelined partials, no cluster, or 64 with one slab, no cluster");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    float* scales = reinterpret_cast<float*>(smem + L::kTiles);
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + L::kTiles + L::kScales);
    unsigned long long* empty = full + STAGES;
    auto stage_a = [&](int s) { return smem + s * L::kTileBytes; };
    auto stage_b = [&](int s) { return smem + s * L::kTileBytes + BM * kRow; };
    auto stage_sa = [&](int s) { return scales + s * (BM + BN); };
    auto stage_sb = [&](int s) { return scales + s * (BM + BN) + BM; };
    // KSPLIT: warpgroup w > 0 leaves its accumulators here for warpgroup 0, [MWG - 1][BN / 2][128] floats after the
    // barriers (the host counts them in the shared memory size)
    float* red = reinterpret_cast<float*>(smem + L::kBytes);

    const int rank = CLUSTER > 1 ? (int)(blockIdx.x % CLUSTER) : 0;
    const int kblocks = (K + kRow - 1) / kRow;
    // work units: tiles (pairs with CLUSTER 2), each cut into `splits` ranges of whole K blocks (1 <= splits <=
    // kblocks, the host sees to it); unit u is split u % splits of tile u / splits
    // Tail split (tail > 1, splits == 1, no cluster): the tiles that fill whole rounds of the grid run whole; the
    // `rem` left for a last, partly empty round are each cut into `tail` K ranges, so that round's units are
    // 1 / tail as long. Their fp32 partials go to ws as [rem * tail][BM x BN] (unit-major, each tile's rows whole),
    // summed in range order into C by gemm_fp8_tail_sum.
    const int step = gridDim.x / CLUSTER, first = blockIdx.x / CLUSTER;
    const int tiles = (M + BM - 1) / BM * ((N + BN * CLUSTER - 1) / (BN * CLUSTER));
    const int tail_parts = CLUSTER == 1 && splits == 1 && tail > 1 ? tail : 1;
    const int rem = tail_parts > 1 ? tiles % step : 0, whole = tiles - rem;
    const int units = tail_parts > 1 ? whole + rem * tail_parts : tiles * splits;
    // unit u -> its tile, K block range and split sp; slab >= 0: a tail unit's partial slab in ws, else -1
    auto tile = [&](int u, int& m0, int& n0, int& kb0, int& kb1, int& sp, int& slab) {
        int t, parts;
        slab = -1;
        if (u < whole || tail_parts == 1) {
            parts = splits;
            t = u / splits;
            sp = u - t * splits;
        } else {
            parts = tail_parts;
            slab = u - whole;
            t = whole + slab / tail_parts;
            sp = slab % tail_parts;
        }
        kb0 = (int)((long long)sp * kblocks / parts);
        kb1 = (int)((long long)(sp + 1) * kblocks / parts);
        tile_of<BM, BN * CLUSTER>(t, M, N, m0, n0);
        n0 += rank * BN;
    };
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4 * kRowWGs * CLUSTER);   // one arrival per warp that reads the stage
        }
        mbar_init_fence();
    }
    if constexpr (CLUSTER > 1) {
        cluster_sync();                         // the other block's barriers exist before anything reaches them
    } else {
        __syncthreads();
    }

    if (warp < 4) {                             // the copy warpgroup: warp 0 fills the ring, the others idle
        // (one math warpgroup: 256 threads have every register they can use without moving any)
        if constexpr (MWG > 1) tma::release_registers<kCopyRegs>();
        if (warp == 0) {
            if (lane == 0) {
                tma::prefetch(&tma_a);
                tma::prefetch(&tma_b);
            }
            int it = 0;                         // K blocks copied so far, over every tile of this block
            for (int u = first; u < units; u += step) {
                int m0, n0, kb0, kb1, sp, slab;
                tile(u, m0, n0, kb0, kb1, sp, slab);
                for (int kb = kb0; kb < kb1; ++kb, ++it) {
                    const int s = it % STAGES, round = it / STAGES;
                    if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                    // SB_ROWS: the stage's B scales by one bulk copy, counted in its bytes: the columns n0 ..
                    // n0 + BN - 1 of K block kb's row, cut at N rounded up to 4 floats (none for a cluster's second
                    // tile past N). The host passes them column-contiguous (sb_n == 1), 16-byte aligned, sb_k a
                    // multiple of 4, and each row readable up to that rounded N.
                    const int n_end = (N + 3) & ~3;
                    const unsigned sb_bytes = SB_ROWS && n0 < N ? (unsigned)min(BN, n_end - n0) * 4u : 0u;
                    // the A scales of the tile's rows for K block kb, one bulk copy of their row of the M-major
                    // scales (sa_m == 1, sa_k a multiple of 4, 16-byte aligned, rows readable up to M rounded up
                    // to 4: quantize_fp8_dual's layout, or the host's copy into it)
                    const unsigned sa_bytes = (unsigned)min(BM, ((M + 3) & ~3) - m0) * 4u;
                    if (lane == 0) {
                        tma::expect_bytes(&full[s], (BM + BN) * kRow + sa_bytes + sb_bytes);
                        if constexpr (CLUSTER > 1) {
                            constexpr int kPart = BM / CLUSTER;
                            tma::load_2d_multicast(stage_a(s) + rank * kPart * kRow, &tma_a, kb * kRow,
                                                   m0 + rank * kPart, &full[s], (unsigned short)((1u << CLUSTER) - 1));
                        } else {
                            tma::load_2d(stage_a(s), &tma_a, kb * kRow, m0, &full[s]);
                        }
                        tma::load_2d(stage_b(s), &tma_b, kb * kRow, n0, &full[s]);
                        tma::load_1d(stage_sa(s), sa + (long long)kb * sa_k + m0, sa_bytes, &full[s]);
                        if (sb_bytes) tma::load_1d(stage_sb(s), sb + (long long)kb * sb_k + n0, sb_bytes, &full[s]);
                    }
                    if (lane == 0) mbar_arrive(&full[s]);
                }
            }
        }
    } else {
        if constexpr (MWG > 1) tma::claim_registers<kMathRegs>();
        // math warpgroup 0 .. MWG - 1. Read through a shuffle, the compiler keeps it (and the descriptors made from it)
        // in uniform registers; two slabs with per-column B scales and fp32 output leave no room for that (an
        // 8-byte spill)
        constexpr bool kVectorCg = SB_ROWS && SLABS == 2 && sizeof(OT) == 4;
        const int cg = kVectorCg ? warp / 4 - 1 : __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
        const int rows_wg = KSPLIT ? 0 : cg;   // the warpgroup's rows: its own, or (KSPLIT) the one shared slab
        const int col_in_8 = 2 * (lane & 3);
        float acc[SLABS][kR], part[kR], next[kR];
#pragma unroll
        for (int e = 0; e < kR; ++e) part[e] = next[e] = 0.0f;
        auto wait_full = [&](int i) { mbar_wait(&full[i % STAGES], (i / STAGES) & 1); };
        // The descriptors are built from their low 32-bit words (wgmma::desc_sw128_word): each k step adds to a
        // stage's word in 32 bits, where 64-bit descriptor arithmetic cost an add with carry and two register moves
        // per step (256 x 128 tile at 4096 x 7168 x 16384: 994 -> 1113 TFLOP/s, H100, one run). The path from one
        // slab's wait to the next slab's wgmma is what limits this kernel: each instruction taken out of it counts.
        const unsigned smem16 = smem_u32(smem) >> 4;
        auto issue = [&](float (&p)[kR], int s, int slab) {     // slab's 4 k32 steps of stage s, fresh partials
            const unsigned wa =
                wgmma::desc_sw128_word(smem16 + (unsigned)(s * (L::kTileBytes >> 4) + (slab * 64 * kRow >> 4)));
            const unsigned wb = wa - (unsigned)(slab * 64 * kRow >> 4) + (unsigned)(BM * kRow >> 4);
            const unsigned long long da = wgmma::desc_of_word(wa), db = wgmma::desc_of_word(wb);
            if constexpr (PIPE) {
                // the two partial sets alternate with one in flight: a write-only first step makes each issue a
                // new value, so the compiler never copies a set a wgmma still owns (ptxas would answer such a
                // copy by serializing every wgmma); one set (!PIPE) keeps the read-write form, which spills less
                wgmma::fence();
                if constexpr (BN == 64) {
                    mma_m64n64k32_fresh(p, da, db);
                } else {
                    wgmma::mma_m64n128k32_fresh(p, da, db);
                }
            } else {
                wgmma::fence_operands(p);
                wgmma::fence();
                wgmma::mma_n<BN>::run(p, da, db, 0);
            }
#pragma unroll
            for (int ks = 1; ks < kRow / wgmma::kStepK; ++ks)
                wgmma::mma_n<BN>::run(p, wgmma::desc_of_word(wa + ks * (wgmma::kStepK >> 4)),
                                      wgmma::desc_of_word(wb + ks * (wgmma::kStepK >> 4)), 1);
            wgmma::commit();
        };
        // the tile's B scales 32 K blocks at a time, one per lane (lane l: K block 32 g + l), read with a shuffle:
        // a per-lane address keeps the compiler from moving the value into a uniform register right after its
        // load (which waited out the load's latency every K block); the next group is loaded 16 blocks ahead.
        // BN 192: the same for the next 128-column scale block, which the tile's last columns fall in.
        constexpr bool kTwoB = !SB_ROWS && BN == 192;
        const float* tile_sb = sb;
        const float* tile_sb2 = sb;
        float b_grp = 0.0f, b_next = 0.0f, b_grp2 = 0.0f, b_next2 = 0.0f;
        int split = 16;                         // kTwoB: the tile's 8-column groups in its first scale block
        auto fetch_b = [&](const float* t, int kb_first) {
            return ld_scale(t + (long long)min(kb_first + lane, kblocks - 1) * sb_k);
        };
        struct b_scales { float b0, b1; };
        int kb_base = 0, nkb = kblocks;         // the unit's first K block and its count
        auto b_at = [&](int kb) {               // kb counted from the unit's first K block
            b_scales v{0.0f, 0.0f};
            if constexpr (!SB_ROWS) {
                if ((kb & 31) == 16 && kb + 16 < nkb) {
                    b_next = fetch_b(tile_sb, kb_base + kb + 16);
                    if constexpr (kTwoB) b_next2 = fetch_b(tile_sb2, kb_base + kb + 16);
                }
                if ((kb & 31) == 0 && kb > 0) {
                    b_grp = b_next;
                    if constexpr (kTwoB) b_grp2 = b_next2;
                }
                v.b0 = __shfl_sync(0xffffffffu, b_grp, kb & 31);
                if constexpr (kTwoB) v.b1 = __shfl_sync(0xffffffffu, b_grp2, kb & 31);
            }
            return v;
        };
        // the A scales of this thread's two rows of slab j, from stage s (they came with its copies): read from
        // shared memory, no global load is in flight when the next wgmma is issued (the math warps used to load
        // them from global memory, and the wgmma fence appeared to wait for those loads)
        const int row_in_slab = (warp & 3) * 16 + (lane >> 2);
        struct row_scales { float r[SLABS][2]; };
        auto scales_of = [&](int s) {
            row_scales v;
#pragma unroll
            for (int j = 0; j < SLABS; ++j) {
                const float* p = stage_sa(s) + (rows_wg * SLABS + j) * 64 + row_in_slab;
                v.r[j][0] = p[0];
                v.r[j][1] = p[8];
            }
            return v;
        };
        auto promote_with = [&](float (&p)[kR], int s, int j, const row_scales& sc, b_scales bsc) {
            wgmma::fence_operands(p);
            if constexpr (kTwoB) {
                promote_192(acc[j], p, sc.r[j][0], sc.r[j][1], bsc.b0, bsc.b1, split);
            } else {
                promote_rows<SB_ROWS, kR>(acc[j], p, sc.r[j][0], sc.r[j][1], stage_sb(s) + col_in_8, bsc.b0);
            }
        };
        auto release = [&](int s) {             // this warp's wgmmas and scale reads of stage s are done
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(&empty[s]);
                if constexpr (CLUSTER > 1)
                    for (int r = 1; r < CLUSTER; ++r) mbar_arrive_remote(&empty[s], (rank + r) % CLUSTER);
            }
        };
        int it = 0;                             // K blocks consumed so far (PIPE)
        int ring_s = 0;                         // !PIPE: the ring stage of the next K block, and its phase
        unsigned ring_ph = 0;
        for (int u = first; u < units; u += step) {
            int m0, n0, kb1, sp, slab;
            tile(u, m0, n0, kb_base, kb1, sp, slab);
            nkb = kb1 - kb_base;
#pragma unroll
            for (int e = 0; e < kR; ++e) {
#pragma unroll
                for (int j = 0; j < SLABS; ++j) acc[j][e] = 0.0f;
            }
            // (rows past M multiply zero-filled A rows by whatever scales their smem slots hold; never stored)
            if constexpr (!SB_ROWS) {
                const int nb = min(n0, N - 1) / 128;
                tile_sb = sb + (long long)nb * sb_n;
                b_grp = fetch_b(tile_sb, kb_base);
                if constexpr (kTwoB) {          // (a block past N: the last one's scales, for columns never stored)
                    tile_sb2 = sb + (long long)min(nb + 1, (N - 1) / 128) * sb_n;
                    b_grp2 = fetch_b(tile_sb2, kb_base);
                    split = (128 - (n0 & 127)) / 8;
                }
            }
            if constexpr (!PIPE) {
                // K blocks in groups of 32, one B scale per lane: the next group's scales are loaded when a group
                // starts, so the rare load sits outside the loop that issues the wgmmas, and that loop keeps its
                // ring stage and barrier phase in two counters (no division by STAGES). Its head went from 67 to
                // 30 instructions in the 256 x 128 build (4096 x 7168 x 16384: 1076 -> 1112 TFLOP/s, H100, one run)
                const int group = SB_ROWS ? nkb : 32;         // (per-row B scales come with the stage)
                for (int g = 0; g < nkb; g += group) {
                    float nx = 0.0f, nx2 = 0.0f;
                    if constexpr (!SB_ROWS) {
                        if (g + 32 < nkb) {
                            nx = fetch_b(tile_sb, kb_base + g + 32);
                            if constexpr (kTwoB) nx2 = fetch_b(tile_sb2, kb_base + g + 32);
                        }
                    }
                    const int n = min(nkb - g, group);
                    for (int i = 0; i < n; ++i) {
                        b_scales bsc{0.0f, 0.0f};
                        if constexpr (!SB_ROWS) {
                            bsc.b0 = __shfl_sync(0xffffffffu, b_grp, i);
                            if constexpr (kTwoB) bsc.b1 = __shfl_sync(0xffffffffu, b_grp2, i);
                        }
                        if (!KSPLIT || ring_s % MWG == cg) {
                            mbar_wait(&full[ring_s], ring_ph);
                            row_scales sc;
#pragma unroll
                            for (int j = 0; j < SLABS; ++j) {
                                issue(part, ring_s, rows_wg * SLABS + j);
                                if (j == 0) sc = scales_of(ring_s);     // read while the first wgmmas run
                                wgmma::wait<0>();
                                promote_with(part, ring_s, j, sc, bsc);
                            }
                            release(ring_s);
                        }
                        if (++ring_s == STAGES) {
                            ring_s = 0;
                            ring_ph ^= 1u;
                        }
                    }
                    b_grp = nx;
                    if constexpr (kTwoB) b_grp2 = nx2;
                }
            } else {
                // K block kb in flight in `cur`: issue kb + 1 into `nxt`, then promote kb. Every path through the
                // loop keeps one group in flight at the loop head (the last K blocks are peeled), so ptxas can
                // prove the promotion reads only finished accumulators and keeps the wgmmas asynchronous.
                auto steady = [&](int kb, float (&cur)[kR], float (&nxt)[kR]) {
                    const int s = it % STAGES;
                    const b_scales bsc = b_at(kb);
                    wait_full(it + 1);
                    issue(nxt, (it + 1) % STAGES, cg);
                    const row_scales sc = scales_of(s);     // read while the wgmmas run
                    wgmma::wait<1>();
                    promote_with(cur, s, 0, sc, bsc);
                    release(s);
                    ++it;
                };
                auto last = [&](int kb, float (&cur)[kR]) {
                    const int s = it % STAGES;
                    const b_scales bsc = b_at(kb);
                    const row_scales sc = scales_of(s);
                    wgmma::wait<0>();
                    promote_with(cur, s, 0, sc, bsc);
                    release(s);
                    ++it;
                };
                wait_full(it);
                issue(part, it % STAGES, cg);
                int kb = 0;
                for (; kb + 2 < nkb; kb += 2) {
                    steady(kb, part, next);
                    steady(kb + 1, next, part);
                }
                if (kb + 1 < nkb) {
                    steady(kb, part, next);
                    last(kb + 1, next);
                } else {
                    last(kb, part);
                }
            }
            if constexpr (KSPLIT) {
                // warpgroups 1 .. MWG - 1 hand their accumulators to warpgroup 0 through shared memory (thread t of
                // each holds the same fragment elements), which adds them in warpgroup order and stores the tile;
                // the others go on to their next unit once it has read them
                const int t = threadIdx.x & 127;
                if (cg > 0) {
                    float* r = red + (cg - 1) * kR * 128;
#pragma unroll
                    for (int e = 0; e < kR; e += 4)
                        store_vec<4>(r + e * 128 + 4 * t, vec<float, 4>{{acc[0][e], acc[0][e + 1], acc[0][e + 2],
                                                                         acc[0][e + 3]}});
                }
                wgmma::bar_sync<2, 128 * MWG>();
                if (cg == 0) {
#pragma unroll
                    for (int w = 0; w < MWG - 1; ++w) {
#pragma unroll
                        for (int e = 0; e < kR; e += 4) {
                            const vec<float, 4> v = load_vec<4>(red + w * kR * 128 + e * 128 + 4 * t);
#pragma unroll
                            for (int q = 0; q < 4; ++q) acc[0][e + q] += v[q];
                        }
                    }
                }
                wgmma::bar_sync<3, 128 * MWG>();
                if (cg > 0) continue;
            }
            if (slab >= 0) {                    // a tail unit: its fp32 partials, the whole BM x BN tile row-major
                float* w = ws + (long long)slab * BM * BN;
#pragma unroll
                for (int j = 0; j < SLABS; ++j) {
                    const int r0 = (rows_wg * SLABS + j) * 64 + (warp & 3) * 16 + (lane >> 2);
#pragma unroll
                    for (int q = 0; q < kR / 4; ++q) {
                        const int col = 8 * q + col_in_8;
                        store_vec<2>(w + (long long)r0 * BN + col, vec<float, 2>{{acc[j][4 * q], acc[j][4 * q + 1]}});
                        store_vec<2>(w + (long long)(r0 + 8) * BN + col,
                                     vec<float, 2>{{acc[j][4 * q + 2], acc[j][4 * q + 3]}});
                    }
                }
                continue;
            }
            if (splits > 1) {                   // fp32 partials of split sp, laid out as C (or C^T)
                float* w = ws + (long long)sp * M * N;
                const long long ldw = TRANS_C ? M : N;
#pragma unroll
                for (int j = 0; j < SLABS; ++j) {
                    const int r0 = m0 + (rows_wg * SLABS + j) * 64 + (warp & 3) * 16 + (lane >> 2);
#pragma unroll
                    for (int q = 0; q < kR / 4; ++q) {
                        const int col = n0 + 8 * q + col_in_8;
                        store_pair<float>(w, ldw, r0, col, acc[j][4 * q], acc[j][4 * q + 1], M, N, TRANS_C,
                                          (ldw & 1) == 0);
                        store_pair<float>(w, ldw, r0 + 8, col, acc[j][4 * q + 2], acc[j][4 * q + 3], M, N, TRANS_C,
                                          (ldw & 1) == 0);
                    }
                }
                continue;
            }
#pragma unroll
            for (int j = 0; j < SLABS; ++j) {
                const int r0 = m0 + (rows_wg * SLABS + j) * 64 + (warp & 3) * 16 + (lane >> 2);
                if constexpr (sizeof(OT) == 2 && !TRANS_C) {
                    store_fragment16<OT, VEC_OUT, kR>(c, ldc, acc[j], r0, n0, M, N, lane);
                } else {
#pragma unroll
                    for (int q = 0; q < kR / 4; ++q) {
                        const int col = n0 + 8 * q + col_in_8;
                        store_pair<OT>(c, ldc, r0, col, acc[j][4 * q], acc[j][4 * q + 1], M, N, TRANS_C, VEC_OUT);
                        store_pair<OT>(c, ldc, r0 + 8, col, acc[j][4 * q + 2], acc[j][4 * q + 3], M, N, TRANS_C,
                                       VEC_OUT);
                    }
                }
            }
        }
    }
    // no block leaves while the other may still multicast into its ring or arrive on its barriers
    if constexpr (CLUSTER > 1) cluster_sync();
#else
    (void)tma_a; (void)tma_b; (void)c; (void)ws; (void)splits; (void)tail; (void)sa; (void)sb; (void)M; (void)N;
    (void)K;
    (void)ldc; (void)sa_m; (void)sa_k; (void)sb_n; (void)sb_k;
    unsupported_on_target();   // TMA and wgmma need sm_90a: the host never launches this elsewhere
#endif
}

}  // namespace gemm8_sm90

// One block per tile pass (launched with at most one block per multiprocessor).
template <class OT, int SLABS, int BN, int STAGES, bool PIPE, bool SB_ROWS, bool TRANS_C, bool VEC_OUT>
__launch_bounds__(384, 1) __global__ void gemm_fp8_blockwise_tma_kernel(
    ROCJIT_GRID_CONSTANT const tensor_map tma_a, ROCJIT_GRID_CONSTANT const tensor_map tma_b, OT* __restrict__ c,
    float* __restrict__ ws, int splits, int tail, const float* __restrict__ sa, const float* __restrict__ sb, int M,
    int N, int K, long long ldc, long long sa_m, long long sa_k, long long sb_n, long long sb_k) {
    gemm8_sm90::tma_gemm<OT, SLABS, BN, STAGES, PIPE, 1, SB_ROWS, TRANS_C, VEC_OUT>(
        tma_a, tma_b, c, ws, splits, tail, sa, sb, M, N, K, ldc, sa_m, sa_k, sb_n, sb_k);
}

// The same in clusters of 2 blocks sharing each A tile (the grid a multiple of 2).
template <class OT, int SLABS, int BN, int STAGES, bool PIPE, bool SB_ROWS, bool TRANS_C, bool VEC_OUT>
__launch_bounds__(384, 1) __global__ void __attribute__((ROCJIT_CLUSTER_DIMS(2))) gemm_fp8_blockwise_tma2_kernel(
    ROCJIT_GRID_CONSTANT const tensor_map tma_a, ROCJIT_GRID_CONSTANT const tensor_map tma_b, OT* __restrict__ c,
    float* __restrict__ ws, int splits, int tail, const float* __restrict__ sa, const float* __restrict__ sb, int M,
    int N, int K, long long ldc, long long sa_m, long long sa_k, long long sb_n, long long sb_k) {
    gemm8_sm90::tma_gemm<OT, SLABS, BN, STAGES, PIPE, 2, SB_ROWS, TRANS_C, VEC_OUT>(
        tma_a, tma_b, c, ws, splits, tail, sa, sb, M, N, K, ldc, sa_m, sa_k, sb_n, sb_k);
}

// One math warpgroup of one m64 slab: 64 x BN tiles, 256 threads. For products of at most 64 rows (a 128-row tile
// multiplies as many dead rows as live ones there) and of few rows against many columns, where twice the tiles of a
// 128-row tile fill the multiprocessors without split-K (128 x 4096 on 64 x 64 tiles: 128 of them).
template <class OT, int BN, int STAGES, bool PIPE, bool SB_ROWS, bool TRANS_C, bool VEC_OUT>
__launch_bounds__(256, 1) __global__ void gemm_fp8_blockwise_tma1_kernel(
    ROCJIT_GRID_CONSTANT const tensor_map tma_a, ROCJIT_GRID_CONSTANT const tensor_map tma_b, OT* __restrict__ c,
    float* __restrict__ ws, int splits, int tail, const float* __restrict__ sa, const float* __restrict__ sb, int M,
    int N, int K, long long ldc, long long sa_m, long long sa_k, long long sb_n, long long sb_k) {
    gemm8_sm90::tma_gemm<OT, 1, BN, STAGES, PIPE, 1, SB_ROWS, TRANS_C, VEC_OUT, 1>(
        tma_a, tma_b, c, ws, splits, tail, sa, sb, M, N, K, ldc, sa_m, sa_k, sb_n, sb_k);
}

// KWG math warpgroups on one m64 slab, taking turns over its K blocks: 64 x BN tiles, 128 (KWG + 1) threads. For
// products of at most 64 rows, where one warpgroup per tile leaves the tensor cores idle through each of its waits
// and promotions: KWG chains per tile, summed in the block (H200: 5 - 15% faster than gemm_fp8_blockwise_tma1_kernel
// on the same tiles and K ranges at five DeepSeek-V3 shapes, NT and TN; the host offers KWG = 2, three were no
// faster).
template <class OT, int KWG, int BN, int STAGES, bool SB_ROWS, bool TRANS_C, bool VEC_OUT>
__launch_bounds__(128 * (KWG + 1), 1) __global__ void gemm_fp8_blockwise_tmak_kernel(
    ROCJIT_GRID_CONSTANT const tensor_map tma_a, ROCJIT_GRID_CONSTANT const tensor_map tma_b, OT* __restrict__ c,
    float* __restrict__ ws, int splits, int tail, const float* __restrict__ sa, const float* __restrict__ sb, int M,
    int N, int K, long long ldc, long long sa_m, long long sa_k, long long sb_n, long long sb_k) {
    gemm8_sm90::tma_gemm<OT, 1, BN, STAGES, false, 1, SB_ROWS, TRANS_C, VEC_OUT, KWG, true>(
        tma_a, tma_b, c, ws, splits, tail, sa, sb, M, N, K, ldc, sa_m, sa_k, sb_n, sb_k);
}

// Three math warpgroups of one m64 slab each: 192 x 128 tiles, 512 threads. While one warpgroup promotes its
// partials, two keep the tensor cores fed, where with two a promotion that takes longer than the other warpgroup's
// wgmmas leaves them idle: the case of per-row B scales (wgrad), whose promotion multiplies twice per element.
template <class OT, int STAGES, bool SB_ROWS, bool TRANS_C, bool VEC_OUT>
__launch_bounds__(512, 1) __global__ void gemm_fp8_blockwise_tma3_kernel(
    ROCJIT_GRID_CONSTANT const tensor_map tma_a, ROCJIT_GRID_CONSTANT const tensor_map tma_b, OT* __restrict__ c,
    float* __restrict__ ws, int splits, int tail, const float* __restrict__ sa, const float* __restrict__ sb, int M,
    int N, int K, long long ldc, long long sa_m, long long sa_k, long long sb_n, long long sb_k) {
    gemm8_sm90::tma_gemm<OT, 1, 128, STAGES, false, 1, SB_ROWS, TRANS_C, VEC_OUT, 3>(
        tma_a, tma_b, c, ws, splits, tail, sa, sb, M, N, K, ldc, sa_m, sa_k, sb_n, sb_k);
}

// Split-K's second kernel: C (or C^T), contiguous, = the sum of the splits' fp32 partials ws [splits, rows x cols],
// added in split order, so the result does not depend on which split finished first. VEC: 8 elements per thread,
// two 16-byte loads per split and 16-byte stores (rows x cols a multiple of 8, so every split's slab is 32-byte
// aligned, and c 16-byte aligned: the host sees to both and sizes the grid to match); the same sums in the same
// order as one element per thread, which ran at a third of the memory's speed on these L2-resident partials.
template <class OT, bool VEC>
__global__ void gemm_fp8_splitk_sum(const float* __restrict__ ws, OT* __restrict__ c, int splits, int rows,
                                    int cols) {
    const long long n = (long long)rows * cols;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if constexpr (VEC) {
        const long long i = t * 8;
        if (i >= n) return;
        float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < splits; ++s) {
            const vec<float, 4> lo = load_vec<4>(ws + s * n + i), hi = load_vec<4>(ws + s * n + i + 4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                v[e] += lo[e];
                v[4 + e] += hi[e];
            }
        }
        if constexpr (sizeof(OT) == 4) {
            store_vec<4>(c + i, vec<OT, 4>{{from_float<OT>(v[0]), from_float<OT>(v[1]), from_float<OT>(v[2]),
                                            from_float<OT>(v[3])}});
            store_vec<4>(c + i + 4, vec<OT, 4>{{from_float<OT>(v[4]), from_float<OT>(v[5]), from_float<OT>(v[6]),
                                                from_float<OT>(v[7])}});
        } else {
            vec<OT, 8> o;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = from_float<OT>(v[e]);
            store_vec<8>(c + i, o);
        }
    } else {
        if (t >= n) return;
        float v = 0.0f;
        for (int s = 0; s < splits; ++s) v += ws[s * n + t];
        c[t] = from_float<OT>(v);
    }
}

// Tail split's second kernel: tile full + blockIdx.y of the TMA kernel's BM x BN tiles (the same grouped raster) =
// the sum of its `parts` fp32 partial slabs ws [(blockIdx.y * parts + p)][BM x BN], added in range order, into C
// (or C^T), rows past M and columns past N dropped.
template <class OT, int BM, int BN, bool TRANS_C>
__global__ void gemm_fp8_tail_sum(const float* __restrict__ ws, OT* __restrict__ c, int full, int parts, int M, int N,
                                  long long ldc) {
    int m0, n0;
    gemm8_sm90::tile_of<BM, BN>(full + (int)blockIdx.y, M, N, m0, n0);
    const float* w = ws + (long long)blockIdx.y * parts * BM * BN;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < BM * BN; e += gridDim.x * blockDim.x) {
        const int m = m0 + e / BN, n = n0 + e % BN;
        if (m >= M || n >= N) continue;
        float v = 0.0f;
        for (int p = 0; p < parts; ++p) v += w[(long long)p * BM * BN + e];
        if (TRANS_C) c[(long long)n * ldc + m] = from_float<OT>(v);
        else c[(long long)m * ldc + n] = from_float<OT>(v);
    }
}

// The TMA kernel's scale layout (each K block's R scales contiguous, R rounded up to 4 and zero-filled: one bulk
// copy per K block) from scales of any strides: out [KB, R4], out[kb][r] = s[r * sr + kb * sk] for r < R, else 0.
// The op's launch for scales in another layout (e.g. quantize_fp8(granularity="block")'s row-major ones), so that a
// call that needs it is still one an eager plan replays.
__global__ void gemm_fp8_scales_kblock_rows(const float* __restrict__ s, long long sr, long long sk,
                                            float* __restrict__ out, int R, int KB, int R4) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)KB * R4) return;
    const int kb = (int)(i / R4), r = (int)(i - (long long)kb * R4);
    out[i] = r < R ? s[(long long)r * sr + (long long)kb * sk] : 0.0f;
}

// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 128, 128, 6, true, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 128, 128, 4, false, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 64, 128, 4, false, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__hip_bfloat16, 128, 256, 4, false, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<float, 64, 128, 4, false, false, true, true, false>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<float, 128, 128, 6, true, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<float, 128, 256, 4, false, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_sm90_kernel<__half, 128, 256, 4, false, false, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 2, 128, 4, false, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma2_kernel<__hip_bfloat16, 2, 128, 4, false, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma2_kernel<__hip_bfloat16, 2, 128, 4, false, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 2, 128, 4, false, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<float, 2, 128, 4, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 128, 6, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma2_kernel<__hip_bfloat16, 1, 128, 6, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 128, 6, false, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma2_kernel<float, 1, 128, 6, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__half, 1, 128, 6, false, true, false, false>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 128, 6, true, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 192, 5, false, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<float, 1, 192, 5, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__half, 1, 192, 5, false, true, false, false>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 64, 8, false, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 64, 8, false, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma_kernel<float, 1, 64, 8, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, 64, 12, false, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, 64, 12, false, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<float, 64, 12, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, 64, 12, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, 64, 12, true, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, 128, 8, false, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, 128, 8, true, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, 128, 8, true, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma1_kernel<float, 128, 8, false, true, true, true>
// rocjit:check gemm_fp8_blockwise_tmak_kernel<__hip_bfloat16, 2, 64, 12, false, false, true>
// rocjit:check gemm_fp8_blockwise_tmak_kernel<__hip_bfloat16, 2, 64, 12, true, false, true>
// rocjit:check gemm_fp8_blockwise_tmak_kernel<float, 2, 64, 12, true, true, true>
// rocjit:check gemm_fp8_blockwise_tmak_kernel<__half, 2, 64, 12, false, false, false>
// rocjit:check gemm_fp8_blockwise_tmak_kernel<__hip_bfloat16, 2, 128, 6, false, false, true>
// rocjit:check gemm_fp8_blockwise_tmak_kernel<__hip_bfloat16, 2, 128, 6, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma3_kernel<__hip_bfloat16, 5, false, false, true>
// rocjit:check gemm_fp8_blockwise_tma3_kernel<__hip_bfloat16, 5, true, false, true>
// rocjit:check gemm_fp8_blockwise_tma3_kernel<float, 5, true, true, true>
// rocjit:check gemm_fp8_blockwise_tma3_kernel<__half, 5, false, false, false>
// rocjit:check gemm_fp8_splitk_sum<__hip_bfloat16, true>
// rocjit:check gemm_fp8_splitk_sum<float, true>
// rocjit:check gemm_fp8_splitk_sum<__half, true>
// rocjit:check gemm_fp8_splitk_sum<__hip_bfloat16, false>
// rocjit:check gemm_fp8_splitk_sum<float, false>
// rocjit:check gemm_fp8_tail_sum<__hip_bfloat16, 256, 128, false>
// rocjit:check gemm_fp8_tail_sum<float, 192, 128, true>
// rocjit:check gemm_fp8_tail_sum<__half, 128, 192, false>
// rocjit:check gemm_fp8_scales_kblock_rows
