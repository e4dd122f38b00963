// A large per-thread array indexed at run time cannot live in registers: it goes to scratch
// memory, which `python -m rocjit check` must report as a failure.
#include <hip/hip_runtime.h>

extern "C" __global__ void dynamic_local_array(const float* x, float* y, int stride, int pick) {
    float values[2048];
    for (int i = 0; i < 2048; ++i) values[i] = x[i * stride + threadIdx.x];
    y[threadIdx.x] = values[(pick + threadIdx.x) % 2048];
}
