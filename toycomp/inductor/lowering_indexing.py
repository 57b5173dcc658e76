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


@register_lowering(prims.gather)
def _gather(g: GraphLowering, out, a: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    i_dim = indexing.index_vars("i", len(a.size))[dim]
    value = _index_body(index)

    def read_at_index(e: ir.Expr) -> ir.Expr | None:
        if isinstance(e, ir.IndexValue) and i_dim in sympy.sympify(e.index).free_symbols:
            raise NotImplementedError("gather of an index value")  # (the prim runs eagerly)
        if not isinstance(e, ir.Load) or i_dim not in sympy.sympify(e.index).free_symbols:
            return None
        ind = ir.indirect_symbol(len(e.indirect))  # bound by this load: the next free one
        moved = sympy.expand(sympy.sympify(e.index).subs(i_dim, ind))
        return ir.Load(e.buffer, moved, e.dtype, (*e.indirect, value))

    return TensorValue(tuple(out.shape), a.dtype, ir.map_expr(a.body, read_at_index))


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
