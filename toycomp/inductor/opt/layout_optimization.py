"""Layouts chosen for a GPU (``toycomp.config.layout_optimization``, on CUDA): channels-last
convolutions, and a graph's outputs computed in eager's layout (at the end of this file).

A bf16/fp16 convolution in a graph that is channels-last around it reads and writes its
activations channels-last, N, H, W, C from outermost to innermost in memory.

Input -> output: a ``convolution`` or ``convolution_backward`` node about to be lowered -> the
same node, its activations stored channels-last and its results planned so. Lowering stores
every value contiguously (NCHW), and ATen runs a bf16 depthwise convolution on NCHW tensors
with its own ``conv_depthwise2d`` kernels: forward and backward, 45% of ConvNeXt's GPU time a
step on an H200. Given channels-last tensors ATen picks cuDNN for it (ConvNeXt's step: 22.8 -> 13.1 ms
of GPU time), and cuDNN's bf16 convolutions, which compute in NHWC, no longer transpose their
NCHW operands and results. In fp32 cuDNN's channels-last depthwise weight gradient is the
slow one (ConvNeXt: 47 -> 59 ms), so fp32 convolutions are left NCHW::

    NCHW   x ──► [transpose] ──► cuDNN NHWC ──► [transpose] ──► y
    NHWC   x ───────────────────► cuDNN NHWC ──────────────────► y

A value the convolution reads is stored in that order where it is computed (a Pointwise over
the permuted shape, as [Note: fallbacks see eager's strides] stores a fallback's argument in
lowering_meta.py), so a producer costs no more; a value already in memory in another layout
(a graph input, a saved activation) is copied once, as cuDNN would copy it. Later readers of
the node read that buffer. The results are planned channels-last; should ATen hand back
another layout, the wrapper's ``check_extern`` copies the result into the planned one: a cost,
never a wrong value. Their readers read them through their strides, as any strided buffer::

    >>> channels_last_strides((8, 32, 14, 14))
    (6272, 1, 448, 32)

NB: in PyTorch this is torch/_inductor/graph.py (``GraphLowering.decide_layout_opt``, under
``config.layout_optimization``): when a graph's convolutions gain from it, every one of them
runs channels-last, and pointwise buffers then follow their inputs' layout
(``ComputedBuffer.decide_layout`` in ir.py), which toycomp's lowering does not do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.node import Node

import toycomp.prims as prims
from toycomp.inductor import indexing, ir
from toycomp.inductor.lowering_meta import dense_order, eager_layout_arg, store_in_order
from toycomp.inductor.tensor_value import TensorValue, as_strided_view, strided_load

aten = torch.ops.aten
DEVICES = {"cuda"}  # where cuDNN runs the convolutions (the tests add "cpu": ATen's CPU convs
# take any layout, so the stores and strides are checked there too)
CHANNELS_LAST = [0, 2, 3, 1]  # N, H, W, C: the dims from outermost to innermost
# the op -> (positions of its activations, of ``transposed``)
CONVOLUTIONS = {
    aten.convolution.default: ((0,), 6),
    aten.convolution_backward.default: ((0, 1), 7),  # grad_output, input
}


def channels_last_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = size
    return (c * h * w, 1, w * c, c)


def applies(g: Any, node: Node) -> bool:
    """A 2-d convolution on CUDA in bf16/fp16, static sizes, not transposed, in a graph already
    channels-last around it."""
    if g.device.type not in DEVICES or node.target not in CONVOLUTIONS:
        return False
    activations, transposed = CONVOLUTIONS[node.target]
    if len(node.args) <= transposed:  # (arguments by keyword: not as AOT traces them)
        return False
    x = g.meta[node.args[activations[-1]]]
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or node.args[transposed]:
        return False
    if not all(isinstance(s, int) for s in x.shape):  # dynamic shapes: left as they are
        return False
    return x.dtype in (torch.bfloat16, torch.float16) and reads_channels_last(node)


def reads_channels_last(node: Node) -> bool:
    """The graph around the convolution is channels-last already: its result is read through
    ``permute(0, 2, 3, 1)``, or the gradient it takes in is ``permute(0, 3, 1, 2)`` of one (a
    ConvNeXt block, whose LayerNorm and MLP run on N, H, W, C). Elsewhere its neighbours
    (BatchNorm, activations, the activations saved for the backward) are stored NCHW, and
    reading channels-last results through strides there, and copying the saved ones back to
    NCHW, cost more than the convolution gains (ResNet-50 in bf16: 2.6x the GPU time)."""
    if node.target is aten.convolution.default:
        return any(_is_permute(user, [0, 2, 3, 1]) for user in _through_casts(node))
    return _is_permute(_cast_source(node.args[0]), [0, 3, 1, 2])


def _through_casts(node: Node) -> list[Node]:
    """``node``'s readers, through dtype conversions (autocast's)."""
    users = []
    for user in node.users:
        users += _through_casts(user) if user.target is prims.convert_element_type else [user]
    return users


def _cast_source(node: Any) -> Any:
    while isinstance(node, Node) and node.target is prims.convert_element_type:
        node = node.args[0]
    return node


def _is_permute(node: Any, dims: list[int]) -> bool:
    return isinstance(node, Node) and node.target is prims.permute and list(node.args[1]) == dims


def use_channels_last(g: Any, node: Node) -> None:
    """Store the convolution's activations channels-last and plan its results so (in
    ``g.meta``, from which ``GraphLowering.extern`` plans them)."""
    activations = CONVOLUTIONS[node.target][0]
    for arg in dict.fromkeys(node.args[i] for i in activations):
        _store_channels_last(g, arg)
    out = g.meta[node]
    if isinstance(out, (tuple, list)):
        g.meta[node] = type(out)(_planned(t) for t in out)
    else:
        g.meta[node] = _planned(out)


def _store_channels_last(g: Any, arg: Node) -> None:
    value = g.env[arg]
    view = as_strided_view(value)
    if view is not None and view.offset == 0:
        order = dense_order(tuple(view.size), tuple(view.stride))
        if order is not None and [d for d in order if view.size[d] != 1] == [
            d for d in CHANNELS_LAST if view.size[d] != 1
        ]:
            return  # already channels-last
    stored = store_in_order(g, value, CHANNELS_LAST)
    g.env[arg] = strided_load(stored.buffer, stored.size, stored.stride, value.dtype)


def _planned(t: Any) -> Any:
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        return t  # a bias gradient, or no result
    size = tuple(t.shape)
    return torch.empty_strided(size, channels_last_strides(size), dtype=t.dtype, device="meta")


# --- graph outputs in eager's layout -------------------------------------------------------------
# AOT expects each output of a graph laid out as eager lays it out: ``x.t() / s`` transposed as
# ``x.t()`` is, attention's saved ``.contiguous()`` of a transpose (which lowering keeps as a view
# of the matmul's result). Without this pass the wrapper copies such an output there after the
# kernels (``restride``): on a GPU an ATen launch of about 20 us of host time, six a step in the
# GPT of notebook 05. Here a value not yet in memory is computed in eager's layout at once (a
# kernel over ``x``'s rows: the sum of row j, then row j divided by it), and one already in memory
# is stored there by a kernel, which the scheduler fuses with another that reads it alike. A
# layout with gaps or overlaps is left to ``restride``. (Inductor: a graph output's FlexibleLayout
# is fixed to eager's strides, ``keep_output_stride``, before its loops are ordered.)
def outputs_apply(g: Any, results: tuple, vals: tuple) -> bool:
    return g.device.type in DEVICES and len(vals) == len(results)


def outputs_in_eager_layout(g: Any, results: tuple, vals: tuple) -> tuple:
    """The graph's outputs realized (``GraphLowering.extern_arg``), each dense one in the layout
    of its ``val``, once per node."""
    laid_out: dict[Node, Any] = {}
    for r, val in zip(results, vals):
        if isinstance(r, Node) and r not in laid_out:
            laid_out[r] = eager_layout_arg(g, r, _computed_in_layout(g, r, val), val)
    return tuple(laid_out.get(r, r) for r in results)  # an int: a size saved by AOT


def _computed_in_layout(g: Any, node: Node, val: Any) -> Any:
    value = g.env[node]
    if (not isinstance(value, TensorValue) or not isinstance(val, torch.Tensor)
            or node in g.view_base or as_strided_view(value) is not None):  # fmt: skip
        return g.extern_arg(node)  # in memory already, or a view: realized as lowering does
    size = tuple(value.size)
    order = dense_order(size, tuple(g.sizevars.stride(val)))
    contiguous = ir.TensorArg("", size, indexing.contiguous_strides(size))
    if order is None or g.eager_stride(contiguous, val) is None:
        return g.extern_arg(node)
    stored = store_in_order(g, value, order)
    g.env[node] = strided_load(stored.buffer, stored.size, stored.stride, value.dtype)
    return stored
