// FP8 quantization of fp16/bf16 activations and weights. Scales are fp32 dequantization
// multipliers (x ~= q * s), s = amax / fp8 max, q = saturate(x / s).
//   quant_rows_kernel:   per-tensor (static scale, or dynamic from amax_kernel partials) and
//                        per-token (row kept in registers between its amax and the quantization)
//   amax_kernel:         per-block partial maxima of |x| for the dynamic per-tensor scale
//   quant_blocks_kernel: 1x128 row blocks, 128x1 column blocks, 128x128 tiles, or 1x128 and
//                        128x1 together from ONE read of x (the "dual" quantization); optionally of act(x)
//                        or of g * act'(x) (an MLP's activation, forward or backward, fused into the read)
// Every kernel here waits for the kernel ahead of it before touching memory (grid_dependency_sync):
// rocjit may launch them to overlap that kernel's tail (programmatic dependent launch, sm_90+).
// rocjit:pdl
#include <hip/hip_runtime.h>
#include "rocjit/chunk.h"
#include "rocjit/device.h"
#include "rocjit/mma_fp8.h"
#include "rocjit/warp.h"
#include "rocjit/stream.h"

using namespace rocjit;

constexpr int kQuantDynamicTensor = 3;  // scale from amax_kernel's partial maxima

template <class T, class F, int kQuant, int kRowThreads, int kBlock, int kChunks, bool kAligned>
__launch_bounds__(kBlock) __global__ void quant_rows_kernel(unsigned char* q, float* scales, const T* x,
                                                            const float* scale_in, int rows, int hidden,
                                                            int tiles_per_row, int num_partials) {
    static_assert(kRowThreads <= kWaveSize || kRowThreads == kBlock, "a row spans a wave or the whole block");
    grid_dependency_sync();
    constexpr int kGroupsPerBlock = kBlock / kRowThreads;
    __shared__ float scratch[1024 / kWaveSize];
    float out_mul = 1.0f;
    if (kQuant == kQuantStatic) out_mul = 1.0f / *scale_in;
    if (kQuant == kQuantDynamicTensor) {
        float m = 0.0f;
        for (int i = threadIdx.x; i < num_partials; i += kBlock) m = fmaxf(m, scale_in[i]);
        m = fmaxf(block_max(m, scratch), kMinAmax);
        out_mul = F::max / m;
        if (blockIdx.x == 0 && threadIdx.x == 0) scales[0] = m / F::max;
    }
    const int group = blockIdx.x * kGroupsPerBlock + threadIdx.x / kRowThreads;  // rows * tiles < 2^31
    const int row = group / tiles_per_row;
    const int tile = group % tiles_per_row;
    const int lane = threadIdx.x % kRowThreads;
    const bool valid = row < rows;
    const long long base = (long long)row * hidden;

    float v[kChunks][kChunk];
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = ((tile * kChunks + c) * kRowThreads + lane) * kChunk;
        chunk_t<T> h = zero_chunk<T>();
        if (valid && col < hidden) h = load_chunk<kAligned, true>(x + base, col, hidden);
        chunk_to_float(h, v[c]);
        if (kQuant == kQuantToken) {
#pragma unroll
            for (int i = 0; i < kChunk; ++i) amax = fmaxf(amax, fabsf(v[c][i]));
        }
    }
    if (kQuant == kQuantToken) {
        amax = fmaxf(row_reduce<MaxOp, kRowThreads>(amax, scratch), kMinAmax);
        out_mul = F::max / amax;
        if (valid && lane == 0) scales[row] = amax / F::max;
    }
    if (!valid) return;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = ((tile * kChunks + c) * kRowThreads + lane) * kChunk;
        if (col >= hidden) break;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[c][i] *= out_mul;
        unsigned int lo, hi;
        float8_to_fp8x8<F>(v[c], lo, hi);
        store_fp8_chunk<kAligned, true>(q + base, col, hidden, lo, hi);
    }
}

// Partial maxima of |x| over a flat tensor of n elements, one per block.
template <class T, int kBlock, bool kAligned>
__launch_bounds__(kBlock) __global__ void amax_kernel(float* partials, const T* x, long long n) {
    grid_dependency_sync();
    __shared__ float scratch[1024 / kWaveSize];
    float m = 0.0f;
    const long long chunks = (n + kChunk - 1) / kChunk;
    for (long long c = (long long)blockIdx.x * kBlock + threadIdx.x; c < chunks; c += (long long)gridDim.x * kBlock) {
        const long long start = c * kChunk;
        const int left = n - start < kChunk ? (int)(n - start) : kChunk;
        float f[kChunk];
        chunk_to_float(load_chunk<kAligned, true>(x + start, 0, left), f);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) m = fmaxf(m, fabsf(f[i]));
    }
    m = block_max(m, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

// The activation fused into the block quantizers (kAct): they quantize act(x) or, with kGrad, g * act'(x) (the
// activation's backward for the upstream gradient g, x being its input), each value rounded to T before its block's
// maximum is taken -- what quantizing torch's gelu / gelu_backward / silu / relu output in T gives, up to the last
// bits of fp32. torch's formulas call erff / tanhf / expf and an IEEE division: 24 - 44 SASS instructions per
// element on top of the quantization's 37 (sm_90a, the streamed kernel), and this kernel is instruction-bound (on
// the H200 each instruction per element cost about 4.5 us at 8192 x 14336). So every activation here is one
// hardware exp2 (two in GELU's backward) and one hardware reciprocal (rocjit::fast_exp2 / fast_rcp) with FMAs:
// - GELU: Phi(-|z|) = erfc(x) / 2, x = |z| / sqrt(2), by the Chebyshev fit of Numerical Recipes' erfcc,
//   t exp(-x^2 + P(t)) with t = 1 / (1 + x / 2) and P of degree 9 (relative error < 1.2e-7 at every x), the 1/2,
//   the natural log's base and -x^2 folded into one exp2 argument; Phi(z) = 1 - Phi(-z) for z >= 0. The tail is
//   taken directly, so it keeps its relative accuracy where fp32's 1 + erff(z) cancels (torch's GELU in fp32 is
//   off by up to ~5e-5 relative at |GELU| >= 1e-3, this one by ~1.3e-6). The backward adds z exp(-z^2 / 2) /
//   sqrt(2 pi): a second exp2.
// - tanh-GELU: 1 +- tanh(u) from e = exp(-2 |u|) in (0, 1] (below). SiLU: rocjit::sigmoid (as swiglu).
// Errors stay near 1e-6 relative, far under a 16-bit T's rounding step: a value rounds to torch's T value unless
// one of the two lies within about that of a rounding boundary. act(0) = 0 and a zero gradient stays zero,
// so the zeros past the matrix stay zeros; NaN stays NaN.
constexpr int kActNone = 0, kActGelu = 1, kActGeluTanh = 2, kActSilu = 3, kActRelu = 4;

template <int kAct, bool kGrad>
ROCJIT_INLINE float activation(float z, float g) {
    constexpr float kLog2e = 1.4426950408889634f;
    if constexpr (kAct == kActGelu) {
        // erfcc's coefficients c0..c9, times log2(e), with log(1/2) added to c0 (Phi = erfc / 2)
        constexpr float c0 = (-1.26551223f - 0.69314718056f) * kLog2e, c1 = 1.00002368f * kLog2e,
                        c2 = 0.37409196f * kLog2e, c3 = 0.09678418f * kLog2e, c4 = -0.18628806f * kLog2e,
                        c5 = 0.27886807f * kLog2e, c6 = -1.13520398f * kLog2e, c7 = 1.48851587f * kLog2e,
                        c8 = -0.82215223f * kLog2e, c9 = 0.17087277f * kLog2e;
        const float t = rocjit::fast_rcp(fmaf(0.5f * 0.70710678118654752f, fabsf(z), 1.0f));   // in (0, 1]
        float p = fmaf(c9, t, c8);
        p = fmaf(p, t, c7); p = fmaf(p, t, c6); p = fmaf(p, t, c5); p = fmaf(p, t, c4);
        p = fmaf(p, t, c3); p = fmaf(p, t, c2); p = fmaf(p, t, c1); p = fmaf(p, t, c0);
        const float zl = z * (-0.5f * kLog2e);                          // z zl = -z^2 / 2 in log2 units
        const float tail = t * rocjit::fast_exp2(fmaf(zl, z, p));      // Phi(-|z|)
        const float cdf = z < 0.0f ? tail : 1.0f - tail;
        if constexpr (kGrad) return g * fmaf(z * 0.39894228040143268f, rocjit::fast_exp2(zl * z), cdf);
        return z * cdf;
    } else if constexpr (kAct == kActGeluTanh) {
        // 1 + tanh(u) and 1 - tanh(u) as 2 / (1 + e) and 2 e / (1 + e), e = exp(-2 |u|), each picked by u's sign:
        // neither is a difference, so the tail where tanh(u) -> -1 keeps its relative accuracy (1 - t^2 too, as their
        // product). Against float64, fp16 data: 0.03% of backward values round to another fp16 than the exact one,
        // where torch's tanhf form gives 4.5% (NumPy emulation of both in fp32).
        constexpr float kBeta = 0.79788456080286536f, kKappa = 0.044715f;
        const float z2 = z * z;
        const float u = kBeta * z * fmaf(kKappa, z2, 1.0f);
        const float e = rocjit::fast_exp2(fabsf(u) * (-2.0f * kLog2e));
        const float r2 = 2.0f * rocjit::fast_rcp(1.0f + e), er2 = e * r2;
        const float plus = u < 0.0f ? er2 : r2;          // 1 + tanh(u)
        if constexpr (kGrad) {
            const float minus = u < 0.0f ? r2 : er2;     // 1 - tanh(u)
            return g * (0.5f * plus + 0.5f * z * plus * minus * kBeta * fmaf(3.0f * kKappa, z2, 1.0f));
        }
        return 0.5f * z * plus;
    } else if constexpr (kAct == kActSilu) {
        const float sig = rocjit::sigmoid(z);
        if constexpr (kGrad) return g * sig * fmaf(z, 1.0f - sig, 1.0f);
        return z * sig;
    } else if constexpr (kAct == kActRelu) {
        if constexpr (kGrad) return z > 0.0f ? g : 0.0f;
        return z < 0.0f ? 0.0f : z;          // NaN stays NaN, as torch.relu
    } else {
        (void)g;
        return z;
    }
}

// h = act(h) (kGrad: gh * act'(h)), rounded back to T.
template <class T, int kAct, bool kGrad>
ROCJIT_INLINE void activate_chunk(chunk_t<T>& h, const chunk_t<T>& gh) {
    static_assert(kAct >= kActNone && kAct <= kActRelu, "activation: 0 none, 1 gelu, 2 gelu tanh, 3 silu, 4 relu");
    static_assert(!kGrad || kAct != kActNone, "the backward form needs an activation");
    if constexpr (kAct != kActNone) {
        float v[kChunk], g[kChunk];
        chunk_to_float(h, v);
        if constexpr (kGrad) chunk_to_float(gh, g);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = activation<kAct, kGrad>(v[i], kGrad ? g[i] : 0.0f);
        h = float_to_chunk<T>(v);
    } else {
        (void)h; (void)gh;
    }
}

// Block-scaled quantization. A 256-thread block covers kTileRows rows x 128 columns: 16 lanes
// of 8 elements span the 128 columns, and each of 16 row slots owns kTileRows / 16 consecutive rows
// (kept as packed 16-byte chunks in registers between the maxima and the quantization). Output layouts:
//   kRowBlocks: q_row [rows, cols], s_row [rows, ceil(cols/128)]
//   kColBlocks: q_col [rows, cols], s_col [ceil(rows/128), cols]       (kTileRows == 128)
//   kTile:      q_row [rows, cols], s_row [ceil(rows/128), ceil(cols/128)] (kTileRows == 128)
//   kTileCol:   with kTile, q_col receives the tile-quantized values too (with kColT: the weight's
//               transposed copy, whose tile scales are s_row read transposed)
// kRowT stores the kRowBlocks scales M-major, s_row [ceil(cols/128), rows] (the host hands them out as the transposed
// view [rows, ceil(cols/128)], whose K blocks' scales of consecutive rows a GEMM's copy unit takes in one bulk copy).
// kColT stores q_col transposed, [cols, rows] (s_col keeps its layout; the host hands it out as the transposed view
// [cols, ceil(rows/128)], whose contiguous columns a GEMM's copy unit takes in one bulk copy): the K-major operands
// of the GEMMs that reduce over rows (wgrad, dgrad) come out of the same launch, staged through shared
// memory so the transposed rows still leave as 16-byte stores.
constexpr int kRowBlocks = 1, kColBlocks = 2, kTile = 4, kTileCol = 8;
constexpr int kQuantBlock = 128;
constexpr int kLanes = kQuantBlock / kChunk;  // 16 lanes across a block's columns
constexpr int kSlots = 256 / kLanes;          // 16 row slots of a block
ROCJIT_INLINE int row_blocks_of(int cols) { return (cols + kQuantBlock - 1) / kQuantBlock; }

// The tile (tile_r, tile_c) of a kColT block. The grid is (column tiles, row tiles); launched in that order, the
// blocks resident at once share their rows and spread over the columns, so each transposed output row (one column
// of x) received 128 bytes from them and the rest much later. Here the grid is walked in groups of kColGroup column
// tiles with the row tiles fastest inside a group: resident blocks read 8 x 256 contiguous bytes of each of their
// rows and write runs of several KB of each transposed row. H200, bf16, same outputs bit for bit: dual 8192 x 14336
// 214 -> 173 us (2.2 -> 2.8 TB/s), 8192 x 4096 65 -> 54; weight 14336 x 4096 78 -> 70.
constexpr int kColGroup = 8;
ROCJIT_INLINE void grouped_tile(int b, int ct, int rt, int& tile_r, int& tile_c) {   // tile b of ct x rt
    const int g = b / (kColGroup * rt), within = b - g * kColGroup * rt;
    const int gs = min(kColGroup, ct - g * kColGroup);
    tile_r = within / gs;
    tile_c = g * kColGroup + within % gs;
}

// A block's shared memory. kColT staging: row c holds column c of the tile (128 bytes, one per row of x). A thread's
// 8 consecutive rows of one column are one 8-byte word, stored at word (slot ^ 2 * (lane & 7)) of row c = 8 * lane + i:
// the 16 lanes of a half-warp hit distinct banks (two words per bank across the warp, the least 8-byte stores allow),
// and the 16-byte pairs of words stay whole, only permuted, for the read-out.
template <bool kColT>
struct quant_blocks_smem {
    float col_partial[kSlots][kQuantBlock + 1];
    __align__(16) unsigned char staged[kColT ? kQuantBlock : 1][kColT ? kQuantBlock : 16];
    float scratch[1024 / kWaveSize];
};

// One tile (tile_r, tile_c) of kTileRows rows x 128 columns, this thread's kSteps rows of it in h (16 bytes each: row
// row0 + s, columns col .. col + 7; zeros past the matrix).
template <class T, class F, int kMode, int kTileRows, bool kAligned, bool kColT, bool kRowT>
ROCJIT_INLINE void quant_tile(const chunk_t<T> (&h)[kTileRows / kSlots], int tile_r, int tile_c,
                              unsigned char* q_row, float* s_row, unsigned char* q_col, float* s_col, int rows,
                              int cols, quant_blocks_smem<kColT>& sm) {
    static_assert(kTileRows % kSlots == 0, "tile rows: a multiple of 16");
    static_assert(!(kMode & (kColBlocks | kTile)) || kTileRows == kQuantBlock, "column blocks and tiles are 128 rows");
    static_assert(!(kMode & kTileCol) || (kMode & kTile), "kTileCol goes with kTile");
    static_assert(!kRowT || !(kMode & kTile), "kRowT lays out row-block scales (kRowBlocks)");
    constexpr int kSteps = kTileRows / kSlots;
    static_assert(!kColT || kSteps == 8, "the transposed store takes 8 rows per thread");
    constexpr bool kColOut = (kMode & (kColBlocks | kTileCol)) != 0;
    auto& col_partial = sm.col_partial;
    auto& staged = sm.staged;
    float* scratch = sm.scratch;
    const int lane = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
    const int col = tile_c * kQuantBlock + lane * kChunk;
    const int row0 = tile_r * kTileRows + slot * kSteps;   // this thread's kSteps consecutive rows
    float col_max[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) col_max[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
        float v[kChunk];
        chunk_to_float(h[s], v);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) col_max[i] = fmaxf(col_max[i], fabsf(v[i]));
    }

    // Column (128x1) and tile (128x128) maxima through shared memory.
    float tile_mul = 1.0f;
    float col_mul[kChunk];
    if constexpr ((kMode & kColBlocks) != 0) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) col_partial[slot][lane * kChunk + i] = col_max[i];
        __syncthreads();
        if (threadIdx.x < kQuantBlock) {
            float m = 0.0f;
#pragma unroll
            for (int s = 0; s < kSlots; ++s) m = fmaxf(m, col_partial[s][threadIdx.x]);
            col_partial[0][threadIdx.x] = fmaxf(m, kMinAmax);
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
            const float m = col_partial[0][lane * kChunk + i];
            col_mul[i] = F::max / m;
            if (slot == 0 && col + i < cols) {
                s_col[(long long)tile_r * cols + col + i] = m / F::max;
            }
        }
    }
    if constexpr ((kMode & kTile) != 0) {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) m = fmaxf(m, col_max[i]);
        m = fmaxf(block_max(m, scratch), kMinAmax);
        tile_mul = F::max / m;
        if (threadIdx.x == 0) s_row[(long long)tile_r * row_blocks_of(cols) + tile_c] = m / F::max;
    }

    unsigned long long tcol[kColT ? kChunk : 1];   // kColT: byte s of tcol[i] = q(row0 + s, col + i)
#pragma unroll
    for (int i = 0; i < (kColT ? kChunk : 1); ++i) tcol[i] = 0;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
        const int row = row0 + s;
        float v[kChunk];
        chunk_to_float(h[s], v);
        if constexpr ((kMode & (kRowBlocks | kTile)) != 0) {
            float mul = tile_mul;
            if constexpr ((kMode & kRowBlocks) != 0) {
                float m = 0.0f;
#pragma unroll
                for (int i = 0; i < kChunk; ++i) m = fmaxf(m, fabsf(v[i]));
                m = fmaxf(group_max<kLanes>(m), kMinAmax);
                mul = F::max / m;
                if (lane == 0 && row < rows) {
                    if constexpr (kRowT) {
                        s_row[(long long)tile_c * rows + row] = m / F::max;
                    } else {
                        s_row[(long long)row * row_blocks_of(cols) + tile_c] = m / F::max;
                    }
                }
            }
            float f[kChunk];
#pragma unroll
            for (int i = 0; i < kChunk; ++i) f[i] = v[i] * mul;
            unsigned int lo, hi;
            float8_to_fp8x8<F>(f, lo, hi);
            if (row < rows && col < cols) store_fp8_chunk<kAligned, true>(q_row + (long long)row * cols, col, cols, lo, hi);
        }
        if constexpr (kColOut) {
            float f[kChunk];
#pragma unroll
            for (int i = 0; i < kChunk; ++i) f[i] = v[i] * ((kMode & kColBlocks) ? col_mul[i] : tile_mul);
            unsigned int lo, hi;
            float8_to_fp8x8<F>(f, lo, hi);
            if constexpr (kColT) {
#pragma unroll
                for (int i = 0; i < kChunk; ++i)
                    tcol[i] |= (unsigned long long)(((i < 4 ? lo : hi) >> (8 * (i & 3))) & 0xffu) << (8 * s);
            } else {
                if (row < rows && col < cols) store_fp8_chunk<kAligned, true>(q_col + (long long)row * cols, col, cols, lo, hi);
            }
        }
    }
    if constexpr (kColT) {
        const int word = slot ^ (2 * (lane & 7));
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            *reinterpret_cast<unsigned long long*>(&staged[lane * kChunk + i][word * 8]) = tcol[i];
        __syncthreads();
        // q_col^T [cols, rows]: 128 staged rows of 128 bytes, 8 chunks of 16 bytes each (chunk j of row c is
        // stored as chunk j ^ ((c / 8) & 7))
        const int r0 = tile_r * kQuantBlock;
        for (int i = threadIdx.x; i < kQuantBlock * 8; i += 256) {
            const int c = i >> 3, part = (i & 7) * 16;
            const int oc = tile_c * kQuantBlock + c;
            if (oc >= cols || r0 + part >= rows) continue;
            const unsigned char* src = &staged[c][((i & 7) ^ ((c >> 3) & 7)) * 16];
            unsigned char* dst = q_col + (long long)oc * rows + r0 + part;
            if (kAligned && r0 + part + 16 <= rows) {
                *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
            } else {
                for (int t = 0; t < 16 && r0 + part + t < rows; ++t) dst[t] = src[t];
            }
        }
    }
}

// kAct / kGrad: the fused activation (activate_chunk); g: the upstream gradient (kGrad: a T tensor shaped as x),
// unused otherwise.
template <class T, class F, int kMode, int kTileRows, bool kAligned, bool kColT, bool kRowT, int kAct,
          bool kGrad>
__launch_bounds__(256) __global__ void quant_blocks_kernel(unsigned char* q_row, float* s_row, unsigned char* q_col,
                                                           float* s_col, const T* x, int rows, int cols,
                                                           const void* g) {
    constexpr int kSteps = kTileRows / kSlots;
    grid_dependency_sync();
    __shared__ quant_blocks_smem<kColT> sm;
    int tile_r = blockIdx.y, tile_c = blockIdx.x;
    if constexpr (kColT) grouped_tile(blockIdx.y * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, tile_r, tile_c);
    const int lane = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
    const int col = tile_c * kQuantBlock + lane * kChunk;
    const int row0 = tile_r * kTileRows + slot * kSteps;
    // x stays packed in registers (kSteps chunks of 16 bytes): every load is issued before any math
    chunk_t<T> h[kSteps];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
        h[s] = zero_chunk<T>();
        if (row0 + s < rows && col < cols) h[s] = load_chunk<kAligned, true>(x + (long long)(row0 + s) * cols, col, cols);
    }
    if constexpr (kAct != kActNone) {
        chunk_t<T> gh[kGrad ? kSteps : 1];
        if constexpr (kGrad) {
            const T* gt = static_cast<const T*>(g);
#pragma unroll
            for (int s = 0; s < kSteps; ++s) {
                gh[s] = zero_chunk<T>();
                if (row0 + s < rows && col < cols) gh[s] = load_chunk<kAligned, true>(gt + (long long)(row0 + s) * cols, col, cols);
            }
        }
#pragma unroll
        for (int s = 0; s < kSteps; ++s) activate_chunk<T, kAct, kGrad>(h[s], gh[kGrad ? s : 0]);
    } else {
        (void)g;
    }
    quant_tile<T, F, kMode, kTileRows, kAligned, kColT, kRowT>(h, tile_r, tile_c, q_row, s_row, q_col, s_col, rows, cols,
                                                               sm);
}

// The dual quantization (kRowBlocks | kColBlocks; kColT: column blocks transposed; aligned operands: cols a multiple
// of 8, and of rows 16 with kColT, 16-byte aligned tensors), streamed: a persistent block walks the tiles b =
// blockIdx.x, + gridDim.x, ... (grouped_tile's order) and has the async copy unit bring the next tile's x into shared
// memory while it quantizes the current one, so its loads are always in flight (each thread copies and later reads
// only its own 16-byte chunks: no barrier between them). Dynamic shared memory: 2 x 128 rows x 256 bytes. sm_80+
// (cp.async); the host selects it on NVIDIA only. H200, bf16, bit-identical to quant_blocks_kernel: kColT 8192 x
// 14336 174 -> 153 us, 8192 x 4096 54 -> 48; in x's layout 16384 x 7168 177 -> 159.
// With a fused activation (kAct) the ring has one buffer per operand (x, and with kGrad the gradient g: 32 or 64 KB),
// and the next tile's copy is issued once this thread's chunks of the current one are in registers and consumed by
// the activation (each thread overwrites only the chunks it has read itself), so that with kGrad two blocks still fit
// on a multiprocessor (a double-buffered 128 KB ring leaves one). Measured with the double-buffered ring (H200,
// 8192 x 14336 bf16, kColT): 155 us plain, 270 with GELU, 426 for GELU's backward at one block per multiprocessor;
// the activation makes the kernel arithmetic-bound. The single-buffered form is checked for correctness on the GPU
// but its speed is not measured yet.
template <class T, class F, bool kColT, bool kRowT, int kAct, bool kGrad>
__launch_bounds__(256, 2) __global__ void quant_dual_stream_kernel(unsigned char* q_row, float* s_row,
                                                                   unsigned char* q_col, float* s_col, const T* x,
                                                                   int rows, int cols, const void* g) {
#if ROCJIT_NVIDIA
    constexpr int kSteps = kQuantBlock / kSlots;
    constexpr int kOps = kGrad ? 2 : 1;         // operands in the ring: x (and g)
    constexpr bool kSingle = kAct != kActNone;  // one buffer per operand (see above)
    static_assert(sizeof(chunk_t<T>) == 16, "16-byte chunks");
    grid_dependency_sync();
    __shared__ quant_blocks_smem<kColT> sm;
    extern __shared__ __align__(16) unsigned char ring[];
    const int ct = (cols + kQuantBlock - 1) / kQuantBlock, rt = (rows + kQuantBlock - 1) / kQuantBlock;
    const int tiles = ct * rt;
    const int lane = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
    auto chunk_at = [&](int buf, int op, int s) {
        return ring + (((buf * kOps + op) * kQuantBlock + slot * kSteps + s) * kLanes + lane) * 16;
    };
    auto prefetch = [&](int b, int buf) {       // tile b's chunks of this thread -> ring buffer buf (zeros past x)
        int r, c;
        grouped_tile(b, ct, rt, r, c);
        const int pc = c * kQuantBlock + lane * kChunk, pr = r * kQuantBlock + slot * kSteps;
#pragma unroll
        for (int op = 0; op < kOps; ++op) {
            const T* src0 = op == 0 ? x : static_cast<const T*>(g);
#pragma unroll
            for (int s = 0; s < kSteps; ++s) {
                const bool valid = pr + s < rows && pc < cols;
                const T* src = valid ? src0 + (long long)(pr + s) * cols + pc : src0;
                mma8::copy16(chunk_at(buf, op, s), src, valid);
            }
        }
        mma8::copy_commit();
    };
    int b = blockIdx.x;
    if (b < tiles) prefetch(b, 0);
    for (int it = 0; b < tiles; b += gridDim.x, ++it) {
        const bool more = b + (int)gridDim.x < tiles;
        const int buf = kSingle ? 0 : it & 1;
        if (!kSingle && more) {
            prefetch(b + gridDim.x, (it + 1) & 1);
            mma8::copy_wait<1>();
        } else {
            mma8::copy_wait<0>();
        }
        chunk_t<T> h[kSteps];
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
            h[s] = *reinterpret_cast<const chunk_t<T>*>(chunk_at(buf, 0, s));
            activate_chunk<T, kAct, kGrad>(h[s], *reinterpret_cast<const chunk_t<T>*>(chunk_at(buf, kOps - 1, s)));
        }
        if (kSingle && more) prefetch(b + gridDim.x, 0);
        int r, c;
        grouped_tile(b, ct, rt, r, c);
        quant_tile<T, F, kRowBlocks | kColBlocks, kQuantBlock, true, kColT, kRowT>(h, r, c, q_row, s_row, q_col, s_col,
                                                                                  rows, cols, sm);
        __syncthreads();                        // the next tile's maxima and staging reuse sm
    }
#else
    (void)q_row; (void)s_row; (void)q_col; (void)s_col; (void)x; (void)rows; (void)cols; (void)g;
    unsupported_on_target();   // its 64 KB ring plus 24 KB exceed gfx90a / gfx942 LDS: the host selects it on NVIDIA only
#endif
}

// rocjit:check quant_rows_kernel<__hip_bfloat16, rocjit::e4m3fn, 2, 128, 128, 7, true>
// rocjit:check quant_rows_kernel<__hip_bfloat16, rocjit::e4m3fnuz, 1, 256, 256, 2, true>
// rocjit:check quant_rows_kernel<__half, rocjit::e4m3fn, 3, 256, 256, 2, false>
// rocjit:check amax_kernel<__hip_bfloat16, 512, true>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 1, 32, true, false, false, 0, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 3, 128, true, false, false, 0, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fnuz, 2, 128, true, false, false, 0, false>
// rocjit:check quant_blocks_kernel<__half, rocjit::e4m3fn, 4, 128, false, false, false, 0, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 3, 128, true, true, false, 0, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 3, 128, true, true, true, 0, false>
// rocjit:check quant_blocks_kernel<__half, rocjit::e4m3fnuz, 3, 128, false, false, true, 0, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fnuz, 12, 128, false, true, false, 0, false>
// rocjit:check quant_dual_stream_kernel<__hip_bfloat16, rocjit::e4m3fn, true, true, 0, false>
// rocjit:check quant_dual_stream_kernel<__hip_bfloat16, rocjit::e4m3fn, false, true, 0, false>
// rocjit:check quant_dual_stream_kernel<__half, rocjit::e4m3fnuz, true, true, 0, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 3, 128, true, true, true, 1, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 3, 128, false, true, true, 2, true>
// rocjit:check quant_blocks_kernel<__half, rocjit::e4m3fnuz, 3, 128, false, false, true, 3, true>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 3, 128, true, false, true, 4, false>
// rocjit:check quant_dual_stream_kernel<__hip_bfloat16, rocjit::e4m3fn, true, true, 1, false>
// rocjit:check quant_dual_stream_kernel<__hip_bfloat16, rocjit::e4m3fn, true, true, 1, true>
// rocjit:check quant_dual_stream_kernel<__half, rocjit::e4m3fn, false, true, 3, true>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 1, 64, true, false, true, 0, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 1, 64, true, false, true, 1, false>
// rocjit:check quant_blocks_kernel<__hip_bfloat16, rocjit::e4m3fn, 1, 16, true, false, true, 4, true>
// rocjit:check quant_blocks_kernel<__half, rocjit::e4m3fnuz, 1, 64, false, false, true, 3, false>
