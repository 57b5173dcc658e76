"""Stage 3b, the table (reductions and the nn ops built on them): ATen -> prims decompositions.

Input IR -> output IR: like ``pointwise_rules.py``, each function takes an ATen op's
arguments (``Proxy`` objects while ``decompose`` traces, or real tensors) and returns its result
computed with prims. Here are the ops whose decomposition needs a reduction prim (``sum``,
``amax``, ``amin``): ``sum``/``mean``/``var``, softmax and log-softmax with their backwards,
``nll_loss`` (its gather becomes a one-hot mask), ``addmm``/``baddbmm`` (the product stays an extern matmul)
and layer norm. Example, ``aten._softmax(x, -1)`` on a (4, 8) float32 tensor::

    amax = prims.amax(x, [1]);   b = prims.broadcast_in_dim(amax, [4, 8], [0])
    e = prims.exp(prims.sub(x, b));   s = prims.sum(e, [1])
    out = prims.div(e, prims.broadcast_in_dim(s, [4, 8], [0]))

NB: in PyTorch this lives in torch/_decomp/decompositions.py (``_softmax``,
``native_layer_norm_backward``, ``nll_loss_forward``...) and torch/_refs/__init__.py /
torch/_refs/nn/functional/__init__.py (``sum``, ``mean``, ``var``, ``mse_loss``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.helpers import (
    broadcast_to,
    convert,
    corrected_moments,
    elementwise,
    expand_back,
    get_computation_dtype,
    reduce,
    reduction_dims,
    reshape,
    upcast,
)
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.prims.decomp_tracer import meta_like

aten = torch.ops.aten


# --- softmax family -----------------------------------------------------------------------------
@register(aten._softmax.default)
def softmax(a: Any, dim: int, half_to_float: bool = False) -> Any:
    x, dtype = upcast(a)
    dims = reduction_dims(a, [dim])
    shifted = prims.sub(x, expand_back(prims.amax(x, dims), x.shape, dims))
    e = prims.exp(shifted)
    out = prims.div(e, expand_back(prims.sum(e, dims), x.shape, dims))
    return convert(out, torch.float32 if half_to_float else dtype)


@register(aten._safe_softmax.default)
def safe_softmax(a: Any, dim: int, dtype: torch.dtype | None = None) -> Any:
    """The math attention's softmax: a row whose scores are all -inf (every key masked out)
    gives zeros where ``_softmax`` gives NaN. Its gradient is ``_softmax``'s."""
    x, out_dtype = upcast(a if dtype is None else convert(a, dtype))
    dims = reduction_dims(a, [dim])
    peak = expand_back(prims.amax(x, dims), x.shape, dims)
    e = prims.exp(prims.sub(x, peak))
    out = prims.div(e, expand_back(prims.sum(e, dims), x.shape, dims))
    return convert(prims.where(prims.ne(peak, float("-inf")), out, 0.0), out_dtype)


@register(aten._log_softmax.default)
def log_softmax(a: Any, dim: int, half_to_float: bool = False) -> Any:
    x, dtype = upcast(a)
    dims = reduction_dims(a, [dim])
    shifted = prims.sub(x, expand_back(prims.amax(x, dims), x.shape, dims))
    log_sum = prims.log(prims.sum(prims.exp(shifted), dims))
    out = prims.sub(shifted, expand_back(log_sum, x.shape, dims))
    return convert(out, torch.float32 if half_to_float else dtype)


@register(aten._softmax_backward_data.default)
def softmax_backward_data(grad: Any, out: Any, dim: int, input_dtype: torch.dtype) -> Any:
    (g, y), _ = upcast(grad, out)
    dims = reduction_dims(y, [dim])
    dot = expand_back(prims.sum(prims.mul(g, y), dims), y.shape, dims)
    return convert(prims.mul(y, prims.sub(g, dot)), input_dtype)


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad: Any, out: Any, dim: int, input_dtype: torch.dtype) -> Any:
    (g, y), _ = upcast(grad, out)
    dims = reduction_dims(y, [dim])
    total = expand_back(prims.sum(g, dims), y.shape, dims)
    return convert(prims.sub(g, prims.mul(prims.exp(y), total)), input_dtype)


# --- losses: gathers become one-hot masks (iota + eq + where) -----------------------------------
def _nll_masks(a: Any, target: Any, weight: Any, ignore_index: int) -> tuple[Any, Any, Any]:
    """For ``a`` of shape (N, C): one-hot (N, C) of the targets, valid (N,) and ``a`` itself."""
    if weight is not None:
        raise Unsupported("nll_loss with a class weight")
    if a.ndim == 1:  # (C,) with a 0-d target: treat as a batch of one
        a, target = prims.reshape(a, [1, a.shape[0]]), prims.reshape(target, [1])
    n, c = a.shape
    classes = prims.broadcast_in_dim(prims.iota(c, target.dtype, a.device), [n, c], [1])
    one_hot = prims.eq(prims.broadcast_in_dim(target, [n, c], [0]), classes)
    return one_hot, prims.ne(target, ignore_index), a


@register(aten.nll_loss_forward.default)
def nll_loss_forward(
    a: Any, target: Any, weight: Any, reduction: int, ignore_index: int
) -> tuple[Any, Any]:
    classes = a.shape[-1]  # a target out of range would pick nothing: eager's error instead
    target = _extern(torch.ops.toycomp.check_targets.default, target, classes, ignore_index)
    one_hot, valid, x = _nll_masks(a, target, weight, ignore_index)
    picked = prims.sum(prims.where(one_hot, x, 0.0), [1])
    loss = prims.where(valid, prims.neg(picked), 0.0)
    total_weight = prims.sum(convert(valid, a.dtype), [0])
    if reduction == 0:  # "none"; ATen reports total_weight 0 for a batch, the count for (C,)
        out = prims.reshape(loss, []) if a.ndim == 1 else loss
        return out, total_weight if a.ndim == 1 else prims.full([], 0.0, a.dtype, a.device)
    out = prims.sum(loss, [0])
    return (prims.div(out, total_weight) if reduction == 1 else out), total_weight


@register(aten.nll_loss_backward.default)
def nll_loss_backward(
    grad: Any,
    a: Any,
    target: Any,
    weight: Any,
    reduction: int,
    ignore_index: int,
    total_weight: Any,
) -> Any:
    one_hot, valid, x = _nll_masks(a, target, weight, ignore_index)
    n, c = x.shape
    g = prims.reshape(grad, [n]) if reduction == 0 else prims.broadcast_in_dim(grad, [n], [])
    if reduction == 1:
        g = prims.div(g, prims.broadcast_in_dim(total_weight, [n], []))
    hit = prims.logical_and(one_hot, prims.broadcast_in_dim(valid, [n, c], [0]))
    out = prims.where(hit, prims.broadcast_in_dim(prims.neg(g), [n, c], [0]), 0.0)
    return reshape(out, a.shape)


# --- matmul: the product stays extern, bias and scaling become prims that fuse ------------------
def _extern(op: Any, *args: Any) -> Any:
    tracer = prims.current_tracer()
    return tracer.emit(op, args, {}) if tracer is not None else op(*args)


@register(aten.addmm.default)
def addmm(bias: Any, m1: Any, m2: Any, beta: Any = 1, alpha: Any = 1) -> Any:
    return _add_product(bias, _extern(aten.mm.default, m1, m2), beta, alpha)


@register(aten.baddbmm.default)
def baddbmm(bias: Any, b1: Any, b2: Any, beta: Any = 1, alpha: Any = 1) -> Any:
    return _add_product(bias, _extern(aten.bmm.default, b1, b2), beta, alpha)


def _add_product(bias: Any, product: Any, beta: Any, alpha: Any) -> Any:
    if alpha != 1:
        product = prims.mul(product, alpha)
    if beta == 0:  # ATen ignores the bias entirely (even NaNs in it)
        return product
    if beta != 1:
        bias = elementwise(prims.mul, bias, beta)
    return elementwise(prims.add, product, bias)


# --- reductions -----------------------------------------------------------------------------------
@register(aten.sum.default, aten.sum.dim_IntList)
def sum_(a: Any, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: Any = None) -> Any:
    if dtype is None and not a.dtype.is_floating_point:
        dtype = torch.int64  # ATen sums bools and integers as int64
    dtype = dtype or a.dtype  # float16/bfloat16 accumulate in float32, rounded once at the end
    out = reduce(prims.sum, convert(a, get_computation_dtype(dtype)), dim, keepdim)
    return convert(out, dtype)


@register(aten.mean.default, aten.mean.dim)
def mean(a: Any, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: Any = None) -> Any:
    dtype = dtype or a.dtype
    if not dtype.is_floating_point:
        raise Unsupported(f"mean of {dtype}")
    x, _ = upcast(convert(a, dtype))
    count = math.prod(a.shape[d] for d in reduction_dims(a, dim))
    return convert(prims.div(reduce(prims.sum, x, dim, keepdim), count), dtype)


@register(aten.amax.default, aten.max.default)
def amax(a: Any, dim: Sequence[int] = (), keepdim: bool = False) -> Any:
    return reduce(prims.amax, a, dim, keepdim)


@register(aten.amin.default, aten.min.default)
def amin(a: Any, dim: Sequence[int] = (), keepdim: bool = False) -> Any:
    return reduce(prims.amin, a, dim, keepdim)


@register(aten.var.correction)
def var(a: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    if not a.dtype.is_floating_point:
        raise Unsupported(f"var of {a.dtype}")
    x, dtype = upcast(a)
    if x.dtype == torch.float32 and a.dtype == torch.float32 and a.device.type == "cpu":
        x = convert(x, torch.float64)  # eager's CPU kernels accumulate a float var in double
    dims = reduction_dims(a, dim)
    count = math.prod(a.shape[d] for d in dims)
    _, m2 = corrected_moments(x, dims, count)
    denominator = max(count - (1 if correction is None else correction), 0)
    out = prims.div(m2, denominator)
    if keepdim:
        out = reshape(out, [1 if d in dims else s for d, s in enumerate(a.shape)])
    return convert(out, dtype)


@register(aten.std.correction)
def std(a: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return prims.sqrt(var(a, dim, correction=correction, keepdim=keepdim))


@register(aten.linalg_vector_norm.default)
def linalg_vector_norm(a: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                       dtype: Any = None) -> Any:  # fmt: skip
    """The ``ord``-norm over ``dim``: sqrt(sum x^2), sum |x|, max |x|, (sum |x|^p)^(1/p)..."""
    if not a.dtype.is_floating_point or (dtype is not None and not dtype.is_floating_point):
        raise Unsupported(f"vector norm of {dtype or a.dtype}")  # eager's error, at run time
    if math.isinf(ord) and any(a.shape[d] == 0 for d in reduction_dims(a, dim)):
        raise Unsupported("an inf-norm over an empty dim")  # eager's error, at run time
    x, out_dtype = upcast(convert(a, dtype))
    magnitude = prims.abs(x)
    if math.isinf(ord):
        out = reduce(prims.amax if ord > 0 else prims.amin, magnitude, dim, keepdim)
    elif ord == 0:  # the count of non-zeros
        out = reduce(prims.sum, convert(prims.ne(x, 0), x.dtype), dim, keepdim)
    elif ord == 1:
        out = reduce(prims.sum, magnitude, dim, keepdim)
    elif ord == 2:
        out = prims.sqrt(reduce(prims.sum, prims.mul(x, x), dim, keepdim))
    else:
        out = prims.pow(reduce(prims.sum, prims.pow(magnitude, ord), dim, keepdim), 1.0 / ord)
    return convert(out, out_dtype)


# --- normalization -----------------------------------------------------------------------------
# [Note: layer norm]
# ``native_layer_norm`` returns three tensors: the output, and the mean and 1/std of each row,
# which the backward reuses (AOT saves them). Both keep the normalized dims with size 1, e.g.
# (2, 8, 1) for an input (2, 8, 16) normalized over its last dim. Like torch/_refs we compute in
# float32 for float16/bfloat16 inputs and convert at the end; ATen's CPU kernel also converts the
# statistics back to the input dtype, unless the weight or bias is float32 (its "mixed type",
# as under CPU autocast: then they stay float32); its CUDA kernel keeps them in float32. PyTorch's
# meta kernel gives the input dtype in that mixed case, so where the graph's node has a value
# (AOT's), its dtype is the one the rest of the graph was traced with, and we follow it.
def _layer_norm_dims(a: Any, normalized_shape: Sequence[int]) -> tuple[list[int], list[int]]:
    axis = a.ndim - len(normalized_shape)
    return list(range(axis)), list(range(axis, a.ndim))


@register(aten.native_layer_norm.default)
def native_layer_norm(
    a: Any, normalized_shape: Sequence[int], weight: Any, bias: Any, eps: float
) -> tuple[Any, Any, Any]:
    outer, inner = _layer_norm_dims(a, normalized_shape)
    x, dtype = upcast(a)
    count = math.prod(a.shape[d] for d in inner)
    mean, m2 = corrected_moments(x, inner, count)
    centered = prims.sub(x, expand_back(mean, x.shape, inner))
    var = prims.div(m2, count)
    rstd = prims.rsqrt(prims.add(var, eps))
    out = prims.mul(centered, expand_back(rstd, x.shape, inner))
    if weight is not None:
        out = prims.mul(out, broadcast_to(convert(weight, x.dtype), x.shape))
    if bias is not None:
        out = prims.add(out, broadcast_to(convert(bias, x.dtype), x.shape))
    stats_shape = [a.shape[d] for d in outer] + [1] * len(inner)
    mixed = any(p is not None and p.dtype == torch.float32 for p in (weight, bias))
    stats_dtype = dtype if a.device.type == "cpu" and not mixed else x.dtype
    node = getattr(prims.current_tracer(), "aten_node", None)
    traced = node.meta.get("val") if node is not None else None
    if isinstance(traced, (tuple, list)) and isinstance(traced[1], torch.Tensor):
        stats_dtype = traced[1].dtype
    mean, rstd = (convert(reshape(s, stats_shape), stats_dtype) for s in (mean, rstd))
    return convert(out, dtype), mean, rstd


@register(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(
    grad_out: Any,
    a: Any,
    normalized_shape: Sequence[int],
    mean: Any,
    rstd: Any,
    weight: Any,
    bias: Any,
    output_mask: Sequence[bool],
) -> tuple[Any, Any, Any]:
    outer, inner = _layer_norm_dims(a, normalized_shape)
    count = math.prod(a.shape[d] for d in inner)
    if a.numel() == 0:
        raise Unsupported("native_layer_norm_backward of an empty tensor")
    (g, x), _ = upcast(grad_out, a)
    mu, rs = (broadcast_to(convert(s, x.dtype), x.shape) for s in (mean, rstd))
    x_hat = prims.mul(prims.sub(x, mu), rs)
    g_hat = g if weight is None else prims.mul(g, broadcast_to(convert(weight, x.dtype), x.shape))
    # d_input = rstd / N * (N * g_hat - sum(g_hat) - x_hat * sum(g_hat * x_hat))
    sum_g = expand_back(prims.sum(g_hat, inner), x.shape, inner)
    sum_gx = expand_back(prims.sum(prims.mul(g_hat, x_hat), inner), x.shape, inner)
    centered = prims.sub(prims.sub(prims.mul(g_hat, count), sum_g), prims.mul(x_hat, sum_gx))
    d_input = convert(prims.mul(prims.div(rs, count), centered), a.dtype)
    d_weight = d_bias = None
    if output_mask[1] and weight is not None:
        d_weight = convert(prims.sum(prims.mul(g, x_hat), outer), weight.dtype)
    if output_mask[2] and bias is not None:
        d_bias = convert(prims.sum(g, outer), bias.dtype)
    return (d_input if output_mask[0] else None), d_weight, d_bias


# [Note: embedding_bag's sizes]
# ``aten._embedding_bag`` returns (output, offset2bag, bag_size, max_indices), and the CPU
# kernel sizes the last three by mode and fast path (``sum`` without per-sample weights skips
# offset2bag: size 0, and its max_indices is bag_size's size), which the meta kernel does not
# follow. The sizes depend on the shapes and the mode, never on the values, so we ask eager
# itself, on a one-row table with zero indices, and keep the call a visible fallback.
@register(aten._embedding_bag.default)
def _embedding_bag(weight: Any, indices: Any, offsets: Any, *rest: Any) -> Any:
    tracer = prims.current_tracer()
    tensors = [t for t in (weight, indices, offsets, *rest) if hasattr(t, "shape")]
    static = all(isinstance(s, int) for t in tensors for s in t.shape)
    if tracer is None or weight.device.type != "cpu" or not static:
        raise Unsupported("_embedding_bag (its meta kernel's sizes)")

    def zeros(t: Any, shape: Sequence[int] | None = None) -> Any:
        if not hasattr(t, "shape"):
            return t
        return torch.zeros(tuple(t.shape) if shape is None else shape, dtype=t.dtype)

    real = aten._embedding_bag.default(
        zeros(weight, (1, *weight.shape[1:])), zeros(indices), zeros(offsets), *map(zeros, rest)
    )
    val = tuple(meta_like(t) for t in real)
    out = tracer.emit(aten._embedding_bag.default, (weight, indices, offsets, *rest), {}, val=val)
    out.node.meta["eager_sizes"] = True  # (decompose's result check: not the meta kernel's)
    return out
