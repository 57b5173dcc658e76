"""Stage 3b, the table (elementwise losses): ATen -> prims decompositions.

Input IR -> output IR: as in ``pointwise_rules.py``, each function takes an ATen op's
arguments and returns its result, written with prims. The losses here are one pointwise formula
per element followed by the reduction (``reduction``: 0 none, 1 mean, 2 sum, ATen's enum), and
their backwards one pointwise formula; ``nll_loss``, a gather, is in ``nn_rules.py``. Example,
``mse_loss(x, t)`` (mean)::

    d = prims.sub(x, t);   out = prims.div(prims.sum(prims.mul(d, d), [0, 1]), x.numel())

Each formula is the one ATen's CPU kernel computes (torch/aten/src/ATen/native/cpu/
PointwiseOpsKernel.cpp, native/Loss.cpp), comparisons included.

NB: in PyTorch this lives in torch/_decomp/decompositions.py (``smooth_l1_loss``,
``huber_loss_backward``, ``binary_cross_entropy_with_logits``...).
"""

from __future__ import annotations

from typing import Any

import torch

import toycomp.prims as prims
from toycomp.prims.activation_rules import log_sigmoid
from toycomp.prims.decomp_table import register
from toycomp.prims.helpers import elementwise
from toycomp.prims.nn_rules import mean, sum_
from toycomp.prims.pointwise_rules import abs as abs_, sub

aten = torch.ops.aten


def _reduce(loss: Any, reduction: int) -> Any:
    if reduction == 0:  # "none"
        return loss
    return mean(loss) if reduction == 1 else sum_(loss)


def _norm(a: Any, reduction: int) -> float:
    """The backward's factor: 1 / numel for a mean, else 1."""
    return 1 / a.numel() if reduction == 1 else 1.0


@register(aten.mse_loss.default)
def mse_loss(a: Any, target: Any, reduction: int = 1) -> Any:
    return _reduce(elementwise(lambda d: prims.mul(d, d), sub(a, target)), reduction)


@register(aten.mse_loss_backward.default)
def mse_loss_backward(grad: Any, a: Any, target: Any, reduction: int) -> Any:
    scale = 2 * _norm(a, reduction)
    return elementwise(lambda g, d: prims.mul(prims.mul(d, scale), g), grad, sub(a, target))


@register(aten.smooth_l1_loss.default)
def smooth_l1_loss(a: Any, target: Any, reduction: int = 1, beta: float = 1.0) -> Any:
    z = abs_(sub(a, target))
    if beta == 0:  # ATen: the L1 loss
        return _reduce(z, reduction)

    def formula(z: Any) -> Any:  # ATen: z < beta ? 0.5 * z * z / beta : z - 0.5 * beta
        quadratic = prims.div(prims.mul(prims.mul(z, 0.5), z), beta)
        return prims.where(prims.lt(z, beta), quadratic, prims.sub(z, 0.5 * beta))

    return _reduce(elementwise(formula, z), reduction)


@register(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad: Any, a: Any, target: Any, reduction: int, beta: float) -> Any:
    norm = _norm(a, reduction)

    def formula(g: Any, x: Any) -> Any:  # ATen: x <= -beta, x >= beta: -+norm * g; a NaN: NaN
        inside = prims.div(prims.mul(prims.mul(x, norm), g), beta)
        above = prims.where(prims.ge(x, beta), prims.mul(g, norm), inside)
        return prims.where(prims.le(x, -beta), prims.mul(g, -norm), above)

    return elementwise(formula, grad, sub(a, target))


@register(aten.huber_loss.default)
def huber_loss(a: Any, target: Any, reduction: int = 1, delta: float = 1.0) -> Any:
    def formula(z: Any) -> Any:  # ATen: z < delta ? 0.5 * z * z : delta * (z - 0.5 * delta)
        quadratic = prims.mul(prims.mul(z, 0.5), z)
        return prims.where(prims.lt(z, delta), quadratic,
                           prims.mul(prims.sub(z, 0.5 * delta), delta))  # fmt: skip

    return _reduce(elementwise(formula, abs_(sub(a, target))), reduction)


@register(aten.huber_loss_backward.default)
def huber_loss_backward(grad: Any, a: Any, target: Any, reduction: int, delta: float) -> Any:
    norm = _norm(a, reduction)

    def formula(g: Any, x: Any) -> Any:  # ATen: x <= -delta, x >= delta: -+norm * g * delta
        inside = prims.mul(prims.mul(x, norm), g)
        above = prims.where(prims.ge(x, delta), prims.mul(prims.mul(g, norm), delta), inside)
        return prims.where(prims.le(x, -delta), prims.mul(prims.mul(g, -norm), delta), above)

    return elementwise(formula, grad, sub(a, target))


@register(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(
    a: Any, target: Any, weight: Any = None, pos_weight: Any = None, reduction: int = 1
) -> Any:
    """ATen: (1 - t) * x - log_sigmoid(x) * (1 + (pos_weight - 1) * t), times ``weight``."""
    log_sig = log_sigmoid(a)
    if pos_weight is not None:
        log_weight = elementwise(lambda p, t: prims.add(prims.mul(prims.sub(p, 1.0), t), 1.0),
                                 pos_weight, target)  # fmt: skip
        log_sig = elementwise(prims.mul, log_sig, log_weight)
    loss = elementwise(lambda t, x: prims.mul(prims.sub(1.0, t), x), target, a)
    loss = elementwise(prims.sub, loss, log_sig)
    if weight is not None:
        loss = elementwise(prims.mul, loss, weight)
    return _reduce(loss, reduction)
