"""Stage 4c (C++ backend): the preamble every C++ kernel's source starts with.

Input -> output: nothing -> C++ text (``PREAMBLE``) that ``cpp.py`` puts before each kernel: the
includes (``<algorithm>`` for the column layout's ``std::min``), NaN-propagating ``max``/``min``,
bfloat16 conversions, ``fp-contract=off`` (see [Note: one rounding per op] in cpp.py), and the
``TOYCOMP_SAME_LIBM_1``/``_2`` macros through which a kernel calls float ``sinf``/``expf``/...
(see [Note: vectorised libm] in cpp.py). A kernel that calls ``sinf`` writes
``TOYCOMP_SAME_LIBM_1(sinf)`` after it and calls ``toycomp_sinf``::

    >>> "TOYCOMP_SAME_LIBM_1(fn)" in PREAMBLE and "fp-contract=off" in PREAMBLE
    True

NB: in PyTorch this lives in torch/_inductor/codegen/cpp_prefix.h (included by every C++ kernel).
"""

# The machinery of [Note: vectorised libm], in every kernel's preamble (it is only macros and
# types until a kernel uses TOYCOMP_SAME_LIBM_1(sinf)). x86_64 with GCC only: elsewhere a kernel
# falls back to the scalar functions.
SAME_LIBM = r"""#if defined(__x86_64__) && defined(__GNUC__)
// One implementation per function: glibc's widest vector version for this CPU.
#if defined(__AVX512F__)
#define TOYCOMP_LANES 16
#define TOYCOMP_LIBMVEC(v, fn) _ZGVeN16##v##_##fn
#define TOYCOMP_CLONES(C, fn) C(b, 4, fn) C(c, 8, fn) C(d, 8, fn) C(e, 16, fn)
#elif defined(__AVX2__)
#define TOYCOMP_LANES 8
#define TOYCOMP_LIBMVEC(v, fn) _ZGVdN8##v##_##fn
#define TOYCOMP_CLONES(C, fn) C(b, 4, fn) C(c, 8, fn) C(d, 8, fn)
#elif defined(__AVX__)
#define TOYCOMP_LANES 8
#define TOYCOMP_LIBMVEC(v, fn) _ZGVcN8##v##_##fn
#define TOYCOMP_CLONES(C, fn) C(b, 4, fn) C(c, 8, fn)
#else
#define TOYCOMP_LANES 4
#define TOYCOMP_LIBMVEC(v, fn) _ZGVbN4##v##_##fn
#define TOYCOMP_CLONES(C, fn) C(b, 4, fn)
#endif
typedef float toycomp_vec __attribute__((vector_size(4 * TOYCOMP_LANES)));
typedef float toycomp_v4 __attribute__((vector_size(16)));
typedef float toycomp_v8 __attribute__((vector_size(32)));
typedef float toycomp_v16 __attribute__((vector_size(64)));
#define TOYCOMP_HIDDEN extern "C" __attribute__((visibility("hidden")))
// The first n floats at p (at most TOYCOMP_LANES) as a vector, the other lanes 0; and back.
inline toycomp_vec toycomp_load(const float* p, int n) {
    toycomp_vec v = {};
    std::memcpy(&v, p, sizeof(float) * (n < TOYCOMP_LANES ? n : TOYCOMP_LANES));
    return v;
}
inline void toycomp_store(float* p, toycomp_vec v, int n) {
    std::memcpy(p, &v, sizeof(float) * (n < TOYCOMP_LANES ? n : TOYCOMP_LANES));
}
// toycomp_sinf: GCC calls it on one float, and its SIMD clones _ZGV<isa>N<n>v_toycomp_sinf on
// n floats; all of them compute through toycomp_sinf_lanes, TOYCOMP_LANES floats at a time.
#define TOYCOMP_SAME_LIBM_1(fn)                                                               \
    extern "C" toycomp_vec TOYCOMP_LIBMVEC(v, fn)(toycomp_vec);                               \
    inline void toycomp_##fn##_lanes(float* out, int n, const float* a) {                     \
        for (int k = 0; k < n; k += TOYCOMP_LANES)                                            \
            toycomp_store(out + k, TOYCOMP_LIBMVEC(v, fn)(toycomp_load(a + k, n - k)), n - k); \
    }                                                                                         \
    extern "C" float toycomp_##fn(float) __attribute__((__simd__("notinbranch")));            \
    TOYCOMP_HIDDEN float toycomp_##fn##_scalar(float a) __asm__("toycomp_" #fn);              \
    float toycomp_##fn##_scalar(float a) {                                                    \
        float r;                                                                              \
        toycomp_##fn##_lanes(&r, 1, &a);                                                      \
        return r;                                                                             \
    }                                                                                         \
    TOYCOMP_CLONES(TOYCOMP_CLONE_1, fn)
#define TOYCOMP_CLONE_1(isa, n, fn)                                                           \
    TOYCOMP_HIDDEN toycomp_v##n _ZGV##isa##N##n##v_toycomp_##fn(toycomp_v##n a) {             \
        toycomp_v##n r;                                                                       \
        toycomp_##fn##_lanes((float*)&r, n, (const float*)&a);                                \
        return r;                                                                             \
    }
#define TOYCOMP_SAME_LIBM_2(fn)                                                               \
    extern "C" toycomp_vec TOYCOMP_LIBMVEC(vv, fn)(toycomp_vec, toycomp_vec);                 \
    inline void toycomp_##fn##_lanes(float* out, int n, const float* a, const float* b) {     \
        for (int k = 0; k < n; k += TOYCOMP_LANES) {                                          \
            toycomp_vec va = toycomp_load(a + k, n - k), vb = toycomp_load(b + k, n - k);     \
            toycomp_store(out + k, TOYCOMP_LIBMVEC(vv, fn)(va, vb), n - k);                   \
        }                                                                                     \
    }                                                                                         \
    extern "C" float toycomp_##fn(float, float) __attribute__((__simd__("notinbranch")));     \
    TOYCOMP_HIDDEN float toycomp_##fn##_scalar(float a, float b) __asm__("toycomp_" #fn);     \
    float toycomp_##fn##_scalar(float a, float b) {                                           \
        float r;                                                                              \
        toycomp_##fn##_lanes(&r, 1, &a, &b);                                                  \
        return r;                                                                             \
    }                                                                                         \
    TOYCOMP_CLONES(TOYCOMP_CLONE_2, fn)
#define TOYCOMP_CLONE_2(isa, n, fn)                                                           \
    TOYCOMP_HIDDEN toycomp_v##n _ZGV##isa##N##n##vv_toycomp_##fn(toycomp_v##n a,              \
                                                                 toycomp_v##n b) {            \
        toycomp_v##n r;                                                                       \
        toycomp_##fn##_lanes((float*)&r, n, (const float*)&a, (const float*)&b);              \
        return r;                                                                             \
    }
#endif
"""

PREAMBLE = r"""#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <omp.h>

// Every op rounds once, as in eager PyTorch (see [Note: one rounding per op] in cpp.py).
#pragma GCC optimize("fp-contract=off")
// max/min that propagate NaN like torch.maximum / torch.amax (std::max would drop it).
template <typename T> inline T max_propagate_nan(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> inline T min_propagate_nan(T a, T b) { return (a < b || a != a) ? a : b; }
// bfloat16 is stored as the top 16 bits of a float (round to nearest even on the way back).
inline float bf16_to_float(uint16_t bits) {
    uint32_t u = uint32_t(bits) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline uint16_t float_to_bf16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if (f != f) return 0x7fc0;
    return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
""" + SAME_LIBM
