// Shared-memory mbarriers (NVIDIA sm_90+): phase barriers that threads and asynchronous copies arrive on,
// used by the copy / multiply pipelines of the skinny stream kernel and the sm_90a blockwise GEMM.
// A barrier is one 8-byte word of shared memory, initialised by one thread with its arrival count, then
// published with mbar_init_fence() and a block barrier. Each phase completes when `count` arrivals have
// happened; mbar_wait(bar, parity) waits for the phase of that parity (phase k has parity k & 1).
// Elsewhere (older NVIDIA architectures, AMD) the functions compile to nothing: no kernel that reaches them
// is launched there.
#pragma once
#include "rocjit/device.h"

#if ROCJIT_NVIDIA && ROCJIT_SM >= 900
#define ROCJIT_HAS_MBARRIER 1
#else
#define ROCJIT_HAS_MBARRIER 0
#endif

namespace rocjit {

ROCJIT_INLINE void mbar_init(unsigned long long* bar, unsigned count) {
#if ROCJIT_HAS_MBARRIER
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}
// mbarrier inits visible to the other threads (and the async proxy) of the block; follow with a barrier.
ROCJIT_INLINE void mbar_init_fence() {
#if ROCJIT_HAS_MBARRIER
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
ROCJIT_INLINE void mbar_arrive(unsigned long long* bar) {
#if ROCJIT_HAS_MBARRIER
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(smem_u32(bar)) : "memory");
#endif
}
// Arrive on the mbarrier at `bar`'s offset in the shared memory of block `rank` of this cluster, to say that this
// block is done reading a buffer the other block's copies will overwrite. The arrive has the default .release.cta
// semantics: the reads it orders have completed (their values are in registers, or the wgmmas that made them
// were waited on), so no cluster-scope release is needed, and one costs much more: with .release.cluster the
// 2-block cluster blockwise GEMM ran its copies-only K loop in 1034 us against 662 (H100, 8192^3).
ROCJIT_INLINE void mbar_arrive_remote(unsigned long long* bar, unsigned rank) {
#if ROCJIT_HAS_MBARRIER
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
#else
    (void)bar; (void)rank;
#endif
}
// Wait for the phase of parity `parity` to complete.
ROCJIT_INLINE void mbar_wait(unsigned long long* bar, unsigned parity) {
#if ROCJIT_HAS_MBARRIER
    asm volatile(
        "{\n .reg .pred done;\n"
        "WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT_%=;\n}" :: "r"(smem_u32(bar)), "r"(parity) : "memory");
#endif
}
// Arrive on `bar` once every earlier cp.async of this thread has landed (counted in the barrier's init count).
ROCJIT_INLINE void cp_async_arrive(unsigned long long* bar) {
#if ROCJIT_HAS_MBARRIER
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(smem_u32(bar)) : "memory");
#endif
}

}  // namespace rocjit
