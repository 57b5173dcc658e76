"""Stage 4c (C++ backend): the preamble every C++ kernel's source starts with.

Input -> output: nothing -> C++ text (``PREAMBLE``) that ``cpp.py`` puts before each kernel: the
includes (``<algorithm>`` for the column layout's ``std::min``), NaN-propagating ``max``/``min``,
bfloat16 conversions and ``fp-contract=off`` (see [Note: one rounding per op] in cpp.py). With
vector math on (``toycomp.config.cpp.simdlen``), opt/cpp_vector_prefix.py's macros follow it::

    >>> "fp-contract=off" in PREAMBLE and "TOYCOMP_SAME_LIBM_1" not in PREAMBLE
    True

NB: in PyTorch this lives in torch/_inductor/codegen/cpp_prefix.h (included by every C++ kernel).
"""

PREAMBLE = r"""#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <omp.h>
#include <type_traits>

// Every op rounds once, as in eager PyTorch (see [Note: one rounding per op] in cpp.py).
#pragma GCC optimize("fp-contract=off")
// Signed integers wrap around on overflow, as in eager PyTorch (C++ leaves it undefined).
#pragma GCC optimize("wrapv")
// pow of integers by repeated squaring (ATen's powi): it wraps around like eager's, where
// std::pow would go through double and saturate. A negative exponent gives 1 ** b = 1,
// (-1) ** b = +-1, and 0 otherwise (integer division of 1 by a ** -b).
template <typename T> inline T pow_int(T a, T b) {
    if (b < 0) return a == 1 ? T(1) : a == T(-1) ? T((-b) % 2 ? -1 : 1) : T(0);
    T result = 1;
    for (; b; b /= 2, a = T(a * a))
        if (b & 1) result = T(result * a);
    return result;
}
template <typename T, typename U> inline auto toycomp_pow(T a, U b) {
    if constexpr (std::is_integral_v<T> && std::is_integral_v<U>) return pow_int<T>(a, T(b));
    else return std::pow(a, b);
}
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
"""
