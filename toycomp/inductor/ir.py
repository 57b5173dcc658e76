"""Stage 4a: the loop-level IR, from lowered buffers down to fused kernels.

Three layers, all small frozen dataclasses that print compactly:

1. **Value expressions** (``Load``, ``Constant``, ``IndexValue``, ``Op``, ``Local``): the body of a
   loop, as a tree whose repeated parts are shared objects (a DAG: see [Note: expressions are
   DAGs] in loop_body.py). ``Op`` names a pointwise prim (``"sin"``, ``"add"``, ``"where"``...).
   Indices are sympy expressions over loop variables, so a view is just a substitution of
   variables (``permute`` swaps them, ``broadcast_in_dim`` drops them, ``slice`` scales them): no
   copies. They and the passes over them (``walk``, ``substitute``...) live in ``loop_body.py``;
   this module re-exports every name (``ir.Load``, ``ir.walk``).
2. **Buffers** (``InputBuffer``, ``Pointwise``, ``Reduction``, ``ExternKernel``), produced by
   ``lowering.py``: one node per tensor that must exist in memory, with a body over its own index
   variables ``i0, i1, ...`` (and ``r0, r1, ...`` for the reduced dims of a ``Reduction``).
3. **Kernels** (``Kernel`` of ``Loop`` of ``Store`` / ``Reduce``), produced by ``scheduler.py``:
   a fused group of buffers rewritten over two flat variables, ``x`` in ``range(numel)`` (one
   output row or element) and ``r`` in ``range(rnumel)`` (the reduced elements of that row).

Example: ``sin(a)**2`` on 1000 floats lowers to one ``Pointwise`` and schedules to one
``Kernel`` with a single ``Loop(over_r=False)`` holding one ``Store``::

    >>> from toycomp.inductor.indexing import index_vars, x
    >>> (i0,), f32 = index_vars("i", 1), torch.float32
    >>> sin = Op("sin", (Load("a", i0, f32),), f32)
    >>> Pointwise("buf0", (1000,), f32, Op("mul", (sin, sin), f32))
    buf0[1000] = mul(sin(load(a, i0)), sin(load(a, i0)))
    >>> value = substitute(Op("mul", (sin, sin), f32), {i0: x})  # i0 follows the kernel's x
    >>> loops = (Loop(over_r=False, body=(Store("buf0", x, value),)),)
    >>> Kernel("kernel_0", 1000, 1, loops, (("a", f32), ("buf0", f32)), origins=("sin", "mul"))
    kernel_0(numel=1000, rnumel=1):  # ('sin', 'mul')
      once:
        buf0[x] = mul(sin(load(a, x)), sin(load(a, x)))

NB: in PyTorch this lives in torch/_inductor/ir.py (Pointwise, Reduction, ExternKernel, Layout,
ReinterpretView) and torch/_inductor/scheduler.py (SchedulerNode, FusedSchedulerNode); Inductor's
``inner_fn`` closures play the role of our printable expression trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Union

import sympy
import torch

from toycomp.inductor import indexing
from toycomp.inductor.loop_body import (  # noqa: F401  (layer 1, re-exported: ir.Load, ir.walk)
    TREE_PRINT_LIMIT,
    Constant,
    children,
    format_index,
    indirect_symbol,
    is_indirect_symbol,
    Expr,
    IndexValue,
    Load,
    Local,
    Number,
    Op,
    convert_number,
    format_expr,
    map_expr,
    post_order,
    substitute,
    walk,
)


# --- buffers: what lowering produces -------------------------------------------------------------
@dataclass(frozen=True)
class InputBuffer:
    """A graph input, read with its real strides."""

    name: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device | None = None  # where it lives when not on the graph's device
    any_device: bool = False  # a 0-d value only externs read: see [Note: extern seeds]


@dataclass(frozen=True)
class SizeInput:
    """A graph input that is a size, not a tensor: a Python int at run time (Dynamo passes the
    batch size ``s0`` to backends; AOT saves sizes for the backward). ``expr`` is its value in
    the size symbols, usually one symbol (``s0``). PyTorch: a ``sympy.Expr`` in
    ``GraphLowering.graph_inputs``."""

    name: str
    expr: object  # int | sympy.Expr

    def __repr__(self) -> str:
        return f"input {self.name} = {self.expr}"


@dataclass(frozen=True)
class SizeScalar:
    """A float computed from the sizes (``f0 = 2.0 / (s0*s1 - 1)``) by the wrapper at each call
    and passed to the kernels that read it; ``expr`` is a ShapeEnv expression (PyTorch's
    ``FloatTrueDiv``, ``ToFloat``...) over the size symbols."""

    symbol: sympy.Symbol
    expr: sympy.Expr

    def __repr__(self) -> str:
        return f"{self.symbol} = {self.expr}"


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
    """``name[i...] = reduce over r... of body(i..., r...)``; stored contiguously in ``size``.
    ``mix_order_rows``: nonzero for the partial sums of a column reduction over chunks of that
    many rows, which the scheduler may fuse into the row reduction's kernel over the same rows
    (see [Note: mix-order reductions] in split_reduction.py)."""

    name: str
    size: tuple[int, ...]
    reduction_size: tuple[int, ...]
    reduction_type: ReductionType
    dtype: torch.dtype
    body: Expr
    origins: tuple[str, ...] = ()
    mix_order_rows: int = 0

    def __repr__(self) -> str:
        red = f"{self.reduction_type.value}[r<{list(self.reduction_size)}]"
        return f"{self.name}{list(self.size)} = {red}({self.body!r})"


@dataclass(frozen=True)
class Scatter:
    """``name = init``, then ``name[index] = value`` (``+=`` if ``accumulate``) for every index of
    ``src_size``: a scatter, whose ``index`` (over ``i0, i1...`` of ``src_size``) reads
    ``ind0 = indirect[0]`` (see [Note: indirect indexing] in loop_body.py and [Note: a scatter
    is a buffer written twice] in scheduler.py). Dim ``dim`` of ``src_size`` is the one whose
    elements may hit the same target: it runs in order, the others in parallel."""

    name: str
    size: tuple[int, ...]
    dtype: torch.dtype
    init: Expr
    src_size: tuple[int, ...]
    dim: int
    index: sympy.Expr
    indirect: tuple[Expr, ...]
    value: Expr
    accumulate: bool
    origins: tuple[str, ...] = ()

    def __repr__(self) -> str:
        op = "+=" if self.accumulate else "="
        where = format_index(self.index, self.indirect)
        return (f"{self.name}{list(self.size)} = {self.init!r}\n"
                f"{self.name}[{where}] {op} {self.value!r} for i<{list(self.src_size)}")  # fmt: skip

    def bodies(self) -> tuple[Expr, ...]:
        return (self.init, *self.indirect, self.value)


@dataclass(frozen=True)
class TensorArg:
    """A strided view of a buffer, passed to extern kernels or returned (PyTorch:
    ``ReinterpretView``)."""

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

    def __repr__(self) -> str:
        kind = "fallback" if self.fallback else "extern"
        lines = [f"{self.name} = {kind} {self.kernel}{self.args}"]
        lines += [f"{o.name} = {self.name}[{o.index}]" for o in self.outputs]
        return "\n".join(lines)


Buffer = Union[InputBuffer, ConstantBuffer, Pointwise, Reduction, Scatter, ExternKernel]


@dataclass(frozen=True)
class LoweredGraph:
    """Lowering's result: the buffers to compute, in order, and what the graph returns."""

    inputs: tuple[InputBuffer | SizeInput, ...]
    nodes: tuple[Union[Pointwise, Reduction, Scatter, ExternKernel], ...]
    outputs: tuple[TensorArg | None | int | sympy.Expr, ...]  # sizes too (saved for backward)
    device: torch.device
    constants: tuple[ConstantBuffer, ...] = ()
    # Per output: the strides eager gives it where they differ from ``outputs``' (else None);
    # the wrapper copies such an output into them (saved tensors must match the backward's).
    output_strides: tuple[tuple[int, ...] | None, ...] = ()
    scalars: tuple[SizeScalar, ...] = ()  # floats computed from the sizes (dynamic shapes)

    def __repr__(self) -> str:
        lines = [
            repr(b) if isinstance(b, SizeInput) else f"input {b.name}{list(b.size)} {b.dtype}"
            for b in self.inputs
        ]
        lines += [f"constant {c.name}{list(c.size)} {c.dtype}" for c in self.constants]
        lines += [f"scalar {s!r}" for s in self.scalars]
        lines += [repr(node) for node in self.nodes]
        return "\n".join(lines + [_return_line(self.outputs)])


# --- kernels: what the scheduler produces ---------------------------------------------------------
# Their reprs are the pseudo-code that ``scheduler.format_scheduled`` prints (see its docstring).
@dataclass(frozen=True)
class Store:
    """``buffer[index] = value`` (index over the kernel variables ``x`` and ``r``); a scatter's
    index reads ``indirect`` values and ``accumulate`` adds to what is there (``+=``)."""

    buffer: str
    index: sympy.Expr
    value: Expr
    indirect: tuple[Expr, ...] = ()
    accumulate: bool = False

    def __repr__(self) -> str:
        op = "+=" if self.accumulate else "="
        return f"{self.buffer}[{format_index(self.index, self.indirect)}] {op} {self.value!r}"


@dataclass(frozen=True)
class Reduce:
    """``name = reduce over r of value``: a per-``x`` local, readable later as ``Local(name)``."""

    name: str
    reduction_type: ReductionType
    value: Expr
    dtype: torch.dtype

    def __repr__(self) -> str:
        return f"{self.name} = {self.reduction_type.value}({self.value!r})"


@dataclass(frozen=True)
class ColumnReduce:
    """``buffer[index] = reduce over this program's rows x of value``: a column's partial sum,
    in a kernel whose programs take ``Kernel.rows_per_program`` rows each (``index`` is over
    ``r`` and the program's first row ``x``; see [Note: mix-order reductions])."""

    buffer: str
    index: sympy.Expr
    reduction_type: ReductionType
    value: Expr
    dtype: torch.dtype

    def __repr__(self) -> str:
        kind = self.reduction_type.value
        return f"{self.buffer}[{self.index}] = {kind}_over_rows({self.value!r})"


@dataclass(frozen=True)
class Loop:
    """One pass of a kernel: ``over_r=False`` runs once per ``x``; ``over_r=True`` runs for each
    ``r`` in ``range(rnumel)`` (stores) or reduces over it (``Reduce``)."""

    over_r: bool
    body: tuple[Union[Store, Reduce, ColumnReduce], ...]

    def __repr__(self) -> str:
        header = "for r:" if self.over_r else "once:"
        return "\n  ".join([header, *map(repr, self.body)])


@dataclass(frozen=True)
class Kernel:
    """A fused kernel: for each ``x`` in ``range(numel)`` run ``loops`` in order.

    A pointwise kernel has ``rnumel == 1`` and one ``Loop(over_r=False)``; a softmax kernel has
    ``numel`` rows and ``rnumel`` columns: a max loop, a sum loop, a store loop. A kernel with
    ``ColumnReduce``s runs ``rows_per_program`` rows in each program (else 0).
    """

    name: str
    numel: int | sympy.Expr  # with dynamic shapes, an expression in the sizes: 4*s0
    rnumel: int | sympy.Expr
    loops: tuple[Loop, ...]
    buffer_dtypes: tuple[tuple[str, torch.dtype], ...]  # every buffer read or written
    origins: tuple[str, ...]  # the FX nodes fused here, for the generated comment
    rows_per_program: int = 0

    def size_symbols(self) -> tuple[sympy.Symbol, ...]:
        """The size symbols (``s0, s1...``) of its numel, rnumel and indices: its arguments."""
        indices = [e.index for e in walk(*self.values()) if isinstance(e, (Load, IndexValue))]
        indices += [s.index for s in self.stores()]
        return tuple(indexing.size_symbols(self.numel, self.rnumel, *indices))

    def stores(self) -> list[Store | ColumnReduce]:
        """The statements that write a buffer, in order."""
        return [s for loop in self.loops for s in loop.body if not isinstance(s, Reduce)]

    def values(self) -> list[Expr]:
        """Every expression the statements compute (a scatter's index values too)."""
        stmts = [stmt for loop in self.loops for stmt in loop.body]
        return [v for s in stmts for v in (*getattr(s, "indirect", ()), s.value)]

    def scatters(self) -> list[Store]:
        """The stores at indirect indices or that accumulate (a scatter's)."""
        return [s for s in self.stores() if getattr(s, "indirect", ()) or getattr(s, "accumulate", False)]

    def indirect(self) -> bool:
        """Whether some index of this kernel reads a value (see [Note: indirect indexing])."""
        loads = walk(*self.values())
        return bool(self.scatters()) or any(isinstance(e, Load) and e.indirect for e in loads)

    def reads(self) -> tuple[str, ...]:
        """Buffers loaded by this kernel (in first-use order)."""
        return tuple(dict.fromkeys(e.buffer for e in walk(*self.values()) if isinstance(e, Load)))

    def writes(self) -> tuple[str, ...]:
        """Buffers stored by this kernel."""
        return tuple(dict.fromkeys(s.buffer for s in self.stores()))

    def __repr__(self) -> str:
        rows = f", rows_per_program={self.rows_per_program}" if self.rows_per_program else ""
        header = f"{self.name}(numel={self.numel}, rnumel={self.rnumel}{rows}):  # {self.origins}"
        return "\n  ".join([header, *(repr(loop).replace("\n", "\n  ") for loop in self.loops)])


@dataclass(frozen=True)
class AllocatedBuffer:
    """A buffer the wrapper allocates (contiguous) before the kernels that write it run."""

    name: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def __repr__(self) -> str:
        return f"allocate {self.name}{list(self.size)} {self.dtype}"


@dataclass(frozen=True)
class ScheduledGraph:
    """The scheduler's result: what the wrapper allocates, calls, and returns.

    It prints as pseudo-code, one line per allocation and extern call, a block per kernel.
    """

    inputs: tuple[InputBuffer | SizeInput, ...]
    allocations: tuple[AllocatedBuffer, ...]
    steps: tuple[Union[Kernel, ExternKernel], ...]
    outputs: tuple[TensorArg | None | int | sympy.Expr, ...]
    device: torch.device
    constants: tuple[ConstantBuffer, ...] = ()
    output_strides: tuple[tuple[int, ...] | None, ...] = ()
    scalars: tuple[SizeScalar, ...] = ()

    def __repr__(self) -> str:
        lines = [f"scalar {s!r}" for s in self.scalars]
        lines += [repr(a) for a in self.allocations] + [repr(s) for s in self.steps]
        return "\n".join(lines + [_return_line(self.outputs)])


def _return_line(outputs: tuple[TensorArg | None, ...]) -> str:
    return f"return {', '.join(repr(o) for o in outputs)}"
