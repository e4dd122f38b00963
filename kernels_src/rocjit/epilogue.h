// The decode GEMMs' epilogues: what a finished value acc * scale_a[m] * scale_w[n] becomes (plain store, residual
// add, SwiGLU of interleaved gate / up rows with an optional FP8 quantization). skinny_gemm.hip's kernels use them,
// and so does gemv.hip's portable kernel where skinny_gemm and its fused ops run it. The ops name them as template
// arguments (rocjit/ops/_gemm.py: skinny::ep_store, skinny::ep_residual, skinny::ep_swiglu<Q>).
#pragma once
#include "rocjit/types.h"
#include "rocjit/fp8.h"
#include "rocjit/stream.h"

namespace skinny {

template <class T> __device__ __forceinline__ void store_out(T* p, float v);
template <> __device__ __forceinline__ void store_out<float>(float* p, float v) { *p = v; }
template <> __device__ __forceinline__ void store_out<__half>(__half* p, float v) { *p = __float2half_rn(v); }
template <> __device__ __forceinline__ void store_out<__hip_bfloat16>(__hip_bfloat16* p, float v) {
    *p = __float2bfloat16(v);
}

// Activations and their scales come from the kernel ahead, which may still be running when this one starts
// (programmatic dependent launch): they are read with rocjit/stream.h's coherent loads (load16_dep, load_dep,
// load_dep_l1), never the read-only path (tests/test_skinny_weight_stream_cpu.py checks more skinny builds than the
// all-sources test). Weights and their scales never change during a launch and keep the read-only path.
// scale_modes bit 0: scale_w holds one scale per output column n (else one per tensor);
// bit 1: scale_a holds one scale per activation row m (dynamic per-token FP8), else one per tensor.
__device__ __forceinline__ float scale_at(const float* s, int per_index, int i) {
    return s ? rocjit::load_dep(s + (per_index ? i : 0)) : 1.f;
}
struct ep_store { static constexpr int kind = 0; };      // out[m, n] = v
struct ep_residual { static constexpr int kind = 1; };   // out[m, n] = residual[m, n] + v (fp32, one rounding)
struct no_quant {};
// out[m, i] = silu(g) * u of interleaved rows g = 16*(i/8) + i%8, u = g + 8; Q: no_quant (out in OT)
// or an FP8 format tag (out = fp8(silu(g) * u / out_scale), OT = unsigned char).
template <class Q> struct ep_swiglu { static constexpr int kind = 2; typedef Q quant; };
template <class Q> struct quantizes { static constexpr bool value = true; };
template <> struct quantizes<no_quant> { static constexpr bool value = false; };

template <class T> __device__ __forceinline__ float load_out(const T* p) { return rocjit::to_float(*p); }
template <> __device__ __forceinline__ float load_out<unsigned char>(const unsigned char*) { return 0.f; }

template <class OT> struct epilogue {
    OT* out;                  // [M, ldo]
    const OT* residual;       // [M, ldo] (ep_residual; may be out itself)
    const float* scale_a;
    const float* scale_w;
    int modes, M, N, ldo;     // N: weight rows; ldo: output columns (N, or I for SwiGLU)
    float qmul;               // 1 / out_scale (FP8 SwiGLU)

    __device__ __forceinline__ float scaled(float acc, int m, int n) const {
        return acc * scale_at(scale_a, modes & 2, m) * scale_at(scale_w, modes & 1, n);
    }
    // The value that EP stores at (m, col): v, plus the residual there for ep_residual.
    template <class EP> __device__ __forceinline__ float value(int m, int col, float v) const {
        if constexpr (EP::kind == 1) v += load_out<OT>(residual + (size_t)m * ldo + col);
        return v;
    }
    __device__ __forceinline__ void store(int m, int col, float v) const { store_out<OT>(out + (size_t)m * ldo + col, v); }
    template <class EP> __device__ __forceinline__ void put(int m, int col, float v) const {
        store(m, col, value<EP>(m, col, v));
    }
    template <class EP> __device__ __forceinline__ void put_swiglu(int m, int col, float g, float u) const {
        const float y = rocjit::silu(g) * u;
        if constexpr (quantizes<typename EP::quant>::value)
            out[(size_t)m * ldo + col] = (OT)rocjit::float_to_fp8<typename EP::quant>(y * qmul);
        else
            store_out<OT>(out + (size_t)m * ldo + col, y);
    }
};

template <class EP, class OT>
__device__ __forceinline__ epilogue<OT> make_epilogue(OT* out, const OT* residual, const float* out_scale,
                                                     const float* scale_a, const float* scale_w, int modes,
                                                     int M, int N, int ldo) {
    float qmul = 1.f;
    if constexpr (EP::kind == 2) {
        if constexpr (quantizes<typename EP::quant>::value) qmul = 1.0f / rocjit::load_dep(out_scale);
    }
    return epilogue<OT>{out, residual, scale_a, scale_w, modes, M, N, ldo, qmul};
}

}  // namespace skinny
