// Thread block clusters (NVIDIA sm_90+): the blocks of a cluster run at the same time and read
// each other's shared memory, so a row split across kSplit blocks reduces through one cluster
// barrier instead of a second launch. Other targets have no clusters: ROCJIT_HAS_CLUSTERS is 0
// there, kernels keep kSplit == 1, and a kSplit > 1 instantiation traps (the ops never pick it).
#pragma once
#include "rocjit/device.h"
#include "rocjit/warp.h"

// Kernels declare their cluster shape as `__global__ void __attribute__((ROCJIT_CLUSTER_DIMS(n))) name(...)`:
// the spelled-out __attribute__ keeps the declaration readable to rocjit's signature parser, and the
// attribute list is empty where there are no clusters.
#if ROCJIT_NVIDIA && ROCJIT_SM >= 900
#define ROCJIT_HAS_CLUSTERS 1
#define ROCJIT_CLUSTER_DIMS(x) cluster_dims(x, 1, 1)
#else
#define ROCJIT_HAS_CLUSTERS 0
#define ROCJIT_CLUSTER_DIMS(x)
#endif

namespace rocjit {

constexpr bool kHasClusters = ROCJIT_HAS_CLUSTERS;

// Whole-cluster barrier, split in two so independent work can run between arrive and wait.
// release/acquire order this block's shared-memory writes before other blocks' reads.
ROCJIT_INLINE void cluster_arrive() {
#if ROCJIT_HAS_CLUSTERS
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
ROCJIT_INLINE void cluster_wait() {
#if ROCJIT_HAS_CLUSTERS
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
ROCJIT_INLINE void cluster_sync() {
    cluster_arrive();
    cluster_wait();
}

// A float in the shared memory of block `rank` of this cluster, at the address `p` has in ours.
ROCJIT_INLINE float cluster_load(const float* p, unsigned int rank) {
#if ROCJIT_HAS_CLUSTERS
    const unsigned int local = (unsigned int)__cvta_generic_to_shared(p);
    unsigned int remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
#else
    return rank == 0 ? *p : 0.0f;
#endif
}

// Reduce v over every thread of a cluster of kSplit blocks of kWaves waves (kSplit == 1: one block);
// every thread gets the same result. `partials` holds kWaves floats of this block's shared memory that
// other blocks may read until the cluster's next barrier. Each wave reduces all kSplit x kWaves partials
// itself, lane i taking partial i, so every block sums them in the same order.
template <class Op, int kSplit, int kWaves>
ROCJIT_INLINE float split_reduce(float v, float* partials, int lane, int wave) {
    v = group_reduce<Op>(v);
    if (lane == 0) partials[wave] = v;
    if constexpr (kSplit > 1) {
        cluster_sync();
    } else {
        __syncthreads();
    }
    float r = Op::identity;
    for (int i = lane; i < kSplit * kWaves; i += kWaveSize)
        r = Op::apply(r, kSplit > 1 ? cluster_load(partials + i % kWaves, (unsigned int)(i / kWaves)) : partials[i]);
    return group_reduce<Op>(r);
}


}  // namespace rocjit
