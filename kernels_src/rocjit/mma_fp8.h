// FP8 (e4m3) matrix-core tiles with fp32 accumulation, and the global -> shared copies that feed them.
//
// A warp (NVIDIA, 32 lanes) or wave (AMD CDNA, 64 lanes) computes 16 x 16 output tiles:
//   NVIDIA sm_89+:   two mma.sync m16n8k32 e4m3 per 16 x 16 x 32 step; fragments read with ldmatrix
//   AMD gfx942/950:  one MFMA 16x16x32 fp8 per step (e4m3fnuz on gfx942, e4m3fn on gfx950)
// Operands live in shared memory as K-major tiles of 128-byte rows (128 k values of one row of A or
// one column of B), the 16-byte chunks of row r stored XOR-swizzled by (r & 7) so that the 8 rows an
// ldmatrix (or a 16-lane group) reads hit different banks.
// Targets without an FP8 matrix instruction (gfx90a, sm < 89) compile the same code with a trap.
#pragma once
#include "rocjit/device.h"

#if (ROCJIT_NVIDIA && ROCJIT_SM >= 890) || ROCJIT_GFX942 || ROCJIT_GFX950
#define ROCJIT_HAS_MMA_FP8 1
#else
#define ROCJIT_HAS_MMA_FP8 0
#endif

namespace rocjit {
namespace mma8 {

constexpr int kRowBytes = 128;   // one K block of 128 e4m3 values per shared-memory row
constexpr int kTile = 16;        // output tile per fragment step: 16 x 16
constexpr int kStepK = 32;       // k per step

ROCJIT_INLINE int swizzle(int row, int chunk) { return row * kRowBytes + ((chunk ^ (row & 7)) << 4); }

#if ROCJIT_NVIDIA
constexpr int kAcc = 8;          // fp32 accumulators per lane per 16 x 16 tile (two m16n8 tiles)
struct frag_a { unsigned r[4]; };
struct frag_b { unsigned r[4]; };   // r[0..1]: columns 0..7, r[2..3]: columns 8..15

ROCJIT_INLINE void ldsm_x4(unsigned (&r)[4], const unsigned char* p) {
#if ROCJIT_HAS_MMA_FP8
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
#endif
}

// A rows row0..row0+15, k step ks (32 bytes: chunks 2ks, 2ks+1). ldmatrix matrix j -> register j:
// (rows 0-7, low chunk) (rows 8-15, low) (rows 0-7, high) (rows 8-15, high) = mma's a0..a3.
ROCJIT_INLINE void load_a(frag_a& f, const unsigned char* tile, int row0, int ks) {
    const int lane = threadIdx.x & 31;
    const int row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
    ldsm_x4(f.r, tile + swizzle(row, 2 * ks + (lane >> 4)));
}
// B columns col0..col0+15 (rows of the K-major B tile): (cols 0-7, low) (0-7, high) (8-15, low) (8-15, high).
ROCJIT_INLINE void load_b(frag_b& f, const unsigned char* tile, int col0, int ks) {
    const int lane = threadIdx.x & 31;
    const int row = col0 + (lane & 7) + (lane >> 4) * 8;
    ldsm_x4(f.r, tile + swizzle(row, 2 * ks + ((lane >> 3) & 1)));
}

ROCJIT_INLINE void mma(float (&c)[kAcc], const frag_a& a, const frag_b& b) {
#if ROCJIT_HAS_MMA_FP8
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[4]), "+f"(c[5]), "+f"(c[6]), "+f"(c[7])
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[2]), "r"(b.r[3]));
#else
    unsupported_on_target();
#endif
}

// Row and column (within the 16 x 16 tile) of accumulator e of this lane.
ROCJIT_INLINE int acc_row(int e) { return ((threadIdx.x & 31) >> 2) + 8 * ((e >> 1) & 1); }
ROCJIT_INLINE int acc_col(int e) { return 8 * (e >> 2) + 2 * (threadIdx.x & 3) + (e & 1); }

// 16 (4) bytes global -> shared through the async copy unit; `valid` false writes zeros.
ROCJIT_INLINE void copy16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
ROCJIT_INLINE void copy4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
ROCJIT_INLINE void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> ROCJIT_INLINE void copy_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

#else  // ---------------------------------------------------------------- AMD CDNA
constexpr int kAcc = 4;          // MFMA 16x16: lane l holds column l % 16, rows 4 (l / 16) + e
struct frag_a { unsigned r[2]; };   // 8 k values of row l % 16 at k = 8 (l / 16)
struct frag_b { unsigned r[2]; };   // 8 k values of column l % 16 at the same k

ROCJIT_INLINE void load8(unsigned (&r)[2], const unsigned char* tile, int row, int ks) {
    const int lane = threadIdx.x & 63;
    const int k = 32 * ks + 8 * (lane >> 4);
    const uint2 v = *reinterpret_cast<const uint2*>(tile + swizzle(row, k >> 4) + (k & 15));
    r[0] = v.x;
    r[1] = v.y;
}
ROCJIT_INLINE void load_a(frag_a& f, const unsigned char* tile, int row0, int ks) { load8(f.r, tile, row0 + (threadIdx.x & 15), ks); }
ROCJIT_INLINE void load_b(frag_b& f, const unsigned char* tile, int col0, int ks) { load8(f.r, tile, col0 + (threadIdx.x & 15), ks); }

ROCJIT_INLINE void mma(float (&c)[kAcc], const frag_a& a, const frag_b& b) {
#if ROCJIT_HAS_MMA_FP8
    typedef float floatx4 __attribute__((ext_vector_type(4)));
    const long av = (long)(((unsigned long long)a.r[1] << 32) | a.r[0]);
    const long bv = (long)(((unsigned long long)b.r[1] << 32) | b.r[0]);
    floatx4 acc = {c[0], c[1], c[2], c[3]};
    // A is the first operand (rows), B the second (columns): D[i][j] = sum_k A[i][k] B[k][j]
    acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(av, bv, acc, 0, 0, 0);
    c[0] = acc[0]; c[1] = acc[1]; c[2] = acc[2]; c[3] = acc[3];
#else
    unsupported_on_target();
#endif
}

ROCJIT_INLINE int acc_row(int e) { return 4 * ((threadIdx.x & 63) >> 4) + e; }
ROCJIT_INLINE int acc_col(int e) { return threadIdx.x & 15; }

// gfx9 has no asynchronous global -> LDS copy that every compiler exposes: a synchronous 16-byte copy
// (the multistage loop still overlaps the next stage's loads with this stage's MFMAs across waves).
ROCJIT_INLINE void copy16(void* dst, const void* src, bool valid) {
    typedef unsigned int u32x4 __attribute__((ext_vector_type(4)));
    u32x4 v = {0u, 0u, 0u, 0u};
    if (valid) v = *reinterpret_cast<const u32x4*>(src);
    *reinterpret_cast<u32x4*>(dst) = v;
}
ROCJIT_INLINE void copy4(void* dst, const void* src, bool valid) {
    *reinterpret_cast<float*>(dst) = valid ? *reinterpret_cast<const float*>(src) : 0.0f;
}
ROCJIT_INLINE void copy_commit() {}
template <int N> ROCJIT_INLINE void copy_wait() {}
#endif

}  // namespace mma8
}  // namespace rocjit
