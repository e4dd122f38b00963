// What NVRTC sees as <hip/hip_fp16.h>: CUDA's half types carry the same names as HIP's.
#pragma once
#include <cuda_fp16.h>
