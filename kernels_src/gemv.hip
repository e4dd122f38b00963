// Portable GEMV / small-batch GEMM: out[b, n] = sum_k W[n, k] x[b, k] for b < B <= MB.
//
// P threads share RT weight rows (a "dot team"): each reads 16 bytes of every row at a time
// (8 f16/bf16, 16 int8/fp8 or 32 int4 values), dequantizes in registers, multiplies with the
// matching activations of every batch row in fp32, and the team sums with xor shuffles. The
// activations are loaded and converted once for the RT rows. A block holds ROWS teams. Runs on
// every target (no matrix instructions); it is the GEMV path for quantized weights and the
// fallback of skinny_gemm.hip.
//
// Weight formats (one 16-byte chunk = `per16` values):
//   f16/bf16       plain
//   i8             per-row scale:   W[n, k] = q * scale[n]
//   i4             two per byte, low nibble first (k even in bits 0-3); group-wise scale and
//                  zero point, G in {32, 64, 128}: W[n, k] = (q - zero[n, k/G]) * scale[n, k/G]
//   e4m3 / e4m3fnuz  W = q * scale_w[0 or n] * scale_a[0] (per-tensor or per-channel)
//
// Programmatic dependent launch (sm_90+): a block asks L2 for its rows' first weights, then waits for the kernel
// ahead before its first load; the next kernel is let in once the weights are read (rocjit/stream.h).
// rocjit:pdl
#include <hip/hip_runtime.h>
#include "rocjit/types.h"   // __half / __hip_bfloat16 on every compiler (hipRTC included)
#include "rocjit/fp8.h"     // widen_e4m3x4
#include "rocjit/stream.h"  // programmatic dependent launch, coherent activation loads
#include "rocjit/epilogue.h"  // skinny_gemm's epilogues (its fused ops run this kernel too)

#if defined(__AMDGCN__)
#define GEMV_WAVE 64
#else
#define GEMV_WAVE 32
#endif

namespace gemv {

// ---- scalar conversions to fp32 ----
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__hip_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }


// Two packed 16-bit values -> two floats.
__device__ __forceinline__ float2 unpack2(unsigned v, __half) {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
}
__device__ __forceinline__ float2 unpack2(unsigned v, __hip_bfloat16) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));  // bf16 = top half of fp32
}

// e4m3 byte -> float, exactly: the 7 exponent+mantissa bits go into an f16's and the bias
// difference becomes a power-of-two scale (2^8 for OCP e4m3fn, 2^7 for e4m3fnuz).
template <bool FNUZ>
__device__ __forceinline__ float fp8_to_float(unsigned b) {
    unsigned short bits = (unsigned short)(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7));
    return __half2float(*reinterpret_cast<const __half*>(&bits)) * (FNUZ ? 128.f : 256.f);
}
// Signed int8 / unsigned int4 -> float through the 2^23 magic number (integer ops + one FADD).
__device__ __forceinline__ float i8_to_float(unsigned byte) {
    return __uint_as_float(0x4B000000u | (byte ^ 0x80u)) - 8388736.f;   // 2^23 + 128
}
// int4: nibble j of a word is left in place (masked, not shifted) inside the 2^23 magic float,
// which gives k * 16^j exactly: one LOP3 + one FADD per weight. Nibbles 5..7 are taken from the
// word shifted right by 12 so every one sits below bit 20 (position j - 3). The activation that
// multiplies nibble j is scaled by 16^-i4_pos(j) first (exact: a power of two), once for all
// rows; the zero point is applied as zero * sum(x) per chunk, so it may be fractional.
__device__ __forceinline__ constexpr int i4_pos(int j) { return j <= 4 ? j : j - 3; }
__device__ __forceinline__ float u4_in_place(unsigned word, int j, unsigned magic) {
    const unsigned src = j <= 4 ? word : word >> 12;
    return __uint_as_float(rocjit::and_or(src, 0xFu << (4 * i4_pos(j)), magic)) - 8388608.f;
}

// ---- weight kinds ----
struct w_f16 { typedef __half storage; static constexpr int per16 = 8; };
struct w_bf16 { typedef __hip_bfloat16 storage; static constexpr int per16 = 8; };
struct w_i8 { typedef signed char storage; static constexpr int per16 = 16; };
struct w_i4 { typedef unsigned char storage; static constexpr int per16 = 32; };  // values per 16 bytes
struct w_e4m3 { typedef unsigned char storage; static constexpr int per16 = 16; static constexpr bool fnuz = false; };
struct w_e4m3fnuz { typedef unsigned char storage; static constexpr int per16 = 16; static constexpr bool fnuz = true; };

// Activation chunks: E values of x starting at p, as floats (16-bit types or fp8 bytes).
template <int E, class XT>
__device__ __forceinline__ void load_x(const XT* p, float (&xf)[E]) {
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
        uint4 v = *reinterpret_cast<const uint4*>(p + 8 * i);
        float2 f0 = unpack2(v.x, XT()), f1 = unpack2(v.y, XT()), f2 = unpack2(v.z, XT()), f3 = unpack2(v.w, XT());
        xf[8 * i + 0] = f0.x; xf[8 * i + 1] = f0.y; xf[8 * i + 2] = f1.x; xf[8 * i + 3] = f1.y;
        xf[8 * i + 4] = f2.x; xf[8 * i + 5] = f2.y; xf[8 * i + 6] = f3.x; xf[8 * i + 7] = f3.y;
    }
}
// Weights are read once: streaming (evict-first) loads keep the activations, which every team of
// every block reads again, in L1 and L2.
__device__ __forceinline__ uint4 load_w16(const uint4* p) {
    return rocjit::bit_cast<uint4>(rocjit::load_vec_stream<4>(reinterpret_cast<const unsigned*>(p)));
}
// Byte / nibble i of a 16-byte chunk (i is a compile-time constant after unrolling).
__device__ __forceinline__ unsigned word_of(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ unsigned byte_of(uint4 v, int i) { return (word_of(v, i / 4) >> (8 * (i % 4))) & 0xFFu; }

// A 16-byte chunk of e4m3 values -> 16 floats, byte i -> f[i]. NVIDIA sm_89+ (OCP e4m3fn only) converts two at a
// time in hardware (rocjit::widen_e4m3x4, exact): 8 conversions and 16 widenings per chunk instead of about five
// integer and float instructions per value.
template <bool FNUZ>
__device__ __forceinline__ void fp8x16_to_float(uint4 v, float (&f)[16]) {
    const unsigned r[4] = {v.x, v.y, v.z, v.w};
#if ROCJIT_NVIDIA && ROCJIT_SM >= 890
    if (!FNUZ) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            unsigned lo, hi;
            rocjit::widen_e4m3x4(r[i], lo, hi);
            const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
            const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
            f[4 * i] = a.x; f[4 * i + 1] = a.y; f[4 * i + 2] = b.x; f[4 * i + 3] = b.y;
        }
        return;
    }
#endif
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = fp8_to_float<FNUZ>((r[i / 4] >> (8 * (i % 4))) & 0xFFu);
}

template <bool FNUZ, int E>
__device__ __forceinline__ void load_x_fp8(const unsigned char* p, float (&xf)[E]) {
    fp8x16_to_float<FNUZ>(*reinterpret_cast<const uint4*>(p), xf);
}

template <class XT, class WK> struct x_loader {
    template <int E> __device__ static void load(const XT* p, float (&xf)[E]) { load_x<E>(p, xf); }
};
template <class WK> struct x_loader<unsigned char, WK> {   // fp8 activations go with fp8 weights
    template <int E> __device__ static void load(const unsigned char* p, float (&xf)[E]) {
        load_x_fp8<WK::fnuz, E>(p, xf);
    }
};

// Dequantize one 16-byte chunk of weights into E floats (int4: minus the zero point; the group
// scale is applied to the chunk's dot product, since a chunk never straddles a group).
template <class WK, int E> struct dequant;
template <int E> struct dequant<w_f16, E> {
    __device__ static void run(uint4 v, float (&wf)[E], unsigned, float) {
        const unsigned r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) { float2 f = unpack2(r[i], __half()); wf[2 * i] = f.x; wf[2 * i + 1] = f.y; }
    }
};
template <int E> struct dequant<w_bf16, E> {
    __device__ static void run(uint4 v, float (&wf)[E], unsigned, float) {
        const unsigned r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) { float2 f = unpack2(r[i], __hip_bfloat16()); wf[2 * i] = f.x; wf[2 * i + 1] = f.y; }
    }
};
template <int E> struct dequant<w_i8, E> {
    __device__ static void run(uint4 v, float (&wf)[E], unsigned, float) {
#pragma unroll
        for (int i = 0; i < 16; ++i) wf[i] = i8_to_float(byte_of(v, i));
    }
};
template <int E> struct dequant<w_i4, E> {   // exact k - zero: shift, LOP3 and two FADDs per weight
    __device__ static void run(uint4 v, float (&wf)[E], unsigned magic, float zero) {
#pragma unroll
        for (int i = 0; i < 32; ++i)
            wf[i] = (__uint_as_float(rocjit::and_or(word_of(v, i / 8) >> (4 * (i % 8)), 0xFu, magic)) - 8388608.f)
                    - zero;
    }
};
// int4, k * 16^i4_pos(i % 8) (see u4_in_place): for activations pre-scaled by 16^-i4_pos.
template <int E>
__device__ __forceinline__ void dequant_i4_in_place(uint4 v, float (&wf)[E], unsigned magic) {
#pragma unroll
    for (int i = 0; i < E; ++i) wf[i] = u4_in_place(word_of(v, i / 8), i % 8, magic);
}
template <int E> struct dequant<w_e4m3, E> {
    __device__ static void run(uint4 v, float (&wf)[E], unsigned, float) { fp8x16_to_float<false>(v, wf); }
};
template <int E> struct dequant<w_e4m3fnuz, E> {
    __device__ static void run(uint4 v, float (&wf)[E], unsigned, float) { fp8x16_to_float<true>(v, wf); }
};

template <class WK> struct is_i4 { static constexpr bool value = false; };
template <> struct is_i4<w_i4> { static constexpr bool value = true; };

// int4 at batch 1: x pre-scaled for in-place nibbles (xf[i] * 16^-i4_pos(i % 8)) and each chunk's sum.
template <int E>
__device__ __forceinline__ float prescale_i4(float (&xf)[E]) {
    float xsum = 0.f;
#pragma unroll
    for (int i = 0; i < E; ++i) {
        xsum += xf[i];
        xf[i] *= 1.f / (float)(1u << (4 * i4_pos(i % 8)));
    }
    return xsum;
}

}  // namespace gemv

// XT: activation type (__half, __hip_bfloat16, or unsigned char for fp8 with fp8 weights);
// WK: weight kind; ST: type of w_scale / w_zero (float or XT); OT: output type.
// P threads per team (a power of two <= wave size), ROWS teams per block, RT rows per team,
// MB >= B batch rows, UNROLL 16-byte loads per row in flight per thread.
// w_scale: int8 [N]; int4 [N, K/G] (+ w_zero [N, K/G]); fp8 [1] or [N] (scale_modes bit 0).
// scale_a: fp8 activations' scale, per tensor [1] or per row [B] (scale_modes bit 1), or nullptr.
// EP (rocjit/epilogue.h): skinny::ep_store (out [B, ldo = N]), skinny::ep_residual (out = residual + value, out may
// be residual itself) or skinny::ep_swiglu<Q> (W's rows interleaved by prepare_gate_up, 8 gate then 8 up rows per
// 16; out [B, ldo = I] = silu(g) * u, FP8 with 1 / out_scale when Q is an FP8 tag); skinny_gemm and its fused ops
// run this kernel where it streams the weights faster than the matrix-core kernels (M = 1, 2).
// x is the kernel ahead's output (programmatic dependent launch): not __restrict__, so that its loads stay plain
// coherent ones (LDG.E.128), never the read-only path, which may be scheduled above the grid-dependency wait; plain
// loads the compiler still issues early, with the step's weights (as volatile asm, rocjit::load16_dep, they were
// issued one by one where used: bf16 2304 x 16384 at M = 2 41.9 against 25.5 us).
template <class XT, class WK, class ST, class OT, int P, int ROWS, int MB, int UNROLL, int RT, class EP>
__launch_bounds__(P * ROWS, 1) __global__ void
gemv_kernel(const typename WK::storage* __restrict__ w, const XT* x, OT* out,
            const ST* __restrict__ w_scale, const ST* __restrict__ w_zero, int group_size, int scale_modes,
            const float* __restrict__ scale_a, int N, int K, int B, const OT* residual, const float* out_scale,
            int ldo) {
    using namespace gemv;
    constexpr int E = WK::per16;
    constexpr bool I4 = is_i4<WK>::value;
    static_assert(EP::kind != 2 || (ROWS * RT) % 16 == 0, "SwiGLU: a block holds whole 16-row gate / up groups");
    const int team = threadIdx.x / P, lp = threadIdx.x % P;
    const int n0 = (blockIdx.x * ROWS + team) * RT;        // this team's rows: n0 .. n0 + RT - 1
    const size_t row_len = I4 ? K / 2 : K;                 // storage elements per row
    const int nchunks = K / E;
    const uint4* wrow[RT];
    int goff[RT];                                          // int4: row's first group in w_scale / w_zero
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int n = n0 + r < N ? n0 + r : 0;
        wrow[r] = reinterpret_cast<const uint4*>(w + (size_t)n * row_len);
        goff[r] = I4 ? n * (K / group_size) : 0;
        if (lp < nchunks) rocjit::prefetch_l2_early(wrow[r] + lp);   // programmatic launch: see the wait below
    }
    // Every load and store below may touch what the kernel ahead writes (activations, their scales, the residual,
    // and the weights themselves where that kernel made them): under programmatic dependent launch this grid may
    // start before that kernel ends, so it waits here; the weights' first lines were asked of L2 above.
    rocjit::grid_dependency_wait();
    // int4: chunk c lies in group c >> gshift (group_size is E << gshift, a power of two)
    const int gshift = I4 ? 31 - __clz(group_size / E) : 0;
    const unsigned magic = 0x4B000000u;   // int4: 2^23, see u4_in_place

    float acc[RT][MB];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int b = 0; b < MB; ++b) acc[r][b] = 0.f;

    for (int c0 = lp; c0 < nchunks; c0 += P * UNROLL) {
        // every load of the step first: weights, and int4's group scale / zero point (a chunk never
        // straddles a group), so no chunk waits on a scale it only asks for when it needs it
        uint4 wv[UNROLL][RT];
        ST zq[UNROLL][RT], sq[UNROLL][RT];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const int c = c0 + u * P, n = n0 + r;
                const bool live = n < N && c < nchunks;
                wv[u][r] = live ? load_w16(wrow[r] + c) : make_uint4(0, 0, 0, 0);
                if (I4) {
                    const int g = goff[r] + (live ? c >> gshift : 0);
                    zq[u][r] = w_zero[g];
                    sq[u][r] = w_scale[g];
                }
            }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int c = c0 + u * P;
            if (c >= nchunks) break;
            float zero[RT], gscale[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                zero[r] = I4 ? to_float(zq[u][r]) : 0.f;     // rows past N: row 0's values, dropped at the end
                gscale[r] = I4 ? to_float(sq[u][r]) : 1.f;
            }
            if (MB == 1) {
                // one activation chunk for the RT rows: loaded, converted (int4: pre-scaled and summed)
                // once; int4 weights dequantized in place, the zero point applied as zero * sum(x)
                float xf[E];
                x_loader<XT, WK>::template load<E>(x + (size_t)c * E, xf);
                const float xsum = I4 ? prescale_i4<E>(xf) : 0.f;
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    float wf[E];
                    if (I4) dequant_i4_in_place(wv[u][r], wf, magic);
                    else dequant<WK, E>::run(wv[u][r], wf, magic, 0.f);
                    float d = 0.f;
#pragma unroll
                    for (int i = 0; i < E; ++i) d = fmaf(wf[i], xf[i], d);
                    acc[r][0] = I4 ? fmaf(gscale[r], fmaf(-zero[r], xsum, d), acc[r][0]) : acc[r][0] + d;
                }
            } else {
                // several batch rows: the RT rows' weights dequantized once (int4: k - zero exactly), then each
                // batch row's activation chunk loaded and converted once for all of them
                float wf[RT][E];
#pragma unroll
                for (int r = 0; r < RT; ++r) dequant<WK, E>::run(wv[u][r], wf[r], magic, zero[r]);
#pragma unroll
                for (int b = 0; b < MB; ++b) {
                    if (b >= B) continue;
                    float xf[E];
                    x_loader<XT, WK>::template load<E>(x + (size_t)b * K + (size_t)c * E, xf);
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        float d = 0.f;
#pragma unroll
                        for (int i = 0; i < E; ++i) d = fmaf(wf[r][i], xf[i], d);
                        acc[r][b] = I4 ? fmaf(gscale[r], d, acc[r][b]) : acc[r][b] + d;
                    }
                }
            }
        }
    }
    rocjit::launch_dependents();   // the weights are read: the next kernel may be scheduled

    // Team reduction: xor butterfly inside the P lanes (fixed order, every lane ends with the sum).
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int b = 0; b < MB; ++b)
#pragma unroll
            for (int off = P / 2; off > 0; off >>= 1) acc[r][b] += __shfl_xor(acc[r][b], off, P);

    // the finished value of (b, n): the dot product times the fp8 / int8 scales (int4's are in the sums)
    auto value = [&](int r, int b, int n) {
        float s = 1.f;
        if (!I4 && w_scale) s = to_float(w_scale[(scale_modes & 1) ? n : 0]);
        return acc[r][b] * s * (scale_a ? rocjit::load_dep(scale_a + ((scale_modes & 2) ? b : 0)) : 1.f);
    };
    const skinny::epilogue<OT> ep = skinny::make_epilogue<EP, OT>(out, residual, out_scale, scale_a, nullptr,
                                                                  scale_modes, B, N, ldo);
    if constexpr (EP::kind == 2) {
        // gate row g and its up row g + 8 belong to different teams: the block's values meet in shared memory
        __shared__ float vals[MB][ROWS * RT];
        if (lp == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
                for (int b = 0; b < MB; ++b)
                    if (b < B) vals[b][team * RT + r] = n0 + r < N ? value(r, b, n0 + r) : 0.f;
        }
        __syncthreads();
        constexpr int kOuts = ROWS * RT / 2;   // outputs of the block per batch row
        for (int i = threadIdx.x; i < kOuts * B; i += P * ROWS) {
            const int b = i / kOuts, j = i % kOuts;
            const int g = 16 * (j / 8) + j % 8, col = blockIdx.x * kOuts + j;
            if (col < ldo) ep.template put_swiglu<EP>(b, col, vals[b][g], vals[b][g + 8]);
        }
        return;
    } else {
        if (lp != 0) return;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const int n = n0 + r;
            if (n < N) {
#pragma unroll
                for (int b = 0; b < MB; ++b)
                    if (b < B) ep.template put<EP>(b, n, value(r, b, n));
            }
        }
    }
}

// rocjit:check gemv_kernel<__half, gemv::w_f16, float, __half, 32, 8, 1, 2, 1, skinny::ep_store>
// rocjit:check gemv_kernel<__half, gemv::w_f16, float, __half, 32, 4, 1, 2, 2, skinny::ep_store>
// rocjit:check gemv_kernel<__hip_bfloat16, gemv::w_bf16, float, __hip_bfloat16, 16, 16, 8, 2, 1, skinny::ep_store>
// rocjit:check gemv_kernel<__half, gemv::w_i8, float, __half, 16, 8, 1, 2, 2, skinny::ep_store>
// rocjit:check gemv_kernel<__half, gemv::w_i4, __half, __half, 32, 4, 1, 1, 4, skinny::ep_store>
// rocjit:check gemv_kernel<__hip_bfloat16, gemv::w_i4, float, __hip_bfloat16, 16, 8, 2, 2, 2, skinny::ep_store>
// rocjit:check gemv_kernel<__hip_bfloat16, gemv::w_i4, float, __hip_bfloat16, 16, 16, 8, 2, 1, skinny::ep_store>
// rocjit:check gemv_kernel<unsigned char, gemv::w_e4m3fnuz, float, __hip_bfloat16, 32, 4, 8, 2, 1, skinny::ep_store>
// rocjit:check gemv_kernel<unsigned char, gemv::w_e4m3, float, __hip_bfloat16, 32, 4, 1, 2, 4, skinny::ep_store>
// rocjit:check gemv_kernel<unsigned char, gemv::w_e4m3, float, __hip_bfloat16, 16, 8, 4, 2, 1, skinny::ep_store>
// rocjit:check gemv_kernel<unsigned char, gemv::w_e4m3, float, unsigned char, 32, 4, 1, 2, 4, skinny::ep_swiglu<rocjit::e4m3fn>>
// rocjit:check gemv_kernel<unsigned char, gemv::w_e4m3fnuz, float, unsigned char, 16, 16, 2, 2, 1, skinny::ep_swiglu<rocjit::e4m3fnuz>>
// rocjit:check gemv_kernel<__hip_bfloat16, gemv::w_bf16, float, __hip_bfloat16, 16, 8, 2, 2, 2, skinny::ep_residual>
// rocjit:check gemv_kernel<__hip_bfloat16, gemv::w_bf16, float, __hip_bfloat16, 32, 4, 1, 2, 4, skinny::ep_swiglu<skinny::no_quant>>
