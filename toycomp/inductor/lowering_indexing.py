"""Stage 4b, the rules for the two indexing prims: ``gather`` and ``scatter`` -> indirect indices.

Input -> output: like lowering_rules.py, each rule takes the prim's arguments as ``TensorValue``s
and returns the result's. ``gather(a, dim, index)`` is ``a``'s own body with ``i<dim>``
replaced, in every load, by ``ind<k>``, bound to ``index``'s body (see [Note: indirect indexing]
in loop_body.py): nothing is copied, and a gather of a computed value computes only the
elements read. ``scatter`` makes an ``ir.Scatter`` node (see [Note: a scatter is a buffer written
twice] in scheduler.py). The embedding of a (50257, 768) table by ``idx`` of (1024,)::

    buf0[1024, 768] = load(w, i1 + 768*ind0; ind0 = load(idx, i0))

NB: in PyTorch this lives in torch/_inductor/lowering.py (``gather``, ``index``, ``index_put``,
``scatter_add``: each calls ``ops.indirect_indexing`` in its ``inner_fn``) and
torch/_inductor/ir.py (``Scatter``, a ``Pointwise`` with an output indexer and a reduce mode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy
import torch

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.lowering_table import register_lowering
from toycomp.inductor.tensor_value import TensorValue, strided_load

if TYPE_CHECKING:
    from toycomp.inductor.lowering import GraphLowering


def _index_body(index: TensorValue) -> ir.Expr:
    """The index values as int64 (what an address is computed in)."""
    if index.dtype == torch.int64:
        return index.body
    return ir.Op("convert_element_type", (index.body,), torch.int64)


# [Note: index arithmetic is not indirect]
# flip, roll, pad, a cat of unequal sizes and slice_backward read their input at an index that
# the loop variables give, ``n - 1 - i`` or ``clamp(i - 4, 0, n - 1)``: decompositions write
# these as a gather at an index computed from an ``iota`` (prims have no other way to say it),
# but when the index values are such arithmetic (add, sub, mul, neg, maximum, minimum of index
# values and integers) the gather substitutes the expression itself into the index: a plain
# load at an affine index (with Min/Max), which fusion, views and code generation read as any
# other. Only an index read from memory is indirect.
_INDEX_OPS = {"add": sympy.Add, "sub": lambda a, b: a - b, "mul": sympy.Mul, "neg": lambda a: -a,
              "maximum": sympy.Max, "minimum": sympy.Min}  # fmt: skip


def _as_index(expr: ir.Expr) -> sympy.Expr | None:
    """``expr`` as a sympy index, when it is arithmetic on index values and integers."""
    if isinstance(expr, ir.IndexValue) and not expr.dtype.is_floating_point:
        return sympy.sympify(expr.index)
    if isinstance(expr, ir.Constant) and isinstance(expr.value, int) and expr.value is not True:
        return sympy.Integer(expr.value)
    if isinstance(expr, ir.Op) and expr.name == "convert_element_type":
        return _as_index(expr.args[0]) if not expr.dtype.is_floating_point else None
    if not isinstance(expr, ir.Op) or expr.name not in _INDEX_OPS:
        return None
    args = [_as_index(a) for a in expr.args]
    return None if any(a is None for a in args) else _INDEX_OPS[expr.name](*args)


@register_lowering(prims.gather)
def _gather(g: GraphLowering, out, a: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    i_dim = indexing.index_vars("i", len(a.size))[dim]
    value, known = _index_body(index), _as_index(index.body)

    def read_at_index(e: ir.Expr) -> ir.Expr | None:
        if not isinstance(e, (ir.Load, ir.IndexValue)):
            return None
        if i_dim not in sympy.sympify(e.index).free_symbols:
            return None
        if known is not None:  # [Note: index arithmetic is not indirect]
            return _replace(e, indexing.simplify_index(e.index.subs(i_dim, known), {}))
        if isinstance(e, ir.IndexValue):
            raise NotImplementedError("gather of an index value")  # (the prim runs eagerly)
        ind = ir.indirect_symbol(len(e.indirect))  # bound by this load: the next free one
        moved = sympy.expand(sympy.sympify(e.index).subs(i_dim, ind))
        return ir.Load(e.buffer, moved, e.dtype, (*e.indirect, value))

    return TensorValue(tuple(out.shape), a.dtype, ir.map_expr(a.body, read_at_index))


def _replace(e: ir.Load | ir.IndexValue, index: sympy.Expr) -> ir.Expr:
    if isinstance(e, ir.IndexValue):
        return ir.IndexValue(index, e.dtype)
    return ir.Load(e.buffer, index, e.dtype, e.indirect)


@register_lowering(prims.scatter)
def _scatter(g: GraphLowering, out, a: TensorValue, dim: int, index: TensorValue,
             src: TensorValue, accumulate: bool) -> TensorValue:  # fmt: skip
    size, name = tuple(out.shape), g.new_name()
    ivars = list(indexing.index_vars("i", len(size)))
    ivars[dim] = ir.indirect_symbol(0)
    strides = indexing.contiguous_strides(size)
    position = indexing.linear_index(ivars, strides)
    node = ir.Scatter(name, size, a.dtype, a.body, tuple(index.size), dim, position,
                      (_index_body(index),), src.body, accumulate, (g.current_origin,))  # fmt: skip
    g.nodes.append(node)
    return strided_load(name, size, strides, a.dtype)
