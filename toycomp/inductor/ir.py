"""Stage 4a: the loop-level IR, from lowered buffers down to fused kernels.

Three layers, all small frozen dataclasses that print compactly:

1. **Value expressions** (``Load``, ``Constant``, ``IndexValue``, ``Op``, ``Local``): the body of a
   loop, as a tree. ``Op`` names a pointwise prim (``"sin"``, ``"add"``, ``"where"``...). Indices
   are sympy expressions over loop variables, so a view is just a substitution of variables
   (``permute`` swaps them, ``broadcast_in_dim`` drops them, ``slice`` scales them): no copies.
2. **Buffers** (``InputBuffer``, ``Pointwise``, ``Reduction``, ``ExternKernel``), produced by
   ``lowering.py``: one node per tensor that must exist in memory, with a body over its own index
   variables ``i0, i1, ...`` (and ``r0, r1, ...`` for the reduced dims of a ``Reduction``).
3. **Kernels** (``Kernel`` of ``Loop`` of ``Store`` / ``Reduce``), produced by ``scheduler.py``:
   a fused group of buffers rewritten over two flat variables, ``x`` in ``range(numel)`` (one
   output row or element) and ``r`` in ``range(rnumel)`` (the reduced elements of that row).

Example: ``sin(x)**2 + cos(x)**2`` on 1000 floats lowers to one ``Pointwise`` whose body is
``add(mul(sin(load(arg0, i0)), ...), ...)`` and schedules to one ``Kernel(numel=1000, rnumel=1)``
with a single ``Loop(over_r=False)`` holding one ``Store``.

NB: in PyTorch this lives in torch/_inductor/ir.py (Pointwise, Reduction, ExternKernel, Layout,
ReinterpretView) and torch/_inductor/scheduler.py (SchedulerNode, FusedSchedulerNode); Inductor's
``inner_fn`` closures play the role of our printable expression trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterator, Union

import sympy
import torch

Number = Union[int, float, bool]


# --- index arithmetic ---------------------------------------------------------------------------
class FloorDiv(sympy.Function):
    """``a // b`` for non-negative integers (printed as ``/`` in C++, ``//`` in Triton)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1:
            return base
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):  # (a // b) // c == a // (b * c)
            return FloorDiv(base.args[0], base.args[1] * divisor)
        return None


def modular(base: sympy.Expr, divisor: int) -> sympy.Expr:
    """``base % divisor`` written as ``base - divisor * (base // divisor)`` so that sympy cancels
    the ``10*(x//10) + x%10`` patterns that flattening and unflattening produce."""
    if divisor == 1:
        return sympy.Integer(0)
    return base - divisor * FloorDiv(base, divisor)


def index_vars(prefix: str, n: int) -> tuple[sympy.Symbol, ...]:
    """Loop variables ``i0, i1, ...``: integer and non-negative, which lets sympy simplify."""
    return tuple(sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True) for k in range(n))


# The two flat variables of a kernel (Triton's xindex and rindex).
x, r = sympy.symbols("x r", integer=True, nonnegative=True)


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for n in reversed(size):
        strides.append(running)
        running *= n
    return tuple(reversed(strides))


def linear_index(idx: tuple[sympy.Expr, ...], stride: tuple[int, ...], offset: int = 0) -> sympy.Expr:
    """``offset + sum(i * s)``: the memory position of element ``idx`` of a strided tensor."""
    return sympy.Integer(offset) + sympy.Add(*(i * s for i, s in zip(idx, stride)))


def unflatten_index(flat: sympy.Expr, size: tuple[int, ...]) -> tuple[sympy.Expr, ...]:
    """The per-dimension indices of row-major position ``flat`` in a tensor of ``size``."""
    idx, inner = [], 1
    outer = next((dim for dim, n in enumerate(size) if n != 1), None)
    for dim, n in reversed(list(enumerate(size))):
        if n == 1:
            idx.append(sympy.Integer(0))
        elif dim == outer:  # the outermost index needs no modulo: flat < numel already bounds it
            idx.append(FloorDiv(flat, inner))
        else:
            idx.append(modular(FloorDiv(flat, inner), n))
        inner *= n
    return tuple(reversed(idx))


def numel(size: tuple[int, ...]) -> int:
    total = 1
    for n in size:
        total *= n
    return total


def simplify_index(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Expand ``expr`` and drop the ``//`` (and so ``%``) terms that the variables' ranges make
    trivial: with ``0 <= i1 < 1000``, ``(1000*i0 + i1) // 1000`` becomes ``i0``.

    ``ranges`` maps a variable to its extent (``i1 -> 1000``); other symbols are left alone.
    """
    return sympy.expand(_simplify_floordiv(sympy.expand(expr), ranges))


def _simplify_floordiv(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    if not expr.args:
        return expr
    args = [_simplify_floordiv(a, ranges) for a in expr.args]
    if not isinstance(expr, FloorDiv) or not args[1].is_Integer or args[1] <= 0:
        return expr.func(*args)
    divisor = int(args[1])
    whole, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(args[0])):
        coeff, _ = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % divisor == 0:
            whole += term
        else:
            rest += term
    bounds = _bounds(rest, ranges)  # (a*d + b) // d == a + b // d, and b // d == 0 if 0 <= b < d
    if bounds is not None and bounds[0] >= 0 and bounds[1] < divisor:
        return sympy.expand(whole / divisor)
    return sympy.expand(whole / divisor) + FloorDiv(rest, divisor)


def _bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> tuple[int, int] | None:
    """Smallest and largest value of ``expr`` over ``ranges``, or None when unknown."""
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        return (0, ranges[expr] - 1) if expr in ranges else None
    parts = [_bounds(a, ranges) for a in expr.args]
    if any(p is None for p in parts):
        return None
    if isinstance(expr, sympy.Add):
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(expr, sympy.Mul):
        lo, hi = 1, 1
        for a, b in parts:
            corners = (lo * a, lo * b, hi * a, hi * b)
            lo, hi = min(corners), max(corners)
        return lo, hi
    if isinstance(expr, FloorDiv) and parts[1][0] == parts[1][1] and parts[1][0] > 0:
        return parts[0][0] // parts[1][0], parts[0][1] // parts[1][0]
    return None


# --- value expressions: the body of a loop ---------------------------------------------------------
@dataclass(frozen=True)
class Load:
    """Read ``buffer`` at memory position ``index`` (an element offset, strides already applied)."""

    buffer: str
    index: sympy.Expr
    dtype: torch.dtype

    def __repr__(self) -> str:
        return f"load({self.buffer}, {self.index})"


@dataclass(frozen=True)
class Constant:
    value: Number
    dtype: torch.dtype

    def __repr__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class IndexValue:
    """The value of an index expression (how ``iota`` lowers)."""

    index: sympy.Expr
    dtype: torch.dtype

    def __repr__(self) -> str:
        return f"index({self.index})"


@dataclass(frozen=True)
class Op:
    """A pointwise prim applied to sub-expressions; ``name`` is the prim's name (``"sin"``)."""

    name: str
    args: tuple["Expr", ...]
    dtype: torch.dtype

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(map(repr, self.args))})"


@dataclass(frozen=True)
class Local:
    """The per-row result of a ``Reduce`` that ran earlier in the same kernel."""

    name: str
    dtype: torch.dtype

    def __repr__(self) -> str:
        return self.name


Expr = Union[Load, Constant, IndexValue, Op, Local]


def walk(expr: Expr) -> Iterator[Expr]:
    """Every sub-expression of ``expr``, parents before children."""
    yield expr
    if isinstance(expr, Op):
        for arg in expr.args:
            yield from walk(arg)


def map_expr(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``expr`` bottom-up; ``fn`` returns a replacement for a node, or None to keep it."""
    if isinstance(expr, Op):
        expr = Op(expr.name, tuple(map_expr(a, fn) for a in expr.args), expr.dtype)
    replaced = fn(expr)
    return expr if replaced is None else replaced


def substitute(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    """Rename loop variables in every index of ``expr`` (how views and fusion move bodies)."""

    def subs(e: Expr) -> Expr | None:
        if isinstance(e, Load):
            return Load(e.buffer, sympy.expand(e.index.subs(mapping, simultaneous=True)), e.dtype)
        if isinstance(e, IndexValue):
            return IndexValue(sympy.expand(e.index.subs(mapping, simultaneous=True)), e.dtype)
        return None

    return map_expr(expr, subs)


# --- buffers: what lowering produces -------------------------------------------------------------
@dataclass(frozen=True)
class InputBuffer:
    """A graph input, read with its real strides."""

    name: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ConstantBuffer:
    """A tensor stored in the graph itself (an FX ``get_attr`` node, e.g. ``torch.tensor([1.,
    2.])`` in the traced code): read like an input, but bound once when the graph is compiled;
    the wrapper keeps it in its namespace (PyTorch: ``GraphLowering.constants``)."""

    name: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    value: torch.Tensor = field(compare=False, repr=False)


@dataclass(frozen=True)
class Pointwise:
    """``name[i0, i1, ...] = body`` for every index of ``size``; stored contiguously."""

    name: str
    size: tuple[int, ...]
    dtype: torch.dtype
    body: Expr
    origins: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{self.name}{list(self.size)} = {self.body!r}"


class ReductionType(Enum):
    SUM = "sum"
    MAX = "amax"
    MIN = "amin"


@dataclass(frozen=True)
class Reduction:
    """``name[i...] = reduce over r... of body(i..., r...)``; stored contiguously in ``size``."""

    name: str
    size: tuple[int, ...]
    reduction_size: tuple[int, ...]
    reduction_type: ReductionType
    dtype: torch.dtype
    body: Expr
    origins: tuple[str, ...] = ()

    def __repr__(self) -> str:
        red = f"{self.reduction_type.value}[r<{list(self.reduction_size)}]"
        return f"{self.name}{list(self.size)} = {red}({self.body!r})"


@dataclass(frozen=True)
class TensorArg:
    """A strided view of a buffer, passed to extern kernels or returned (PyTorch: ReinterpretView)."""

    buffer: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0


@dataclass(frozen=True)
class MultiOutput:
    """Tensor ``index`` of an extern call that returns several (PyTorch: ``ir.MultiOutput``)."""

    name: str
    index: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ExternKernel:
    """A call into eager PyTorch (matmuls, and visible fallbacks for unsupported ops).

    ``args`` mirror the FX node's args with tensors replaced by ``TensorArg``; the result keeps
    the strides that eager PyTorch gives it (``stride``). An op returning a tuple (``aten.sort``)
    lists its tensors in ``outputs``, each a buffer of its own; then ``name`` holds the tuple
    and ``size``/``stride`` are empty.
    """

    name: str
    kernel: str  # e.g. "aten.mm.default"
    args: tuple
    kwargs: tuple[tuple[str, object], ...]
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    fallback: bool  # True when the op runs eagerly only because toycomp cannot lower it
    origins: tuple[str, ...] = ()
    outputs: tuple[MultiOutput, ...] = ()

    def buffers(self) -> tuple[str, ...]:
        """The buffers this call defines: ``name``, or the tensors of a tuple result."""
        return tuple(o.name for o in self.outputs) or (self.name,)


Buffer = Union[InputBuffer, ConstantBuffer, Pointwise, Reduction, ExternKernel]


def extern_callable(kernel: str) -> Callable[..., object]:
    """The eager function an ``ExternKernel`` calls: ``"aten.mm.default"`` is
    ``torch.ops.aten.mm.default``; ``"toycomp.prims.sin"`` (a visible fallback for a prim that
    cannot be lowered) is the eager reference of toycomp's prim (NOT ``torch.ops.prims.sin``,
    PyTorch's own, different prims)."""
    if kernel.startswith("toycomp.prims."):
        import toycomp.prims as prims  # local import: ir.py stays importable on its own

        return prims.PRIM_INFO[prims.PRIMS[kernel.removeprefix("toycomp.prims.")]].ref
    fn: object = torch.ops
    for part in kernel.split("."):
        fn = getattr(fn, part)
    return fn  # type: ignore[return-value]


@dataclass(frozen=True)
class LoweredGraph:
    """Lowering's result: the buffers to compute, in order, and what the graph returns."""

    inputs: tuple[InputBuffer, ...]
    nodes: tuple[Union[Pointwise, Reduction, ExternKernel], ...]
    outputs: tuple[TensorArg | None, ...]
    device: torch.device
    constants: tuple[ConstantBuffer, ...] = ()
    # Per output: the strides eager gives it where they differ from ``outputs``' (else None);
    # the wrapper copies such an output into them (saved tensors must match the backward's).
    output_strides: tuple[tuple[int, ...] | None, ...] = ()


# --- kernels: what the scheduler produces ---------------------------------------------------------
@dataclass(frozen=True)
class Store:
    """``buffer[index] = value`` (index over the kernel variables ``x`` and ``r``)."""

    buffer: str
    index: sympy.Expr
    value: Expr


@dataclass(frozen=True)
class Reduce:
    """``name = reduce over r of value``: a per-``x`` local, readable later as ``Local(name)``."""

    name: str
    reduction_type: ReductionType
    value: Expr
    dtype: torch.dtype


@dataclass(frozen=True)
class Loop:
    """One pass of a kernel: ``over_r=False`` runs once per ``x``; ``over_r=True`` runs for each
    ``r`` in ``range(rnumel)`` (stores) or reduces over it (``Reduce``)."""

    over_r: bool
    body: tuple[Union[Store, Reduce], ...]


@dataclass(frozen=True)
class Kernel:
    """A fused kernel: for each ``x`` in ``range(numel)`` run ``loops`` in order.

    A pointwise kernel has ``rnumel == 1`` and one ``Loop(over_r=False)``; a softmax kernel has
    ``numel`` rows and ``rnumel`` columns: a max loop, a sum loop, a store loop.
    """

    name: str
    numel: int
    rnumel: int
    loops: tuple[Loop, ...]
    buffer_dtypes: tuple[tuple[str, torch.dtype], ...]  # every buffer read or written
    origins: tuple[str, ...]  # the FX nodes fused here, for the generated comment

    def reads(self) -> tuple[str, ...]:
        """Buffers loaded by this kernel (in first-use order)."""
        names = [
            e.buffer
            for loop in self.loops
            for stmt in loop.body
            for e in walk(stmt.value)
            if isinstance(e, Load)
        ]
        return tuple(dict.fromkeys(names))

    def writes(self) -> tuple[str, ...]:
        """Buffers stored by this kernel."""
        return tuple(
            dict.fromkeys(s.buffer for loop in self.loops for s in loop.body if isinstance(s, Store))
        )


@dataclass(frozen=True)
class AllocatedBuffer:
    """A buffer the wrapper allocates (contiguous) before the kernels that write it run."""

    name: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ScheduledGraph:
    """The scheduler's result: what the wrapper allocates, calls, and returns."""

    inputs: tuple[InputBuffer, ...]
    allocations: tuple[AllocatedBuffer, ...]
    steps: tuple[Union[Kernel, ExternKernel], ...]
    outputs: tuple[TensorArg | None, ...]
    device: torch.device
    constants: tuple[ConstantBuffer, ...] = ()
    output_strides: tuple[tuple[int, ...] | None, ...] = ()
