"""C++ vector math (``toycomp.config.cpp.simdlen``): the macros that follow the preamble.

Input -> output: nothing -> C++ text (``VECTOR_PREAMBLE``) that a C++ kernel starts with when
vector math is on: the core ``PREAMBLE`` (codegen/cpp_prefix.py), then the
``TOYCOMP_SAME_LIBM_1``/``_2`` macros through which a kernel calls float ``expf``/``logf``/...
(see [Note: vectorised libm] in codegen/cpp.py), and toycomp's own vector sin and cos
(``TOYCOMP_SINCOSF``, see [Note: one sincos for sin and cos] in libmvec.py). A kernel that calls
``expf`` writes ``TOYCOMP_SAME_LIBM_1(expf)`` after it and calls ``toycomp_expf``; one that
computes the sine and the cosine of a value writes ``TOYCOMP_SINCOSF(sincosf)`` and calls
``toycomp_sincosf``::

    >>> "TOYCOMP_SAME_LIBM_1(fn)" in VECTOR_PREAMBLE and "fp-contract=off" in VECTOR_PREAMBLE
    True
    >>> "TOYCOMP_SINCOSF(fn)" in VECTOR_PREAMBLE
    True

NB: in PyTorch, Inductor's vectorised C++ includes ATen's ``Vectorized`` headers and Sleef
(torch/_inductor/codegen/cpp_prefix.h).
"""

from toycomp.inductor.codegen.cpp_prefix import PREAMBLE

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
// toycomp_expf: GCC calls it on one float, and its SIMD clones _ZGV<isa>N<n>v_toycomp_expf on
// n floats; all of them compute through toycomp_expf_lanes, TOYCOMP_LANES floats at a time.
// expf is toycomp's own (TOYCOMP_EXPF below); the other functions are glibc's.
#define TOYCOMP_SAME_LIBM_1(fn) TOYCOMP_LIBM_1_##fn(fn)
#define TOYCOMP_LIBM_1_expf(fn) TOYCOMP_EXPF
#define TOYCOMP_LIBM_1_logf(fn) TOYCOMP_GLIBC_1(fn)
#define TOYCOMP_LIBM_1_log1pf(fn) TOYCOMP_GLIBC_1(fn)
#define TOYCOMP_LIBM_1_tanhf(fn) TOYCOMP_GLIBC_1(fn)
#define TOYCOMP_LIBM_1_erff(fn) TOYCOMP_GLIBC_1(fn)
#define TOYCOMP_GLIBC_1(fn)                                                                   \
    extern "C" toycomp_vec TOYCOMP_LIBMVEC(v, fn)(toycomp_vec);                               \
    inline void toycomp_##fn##_lanes(float* out, int n, const float* a) {                     \
        for (int k = 0; k < n; k += TOYCOMP_LANES)                                            \
            toycomp_store(out + k, TOYCOMP_LIBMVEC(v, fn)(toycomp_load(a + k, n - k)), n - k); \
    }                                                                                         \
    TOYCOMP_VECTOR_FN_1(fn)
// The scalar toycomp_<fn> and its clones, given toycomp_<fn>_lanes.
#define TOYCOMP_VECTOR_FN_1(fn)                                                               \
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
// [Note: toycomp's own expf]
// glibc 2.36's _ZGVeN16v_expf, called once per 16 floats through a clone, made exp on 4M floats
// 1.3-2x Inductor's time (Sleef, inlined). This expf is inline code that GCC vectorises in the
// kernel's loop itself: x = n*ln2 + r with |r| <= ln2/2 (n by the 1.5*2^23 shifter, ln 2 in two
// floats, each subtracted by one fma), Cephes' degree-6 polynomial for exp r, then 2^n in two
// halves (2^(n/2) * 2^(n - n/2)) so that results below 2^-126 round once to their subnormal, and
// x clamped to [-104, 89] first (exp is 0 or inf beyond; NaN passes the compares unchanged).
// Explicit fma and fp-contract off: the scalar and every vector lane give the same bits.
// Checked on all 2^32 floats against exp in double: at most 1.02 ulp; NaN, +-inf, 0 as eager.
#define TOYCOMP_EXPF                                                                          \
    _Pragma("omp declare simd notinbranch")                                                   \
    inline float toycomp_expf(float x) {                                                      \
        x = x < -104.0f ? -104.0f : x;                                                        \
        x = x > 89.0f ? 89.0f : x;                                                            \
        float k = __builtin_fmaf(x, 0x1.715476p0f, 0x1.8p23f); /* 1.5*2^23 + n */            \
        float j = k - 0x1.8p23f;                                                              \
        int32_t n;                                                                            \
        std::memcpy(&n, &k, 4);                                                               \
        n -= 0x4b400000;                                                                      \
        float r = __builtin_fmaf(j, -0x1.62e430p-1f, x);                                      \
        r = __builtin_fmaf(j, 0x1.05c610p-29f, r);                                            \
        float p = __builtin_fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);                      \
        p = __builtin_fmaf(p, r, 8.3334519073e-3f);                                           \
        p = __builtin_fmaf(p, r, 4.1665795894e-2f);                                           \
        p = __builtin_fmaf(p, r, 1.6666665459e-1f);                                           \
        p = __builtin_fmaf(p, r, 5.0000001201e-1f);                                           \
        float y = __builtin_fmaf(p, r * r, r) + 1.0f;                                         \
        int32_t b1 = ((n >> 1) + 127) << 23, b2 = ((n - (n >> 1)) + 127) << 23;              \
        float s1, s2;                                                                         \
        std::memcpy(&s1, &b1, 4);                                                             \
        std::memcpy(&s2, &b2, 4);                                                             \
        return y * s1 * s2;                                                                   \
    }
#endif
"""

# toycomp's own float sin and cos: see [Note: one sincos for sin and cos] in libmvec.py. Like
# SAME_LIBM, every lane of every clone and the scalar function run the same code, so a value's
# sine has the same bits alone or next to its cosine, vectorised or not.
SINCOSF = r"""#if defined(__x86_64__) && defined(__GNUC__)
#define TOYCOMP_SINCOS_MAX 8192.0f  // larger |x| (and inf): glibc's sinf and cosf
// [Note: one polynomial for sin and for cos]
// sin x, |x| <= TOYCOMP_SINCOS_MAX: x = j*pi + r with |r| <= pi/2 (j the nearest integer, by the
// 1.5*2^23 shifter; r = x - j*pi in three fma, pi in three parts), then sin x = +-sin r by one
// odd polynomial of degree 9 (Sleef's sinf_u35 coefficients, as eager's), negated when j is odd.
// cos x: x = q*pi/2 + r with q = 2j + 1 odd (j = rint(x/pi - 1/2)), cos x = +-sin r, negated when
// j is even. One polynomial and no quadrant select: a reduction by pi/2 into [-pi/4, pi/4] needs
// sin r and cos r both and a select of the two (1.3x the time on 4M floats). The sign flip is
// one xor of the bits (no branch: GCC vectorises it without masked instructions).
inline float toycomp_sin_poly(float r, uint32_t flip) {  // (-1)^flip * sin r, |r| <= pi/2
    float r2 = r * r;
    float u = __builtin_fmaf(2.6083159809786593541503e-06f, r2, -1.981069071916863322258e-4f);
    u = __builtin_fmaf(u, r2, 8.33307858556509017944336e-3f);
    u = __builtin_fmaf(u, r2, -0.166666597127914428710938f);
    float y = __builtin_copysignf(__builtin_fmaf(r2, u * r, r), r);  // sin(-0.0) = -0.0
    uint32_t bits;
    std::memcpy(&bits, &y, 4);
    bits ^= flip << 31;
    std::memcpy(&y, &bits, 4);
    return y;
}
template <bool S, bool C> inline void toycomp_sincosf_1(float x, float* s, float* c) {
    if constexpr (S) {
        float k = __builtin_fmaf(x, 0x1.45f306p-2f, 0x1.8p23f);  // 1.5*2^23 + j, j = rint(x/pi)
        uint32_t q;
        std::memcpy(&q, &k, 4);  // its low bit: j mod 2
        float j = k - 0x1.8p23f;
        float r = __builtin_fmaf(j, -0x1.921fb4p1f, x);  // three parts below pi: j = +0 gives
        r = __builtin_fmaf(j, -0x1.4442d0p-23f, r);        // -0 products, and -0 + -0 = -0, so
        r = __builtin_fmaf(j, -0x1.84698ap-47f, r);        // that r = x when x = -0.0
        *s = toycomp_sin_poly(r, q & 1);
    }
    if constexpr (C) {
        float k = __builtin_fmaf(x, 0x1.45f306p-2f, -0.5f) + 0x1.8p23f;  // 1.5*2^23 + j
        uint32_t q;
        std::memcpy(&q, &k, 4);
        float h = (k - 0x1.8p23f) * 2.0f + 1.0f;  // q = 2j + 1 (exact: |j| < 2^12)
        float r = __builtin_fmaf(h, -0x1.921fb4p0f, x);  // x - q*pi/2, pi/2 in three parts
        r = __builtin_fmaf(h, -0x1.4442d0p-24f, r);
        r = __builtin_fmaf(h, -0x1.84698ap-48f, r);
        *c = toycomp_sin_poly(r, ~q & 1);  // cos x = sin r for j odd, -sin r for j even
    }
}
// Whether any of the n floats at a is beyond TOYCOMP_SINCOS_MAX (or NaN), with one compare of
// their bits for a clone's vector (GCC's builtins: <immintrin.h> costs 0.3 s a compile).
typedef int32_t toycomp_v8i __attribute__((vector_size(32)));
typedef int32_t toycomp_v16i __attribute__((vector_size(64)));
inline bool toycomp_sincos_big(const float* a, int n) {
    const int32_t big = 0x46000000;  // the bits of 8192.0f
#if defined(__AVX512F__) && !defined(__clang__)
    if (n == 16) {
        toycomp_v16i bits;
        std::memcpy(&bits, a, 64);
        return __builtin_ia32_pcmpgtd512_mask(bits & 0x7fffffff, bits * 0 + big, 0xffff);
    }
#endif
#if defined(__AVX__) && !defined(__clang__)
    if (n == 8) {
        toycomp_v8i bits;
        std::memcpy(&bits, a, 32);
        return __builtin_ia32_movmskps256((toycomp_v8)((bits & 0x7fffffff) > big));
    }
#endif
    bool any = false;
    for (int k = 0; k < n; k++)
        any |= std::fabs(a[k]) > TOYCOMP_SINCOS_MAX;
    return any;
}
template <bool S, bool C> inline void toycomp_sincosf_lanes(float* s, float* c, int n,
                                                            const float* a) {
    _Pragma("omp simd")  // (one vector when n is a clone's width)
    for (int k = 0; k < n; k++)
        toycomp_sincosf_1<S, C>(a[k], s + k, c + k);
    if (__builtin_expect(toycomp_sincos_big(a, n), 0))
        for (int k = 0; k < n; k++)
            if (std::fabs(a[k]) > TOYCOMP_SINCOS_MAX) {
                if constexpr (S) s[k] = sinf(a[k]);
                if constexpr (C) c[k] = cosf(a[k]);
            }
}
// TOYCOMP_SINCOSF(sinf), (cosf): toycomp_sinf / toycomp_cosf and their clones, as SAME_LIBM's;
// TOYCOMP_SINCOSF(sincosf): toycomp_sincosf(x, &s, &c), whose clones GCC calls with a vector
// of x and two pointers to n floats each (`linear`: _ZGV<isa>N<n>vl4l4_toycomp_sincosf).
#define TOYCOMP_SINCOSF(fn) TOYCOMP_SINCOSF_##fn
#define TOYCOMP_SINCOSF_sinf                                                                  \
    inline void toycomp_sinf_lanes(float* out, int n, const float* a) {                       \
        toycomp_sincosf_lanes<true, false>(out, nullptr, n, a);                               \
    }                                                                                         \
    TOYCOMP_VECTOR_FN_1(sinf)
#define TOYCOMP_SINCOSF_cosf                                                                  \
    inline void toycomp_cosf_lanes(float* out, int n, const float* a) {                       \
        toycomp_sincosf_lanes<false, true>(nullptr, out, n, a);                               \
    }                                                                                         \
    TOYCOMP_VECTOR_FN_1(cosf)
#define TOYCOMP_SINCOSF_sincosf                                                               \
    _Pragma("omp declare simd notinbranch linear(s, c)")                                      \
    extern "C" void toycomp_sincosf(float a, float* s, float* c);                             \
    TOYCOMP_HIDDEN void toycomp_sincosf_scalar(float, float*, float*)                         \
        __asm__("toycomp_sincosf");                                                           \
    void toycomp_sincosf_scalar(float a, float* s, float* c) {                                \
        toycomp_sincosf_lanes<true, true>(s, c, 1, &a);                                       \
    }                                                                                         \
    TOYCOMP_CLONES(TOYCOMP_CLONE_SINCOS, sincosf)
#define TOYCOMP_CLONE_SINCOS(isa, n, fn)                                                      \
    TOYCOMP_HIDDEN void _ZGV##isa##N##n##vl4l4_toycomp_sincosf(toycomp_v##n a, float* s,      \
                                                              float* c) {                     \
        toycomp_sincosf_lanes<true, true>(s, c, n, (const float*)&a);                         \
    }
#endif
"""

VECTOR_PREAMBLE = PREAMBLE + SAME_LIBM + SINCOSF
