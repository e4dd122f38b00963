// FP8 E4M3 in its two flavours, selected by a tag type so one kernel source serves both:
//   e4m3fn   (OCP; NVIDIA, gfx950): bias 7, max 448, NaN = S.1111.111, has -0, no inf
//   e4m3fnuz (gfx942):              bias 8, max 240, NaN = 0x80 only, no -0, no inf
// float -> fp8 rounds to nearest even and saturates to +-max (inf too); NaN stays NaN.
// Packed conversions use the hardware where it speaks the format, else bit-exact software.
#pragma once
#include "rocjit/platform.h"

namespace rocjit {

struct e4m3fn {
    static constexpr bool fnuz = false;
    static constexpr int bias = 7;
    static constexpr float max = 448.0f;
    static constexpr unsigned int max_code = 0x7e;
    static constexpr unsigned int max_f32_bits = 0x43e00000u;  // 448.0f
};
struct e4m3fnuz {
    static constexpr bool fnuz = true;
    static constexpr int bias = 8;
    static constexpr float max = 240.0f;
    static constexpr unsigned int max_code = 0x7f;
    static constexpr unsigned int max_f32_bits = 0x43700000u;  // 240.0f
};

// The format a target computes in natively; -DROCJIT_FP8_FNUZ=0/1 overrides.
#ifndef ROCJIT_FP8_FNUZ
#if ROCJIT_GFX942
#define ROCJIT_FP8_FNUZ 1
#else
#define ROCJIT_FP8_FNUZ 0
#endif
#endif
#if ROCJIT_FP8_FNUZ
typedef e4m3fnuz fp8_native;
#else
typedef e4m3fn fp8_native;
#endif

// ---- software path: bit-exact, any target ----
template <class F>
ROCJIT_INLINE unsigned int float_to_fp8_soft(float x) {
    const unsigned int u = __float_as_uint(x);
    const unsigned int sign = (u >> 24) & 0x80u;
    const unsigned int mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return F::fnuz ? 0x80u : (sign | 0x7fu);  // NaN
    if (mag >= F::max_f32_bits) return sign | F::max_code;           // saturate (inf too)
    constexpr int kMinNormalExp = 1 - F::bias;
    const int exp = (int)(mag >> 23) - 127;
    unsigned int code;
    if (exp < kMinNormalExp) {
        // Subnormal range: count quanta of 2^(kMinNormalExp-3); rintf rounds half to even and
        // a result of 8 is exactly the smallest normal's code.
        code = (unsigned int)rintf(__uint_as_float(mag) * (float)(1 << (3 - kMinNormalExp)));
    } else {
        const unsigned int mant = mag & 0x7fffffu;
        code = ((unsigned int)(exp + F::bias) << 3) | (mant >> 20);
        const unsigned int rest = mant & 0xfffffu;  // the 20 dropped bits
        code += (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ? 1u : 0u;
        code = code > F::max_code ? F::max_code : code;  // rounded past max: saturate
    }
    if (F::fnuz && code == 0) return 0;  // no negative zero in fnuz (0x80 is NaN)
    return sign | code;
}

template <class F>
ROCJIT_INLINE float fp8_to_float(unsigned int b) {
    b &= 0xffu;
    if (F::fnuz ? b == 0x80u : (b & 0x7fu) == 0x7fu) return __uint_as_float(0x7fc00000u);
    const unsigned int exp = (b >> 3) & 0xfu, mant = b & 7u;
    float mag;
    if (exp == 0) {
        mag = (float)mant * __uint_as_float((unsigned int)(127 + 1 - F::bias - 3) << 23);
    } else {
        mag = __uint_as_float(((exp - F::bias + 127) << 23) | (mant << 20));
    }
    return (b & 0x80u) ? -mag : mag;
}

// Four OCP e4m3 bytes -> two f16x2 words, exactly, in hardware (NVIDIA sm_89+): bytes 0, 1 -> lo, bytes 2, 3 -> hi
// (low byte in the low half). Side-effect-free asm, so the compiler may share one conversion among its users.
#if ROCJIT_NVIDIA && ROCJIT_SM >= 890
ROCJIT_INLINE void widen_e4m3x4(unsigned v, unsigned& lo, unsigned& hi) {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi) : "r"(v));
}
#endif

// Clamp to +-max keeping NaN (fminf/fmaxf would turn NaN into a number).
template <class F>
ROCJIT_INLINE float fp8_clamp(float x) {
    return x > F::max ? F::max : (x < -F::max ? -F::max : x);
}

// ---- packed: two floats -> two bytes (lo in bits 0..7), four -> four bytes ----
// Hardware: NVIDIA sm_89+ cvt.rn.satfinite.e4m3x2 (fn); gfx942 v_cvt_pk_fp8_f32 (fnuz);
// gfx950 v_cvt_pk_fp8_f32 (OCP fn). The AMD instruction is fed pre-clamped values.
#if ROCJIT_NVIDIA && ROCJIT_SM >= 890
#define ROCJIT_FP8_HW_FN 1
#elif ROCJIT_GFX950
#define ROCJIT_FP8_HW_FN 1
#else
#define ROCJIT_FP8_HW_FN 0
#endif
#if ROCJIT_GFX942
#define ROCJIT_FP8_HW_FNUZ 1
#else
#define ROCJIT_FP8_HW_FNUZ 0
#endif

template <class F>
ROCJIT_INLINE unsigned int float2_to_fp8x2_soft(float lo, float hi) {
    return float_to_fp8_soft<F>(lo) | (float_to_fp8_soft<F>(hi) << 8);
}

ROCJIT_INLINE unsigned int float2_to_fp8x2(float lo, float hi, e4m3fn) {
#if ROCJIT_FP8_HW_FN && ROCJIT_NVIDIA
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));  // first source -> high byte
    return r;
#elif ROCJIT_FP8_HW_FN
    return (unsigned int)__builtin_amdgcn_cvt_pk_fp8_f32(fp8_clamp<e4m3fn>(lo), fp8_clamp<e4m3fn>(hi), 0, false) & 0xffffu;
#else
    return float2_to_fp8x2_soft<e4m3fn>(lo, hi);
#endif
}

ROCJIT_INLINE unsigned int float2_to_fp8x2(float lo, float hi, e4m3fnuz) {
#if ROCJIT_FP8_HW_FNUZ
    return (unsigned int)__builtin_amdgcn_cvt_pk_fp8_f32(fp8_clamp<e4m3fnuz>(lo), fp8_clamp<e4m3fnuz>(hi), 0, false) & 0xffffu;
#else
    return float2_to_fp8x2_soft<e4m3fnuz>(lo, hi);
#endif
}

template <class F>
ROCJIT_INLINE unsigned int float2_to_fp8x2(float lo, float hi) { return float2_to_fp8x2(lo, hi, F()); }

template <class F>
ROCJIT_INLINE unsigned int float4_to_fp8x4(float a, float b, float c, float d) {
#if ROCJIT_AMD && (ROCJIT_FP8_HW_FN || ROCJIT_FP8_HW_FNUZ)
    // Both halves written into one register by the instruction's word select.
    if ((F::fnuz && ROCJIT_FP8_HW_FNUZ) || (!F::fnuz && ROCJIT_FP8_HW_FN)) {
        int r = __builtin_amdgcn_cvt_pk_fp8_f32(fp8_clamp<F>(a), fp8_clamp<F>(b), 0, false);
        return (unsigned int)__builtin_amdgcn_cvt_pk_fp8_f32(fp8_clamp<F>(c), fp8_clamp<F>(d), r, true);
    }
#endif
    return float2_to_fp8x2<F>(a, b) | (float2_to_fp8x2<F>(c, d) << 16);
}

template <class F>
ROCJIT_INLINE unsigned int float_to_fp8(float x) { return float2_to_fp8x2<F>(x, 0.0f) & 0xffu; }

// Eight floats -> eight bytes in a uint2-sized pair of words.
template <class F>
ROCJIT_INLINE void float8_to_fp8x8(const float (&v)[8], unsigned int& lo, unsigned int& hi) {
    lo = float4_to_fp8x4<F>(v[0], v[1], v[2], v[3]);
    hi = float4_to_fp8x4<F>(v[4], v[5], v[6], v[7]);
}

}  // namespace rocjit
