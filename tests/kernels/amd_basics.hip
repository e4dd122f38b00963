// Small kernels covering what the library relies on: fp16 / bf16 math, 16-byte vector loads,
// wave shuffles, static LDS and templates. hipRTC (ROCm 5.2) predefines the half types and
// has no hip_bf16.h, so the host-side headers are included for the offline clang only.
#include <hip/hip_runtime.h>
#if !defined(__HIPCC_RTC__)
#include <hip/hip_fp16.h>
#include <hip/hip_bf16.h>
#define AMD_TEST_HAS_BF16 1
#endif

// Parameter layout (const float*, float*, int, float): offsets 0, 8, 16, 20.
extern "C" __global__ void saxpy(const float* x, float* y, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void __launch_bounds__(256) scale_float4(const float4* __restrict__ x, float4* __restrict__ y,
                                                              int n4, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        y[i] = make_float4(v.x * a, v.y * a, v.z * a, v.w * a);
    }
}

extern "C" __global__ void half2_axpy(const __half2* x, __half2* y, int n2, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) y[i] = __hfma2(__float2half2_rn(a), x[i], y[i]);
}

#ifdef AMD_TEST_HAS_BF16
extern "C" __global__ void bf16_scale(const __hip_bfloat16* x, __hip_bfloat16* y, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(__bfloat162float(x[i]) * a);
}
#endif

// One partial sum per 256-thread block: a wave reduction with shuffles, then LDS across waves.
extern "C" __global__ void __launch_bounds__(256) block_sum(const float* x, float* partial, int n) {
    __shared__ float wave_sums[256 / 64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int offset = 32; offset > 0; offset /= 2) v += __shfl_xor(v, offset);
    if (threadIdx.x % 64 == 0) wave_sums[threadIdx.x / 64] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < 256 / 64; ++w) s += wave_sums[w];
        partial[blockIdx.x] = s;
    }
}

template <typename T, int VEC>
__global__ void scale_vec(const T* x, T* y, int n, float a) {
    int base = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    for (int j = 0; j < VEC; ++j)
        if (base + j < n) y[base + j] = static_cast<T>(static_cast<float>(x[base + j]) * a);
}

// rocjit:check scale_vec<float, 4>
// rocjit:check scale_vec<__half, 8>
