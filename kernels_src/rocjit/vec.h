// 16-byte (and 8/4-byte) vector loads and stores: one global_load_dwordx4 on AMD, one
// LDG.E.128 on NVIDIA. Pointers must be aligned to the vector's size.
#pragma once
#include "rocjit/platform.h"

namespace rocjit {

// N elements of T moved as one memory instruction.
template <class T, int N>
struct alignas(sizeof(T) * N) vec {
    T e[N];
    ROCJIT_INLINE T& operator[](int i) { return e[i]; }
    ROCJIT_INLINE const T& operator[](int i) const { return e[i]; }
};

// The raw integer vector of each width, as each compiler likes to see it.
template <int kBytes> struct raw_vec;
#if ROCJIT_AMD
typedef unsigned int u32x2_t __attribute__((ext_vector_type(2)));
typedef unsigned int u32x4_t __attribute__((ext_vector_type(4)));
template <> struct raw_vec<16> { typedef u32x4_t type; };
template <> struct raw_vec<8> { typedef u32x2_t type; };
#else
template <> struct raw_vec<16> { typedef uint4 type; };
template <> struct raw_vec<8> { typedef uint2 type; };
#endif
template <> struct raw_vec<4> { typedef unsigned int type; };
template <> struct raw_vec<2> { typedef unsigned short type; };

// The raw vector that moves N elements of T: the integer vector of the same size, unless T asks for
// lanes of its own width (see rocjit/types.h).
template <class T, int N> struct raw_of { typedef typename raw_vec<sizeof(T) * N>::type type; };

template <class To, class From>
ROCJIT_INLINE To bit_cast(const From& from) {
    static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
    To to;
#if ROCJIT_NVIDIA
    memcpy(&to, &from, sizeof(To));  // NVRTC's device memcpy; folded away
#else
    __builtin_memcpy(&to, &from, sizeof(To));
#endif
    return to;
}

template <int N, class T>
ROCJIT_INLINE vec<T, N> load_vec(const T* p) {
    typedef typename raw_of<T, N>::type raw;
    const raw r = *reinterpret_cast<const raw*>(p);
    return bit_cast<vec<T, N>>(r);
}

template <int N, class T>
ROCJIT_INLINE void store_vec(T* p, const vec<T, N>& v) {
    typedef typename raw_of<T, N>::type raw;
    *reinterpret_cast<raw*>(p) = bit_cast<raw>(v);
}

// Streaming variants for data touched once: they do not displace reused lines from cache
// (NVIDIA evict-first ld/st.cs; AMD nontemporal).
template <int N, class T>
ROCJIT_INLINE vec<T, N> load_vec_stream(const T* p) {
    typedef typename raw_of<T, N>::type raw;
#if ROCJIT_NVIDIA
    return bit_cast<vec<T, N>>(__ldcs(reinterpret_cast<const raw*>(p)));
#else
    return bit_cast<vec<T, N>>(__builtin_nontemporal_load(reinterpret_cast<const raw*>(p)));
#endif
}

template <int N, class T>
ROCJIT_INLINE void store_vec_stream(T* p, const vec<T, N>& v) {
    typedef typename raw_of<T, N>::type raw;
#if ROCJIT_NVIDIA
    __stcs(reinterpret_cast<raw*>(p), bit_cast<raw>(v));
#else
    __builtin_nontemporal_store(bit_cast<raw>(v), reinterpret_cast<raw*>(p));
#endif
}

}  // namespace rocjit
