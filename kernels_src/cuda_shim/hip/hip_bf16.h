// What NVRTC sees as <hip/hip_bf16.h>: HIP's bfloat16 names for CUDA's types.
#pragma once
#include <cuda_bf16.h>

typedef __nv_bfloat16 __hip_bfloat16;
typedef __nv_bfloat162 __hip_bfloat162;
typedef __nv_bfloat16 hip_bfloat16;
