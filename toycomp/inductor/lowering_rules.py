"""Stage 4b, the table: one lowering rule per prim, prims -> loop IR values.

Input -> output: each rule takes the ``GraphLowering`` ``g``, the node's meta tensor ``out``
(size, dtype) and the prim's arguments, with ``TensorValue`` where the FX node had tensors, and
returns the ``TensorValue`` of the result: a loop body over ``i0, i1, ...``. Rules register
themselves in ``lowering_table.LOWERINGS`` (``lowering.py`` imports this module for that)::

    >>> from toycomp.inductor.tensor_value import strided_load
    >>> x = strided_load("x", (8,), (1,), torch.float32)
    >>> x
    TensorValue([8], torch.float32, load(x, i0))
    >>> from toycomp.inductor.lowering import GraphLowering
    >>> g = GraphLowering(torch.fx.symbolic_trace(lambda x: x), [torch.empty(8)])
    >>> LOWERINGS[prims.sin](g, torch.empty(8, device="meta"), x)  # (g, out, *args)
    TensorValue([8], torch.float32, sin(load(x, i0)))

Pointwise prims wrap their operands' bodies in one ``Op``; reductions become ``Reduction``
buffers (``g.make_reduction``); views (``permute``, ``broadcast_in_dim``, ``slice``,
``reshape``) rewrite the index of every load and never copy; ``full`` becomes a ``Constant``
and ``iota`` an ``IndexValue``. A rule may raise ``NotImplementedError`` to decline a case: the
prim then runs eagerly as a visible fallback.

NB: in PyTorch this lives in torch/_inductor/lowering.py (``register_lowering``,
``make_pointwise``, ``make_reduction``, and the rules for views and creation ops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
import torch

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.lowering_table import LOWERINGS, LoweringError, Rule, register_lowering
from toycomp.inductor.tensor_value import TensorValue, reindex

if TYPE_CHECKING:
    from toycomp.inductor.lowering import GraphLowering


# --- pointwise --------------------------------------------------------------------------------
def _constant(value: prims.Number, dtype: torch.dtype) -> ir.Constant | ir.IndexValue:
    """A number in a loop body, converted to ``dtype`` as eager does (a size ``s0``: its value)."""
    if not indexing.is_static(value):
        return ir.IndexValue(value, dtype)
    return ir.Constant(ir.convert_number(value, dtype), dtype)


def _pointwise_rule(name: str) -> Rule:
    def rule(g: GraphLowering, out: torch.Tensor, *args: Any) -> TensorValue:
        tensors = [a for a in args if isinstance(a, TensorValue)]
        if any(not g.sizevars.same_sizes(t.size, tuple(out.shape)) for t in tensors):
            raise LoweringError(f"{name}: operands must have one shape (broadcast_in_dim first)")
        # Numbers take the dtype of the tensor the eager reference converts them like.
        operands = args[1:] if name == "where" else args
        like = next(a for a in operands if isinstance(a, TensorValue))
        bodies = tuple(
            a.body if isinstance(a, TensorValue) else _constant(a, like.dtype) for a in args
        )
        return TensorValue(tuple(out.shape), out.dtype, ir.Op(name, bodies, out.dtype))

    return rule


LOWERINGS[prims.neg] = _pointwise_rule("neg")
LOWERINGS[prims.abs] = _pointwise_rule("abs")
LOWERINGS[prims.exp] = _pointwise_rule("exp")
LOWERINGS[prims.log] = _pointwise_rule("log")
LOWERINGS[prims.log1p] = _pointwise_rule("log1p")
LOWERINGS[prims.sqrt] = _pointwise_rule("sqrt")
LOWERINGS[prims.rsqrt] = _pointwise_rule("rsqrt")
LOWERINGS[prims.reciprocal] = _pointwise_rule("reciprocal")
LOWERINGS[prims.sin] = _pointwise_rule("sin")
LOWERINGS[prims.cos] = _pointwise_rule("cos")
LOWERINGS[prims.tanh] = _pointwise_rule("tanh")
LOWERINGS[prims.erf] = _pointwise_rule("erf")
LOWERINGS[prims.floor] = _pointwise_rule("floor")
LOWERINGS[prims.sign] = _pointwise_rule("sign")
LOWERINGS[prims.logical_not] = _pointwise_rule("logical_not")
LOWERINGS[prims.add] = _pointwise_rule("add")
LOWERINGS[prims.sub] = _pointwise_rule("sub")
LOWERINGS[prims.mul] = _pointwise_rule("mul")
LOWERINGS[prims.div] = _pointwise_rule("div")
LOWERINGS[prims.pow] = _pointwise_rule("pow")
LOWERINGS[prims.maximum] = _pointwise_rule("maximum")
LOWERINGS[prims.minimum] = _pointwise_rule("minimum")
LOWERINGS[prims.eq] = _pointwise_rule("eq")
LOWERINGS[prims.ne] = _pointwise_rule("ne")
LOWERINGS[prims.lt] = _pointwise_rule("lt")
LOWERINGS[prims.le] = _pointwise_rule("le")
LOWERINGS[prims.gt] = _pointwise_rule("gt")
LOWERINGS[prims.ge] = _pointwise_rule("ge")
LOWERINGS[prims.logical_and] = _pointwise_rule("logical_and")
LOWERINGS[prims.where] = _pointwise_rule("where")


@register_lowering(prims.convert_element_type)
def _convert_element_type(g, out, a: TensorValue, dtype: torch.dtype) -> TensorValue:
    if a.dtype == dtype:
        return a
    return TensorValue(a.size, dtype, ir.Op("convert_element_type", (a.body,), dtype))


# --- reductions -------------------------------------------------------------------------------
def _reduction_rule(reduction_type: ir.ReductionType) -> Rule:
    def rule(g: GraphLowering, out: torch.Tensor, a: TensorValue, dims) -> TensorValue:
        dims = sorted({d % len(a.size) for d in dims}) if a.size else []
        kept = [d for d in range(len(a.size)) if d not in dims]
        size, rsize = tuple(a.size[d] for d in kept), tuple(a.size[d] for d in dims)
        if a.dtype != out.dtype:  # sum of int32/bool accumulates in int64, like eager
            a = _convert_element_type(g, out, a, out.dtype)
        if indexing.numel(rsize) == 1:  # nothing to reduce: a view that drops the reduced dims
            return reindex(a, size, _scatter_vars(len(a.size), kept, dims, ()))
        if indexing.numel(rsize) == 0 and reduction_type == ir.ReductionType.SUM:
            return TensorValue(size, out.dtype, _constant(0, out.dtype))
        rvars = indexing.index_vars("r", len(dims))
        ranges = dict(zip(indexing.index_vars("i", len(size)) + rvars, size + rsize))
        index = _scatter_vars(len(a.size), kept, dims, rvars)
        body = reindex(a, a.size, index, ranges).body
        origins = a.origins + (g.current_origin,)
        return g.make_reduction(size, rsize, reduction_type, out.dtype, body, origins)

    return rule


def _scatter_vars(ndim, kept, dims, rvars) -> tuple[sympy.Expr, ...]:
    """The input index of a reduction: kept dims read ``i`` variables, reduced dims ``r`` ones
    (or 0 where ``rvars`` is empty)."""
    index: list[sympy.Expr] = [sympy.Integer(0)] * ndim
    for d, v in zip(kept, indexing.index_vars("i", len(kept))):
        index[d] = v
    for d, v in zip(dims, rvars):
        index[d] = v
    return tuple(index)


LOWERINGS[prims.sum] = _reduction_rule(ir.ReductionType.SUM)
LOWERINGS[prims.amax] = _reduction_rule(ir.ReductionType.MAX)
LOWERINGS[prims.amin] = _reduction_rule(ir.ReductionType.MIN)


# --- views: index maps, no copies -------------------------------------------------------------
@register_lowering(prims.permute)
def _permute(g, out, a: TensorValue, dims) -> TensorValue:
    out_vars = indexing.index_vars("i", len(dims))
    index = [sympy.Integer(0)] * len(dims)
    for k, d in enumerate(dims):  # output dim k is input dim dims[k]
        index[d % len(dims)] = out_vars[k]
    return reindex(a, tuple(out.shape), tuple(index))


@register_lowering(prims.broadcast_in_dim)
def _broadcast_in_dim(g, out, a: TensorValue, shape, broadcast_dimensions) -> TensorValue:
    out_vars = indexing.index_vars("i", len(shape))
    index = tuple(
        sympy.Integer(0) if a.size[k] == 1 else out_vars[d]
        for k, d in enumerate(broadcast_dimensions)
    )
    return reindex(a, tuple(out.shape), index)


@register_lowering(prims.slice)
def _slice(g, out, a: TensorValue, dim: int, start: int, end: int, step: int = 1):
    dim = dim % len(a.size)
    index = list(indexing.index_vars("i", len(a.size)))
    index[dim] = start + step * index[dim]
    return reindex(a, tuple(out.shape), tuple(index))


@register_lowering(prims.reshape)
def _reshape(g, out, a: TensorValue, shape) -> TensorValue:
    size = tuple(out.shape)
    ivars = indexing.index_vars("i", len(size))
    flat = indexing.linear_index(ivars, indexing.contiguous_strides(size))
    return reindex(a, size, indexing.unflatten_index(flat, a.size))


# --- creation ---------------------------------------------------------------------------------
@register_lowering(prims.full)
def _full(g, out, shape, value, dtype, device) -> TensorValue:
    return TensorValue(tuple(out.shape), dtype, _constant(value, dtype))


@register_lowering(prims.iota)
def _iota(g, out, length, dtype, device) -> TensorValue:
    index = ir.IndexValue(indexing.index_vars("i", 1)[0], dtype)
    return TensorValue(tuple(out.shape), dtype, index)
