// Rows processed in chunks of 8 consecutive elements: one 16-byte access (fp16/bf16) when
// the row is aligned and its length a multiple of 8 (kAligned), else per-element accesses
// guarded by the row length (the general path for any hidden size).
#pragma once
#include "rocjit/platform.h"
#include "rocjit/types.h"
#include "rocjit/vec.h"
#include "rocjit/fp8.h"

namespace rocjit {

constexpr int kChunk = 8;

template <class T> using chunk_t = vec<T, kChunk>;

template <class T>
ROCJIT_INLINE chunk_t<T> zero_chunk() {
    chunk_t<T> c;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) c[i] = from_float<T>(0.0f);
    return c;
}

// Elements [col, col + 8) of a row of length n; those past n read as zero.
template <bool kAligned, bool kStream = false, class T>
ROCJIT_INLINE chunk_t<T> load_chunk(const T* row, int col, int n) {
    if constexpr (kAligned) {
        return kStream ? load_vec_stream<kChunk>(row + col) : load_vec<kChunk>(row + col);
    } else {
        chunk_t<T> c = zero_chunk<T>();
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            if (col + i < n) c[i] = row[col + i];
        return c;
    }
}

template <bool kAligned, bool kStream = false, class T>
ROCJIT_INLINE void store_chunk(T* row, int col, int n, const chunk_t<T>& c) {
    if constexpr (kAligned) {
        if constexpr (kStream) store_vec_stream<kChunk>(row + col, c); else store_vec<kChunk>(row + col, c);
    } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            if (col + i < n) row[col + i] = c[i];
    }
}

// Eight fp8 bytes (lo = elements 0..3, hi = 4..7) into a byte row.
template <bool kAligned, bool kStream = false>
ROCJIT_INLINE void store_fp8_chunk(unsigned char* row, int col, int n, unsigned int lo, unsigned int hi) {
    if constexpr (kAligned) {
        vec<unsigned int, 2> v;
        v[0] = lo;
        v[1] = hi;
        if constexpr (kStream) store_vec_stream<2>(reinterpret_cast<unsigned int*>(row + col), v);
        else store_vec<2>(reinterpret_cast<unsigned int*>(row + col), v);
    } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            if (col + i < n) row[col + i] = (unsigned char)((i < 4 ? lo >> (8 * i) : hi >> (8 * (i - 4))) & 0xffu);
    }
}

// Packed add of two chunks (correctly rounded in T, like adding in fp32 and rounding).
template <class T>
ROCJIT_INLINE chunk_t<T> add_chunks(const chunk_t<T>& a, const chunk_t<T>& b) {
    typedef vec<packed_t<T>, kChunk / 2> pairs;
    pairs pa = bit_cast<pairs>(a), pb = bit_cast<pairs>(b);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) pa[i] = add2(pa[i], pb[i]);
    return bit_cast<chunk_t<T>>(pa);
}

template <class T>
ROCJIT_INLINE void chunk_to_float(const chunk_t<T>& c, float (&f)[kChunk]) {
    typedef vec<packed_t<T>, kChunk / 2> pairs;
    pairs p = bit_cast<pairs>(c);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) {
        float2 v = to_float2(p[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

template <class T>
ROCJIT_INLINE chunk_t<T> float_to_chunk(const float (&f)[kChunk]) {
    typedef vec<packed_t<T>, kChunk / 2> pairs;
    pairs p;
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) p[i] = from_float2<packed_t<T>>(make_float2(f[2 * i], f[2 * i + 1]));
    return bit_cast<chunk_t<T>>(p);
}

// Output modes shared by the fused kernels.
constexpr int kQuantNone = 0;    // same dtype as the input
constexpr int kQuantStatic = 1;  // fp8 with a given per-tensor scale
constexpr int kQuantToken = 2;   // fp8 with a dynamic scale per row
constexpr float kMinAmax = 1e-12f;  // all-zero rows get a tiny, finite scale

}  // namespace rocjit
