"""glibc's vector math library (libmvec): which float functions a C++ kernel may call vectorised.

Input -> output: the libm functions a kernel uses -> the compiler flags that switch on their
vector versions (``-DTOYCOMP_SIMD_sinf ... -lmvec``), for those this machine provides and that
compute correctly, found by a probe compiled once per process (and cached on disk like a
kernel). ``TOYCOMP_VECTOR_MATH=0`` turns them off. See [Note: vectorised libm] in cpp.py for why
every kernel then uses one implementation per function.

    >>> vector_math_flags([]) == ()
    True

NB: in PyTorch, Inductor's C++ backend vectorises with its own ATen ``Vectorized`` headers
(torch/_inductor/codegen/cpp.py, cpp_prefix.h) rather than with libmvec.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import threading
from typing import Iterable, Sequence

from toycomp.inductor import cache

# float function -> (arity, Python reference) for the probe
_VECTOR_MATH_CANDIDATES = {
    "expf": (1, math.exp), "logf": (1, math.log), "log1pf": (1, math.log1p),
    "sinf": (1, math.sin), "cosf": (1, math.cos), "tanhf": (1, math.tanh),
    "erff": (1, math.erf), "powf": (2, math.pow),
}  # fmt: skip
_PROBE_INPUTS = [0.25 + 0.37 * i for i in range(40)]  # 40: vector iterations and a remainder
_probe_lock = threading.Lock()
_probed: dict[str, frozenset[str]] = {}  # compiler -> functions that work


def vector_math_flags(functions: Iterable[str]) -> tuple[str, ...]:
    """Compiler flags that turn the ``TOYCOMP_SIMD_<fn>`` declarations of a kernel into vector
    calls, for those of ``functions`` this machine's libmvec provides; ``()`` for none."""
    available = sorted(set(functions) & vector_math_functions())
    if not available:
        return ()
    flags = [f"-DTOYCOMP_SIMD_{fn}" for fn in available]
    flags += [f"-fno-builtin-{fn}" for fn in available]
    return (*flags, "-lmvec")


def vector_math_functions() -> frozenset[str]:
    """The float libm functions whose libmvec versions compile, load and compute correctly here
    (probed once per process and compiler; the probe library is cached on disk like a kernel).
    Empty when ``TOYCOMP_VECTOR_MATH=0``, off Linux, or when anything about the probe fails."""
    if os.environ.get("TOYCOMP_VECTOR_MATH", "1") == "0" or platform.system() != "Linux":
        return frozenset()
    try:
        cxx = cache.find_cxx()
    except cache.CppCompileError:
        return frozenset()
    with _probe_lock:
        if cxx not in _probed:
            _probed[cxx] = probe_vector_math(sorted(_VECTOR_MATH_CANDIDATES))
        return _probed[cxx]


def probe_vector_math(functions: Sequence[str]) -> frozenset[str]:
    """Compile, load and run a vectorised loop over each of ``functions``: all at once, and if
    that fails, one by one. Returns those that work; never raises."""
    if _probe_works(functions):
        return frozenset(functions)
    if len(functions) == 1:
        return frozenset()
    return frozenset(fn for fn in functions if _probe_works([fn]))


def _probe_works(functions: Sequence[str]) -> bool:
    lines = ["#include <math.h>"]
    for fn in functions:
        arity = _VECTOR_MATH_CANDIDATES[fn][0]
        args = ", ".join(["float"] * arity)
        call = f"{fn}(in[i], 1.5f)" if arity == 2 else f"{fn}(in[i])"
        lines += [
            f'extern "C" float {fn}({args}) __attribute__((__simd__("notinbranch")));',
            f'extern "C" void probe_{fn}(const float* in, float* out, int n) {{',
            f"    #pragma omp simd\n    for (int i = 0; i < n; i++) out[i] = {call};\n}}",
        ]
    flags = [f"-fno-builtin-{fn}" for fn in functions] + ["-lmvec"]
    try:
        lib = cache.load_cpp_library("\n".join(lines) + "\n", flags)
        n = len(_PROBE_INPUTS)
        inputs, out = (ctypes.c_float * n)(*_PROBE_INPUTS), (ctypes.c_float * n)()
        for fn in functions:
            arity, ref = _VECTOR_MATH_CANDIDATES[fn]
            getattr(lib, f"probe_{fn}")(inputs, out, ctypes.c_int(n))
            for x, y in zip(inputs, out):
                expected = ref(x, 1.5) if arity == 2 else ref(x)
                if not math.isclose(y, expected, rel_tol=1e-5, abs_tol=1e-6):
                    return False
        return True
    except cache.CacheDirError:  # not a libmvec problem: say so
        raise
    except Exception:  # a missing libmvec, an old glibc, another compiler: no vector math
        return False
