"""Vector math for C++ kernels: glibc's libmvec, toycomp's own sin and cos, and the C++ kernel
of the ``cpp.*`` passes (``CppVecKernelCodegen``).

Input -> output: the libm functions a kernel uses -> the compiler flags that switch on their
vector versions (``-DTOYCOMP_SIMD_expf ... -lmvec``), for those this machine provides and that
compute correctly, found by a probe compiled once per process (and cached on disk like a
kernel). ``TOYCOMP_VECTOR_MATH=0`` turns them off. See [Note: vectorised libm] in cpp.py for why
every kernel then uses one implementation per function. Float ``sin`` and ``cos`` are toycomp's
own (``sincosf``, with its probe): ``fuse_sin_cos`` turns the sine and the cosine of one value
into one call (see [Note: one sincos for sin and cos])::

    >>> vector_math_flags([]) == ()
    True
    >>> buf = IndentedBuffer()
    >>> buf.writelines(["float tmp1 = toycomp_sinf(tmp0);", "float tmp2 = tmp1 * tmp1;",
    ...                 "float tmp3 = toycomp_cosf(tmp0);"])
    >>> fuse_sin_cos(buf); print(buf.getvalue(), end="")
    float tmp1, tmp3;
    toycomp_sincosf(tmp0, &tmp1, &tmp3);
    float tmp2 = tmp1 * tmp1;

``CppVecKernelCodegen`` is codegen/cpp.py's ``CppKernelCodegen`` with the C++ passes applied at
its hooks, used when any is on: ``cpp.simdlen`` (``omp simd`` loops, the vector math above, its
preamble), ``cpp.layouts`` (sibling reductions merged, column reductions, planes, parts:
cpp_layout.py, cpp_reduction.py) and ``cpp.row_buffers`` (cpp_row_buffers.py).

NB: in PyTorch, Inductor's C++ backend vectorises with its own ATen ``Vectorized`` headers
(torch/_inductor/codegen/cpp.py, cpp_prefix.h) rather than with libmvec: ``Vectorized::sin``
calls Sleef, which has a ``sincos`` that Inductor does not use. The kernel class is
``CppVecKernel`` there, a subclass of ``CppKernel``; ``CppKernelProxy`` picks each part's loops.
"""

from __future__ import annotations

import ctypes
import math
import os
import platform
import re
import threading
from typing import Iterable, Sequence

import sympy
import torch

import toycomp.config as config
from toycomp.inductor import cache, indexing, ir
from toycomp.inductor.codegen import cpp_reduction
from toycomp.inductor.codegen.common import IndentedBuffer, compute_dtype
from toycomp.inductor.codegen.cpp import PARALLEL_MIN_ELEMENTS, CppKernelCodegen, preamble
from toycomp.inductor.opt import cpp_layout, cpp_row_buffers
from toycomp.inductor.opt.cpp_vector_prefix import VECTOR_PREAMBLE as PREAMBLE

# float function -> (arity, Python reference) for the probe
_VECTOR_MATH_CANDIDATES = {
    "expf": (1, math.exp), "logf": (1, math.log), "log1pf": (1, math.log1p),
    "tanhf": (1, math.tanh), "erff": (1, math.erf), "powf": (2, math.pow),
}  # fmt: skip
_PROBE_INPUTS = [0.25 + 0.37 * i for i in range(40)]  # 40: vector iterations and a remainder
_probe_lock = threading.Lock()
_probed: dict[tuple, frozenset[str]] = {}  # compiler, ISA flags -> functions that work


def vector_math_flags(functions: Iterable[str]) -> tuple[str, ...]:
    """Compiler flags that turn the ``TOYCOMP_SIMD_<fn>`` declarations of a kernel into vector
    calls, for those of ``functions`` this machine can run vectorised; ``()`` for none."""
    available = sorted(set(functions) & vector_math_functions())
    if not available:
        return ()
    flags = [f"-DTOYCOMP_SIMD_{fn}" for fn in available]
    flags += [f"-fno-builtin-{fn}" for fn in available if fn != "sincosf"]
    if "sincosf" in available:  # its |x| > 8192 lanes call sinf and cosf, as written
        flags += ["-fno-builtin-sinf", "-fno-builtin-cosf"]
    if set(available) & set(_VECTOR_MATH_CANDIDATES):
        flags.append("-lmvec")
    return tuple(flags)


def vector_math_functions() -> frozenset[str]:
    """The float libm functions whose libmvec versions compile, load and compute correctly here
    (probed once per process and compiler; the probe library is cached on disk like a kernel),
    and ``sincosf`` where toycomp's own does. Empty when ``TOYCOMP_VECTOR_MATH=0``, off Linux,
    or when anything about the probes fails."""
    if os.environ.get("TOYCOMP_VECTOR_MATH", "1") == "0" or platform.system() != "Linux":
        return frozenset()
    try:
        cxx = cache.find_cxx()
    except cache.CppCompileError:
        return frozenset()
    key = (cxx, cache.isa_flags())  # AVX2 forced: the 8-lane functions are probed
    with _probe_lock:
        if key not in _probed:
            found = probe_vector_math(sorted(_VECTOR_MATH_CANDIDATES))
            _probed[key] = found | ({"sincosf"} if probe_sincos() else set())
        return _probed[key]


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


# --- float sin and cos: toycomp's own -------------------------------------------------------
# [Note: one sincos for sin and cos]
# sin(x)**2 + cos(x)**2 computes two functions of one value, and both are computed alike: x is
# reduced to r = x - k*pi/2 with |r| <= pi/2, and a polynomial of r gives the result up to its
# sign. The kernel calls a vector function once per vector: one call for both saves a call.
# glibc has no usable vector sincosf: libmvec 2.36's _ZGVeN16vvv_sincosf takes vectors of 32
# pointers and scatters through them (twice the time of sinf + cosf on 16 floats), and its sine
# differs from its sinf in the last bit for 4M of the 2^32 floats. So float sin and cos are
# toycomp's own, in PREAMBLE (cpp_vector_prefix.py, TOYCOMP_SINCOSF): Cody and Waite's reduction
# (pi in three floats, each subtracted by one fma), one odd polynomial of sin for each function
# ([Note: one polynomial for sin and for cos] there), and for |x| > 8192 (and inf) glibc's
# scalar sinf/cosf, lane by lane (rare). Against sin/cos in double: at most 2.21 ulp for |x| <=
# 8192 (every float of [0.5, 2), a sweep of the range: tests/inductor/test_cpp_sin_poly.py;
# Sleef's u35, which eager and Inductor call: 2.49), 0.56 beyond; within 4 ulp of Sleef's
# (eager's) value; signed zeros, inf and NaN as eager. Like libmvec's
# functions (see [Note: vectorised libm] in cpp.py), one implementation serves every lane of
# every clone and the scalar function, so results do not depend on vectorisation; and the
# sine of a value has the same bits whether its cosine is computed too or not.
# `fuse_sin_cos` is the CSE that makes use of it: in one loop body, `tmpA = toycomp_sinf(X)`
# and `tmpB = toycomp_cosf(X)` become one `toycomp_sincosf(X, &tmpA, &tmpB)`, which GCC
# vectorises through the clone _ZGVeN16vl4l4_toycomp_sincosf (pointers to the 16 lanes of tmpA
# and of tmpB). On 4M floats (AVX-512, one thread) sin(x)**2 + cos(x)**2 takes 0.65-0.75x the
# time it took with libmvec's sinf and cosf; sin alone about the same time as libmvec's sinf.
# Each function has its own reduction (into [-pi/2, pi/2], for one polynomial instead of two
# and no select): sin alone on 4M floats took 0.6x the time of the shared one.
# NB: Inductor calls Sleef_sinf16_u35 and Sleef_cosf16_u35 (at::vec::Vectorized) separately.
SIN_COS = {"sin": "sinf", "cos": "cosf"}  # prim -> float function, declared by TOYCOMP_SINCOSF
_SIN_OR_COS = re.compile(r"(\s*)float (tmp\d+) = toycomp_(sin|cos)f\((tmp\d+)\);")


def fuse_sin_cos(body: IndentedBuffer) -> None:
    """Rewrite the lines of one loop body: the sine and the cosine of one value become one
    ``toycomp_sincosf`` call, where the first of the two was (see the Note above)."""
    first: dict[str, tuple[int, str, str]] = {}  # argument -> (line, name, sin or cos)
    pairs: dict[int, tuple[int, str, str, str]] = {}  # first line -> (second line, sin, cos, arg)
    for i, line in enumerate(body.lines):
        match = _SIN_OR_COS.fullmatch(line)
        if match is None:
            continue
        _, name, fn, arg = match.groups()
        if arg in first and first[arg][2] != fn:
            j, other, _ = first.pop(arg)
            sin, cos = (other, name) if fn == "cos" else (name, other)
            pairs[j] = (i, sin, cos, arg)
        else:
            first.setdefault(arg, (i, name, fn))
    if not pairs:
        return
    second = {i for i, *_ in pairs.values()}
    lines = []
    for i, line in enumerate(body.lines):
        if i in pairs:
            _, sin, cos, arg = pairs[i]
            indent = line[: len(line) - len(line.lstrip())]
            lines.append(f"{indent}float {sin}, {cos};")
            lines.append(f"{indent}toycomp_sincosf({arg}, &{sin}, &{cos});")
        elif i not in second:
            lines.append(line)
    body.lines = lines


def declare_sin_cos(fn: str) -> list[str]:
    """``sinf``, ``cosf`` or ``sincosf`` -> the lines that define ``toycomp_<fn>`` in a kernel:
    toycomp's vector version where ``TOYCOMP_SIMD_sincosf`` is defined, else scalar libm."""
    scalar = {
        "sinf": "inline float toycomp_sinf(float a) { return sinf(a); }",
        "cosf": "inline float toycomp_cosf(float a) { return cosf(a); }",
        "sincosf": "inline void toycomp_sincosf(float a, float* s, float* c) "
        "{ *s = sinf(a); *c = cosf(a); }",
    }[fn]
    guard = "#if defined(TOYCOMP_SIMD_sincosf) && defined(TOYCOMP_SINCOSF)"
    return [guard, f"TOYCOMP_SINCOSF({fn})", "#else", scalar, "#endif"]


def probe_sincos() -> bool:
    """Whether toycomp's vector sin/cos compile, load and compute correctly with this compiler
    (a compiler that names the clones otherwise fails to load: then kernels call libm)."""
    lines = [PREAMBLE, "#if defined(TOYCOMP_SINCOSF)"]
    lines += [f"TOYCOMP_SINCOSF({fn})" for fn in ("sinf", "cosf", "sincosf")]
    lines += [
        'extern "C" void probe(const float* in, float* out, int n) {',
        "    #pragma omp simd",
        "    for (int i = 0; i < n; i++) {",
        "        float s, c;",
        "        toycomp_sincosf(in[i], &s, &c);",
        "        out[4 * i] = s, out[4 * i + 1] = c;",
        "        out[4 * i + 2] = toycomp_sinf(in[i]), out[4 * i + 3] = toycomp_cosf(in[i]);",
        "    }",
        "}",
        "#endif",
    ]
    inputs = _PROBE_INPUTS + [-3.0e4, 1.0e5]  # and two beyond 8192
    try:
        lib = cache.load_cpp_library("\n".join(lines) + "\n", ("-DTOYCOMP_SIMD_sincosf",))
        n = len(inputs)
        args, out = (ctypes.c_float * n)(*inputs), (ctypes.c_float * (4 * n))()
        lib.probe(args, out, ctypes.c_int(n))
    except cache.CacheDirError:
        raise
    except Exception:  # another compiler, another platform: scalar sinf and cosf
        return False
    want = [f(x) for x in args for f in (math.sin, math.cos, math.sin, math.cos)]
    return all(math.isclose(y, w, rel_tol=1e-5, abs_tol=1e-6) for y, w in zip(out, want))


# --- the C++ kernel of the passes ---------------------------------------------------------------
VECTOR_MATH: dict[str, tuple[str, int]] = {  # prim -> (float libm function, its arity)
    "exp": ("expf", 1), "log": ("logf", 1), "log1p": ("log1pf", 1), "tanh": ("tanhf", 1),
    "erf": ("erff", 1), "pow": ("powf", 2),
}  # fmt: skip


def vector_math() -> bool:
    """Whether kernels call vector math (``toycomp.config.cpp.simdlen``, off in ``teach``)."""
    return config.cpp.simdlen != 0


def codegen(kernel: ir.Kernel) -> CppVecKernelCodegen:
    """The code generator of ``kernel`` with the C++ passes that are on (``cpp.generate``'s
    hook): with ``cpp.layouts``, sibling reductions merged first, to run in one pass."""
    if config.cpp.layouts and not kernel.indirect():
        kernel = cpp_layout.merge_reduction_loops(kernel)
    return CppVecKernelCodegen(kernel)


class CppVecKernelCodegen(CppKernelCodegen):
    """Generates one C++ function for an ``ir.Kernel`` with the C++ passes that are on."""

    plane: int | None = None  # cpp.layouts: see [Note: pointwise kernels over planes]

    def __init__(self, kernel: ir.Kernel) -> None:
        super().__init__(kernel)
        self.preamble = preamble()  # with the vector math macros under cpp.simdlen
        self.vector_math: dict[str, int] = {}  # libm functions called (see VECTOR_MATH)
        # columns and planes: cpp_layout.py (never for indirect indices, which it cannot read)
        self.layouts = config.cpp.layouts and not kernel.indirect()
        self.column = self.layouts and cpp_layout.use_column_layout(kernel)
        self.partial_sums: list[tuple[str, str, str]] = []  # the column layout's float sums
        self.accumulators: list[tuple[str, ...]] = []  # and all its accumulator arrays
        self.kept: cpp_row_buffers.RowBuffers | None = None  # the row layout's, see codegen_body

    # --- cpp.simdlen: vector math ----------------------------------------------------------------
    def op(self, expr: ir.Op, args: list[str]) -> str:
        if vector_math() and compute_dtype(expr.dtype) == torch.float32:
            return self.vector_math_op(expr, args) or super().op(expr, args)
        return super().op(expr, args)

    def vector_math_op(self, expr: ir.Op, args: list[str]) -> str | None:
        """float ``exp``/``sin``/... call ``toycomp_expf``/``toycomp_sinf``: one implementation
        for every element of every kernel (see [Note: vectorised libm] in cpp.py)."""
        if expr.name in VECTOR_MATH:
            fn, arity = VECTOR_MATH[expr.name]
            self.vector_math[fn] = arity
            return f"toycomp_{fn}({', '.join(args)})"
        if expr.name in SIN_COS:  # declared by declare_helpers, when used
            return f"toycomp_{SIN_COS[expr.name]}({args[0]})"
        return None

    def declare_helpers(self, code: IndentedBuffer, functions: str) -> None:
        if vector_math():  # the libm functions called, vectorised
            for fn, arity in sorted(self.vector_math.items()):
                code.writelines(_declare_vector_math(fn, arity))
            called = re.findall(r"\btoycomp_(sinf|cosf|sincosf)\(", functions)
            for fn in sorted(set(called)):
                code.writelines(declare_sin_cos(fn))
        super().declare_helpers(code, functions)

    def codegen_loop(self, loop: ir.Loop) -> None:
        if self.kept is not None:  # cpp.row_buffers: this loop reads the values kept for it
            self.kept.before_loop(self)
        super().codegen_loop(loop)
        if self.kept is not None:  # and keeps the values later loops read
            self.kept.after_loop(self)
        if vector_math():
            fuse_sin_cos(self.compute)  # see [Note: one sincos for sin and cos]

    def x_pragma(self, parallel: str | None) -> str | None:
        if not (vector_math() and self.simd_x_loop()):
            return super().x_pragma(parallel)
        if parallel is None:
            return "#pragma omp simd"
        return f"#pragma omp parallel for simd{parallel}"

    def simd_x_loop(self) -> bool:
        """A pointwise kernel's x loop is its only loop: vectorise it too."""
        independent = cpp_layout.independent_iterations
        return all(not loop.over_r and independent(loop) for loop in self.kernel.loops)

    # --- cpp.layouts: columns, planes, parts; cpp.row_buffers ----------------------------------
    def reduce(self, red: ir.Reduce, value: str) -> None:
        if self.column:
            cpp_reduction.reduce_column(self, red, value)
        else:
            super().reduce(red, value)

    def print_index(self, index: sympy.Expr) -> str:
        # x = plane*x0 + x1, r = rplane*r0 + r1: see [Note: pointwise kernels over planes]
        for var, plane in ((indexing.x, self.plane), (indexing.r, self.rplane)):
            if plane is not None:
                index = cpp_layout.plane_index(sympy.sympify(index), plane, var)
        return super().print_index(index)

    def codegen_functions(self) -> str:
        parts = cpp_layout.split_by_layout(self.kernel) if self.layouts else [self.kernel]
        if len(parts) == 1:
            return super().codegen_functions()
        return "".join(self.codegen_parts(parts))

    def codegen_parts(self, parts: list[ir.Kernel]) -> list[str]:
        """One static function per part, and the kernel calling them in turn: [Note: a kernel
        of rows and columns] in cpp_layout.py."""
        functions, calls = [], IndentedBuffer()
        for part in parts:
            cg = CppVecKernelCodegen(part)
            functions.append(cg.codegen_function(part.name, cg.codegen_body(), "static "))
            self.vector_math.update(cg.vector_math)
            self.declared_reductions.update(cg.declared_reductions)
            args = [self.args[b] for b in cg.args] + list(map(str, part.size_symbols()))
            calls.writeline(f"{part.name}({', '.join(args)});")
        return [*functions, self.codegen_function(self.kernel.name, calls)]

    def codegen_body(self) -> IndentedBuffer:
        k = self.kernel
        if self.column:  # see [Note: row and column reductions] in cpp_reduction.py
            parallel = self.parallel_if(k.numel * k.rnumel, PARALLEL_MIN_ELEMENTS)
            return cpp_reduction.codegen_column_body(self, parallel)
        if self.layouts:
            self.plane = cpp_layout.pointwise_plane(k)
            self.rplane = cpp_layout.reduction_plane(k)
        if config.cpp.row_buffers:  # a row's costly values, kept: see cpp_row_buffers.py
            self.kept = cpp_row_buffers.RowBuffers(k)
        return super().codegen_body()

    def codegen_x_loop(self, body: IndentedBuffer) -> IndentedBuffer:
        if self.plane is None:
            return super().codegen_x_loop(body)
        # planes on the cores, each plane's elements vectorised
        k = self.kernel
        parallel = self.parallel_if(k.numel * k.rnumel, PARALLEL_MIN_ELEMENTS)
        outer = None if parallel is None else f"#pragma omp parallel for{parallel}"
        inner = "#pragma omp simd" if vector_math() and self.simd_x_loop() else None
        return cpp_layout.plane_loops("x", k.numel, self.plane, body, outer, inner)


def _declare_vector_math(fn: str, arity: int) -> list[str]:
    """``sinf`` -> ``toycomp_sinf``: glibc's vector sinf where cache.py defines
    ``TOYCOMP_SIMD_sinf`` (and PREAMBLE can use it), else the scalar sinf."""
    params = ", ".join(f"float {a}" for a in "ab"[:arity])
    same = f"TOYCOMP_SAME_LIBM_{arity}"
    return [
        f"#if defined(TOYCOMP_SIMD_{fn}) && defined({same})",
        f"{same}({fn})",
        "#else",
        f"inline float toycomp_{fn}({params}) {{ return {fn}({', '.join('ab'[:arity])}); }}",
        "#endif",
    ]
