// Hopper (sm_90a) warpgroup matrix multiply: wgmma.mma_async with e4m3 operands in shared memory and fp32
// accumulators in registers, the shared-memory matrix descriptors it reads, and its fences.
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp index a multiple of 4); every wgmma
// instruction is executed by all of them together. m64nNk32 multiplies a 64 x 32 tile of A by a 32 x N tile
// of B (both K-major for 8-bit types) into d[N / 2] floats per thread: in warp w of the group, lane l holds
// rows 16 w + l / 4 (d[4 j], d[4 j + 1]) and 16 w + l / 4 + 8 (d[4 j + 2], d[4 j + 3]), columns 8 j + 2 (l % 4)
// and 8 j + 2 (l % 4) + 1 (the mma.sync m16n8 accumulator layout, repeated N / 8 times).
//
// Operand tiles: rows of 128 bytes (128 e4m3 values of K), 8-row groups of 1024 bytes stored with the
// 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r & 7): rocjit::mma8::swizzle), each tile starting
// at a 1024-byte aligned shared address. The descriptor of such a tile: stride between 8-row groups 1024 bytes,
// swizzle mode 128B; a k32 step inside the 128-byte row advances the start address by 32 bytes (the hardware
// applies the swizzle to the address bits, so the XOR pattern stays the one the copies wrote).
//
// Ordering rules (PTX ISA, "asynchronous warpgroup level matrix multiply-accumulate"):
// - wgmma_fence() before the first wgmma of a group and whenever the accumulator registers were touched by
//   other instructions since the last wgmma;
// - shared memory written through the generic proxy (st.shared, cp.async) must be followed by
//   fence_proxy_async() (by the writing threads, before the barrier that publishes it) before wgmma reads it;
// - wgmma_commit() closes a group; wgmma_wait<N>() waits until at most N groups are pending, after which the
//   accumulators may be read and the shared memory they read may be overwritten.
// Elsewhere (other NVIDIA architectures, AMD) ROCJIT_HAS_WGMMA is 0 and the functions trap.
#pragma once
#include "rocjit/device.h"
#include "rocjit/mbarrier.h"   // the copy / multiply pipeline's barriers

#if ROCJIT_NVIDIA && ROCJIT_SM >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ROCJIT_HAS_WGMMA 1
#else
#define ROCJIT_HAS_WGMMA 0
#endif

namespace rocjit {
namespace wgmma {

constexpr int kGroupThreads = 128;   // one warpgroup
constexpr int kStepK = 32;           // k per instruction (bytes of an e4m3 row)
constexpr int kSwizzleAlign = 1024;  // a 128B-swizzled tile starts at a multiple of this shared address

// Descriptor of a K-major e4m3 tile of 128-byte rows, 128B swizzle, as two 32-bit words. The low word: the start
// address / 16 (bits 0-13) and the leading byte offset 1 (bit 16; unused: K in one row). The high word, the same for
// every such tile: stride byte offset 1024 >> 4 (8 rows x 128 B) and swizzle mode 1 (128B, bit 62). A shared window
// of at most 256 KB keeps the start address within its 14 bits, so k steps added to the low word never carry: a
// loop may step the word in 32 bits (desc_sw128_word) and form the descriptor at the instruction (desc_of_word).
constexpr unsigned kSw128High = (1024 >> 4) | (1u << 30);
ROCJIT_INLINE unsigned desc_sw128_word(unsigned addr16) { return addr16 | (1u << 16); }
ROCJIT_INLINE unsigned long long desc_of_word(unsigned word) {
    return ((unsigned long long)kSw128High << 32) | word;
}
// The descriptor of the tile at shared address `addr` (a 32-bit shared-window address; 8-row groups 1024 bytes apart).
ROCJIT_INLINE unsigned long long desc_sw128(unsigned addr) {
    return desc_of_word(desc_sw128_word((addr & 0x3FFFF) >> 4));
}
// The same descriptor `bytes` further (a multiple of 16): start address field only.
ROCJIT_INLINE unsigned long long desc_advance(unsigned long long d, int bytes) { return d + (unsigned)(bytes >> 4); }

ROCJIT_INLINE void fence() {
#if ROCJIT_HAS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
ROCJIT_INLINE void commit() {
#if ROCJIT_HAS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N> ROCJIT_INLINE void wait() {
#if ROCJIT_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}
// Generic-proxy shared-memory writes of this thread become visible to the async proxy (wgmma's reads).
ROCJIT_INLINE void fence_proxy_async() {
#if ROCJIT_HAS_WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Keeps the compiler from moving reads / writes of accumulator registers across wgmma issue and wait.
template <int R> ROCJIT_INLINE void fence_operands(float (&d)[R]) {
#if ROCJIT_HAS_WGMMA
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
#else
    (void)d;
#endif
}

// d (+)= A[64 x 32] B[32 x N]: desc_a / desc_b from desc_sw128; accumulate 0 overwrites d (scale-d = 0).
ROCJIT_INLINE void mma_m64n64k32(float (&d)[32], unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
#if ROCJIT_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    (void)d; (void)desc_a; (void)desc_b; (void)accumulate;
    unsupported_on_target();
#endif
}

// The m64n128k32 accumulator operands (64 floats per thread), as asm operand lists for the two forms below.
#define ROCJIT_WGMMA_D64_REGS \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31," \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define ROCJIT_WGMMA_D8(C, d, i) C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), \
    C(d[i + 6]), C(d[i + 7])
#define ROCJIT_WGMMA_D64(C, d) ROCJIT_WGMMA_D8(C, d, 0), ROCJIT_WGMMA_D8(C, d, 8), ROCJIT_WGMMA_D8(C, d, 16), \
    ROCJIT_WGMMA_D8(C, d, 24), ROCJIT_WGMMA_D8(C, d, 32), ROCJIT_WGMMA_D8(C, d, 40), ROCJIT_WGMMA_D8(C, d, 48), \
    ROCJIT_WGMMA_D8(C, d, 56)

ROCJIT_INLINE void mma_m64n128k32(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
#if ROCJIT_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" ROCJIT_WGMMA_D64_REGS "}, %64, %65, p, 1, 1;\n}\n"
        : ROCJIT_WGMMA_D64("+f", d)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    (void)d; (void)desc_a; (void)desc_b; (void)accumulate;
    unsupported_on_target();
#endif
}

// The same with D = A B (the accumulator's old value neither read nor kept alive): the first k32 step of a
// fresh partial. Its outputs are write-only, so a partial issued in a loop is a new value each time and the
// compiler never copies a register set that a wgmma still owns (copies ptxas answers by serializing wgmmas).
ROCJIT_INLINE void mma_m64n128k32_fresh(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b) {
#if ROCJIT_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" ROCJIT_WGMMA_D64_REGS "}, %64, %65, p, 1, 1;\n}\n"
        : ROCJIT_WGMMA_D64("=f", d)
        : "l"(desc_a), "l"(desc_b), "r"(0));
#else
    (void)d; (void)desc_a; (void)desc_b;
    unsupported_on_target();
#endif
}
// A wider column block for 128-row tiles whose partial and accumulator both stay in registers (96 floats each):
// m64n192k32, accumulating when `accumulate` is non-zero.
#define ROCJIT_WGMMA_D96_REGS ROCJIT_WGMMA_D64_REGS "," \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
ROCJIT_INLINE void mma_m64n192k32(float (&d)[96], unsigned long long desc_a, unsigned long long desc_b, int accumulate) {
#if ROCJIT_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {" ROCJIT_WGMMA_D96_REGS "}, %96, %97, p, 1, 1;\n}\n"
        : ROCJIT_WGMMA_D64("+f", d), ROCJIT_WGMMA_D8("+f", d, 64), ROCJIT_WGMMA_D8("+f", d, 72),
          ROCJIT_WGMMA_D8("+f", d, 80), ROCJIT_WGMMA_D8("+f", d, 88)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
    (void)d; (void)desc_a; (void)desc_b; (void)accumulate;
    unsupported_on_target();
#endif
}
#undef ROCJIT_WGMMA_D96_REGS
#undef ROCJIT_WGMMA_D64
#undef ROCJIT_WGMMA_D8
#undef ROCJIT_WGMMA_D64_REGS


// Small-N forms for skinny products (64 weight rows as A, N = 8 / 16 / 32 activation rows as B), always
// accumulating: e4m3 (k32) and bf16 / f16 (k16, both K-major). Each reads 32 bytes of K per operand row, so the
// descriptors advance as for mma_m64n64k32 above. d[N / 2] per thread, in the accumulator layout described above.
#define ROCJIT_WG_D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#if ROCJIT_HAS_WGMMA
#define ROCJIT_WG_SMALL(FN, INSTR, TAIL, R, REGS, DESCS, ...)                                                   \
    ROCJIT_INLINE void FN(float (&d)[R], unsigned long long da, unsigned long long db) {                        \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #R ", 0;\n" INSTR " " REGS ", " DESCS ", p, " TAIL ";\n}\n" \
                     : __VA_ARGS__ : "r"(1), "l"(da), "l"(db));                                                   \
    }
#else
#define ROCJIT_WG_SMALL(FN, INSTR, TAIL, R, REGS, DESCS, ...)                                                   \
    ROCJIT_INLINE void FN(float (&d)[R], unsigned long long da, unsigned long long db) {                        \
        (void)d; (void)da; (void)db;                                                                             \
        unsupported_on_target();                                                                                 \
    }
#endif
// Register-A forms for skinny products: A (64 weight rows x 32 bytes of K) from registers, B (N = 8 / 16 / 32
// activation rows) from shared memory, D = A B written fresh (scale-d = 0). In warp w of the group, lane l gives
// a0 / a2 = 4 bytes of row 16 w + l / 4 at K bytes 4 (l % 4) and 16 + 4 (l % 4) of the step, a1 / a3 the same of
// row + 8 (the mma.sync m16n8k32 / m16n8k16 A fragment; 4 bytes are four e4m3 or two 16-bit values). A register
// operand may be rewritten only after wait() has seen its group complete; wgmma_fence() must precede the first
// wgmma that reads registers other instructions wrote.
#define ROCJIT_WG_W4(i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3])
#if ROCJIT_HAS_WGMMA
#define ROCJIT_WG_RS(FN, INSTR, TAIL, R, REGS, OPS, ...)                                                         \
    ROCJIT_INLINE void FN(float (&d)[R], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long db) { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " OPS ";\n" INSTR " " REGS ", p, " TAIL ";\n}\n"              \
                     : __VA_ARGS__ : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(0));                      \
    }
#else
#define ROCJIT_WG_RS(FN, INSTR, TAIL, R, REGS, OPS, ...)                                                         \
    ROCJIT_INLINE void FN(float (&d)[R], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long db) { \
        (void)d; (void)a0; (void)a1; (void)a2; (void)a3; (void)db;                                                \
        unsupported_on_target();                                                                                 \
    }
#endif
#define ROCJIT_WG_R4 "{%0, %1, %2, %3}"
#define ROCJIT_WG_R8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define ROCJIT_WG_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
// register-A operand lists: "{d...}, {a0..a3}, desc", the predicate's zero operand after them
#define ROCJIT_WG_RS4 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8"
#define ROCJIT_WG_RS8 "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12"
#define ROCJIT_WG_RS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20"
// T_n8 / _n16 / _n32 (both operands in shared memory) and T_rs_n8 / _rs_n16 / _rs_n32 (A in registers) of element
// type T, K values per instruction (32 bytes of K per row either way), the instructions' trailing immediates (16-bit
// types: transposes of A and B, none for a register A; e4m3 has none).
#define ROCJIT_WG_TYPE(T, K, SS_TAIL, RS_TAIL)                                                                    \
    ROCJIT_WG_SMALL(T##_n8, "wgmma.mma_async.sync.aligned.m64n8k" #K ".f32." #T "." #T, SS_TAIL, 4, ROCJIT_WG_R4,   \
                    "%5, %6", ROCJIT_WG_D4(0))                                                                    \
    ROCJIT_WG_SMALL(T##_n16, "wgmma.mma_async.sync.aligned.m64n16k" #K ".f32." #T "." #T, SS_TAIL, 8, ROCJIT_WG_R8, \
                    "%9, %10", ROCJIT_WG_D4(0), ROCJIT_WG_D4(4))                                                  \
    ROCJIT_WG_SMALL(T##_n32, "wgmma.mma_async.sync.aligned.m64n32k" #K ".f32." #T "." #T, SS_TAIL, 16,             \
                    ROCJIT_WG_R16, "%17, %18", ROCJIT_WG_D4(0), ROCJIT_WG_D4(4), ROCJIT_WG_D4(8), ROCJIT_WG_D4(12)) \
    ROCJIT_WG_RS(T##_rs_n8, "wgmma.mma_async.sync.aligned.m64n8k" #K ".f32." #T "." #T, RS_TAIL, 4, ROCJIT_WG_RS4, \
                 "%9, 0", ROCJIT_WG_W4(0))                                                                        \
    ROCJIT_WG_RS(T##_rs_n16, "wgmma.mma_async.sync.aligned.m64n16k" #K ".f32." #T "." #T, RS_TAIL, 8,              \
                 ROCJIT_WG_RS8, "%13, 0", ROCJIT_WG_W4(0), ROCJIT_WG_W4(4))                                      \
    ROCJIT_WG_RS(T##_rs_n32, "wgmma.mma_async.sync.aligned.m64n32k" #K ".f32." #T "." #T, RS_TAIL, 16,             \
                 ROCJIT_WG_RS16, "%21, 0", ROCJIT_WG_W4(0), ROCJIT_WG_W4(4), ROCJIT_WG_W4(8), ROCJIT_WG_W4(12))
ROCJIT_WG_TYPE(e4m3, 32, "1, 1", "1, 1")
ROCJIT_WG_TYPE(bf16, 16, "1, 1, 0, 0", "1, 1, 0")
ROCJIT_WG_TYPE(f16, 16, "1, 1, 0, 0", "1, 1, 0")
#undef ROCJIT_WG_TYPE
#undef ROCJIT_WG_SMALL
#undef ROCJIT_WG_RS
#undef ROCJIT_WG_D4
#undef ROCJIT_WG_W4
#undef ROCJIT_WG_R4
#undef ROCJIT_WG_R8
#undef ROCJIT_WG_R16
#undef ROCJIT_WG_RS4
#undef ROCJIT_WG_RS8
#undef ROCJIT_WG_RS16

// Keeps the compiler from moving register-operand writes across wgmma issue and wait.
ROCJIT_INLINE void fence_operand(unsigned& r) {
#if ROCJIT_HAS_WGMMA
    asm volatile("" : "+r"(r) :: "memory");
#else
    (void)r;
#endif
}

// m64nNk32 by its N (d: N / 2 floats per thread)
template <int N> struct mma_n;
template <> struct mma_n<64> {
    static ROCJIT_INLINE void run(float (&d)[32], unsigned long long a, unsigned long long b, int acc) {
        mma_m64n64k32(d, a, b, acc);
    }
};
template <> struct mma_n<128> {
    static ROCJIT_INLINE void run(float (&d)[64], unsigned long long a, unsigned long long b, int acc) {
        mma_m64n128k32(d, a, b, acc);
    }
};
template <> struct mma_n<192> {
    static ROCJIT_INLINE void run(float (&d)[96], unsigned long long a, unsigned long long b, int acc) {
        mma_m64n192k32(d, a, b, acc);
    }
};

// Named barrier ID over THREADS threads (a multiple of 32): the warps that execute it wait for each other.
template <int ID, int THREADS> ROCJIT_INLINE void bar_sync() {
#if ROCJIT_NVIDIA
    asm volatile("bar.sync %0, %1;" :: "n"(ID), "n"(THREADS) : "memory");
#else
    __syncthreads();
#endif
}

}  // namespace wgmma
}  // namespace rocjit
