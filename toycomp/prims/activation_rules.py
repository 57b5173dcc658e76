"""Stage 3b, the table (activations and their backwards): one decomposition per ATen op, in prims.

Input IR -> output IR: as in ``pointwise_rules.py``, each function takes the ATen op's
arguments and returns what the op returns, written with prims. The activations of the models
the course trains (ReLU, GELU, SiLU, ...) and, for each, the backward op autograd's formula
calls (``silu_backward``, ``gelu_backward``...), which fuse with the rest of the backward::

    @register(aten.silu_backward.default)
    def silu_backward(grad, x): ...   # grad * s * (1 + x * (1 - s)), s = sigmoid(x)

Each formula is the one ATen's CPU kernel computes (torch/aten/src/ATen/native/cpu/
Activation.cpp), comparisons included, so a NaN or a bound takes the same branch as in eager.
``expm1`` has no prim: ``_expm1`` computes it from ``exp`` and ``log`` without losing the
digits near 0 ([Note: expm1 from exp and log]).

NB: in PyTorch this lives in torch/_decomp/decompositions.py (``silu_backward``, ``elu``,
``softplus_backward``, ``log_sigmoid_forward``, ``mish_backward``...).
"""

from __future__ import annotations

import math
from typing import Any

import torch

import toycomp.prims as prims
from toycomp.prims.helpers import (
    ELEMENTWISE_TYPE_PROMOTION_KIND as KIND,
    broadcast_shapes,
    broadcast_to,
    convert,
    elementwise,
    elementwise_dtypes,
    upcast,
)
from toycomp.prims.decomp_table import register
from toycomp.prims.pointwise_rules import ge, gt, le, logical_and, logical_or, lt

aten = torch.ops.aten


@register(aten.relu.default)
def relu(a: Any) -> Any:
    return prims.maximum(0, a)  # NaN stays NaN, and relu(-0.0) is -0.0 (see clamp)


@register(aten.threshold_backward.default)
def threshold_backward(grad: Any, a: Any, threshold: Any) -> Any:
    return _zero_where(grad, a, elementwise(prims.le, a, threshold, kind=KIND.ALWAYS_BOOL))


@register(aten.hardtanh_backward.default)
def hardtanh_backward(grad: Any, a: Any, min_val: Any, max_val: Any) -> Any:
    # The gradient passes only strictly between the bounds (ReLU6's backward in MobileNet).
    # At a NaN x the kernels disagree (see [Note: each device's kernel at NaN]): the CPU's
    # vector loop computes (min < x) & (x < max), so NaN gets 0; CUDA's tests
    # x <= min || x >= max, so NaN passes.
    if on_cpu(a):
        blocked = prims.logical_not(logical_and(gt(a, min_val), lt(a, max_val)))
    else:
        blocked = logical_or(le(a, min_val), ge(a, max_val))
    return _zero_where(grad, a, blocked)


# [Note: each device's kernel at NaN]
# Some of ATen's backward kernels pick a branch with comparisons that a NaN (or an input exactly
# at a bound) answers differently from one kernel to the next: the CPU's vector loop, which
# runs all of a tensor but its last few elements, and CUDA's kernel. toycomp follows the kernel
# of the device the graph runs on, the CPU's vector loop on the CPU, so eager on the same device
# is the oracle. (The CPU's scalar tail, a few elements, agrees with CUDA's kernel.)
def on_cpu(a: Any) -> bool:
    return a.device.type == "cpu"


def _zero_where(grad: Any, a: Any, mask: Any) -> Any:
    """``grad`` (broadcast with ``a``, in their common dtype) with 0 wherever ``mask`` is set."""
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


@register(aten.silu_backward.default)
def silu_backward(grad: Any, a: Any) -> Any:
    def formula(g: Any, x: Any) -> Any:  # ATen: dy * s * (1 + x * (1 - s))
        s = prims.reciprocal(prims.add(prims.exp(prims.neg(x)), 1.0))
        return prims.mul(prims.mul(g, s), prims.add(prims.mul(x, prims.sub(1.0, s)), 1.0))

    return elementwise(formula, grad, a)


@register(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad: Any, a: Any, negative_slope: Any, self_is_result: bool) -> Any:
    # (self_is_result: the in-place op's result, whose sign is its input's for a slope > 0)
    def formula(g: Any, x: Any) -> Any:
        return prims.where(prims.gt(x, 0), g, prims.mul(g, negative_slope))

    return elementwise(formula, grad, a)


# [Note: expm1 from exp and log]
# exp(x) - 1 loses every digit of a tiny x (exp(1e-10) rounds to 1.0). Kahan's trick keeps
# them: with u = exp(x) (rounded), (u - 1) * (x / log(u)) is within a few ulps of expm1(x),
# since the rounding error of u cancels between u - 1 and log(u). Where u rounds to 1 the
# answer is x itself (a signed zero included); u = inf gives inf, u = 0 gives -1.
def _expm1(x: Any) -> Any:
    u = prims.exp(x)
    u_minus_1 = prims.sub(u, 1.0)
    out = prims.mul(u_minus_1, prims.div(x, prims.log(u)))
    out = prims.where(prims.eq(u, math.inf), math.inf, out)
    out = prims.where(prims.eq(u_minus_1, -1.0), -1.0, out)
    return prims.where(prims.eq(u, 1.0), x, out)


@register(aten.expm1.default)
def expm1(a: Any) -> Any:
    return elementwise(_expm1, a, kind=KIND.INT_TO_FLOAT)


@register(aten.elu.default)
def elu(a: Any, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Any:
    def formula(x: Any) -> Any:  # ATen: x <= 0 ? expm1(x * input_scale) * alpha * scale : x * scale
        negative = prims.mul(_expm1(prims.mul(x, input_scale)), alpha * scale)
        return prims.where(prims.le(x, 0), negative, prims.mul(x, scale))

    return elementwise(formula, a)


@register(aten.celu.default)
def celu(a: Any, alpha: Any = 1.0) -> Any:  # ATen: elu(x, alpha, 1, 1 / alpha)
    return elu(a, alpha, 1.0, 1.0 / alpha)


@register(aten.elu_backward.default)
def elu_backward(grad: Any, alpha: Any, scale: Any, input_scale: Any, is_result: bool,
                 self_or_result: Any) -> Any:  # fmt: skip
    def formula(g: Any, x: Any) -> Any:
        if is_result:  # x is elu's output: its derivative is input_scale * (out + alpha*scale)
            negative = prims.mul(prims.mul(g, input_scale), prims.add(x, alpha * scale))
        else:
            e = prims.exp(prims.mul(x, input_scale))
            negative = prims.mul(prims.mul(prims.mul(g, input_scale), alpha * scale), e)
        # A NaN x ([Note: each device's kernel at NaN]): the CPU's vector loop tests x > 0
        # (NaN: the NaN branch), CUDA's x <= 0 (NaN: g * scale)
        if on_cpu(x):
            return prims.where(prims.gt(x, 0), prims.mul(g, scale), negative)
        return prims.where(prims.le(x, 0), negative, prims.mul(g, scale))

    return elementwise(formula, grad, self_or_result)


@register(aten.softplus.default)
def softplus(a: Any, beta: Any = 1.0, threshold: Any = 20.0) -> Any:
    def formula(x: Any) -> Any:  # ATen: x * beta > threshold ? x : log1p(exp(x * beta)) / beta
        scaled = prims.mul(x, beta)
        soft = prims.div(prims.log1p(prims.exp(scaled)), beta)
        return prims.where(prims.gt(scaled, threshold), x, soft)

    return elementwise(formula, a)


@register(aten.softplus_backward.default)
def softplus_backward(grad: Any, a: Any, beta: Any, threshold: Any) -> Any:
    def formula(g: Any, x: Any) -> Any:  # ATen: z = exp(x * beta); g * z / (z + 1) below
        scaled = prims.mul(x, beta)
        z = prims.exp(scaled)
        return prims.where(prims.gt(scaled, threshold), g,
                           prims.div(prims.mul(g, z), prims.add(z, 1.0)))  # fmt: skip

    return elementwise(formula, grad, a)


@register(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(a: Any) -> tuple[Any, Any]:
    """``min(x, 0) - log1p(exp(-|x|))``, and the buffer ATen's CPU backward reads (exp(-|x|));
    CUDA's is empty. The backward below recomputes it, so either is fine."""
    if a.device.type != "cpu":
        return log_sigmoid(a), prims.full([0], 0, a.dtype, a.device)
    return log_sigmoid(a), elementwise(lambda x: prims.exp(prims.neg(prims.abs(x))), a)


def log_sigmoid(a: Any) -> Any:
    """``log(sigmoid(x))`` without overflow: ``min(x, 0) - log1p(exp(-|x|))``, as ATen."""
    def formula(x: Any) -> Any:
        return prims.sub(prims.minimum(0, x), prims.log1p(prims.exp(prims.neg(prims.abs(x)))))

    return elementwise(formula, a)


@register(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad: Any, a: Any, buffer: Any) -> Any:
    def formula(g: Any, x: Any) -> Any:  # ATen: (max_deriv - sign * z / (1 + z)) * g
        negative = prims.lt(x, 0)
        z = prims.exp(prims.neg(prims.abs(x)))
        ratio = prims.div(z, prims.add(z, 1.0))
        deriv = prims.where(negative, prims.sub(1.0, ratio), ratio)  # 1 - z/(1+z) or z/(1+z)
        return prims.mul(deriv, g)

    return elementwise(formula, grad, a)


@register(aten.hardsigmoid.default)
def hardsigmoid(a: Any) -> Any:
    return elementwise(lambda x: prims.div(_relu6(prims.add(x, 3.0)), 6.0), a)


@register(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad: Any, a: Any) -> Any:
    def formula(g: Any, x: Any) -> Any:  # ATen: -3 < x < 3 ? g / 6 : 0
        inside = prims.logical_and(prims.gt(x, -3.0), prims.lt(x, 3.0))
        return prims.where(inside, prims.mul(g, 1 / 6), 0)

    return elementwise(formula, grad, a)


@register(aten.hardswish.default)
def hardswish(a: Any) -> Any:
    return elementwise(lambda x: prims.div(prims.mul(x, _relu6(prims.add(x, 3.0))), 6.0), a)


@register(aten.hardswish_backward.default)
def hardswish_backward(grad: Any, a: Any) -> Any:
    # [Note: each device's kernel at NaN]: the CPU's vector loop computes
    # x <= -3 ? 0 : x >= 3 ? g : g * (x / 3 + 0.5), so a NaN gets NaN and g passes whole at 3;
    # CUDA's x <= -3 ? 0 : x < 3 ? g * (x / 3 + 0.5) : g, so a NaN gets g.
    def formula(g: Any, x: Any) -> Any:
        middle = prims.mul(g, prims.add(prims.div(x, 3.0), 0.5))
        if on_cpu(x):
            return prims.where(prims.le(x, -3.0), 0, prims.where(prims.ge(x, 3.0), g, middle))
        return prims.where(prims.le(x, -3.0), 0, prims.where(prims.lt(x, 3.0), middle, g))

    return elementwise(formula, grad, a)


def _relu6(x: Any) -> Any:
    """``min(max(x, 0), 6)`` as ATen's hardswish writes it (a NaN stays NaN)."""
    return prims.minimum(prims.maximum(x, 0.0), 6.0)


@register(aten.mish.default)
def mish(a: Any) -> Any:  # ATen: x * tanh(log1p(exp(x)))
    return elementwise(lambda x: prims.mul(x, prims.tanh(prims.log1p(prims.exp(x)))), a)


@register(aten.mish_backward.default)
def mish_backward(grad: Any, a: Any) -> Any:
    def formula(g: Any, x: Any) -> Any:  # ATen: g * (t + x * s * (1 - t*t)), t = tanh(softplus)
        s = prims.reciprocal(prims.add(prims.exp(prims.neg(x)), 1.0))
        t = prims.tanh(prims.log1p(prims.exp(x)))
        slope = prims.mul(prims.mul(x, s), prims.sub(1.0, prims.mul(t, t)))
        return prims.mul(g, prims.add(t, slope))

    return elementwise(formula, grad, a)
