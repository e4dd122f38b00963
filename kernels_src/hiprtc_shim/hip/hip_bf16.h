// What hipRTC 5.x sees as <hip/hip_bf16.h>, which ROCm 5 does not ship: the bfloat16 storage types and the
// conversions kernels use. ROCJIT_OWN_BF16 tells rocjit/types.h that these are the types in use.
#pragma once
#define ROCJIT_OWN_BF16 1

// The storage type and the conversions kernels need (round-to-nearest-even, NaN kept).
struct __hip_bfloat16 { unsigned short data; };
struct __hip_bfloat162 { __hip_bfloat16 x, y; };
__device__ __forceinline__ float __bfloat162float(__hip_bfloat16 b) { return __uint_as_float((unsigned int)b.data << 16); }
__device__ __forceinline__ __hip_bfloat16 __float2bfloat16(float f) {
    unsigned int u = __float_as_uint(f);
    unsigned int rounded = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) : u + 0x7fffu + ((u >> 16) & 1u);
    return __hip_bfloat16{(unsigned short)(rounded >> 16)};
}
__device__ __forceinline__ float2 __bfloat1622float2(__hip_bfloat162 v) { return make_float2(__bfloat162float(v.x), __bfloat162float(v.y)); }
__device__ __forceinline__ __hip_bfloat162 __float22bfloat162_rn(float2 f) { return __hip_bfloat162{__float2bfloat16(f.x), __float2bfloat16(f.y)}; }
__device__ __forceinline__ __hip_bfloat162 __hadd2(__hip_bfloat162 a, __hip_bfloat162 b) {
    return __hip_bfloat162{__float2bfloat16(__bfloat162float(a.x) + __bfloat162float(b.x)),
                           __float2bfloat16(__bfloat162float(a.y) + __bfloat162float(b.y))};
}
