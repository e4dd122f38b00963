// Register pressure above a forced VGPR budget: the compiler must spill VGPRs to scratch,
// which `python -m rocjit check` reports as a failure. (amdgpu_num_vgpr is an AMD-only attribute.)
#include <hip/hip_runtime.h>

extern "C" __global__ void __attribute__((amdgpu_num_vgpr(24))) forced_vgpr_spill(const float* x, float* y, int n) {
    float v[48];
#pragma unroll
    for (int i = 0; i < 48; ++i) v[i] = x[i * n + threadIdx.x];
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 48; ++i)
#pragma unroll
        for (int j = i + 1; j < 48; ++j) acc += v[i] * v[j];
    y[threadIdx.x] = acc;
}
