"""Stage 3b, the table: one decomposition per ATen op, written with prims only.

Input IR -> output IR: each function takes the ATen op's arguments (``Proxy`` objects while
``toycomp.decompositions.decompose`` traces it, or real tensors when called eagerly - prims run
their references then) and returns what the ATen op returns, computed with prims plus Python
arithmetic on sizes. Example::

    @register(aten.gelu_backward.default)
    def gelu_backward(grad, x, approximate="none"): ...   # -> erf, exp, mul, add prims

Broadcasting and type promotion are explicit here (``elementwise``, ``broadcast_to``,
``convert``), because prims take same-shape same-dtype operands. Helpers for promotion and views
live in ``toycomp/decomp_helpers.py``.

NB: in PyTorch this lives in torch/_decomp/decompositions.py and torch/_refs/__init__.py (e.g.
``_refs.nn.functional.gelu``); ``torch._prims_common`` holds the type-promotion helpers.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from toycomp import prims
from toycomp.decomp_helpers import (
    ELEMENTWISE_TYPE_PROMOTION_KIND as KIND,
    broadcast_shapes,
    broadcast_to,
    convert,
    elementwise,
    elementwise_dtypes,
    expand_back,
    get_computation_dtype,
    is_number,
    reduce,
    reshape,
    reduction_dims,
    round_number,
    upcast,
)
from toycomp.decompositions import Unsupported, register

aten = torch.ops.aten


def _overloads(name: str, *overloads: str) -> list[Any]:
    """``aten.<name>.<overload>`` for those overloads that exist and return a Tensor (so not
    ``aten.mul.default``, which multiplies two Python numbers)."""
    packet = getattr(aten, name, None)
    ops = [getattr(packet, o) for o in overloads if packet is not None and hasattr(packet, o)]
    return [op for op in ops if str(op._schema.returns[0].type) == "Tensor"]


# --- pointwise --------------------------------------------------------------------------------
_UNARY_KINDS = {
    "neg": KIND.DEFAULT, "abs": KIND.DEFAULT, "floor": KIND.DEFAULT, "sign": KIND.DEFAULT,
    "exp": KIND.INT_TO_FLOAT, "log": KIND.INT_TO_FLOAT, "log1p": KIND.INT_TO_FLOAT,
    "sqrt": KIND.INT_TO_FLOAT, "rsqrt": KIND.INT_TO_FLOAT, "reciprocal": KIND.INT_TO_FLOAT,
    "sin": KIND.INT_TO_FLOAT, "cos": KIND.INT_TO_FLOAT, "tanh": KIND.INT_TO_FLOAT,
    "erf": KIND.INT_TO_FLOAT,
}  # fmt: skip

_BINARY_KINDS = {
    "mul": KIND.DEFAULT, "div": KIND.INT_TO_FLOAT, "maximum": KIND.DEFAULT,
    "minimum": KIND.DEFAULT, "eq": KIND.ALWAYS_BOOL, "ne": KIND.ALWAYS_BOOL,
    "lt": KIND.ALWAYS_BOOL, "le": KIND.ALWAYS_BOOL, "gt": KIND.ALWAYS_BOOL,
    "ge": KIND.ALWAYS_BOOL,
}  # fmt: skip


# Ops whose ATen CPU kernels round a Python number to the tensor's dtype first (see
# [Note: low precision computes in float32] in decomp_helpers.py); mul and div do not.
_ROUNDS_NUMBERS = {"maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"}


def _pointwise(prim: Any, kind: KIND) -> Any:
    round_numbers = prim.__name__ in _ROUNDS_NUMBERS

    def decomp(*args: Any) -> Any:
        return elementwise(prim, *args, kind=kind, round_numbers=round_numbers)

    decomp.__name__ = decomp.__qualname__ = prim.__name__
    return decomp


for _name, _kind in _UNARY_KINDS.items():
    register(*_overloads(_name, "default"))(_pointwise(prims.PRIMS[_name], _kind))
for _name, _kind in _BINARY_KINDS.items():
    register(*_overloads(_name, "Tensor", "Scalar", "default"))(
        _pointwise(prims.PRIMS[_name], _kind)
    )
del _name, _kind


def _add_or_sub(prim: Any, a: Any, b: Any, alpha: Any) -> Any:
    """``a + alpha * b`` (or ``-``), computed in one go: rounded once, like ATen's kernel."""
    if alpha == 1 or is_number(b):
        b = b * alpha if is_number(b) else b
        return elementwise(prim, a, b, round_numbers=True)
    return elementwise(lambda x, y: prim(x, prims.mul(y, alpha)), a, b, round_numbers=True)


@register(aten.add.Tensor, aten.add.Scalar)
def add(a: Any, b: Any, alpha: Any = 1) -> Any:
    return _add_or_sub(prims.add, a, b, alpha)


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return _add_or_sub(prims.sub, a, b, alpha)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return sub(b, a, alpha)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    if rounding_mode is None:
        return elementwise(prims.div, a, b, kind=KIND.INT_TO_FLOAT)
    computation, _ = elementwise_dtypes(a, b)
    if rounding_mode != "trunc" or not computation.is_floating_point:
        raise Unsupported(f"div with rounding_mode={rounding_mode!r} on {computation}")
    return elementwise(lambda x, y: trunc(prims.div(x, y)), a, b)  # like ATen: trunc(a / b)


@register(aten.trunc.default)
def trunc(a: Any) -> Any:
    if not a.dtype.is_floating_point:
        return a
    return prims.where(prims.lt(a, 0), prims.neg(prims.floor(prims.neg(a))), prims.floor(a))


@register(aten.ceil.default)
def ceil(a: Any) -> Any:
    return prims.neg(prims.floor(prims.neg(a))) if a.dtype.is_floating_point else a


@register(aten.logical_not.default)
def logical_not(a: Any) -> Any:
    return prims.logical_not(convert(a, torch.bool))


@register(aten.logical_and.default)
def logical_and(a: Any, b: Any) -> Any:
    shape = broadcast_shapes(a.shape, b.shape)
    a, b = (broadcast_to(convert(t, torch.bool), shape) for t in (a, b))
    return prims.logical_and(a, b)


@register(aten.logical_or.default)
def logical_or(a: Any, b: Any) -> Any:
    return prims.logical_not(logical_and(logical_not(a), logical_not(b)))


@register(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(a: Any, exponent: Any) -> Any:
    computation, result = elementwise_dtypes(a, exponent, kind=KIND.BOOL_TO_LONG)
    a, exponent = convert(a, computation), round_number(exponent, result)
    if exponent == 1:
        out = a
    elif exponent == 2:  # like Inductor: small integer powers become multiplications
        out = prims.mul(a, a)
    elif exponent == 0:
        out = prims.full(a.shape, 1, computation, a.device)
    else:
        out = prims.pow(a, exponent)
    return convert(out, result)


@register(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_tensor(a: Any, b: Any) -> Any:
    return elementwise(prims.pow, a, b, kind=KIND.BOOL_TO_LONG, round_numbers=True)


@register(aten.where.self, *_overloads("where", "ScalarSelf", "ScalarOther", "Scalar"))
def where(cond: Any, a: Any, b: Any) -> Any:
    computation, _ = elementwise_dtypes(a, b, kind=KIND.NO_OPMATH)  # a selection: no rounding
    shapes = [t.shape for t in (cond, a, b) if not is_number(t)]
    shape = broadcast_shapes(*shapes)
    a, b = (broadcast_to(convert(t, computation), shape) for t in (a, b))
    cond = broadcast_to(convert(cond, torch.bool), shape)
    if is_number(a) and is_number(b):
        a = prims.full(shape, a, computation, cond.device)
    return prims.where(cond, a, b)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(a: Any, mask: Any, value: Any) -> Any:
    if is_number(value) and isinstance(value, float) and not a.dtype.is_floating_point:
        raise Unsupported(f"masked_fill of a {a.dtype} tensor with float {value}")
    value = value if is_number(value) else broadcast_to(convert(value, a.dtype), a.shape)
    return prims.where(broadcast_to(mask, a.shape), value, a)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(a: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 (ATen's names)
    bounds = [v for v in (min, max) if v is not None]
    computation, _ = elementwise_dtypes(a, *bounds, kind=KIND.NO_OPMATH)
    shape = broadcast_shapes(*(v.shape for v in (a, *bounds) if not is_number(v)))
    out, min, max = (broadcast_to(convert(v, computation), shape) for v in (a, min, max))
    if min is not None:
        out = prims.maximum(out, min)
    if max is not None:
        out = prims.minimum(out, max)
    return out


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(a: Any, min: Any) -> Any:  # noqa: A002
    return clamp(a, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(a: Any, max: Any) -> Any:  # noqa: A002
    return clamp(a, None, max)


@register(aten.hardtanh.default)
def hardtanh(a: Any, min_val: Any = -1.0, max_val: Any = 1.0) -> Any:
    return clamp(a, min_val, max_val)


# --- activations and their backwards -----------------------------------------------------------
@register(aten.relu.default)
def relu(a: Any) -> Any:
    return prims.maximum(a, 0)  # maximum propagates NaN, as relu does


@register(aten.threshold_backward.default)
def threshold_backward(grad: Any, a: Any, threshold: Any) -> Any:
    mask = elementwise(prims.le, a, threshold, kind=KIND.ALWAYS_BOOL)
    computation, _ = elementwise_dtypes(grad, a, kind=KIND.NO_OPMATH)
    shape = broadcast_shapes(grad.shape, a.shape)
    grad = broadcast_to(convert(grad, computation), shape)
    return prims.where(broadcast_to(mask, shape), 0, grad)


@register(aten.sigmoid.default)
def sigmoid(a: Any) -> Any:
    x, dtype = upcast(a)
    return convert(prims.reciprocal(prims.add(prims.exp(prims.neg(x)), 1.0)), dtype)


@register(aten.sigmoid_backward.default)
def sigmoid_backward(grad: Any, y: Any) -> Any:
    return elementwise(lambda g, y: prims.mul(g, prims.mul(y, prims.sub(1.0, y))), grad, y)


@register(aten.tanh_backward.default)
def tanh_backward(grad: Any, y: Any) -> Any:
    return elementwise(lambda g, y: prims.mul(g, prims.sub(1.0, prims.mul(y, y))), grad, y)


@register(aten.silu.default)
def silu(a: Any) -> Any:
    x, dtype = upcast(a)
    return convert(prims.mul(x, sigmoid(x)), dtype)


@register(aten.leaky_relu.default)
def leaky_relu(a: Any, negative_slope: float = 0.01) -> Any:
    x, dtype = upcast(a)
    return convert(prims.where(prims.gt(x, 0), x, prims.mul(x, negative_slope)), dtype)


@register(aten.gelu.default)
def gelu(a: Any, approximate: str = "none") -> Any:
    x, dtype = upcast(a)
    if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = prims.mul(prims.mul(x, x), x)
        inner = prims.mul(prims.add(x, prims.mul(cube, 0.044715)), math.sqrt(2 / math.pi))
        cdf = prims.mul(prims.add(prims.tanh(inner), 1.0), 0.5)
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        cdf = prims.mul(prims.add(prims.erf(prims.mul(x, math.sqrt(0.5))), 1.0), 0.5)
    return convert(prims.mul(x, cdf), dtype)


@register(aten.gelu_backward.default)
def gelu_backward(grad: Any, a: Any, approximate: str = "none") -> Any:
    (g, x), dtype = upcast(grad, a)
    if approximate == "tanh":
        beta, kappa = math.sqrt(2 / math.pi), 0.044715
        x_sq = prims.mul(x, x)
        inner = prims.mul(prims.add(x, prims.mul(prims.mul(x_sq, x), kappa)), beta)
        t = prims.tanh(inner)
        left_derivative = prims.mul(prims.add(t, 1.0), 0.5)
        right_derivative = prims.sub(1.0, prims.mul(t, t))
        inner_derivative = prims.mul(prims.add(prims.mul(x_sq, 3 * kappa), 1.0), beta)
        d = prims.mul(prims.mul(prims.mul(x, 0.5), right_derivative), inner_derivative)
        out = prims.mul(g, prims.add(left_derivative, d))
    else:  # cdf(x) + x * pdf(x)
        cdf = prims.mul(prims.add(prims.erf(prims.mul(x, math.sqrt(0.5))), 1.0), 0.5)
        pdf = prims.mul(prims.exp(prims.mul(prims.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        out = prims.mul(g, prims.add(cdf, prims.mul(x, pdf)))
    return convert(out, dtype)


# --- softmax family -----------------------------------------------------------------------------
@register(aten._softmax.default)
def softmax(a: Any, dim: int, half_to_float: bool = False) -> Any:
    x, dtype = upcast(a)
    dims = reduction_dims(a, [dim])
    shifted = prims.sub(x, expand_back(prims.amax(x, dims), x.shape, dims))
    e = prims.exp(shifted)
    out = prims.div(e, expand_back(prims.sum(e, dims), x.shape, dims))
    return convert(out, torch.float32 if half_to_float else dtype)


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


@register(aten.mse_loss.default)
def mse_loss(a: Any, target: Any, reduction: int = 1) -> Any:
    diff = elementwise(prims.sub, a, target)
    squared = elementwise(lambda d: prims.mul(d, d), diff)
    if reduction == 0:  # "none"
        return squared
    return mean(squared) if reduction == 1 else sum_(squared)


@register(aten.mse_loss_backward.default)
def mse_loss_backward(grad: Any, a: Any, target: Any, reduction: int) -> Any:
    scale = 2 / a.numel() if reduction == 1 else 2
    diff = elementwise(prims.sub, a, target)
    return elementwise(lambda g, d: prims.mul(prims.mul(d, scale), g), grad, diff)


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
    dims = reduction_dims(a, dim)
    count = math.prod(a.shape[d] for d in dims)
    mu = expand_back(prims.div(prims.sum(x, dims), count), x.shape, dims)
    diff = prims.sub(x, mu)
    denominator = max(count - (1 if correction is None else correction), 0)
    out = prims.div(reduce(prims.sum, prims.mul(diff, diff), dims, keepdim), denominator)
    return convert(out, dtype)


@register(aten.std.correction)
def std(a: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return prims.sqrt(var(a, dim, correction=correction, keepdim=keepdim))


# --- normalization -----------------------------------------------------------------------------
# [Note: layer norm]
# ``native_layer_norm`` returns three tensors: the output, and the mean and 1/std of each row,
# which the backward reuses (AOT saves them). Both keep the normalized dims with size 1, e.g.
# (2, 8, 1) for an input (2, 8, 16) normalized over its last dim. Like torch/_refs we compute in
# float32 for float16/bfloat16 inputs and convert at the end; ATen's CPU kernel also converts the
# statistics back to the input dtype, its CUDA kernel keeps them in float32.
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
    mean = prims.div(prims.sum(x, inner), count)
    centered = prims.sub(x, expand_back(mean, x.shape, inner))
    var = prims.div(prims.sum(prims.mul(centered, centered), inner), count)
    rstd = prims.rsqrt(prims.add(var, eps))
    out = prims.mul(centered, expand_back(rstd, x.shape, inner))
    if weight is not None:
        out = prims.mul(out, broadcast_to(convert(weight, x.dtype), x.shape))
    if bias is not None:
        out = prims.add(out, broadcast_to(convert(bias, x.dtype), x.shape))
    stats_shape = [a.shape[d] for d in outer] + [1] * len(inner)
    stats_dtype = dtype if a.device.type == "cpu" else x.dtype
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


from toycomp import decomp_views  # noqa: E402,F401  (views, creation, copies)
