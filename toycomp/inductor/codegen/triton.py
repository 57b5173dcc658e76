"""Stage 4c (Triton backend): ``ir.Kernel`` -> one ``@triton.jit`` kernel.

Input IR -> output: a fused kernel -> a Python module holding one Triton kernel (plus the few
``tl.*``-only helpers it uses). Each program handles ``XBLOCK`` values of ``x``; reductions add an
``RBLOCK``-wide axis over ``r``. For ``sin(x)**2 + cos(x)**2`` on 1000 floats (the scheduled kernel
that ``toycomp.explain`` keeps)::

    >>> import torch, toycomp
    >>> f = lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2
    >>> kernel = toycomp.explain(f, torch.empty(1000)).graph("forward").scheduled.steps[0]
    >>> generated = generate(kernel)
    >>> print(generated.source.split("@triton.jit")[-1].strip())
    def kernel_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        # FX origins: sin, mul, cos, mul_1, add
        xoffset = tl.program_id(0) * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        # loop 0: store buf0
        tmp0 = tl.load(in_ptr0 + (xindex), xmask)
        tmp1 = tl.sin(tmp0)
        tmp2 = tmp1 * tmp1
        tmp3 = tl.cos(tmp0)
        tmp4 = tmp3 * tmp3
        tmp5 = tmp2 + tmp4
        tl.store(out_ptr0 + (xindex), tmp5, xmask)
    >>> generated.call  # the wrapper's line that launches it
    'kernel_0[(1,)](primals_1, buf0, 1000, XBLOCK=1024, num_warps=4)'

Rules (see the Notes): every load and store is masked, a load that only one branch of a ``where``
needs by that branch's condition too (codegen/masked_loads.py); fp16/bf16 are upcast to fp32 on load;
only ``tl.*`` math (Triton's CPU interpreter cannot run ``libdevice``); block sizes come from
``block_sizes`` in triton_heuristics.py, and on CUDA the fastest of a few candidates is
launched instead (autotune.py). On CPU tensors the kernel runs in Triton's interpreter. With
dynamic shapes the sizes are kernel arguments, the grid comes from them at each call (see
[Note: Triton with dynamic shapes] in triton_heuristics.py).

NB: in PyTorch this lives in torch/_inductor/codegen/triton.py (TritonKernel, TritonOverrides,
persistent vs looped reductions), torch/_inductor/runtime/triton_heuristics.py (block sizes,
autotuning) and torch/_inductor/runtime/triton_helpers.py (NaN-propagating max/min).
"""

from __future__ import annotations

import math
import re
from typing import Any

import sympy
import torch

import toycomp.config as config
import toycomp.prims as prims
from toycomp._triton_compat import InterpretedKernel, LeanLauncher
from toycomp.inductor import cache, indexing, ir
from toycomp.inductor.opt.autotune import autotuned
from toycomp.inductor.opt.split_reduction import ReductionHint
from toycomp.inductor.codegen.common import (
    KEEP_ARG_DTYPES,
    LOW_PRECISION,
    GeneratedKernel,
    IndentedBuffer,
    KernelCodegen,
    compute_dtype,
    operand_dtype,
)
from toycomp.inductor.codegen.masked_loads import load_conditions
from toycomp.inductor.codegen.triton_heuristics import (
    PERSISTENT_MAX_RNUMEL,
    block_sizes,
    candidate_configs,
    eviction_policy,
    index_dtype,
    index_dtype_arg,
    kernel_hint,
    past_l2,
    python_size,
    reduction_blocks,  # noqa: F401  (the wrapper's namespace takes it from here)
)
from toycomp.inductor.codegen.triton_helpers import (
    HELPERS,
    TRITON_OPS,
    final_reduction,
    triton_convert,
    triton_narrow,
    triton_type,
    triton_widen,
)

XSTART = sympy.Symbol("xstart", integer=True, nonnegative=True)  # a program's first row


class TritonKernelCodegen(KernelCodegen):
    """Generates one ``@triton.jit`` function for an ``ir.Kernel``."""

    ops = TRITON_OPS

    def __init__(self, kernel: ir.Kernel, persistent: bool | None = None, cuda: bool = False
                 ) -> None:  # fmt: skip
        super().__init__(kernel)
        self.blocks = block_sizes(kernel, cuda)
        self.is_reduction = any(loop.over_r for loop in kernel.loops)
        if persistent is None:  # (a symbolic rnumel: generate() asks for both variants)
            persistent = self.blocks.get("RBLOCK", 0) >= kernel.rnumel
        self.persistent = self.is_reduction and persistent
        if kernel.rows_per_program and not self.persistent:  # (column sums need whole rows)
            raise ValueError(f"{kernel.name}: rows_per_program needs a persistent reduction")
        one_pass = self.persistent or not self.is_reduction  # [Note: eviction policy]
        self.cuda_past_l2 = cuda and one_pass and past_l2(kernel)
        variant = self.is_reduction and not self.blocks and not persistent
        self.name = f"{kernel.name}_looped" if variant else kernel.name
        self.int64_index = index_dtype(kernel, self.blocks, self.is_reduction)
        self.load_masks: dict | None = None  # see codegen_loop and masked_loads.py
        self.loaded_later: set[str] = set()  # buffers a later loop loads (eviction_policy)

    # --- shapes and masks -----------------------------------------------------------------------
    def shape(self, with_r: bool) -> str:
        if not self.is_reduction:
            return "[XBLOCK]"
        return "[XBLOCK, RBLOCK]" if with_r else "[XBLOCK, 1]"

    def mask(self, index: sympy.Expr | None) -> str:
        if index is None:
            return "rmask & xmask" if self.in_r_loop else "xmask"
        free = sympy.sympify(index).free_symbols
        # an indirect index (its ``tmp``s: [Note: indirect indexing]) may move with r
        uses_r = indexing.r in free or (self.in_r_loop and any(v.name[:3] == "tmp" for v in free))
        return "rmask & xmask" if uses_r else "xmask"

    def pointer(self, buffer: str, index: sympy.Expr) -> str:
        index = sympy.sympify(index)
        text = self.print_index(index)
        if not index.free_symbols:  # a block pointer is needed for a block mask
            itype = "tl.int64" if self.int64_index is not False else "tl.int32"
            text = f"tl.full({self.shape(False)}, {text}, {itype})"
        elif not index.free_symbols & {indexing.x, indexing.r}:  # only sizes: s0 - 1
            itype = "tl.int64" if self.int64_index is not False else "tl.int32"
            text = f"tl.zeros({self.shape(False)}, {itype}) + ({text})"
        return f"{self.args[buffer]} + ({text})"

    # --- the backend methods --------------------------------------------------------------------
    def codegen_loop(self, loop: ir.Loop) -> None:
        # loops that share one scope share values too: their loads are masked by all their uses
        position = next(i for i, lp in enumerate(self.kernel.loops) if lp is loop)
        later = [stmt.value for lp in self.kernel.loops[position + 1 :] for stmt in lp.body]
        self.loaded_later = {e.buffer for e in ir.walk(*later) if isinstance(e, ir.Load)}
        if not self.persistent:
            self.load_masks = load_conditions([stmt.value for stmt in loop.body])
        elif self.load_masks is None:  # once for the kernel
            roots = [stmt.value for lp in self.kernel.loops for stmt in lp.body]
            self.load_masks = load_conditions(roots)
        super().codegen_loop(loop)

    def load(self, buffer: str, index: sympy.Expr, dtype: torch.dtype) -> str:
        mask, section = self.mask(index), self.loads
        terms = self.load_masks.get((buffer, index))
        if terms:  # read only where a `where` selects it ([Note: loads masked by where])
            mask, section = f"{mask} & ({self.where_mask(terms)})", self.compute
        other = ""
        if "rmask" in mask or terms:
            other = ", other=" + self.constant(0, self.dtypes[buffer])
        looped, again = self.in_r_loop and not self.persistent, buffer in self.loaded_later
        policy = None
        if config.triton.eviction_hints:
            policy = eviction_policy(index, looped, self.persistent, again, self.cuda_past_l2)
        if policy:  # [Note: eviction policy] in triton_heuristics.py
            other += f", eviction_policy='{policy}'"
        load = f"tl.load({self.pointer(buffer, index)}, {mask}{other})"
        code = triton_widen(load, self.dtypes[buffer])
        return self.cse.generate(section, code, self.dtypes[buffer])

    def where_mask(self, terms: list[list[tuple[ir.Expr, bool]]]) -> str:
        """``(c0 & ~c1) | c2``: the where-conditions under which a load is selected."""
        def condition(c: ir.Expr, taken: bool) -> str:
            return self.codegen_expr(c) if taken else f"~{self.codegen_expr(c)}"

        conjunctions = [" & ".join(condition(c, taken) for c, taken in t) for t in terms]
        return " | ".join(f"({c})" for c in conjunctions) if len(terms) > 1 else conjunctions[0]

    def store(self, buffer: str, index: sympy.Expr, value: str, expr: ir.Expr,
              accumulate: bool = False) -> None:  # fmt: skip
        dtype = self.dtypes[buffer]
        if isinstance(expr, ir.Constant):
            value = self.materialize(value, dtype)
        if dtype == torch.bool and expr.dtype != torch.bool:
            value = f"{value} != 0"
        elif dtype != compute_dtype(expr.dtype):
            value = triton_narrow(value, dtype, compute_dtype(expr.dtype))
        mask = "rmask & xmask" if self.in_r_loop else "xmask"
        store = "tl.atomic_add" if accumulate else "tl.store"  # [Note: a scatter is a buffer
        # written twice] in scheduler.py: a scatter-add's programs may hit one element at once
        if accumulate:
            value = f"tl.broadcast_to({value}, {self.shape(self.in_r_loop)})"
        self.stores.writeline(f"{store}({self.pointer(buffer, index)}, {value}, {mask})")

    def reduce(self, red: ir.Reduce, value: str) -> None:
        acc, dtype = self.locals[red.name], compute_dtype(red.dtype)
        if isinstance(red.value, ir.Constant):
            value = self.materialize(value, dtype)
        elif compute_dtype(red.value.dtype) != dtype:
            value = self.cast(value, red.value.dtype, dtype)
        identity = self.constant(prims.reduction_identity(red.reduction_type.value, dtype), dtype)
        kind = red.reduction_type
        if self.persistent:
            masked = self.cse.generate(
                self.compute, f"tl.where(rmask & xmask, {value}, {identity})", dtype
            )
            self.stores.writelines(final_reduction(acc, masked, kind, dtype))
            return
        partial = f"{acc}_acc"
        init = f"tl.full([XBLOCK, RBLOCK], {identity}, {triton_type(dtype)})"
        self.prefix.writeline(f"{partial} = {init}")
        if kind == ir.ReductionType.SUM:
            update = f"{partial} + {value}"
            self.stores.writeline(f"{partial} = tl.where(rmask & xmask, {update}, {partial})")
        else:
            better = ">" if kind == ir.ReductionType.MAX else "<"
            take = f"rmask & xmask & (({value} {better} {partial}) | ({value} != {value}))"
            self.stores.writeline(f"{partial} = tl.where({take}, {value}, {partial})")
        self.suffix.writelines(final_reduction(acc, partial, kind, dtype))

    def column_reduce(self, red: ir.ColumnReduce, value: str) -> None:
        """Add this step's rows to the column sums (``{buffer}_acc``, [1, RBLOCK]); stored after
        the program's last row (see codegen_kernel)."""
        dtype = compute_dtype(red.dtype)
        if isinstance(red.value, ir.Constant):
            value = self.materialize(value, dtype)
        elif compute_dtype(red.value.dtype) != dtype:
            value = self.cast(value, red.value.dtype, dtype)
        zero = self.constant(0, dtype)  # (the same text as a row sum's: one tl.where for both)
        masked = self.cse.generate(self.compute, f"tl.where(rmask & xmask, {value}, {zero})", dtype)
        acc = f"{red.buffer}_acc"
        self.stores.writeline(f"{acc} = {acc} + tl.sum({masked}, 0)[None, :]")

    def constant(self, value: ir.Number, dtype: torch.dtype) -> str:
        if isinstance(value, bool) or dtype == torch.bool:
            return "True" if value else "False"
        if isinstance(value, float) or (dtype is not None and dtype.is_floating_point):
            value = float(value)
            if math.isnan(value):
                return 'float("nan")'
            if math.isinf(value):
                return 'float("inf")' if value > 0 else 'float("-inf")'
            return f"({value!r})" if value < 0 else repr(value)
        value = int(value)
        if dtype is not None and dtype != torch.int64:  # eager wraps x * 1000 in uint8 around
            bits = torch.iinfo(dtype).bits
            value = (value - torch.iinfo(dtype).min) % 2**bits + torch.iinfo(dtype).min
        return f"({value})" if value < 0 else str(value)

    def materialize(self, value: str, dtype: torch.dtype) -> str:
        """A number as a tensor of the current shape (``tl.exp(2.0)`` alone is not valid)."""
        shape = self.shape(self.in_r_loop)
        return f"tl.full({shape}, {value}, {triton_type(compute_dtype(dtype))})"

    def index_value(self, index: sympy.Expr, dtype: torch.dtype) -> str:
        index = sympy.sympify(index)
        text = self.print_index(index)
        if not index.free_symbols:  # a number: a block of it, in an exact dtype
            exact = torch.int64 if dtype in LOW_PRECISION else dtype
            code = f"tl.full({self.shape(self.in_r_loop)}, {text}, {triton_type(exact)})"
            if exact != dtype:
                code = triton_convert(code, dtype, exact)
        elif not index.free_symbols & {indexing.x, indexing.r}:  # a size (mean's s0): a block
            scalar = any(indexing.is_scalar_symbol(v) for v in index.free_symbols)
            kind = torch.float32 if scalar else torch.int64  # (a float f0 arrives as fp32)
            block = f"(tl.zeros({self.shape(self.in_r_loop)}, {triton_type(kind)}) + ({text}))"
            code = triton_convert(block, dtype, kind)
        else:
            code = triton_convert(f"({text})", dtype)
        return self.cse.generate(self.compute, code, dtype)

    def cast(self, value: str, src: torch.dtype, dst: torch.dtype) -> str:
        return triton_convert(value, dst, compute_dtype(src))

    def declare(self, name: str, expr: str, dtype: torch.dtype) -> str:
        return f"{name} = {expr}"

    def op(self, expr: ir.Op, args: list[str]) -> str:
        consts = [isinstance(a, ir.Constant) for a in expr.args]
        for i, is_const in enumerate(consts):
            if is_const and (expr.name not in _NUMBERS_OK or (all(consts) and i == 0)):
                args[i] = self.materialize(args[i], operand_dtype(expr, i))
        if expr.name == "pow" and not expr.dtype.is_floating_point:  # wraps like eager's
            return f"_pow_int({args[0]}, {args[1]})"
        if expr.name == "convert_element_type":  # the source dtype picks the rounding path
            return triton_convert(args[0], expr.dtype, compute_dtype(expr.args[0].dtype))
        return super().op(expr, args)

    # --- layout ---------------------------------------------------------------------------------
    def codegen_kernel(self) -> str:
        body = IndentedBuffer()
        with body.indent():
            self.codegen_header(body)
            if not self.kernel.rows_per_program:
                self.codegen_loops(body)
            else:  # [Note: mix-order reductions] in split_reduction.py
                partials = [s for s in self.kernel.stores() if isinstance(s, ir.ColumnReduce)]
                for red in partials:
                    dtype = triton_type(compute_dtype(red.dtype))
                    body.writeline(f"{red.buffer}_acc = tl.zeros([1, RBLOCK], {dtype})")
                body.writeline("for xstep in range(0, RSPLIT, XBLOCK):  # this program's rows")
                with body.indent():
                    body.writeline("xoffset = xstart + xstep")
                    self.codegen_rows(body)
                    self.codegen_loops(body)
                for red in partials:  # one partial per column and program
                    index = sympy.sympify(red.index).subs(indexing.x, XSTART)
                    pointer = f"{self.args[red.buffer]} + ({self.print_index(index)})"
                    body.writeline(f"tl.store({pointer}, {red.buffer}_acc, rmask)")
        code = IndentedBuffer()
        code.writeline("@triton.jit")
        code.writeline(f"def {self.name}({', '.join(self.signature())}):")
        code.splice(body)
        source = code.getvalue()
        helpers = [h for name, h in HELPERS.items() if re.search(rf"\b{name}\(", source)]
        header = "import triton\nimport triton.language as tl\n\n\n"
        return header + "".join(h + "\n\n" for h in helpers) + source

    def signature(self) -> list[str]:
        params = [*self.args.values(), *map(str, self.kernel.size_symbols()), "xnumel"]
        if self.is_reduction and not indexing.is_static(self.kernel.rnumel):
            params.append("rnumel")  # symbolic: one compiled kernel for every size
        elif self.is_reduction:  # constexpr: `range(0, rnumel, RBLOCK)` must see an int (3.6)
            params.append("rnumel: tl.constexpr")
        params.append("XBLOCK: tl.constexpr")
        if self.is_reduction:
            params.append("RBLOCK: tl.constexpr")
        if self.kernel.rows_per_program:
            params.append("RSPLIT: tl.constexpr")
        if isinstance(self.int64_index, list):
            params.append("INDEX_INT64: tl.constexpr")
        return params + [f"{s}_ALIGN: tl.constexpr" for s in _int_sizes(self.kernel)]

    # [Note: alignment of symbolic sizes]
    # Triton specializes an int argument divisible by 16 (and one equal to 1): with a row of
    # s1 = 8192 floats it knows each row starts 64-byte aligned and loads 4 floats at once. A
    # row of s1 = 1000 floats is a multiple of 8 but not of 16, so Triton knows nothing and
    # loads one float at a time: the all-dynamic row softmax ran 11% slower than the static one,
    # whose literal 1000 shows the multiple of 8. So the wrapper also passes, per size, the
    # largest power of two up to 16 that divides it (``s1_ALIGN=alignment(s1)``, a constexpr:
    # at most five variants compile), and the kernel rebuilds the size as a visible multiple:
    # ``s1 = (s1 // s1_ALIGN) * s1_ALIGN``, the same value, now known to be a multiple of 8.
    # (Triton's interpreter gains nothing from it, and some versions of it cannot take a size
    # turned into a tensor: there the wrapper passes 1 and the lines are skipped.)
    def codegen_alignment(self, body: IndentedBuffer) -> None:
        for s in _int_sizes(self.kernel):
            body.writeline(f"if {s}_ALIGN > 1:")
            with body.indent():
                body.writeline(f"{s} = ({s} // {s}_ALIGN) * {s}_ALIGN  # same value, known multiple")
                if self.kernel.numel == s:
                    body.writeline(f"xnumel = {s}")
                if self.is_reduction and self.kernel.rnumel == s:
                    body.writeline(f"rnumel = {s}")

    def codegen_loops(self, body: IndentedBuffer) -> None:
        for i, loop in enumerate(self.kernel.loops):
            self.codegen_loop_code(body, i, loop)

    def codegen_header(self, body: IndentedBuffer) -> None:
        body.writeline(f"# FX origins: {self.origins_comment()}")
        self.codegen_alignment(body)
        if isinstance(self.int64_index, list):  # decided per call, by the wrapper
            body.writelines(["xoffset = tl.program_id(0)", "if INDEX_INT64:"])
            body.writelines(["    xoffset = xoffset.to(tl.int64)", "xoffset = xoffset * XBLOCK"])
        else:
            pid = "tl.program_id(0).to(tl.int64)" if self.int64_index else "tl.program_id(0)"
            rows = self.kernel.rows_per_program  # (then xoffset moves by XBLOCK in a loop)
            body.writeline(f"xstart = {pid} * RSPLIT" if rows else f"xoffset = {pid} * XBLOCK")
        if not self.kernel.rows_per_program:
            self.codegen_rows(body)
        if self.is_reduction:
            cast = ".to(tl.int64)" if self.int64_index is True else ""
            body.writeline(f"rbase = tl.arange(0, RBLOCK)[None, :]{cast}")
            if isinstance(self.int64_index, list):
                body.writelines(["if INDEX_INT64:", "    rbase = rbase.to(tl.int64)"])
        if self.persistent:
            body.writelines(["rindex = rbase", "rmask = rindex < rnumel"])

    def codegen_rows(self, body: IndentedBuffer) -> None:
        if not self.is_reduction:
            body.writeline("xindex = xoffset + tl.arange(0, XBLOCK)")
        else:
            body.writeline("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        body.writeline("xmask = xindex < xnumel")

    def codegen_loop_code(self, body: IndentedBuffer, i: int, loop: ir.Loop) -> None:
        # A persistent reduction has no `for` loop: every ir.Loop runs in the same scope, so
        # values (the row's loads, exp(x - max)) computed in one are reused by the next.
        self.new_sections(keep_cse=self.persistent)
        self.codegen_loop(loop)
        what = ", ".join(_describe(stmt) for stmt in loop.body)
        body.writeline(f"# loop {i}{' over r' if loop.over_r else ''}: {what}")
        if not loop.over_r or self.persistent:
            for section in (self.loads, self.compute, self.stores):
                body.splice(section)
            return
        body.splice(self.prefix)
        body.writeline("for roffset in range(0, rnumel, RBLOCK):")
        with body.indent():
            body.writelines(["rindex = roffset + rbase", "rmask = rindex < rnumel"])
            for section in (self.loads, self.compute, self.stores):
                body.splice(section)
        body.splice(self.suffix)


# Ops whose arguments may stay Python numbers (Triton's operators accept them).
_NUMBERS_OK = {"add", "sub", "mul", "div", "where"} | (KEEP_ARG_DTYPES - {"logical_not"})
_NUMBERS_OK -= {"logical_and", "convert_element_type"}


def _describe(stmt: ir.Store | ir.Reduce | ir.ColumnReduce) -> str:
    if isinstance(stmt, ir.Store):
        return f"store {stmt.buffer}"
    if isinstance(stmt, ir.ColumnReduce):
        return f"{stmt.reduction_type.value} over rows -> {stmt.buffer}"
    return f"{stmt.reduction_type.value} -> {stmt.name}"


def _int_sizes(kernel: ir.Kernel) -> list:
    """The kernel's integer size arguments (``s0``; not a float ``f0`` made from sizes) that
    take an ``_ALIGN`` (config.triton.divisible_by_16: [Note: alignment of symbolic sizes])."""
    if not config.triton.divisible_by_16:
        return []
    return [s for s in kernel.size_symbols() if not indexing.is_scalar_symbol(s)]


# --- compile and launch -----------------------------------------------------------------------
def generate(kernel: ir.Kernel, cuda: bool = False) -> GeneratedKernel:
    """Triton source for ``kernel`` plus the wrapper line that launches it: Triton's
    ``kernel[grid](args)``, or for ``cuda`` tensors ``kernel.run(stream0, grid, args)`` (a
    lean launch) with the GPU's block sizes."""
    symbolic_rnumel = not indexing.is_static(kernel.rnumel)
    cg = TritonKernelCodegen(kernel, persistent=True if symbolic_rnumel else None, cuda=cuda)
    source = cg.codegen_kernel()
    numel, rnumel = (python_size(n) for n in (kernel.numel, kernel.rnumel))
    sizes = [*map(str, kernel.size_symbols()), numel] + ([rnumel] if cg.is_reduction else [])
    args = ", ".join([*cg.args, *sizes])
    args += "".join(f", {s}_ALIGN=alignment({s})" for s in _int_sizes(kernel))
    if isinstance(cg.int64_index, list):
        args += ", " + index_dtype_arg(cg.int64_index)
    meta = dict(cg.blocks)
    if not meta:  # a symbolic rnumel: two variants, block sizes for this call's sizes
        looped = TritonKernelCodegen(kernel, persistent=False, cuda=cuda)
        source += "\n\n@triton.jit\n" + looped.codegen_kernel().split("@triton.jit\n")[-1]
        blocks, name = f"{kernel.name}_blocks", kernel.name
        outer = kernel_hint(kernel) == ReductionHint.OUTER  # persistent iff rnumel <= RBLOCK:
        limit = f"{blocks}['RBLOCK']" if outer else PERSISTENT_MAX_RNUMEL
        pick = f"({name} if {rnumel} <= {limit} else {looped.name})"
        flags = (", outer=True" if outer else "") + (", cuda=True" if cuda else "")
        call = f"{blocks} = reduction_blocks({numel}, {rnumel}{flags})\n"
        grid = f"(cdiv({numel}, {blocks}['XBLOCK']),)"
        call += launch(pick, grid, f"{args}, **{blocks}", cuda and config.triton.lean_launch)
        return GeneratedKernel(
            kernel.name, "triton", source, kernel.origins, call, variants=(looped.name,)
        )
    if indexing.is_static(kernel.numel):  # (RSPLIT rows a program: a mix-order reduction)
        grid = f"({-(-kernel.numel // meta.get('RSPLIT', meta['XBLOCK']))},)"
    else:
        grid = f"(cdiv({numel}, {meta['XBLOCK']}),)"
    kwargs = ", ".join(f"{k}={v}" for k, v in meta.items())
    call = launch(kernel.name, grid, f"{args}, {kwargs}", cuda and config.triton.lean_launch)
    # what CUDA may launch instead: see [Note: autotuning candidates] in triton_heuristics.py
    configs = tuple(candidate_configs(kernel, dict(meta), cg.int64_index))
    return GeneratedKernel(kernel.name, "triton", source, kernel.origins, call, configs=configs)


def launch(kernel: str, grid: str, args: str, lean: bool) -> str:
    """The wrapper's launch of ``kernel``: see [Note: lean launches] in _triton_compat.py."""
    return f"{kernel}.run(stream0, {grid}, {args})" if lean else f"{kernel}[{grid}]({args})"


def load(generated: GeneratedKernel, device: torch.device, name: str | None = None) -> Any:
    """Import the kernel's module; on CPU wrap the kernel for Triton's interpreter. ``name``:
    another kernel of the module (a variant: ``kernel_0_looped``)."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError("backend='triton' needs the triton package (pip install triton)") from e
    module = cache.load_python_module(generated.source, "triton")
    kernel = getattr(module, name or generated.name)
    lean = ".run(stream0," in generated.call  # config.triton.lean_launch, when generated
    if device.type == "cuda" and lean:  # lean launches of the fastest config: [Note: lean
        return autotuned(LeanLauncher(kernel, device), kernel, generated)  # launches], autotuning
    if device.type == "cuda":
        return kernel  # launched as kernel[grid](args)
    if device.type == "cpu":
        return InterpretedKernel(kernel)
    raise RuntimeError(f"Triton backend: unsupported device {device} (use cuda, or cpu tensors)")
