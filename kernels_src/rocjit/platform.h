// Which GPU a kernel is compiled for, and the few macros every rocjit kernel uses.
// Kernels test these names instead of vendor macros, so vendor #if's stay in rocjit/*.h.
#pragma once
#include <hip/hip_runtime.h>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__) || defined(__AMDGCN__) || defined(__HIPCC_RTC__)
#define ROCJIT_AMD 1
#define ROCJIT_NVIDIA 0
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ROCJIT_AMD 0
#define ROCJIT_NVIDIA 1
#else
#error "rocjit kernels are compiled by hipRTC/clang (AMD) or NVRTC (NVIDIA)"
#endif

// AMD targets (clang defines __gfxNNN__ for the device pass).
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define ROCJIT_GFX942 1
#else
#define ROCJIT_GFX942 0
#endif
#if defined(__gfx950__)
#define ROCJIT_GFX950 1
#else
#define ROCJIT_GFX950 0
#endif
#if defined(__gfx90a__)
#define ROCJIT_GFX90A 1
#else
#define ROCJIT_GFX90A 0
#endif

// NVIDIA compute capability as 900 for sm_90 (0 elsewhere and in host passes).
#if ROCJIT_NVIDIA && defined(__CUDA_ARCH__)
#define ROCJIT_SM __CUDA_ARCH__
#else
#define ROCJIT_SM 0
#endif

// Threads per wavefront / warp: 64 on CDNA (gfx9), 32 on RDNA (gfx10+) and NVIDIA.
#if ROCJIT_AMD
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define ROCJIT_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE
#elif defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__)
#define ROCJIT_WAVE_SIZE 32
#else
#define ROCJIT_WAVE_SIZE 64
#endif
#else
#define ROCJIT_WAVE_SIZE 32
#endif

#define ROCJIT_INLINE __device__ __forceinline__
#define ROCJIT_RESTRICT __restrict__

namespace rocjit {
constexpr int kWaveSize = ROCJIT_WAVE_SIZE;

// (a & b) | c as one instruction: NVIDIA's lop3 (the compiler may otherwise split it in two when
// both b and c are constants); AMD's v_and_or_b32 comes from the plain expression.
ROCJIT_INLINE unsigned and_or(unsigned a, unsigned b, unsigned c) {
#if ROCJIT_NVIDIA
    unsigned d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    return (a & b) | c;
#endif
}
}  // namespace rocjit
