"""Stage 4c (C++ backend): ``ir.Kernel`` -> one ``extern "C"`` C++ function, OpenMP-parallel.

Input IR -> output: a fused kernel -> C++ source (compiled by ``cache.compile_cpp`` and called
through ``ctypes``). Every kernel becomes a loop over ``xindex`` (one output element or row),
``#pragma omp parallel for`` across cores (when it is big enough), with an inner ``for rindex``
loop per ``ir.Loop`` that runs over the reduced elements, or, for a reduction over columns, a
loop over tiles of outputs with ``rindex`` outside (cpp_layout.py: which; cpp_reduction.py: how);
loops are ``omp simd`` and float ``exp``/``log``/... call glibc's vector math, one
implementation for every element of every kernel (see [Note: vectorised libm]); float ``sin``
and ``cos`` are toycomp's own, computed together by one call where a kernel needs both (see
[Note: one sincos for sin and cos] in libmvec.py). For ``sin(x)**2 + cos(x)**2`` on 4M floats
(the scheduled kernel that ``toycomp.explain`` keeps)::

    >>> import torch, toycomp
    >>> f = lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2
    >>> kernel = toycomp.explain(f, torch.empty(4194304)).graph("forward").scheduled.steps[0]
    >>> print(generate(kernel).source.removeprefix(preamble()).strip())
    // kernel_0 (FX origins: sin, mul, cos, mul_1, add)
    #if defined(TOYCOMP_SIMD_sincosf) && defined(TOYCOMP_SINCOSF)
    TOYCOMP_SINCOSF(sincosf)
    #else
    inline void toycomp_sincosf(float a, float* s, float* c) { *s = sinf(a); *c = cosf(a); }
    #endif
    extern "C" void kernel_0(const float* in_ptr0, float* out_ptr0)
    {
        #pragma omp parallel for simd
        for (int64_t xindex = 0; xindex < 4194304; xindex++)
        {
            float tmp0 = in_ptr0[xindex];
            float tmp1, tmp3;
            toycomp_sincosf(tmp0, &tmp1, &tmp3);
            float tmp2 = tmp1 * tmp1;
            float tmp4 = tmp3 * tmp3;
            float tmp5 = tmp2 + tmp4;
            out_ptr0[xindex] = tmp5;
        }
    }

float32 computes in ``float`` (the ``std::`` overloads), fp16/bf16 are loaded into ``float`` and
rounded back on stores, int64 in ``int64_t``, bool in ``bool``; indices are ``int64_t``. These
spellings (``CPP_TYPES``, the ``CPP_OPS`` rule table, ``CppPrinter``) live in cpp_utils.py and
are re-exported here.

NB: in PyTorch this lives in torch/_inductor/codegen/cpp.py (CppKernel, CppOverrides, the
vectorised CppVecKernel and the OpenMP scheduling in CppKernelProxy) and
torch/_inductor/codegen/cpp_prefix.h (the helpers of our PREAMBLE).
"""

from __future__ import annotations

import ctypes
import math
import re
import warnings
from typing import Callable

import sympy
import torch

import toycomp.config as config
from toycomp.inductor import cache, indexing, ir
from toycomp.inductor.codegen import cpp_reduction
from toycomp.inductor.opt import cpp_layout, cpp_row_buffers, libmvec
from toycomp.inductor.codegen.common import (
    GeneratedKernel,
    IndentedBuffer,
    KernelCodegen,
    compute_dtype,
)
from toycomp.inductor.codegen.cpp_prefix import POW_HELPERS
from toycomp.inductor.codegen.cpp_prefix import PREAMBLE as CORE_PREAMBLE
from toycomp.inductor.opt.cpp_vector_prefix import VECTOR_PREAMBLE
from toycomp.inductor.codegen.cpp_utils import (  # noqa: F401  (re-exported: cpp.CPP_TYPES)
    CPP_OPS,
    CPP_TYPES,
    CppPrinter,
    cpp_convert,
    cpp_type,
)

# [Note: C++ kernels with dynamic shapes]
# A kernel whose sizes are symbols takes them as ``const int64_t s0`` arguments after its
# pointers (the wrapper passes this call's values, so one compiled library serves every size);
# its loop bounds and indices use them (``xindex < 4*s0``). Whether a loop runs on all cores is
# then decided at run time, by an OpenMP ``if(parallel: 4*s0 >= 16384)`` clause. ``omp simd``
# loops stay vectorised: GCC emits a vector body and a scalar tail for the last iterations, as
# it does for a static size that is no multiple of the vector width.
# Smaller kernels (numel * rnumel elements) run on one core: starting OpenMP's threads costs
# microseconds, more than the work of a small pointwise kernel (the MLP's bias + GELU, say).
PARALLEL_MIN_ELEMENTS = 16384

# [Note: vectorised libm]
# GCC vectorises `+ - * /` and comparisons by itself, but not calls to sin, cos, exp: libm's
# scalar sinf runs one element at a time, and it dominates a loop like sin(x)**2 + cos(x)**2
# (about 9x slower than the vector version on 4M floats). glibc ships SIMD versions of these
# functions in libmvec (_ZGVeN16v_sinf: 16 floats per call with AVX-512), within 4 ulp, with the
# same NaN / inf / large-argument behaviour. GCC calls a vector version of a function `f` when
#   1. `f` is declared with `__attribute__((__simd__("notinbranch")))`: then GCC assumes that
#      "SIMD clones" _ZGV<isa>N<lanes>v_f exist for every x86 ISA (b: SSE, c: AVX, d: AVX2,
#      e: AVX-512) and calls the one that suits each vectorised loop, and
#   2. the call is in a loop marked `#pragma omp simd`; the library is linked with `-lmvec`.
# But the scalar sinf, _ZGVdN8v_sinf and _ZGVeN16v_sinf are three different implementations:
# with glibc 2.36 they disagree in the last bit for 20-60% of all inputs (sinf, expf, erff). And one
# loop uses several: the vector body runs the 16-lane version, its tail the 8-lane one and then
# the scalar one, and a loop that GCC does not vectorise runs the scalar one only. So exp(x),
# computed in the forward's reduction and again for the value the backward compares it with
# (amax's gradient is `mask = amax == exp(x)`, and `grad / mask.sum()`), did not compare equal:
# an empty mask, a NaN gradient. Values that must compare equal must be computed identically.
# Hence: ONE implementation per function for every element of every kernel. A kernel calls
# `toycomp_sinf`, defined by `TOYCOMP_SAME_LIBM_1(sinf)` in PREAMBLE: it is declared SIMD, and
# the scalar function and every clone GCC may call are defined to run glibc's widest vector sinf
# for this CPU (`TOYCOMP_LIBMVEC`), a partial vector padded with zeros. A lane's result depends
# only on its input, so a value has the same bits in a vector body, in a scalar tail, in any
# kernel, forward or backward; and the whole vector body still runs at full width.
# libmvec exists only on Linux/glibc (x86_64; aarch64 in newer releases) and which functions it
# has depends on the version (sin, cos, exp, log, pow since 2.22; tanh, erf, log1p since 2.35).
# So the generated source is the same everywhere, and cache.py decides at compile time: it
# probes once which functions this machine's libmvec provides (a tiny library, compiled and
# checked against Python's math) and defines TOYCOMP_SIMD_<name> only for those (with
# `-fno-builtin-sinf`, which keeps GCC from rewriting the calls). Without the macro, or off
# x86_64, `toycomp_sinf` is the scalar sinf, for every kernel alike. If a vectorised kernel fails
# to compile or load, `load` compiles it again with scalar calls and warns: that kernel's values
# may then differ in the last bit from the others'.
# Only float (fp32, and fp16/bf16 computed in float) uses it: double keeps std::sin, scalar.
# Float sin and cos are toycomp's own vector code instead, built the same way (one
# implementation, SIMD clones): see [Note: one sincos for sin and cos] in libmvec.py.
# The C++ side (the `TOYCOMP_SAME_LIBM_1` macro) is in cpp_prefix.py.
# NB: Inductor does the same with its own vector types (at::vec::Vectorized, Sleef) in
# torch/_inductor/codegen/cpp.py (CppVecKernel); recent versions also run a loop's tail through
# the same vector code, on a masked partial vector.
#
# [Note: one rounding per op]
# `tmp2 = tmp0 * tmp1; tmp3 = tmp2 + tmp0` may become one fused multiply-add (one rounding
# instead of two), and GCC fuses it only where `tmp2` has no other use: the same expression
# rounded once in one kernel and twice in another, so again values that must compare equal did
# not. PREAMBLE turns contraction off (`fp-contract=off`): every op rounds once, in every kernel,
# as eager PyTorch does, where each op is its own kernel.
# The preamble of the fast preset's kernels (``preamble()``: the current flags' one).
PREAMBLE = VECTOR_PREAMBLE


def vector_math() -> bool:
    """Whether kernels call vector math (``toycomp.config.cpp.simdlen``, off in ``teach``)."""
    return config.cpp.simdlen != 0


def preamble() -> str:
    """The text every C++ kernel starts with: the core, then the vector math macros."""
    return VECTOR_PREAMBLE if vector_math() else CORE_PREAMBLE


VECTOR_MATH: dict[str, tuple[str, int]] = {  # prim -> (float libm function, its arity)
    "exp": ("expf", 1), "log": ("logf", 1), "log1p": ("log1pf", 1), "tanh": ("tanhf", 1),
    "erf": ("erff", 1), "pow": ("powf", 2),
}  # fmt: skip


class CppKernelCodegen(KernelCodegen):
    """Generates one C++ function for an ``ir.Kernel``."""

    ops = CPP_OPS
    printer = CppPrinter()
    ctype = staticmethod(cpp_type)
    plane: int | None = None  # cpp.layouts: see [Note: pointwise kernels over planes]
    rplane: int | None = None  # and [Note: reductions over planes]

    def __init__(self, kernel: ir.Kernel) -> None:
        super().__init__(kernel)
        self.loop_reductions: list[str] = []  # "+:acc" clauses of the current r loop
        self.row_sums: list[tuple[str, str]] = []  # its float sums summed in blocks (C type, acc)
        self.declared_reductions: set[tuple[str, torch.dtype]] = set()
        self.vector_math: dict[str, int] = {}  # libm functions called (see VECTOR_MATH)
        # columns and planes: opt/cpp_layout.py (never for indirect indices, which it cannot read)
        self.layouts = config.cpp.layouts and not kernel.indirect()
        self.column = self.layouts and cpp_layout.use_column_layout(kernel)
        self.partial_sums: list[tuple[str, str, str]] = []  # the column layout's float sums
        self.accumulators: list[tuple[str, ...]] = []  # and all its accumulator arrays

    def op(self, expr: ir.Op, args: list[str]) -> str:
        if vector_math() and compute_dtype(expr.dtype) == torch.float32:  # cpp.simdlen
            return self.vector_math_op(expr, args) or super().op(expr, args)
        return super().op(expr, args)

    def vector_math_op(self, expr: ir.Op, args: list[str]) -> str | None:
        """float ``exp``/``sin``/... call ``toycomp_expf``/``toycomp_sinf``: one implementation
        for every element of every kernel (see [Note: vectorised libm])."""
        if expr.name in VECTOR_MATH:
            fn, arity = VECTOR_MATH[expr.name]
            self.vector_math[fn] = arity
            return f"toycomp_{fn}({', '.join(args)})"
        if expr.name in libmvec.SIN_COS:  # declared by codegen_kernel, when used
            return f"toycomp_{libmvec.SIN_COS[expr.name]}({args[0]})"
        return None

    def codegen_loop(self, loop: ir.Loop) -> None:
        super().codegen_loop(loop)
        if vector_math():
            libmvec.fuse_sin_cos(self.compute)  # see [Note: one sincos for sin and cos]

    def load(self, buffer: str, index: sympy.Expr, dtype: torch.dtype) -> str:
        code = f"{self.args[buffer]}[{self.print_index(index)}]"
        if self.dtypes[buffer] == torch.bfloat16:
            code = f"bf16_to_float({code})"
        return self.cse.generate(self.loads, code, self.dtypes[buffer])

    def store(self, buffer: str, index: sympy.Expr, value: str, expr: ir.Expr,
              accumulate: bool = False) -> None:  # fmt: skip
        dtype = self.dtypes[buffer]
        target = f"{self.args[buffer]}[{self.print_index(index)}]"
        if accumulate:  # a scatter-add: its r loop runs in order ([Note: a scatter is a buffer
            value = _added_to(target, value, dtype)  # written twice] in scheduler.py)
        if dtype == torch.bfloat16:
            value = f"float_to_bf16({value})"
        elif compute_dtype(dtype) != compute_dtype(expr.dtype):
            value = f"static_cast<{cpp_type(dtype)}>({value})"
        self.stores.writeline(f"{target} = {value};")

    def reduce(self, red: ir.Reduce, value: str) -> None:
        if self.column:
            cpp_reduction.reduce_column(self, red, value)
        else:
            cpp_reduction.reduce_row(self, red, value)

    def constant(self, value: ir.Number, dtype: torch.dtype) -> str:
        dtype = compute_dtype(dtype or _literal_dtype(value))
        if dtype == torch.bool:
            return "true" if value else "false"
        if dtype.is_floating_point:
            if not math.isfinite(value):
                return _non_finite(value, cpp_type(dtype))
            text = repr(float(value)) + ("f" if dtype == torch.float32 else "")
            return f"({text})" if value < 0 else text
        if int(value) == torch.iinfo(dtype).min:
            return f"std::numeric_limits<{cpp_type(dtype)}>::min()"
        return f"{cpp_type(dtype)}({int(value)})"

    def print_index(self, index: sympy.Expr) -> str:
        if self.plane is not None or self.rplane is not None:  # cpp.layouts' planes
            index = self.plane_index(index)
        return super().print_index(index)

    def plane_index(self, index: sympy.Expr) -> sympy.Expr:
        # x = plane*x0 + x1, r = rplane*r0 + r1: see [Note: pointwise kernels over planes]
        for var, plane in ((indexing.x, self.plane), (indexing.r, self.rplane)):
            if plane is not None:
                index = cpp_layout.plane_index(sympy.sympify(index), plane, var)
        return index

    def index_value(self, index: sympy.Expr, dtype: torch.dtype) -> str:
        return self.cse.generate(self.compute, self.print_index(index), dtype)

    def cast(self, value: str, src: torch.dtype, dst: torch.dtype) -> str:
        return cpp_convert(value, dst)

    def declare(self, name: str, expr: str, dtype: torch.dtype) -> str:
        return f"{cpp_type(compute_dtype(dtype))} {name} = {expr};"

    # --- layout ----------------------------------------------------------------------------------
    def codegen_kernel(self) -> str:
        k = self.kernel
        parts = cpp_layout.split_by_layout(k) if self.layouts else [k]  # see codegen_parts
        if len(parts) == 1:
            functions = [self.codegen_function(k.name, self.codegen_body())]
        else:  # one static function per part, and the kernel calling them in turn
            functions = self.codegen_parts(parts)
        code = IndentedBuffer()
        code.writeline(f"// {k.name} (FX origins: {self.origins_comment()})")
        if vector_math():  # the libm functions called, vectorised (opt/libmvec.py)
            self.declare_vector_math(code, "".join(functions))
        if "toycomp_pow(" in "".join(functions):
            code.writelines(POW_HELPERS.splitlines())
        for clause, dtype in sorted(self.declared_reductions, key=str):
            code.writeline(cpp_reduction.declare_reduction(self, clause, dtype))
        return preamble() + "\n" + code.getvalue() + "".join(functions)

    def codegen_parts(self, parts: list[ir.Kernel]) -> list[str]:
        """[Note: a kernel of rows and columns] in opt/cpp_layout.py."""
        functions, calls = [], IndentedBuffer()
        for part in parts:
            cg = CppKernelCodegen(part)
            functions.append(cg.codegen_function(part.name, cg.codegen_body(), "static "))
            self.vector_math.update(cg.vector_math)
            self.declared_reductions.update(cg.declared_reductions)
            args = [self.args[b] for b in cg.args] + list(map(str, part.size_symbols()))
            calls.writeline(f"{part.name}({', '.join(args)});")
        return [*functions, self.codegen_function(self.kernel.name, calls)]

    def declare_vector_math(self, code: IndentedBuffer, functions: str) -> None:
        for fn, arity in sorted(self.vector_math.items()):
            code.writelines(_declare_vector_math(fn, arity))
        called = re.findall(r"\btoycomp_(sinf|cosf|sincosf)\(", functions)
        for fn in sorted(set(called)):
            code.writelines(libmvec.declare_sin_cos(fn))

    def codegen_function(self, name: str, body: IndentedBuffer, linkage='extern "C" ') -> str:
        code = IndentedBuffer()
        code.writeline(f"{linkage}void {name}({self.signature()})")
        code.writeline("{")
        with code.indent():
            code.splice(body)
        code.writeline("}")
        return code.getvalue()

    def codegen_body(self) -> IndentedBuffer:
        k = self.kernel
        parallel = self.parallel_if(k.numel * k.rnumel, PARALLEL_MIN_ELEMENTS)
        if self.column:  # see [Note: row and column reductions] in cpp_reduction.py
            return cpp_reduction.codegen_column_body(self, parallel)
        return self.codegen_row_body(parallel)

    def codegen_row_body(self, parallel: str | None) -> IndentedBuffer:
        """One x at a time (on all cores when ``parallel`` is not None), its loops inside."""
        k, body = self.kernel, IndentedBuffer()
        if self.layouts:
            self.plane = cpp_layout.pointwise_plane(k)
            self.rplane = cpp_layout.reduction_plane(k)
        # a row's costly values, kept: opt/cpp_row_buffers.py (config.cpp.row_buffers)
        kept = cpp_row_buffers.RowBuffers(k) if config.cpp.row_buffers else None
        for i, loop in enumerate(k.loops):
            self.new_sections()
            self.loop_reductions, self.row_sums = [], []
            if kept:
                kept.before_loop(self, i)
            self.codegen_loop(loop)
            if kept:
                kept.after_loop(self, i)
            if loop.over_r:
                cpp_reduction.codegen_row_loop(self, body, loop)
            else:
                for section in (self.loads, self.compute, self.stores):
                    body.splice(section)
        return self.codegen_x_loop(body, parallel)

    def codegen_x_loop(self, body: IndentedBuffer, parallel: str | None) -> IndentedBuffer:
        """``body`` run for every x (on all cores when ``parallel`` is not None)."""
        k, code = self.kernel, IndentedBuffer()
        if indexing.known_equal(k.numel, 1):
            code.writeline("const int64_t xindex = 0;")
            code.splice(body)
            return code
        simd = vector_math() and self.simd_x_loop()
        if self.plane is not None:  # cpp.layouts: the x loop over planes
            return self.codegen_x_planes(body, parallel, simd)
        pragma = " ".join(["parallel for"] * (parallel is not None) + ["simd"] * simd)
        if pragma:
            code.writeline(f"#pragma omp {pragma}{parallel or ''}")
        code.writeline(f"for (int64_t xindex = 0; xindex < {self.print_index(k.numel)}; xindex++)")
        code.splice(_block(body))
        return code

    def codegen_x_planes(
        self, body: IndentedBuffer, parallel: str | None, simd: bool
    ) -> IndentedBuffer:
        """Planes on the cores, each plane's elements vectorised (opt/cpp_layout.py)."""
        outer = None if parallel is None else f"#pragma omp parallel for{parallel}"
        inner = "#pragma omp simd" if simd else None
        return cpp_layout.plane_loops("x", self.kernel.numel, self.plane, body, outer, inner)

    def simd_x_loop(self) -> bool:
        """A pointwise kernel's x loop is its only loop: vectorise it too."""
        independent = cpp_layout.independent_iterations
        return all(not loop.over_r and independent(loop) for loop in self.kernel.loops)

    def parallel_if(self, elements, minimum: int) -> str | None:
        """Whether a loop over ``elements`` runs on all cores: None (no), "" (yes), or an OpenMP
        clause deciding at run time: ``if(parallel: 4*s0 >= 16384)`` (symbolic sizes)."""
        if indexing.is_static(elements):
            return "" if elements >= minimum else None
        return f" if(parallel: {self.print_index(elements)} >= {minimum})"

    def signature(self) -> str:
        writes = set(self.kernel.writes())
        params = []
        for buffer, arg in self.args.items():
            const = "" if buffer in writes else "const "
            params.append(f"{const}{cpp_type(self.dtypes[buffer])}* {arg}")
        for symbol in self.kernel.size_symbols():  # s0: a size; f0: a float made from sizes
            ctype = "double" if indexing.is_scalar_symbol(symbol) else "int64_t"
            params.append(f"const {ctype} {symbol}")
        return ", ".join(params)


def _block(body: IndentedBuffer) -> IndentedBuffer:
    """``body`` in braces, indented: a loop's body."""
    code = IndentedBuffer()
    code.writeline("{")
    with code.indent():
        code.splice(body)
    code.writeline("}")
    return code


def _added_to(target: str, value: str, dtype: torch.dtype) -> str:
    """``value`` added to what ``target`` holds (a scatter-add's store)."""
    current = f"bf16_to_float({target})" if dtype == torch.bfloat16 else target
    return f"{current} + {value}"


def _non_finite(value: float, ctype: str) -> str:
    if math.isnan(value):
        return f"std::numeric_limits<{ctype}>::quiet_NaN()"
    sign = "-" if value < 0 else ""
    return f"{sign}std::numeric_limits<{ctype}>::infinity()"


def _ctype(arg: str) -> type:
    if arg.endswith(".data_ptr()"):
        return ctypes.c_void_p
    return ctypes.c_double if arg.startswith("f") else ctypes.c_int64


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


def _literal_dtype(value: ir.Number) -> torch.dtype:
    """The C type a number with no dtype of its own is written in: ``bool``, ``int64_t``, or
    ``float`` for any Python float (``2.0f``). Not ``tensor_utils.python_number_dtype`` on
    purpose: a ``double`` literal would silently turn float arithmetic into double arithmetic."""
    if isinstance(value, bool):
        return torch.bool
    return torch.int64 if isinstance(value, int) else torch.float32


# --- compile and call -------------------------------------------------------------------------
def generate(kernel: ir.Kernel) -> GeneratedKernel:
    """C++ source for ``kernel`` plus the wrapper line that calls it."""
    if config.cpp.layouts and not kernel.indirect():  # sibling reductions in one pass
        kernel = cpp_layout.merge_reduction_loops(kernel)
    cg = CppKernelCodegen(kernel)
    source = cg.codegen_kernel()
    args = [f"{buffer}.data_ptr()" for buffer in cg.args]
    args += [str(s) for s in kernel.size_symbols()]  # dynamic shapes: the sizes, at call time
    call = f"{kernel.name}({', '.join(args)})"
    return GeneratedKernel(kernel.name, "cpp", source, kernel.origins, call)


def load(generated: GeneratedKernel) -> Callable[..., None]:
    """Compile (or find in the cache) and return the ``ctypes`` function, taking data pointers."""
    wanted = re.findall(r"^#if defined\(TOYCOMP_SIMD_(\w+)\)", generated.source, re.MULTILINE)
    if wanted:  # glibc's vector math, where this machine has it
        lib = _load_vector_math(generated, wanted)
    else:
        lib = cache.load_cpp_library(generated.source)
    fn = getattr(lib, generated.name)
    # Declared argument types: one ctypes call per launch, taking data_ptr()'s ints directly.
    args = generated.call[generated.call.index("(") + 1 : -1].split(", ")
    fn.argtypes = [_ctype(a) for a in args if a]  # pointers, then sizes s0... and floats f0...
    fn.restype = None
    return fn


def _load_vector_math(generated: GeneratedKernel, wanted: list[str]) -> ctypes.CDLL:
    """The kernel compiled with the vector math this machine has ([Note: vectorised libm]);
    should that fail to compile or load, compiled again with scalar calls, with a warning."""
    flags = libmvec.vector_math_flags(wanted)
    try:
        return cache.load_cpp_library(generated.source, flags)
    except (cache.CppCompileError, OSError) as e:
        if not flags:
            raise
        warnings.warn(f"{generated.name}: vectorised libm failed, using scalar calls ({e})")
        return cache.load_cpp_library(generated.source)
