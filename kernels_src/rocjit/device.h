// Device-side helpers that need the GPU compiler's intrinsics (platform.h stays parseable by a host C++
// compiler, which the FP8 conversion reference test uses).
#pragma once
#include "rocjit/platform.h"

namespace rocjit {

// The 32-bit shared-window address of a pointer into shared memory (what PTX's .shared operands take).
ROCJIT_INLINE unsigned smem_u32(const void* p) {
#if ROCJIT_NVIDIA
    return (unsigned)__cvta_generic_to_shared(p);
#else
    return (unsigned)(unsigned long long)p;
#endif
}

// Stop a kernel instantiated for a feature this target lacks (NVRTC has no __builtin_trap).
ROCJIT_INLINE void unsupported_on_target() {
#if ROCJIT_NVIDIA
    __trap();
#else
    __builtin_trap();
#endif
}

}  // namespace rocjit
