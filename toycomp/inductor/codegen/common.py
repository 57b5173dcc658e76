"""Stage 4c (shared part): from ``ir.Kernel`` to source text, whatever the target language.

Input IR -> output IR: one ``ir.Kernel`` (loops of ``Store`` / ``Reduce`` over the flat variables
``x`` and ``r``) -> the source of one kernel. This module holds what both backends share; the
languages themselves live in ``cpp.py`` (C++/OpenMP) and ``triton.py``:

* ``IndentedBuffer``: lines with an indentation level, nothing more;
* ``CSE``: a ten-line common-subexpression table that names every value ``tmp0, tmp1, ...``;
* ``IndexPrinter``: sympy index expressions -> ``rindex + 1000*xindex`` (C++ and Python agree,
  except for ``FloorDiv``);
* ``KernelCodegen``: walks a kernel and fills five sections per loop: ``prefix`` (before the loop:
  accumulators), ``loads``, ``compute``, ``stores`` (the loop body, in that order) and ``suffix``
  (after the loop: final reductions). Backends implement ``load``, ``store``, ``reduce``,
  ``constant``, ``index_value``, ``cast``, ``declare`` and ``codegen_kernel``.

Tiny example: ``Store(buf0, x, Op("sin", (Load(arg0, x),)))`` fills ``loads`` with
``tmp0 = load(arg0, xindex)``, ``compute`` with ``tmp1 = sin(tmp0)`` and ``stores`` with
``store(buf0, xindex, tmp1)``, each spelled in the backend's language.

NB: in PyTorch this lives in torch/_inductor/codegen/common.py (IndentedBuffer, CSE, Kernel with
its loads / compute / stores buffers, OpOverrides) and torch/_inductor/codegen/simd.py.
"""

from __future__ import annotations

import contextlib
import keyword
import re
from dataclasses import dataclass
from typing import Callable, Iterator

import sympy
import torch
from sympy.printing.str import StrPrinter

from toycomp.inductor import indexing, ir

OpRule = Callable[..., str]


@dataclass(frozen=True)
class GeneratedKernel:
    """One kernel's source text, ready to print, compile, or look up in ``explain``."""

    name: str
    backend: str  # "cpp" or "triton"
    source: str
    origins: tuple[str, ...]
    call: str = ""  # the line(s) of the Python wrapper that launch it
    variants: tuple[str, ...] = ()  # other kernels of the same source the call may launch
    configs: tuple[dict, ...] = ()  # Triton: launch configs CUDA may time (the call's first)

    def __repr__(self) -> str:
        return f"GeneratedKernel({self.name}, {self.backend}, origins={list(self.origins)})"


class IndentedBuffer:
    """A list of source lines, each written at the current indentation (four spaces a level)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def writeline(self, line: str = "") -> None:
        self.lines.append("    " * self.level + line if line else "")

    def writelines(self, lines: list[str]) -> None:
        for line in lines:
            self.writeline(line)

    def splice(self, other: "IndentedBuffer") -> None:
        """Append ``other``'s lines at this buffer's indentation."""
        self.writelines(other.lines)

    @contextlib.contextmanager
    def indent(self) -> Iterator[None]:
        self.level += 1
        yield
        self.level -= 1

    def getvalue(self) -> str:
        return "\n".join(self.lines) + "\n"

    def __bool__(self) -> bool:
        return bool(self.lines)


class CSE:
    """Names each distinct expression once: ``generate(buf, "sin(tmp0)")`` -> ``"tmp1"``.

    The cache is cleared per loop (a value computed inside one loop is out of scope in the
    next), except where loops share one scope (a persistent Triton reduction has no ``for``: its
    softmax loads a row and computes ``exp`` once for the sum and the store); the counter is
    never cleared, so names stay unique in a kernel.
    """

    def __init__(self, declare: Callable[[str, str, torch.dtype], str]) -> None:
        self.declare = declare  # (name, expr, dtype) -> one line of the backend's language
        self.cache: dict[str, str] = {}
        self.counter = 0

    def generate(self, buffer: IndentedBuffer, expr: str, dtype: torch.dtype) -> str:
        if expr not in self.cache:
            name = f"tmp{self.counter}"
            self.counter += 1
            buffer.writeline(self.declare(name, expr, dtype))
            self.cache[expr] = name
        return self.cache[expr]


# --- sympy index expressions ----------------------------------------------------------------------
# Binary operators spelled the same in C++ and in Triton (Python): both backends' rule tables
# (CPP_OPS, TRITON_OPS) start from these and add their own spellings of everything else.
INFIX_OPS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
}  # fmt: skip


def infix_rules() -> dict[str, Callable[[str, str], str]]:
    """``{"add": lambda a, b: f"{a} + {b}", ...}`` for every entry of ``INFIX_OPS``."""
    return {name: (lambda op: lambda a, b: f"{a} {op} {b}")(op) for name, op in INFIX_OPS.items()}


class IndexPrinter(StrPrinter):
    """Prints index expressions over ``x``/``r`` as ``xindex``/``rindex`` arithmetic."""

    floordiv = "//"

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return {"x": "xindex", "r": "rindex"}.get(expr.name, expr.name)

    def _print_FloorDiv(self, expr: indexing.FloorDiv) -> str:
        base, divisor = (self._print(a) for a in expr.args)
        # Parenthesise both operands: FloorDiv(6*r + x, 24) must not print as 6*r + x // 24.
        return f"(({base}) {self.floordiv} ({divisor}))"

    # Min / Max: a ragged split reduction clamps its row, Min(row, R - 1) (split_reduction.py).
    # Only kernels' indices hold them (sizes never do), so these are Triton's spellings; C++
    # overrides them. Both take a block and a scalar: tl.minimum(rindex + 8, s0 - 1).
    minimum, maximum = "tl.minimum", "tl.maximum"

    def _print_Min(self, expr: sympy.Min) -> str:
        return self._nested(self.minimum, expr.args)

    def _print_Max(self, expr: sympy.Max) -> str:
        return self._nested(self.maximum, expr.args)

    def _nested(self, function: str, args: tuple) -> str:
        first, *rest = args
        text = self._print(first)
        for arg in rest:  # Min(a, b, c) -> minimum(minimum(a, b), c)
            text = f"{function}({text}, {self._print(arg)})"
        return text

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str:
        if expr.exp.is_Integer and expr.exp > 0:  # s0**2, from sizes (s0, s0): s0*s0
            return "*".join([self.parenthesize(expr.base, 100)] * int(expr.exp))
        raise NotImplementedError(f"index expression {expr} (powers are not supported)")

    def _print_Function(self, expr: sympy.Function) -> str:
        raise NotImplementedError(f"index expression {expr} (unknown function {expr.func})")

    def _print_Rational(self, expr: sympy.Rational) -> str:
        raise NotImplementedError(f"index expression {expr} (non-integer coefficient)")


# --- dtypes --------------------------------------------------------------------------------------
LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic on fp16/bf16 happens in fp32 (rounded back only on stores and casts)."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


# Ops whose arguments keep their own dtype; every other op computes in its result dtype, so the
# arguments are cast to it first (prims promise equal dtypes, this makes a slip harmless).
COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}
KEEP_ARG_DTYPES = COMPARISONS | {"logical_not", "logical_and", "convert_element_type"}


def simplify_pow(expr: ir.Op) -> ir.Expr:
    """``pow(a, 2.0)`` -> ``mul(a, a)`` and friends, like eager PyTorch's own special cases."""
    base, exponent = expr.args
    if not isinstance(exponent, ir.Constant) or not expr.dtype.is_floating_point:
        return expr
    e, dt = exponent.value, expr.dtype
    if e == 1:
        return base
    if e == 2:
        return ir.Op("mul", (base, base), dt)
    if e == 3:
        return ir.Op("mul", (ir.Op("mul", (base, base), dt), base), dt)
    if e == 0.5:
        return ir.Op("sqrt", (base,), dt)
    if e == -1:
        return ir.Op("reciprocal", (base,), dt)
    return expr


# Python builtins and keywords a kernel may use; a Reduce named like one gets a prefix.
_RESERVED = set(keyword.kwlist) | {"sum", "max", "min", "abs", "float", "range", "int", "tl"}


class KernelCodegen:
    """What both backends share: argument names, the expression walk, the per-loop sections.

    Subclasses set ``ops`` (their rule table, keyed by prim name) and implement the
    language-specific methods below, which all return source strings.
    """

    ops: dict[str, OpRule] = {}
    printer: IndexPrinter = IndexPrinter()

    def __init__(self, kernel: ir.Kernel) -> None:
        self.kernel = kernel
        self.dtypes = dict(kernel.buffer_dtypes)
        writes = kernel.writes()  # the arguments: buffers only read, then buffers written
        reads = [b for b in kernel.reads() if b not in writes]
        self.args = {b: f"in_ptr{i}" for i, b in enumerate(reads)}
        self.args.update({b: f"out_ptr{i}" for i, b in enumerate(writes)})
        self.cse = CSE(self.declare)
        self.locals: dict[str, str] = {}  # Reduce.name -> variable holding the result
        self.generated: dict[int, tuple[ir.Expr, str]] = {}  # id(node) -> (node, its code)
        self.new_sections()

    def new_sections(self, keep_cse: bool = False) -> None:
        """Fresh sections for the next loop, and a fresh CSE scope unless ``keep_cse``."""
        self.prefix, self.loads, self.compute = IndentedBuffer(), IndentedBuffer(), IndentedBuffer()
        self.stores, self.suffix = IndentedBuffer(), IndentedBuffer()
        if not keep_cse:  # (Triton's persistent reductions: every loop in one scope)
            self.cse.cache.clear()
            self.generated.clear()

    # --- the walk -------------------------------------------------------------------------------
    # [Note: each node generated once]
    # codegen_expr generates each distinct node once per loop, its arguments first, iteratively
    # (see [Note: expressions are DAGs] in loop_body.py); ``generated`` keeps the node alive, so
    # its ``id`` stays its own.
    def codegen_loop(self, loop: ir.Loop) -> None:
        """Fill the five sections for one ``ir.Loop`` (call ``new_sections`` first)."""
        self.in_r_loop = loop.over_r
        for stmt in loop.body:
            value = self.codegen_expr(stmt.value)
            if isinstance(stmt, ir.Store) and not (stmt.indirect or stmt.accumulate):
                self.check_index(stmt.index)
                self.store(stmt.buffer, stmt.index, value, stmt.value)
            else:  # a reduction, a scatter's store, a mix-order partial
                self.codegen_special_statement(stmt, value)

    def codegen_special_statement(
        self, stmt: ir.Reduce | ir.Store | ir.ColumnReduce, value: str
    ) -> None:
        """A ``Reduce`` (in an r loop only), a store at an indirect index or adding to the
        buffer (a scatter), a ``ColumnReduce`` (a mix-order partial)."""
        if isinstance(stmt, ir.Reduce):
            if not self.in_r_loop:
                raise ValueError(f"{self.kernel.name}: Reduce {stmt.name} outside an r loop")
            self.locals[stmt.name] = self.local_name(stmt.name)
            self.reduce(stmt, value)
        elif isinstance(stmt, ir.Store):
            index = self.indirect_index(stmt.index, stmt.indirect)
            self.store(stmt.buffer, index, value, stmt.value, stmt.accumulate)
        else:
            self.check_index(stmt.index)
            self.column_reduce(stmt, value)

    def codegen_expr(self, expr: ir.Expr) -> str:
        """The code of ``expr``'s value in the current loop ([Note: each node generated once])."""
        stack = [(expr, False)]
        while stack:
            node, args_done = stack.pop()
            if id(node) in self.generated:
                continue
            if args_done or not ir.children(node):
                self.generated[id(node)] = (node, self.codegen_node(node))
            else:
                stack.append((node, True))
                stack.extend((arg, False) for arg in reversed(ir.children(node)))
        return self.generated[id(expr)][1]

    def codegen_node(self, expr: ir.Expr) -> str:
        """One node, its arguments already generated (``codegen_expr`` returns their code)."""
        if isinstance(expr, ir.Op):
            return self.codegen_op(expr)
        if isinstance(expr, ir.Load) and not expr.indirect:
            self.check_index(expr.index)
            return self.load(expr.buffer, expr.index, expr.dtype)
        if isinstance(expr, ir.Constant):
            return self.constant(expr.value, expr.dtype)
        return self.codegen_special_node(expr)  # a gather, an index's value, a Reduce's result

    def codegen_special_node(self, expr: ir.Load | ir.IndexValue | ir.Local) -> str:
        if isinstance(expr, ir.Load):  # gather: at an index read from other values
            return self.indirect_load(expr)
        if isinstance(expr, ir.IndexValue):
            self.check_index(expr.index)
            return self.index_value(expr.index, expr.dtype)
        if isinstance(expr, ir.Local):  # a Reduce's result, generated before the Locals reading it
            return self.locals[expr.name]
        raise TypeError(f"unknown loop-IR expression {expr!r}")

    def indirect_load(self, expr: ir.Load) -> str:
        index = self.indirect_index(expr.index, expr.indirect)
        loads, self.loads = self.loads, self.compute  # after the values its index reads
        try:
            return self.load(expr.buffer, index, expr.dtype)
        finally:
            self.loads = loads

    def codegen_op(self, expr: ir.Op) -> str:
        if expr.name == "pow" and (simpler := simplify_pow(expr)) is not expr:
            return self.codegen_expr(simpler)  # x**2 as x*x, x**-1 as a reciprocal
        if expr.name not in self.ops:
            raise NotImplementedError(f"{type(self).__name__}: no rule for op {expr.name!r}")
        args = []
        for i, arg in enumerate(expr.args):
            dtype = operand_dtype(expr, i)
            if isinstance(arg, ir.Constant):  # a number is re-spelled, never cast
                args.append(self.constant(ir.convert_number(arg.value, dtype), dtype))
            elif compute_dtype(arg.dtype) != compute_dtype(dtype):
                args.append(self.cast(self.codegen_expr(arg), arg.dtype, dtype))
            else:
                args.append(self.codegen_expr(arg))
        return self.cse.generate(self.compute, self.op(expr, args), expr.dtype)

    def op(self, expr: ir.Op, args: list[str]) -> str:
        """Apply the rule table (``convert_element_type`` also receives the target dtype)."""
        if expr.name == "convert_element_type":
            return self.ops[expr.name](*args, expr.dtype)
        return self.ops[expr.name](*args)

    def check_index(self, index: sympy.Expr, allowed=()) -> None:
        allowed = ({indexing.x, indexing.r} if self.in_r_loop else {indexing.x}) | set(allowed)
        free = sympy.sympify(index).free_symbols - allowed
        arguments = {v for v in free if indexing.is_size_symbol(v) or indexing.is_scalar_symbol(v)}
        extra = free - arguments  # sizes s0, s1 (and scalars f0) are kernel arguments
        if extra:
            where = "an r loop" if self.in_r_loop else "an x-only loop"
            raise ValueError(f"{self.kernel.name}: index {index} uses {extra} in {where}")

    def indirect_index(self, index: sympy.Expr, indirect: tuple[ir.Expr, ...]) -> sympy.Expr:
        """``index`` with each ``ind<k>`` replaced by the variable holding ``indirect[k]``
        (generated first): ``768*ind0 + x`` becomes ``768*tmp3 + x`` (see [Note: indirect
        indexing] in loop_body.py)."""
        mapping = {}
        for k, value in enumerate(indirect):
            code = self.codegen_expr(value)
            if not code.isidentifier():  # a literal: give it a name
                code = self.cse.generate(self.compute, code, value.dtype)
            mapping[ir.indirect_symbol(k)] = sympy.Symbol(code, integer=True)
        unbound = {s for s in sympy.sympify(index).free_symbols if ir.is_indirect_symbol(s)}
        if unbound - mapping.keys():
            raise ValueError(f"{self.kernel.name}: index {index} uses unbound {unbound}")
        self.check_index(index, allowed=mapping.keys())
        return sympy.sympify(index).xreplace(mapping)  # (see indexing.py)

    def local_name(self, name: str) -> str:
        clean = re.sub(r"\W", "_", name)
        generated = r"(tmp|in_ptr|out_ptr)\d+|[xr](index|mask|offset|numel|base)?|[XR]BLOCK"
        reserved = re.fullmatch(generated, clean) or clean in _RESERVED
        if not clean.isidentifier() or reserved:
            clean = f"red_{clean}"
        return clean

    def print_index(self, index: sympy.Expr) -> str:
        return self.printer.doprint(sympy.sympify(index))

    def origins_comment(self) -> str:
        return ", ".join(self.kernel.origins) or "(no FX origins recorded)"

    # --- implemented by each backend -----------------------------------------------------------
    def load(self, buffer: str, index: sympy.Expr, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def store(self, buffer: str, index: sympy.Expr, value: str, expr: ir.Expr,
              accumulate: bool = False) -> None:  # fmt: skip
        raise NotImplementedError

    def reduce(self, red: ir.Reduce, value: str) -> None:
        raise NotImplementedError

    def column_reduce(self, red: ir.ColumnReduce, value: str) -> None:
        """A mix-order partial: only the Triton backend's kernels take rows per program."""
        raise NotImplementedError(f"{type(self).__name__}: ColumnReduce {red.buffer}")

    def constant(self, value: ir.Number, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def index_value(self, index: sympy.Expr, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def cast(self, value: str, src: torch.dtype, dst: torch.dtype) -> str:
        raise NotImplementedError

    def declare(self, name: str, expr: str, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def codegen_kernel(self) -> str:
        raise NotImplementedError


def operand_dtype(expr: ir.Op, i: int) -> torch.dtype:
    """The dtype argument ``i`` of ``expr`` is computed in: the op's own dtype, except for the
    arguments of comparisons / logical ops / casts and the condition of ``where``."""
    arg = expr.args[i]
    keep = expr.name in KEEP_ARG_DTYPES or (expr.name == "where" and i == 0)
    if keep and not (isinstance(arg, ir.Constant) and arg.dtype is None):
        return arg.dtype
    return expr.dtype
