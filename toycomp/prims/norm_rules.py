"""Stage 3b, the table (batch and group norm): ATen -> prims decompositions, with backwards.

Input IR -> output IR: like ``nn_rules.py``, each function takes an ATen op's arguments
(``Proxy`` objects while ``decompose`` traces, or real tensors) and returns its results computed
with prims: per-channel ``sum`` reductions over every dim but the channel dim 1, and pointwise
work that fuses with the convolution before it and the ReLU after it. Example, the training-mode
``aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)`` on a float32 x of
shape (N, C, H, W), with ``n = N*H*W`` and ``per_channel(t)`` = ``broadcast_in_dim(t, x.shape,
[1])``::

    mean = prims.div(prims.sum(x, [0, 2, 3]), n)
    centered = prims.sub(x, per_channel(mean))
    var_sum = prims.sum(prims.mul(centered, centered), [0, 2, 3])
    invstd = prims.rsqrt(prims.add(prims.div(var_sum, n), 1e-5))
    alpha = prims.mul(invstd, w);   beta = prims.sub(b, prims.mul(mean, alpha))
    out = prims.add(prims.mul(x, per_channel(alpha)), per_channel(beta))
    new_rm = 0.1 * mean + 0.9 * rm;   new_rv = 0.1 * var_sum / (n - 1) + 0.9 * rv

NB: in PyTorch this lives in torch/_decomp/decompositions.py (``native_batch_norm_helper``,
``native_batch_norm_backward``); eager's CPU kernels are in aten/src/ATen/native/batch_norm.cpp
and aten/src/ATen/native/cpu/batch_norm_kernel.cpp.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.prims.helpers import (
    convert,
    corrected_moments,
    expand_back,
    get_computation_dtype,
    reshape,
)
from toycomp.prims.nn_rules import native_layer_norm, native_layer_norm_backward

aten = torch.ops.aten


# [Note: batch norm]
# BatchNorm normalises each channel (dim 1) over all the other dims: the batch, and the spatial
# dims of a 3-d or 4-d input (a 2-d input (N, C) has only the batch). In training mode the
# statistics come from the batch, mean = sum(x) / n and var = sum((x - mean)^2) / n with
# n = numel / C (two passes, as eager's CPU kernel and our layer norm do), and the running
# statistics move towards them: running_mean = momentum * mean + (1 - momentum) * running_mean,
# and the same for running_var with the *unbiased* variance sum(...) / (n - 1). In eval mode
# the running statistics are used instead and nothing is updated. Like eager's CPU kernel
# (``batch_norm_cpu_transform_input``) the output is one multiply-add per element with
# per-channel factors, out = x * alpha + beta, alpha = invstd * weight,
# beta = bias - mean * alpha; float16/bfloat16 inputs compute in float32 and round at the end.
#
# Three ATen spellings reach us. ``native_batch_norm`` and ``_native_batch_norm_legit`` update
# the running statistics in place when training (the first without saying so in its schema);
# toycomp.aot rewrites them to ``_native_batch_norm_legit_functional``, which returns the new
# statistics as outputs 3 and 4 instead. A graph that still holds the in-place form with
# running statistics in training mode is refused here (a visible fallback: the eager kernel
# does the update), since a decomposition that drops the update would be silently wrong.
class BatchNormStats(NamedTuple):
    """What ``_batch_norm`` computes, in the computation dtype (``None`` where not computed)."""

    out: Any
    save_mean: Any
    save_invstd: Any
    new_running_mean: Any
    new_running_var: Any


def _check_input(a: Any) -> None:
    if a.ndim < 2:
        raise Unsupported(f"batch norm of a {a.ndim}-d input (no channel dim)")
    if not a.dtype.is_floating_point:
        raise Unsupported(f"batch norm of {a.dtype}")


def _dims(a: Any) -> list[int]:
    """The reduced dims: all but the channel dim 1."""
    return [0, *range(2, a.ndim)]


def _count(a: Any) -> Any:
    """Elements per channel, ``numel / C`` (a SymInt with dynamic shapes)."""
    return math.prod(a.shape[d] for d in _dims(a))


def _per_channel(t: Any, shape: Sequence[int]) -> Any:
    """A (C,) tensor broadcast along dim 1 of ``shape``."""
    return prims.broadcast_in_dim(t, list(shape), [1])


def _invstd(var: Any, eps: float) -> Any:
    """1 / sqrt(var + eps); eager's ``InvStd`` gives 0, not inf, where var and eps are both 0."""
    invstd = prims.rsqrt(prims.add(var, eps))
    return prims.where(prims.eq(var, 0.0), 0.0, invstd) if eps == 0 else invstd


def _batch_norm(
    a: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
    training: bool, momentum: float, eps: float,
) -> BatchNormStats:  # fmt: skip
    _check_input(a)
    compute = get_computation_dtype(a.dtype)
    x, dims = convert(a, compute), _dims(a)
    if training:
        count = _count(a)
        mean, var_sum = corrected_moments(x, dims, count)
        invstd = _invstd(prims.div(var_sum, count), eps)
        new_mean = _running_update(running_mean, mean, momentum)
        new_var = None
        if running_var is not None:  # eager's unbiased variance: var_sum / (n - 1)
            new_var = _running_update(running_var, prims.div(var_sum, count - 1), momentum)
    else:
        if running_mean is None or running_var is None:
            raise Unsupported("batch norm in eval mode without running statistics")
        mean = convert(running_mean, compute)
        invstd = _invstd(convert(running_var, compute), eps)
        new_mean, new_var = running_mean, running_var
    alpha = invstd if weight is None else prims.mul(invstd, convert(weight, compute))
    beta = prims.neg(prims.mul(mean, alpha))
    if bias is not None:
        beta = prims.add(convert(bias, compute), beta)
    out = prims.add(prims.mul(x, _per_channel(alpha, x.shape)), _per_channel(beta, x.shape))
    return BatchNormStats(out, mean, invstd, new_mean, new_var)


def _running_update(running: Any, batch_stat: Any, momentum: float) -> Any:
    """momentum * batch_stat + (1 - momentum) * running, in the running statistic's dtype."""
    if running is None:
        return None
    old = convert(running, batch_stat.dtype)
    new = prims.add(prims.mul(batch_stat, momentum), prims.mul(old, 1 - momentum))
    return convert(new, running.dtype)


def _saved(a: Any, stats: BatchNormStats, training: bool) -> tuple[Any, Any]:
    """``save_mean`` and ``save_invstd`` as ATen returns them: in the input's dtype on the CPU
    (float32 elsewhere), and in eval mode empty (0,) tensors on the CPU, the statistics used
    on other devices (torch/_decomp's "very annoying inconsistency")."""
    on_cpu = a.device.type == "cpu"
    if not training and on_cpu:
        empty = prims.full([0], 0.0, a.dtype, a.device)
        return empty, empty
    dtype = a.dtype if on_cpu else stats.save_mean.dtype
    return convert(stats.save_mean, dtype), convert(stats.save_invstd, dtype)


def _forward(a: Any, stats: BatchNormStats, training: bool) -> tuple[Any, Any, Any]:
    return (convert(stats.out, a.dtype), *_saved(a, stats, training))


def _refuse_hidden_update(training: bool, running_mean: Any, running_var: Any, op: str) -> None:
    if training and (running_mean is not None or running_var is not None):
        raise Unsupported(
            f"{op} in training mode updates running_mean/running_var in place; functionalize the "
            "graph first (toycomp.aot turns it into _native_batch_norm_legit_functional)"
        )


@register(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def native_batch_norm(
    a: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
    training: bool, momentum: float, eps: float,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """``native_batch_norm`` and ``_native_batch_norm_legit``: the same op, two ATen names."""
    _refuse_hidden_update(training, running_mean, running_var, "batch norm")
    stats = _batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps)
    return _forward(a, stats, training)


@register(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(
    a: Any, weight: Any, bias: Any, training: bool, momentum: float, eps: float
) -> tuple[Any, Any, Any]:
    stats = _batch_norm(a, weight, bias, None, None, training, momentum, eps)
    return _forward(a, stats, training)


@register(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(
    a: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: float,
    eps: float,
) -> tuple[Any, Any, Any]:  # fmt: skip
    stats = _batch_norm(a, weight, bias, running_mean, running_var, False, momentum, eps)
    return _forward(a, stats, False)


@register(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(
    a: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
    training: bool, momentum: float, eps: float,
) -> tuple[Any, Any, Any, Any, Any]:  # fmt: skip
    stats = _batch_norm(a, weight, bias, running_mean, running_var, training, momentum, eps)
    return (*_forward(a, stats, training), stats.new_running_mean, stats.new_running_var)


# [Note: batch norm backward]
# With x_hat = (x - mean) * invstd and g = grad_out, the gradients per channel are
#   grad_bias = sum(g),   grad_weight = sum(g * (x - mean)) * invstd,
#   grad_input = (g - sum(g) / n - (x - mean) * sum(g * (x - mean)) * invstd^2 / n)
#                * invstd * weight                               (training: the batch's stats),
#   grad_input = g * invstd * weight                             (eval: constant statistics),
# two per-channel sums over the same dims as the forward's, and one pointwise pass; in eval mode
# the statistics are the running ones (invstd recomputed from running_var).
@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad_out: Any, a: Any, weight: Any, running_mean: Any, running_var: Any, save_mean: Any,
    save_invstd: Any, train: bool, eps: float, output_mask: Sequence[bool],
) -> tuple[Any, Any, Any]:  # fmt: skip
    _check_input(a)
    compute = get_computation_dtype(a.dtype)
    g, x, dims = convert(grad_out, compute), convert(a, compute), _dims(a)
    if train:
        mean, invstd = convert(save_mean, compute), convert(save_invstd, compute)
    else:
        if running_mean is None or running_var is None:
            raise Unsupported("batch norm backward in eval mode without running statistics")
        mean = convert(running_mean, compute)
        invstd = _invstd(convert(running_var, compute), eps)
    centered = prims.sub(x, _per_channel(mean, x.shape))
    sum_g = prims.sum(g, dims)
    dot = prims.sum(prims.mul(g, centered), dims)
    scale = invstd if weight is None else prims.mul(invstd, convert(weight, compute))
    grad_input = None
    if output_mask[0]:
        grad_input = _grad_input(g, centered, sum_g, dot, invstd, scale, _count(a), train)
        grad_input = convert(grad_input, a.dtype)
    param_dtype = a.dtype if weight is None else weight.dtype
    grad_weight = convert(prims.mul(dot, invstd), param_dtype) if output_mask[1] else None
    grad_bias = convert(sum_g, param_dtype) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


def _grad_input(
    g: Any, centered: Any, sum_g: Any, dot: Any, invstd: Any, scale: Any, count: Any, train: bool
) -> Any:
    shape = g.shape
    if not train:
        return prims.mul(g, _per_channel(scale, shape))
    grad_mean = prims.div(sum_g, count)
    proj_scale = prims.div(prims.mul(dot, prims.mul(invstd, invstd)), count)
    proj = prims.mul(centered, _per_channel(proj_scale, shape))
    diff = prims.sub(prims.sub(g, proj), _per_channel(grad_mean, shape))
    return prims.mul(diff, _per_channel(scale, shape))


# --- group norm: a layer norm over each group of channels ----------------------------------------
# GroupNorm normalises each sample's channels in ``group`` groups: viewed as (N, group, K) with
# K = C / group * HxW, that is a layer norm over the last dim (with its exact moments, [Note:
# the corrected two-pass moments]), followed by a per-channel weight and bias. Its backward is
# layer norm's for the input and batch norm's sums over all dims but the channels for the
# parameters.
def _groups(n: Any, c: Any, hxw: Any, group: int) -> list[Any]:
    """The (N, group, K) view of a group norm's input."""
    return [n, group, c // group * hxw]


@register(aten.native_group_norm.default)
def native_group_norm(a: Any, weight: Any, bias: Any, n: Any, c: Any, hxw: Any, group: int,
                      eps: float) -> tuple[Any, Any, Any]:  # fmt: skip
    computation = get_computation_dtype(a.dtype)
    x = convert(a, computation)
    shape = _groups(n, c, hxw, group)
    out, mean, rstd = native_layer_norm(reshape(x, shape), shape[-1:], None, None, eps)
    out = reshape(out, list(a.shape))
    if weight is not None:
        out = prims.mul(out, _per_channel(convert(weight, computation), a.shape))
    if bias is not None:
        out = prims.add(out, _per_channel(convert(bias, computation), a.shape))
    mean, rstd = (convert(reshape(s, [n, group]), a.dtype) for s in (mean, rstd))
    return convert(out, a.dtype), mean, rstd


@register(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out: Any, a: Any, mean: Any, rstd: Any, weight: Any, n: Any,
                               c: Any, hxw: Any, group: int, output_mask: Sequence[bool]
                               ) -> tuple[Any, Any, Any]:  # fmt: skip
    if a.numel() == 0:
        raise Unsupported("native_group_norm_backward of an empty tensor")
    computation = get_computation_dtype(a.dtype)
    g, x = convert(grad_out, computation), convert(a, computation)
    shape = _groups(n, c, hxw, group)
    stats = [reshape(convert(s, computation), [n, group, 1]) for s in (mean, rstd)]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g_hat = g if weight is None else prims.mul(g, _per_channel(convert(weight, computation),
                                                                   a.shape))  # fmt: skip
        d_input, _, _ = native_layer_norm_backward(reshape(g_hat, shape), reshape(x, shape),
                                                   shape[-1:], *stats, None, None,
                                                   [True, False, False])  # fmt: skip
        grad_input = convert(reshape(d_input, list(a.shape)), a.dtype)
    others = [d for d in range(a.ndim) if d != 1]
    if output_mask[1] and weight is not None:
        grouped = [prims.broadcast_in_dim(s, shape, [0, 1, 2]) for s in stats]
        x_hat = prims.mul(prims.sub(reshape(x, shape), grouped[0]), grouped[1])
        dot = prims.sum(prims.mul(g, reshape(x_hat, list(a.shape))), others)
        grad_weight = convert(dot, weight.dtype)
    if output_mask[2]:
        grad_bias = convert(prims.sum(g, others), a.dtype if weight is None else weight.dtype)
    return grad_input, grad_weight, grad_bias
