// fp16 / bf16 element types, conversions to and from fp32, packed pairs, and the fp32
// activation math (exp2-based sigmoid / SiLU) shared by the kernels.
#pragma once
#include "rocjit/platform.h"
#include "rocjit/vec.h"

#if ROCJIT_NVIDIA
#include <hip/hip_fp16.h>
#include <hip/hip_bf16.h>
#else
#ifndef __HIPCC_RTC__  // hipRTC has __half built in; its header would redefine it
#include <hip/hip_fp16.h>
#endif
#include <hip/hip_bf16.h>  // under hipRTC 5.x rocjit's own (kernels_src/hiprtc_shim), defining ROCJIT_OWN_BF16
#endif

#ifdef ROCJIT_OWN_BF16
namespace rocjit {
// These bf16 values are read and written 16 bits at a time. LLVM 15 (SROA, AMDGPU promote-alloca) keeps
// a chunk in registers only when its whole-chunk accesses have lanes that line up with those accesses: a
// u32x4 load of a chunk also read bf16 by bf16 (a residual written back, then normalized) left it in
// scratch. So own-bf16 chunks move as vectors of 16-bit lanes (the same global_load/store_dwordx4).
template <int N> struct raw_of<__hip_bfloat16, N> { typedef unsigned short type __attribute__((ext_vector_type(N))); };
}  // namespace rocjit
#endif

namespace rocjit {

typedef __half f16;
typedef __half2 f16x2;
typedef __hip_bfloat16 bf16;
typedef __hip_bfloat162 bf16x2;

// The packed pair type of a 16-bit element type.
template <class T> struct packed;
template <> struct packed<f16> { typedef f16x2 type; };
template <> struct packed<bf16> { typedef bf16x2 type; };
template <class T> using packed_t = typename packed<T>::type;

ROCJIT_INLINE float to_float(f16 v) { return __half2float(v); }
ROCJIT_INLINE float to_float(bf16 v) { return __bfloat162float(v); }
ROCJIT_INLINE float to_float(float v) { return v; }
ROCJIT_INLINE float2 to_float2(f16x2 v) { return __half22float2(v); }
ROCJIT_INLINE float2 to_float2(bf16x2 v) { return __bfloat1622float2(v); }

template <class T> ROCJIT_INLINE T from_float(float v);
template <> ROCJIT_INLINE f16 from_float<f16>(float v) { return __float2half_rn(v); }
template <> ROCJIT_INLINE bf16 from_float<bf16>(float v) { return __float2bfloat16(v); }
template <> ROCJIT_INLINE float from_float<float>(float v) { return v; }

template <class T2> ROCJIT_INLINE T2 from_float2(float2 v);
template <> ROCJIT_INLINE f16x2 from_float2<f16x2>(float2 v) { return __float22half2_rn(v); }
template <> ROCJIT_INLINE bf16x2 from_float2<bf16x2>(float2 v) { return __float22bfloat162_rn(v); }

// Packed add, correctly rounded: bit-identical to adding in fp32 and rounding once.
ROCJIT_INLINE f16x2 add2(f16x2 a, f16x2 b) { return __hadd2(a, b); }
ROCJIT_INLINE bf16x2 add2(bf16x2 a, bf16x2 b) { return __hadd2(a, b); }

// 2^x on the hardware's exp2 unit (NVIDIA ex2.approx, AMD v_exp_f32).
ROCJIT_INLINE float fast_exp2(float x) {
#if ROCJIT_NVIDIA
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#elif __has_builtin(__builtin_amdgcn_exp2f)
    return __builtin_amdgcn_exp2f(x);
#else
    return exp2f(x);  // older clang (ROCm 5 hipRTC): the device library's exp2
#endif
}

// 1 / x on the hardware's reciprocal unit (NVIDIA rcp.approx, AMD v_rcp_f32: within 1 ulp; subnormal
// inputs and results flush to zero). The IEEE division it replaces is a branch and a slow-path call
// per element, which serialises the elements of a thread.
ROCJIT_INLINE float fast_rcp(float x) {
#if ROCJIT_NVIDIA
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#elif __has_builtin(__builtin_amdgcn_rcpf)
    return __builtin_amdgcn_rcpf(x);
#else
    return 1.0f / x;
#endif
}

// sigmoid(x) = 1 / (1 + e^-x) with e^-x = 2^(-x log2 e): one exp2 and one hardware reciprocal.
ROCJIT_INLINE float sigmoid(float x) {
    constexpr float kLog2e = 1.4426950408889634f;
    return fast_rcp(1.0f + fast_exp2(-x * kLog2e));
}
ROCJIT_INLINE float silu(float x) { return x * sigmoid(x); }

// N elements of a 16-bit type as fp32 values, and back.
template <class T, int N>
ROCJIT_INLINE void to_float(const vec<T, N>& in, float (&out)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(in[i]);
}

}  // namespace rocjit
