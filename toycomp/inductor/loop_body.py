"""Stage 4a, the loop IR's first layer: value expressions, the body of a loop.

A loop body is a tree of small frozen dataclasses: ``Load`` (read a buffer at an index),
``Constant``, ``IndexValue`` (an index as a value: how ``iota`` lowers), ``Op`` (a pointwise
prim, by name: ``"sin"``, ``"add"``, ``"where"``...) and ``Local`` (a reduction's result, later
in the same kernel). Repeated parts are shared objects, so the tree is a DAG (see [Note:
expressions are DAGs]), and every pass here visits each distinct node once: ``walk``,
``post_order``, ``map_expr``, ``substitute`` (rename the loop variables in every index: how views
and fusion move bodies) and ``format_expr`` (the text that ``Op`` prints).

Input -> output: these are the bodies that lowering builds inside ``ir.Pointwise`` and
``ir.Reduction`` and that the scheduler moves (``substitute``) into ``ir.Store`` / ``ir.Reduce``;
ir.py holds those two layers (buffers, kernels) and re-exports every name of this module, so
``ir.Load`` and ``from toycomp.inductor.ir import Op`` work as before::

    >>> from toycomp.inductor.indexing import index_vars, x
    >>> (i0,), f32 = index_vars("i", 1), torch.float32
    >>> sin = Op("sin", (Load("a", i0, f32),), f32)
    >>> body = Op("mul", (sin, sin), f32)
    >>> len(list(walk(body)))  # mul, sin, load: the shared sin is visited once
    3
    >>> substitute(body, {i0: x})
    mul(sin(load(a, x)), sin(load(a, x)))

NB: in PyTorch this lives in torch/_inductor/loop_body.py (``LoopBody``: a buffer's ``inner_fn``
recorded as an FX graph of ``ops.*`` calls) and torch/_inductor/ops_handler.py (the ops an
``inner_fn`` may call); Inductor's ``inner_fn`` closures play the role of our printable trees.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterator, Union

import sympy
import torch

Number = Union[int, float, bool]


# --- value expressions: the body of a loop ---------------------------------------------------
@dataclass(frozen=True)
class Load:
    """Read ``buffer`` at memory position ``index`` (an element offset, strides already applied).

    ``indirect``: the values of the symbols ``ind0, ind1...`` that ``index`` may use, each an
    expression (an index read from another tensor: see [Note: indirect indexing])."""

    buffer: str
    index: sympy.Expr
    dtype: torch.dtype
    indirect: tuple["Expr", ...] = ()

    def __repr__(self) -> str:
        return f"load({self.buffer}, {format_index(self.index, self.indirect)})"


# [Note: indirect indexing]
# An embedding reads row ``indices[n]`` of its weight: the index of that load is a VALUE, read
# from another tensor, not an affine function of the loop variables. Inductor spells it
# ``ops.indirect_indexing(value, size)``, which turns a loaded value into a new sympy symbol
# that the index may then use. Here a Load (or a Store) carries those values itself, in
# ``indirect``: its index may use ``ind0`` for ``indirect[0]``, ``ind1`` for ``indirect[1]``...,
# so ``embedding(w, idx)`` with a 768-wide ``w`` is ``load(w, i1 + 768*ind0; ind0 =
# load(idx, i0))``. The symbols are bound per Load: two loads may both use ``ind0`` for
# different values, and the passes treat ``indirect`` as the Load's children (``walk``,
# ``map_expr``, ``substitute`` move them with the rest of the body). Code generation computes
# each value first (a ``tmp``) and prints the index with ``ind0`` replaced by it. An ``indN``
# is no loop variable: whatever reasons about indices (fusion, strided views, vectorising,
# masks) sees an unknown symbol, so such a load never fuses with its producer and is never a
# strided view. Bounds: the values are checked before the kernel runs, by the extern
# ``toycomp::check_indices`` that raises eager's IndexError (a device-side assert on CUDA), and
# negative indices are wrapped by the decomposition where the op allows them (``aten.index``),
# so a kernel never reads or writes out of bounds.
def indirect_symbol(k: int) -> sympy.Symbol:
    """``ind<k>``: the symbol an index uses for the value ``indirect[k]`` of its Load/Store."""
    return sympy.Symbol(f"ind{k}", integer=True, nonnegative=True)


def is_indirect_symbol(symbol: sympy.Basic) -> bool:
    name = getattr(symbol, "name", "")
    return name[:3] == "ind" and name[3:].isdigit()


def format_index(index: sympy.Expr, indirect: tuple["Expr", ...]) -> str:
    """``i1 + 768*ind0; ind0 = load(idx, i0)``, or the index alone when nothing is indirect."""
    binds = [f"{indirect_symbol(k)} = {format_expr(v)}" for k, v in enumerate(indirect)]
    return "; ".join([str(index), *binds])


def children(expr: "Expr") -> tuple["Expr", ...]:
    """The sub-expressions of ``expr``: an Op's arguments, an indirect Load's index values."""
    if isinstance(expr, Op):
        return expr.args
    return expr.indirect if isinstance(expr, Load) else ()


@dataclass(frozen=True)
class Constant:
    """A Python number in a loop body, of ``dtype`` (made with ``convert_number``)."""

    value: Number
    dtype: torch.dtype

    def __repr__(self) -> str:
        return repr(self.value)


def convert_number(value: Number, dtype: torch.dtype) -> Number:
    """A Python number as a tensor of ``dtype`` holds it (ints truncate toward zero)."""
    if dtype == torch.bool:
        return bool(value)
    return float(value) if dtype.is_floating_point else int(value)


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
        return format_expr(self)


@dataclass(frozen=True)
class Local:
    """The per-row result of a ``Reduce`` that ran earlier in the same kernel."""

    name: str
    dtype: torch.dtype

    def __repr__(self) -> str:
        return self.name


Expr = Union[Load, Constant, IndexValue, Op, Local]


# [Note: expressions are DAGs]
# An expression is a tree only on paper. Lowering inlines a value into each of its users and
# fusion pastes a producer's expression into each of its consumers, both as the SAME object:
# in `for i in range(n): y = y * y.sigmoid() + y.sin()` each y is used three times by the next,
# so the fused kernel's expression has 3**n paths but only ~6n distinct nodes. Every pass over
# expressions therefore visits each distinct node (object) once: `walk` and `post_order` skip
# nodes already seen, `map_expr` rebuilds each node once (so sharing survives a rewrite), and
# code generation and the interpreter evaluate each node once per loop. All are iterative: a
# chain of a few hundred ops is deeper than Python's recursion limit. Printing names the
# shared nodes of a big expression (`format_expr`). Compile time stays linear in the graph.
# (Identity, not equality: nodes are compared by `is`, which is free; two equal but separately
# built expressions are simply visited twice, and the kernel's CSE still computes them once.)
def walk(*exprs: Expr) -> Iterator[Expr]:
    """Every distinct sub-expression of ``exprs``, once, parents before children (pre-order)."""
    return (expr for expr, args_done in _depth_first(exprs) if not args_done)


def post_order(*exprs: Expr) -> list[Expr]:
    """Every distinct sub-expression of ``exprs``, once, each after its arguments."""
    return [expr for expr, args_done in _depth_first(exprs) if args_done]


def _depth_first(exprs: tuple[Expr, ...]) -> Iterator[tuple[Expr, bool]]:
    """Each distinct node as ``(node, False)`` before its arguments, ``(node, True)`` after."""
    seen: set[int] = set()
    stack = [(e, False) for e in reversed(exprs)]
    while stack:
        expr, args_done = stack.pop()
        if args_done:
            yield expr, True
        elif id(expr) not in seen:
            seen.add(id(expr))
            yield expr, False
            stack.append((expr, True))
            stack.extend((a, False) for a in reversed(children(expr)))


def map_expr(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``expr`` bottom-up, each distinct node once; ``fn`` replaces a node, or None."""
    new: dict[int, Expr] = {}  # id(original node) -> its rebuilt version
    for node in post_order(expr):
        rebuilt = node
        args = tuple(new[id(a)] for a in children(node))
        if any(a is not b for a, b in zip(args, children(node))):  # an argument was rebuilt
            field = "args" if isinstance(node, Op) else "indirect"  # (a Load's index values)
            rebuilt = replace(node, **{field: args})
        new[id(node)] = fn(rebuilt) or rebuilt
    return new[id(expr)]


def substitute(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    """Rename loop variables in every index of ``expr`` (how views and fusion move bodies)."""
    moved: dict[sympy.Expr, sympy.Expr] = {}  # each distinct index is substituted once

    def move(index: sympy.Expr) -> sympy.Expr:
        if index not in moved:
            moved[index] = sympy.expand(index.xreplace(mapping))
        return moved[index]

    def subs(e: Expr) -> Expr | None:
        if isinstance(e, Load):
            return Load(e.buffer, move(e.index), e.dtype, e.indirect)
        if isinstance(e, IndexValue):
            return IndexValue(move(e.index), e.dtype)
        return None

    return map_expr(expr, subs)


# Expressions with more nodes than this, counted as a tree, print with their shared nodes named.
TREE_PRINT_LIMIT = 200


def format_expr(expr: Expr) -> str:
    """``expr`` as text: a tree, ``mul(sin(load(a, x)), sin(load(a, x)))``, unless the tree has
    more than ``TREE_PRINT_LIMIT`` nodes; then each Op used more than once is printed once, by
    name: ``let t0 = sin(load(a, x)), ... in mul(t0, t0)`` (see [Note: expressions are DAGs])."""
    order = post_order(expr)
    size: dict[int, int] = {}
    uses: dict[int, int] = {}
    for e in order:
        args = children(e)
        size[id(e)] = min(1 + sum(size[id(a)] for a in args), TREE_PRINT_LIMIT + 1)
        for a in args:
            uses[id(a)] = uses.get(id(a), 0) + 1
    big = size[id(expr)] > TREE_PRINT_LIMIT
    text: dict[int, str] = {}
    bindings: list[str] = []
    for e in order:
        if not isinstance(e, Op):
            text[id(e)] = repr(e)
            continue
        text[id(e)] = f"{e.name}({', '.join(text[id(a)] for a in e.args)})"
        if big and uses.get(id(e), 0) > 1:
            bindings.append(f"t{len(bindings)} = {text[id(e)]}")
            text[id(e)] = f"t{len(bindings) - 1}"
    if not bindings:
        return text[id(expr)]
    return f"let {', '.join(bindings)} in {text[id(expr)]}"
