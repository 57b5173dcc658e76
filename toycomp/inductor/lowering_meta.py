"""What lowering knows of each FX node besides its rule: its meta value, dtypes and device.

``GraphLowering`` (lowering.py) asks, before running a node's rule, for the node's result on
the meta device (``_meta_value``: shape, dtype and the strides eager would give; from
``node.meta["val"]``, or by running the prim's eager reference on meta tensors) and whether
the loop IR supports its dtypes (``SUPPORTED_DTYPES``; else the node runs eagerly, a visible
fallback); after the rule, it checks that the lowered value has the meta value's sizes and
dtype. Also here: the graph's device and ``_map_nodes``, which replaces the FX nodes in nested
arguments, and ``eager_layout_arg``, which gives an ATen fallback its inputs with eager's
strides ([Note: fallbacks see eager's strides]). Every name is re-exported by lowering.py::

    >>> import torch
    >>> from toycomp.prims.decompositions import decompose
    >>> aten, a = torch.ops.aten, torch.randn(3, 4)
    >>> gm = decompose(torch.fx.symbolic_trace(lambda a: aten.exp.default(aten.t.default(a))), [a])
    >>> placeholder, permute, exp, output = gm.graph.nodes
    >>> meta = {placeholder: a.to("meta")}
    >>> for node in (permute, exp):
    ...     del node.meta["val"]  # as for a graph without meta values: run the prims on meta
    ...     meta[node] = _meta_value(node, meta)
    >>> meta[exp].shape, meta[exp].stride(), _dtypes_supported(exp, meta)  # eager's strides
    (torch.Size([4, 3]), (1, 4), True)

NB: in PyTorch this lives in torch/_inductor/graph.py (``GraphLowering.run_node`` reads each
node's FakeTensor, ``node.meta["val"]``) and torch/_inductor/lowering.py
(``fallback_node_due_to_unsupported_type``, ``unsupported_input_tensor``); a fallback's input
layouts, in torch/_inductor/ir.py (``ExternKernel.require_stride_order``, ``FlexibleLayout``).
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Callable

import sympy
import torch
from torch.fx.node import Node

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.lowering_table import LoweringError
from toycomp.inductor.sizevars import is_symbolic
from toycomp.inductor.tensor_value import reindex
from toycomp.tensor_utils import to_meta, to_meta_value


def _graph_device(gm: torch.fx.GraphModule, example_inputs: list) -> torch.device:
    """The inputs' device; for a graph without inputs, the device its creation prims name."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if not tensors:
        return _creation_device(gm)
    return min(tensors, key=lambda t: t.dim() == 0).device  # scalars may live elsewhere


def _creation_device(gm: torch.fx.GraphModule) -> torch.device:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (prims.full, prims.iota):
            return torch.device(node.kwargs.get("device", node.args[-1]))
    return torch.device("cpu")


def _meta_value(node: Node, meta: dict[Node, Any]) -> Any:
    """The node's result on meta (shape, dtype, stride): its meta["val"], or its op run on meta."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return to_meta(val)
    if is_symbolic(val) or (isinstance(val, int) and not prims.is_prim(node.target)):
        return val  # a size computation (sym_size, operator.mul on SymInts)
    return _tuple_or_run_on_meta(node, meta, val)  # an extern's tuple, or no value recorded


def _tuple_or_run_on_meta(node: Node, meta: dict[Node, Any], val: Any) -> Any:
    if node.target is operator.getitem and isinstance(meta[node.args[0]], (tuple, list)):
        return meta[node.args[0]][node.args[1]]
    if isinstance(val, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in val):
        return to_meta_value(val)
    return _run_on_meta(node, meta)


def _run_on_meta(node: Node, meta: dict[Node, Any]) -> Any:
    """Run ``node``'s op (a prim's eager reference) on meta tensors."""
    args, kwargs = _map_nodes((node.args, node.kwargs), meta.__getitem__)
    fn = prims.PRIM_INFO[node.target].ref if prims.is_prim(node.target) else node.target
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
        if "device" in bound.arguments:  # creation ops: build on meta, the real device is known
            bound.arguments["device"] = "meta"
        args, kwargs = bound.args, bound.kwargs
    except (TypeError, ValueError):  # OpOverloads have no Python signature: call as given
        kwargs = {k: ("meta" if k == "device" else v) for k, v in kwargs.items()}
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise LoweringError(f"cannot infer the result of {node.name!r} ({node.target}): {e}") from e


def _map_nodes(obj: Any, fn: Callable[[Node], Any]) -> Any:
    """Replace every FX node in nested tuples/lists/dicts by ``fn(node)``; lists become tuples."""
    if isinstance(obj, Node):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return tuple(_map_nodes(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_nodes(v, fn) for k, v in obj.items()}
    return obj


SUPPORTED_DTYPES = {
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
}  # fmt: skip


def _dtypes_supported(node: Node, meta: dict[Node, Any]) -> bool:
    tensors = [meta[n] for n in (*node.all_input_nodes, node)]
    return all(t.dtype in SUPPORTED_DTYPES for t in tensors if isinstance(t, torch.Tensor))


# [Note: fallbacks see eager's strides]
# Lowering stores every value it realizes contiguously, and pointwise kernels cannot tell. An
# eager op run as a fallback can: ``as_strided`` and ``view_as_complex`` read the storage
# itself, ``repeat`` then ``as_strided`` reads it past the view. Eager's intermediate of a
# channels_last or transposed input keeps that input's order (TensorIterator), so the
# fallback must receive a tensor with eager's strides. The prims graph records them in each
# node's meta value; when they differ from the realized buffer's, and are a permutation of a
# contiguous layout (dense, no offset: the layout of every computed tensor), the value is
# stored once more in that order: a Pointwise over the permuted shape, read back as a
# TensorArg with eager's strides (Inductor's FlexibleLayout fixed to the fallback's order).
# Other layouts (an expanded view, an offset) are left as they are: those are views of
# buffers, which as_strided_view hands out with their own strides already.


def dense_order(size: tuple, stride: tuple) -> list[int] | None:
    """The dims from outermost to innermost if ``stride`` is a permuted contiguous layout of
    ``size`` (static sizes only), else None. Size-1 dims go first (their stride is free)."""
    if not all(isinstance(v, int) for v in (*size, *stride)):
        return None
    order = sorted(range(len(size)), key=lambda d: (size[d] != 1, -stride[d]))
    expected = 1
    for d in reversed(order):
        if size[d] != 1 and stride[d] != expected:
            return None
        expected *= size[d]
    return order


def eager_layout_arg(g: Any, node: Any, arg: Any, val: Any = None) -> Any:
    """``arg`` (an extern's argument for ``node``, or a graph output) re-stored with eager's
    strides if needed: those of ``val``, by default ``node``'s own."""
    if val is None:
        val = node.meta.get("val") if hasattr(node, "meta") else None
    if not isinstance(arg, ir.TensorArg) or not isinstance(val, torch.Tensor):
        return arg
    want = g.eager_stride(arg, val)  # None when the layouts agree where it matters
    order = None if want is None else dense_order(tuple(arg.size), tuple(want))
    if order is None:
        return arg
    return store_in_order(g, g.env[node], order)


def store_in_order(g: Any, value: Any, order: list[int]) -> ir.TensorArg:
    """``value`` stored once more, its dims laid out from outermost to innermost as ``order``
    says: a Pointwise over the permuted shape, read back as a TensorArg of ``value``'s shape."""
    out_vars = indexing.index_vars("i", len(order))
    index = [sympy.Integer(0)] * len(order)
    for k, d in enumerate(order):  # dim k of the copy is dim order[k] of the value
        index[d] = out_vars[k]
    permuted = reindex(value, tuple(value.size[d] for d in order), tuple(index))
    name = g.new_name()
    g.nodes.append(ir.Pointwise(name, permuted.size, value.dtype, permuted.body, value.origins))
    stride = [0] * len(order)
    for d, s in zip(order, indexing.contiguous_strides(permuted.size)):
        stride[d] = s
    return ir.TensorArg(name, tuple(value.size), tuple(stride))
