"""Stage 4c (C++ backend): ``ir.Kernel`` -> one ``extern "C"`` C++ function, OpenMP-parallel.

Input IR -> output: a fused kernel -> C++ source (compiled by ``cache.compile_cpp`` and called
through ``ctypes``). Every kernel becomes a loop over ``xindex`` (one output element or row),
``#pragma omp parallel for`` across cores (when it is big enough), with an inner ``for rindex``
loop per ``ir.Loop`` that runs over the reduced elements (cpp_reduction.py). That is
``CppKernelCodegen``, the core. The C++ passes (``toycomp.config.cpp``: vector math, layouts,
row buffers) live in its subclass in opt/libmvec.py, which ``generate`` uses when one of them
is on: with the ``fast`` preset loops are ``omp simd`` and float ``exp``/``log``/... call
glibc's vector math, one implementation for every element of every kernel (see [Note:
vectorised libm]); float ``sin`` and ``cos`` are toycomp's own, computed together by one call
where a kernel needs both (see [Note: one sincos for sin and cos] in libmvec.py); a reduction
over columns runs over tiles of outputs with ``rindex`` outside (cpp_layout.py: which;
cpp_reduction.py: how). For ``sin(x)**2 + cos(x)**2`` on 4M floats (the scheduled kernel that
``toycomp.explain`` keeps), with the ``fast`` preset::

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
    braced,
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


def preamble() -> str:
    """The text every C++ kernel starts with: the core, then the vector math macros."""
    return VECTOR_PREAMBLE if config.cpp.simdlen != 0 else CORE_PREAMBLE


class CppKernelCodegen(KernelCodegen):
    """Generates one C++ function for an ``ir.Kernel``: a loop over ``x`` (on all cores when the
    kernel is big enough) running the kernel's loops in turn, scalar code.

    With a C++ pass on (``cpp.simdlen``, ``cpp.layouts``, ``cpp.row_buffers``), ``generate``
    uses opt/libmvec.py's subclass instead, as Inductor's CppVecKernel extends CppKernel.
    """

    ops = CPP_OPS
    printer = CppPrinter()
    ctype = staticmethod(cpp_type)
    preamble = CORE_PREAMBLE  # the first lines of every kernel's source (cpp_prefix.py)
    rplane: int | None = None  # cpp.layouts: see [Note: reductions over planes]

    def __init__(self, kernel: ir.Kernel) -> None:
        super().__init__(kernel)
        self.declared_reductions: set[tuple[str, torch.dtype]] = set()  # NaN-aware max/min

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
        cpp_reduction.reduce_row(self, red, value)

    def constant(self, value: ir.Number, dtype: torch.dtype) -> str:
        dtype = compute_dtype(dtype or _literal_dtype(value))
        if not dtype.is_floating_point or not math.isfinite(value):
            return _exact_constant(value, dtype)  # bool, integers, infinities and NaN
        text = repr(float(value)) + ("f" if dtype == torch.float32 else "")
        return f"({text})" if value < 0 else text

    def index_value(self, index: sympy.Expr, dtype: torch.dtype) -> str:
        return self.cse.generate(self.compute, self.print_index(index), dtype)

    def cast(self, value: str, src: torch.dtype, dst: torch.dtype) -> str:
        return cpp_convert(value, dst)

    def declare(self, name: str, expr: str, dtype: torch.dtype) -> str:
        return f"{cpp_type(compute_dtype(dtype))} {name} = {expr};"

    # --- the function ----------------------------------------------------------------------------
    def codegen_kernel(self) -> str:
        functions = self.codegen_functions()
        code = IndentedBuffer()
        code.writeline(f"// {self.kernel.name} (FX origins: {self.origins_comment()})")
        self.declare_helpers(code, functions)
        return self.preamble + "\n" + code.getvalue() + functions

    def codegen_functions(self) -> str:
        return self.codegen_function(self.kernel.name, self.codegen_body())

    def declare_helpers(self, code: IndentedBuffer, functions: str) -> None:
        """Declare what ``functions`` call: ``toycomp_pow``, NaN-aware max/min reductions."""
        if "toycomp_pow(" in functions:
            code.writelines(POW_HELPERS.splitlines())
        for clause, dtype in sorted(self.declared_reductions, key=str):
            code.writeline(cpp_reduction.declare_reduction(self, clause, dtype))

    def codegen_function(self, name: str, body: IndentedBuffer, linkage='extern "C" ') -> str:
        code = IndentedBuffer()
        code.writeline(f"{linkage}void {name}({self.signature()})")
        braced(code, body)
        return code.getvalue()

    def signature(self) -> str:
        """``const float* in_ptr0, float* out_ptr0``, then the sizes (``const int64_t s0``)."""
        params = []
        for buffer, arg in self.args.items():
            const = "const " if arg.startswith("in_ptr") else ""  # only read
            params.append(f"{const}{cpp_type(self.dtypes[buffer])}* {arg}")
        params += [_size_param(symbol) for symbol in self.kernel.size_symbols()]
        return ", ".join(params)

    def codegen_body(self) -> IndentedBuffer:
        """The kernel's loops in turn, run for each x."""
        body = IndentedBuffer()
        for loop in self.kernel.loops:
            self.new_sections()
            self.loop_reductions, self.row_sums = [], []  # the r loop's clauses, long sums
            self.codegen_loop(loop)
            if loop.over_r:  # see [Note: row and column reductions] in cpp_reduction.py
                cpp_reduction.codegen_row_loop(self, body, loop)
            else:
                body.writelines([*self.loads.lines, *self.compute.lines, *self.stores.lines])
        return self.codegen_x_loop(body)

    def codegen_x_loop(self, body: IndentedBuffer) -> IndentedBuffer:
        """``body`` run for every x, on all cores when the kernel is big enough."""
        k, code = self.kernel, IndentedBuffer()
        if indexing.known_equal(k.numel, 1):  # one x (its r loops may run on the cores)
            code.writelines(["const int64_t xindex = 0;", *body.lines])
            return code
        pragma = self.x_pragma(self.parallel_if(k.numel * k.rnumel, PARALLEL_MIN_ELEMENTS))
        if pragma:
            code.writeline(pragma)
        code.writeline(f"for (int64_t xindex = 0; xindex < {self.print_index(k.numel)}; xindex++)")
        braced(code, body)
        return code

    def x_pragma(self, parallel: str | None) -> str | None:
        return None if parallel is None else f"#pragma omp parallel for{parallel}"

    def parallel_if(self, elements, minimum: int) -> str | None:
        """Whether a loop over ``elements`` runs on all cores: None (no), "" (yes), or an OpenMP
        clause deciding at run time: ``if(parallel: 4*s0 >= 16384)`` (symbolic sizes)."""
        if indexing.is_static(elements):
            return "" if elements >= minimum else None
        return f" if(parallel: {self.printer.doprint(elements)} >= {minimum})"


def _added_to(target: str, value: str, dtype: torch.dtype) -> str:
    """``value`` added to what ``target`` holds (a scatter-add's store)."""
    current = f"bf16_to_float({target})" if dtype == torch.bfloat16 else target
    return f"{current} + {value}"


def _exact_constant(value: ir.Number, dtype: torch.dtype) -> str:
    """A bool or integer literal, or a float's infinity or NaN."""
    ctype = cpp_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        if math.isnan(value):
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        return f"{'-' if value < 0 else ''}std::numeric_limits<{ctype}>::infinity()"
    if int(value) == torch.iinfo(dtype).min:
        return f"std::numeric_limits<{ctype}>::min()"
    return f"{ctype}({int(value)})"


def _literal_dtype(value: ir.Number) -> torch.dtype:
    """The C type a number with no dtype of its own is written in: ``bool``, ``int64_t``, or
    ``float`` for any Python float (``2.0f``). Not ``tensor_utils.python_number_dtype`` on
    purpose: a ``double`` literal would silently turn float arithmetic into double arithmetic."""
    if isinstance(value, bool):
        return torch.bool
    return torch.int64 if isinstance(value, int) else torch.float32


def _size_param(symbol: sympy.Symbol) -> str:
    """A kernel argument for a size: ``s0`` (``int64_t``), or ``f0``, a float made from sizes."""
    return f"const {'double' if indexing.is_scalar_symbol(symbol) else 'int64_t'} {symbol}"


def _ctype(arg: str) -> type:
    if arg.endswith(".data_ptr()"):
        return ctypes.c_void_p
    return ctypes.c_double if arg.startswith("f") else ctypes.c_int64


# --- compile and call -------------------------------------------------------------------------
def generate(kernel: ir.Kernel) -> GeneratedKernel:
    """C++ source for ``kernel`` plus the wrapper line that calls it."""
    if config.cpp.simdlen == 0 and not (config.cpp.layouts or config.cpp.row_buffers):
        cg = CppKernelCodegen(kernel)
    else:  # the C++ passes: a subclass (imported here, since it imports this module)
        from toycomp.inductor.opt import libmvec

        cg = libmvec.codegen(kernel)
    args = [f"{buffer}.data_ptr()" for buffer in cg.args]
    args += [str(s) for s in kernel.size_symbols()]  # dynamic shapes: the sizes, at call time
    call = f"{kernel.name}({', '.join(args)})"
    return GeneratedKernel(kernel.name, "cpp", cg.codegen_kernel(), kernel.origins, call)


def load(generated: GeneratedKernel) -> Callable[..., None]:
    """Compile (or find in the cache) and return the ``ctypes`` function, taking data pointers."""
    if "#if defined(TOYCOMP_SIMD_" in generated.source:  # glibc's vector math (cpp.simdlen)
        lib = _load_vector_math(generated)
    else:
        lib = cache.load_cpp_library(generated.source)
    fn = getattr(lib, generated.name)
    # Declared argument types: one ctypes call per launch, taking data_ptr()'s ints directly.
    args = generated.call[generated.call.index("(") + 1 : -1].split(", ")
    fn.argtypes = [_ctype(a) for a in args if a]  # pointers, then sizes s0... and floats f0...
    fn.restype = None
    return fn


def _load_vector_math(generated: GeneratedKernel) -> ctypes.CDLL:
    """The kernel compiled with the vector math this machine has ([Note: vectorised libm]);
    should that fail to compile or load, compiled again with scalar calls, with a warning."""
    from toycomp.inductor.opt import libmvec  # (which imports this module)

    wanted = re.findall(r"^#if defined\(TOYCOMP_SIMD_(\w+)\)", generated.source, re.MULTILINE)
    flags = libmvec.vector_math_flags(wanted)
    try:
        return cache.load_cpp_library(generated.source, flags)
    except (cache.CppCompileError, OSError) as e:
        if not flags:
            raise
        warnings.warn(f"{generated.name}: vectorised libm failed, using scalar calls ({e})")
        return cache.load_cpp_library(generated.source)
