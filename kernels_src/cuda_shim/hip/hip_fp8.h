// What NVRTC sees as <hip/hip_fp8.h>: HIP's OCP FP8 names for CUDA's types. CUDA has no
// e4m3fnuz type; kernels needing it use rocjit/fp8.h, which converts in software.
#pragma once
#include <cuda_fp8.h>

typedef __nv_fp8_storage_t __hip_fp8_storage_t;
typedef __nv_fp8x2_storage_t __hip_fp8x2_storage_t;
typedef __nv_fp8x4_storage_t __hip_fp8x4_storage_t;
typedef __nv_fp8_e4m3 __hip_fp8_e4m3;
typedef __nv_fp8_e5m2 __hip_fp8_e5m2;
typedef __nv_fp8x2_e4m3 __hip_fp8x2_e4m3;
typedef __nv_fp8x2_e5m2 __hip_fp8x2_e5m2;
typedef __nv_fp8x4_e4m3 __hip_fp8x4_e4m3;
typedef __nv_fp8x4_e5m2 __hip_fp8x4_e5m2;
