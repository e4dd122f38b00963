// Wave-size-aware shuffles and reductions (warp, aligned lane groups, whole block).
#pragma once
#include "rocjit/platform.h"

namespace rocjit {

template <class T>
ROCJIT_INLINE T shfl_xor(T v, int lane_mask, int width = kWaveSize) {
#if ROCJIT_NVIDIA
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
#else
    return __shfl_xor(v, lane_mask, width);
#endif
}

template <class T>
ROCJIT_INLINE T shfl_down(T v, unsigned int delta, int width = kWaveSize) {
#if ROCJIT_NVIDIA
    return __shfl_down_sync(0xffffffffu, v, delta, width);
#else
    return __shfl_down(v, delta, width);
#endif
}

struct SumOp {
    static ROCJIT_INLINE float apply(float a, float b) { return a + b; }
    static constexpr float identity = 0.0f;
};
struct MaxOp {  // NaN-ignoring, like fmaxf
    static ROCJIT_INLINE float apply(float a, float b) { return fmaxf(a, b); }
    static constexpr float identity = -3.402823466e38f;
};

// Reduce within aligned groups of kWidth consecutive lanes (kWidth a power of 2 <= wave);
// every lane of a group gets the group's result.
template <class Op, int kWidth = kWaveSize>
ROCJIT_INLINE float group_reduce(float v) {
    static_assert(kWidth >= 1 && kWidth <= kWaveSize && (kWidth & (kWidth - 1)) == 0,
                  "group width must be a power of two no larger than the wave");
#pragma unroll
    for (int offset = kWidth / 2; offset > 0; offset /= 2) v = Op::apply(v, shfl_xor(v, offset));
    return v;
}

template <int kWidth = kWaveSize> ROCJIT_INLINE float group_sum(float v) { return group_reduce<SumOp, kWidth>(v); }
template <int kWidth = kWaveSize> ROCJIT_INLINE float group_max(float v) { return group_reduce<MaxOp, kWidth>(v); }
ROCJIT_INLINE float warp_sum(float v) { return group_reduce<SumOp>(v); }
ROCJIT_INLINE float warp_max(float v) { return group_reduce<MaxOp>(v); }

// Whole-block reduction through shared memory; the result reaches every thread.
// scratch: shared memory for at least blockDim.x / wave floats, free again on return.
template <class Op>
ROCJIT_INLINE float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x % kWaveSize;
    const int wave = threadIdx.x / kWaveSize;
    const int num_waves = (blockDim.x + kWaveSize - 1) / kWaveSize;
    v = group_reduce<Op>(v);
    if (lane == 0) scratch[wave] = v;
    __syncthreads();
    // Every wave reduces the partials itself: no second broadcast round.
    v = lane < num_waves ? scratch[lane] : Op::identity;
    v = group_reduce<Op>(v);
    __syncthreads();  // scratch may be reused by the caller
    return v;
}

ROCJIT_INLINE float block_sum(float v, float* scratch) { return block_reduce<SumOp>(v, scratch); }
ROCJIT_INLINE float block_max(float v, float* scratch) { return block_reduce<MaxOp>(v, scratch); }

// Reduce over the kGroup threads that share a row: lane shuffles when the group fits in a
// wave, otherwise the whole block (then the block is exactly one group).
template <class Op, int kGroup>
ROCJIT_INLINE float row_reduce(float v, float* scratch) {
    if constexpr (kGroup <= kWaveSize) {
        return group_reduce<Op, kGroup>(v);
    } else {
        return block_reduce<Op>(v, scratch);
    }
}

}  // namespace rocjit
