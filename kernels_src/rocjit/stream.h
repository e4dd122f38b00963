// Streaming a large read-once operand (GEMV / skinny-GEMM weights), and programmatic dependent
// launch: the vendor details of both, so that kernels name a policy instead of writing PTX.
//
// load16_once<HINT>(p): 16 bytes at p (16-byte aligned), read exactly once by the whole grid.
//   HINT 0  ld.global.nc.L1::no_allocate          (no L1 line; L2 default policy)
//   HINT 1  ... + .L2::128B                        (L2 fetches the surrounding 128 bytes)
//   HINT 2  ... + .L2::256B                        (L2 fetches the surrounding 256 bytes: the rest of a
//                                                  row segment that other lanes / warps read next)
//   HINT 3  ld.global.cs                           (evict-first in L1 and L2, like __ldcs)
//   HINT 4  HINT 2 + an L2 evict-first cache policy
// On AMD every hint is one nontemporal global_load_dwordx4 (the hints are NVIDIA PTX).
//
// Programmatic dependent launch (NVIDIA sm_90+): a kernel launched with the programmatic stream
// serialization attribute may start before the kernel ahead of it in the stream has finished.
// grid_dependency_wait() blocks until that kernel has completed and its writes are visible; a thread
// must call it before it reads anything an earlier kernel writes or writes anything an earlier kernel
// reads. launch_dependents() lets the next kernel (if it was launched with the attribute) be scheduled
// once every block of this grid has called it or exited. Both are no-ops for a normal launch, and
// compile to nothing before sm_90 and on AMD (no equivalent there: HIP has no programmatic launch).
// A source whose kernels all follow this rule says so with a line `// rocjit:pdl`: rocjit then launches
// them with the attribute on sm_90+ (rocjit.Module's pdl).
#pragma once
#include "rocjit/platform.h"

namespace rocjit {

// L2 cache policies for loads and copies that take one (NVIDIA sm_80+; 0 on AMD, whose loads take none): evict
// first for data read once (a decode GEMM's weights), so the stream does not push out what the kernels around it
// reuse; evict last for data every block reads again (a decode GEMM's activations).
ROCJIT_INLINE unsigned long long l2_evict_first_policy() {
    unsigned long long pol = 0;
#if ROCJIT_NVIDIA
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}
ROCJIT_INLINE unsigned long long l2_evict_last_policy() {
    unsigned long long pol = 0;
#if ROCJIT_NVIDIA
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}

template <int HINT>
ROCJIT_INLINE uint4 load16_once(const void* p) {
#if ROCJIT_NVIDIA
    static_assert(HINT >= 0 && HINT <= 4, "load16_once: HINT is 0..4");
    uint4 v;
    if constexpr (HINT == 0) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if constexpr (HINT == 1) {
        asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if constexpr (HINT == 2) {
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if constexpr (HINT == 3) {
        asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else {
        const unsigned long long pol = l2_evict_first_policy();
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    }
    return v;
#else
    typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));
    u32x4 v = __builtin_nontemporal_load(reinterpret_cast<const u32x4*>(p));
    return make_uint4(v[0], v[1], v[2], v[3]);
#endif
}

#if ROCJIT_NVIDIA && ROCJIT_SM >= 900
#define ROCJIT_HAS_PDL 1
#else
#define ROCJIT_HAS_PDL 0
#endif

ROCJIT_INLINE void grid_dependency_wait() {
#if ROCJIT_HAS_PDL
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

ROCJIT_INLINE void launch_dependents() {
#if ROCJIT_HAS_PDL
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// For a kernel all of whose memory traffic depends on the kernels ahead of it: the next kernel may be
// scheduled now, and this one waits for its predecessor before going on.
ROCJIT_INLINE void grid_dependency_sync() {
    launch_dependents();
    grid_dependency_wait();
}

// Loads of what the kernel ahead writes (activations, their scales) under programmatic dependent launch: coherent
// global loads, never the read-only path. Through a const __restrict__ pointer the compiler may emit ld.global.nc
// (SASS LDG...CONSTANT), which promises the data cannot change during the kernel, and ptxas is then free to
// schedule the load above griddepcontrol.wait: a read of the kernel ahead's output before it is complete (the
// pipelined skinny GEMM's SASS had such loads there; tests/test_pdl_cpu.py disassembles every checked build of
// every PDL source and fails on one). Data that never changes during a launch (weights, their scales) may keep the
// read-only path (load16_once).
ROCJIT_INLINE uint4 load16_dep(const void* p) {
#if ROCJIT_NVIDIA
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    return *reinterpret_cast<const uint4*>(p);
#endif
}
ROCJIT_INLINE float load_dep(const float* p) {
#if ROCJIT_NVIDIA
    return __ldcg(p);
#else
    return *p;
#endif
}
// The same, cached in L1 like load16_dep's: for values read again and again in a main loop, where load_dep's
// L2-only load (a strong GPU-scope load in SASS) costs an L2 round trip each time (skinny_gemm_blockwise_kernel's
// per-step activation scales: H100, 7168 x 16384, M = 8, best configs 47.1 against 42.9 us).
ROCJIT_INLINE float load_dep_l1(const float* p) {
#if ROCJIT_NVIDIA
    return __ldca(p);
#else
    return *p;
#endif
}

// Ask L2 for the line holding p, reading no value: unlike a load, it may come before grid_dependency_wait()
// even where the kernel ahead writes p (L2 is where the GPU's memory is coherent; the load after the wait
// sees that kernel's write). Compiled only where programmatic launch exists.
ROCJIT_INLINE void prefetch_l2_early(const void* p) {
#if ROCJIT_HAS_PDL
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
#else
    (void)p;
#endif
}

}  // namespace rocjit
