// Fused (residual add +) RMSNorm (+ FP8 quantization), one row per group of kRowThreads threads.
//   h = x (+ residual, written back in place); y = h * rsqrt(mean(h^2) + eps) * weight
//   out = y (dtype T) | fp8(y / scale) | fp8(y / s_row) with s_row = amax(|y_row|) / fp8 max
// The row stays in registers between the reduction and the normalization (kChunks 16-byte
// chunks per thread), so x and residual are read once. Small hidden sizes put several rows
// in a block (kRowThreads < kBlock, reduced by lane shuffles).
// Every kernel here waits for the kernel ahead of it before touching memory (grid_dependency_sync):
// rocjit may launch them to overlap that kernel's tail (programmatic dependent launch, sm_90+).
// rocjit:pdl
#include <hip/hip_runtime.h>
#include "rocjit/chunk.h"
#include "rocjit/warp.h"
#include "rocjit/cluster.h"
#include "rocjit/stream.h"

using namespace rocjit;

template <class T, class F, int kQuant, bool kResidual, int kRowThreads, int kBlock, int kChunks, bool kAligned>
__launch_bounds__(kBlock) __global__ void rms_norm_kernel(void* out, float* row_scales, const T* x, T* residual,
                                                          const T* weight, const float* scale, int rows, int hidden,
                                                          float eps) {
    static_assert(kRowThreads <= kWaveSize || kRowThreads == kBlock, "a row spans a wave or the whole block");
    constexpr int kRowsPerBlock = kBlock / kRowThreads;
    __shared__ float scratch[1024 / kWaveSize];
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kRowThreads;
    const int lane = threadIdx.x % kRowThreads;
    const bool valid = row < rows;  // invalid lanes still join the reductions
    const long long base = (long long)row * hidden;
    // the weight into L2 while the kernel ahead finishes (reads no value, so it may come before the wait; H100,
    // compiled 4-layer FP8 Llama: 533 -> 523 us per token, the norms' weight loads no longer going to DRAM)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = (c * kRowThreads + lane) * kChunk;
        if (valid && col < hidden) prefetch_l2_early(weight + col);
    }
    grid_dependency_sync();

    // The static scale is read first: after the reduction's barriers it would cost one more serial trip to L2.
    const float static_scale = kQuant == kQuantStatic ? *scale : 1.0f;
    chunk_t<T> h[kChunks], w[kChunks];
    float sum_sq = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = (c * kRowThreads + lane) * kChunk;
        h[c] = zero_chunk<T>();
        w[c] = zero_chunk<T>();
        if (valid && col < hidden) {
            h[c] = load_chunk<kAligned, true>(x + base, col, hidden);
            w[c] = load_chunk<kAligned>(weight, col, hidden);
            if (kResidual) {
                h[c] = add_chunks(h[c], load_chunk<kAligned, true>(residual + base, col, hidden));
                store_chunk<kAligned, true>(residual + base, col, hidden, h[c]);
            }
        }
        float f[kChunk];
        chunk_to_float(h[c], f);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) sum_sq += f[i] * f[i];
    }
    sum_sq = row_reduce<SumOp, kRowThreads>(sum_sq, scratch);
    const float inv_rms = 1.0f / sqrtf(sum_sq / (float)hidden + eps);  // correctly rounded, unlike rsqrtf

    float amax = 0.0f;
    if (kQuant == kQuantToken) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            float f[kChunk], g[kChunk];
            chunk_to_float(h[c], f);
            chunk_to_float(w[c], g);
#pragma unroll
            for (int i = 0; i < kChunk; ++i) amax = fmaxf(amax, fabsf(f[i] * inv_rms * g[i]));
        }
        amax = fmaxf(row_reduce<MaxOp, kRowThreads>(amax, scratch), kMinAmax);
    }
    if (!valid) return;
    float out_mul = 1.0f;  // y * out_mul is what gets rounded to fp8
    if (kQuant == kQuantStatic) out_mul = 1.0f / static_scale;
    if (kQuant == kQuantToken) {
        out_mul = F::max / amax;
        if (lane == 0) row_scales[row] = amax / F::max;
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = (c * kRowThreads + lane) * kChunk;
        if (col >= hidden) break;
        float f[kChunk], g[kChunk];
        chunk_to_float(h[c], f);
        chunk_to_float(w[c], g);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) f[i] = f[i] * inv_rms * g[i] * out_mul;
        if (kQuant == kQuantNone) {
            store_chunk<kAligned, true>(static_cast<T*>(out) + base, col, hidden, float_to_chunk<T>(f));
        } else {
            unsigned int lo, hi;
            float8_to_fp8x8<F>(f, lo, hi);
            store_fp8_chunk<kAligned, true>(static_cast<unsigned char*>(out) + base, col, hidden, lo, hi);
        }
    }
}

// Few rows: one row split across a cluster of kSplit blocks (kThreads threads x kChunks chunks each,
// slices interleaved per chunk so every load instruction stays coalesced). One SM streaming a whole
// 16K row is bound by that SM's bandwidth; kSplit SMs share it. Per-warp partial sums meet in shared
// memory and every warp of the cluster reads all kSplit x waves of them after one cluster barrier
// (no second block barrier); blocks wait for the cluster once more before exiting, since others may
// still be reading their partials. The grid is exactly rows x kSplit blocks: no thread returns early.
template <class T, class F, int kQuant, bool kResidual, int kThreads, int kChunks, int kSplit, bool kAligned>
__launch_bounds__(kThreads) __global__ void __attribute__((ROCJIT_CLUSTER_DIMS(kSplit)))
    rms_norm_split_kernel(void* out, float* row_scales, const T* x, T* residual, const T* weight, const float* scale,
                          int rows, int hidden, float eps) {
    static_assert(kThreads % kWaveSize == 0, "whole waves per block");
    constexpr int kWaves = kThreads / kWaveSize;
    __shared__ float partials[2][kWaves];  // [0]: sum of squares, [1]: amax
    if constexpr (kSplit > 1 && !kHasClusters) {
        unsupported_on_target();
        return;
    }
    const int row = blockIdx.x / kSplit;
    const int slice = blockIdx.x % kSplit;
    const int lane = threadIdx.x % kWaveSize;
    const int wave = threadIdx.x / kWaveSize;
    const long long base = (long long)row * hidden;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {    // the weight into L2 before the wait, as rms_norm_kernel
        const int col = ((c * kSplit + slice) * kThreads + threadIdx.x) * kChunk;
        if (col < hidden) prefetch_l2_early(weight + col);
    }
    grid_dependency_sync();
    const float static_scale = kQuant == kQuantStatic ? *scale : 1.0f;  // read before the barriers

    chunk_t<T> h[kChunks], w[kChunks];
    float sum_sq = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = ((c * kSplit + slice) * kThreads + threadIdx.x) * kChunk;
        h[c] = zero_chunk<T>();
        w[c] = zero_chunk<T>();
        if (col < hidden) {
            h[c] = load_chunk<kAligned, true>(x + base, col, hidden);
            w[c] = load_chunk<kAligned>(weight, col, hidden);
            if (kResidual) h[c] = add_chunks(h[c], load_chunk<kAligned, true>(residual + base, col, hidden));
        }
        float f[kChunk];
        chunk_to_float(h[c], f);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) sum_sq += f[i] * f[i];
    }
    // The residual is written back after the cluster barrier, whose release semantics would otherwise
    // cover these stores too (measured 0.05-0.17 µs faster at 1-4 rows of 16K).
    sum_sq = split_reduce<SumOp, kSplit, kWaves>(sum_sq, partials[0], lane, wave);
    if (kResidual) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            const int col = ((c * kSplit + slice) * kThreads + threadIdx.x) * kChunk;
            if (col < hidden) store_chunk<kAligned, true>(residual + base, col, hidden, h[c]);
        }
    }
    const float inv_rms = 1.0f / sqrtf(sum_sq / (float)hidden + eps);

    float out_mul = 1.0f;  // y * out_mul is what gets rounded to fp8
    if (kQuant == kQuantStatic) out_mul = 1.0f / static_scale;
    if (kQuant == kQuantToken) {
        float amax = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            float f[kChunk], g[kChunk];
            chunk_to_float(h[c], f);
            chunk_to_float(w[c], g);
#pragma unroll
            for (int i = 0; i < kChunk; ++i) amax = fmaxf(amax, fabsf(f[i] * inv_rms * g[i]));
        }
        amax = fmaxf(split_reduce<MaxOp, kSplit, kWaves>(amax, partials[1], lane, wave), kMinAmax);
        out_mul = F::max / amax;
        if (slice == 0 && threadIdx.x == 0) row_scales[row] = amax / F::max;
    }
    if constexpr (kSplit > 1) cluster_arrive();  // done reading the other blocks' partials
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = ((c * kSplit + slice) * kThreads + threadIdx.x) * kChunk;
        if (col >= hidden) break;
        float f[kChunk], g[kChunk];
        chunk_to_float(h[c], f);
        chunk_to_float(w[c], g);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) f[i] = f[i] * inv_rms * g[i] * out_mul;
        if (kQuant == kQuantNone) {
            store_chunk<kAligned, true>(static_cast<T*>(out) + base, col, hidden, float_to_chunk<T>(f));
        } else {
            unsigned int lo, hi;
            float8_to_fp8x8<F>(f, lo, hi);
            store_fp8_chunk<kAligned, true>(static_cast<unsigned char*>(out) + base, col, hidden, lo, hi);
        }
    }
    if constexpr (kSplit > 1) cluster_wait();  // our partials stay alive until every block has read them
}

// Instantiations compiled by `python -m rocjit check` (the ops pick others per shape):
// rocjit:check rms_norm_kernel<__half, rocjit::e4m3fn, 1, true, 256, 256, 8, true>
// rocjit:check rms_norm_kernel<__half, rocjit::e4m3fn, 1, true, 1024, 1024, 2, true>
// rocjit:check rms_norm_kernel<__hip_bfloat16, rocjit::e4m3fnuz, 2, true, 128, 128, 4, true>
// rocjit:check rms_norm_kernel<__hip_bfloat16, rocjit::e4m3fn, 0, false, 32, 256, 4, true>
// rocjit:check rms_norm_kernel<__half, rocjit::e4m3fn, 0, true, 256, 256, 8, false>
// rocjit:check rms_norm_split_kernel<__half, rocjit::e4m3fn, 1, true, 256, 1, 8, true>
// rocjit:check rms_norm_split_kernel<__hip_bfloat16, rocjit::e4m3fn, 2, true, 64, 2, 4, true>
// rocjit:check rms_norm_split_kernel<__half, rocjit::e4m3fnuz, 0, false, 128, 1, 4, false>
