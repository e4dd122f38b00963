// The Tensor Memory Accelerator (NVIDIA sm_90+): one thread copies a whole 2-D tile between global and shared
// memory, described by a tensor map the host encodes with the driver (cuTensorMapEncodeTiled) and passes by
// value as a __grid_constant__ kernel parameter. The copy lands in the 128B-swizzled layout that wgmma's
// descriptors read (rocjit/wgmma.h), zero-fills whatever lies outside the tensor's bounds, and reports its
// bytes on an mbarrier (complete_tx), so no thread of the block spends instructions or registers on it.
// Also here: setmaxnreg, which moves registers from a warp-specialized block's copy warpgroup to its math
// warpgroups. Elsewhere (older NVIDIA architectures, AMD) ROCJIT_HAS_TMA is 0 and the functions trap.
#pragma once
#include "rocjit/device.h"
#include "rocjit/mbarrier.h"

#if ROCJIT_NVIDIA && ROCJIT_SM >= 900
#define ROCJIT_HAS_TMA 1
#define ROCJIT_GRID_CONSTANT __grid_constant__
#else
#define ROCJIT_HAS_TMA 0
#define ROCJIT_GRID_CONSTANT
#endif

namespace rocjit {

// CUtensorMap as cuda.h declares it: 128 opaque bytes, 64-byte aligned (the host passes the driver's encoding).
struct alignas(64) tensor_map {
    unsigned long long opaque[16];
};

namespace tma {

// Fetch the tensor map into the TMA unit's descriptor cache ahead of its first copy.
ROCJIT_INLINE void prefetch(const tensor_map* m) {
#if ROCJIT_HAS_TMA
    asm volatile("prefetch.tensormap [%0];" :: "l"(m) : "memory");
#else
    (void)m;
#endif
}

// The box at (x: innermost coordinate, in elements; y: row) of `m` into shared memory at `dst` (aligned as the
// map's swizzle needs: 1024 bytes for 128B), its bytes completing on `bar`'s transaction count.
ROCJIT_INLINE void load_2d(void* dst, const tensor_map* m, int x, int y, unsigned long long* bar) {
#if ROCJIT_HAS_TMA
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        :: "r"(smem_u32(dst)), "l"(m), "r"(x), "r"(y), "r"(smem_u32(bar)) : "memory");
#else
    (void)dst; (void)m; (void)x; (void)y; (void)bar;
    unsupported_on_target();
#endif
}

// load_2d with an L2 cache policy on the lines it reads (e.g. rocjit/stream.h's l2_evict_first_policy).
ROCJIT_INLINE void load_2d_hint(void* dst, const tensor_map* m, int x, int y, unsigned long long* bar,
                                unsigned long long policy) {
#if ROCJIT_HAS_TMA
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3}], [%4], %5;"
        :: "r"(smem_u32(dst)), "l"(m), "r"(x), "r"(y), "r"(smem_u32(bar)), "l"(policy) : "memory");
#else
    (void)dst; (void)m; (void)x; (void)y; (void)bar; (void)policy;
    unsupported_on_target();
#endif
}

// Ask L2 for the box at (x, y) of `m`, moving nothing into shared memory (a prefetch reads no value: it may
// run before grid_dependency_wait even where the kernel ahead writes the tensor).
ROCJIT_INLINE void prefetch_2d_l2(const tensor_map* m, int x, int y) {
#if ROCJIT_HAS_TMA
    asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global [%0, {%1, %2}];" :: "l"(m), "r"(x), "r"(y) : "memory");
#else
    (void)m; (void)x; (void)y;
#endif
}

// The same box into the shared memory of every block of the cluster in `cta_mask` (bit r: rank r), at `dst`'s
// offset in each, completing on the mbarrier at `bar`'s offset in each.
ROCJIT_INLINE void load_2d_multicast(void* dst, const tensor_map* m, int x, int y, unsigned long long* bar,
                                     unsigned short cta_mask) {
#if ROCJIT_HAS_TMA
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;"
        :: "r"(smem_u32(dst)), "l"(m), "r"(x), "r"(y), "r"(smem_u32(bar)), "h"(cta_mask) : "memory");
#else
    (void)dst; (void)m; (void)x; (void)y; (void)bar; (void)cta_mask;
    unsupported_on_target();
#endif
}

// `bytes` contiguous bytes (a multiple of 16; `dst` and `src` 16-byte aligned) from global memory into shared
// memory, completing on `bar`'s transaction count: a bulk copy that needs no tensor map.
ROCJIT_INLINE void load_1d(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
#if ROCJIT_HAS_TMA
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
#else
    (void)dst; (void)src; (void)bytes; (void)bar;
    unsupported_on_target();
#endif
}

// The current phase of `bar` also waits for `bytes` more bytes of asynchronous copies (no arrival).
ROCJIT_INLINE void expect_bytes(unsigned long long* bar, unsigned bytes) {
#if ROCJIT_HAS_TMA
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar; (void)bytes;
#endif
}

// Registers per thread of the calling warpgroup (every warp of it executes the same call): a copy warpgroup
// gives registers back, math warpgroups take them. Needs sm_90a; a no-op elsewhere.
template <int REGS> ROCJIT_INLINE void release_registers() {
#if ROCJIT_HAS_TMA && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(REGS));
#endif
}
template <int REGS> ROCJIT_INLINE void claim_registers() {
#if ROCJIT_HAS_TMA && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(REGS));
#endif
}

}  // namespace tma
}  // namespace rocjit
