// Decode attention: out = softmax(q k^T * scale + mask) v for a few query rows of each sequence against its
// key / value cache, with grouped-query heads (Hq = G * Hkv query heads, G of them per key / value head).
//   q    [B, Hq, S, D]   any strides, the last dimension contiguous
//   k, v [B, Hkv, L, D]  any strides, the last dimension contiguous (a static cache's tensors as they are)
// Strides are in elements (each below 2^31; offsets are 64-bit).
//   mask none | bool [B, Hq, S, L] (false: masked) | additive (q's dtype), broadcast dimensions with stride 0
//   causal: query s of S sees keys 0 .. L - S + s (the queries are the last S positions of the cache)
//   out  [B, S, Hq, D] contiguous: what the attention's output projection reads as [B, S, Hq * D]
// decode_attention_kernel: block (b * Hkv + kv head, split, row group) of kWarps waves. Its kRows query rows
// (row r = g * S + s, g the query head within the group) share every K / V row the block reads; each lane group
// has kUnroll keys in flight per iteration (the host sizes waves and unroll to the keys: at a short cache many
// waves with few keys each, since a block's waves are all an SM has to hide latency with). kLanes lanes hold one key's D
// elements as 8-element chunks, so a wave works on kWaveSize / kLanes keys at a time; each lane group keeps its
// own online-softmax state (running max, sum, weighted V), merged across the wave by shuffles and across the
// block's waves through shared memory. Scores live in the log2 domain (q is pre-multiplied by scale * log2 e).
// With one split the block writes out; with several, each writes its unnormalised partial (acc, max, sum) and
// decode_attention_combine merges the splits of a row. A row whose keys are all masked gets zeros.
// kRope (one new token per sequence, S == 1): q and the new key arrive before the rotary embedding, which the
// kernel applies (x cos + rotate_half(x) sin, rotate_half(x) = [-x[D/2:], x[:D/2]], in fp32; the key rounded to T
// as the cache stores it), and the new key / value go into the cache at position *pos (the blocks whose keys
// hold that position use the new values from registers, and the first row group writes them; every other key
// is read as it is). A position outside 0 .. L - 1 writes nothing and makes every output NaN.
// kAdvance (with kRope): the position also grows by one, as a static cache layer's length does after an update,
// with no kernel of its own. Blocks read the position as its low word; once done reading, each adds 2^32 to it
// atomically, and the add's return says how many blocks came before (its high word less the position's own,
// the sign of the low word); the last block stores the position + 1, which clears the high word. Exact for
// positions in int32 range; the high word is not the position's while the kernel runs (nothing else reads it).
//   knew, vnew [B, Hkv, 1, D] (strides nb / nh, vnb / vnh); cos, sin [B or 1, 1, D] (batch stride cb)
// Every kernel here waits for the kernel ahead of it before touching memory (grid_dependency_sync):
// rocjit may launch them to overlap that kernel's tail (programmatic dependent launch, sm_90+).
// rocjit:pdl
#include <hip/hip_runtime.h>
#include "rocjit/chunk.h"
#include "rocjit/warp.h"
#include "rocjit/stream.h"

using namespace rocjit;

namespace attn {
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNoScore = -1e30f;           // the running max before any key (finite: exp2 of differences stays defined)
constexpr int kMaskBool = 1, kMaskAdd = 2;   // 0: no mask
constexpr float kMasked = -3.0e38f;            // a masked key's score: exp2 of it less any max is 0

constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

template <int kD> struct layout {
    static_assert(kD % kChunk == 0, "head_dim is a multiple of 8");
    static constexpr int kDChunks = kD / kChunk;
    static_assert(kDChunks <= kWaveSize, "one wave holds a key's chunks");
    static constexpr int kLanes = pow2_at_least(kDChunks);     // lanes per key (those past kDChunks idle)
    static constexpr int kKeysPerWave = kWaveSize / kLanes;
};

// Elements [col, col + 8) of row rotated: x cos + rotate_half(x) sin (col and D / 2 multiples of 8, so a chunk
// and its partner lie in opposite halves).
template <bool kAligned, int kD, class T>
ROCJIT_INLINE void rope_chunk(const T* row, const T* cs, const T* sn, int col, float (&f)[kChunk]) {
    constexpr int kHalf = kD / 2;
    static_assert(kHalf % kChunk == 0, "rotary halves of whole chunks: D a multiple of 16");
    float x[kChunk], y[kChunk], c[kChunk], s[kChunk];
    chunk_to_float(load_chunk<kAligned>(row, col, kD), x);
    chunk_to_float(load_chunk<kAligned>(row, col < kHalf ? col + kHalf : col - kHalf, kD), y);
    chunk_to_float(load_chunk<kAligned>(cs, col, kD), c);
    chunk_to_float(load_chunk<kAligned>(sn, col, kD), s);
    const float sign = col < kHalf ? -1.0f : 1.0f;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) f[j] = fmaf(x[j], c[j], sign * y[j] * s[j]);
}

}  // namespace attn

// kAdvance: this block is done reading the position p (read as its low word): it counts itself in the high word,
// and the last block of the launch stores p + 1, which also clears the high word (see the top of this file).
ROCJIT_INLINE void advance_position(long long* pos_ptr, long long p) {
    __threadfence();             // the block's reads of the position come before its count
    const unsigned long long old = atomicAdd(reinterpret_cast<unsigned long long*>(pos_ptr), 1ull << 32);
    const unsigned before = (unsigned)(old >> 32) - (p < 0 ? 0xffffffffu : 0u);   // blocks counted before this one
    if (before == gridDim.x * gridDim.y * gridDim.z - 1) *pos_ptr = p + 1;
}

template <class T, int kD, int kRows, int kMask, bool kAligned, int kWarps, int kUnroll, bool kRope, bool kAdvance>
__launch_bounds__(kWarps * kWaveSize) __global__ void decode_attention_kernel(
        T* out, float* part, float* part_ml, const T* q, const T* k, const T* v, const void* mask, int kv_heads,
        int group_size, int S, int L, int keys_per_split, int qb, int qh, int qs, int kb, int kh, int kl, int vb,
        int vh, int vl, int mb, int mh, int ms, int ml, float scale, int causal, const T* knew, const T* vnew,
        const T* rcos, const T* rsin, long long* pos_ptr, int nb, int nh, int vnb, int vnh, int cb) {
    using namespace attn;
    typedef layout<kD> Lay;
    static_assert(kRows <= 4 && kUnroll <= 8, "at most 4 query rows and 8 keys per lane group in flight");
    static_assert(kRope || !kAdvance, "only a rotary step advances its position");
    static_assert(kWarps * kRows * kD <= 8192, "the waves' partial results fit 32 KB of shared memory");
    constexpr int kKeysPerIter = kWarps * Lay::kKeysPerWave * kUnroll;
    __shared__ float s_acc[kWarps][kRows][kD];
    __shared__ float s_m[kWarps][kRows], s_l[kWarps][kRows];
    const int lane = threadIdx.x % kWaveSize, warp = threadIdx.x / kWaveSize;
    const int group = lane / Lay::kLanes, sub = lane % Lay::kLanes;
    const bool has_col = sub < Lay::kDChunks;
    const int col = has_col ? sub * kChunk : 0;
    const int b = blockIdx.x / kv_heads, hkv = blockIdx.x % kv_heads;
    const int split = blockIdx.y, nsplit = gridDim.y;
    const int row0 = blockIdx.z * kRows, rows = group_size * S;
    const int hq = kv_heads * group_size;
    const T* kp = k + (long long)b * kb + (long long)hkv * kh + col;
    const T* vp = v + (long long)b * vb + (long long)hkv * vh + col;
    const int l_begin = split * keys_per_split;
    const int l_end = min(L, l_begin + keys_per_split);
    // the first iteration's keys and values into L2 while the kernel ahead finishes (a prefetch reads no value,
    // so it may come before the wait even where that kernel writes them; H100, compiled 4-layer FP8 Llama with
    // 72-key caches: 522 -> 517.5 us per token)
    if (has_col) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int key = l_begin + (u * kWarps + warp) * Lay::kKeysPerWave + group;
            if (key < l_end) {
                prefetch_l2_early(kp + (long long)key * kl);
                prefetch_l2_early(vp + (long long)key * vl);
            }
        }
    }
    grid_dependency_sync();

    float qf[kRows][kChunk], acc[kRows][kChunk], m[kRows], l[kRows];
    const long long mbase = (long long)b * mb;
    int moff[kRows];             // a row's mask offset within its sequence's mask
    int last_key[kRows];         // the last key a row may see (causal)
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
        const int r = min(row0 + i, rows - 1);   // rows past the last repeat it; never stored
        const int g = r / S, s = r % S, h = hkv * group_size + g;
        const T* qrow = q + (long long)b * qb + (long long)h * qh + (long long)s * qs;
        if constexpr (kRope) {
            if (has_col) rope_chunk<kAligned, kD>(qrow, rcos + (long long)b * cb, rsin + (long long)b * cb, col, qf[i]);
            else chunk_to_float(zero_chunk<T>(), qf[i]);
        } else {
            chunk_t<T> c = zero_chunk<T>();
            if (has_col) c = load_chunk<kAligned>(qrow + col, 0, kChunk);
            chunk_to_float(c, qf[i]);
        }
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
            qf[i][j] *= scale * kLog2e;
            acc[i][j] = 0.0f;
        }
        m[i] = kNoScore;
        l[i] = 0.0f;
        moff[i] = h * mh + s * ms;
        last_key[i] = causal ? L - S + s : L - 1;
    }
    int pos = -1;                // kRope: the new key's position (-1: none, or out of range)
    long long pos_read = 0;      // kRope: the position as read
    chunk_t<T> kn = zero_chunk<T>(), vn = zero_chunk<T>();
    if constexpr (kRope) {
        // kAdvance: the low word, sign-extended (blocks already done may have counted themselves in the high word)
        const long long p = kAdvance ? (long long)(int)(unsigned)(*reinterpret_cast<const unsigned long long*>(pos_ptr)
                                                                  & 0xffffffffull)
                                     : *pos_ptr;
        pos_read = p;
        pos = p >= 0 && p < L ? (int)p : -1;
        if (has_col) {
            float f[kChunk];
            rope_chunk<kAligned, kD>(knew + (long long)b * nb + (long long)hkv * nh, rcos + (long long)b * cb,
                                     rsin + (long long)b * cb, col, f);
            kn = float_to_chunk<T>(f);
            vn = load_chunk<kAligned>(vnew + (long long)b * vnb + (long long)hkv * vnh, col, kD);
        }
        if (pos >= l_begin && pos < l_end && blockIdx.z == 0 && warp == 0 && group == 0 && has_col) {
            store_chunk<kAligned>(const_cast<T*>(kp) - col + (long long)pos * kl, col, kD, kn);
            store_chunk<kAligned>(const_cast<T*>(vp) - col + (long long)pos * vl, col, kD, vn);
        }
    }
    for (int base = l_begin; base < l_end; base += kKeysPerIter) {
        chunk_t<T> kc[kUnroll], vc[kUnroll];
        float madd[kUnroll][kRows];  // additive masks
        unsigned visible[kRows];     // boolean masks: bit u for the iteration's key u
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {  // every load of the iteration in flight before the first use
            const int key = base + (u * kWarps + warp) * Lay::kKeysPerWave + group;
            kc[u] = zero_chunk<T>();
            vc[u] = zero_chunk<T>();
            if (key < l_end && has_col) {
                if (kRope && key == pos) {      // the new key: from registers (its cache row is being written)
                    kc[u] = kn;
                    vc[u] = vn;
                } else {
                    kc[u] = load_chunk<kAligned>(kp + (long long)key * kl, 0, kChunk);
                    vc[u] = load_chunk<kAligned>(vp + (long long)key * vl, 0, kChunk);
                }
            }
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                if (u == 0) visible[i] = 0u;
                madd[u][i] = 0.0f;
                if (key < l_end) {
                    const long long at = mbase + moff[i] + (long long)key * ml;
                    if constexpr (kMask == kMaskBool) {
                        visible[i] |= (static_cast<const unsigned char*>(mask)[at] != 0) << u;
                    } else if constexpr (kMask == kMaskAdd) {
                        madd[u][i] = to_float(static_cast<const T*>(mask)[at]) * kLog2e;
                    }
                }
            }
        }
        // the iteration's scores first (independent: their reductions overlap), then one rescale per row
        float sc[kUnroll][kRows];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int key = base + (u * kWarps + warp) * Lay::kKeysPerWave + group;
            float kf[kChunk];
            chunk_to_float(kc[u], kf);
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < kChunk; ++j) dot = fmaf(qf[i][j], kf[j], dot);
                sc[u][i] = dot;
            }
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                const float dot = group_sum<Lay::kLanes>(sc[u][i]);
                const bool seen = key < l_end && key <= last_key[i] && (kMask != kMaskBool || (visible[i] >> u & 1u));
                sc[u][i] = seen ? dot + madd[u][i] : kMasked;
            }
        }
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
            float mn = m[i];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) mn = fmaxf(mn, sc[u][i]);
            const float corr = fast_exp2(m[i] - mn);
            l[i] *= corr;
#pragma unroll
            for (int j = 0; j < kChunk; ++j) acc[i][j] *= corr;
            m[i] = mn;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            float vf[kChunk];
            chunk_to_float(vc[u], vf);
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
                const float p = fast_exp2(sc[u][i] - m[i]);
                l[i] += p;
#pragma unroll
                for (int j = 0; j < kChunk; ++j) acc[i][j] = fmaf(p, vf[j], acc[i][j]);
            }
        }
    }
    // the lane groups of a wave hold the same columns for different keys: merge them
#pragma unroll
    for (int off = Lay::kLanes; off < kWaveSize; off *= 2) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
            const float mo = shfl_xor(m[i], off), lo = shfl_xor(l[i], off);
            const float mn = fmaxf(m[i], mo);
            const float a = fast_exp2(m[i] - mn), c = fast_exp2(mo - mn);
            l[i] = l[i] * a + lo * c;
#pragma unroll
            for (int j = 0; j < kChunk; ++j) acc[i][j] = acc[i][j] * a + shfl_xor(acc[i][j], off) * c;
            m[i] = mn;
        }
    }
    if (group == 0 && has_col) {
#pragma unroll
        for (int i = 0; i < kRows; ++i)
#pragma unroll
            for (int j = 0; j < kChunk; ++j) s_acc[warp][i][col + j] = acc[i][j];
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
            s_m[warp][i] = m[i];
            s_l[warp][i] = l[i];
        }
    }
    __syncthreads();
    if constexpr (kAdvance) {    // every thread of the block has read the position (above the barrier)
        if (threadIdx.x == 0) advance_position(pos_ptr, pos_read);
    }
    for (int e = threadIdx.x; e < kRows * kD; e += blockDim.x) {
        const int i = e / kD, d = e % kD, r = row0 + i;
        if (r >= rows) break;
        float mx = s_m[0][i];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][i]);
        float sum = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float f = fast_exp2(s_m[w][i] - mx);
            sum = fmaf(s_l[w][i], f, sum);
            o = fmaf(s_acc[w][i][d], f, o);
        }
        const int g = r / S, s = r % S, h = hkv * group_size + g;
        if (kRope && pos < 0) {         // no valid position: NaN out, through the combine too
            o = __int_as_float(0x7fc00000);
            sum = o;
        }
        if (nsplit == 1) {
            out[(((long long)b * S + s) * hq + h) * kD + d] = from_float<T>(!(sum <= 0.0f) ? o / sum : 0.0f);
        } else {
            const long long prow = ((long long)b * hq + h) * S + s;
            part[(prow * nsplit + split) * kD + d] = o;
            if (d == 0) {
                part_ml[(prow * nsplit + split) * 2] = mx;
                part_ml[(prow * nsplit + split) * 2 + 1] = sum;
            }
        }
    }
}

// Merge the splits of each query row: block = one (b, h, s) row, a thread per output element.
template <class T, int kD>
__launch_bounds__(kD) __global__ void decode_attention_combine(T* out, const float* part, const float* part_ml,
                                                                int hq, int S, int nsplit) {
    grid_dependency_sync();
    const long long prow = blockIdx.x;           // (b * hq + h) * S + s
    const int d = threadIdx.x;
    const int s = (int)(prow % S), h = (int)(prow / S % hq);
    const long long b = prow / S / hq;
    float mx = attn::kNoScore;
    for (int j = 0; j < nsplit; ++j) mx = fmaxf(mx, part_ml[(prow * nsplit + j) * 2]);
    float sum = 0.0f, o = 0.0f;
    for (int j = 0; j < nsplit; ++j) {
        const float f = fast_exp2(part_ml[(prow * nsplit + j) * 2] - mx);
        sum = fmaf(part_ml[(prow * nsplit + j) * 2 + 1], f, sum);
        o = fmaf(part[(prow * nsplit + j) * kD + d], f, o);
    }
    out[((b * S + s) * hq + h) * kD + d] = from_float<T>(!(sum <= 0.0f) ? o / sum : 0.0f);   // NaN stays NaN
}

// rocjit:check decode_attention_kernel<__hip_bfloat16, 128, 4, 1, true, 8, 2, false, false>
// rocjit:check decode_attention_kernel<__hip_bfloat16, 128, 4, 0, true, 8, 1, false, false>
// rocjit:check decode_attention_kernel<__half, 64, 2, 2, false, 8, 1, false, false>
// rocjit:check decode_attention_kernel<__half, 256, 4, 1, true, 8, 2, false, false>
// rocjit:check decode_attention_kernel<__hip_bfloat16, 96, 1, 2, true, 8, 2, false, false>
// rocjit:check decode_attention_kernel<__hip_bfloat16, 128, 4, 1, true, 8, 2, true, false>
// rocjit:check decode_attention_kernel<__half, 64, 2, 2, false, 16, 1, true, false>
// rocjit:check decode_attention_kernel<__hip_bfloat16, 256, 4, 0, true, 8, 2, true, false>
// rocjit:check decode_attention_kernel<__hip_bfloat16, 128, 4, 1, true, 8, 2, true, true>
// rocjit:check decode_attention_kernel<__hip_bfloat16, 128, 1, 1, true, 16, 3, true, true>
// rocjit:check decode_attention_kernel<__hip_bfloat16, 128, 2, 1, true, 16, 4, true, true>
// rocjit:check decode_attention_kernel<__half, 256, 2, 1, true, 16, 4, false, false>
// rocjit:check decode_attention_combine<__hip_bfloat16, 128>
// rocjit:check decode_attention_combine<__half, 256>
