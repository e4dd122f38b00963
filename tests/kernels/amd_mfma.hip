// Matrix-core instructions: an fp32 MFMA on every CDNA target, and the fp8 MFMA gfx942+ has.
#include <hip/hip_runtime.h>

typedef float floatx4 __attribute__((ext_vector_type(4)));

extern "C" __global__ void __launch_bounds__(64) mfma_f32(const float* a, const float* b, float* c, int k_steps) {
    floatx4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < k_steps; ++k)
        acc = __builtin_amdgcn_mfma_f32_16x16x4f32(a[k * 64 + threadIdx.x], b[k * 64 + threadIdx.x], acc, 0, 0, 0);
    for (int i = 0; i < 4; ++i) c[i * 64 + threadIdx.x] = acc[i];
}

#if defined(__gfx942__) || defined(__gfx950__)
extern "C" __global__ void __launch_bounds__(64) mfma_fp8(const long* a, const long* b, float* c, int k_steps) {
    floatx4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < k_steps; ++k)
        acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a[k * 64 + threadIdx.x], b[k * 64 + threadIdx.x], acc, 0, 0, 0);
    for (int i = 0; i < 4; ++i) c[i * 64 + threadIdx.x] = acc[i];
}
#endif
