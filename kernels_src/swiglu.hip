// Fused SwiGLU (+ FP8 quantization): gate_up [rows, 2d] holds the gate half first.
//   y = silu(gate) * up, silu in fp32 with an exp2-based sigmoid
//   out = y (dtype T) | fp8(y / scale) | fp8(y / s_row) with s_row = amax(|y_row|) / fp8 max
// swiglu_tiled_kernel (no scale or a static one): block (row, tile) of the 2-D grid covers
// blockDim.x * kChunks chunks of a row; the host sizes blocks to the row, so no integer division
// or early exit sits in front of the loads, and the static scale is read alongside the data.
// swiglu_kernel (per-token scales, also any mode): a group of kRowThreads threads covers
// kTileChunks = kRowThreads * kChunks chunks of one row; with per-row scales a row is one tile
// (tiles_per_row = 1) and the group reduces its amax.
// Every kernel here waits for the kernel ahead of it before touching memory (grid_dependency_sync):
// rocjit may launch them to overlap that kernel's tail (programmatic dependent launch, sm_90+).
// rocjit:pdl
#include <hip/hip_runtime.h>
#include "rocjit/chunk.h"
#include "rocjit/warp.h"
#include "rocjit/stream.h"

using namespace rocjit;

template <class T, class F, int kQuant, int kChunks, bool kAligned>
__launch_bounds__(1024) __global__ void swiglu_tiled_kernel(void* out, const T* gate_up, const float* scale, int d) {
    static_assert(kQuant != kQuantToken, "per-token scales need the row reduction of swiglu_kernel");
    grid_dependency_sync();
    const int row = blockIdx.x, tile = blockIdx.y;  // x: rows (up to 2^31 - 1), y: tiles of a row
    // Hardware reciprocal: an IEEE division's branch would hold the data loads behind the scale's load.
    const float out_mul = kQuant == kQuantStatic ? fast_rcp(*scale) : 1.0f;
    const T* gate = gate_up + (long long)row * 2 * d;
    const T* up = gate + d;
    const long long base = (long long)row * d;
    chunk_t<T> g[kChunks], u[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {  // every load in flight before the first use
        const int col = ((tile * kChunks + c) * blockDim.x + threadIdx.x) * kChunk;
        if (col < d) {
            g[c] = load_chunk<kAligned, true>(gate, col, d);
            u[c] = load_chunk<kAligned, true>(up, col, d);
        }
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = ((tile * kChunks + c) * blockDim.x + threadIdx.x) * kChunk;
        if (col >= d) break;
        float gf[kChunk], uf[kChunk], y[kChunk];
        chunk_to_float(g[c], gf);
        chunk_to_float(u[c], uf);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) y[i] = silu(gf[i]) * uf[i];
        if (kQuant == kQuantNone) {
            store_chunk<kAligned, true>(static_cast<T*>(out) + base, col, d, float_to_chunk<T>(y));
        } else {
#pragma unroll
            for (int i = 0; i < kChunk; ++i) y[i] *= out_mul;
            unsigned int lo, hi;
            float8_to_fp8x8<F>(y, lo, hi);
            store_fp8_chunk<kAligned, true>(static_cast<unsigned char*>(out) + base, col, d, lo, hi);
        }
    }
}

template <class T, class F, int kQuant, int kRowThreads, int kBlock, int kChunks, bool kAligned>
__launch_bounds__(kBlock) __global__ void swiglu_kernel(void* out, float* row_scales, const T* gate_up,
                                                        const float* scale, int rows, int d, int tiles_per_row) {
    static_assert(kRowThreads <= kWaveSize || kRowThreads == kBlock, "a row spans a wave or the whole block");
    grid_dependency_sync();
    constexpr int kGroupsPerBlock = kBlock / kRowThreads;
    __shared__ float scratch[1024 / kWaveSize];
    const int group = blockIdx.x * kGroupsPerBlock + threadIdx.x / kRowThreads;  // rows * tiles < 2^31
    const int row = group / tiles_per_row;
    const int tile = group % tiles_per_row;
    const int lane = threadIdx.x % kRowThreads;
    const bool valid = row < rows;
    const T* gate = gate_up + (long long)row * 2 * d;
    const T* up = gate + d;

    float y[kChunks][kChunk];
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = ((tile * kChunks + c) * kRowThreads + lane) * kChunk;
        chunk_t<T> g = zero_chunk<T>(), u = zero_chunk<T>();
        if (valid && col < d) {
            g = load_chunk<kAligned, true>(gate, col, d);
            u = load_chunk<kAligned, true>(up, col, d);
        }
        float gf[kChunk], uf[kChunk];
        chunk_to_float(g, gf);
        chunk_to_float(u, uf);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
            y[c][i] = silu(gf[i]) * uf[i];
            if (kQuant == kQuantToken) amax = fmaxf(amax, fabsf(y[c][i]));
        }
    }
    if (kQuant == kQuantToken) amax = fmaxf(row_reduce<MaxOp, kRowThreads>(amax, scratch), kMinAmax);
    if (!valid) return;
    float out_mul = 1.0f;
    if (kQuant == kQuantStatic) out_mul = 1.0f / *scale;
    if (kQuant == kQuantToken) {
        out_mul = F::max / amax;
        if (lane == 0) row_scales[row] = amax / F::max;
    }
    const long long base = (long long)row * d;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
        const int col = ((tile * kChunks + c) * kRowThreads + lane) * kChunk;
        if (col >= d) break;
        if (kQuant == kQuantNone) {
            store_chunk<kAligned, true>(static_cast<T*>(out) + base, col, d, float_to_chunk<T>(y[c]));
        } else {
            float f[kChunk];
#pragma unroll
            for (int i = 0; i < kChunk; ++i) f[i] = y[c][i] * out_mul;
            unsigned int lo, hi;
            float8_to_fp8x8<F>(f, lo, hi);
            store_fp8_chunk<kAligned, true>(static_cast<unsigned char*>(out) + base, col, d, lo, hi);
        }
    }
}

// rocjit:check swiglu_kernel<__half, rocjit::e4m3fn, 1, 256, 256, 2, true>
// rocjit:check swiglu_kernel<__half, rocjit::e4m3fnuz, 2, 1024, 1024, 1, true>
// rocjit:check swiglu_kernel<__hip_bfloat16, rocjit::e4m3fn, 0, 256, 256, 2, true>
// rocjit:check swiglu_kernel<__half, rocjit::e4m3fn, 2, 32, 256, 4, false>
// rocjit:check swiglu_tiled_kernel<__half, rocjit::e4m3fn, 1, 1, true>
// rocjit:check swiglu_tiled_kernel<__hip_bfloat16, rocjit::e4m3fnuz, 1, 2, true>
// rocjit:check swiglu_tiled_kernel<__half, rocjit::e4m3fn, 0, 2, false>
