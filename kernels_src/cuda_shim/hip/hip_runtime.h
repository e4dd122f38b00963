// What NVRTC sees as <hip/hip_runtime.h>: the small part of the HIP device API that
// ordinary kernels use, mapped onto CUDA. Only on the NVRTC include path.
#pragma once

#define __HIP_PLATFORM_NVIDIA__ 1
#define __HIP_PLATFORM_NVCC__ 1

// NVRTC has no <stdint.h>; the fixed-width names kernels expect.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

#define hipThreadIdx_x threadIdx.x
#define hipThreadIdx_y threadIdx.y
#define hipThreadIdx_z threadIdx.z
#define hipBlockIdx_x blockIdx.x
#define hipBlockIdx_y blockIdx.y
#define hipBlockIdx_z blockIdx.z
#define hipBlockDim_x blockDim.x
#define hipBlockDim_y blockDim.y
#define hipBlockDim_z blockDim.z
#define hipGridDim_x gridDim.x
#define hipGridDim_y gridDim.y
#define hipGridDim_z gridDim.z

// HIP's warp intrinsics have no mask argument: they act on the whole (converged) warp.
#define ROCJIT_SHIM_FULL_MASK 0xffffffffu

template <class T>
__device__ __forceinline__ T __shfl(T var, int src_lane, int width = 32) {
    return __shfl_sync(ROCJIT_SHIM_FULL_MASK, var, src_lane, width);
}
template <class T>
__device__ __forceinline__ T __shfl_xor(T var, int lane_mask, int width = 32) {
    return __shfl_xor_sync(ROCJIT_SHIM_FULL_MASK, var, lane_mask, width);
}
template <class T>
__device__ __forceinline__ T __shfl_down(T var, unsigned int delta, int width = 32) {
    return __shfl_down_sync(ROCJIT_SHIM_FULL_MASK, var, delta, width);
}
template <class T>
__device__ __forceinline__ T __shfl_up(T var, unsigned int delta, int width = 32) {
    return __shfl_up_sync(ROCJIT_SHIM_FULL_MASK, var, delta, width);
}
// CUDA still declares deprecated mask-less __ballot/__any/__all (removed for sm_70+), so
// HIP's names are macros. HIP's __ballot is 64-bit (wave64); the upper half is zero here.
#define __ballot(predicate) ((unsigned long long)__ballot_sync(ROCJIT_SHIM_FULL_MASK, (predicate)))
#define __any(predicate) __any_sync(ROCJIT_SHIM_FULL_MASK, (predicate))
#define __all(predicate) __all_sync(ROCJIT_SHIM_FULL_MASK, (predicate))
