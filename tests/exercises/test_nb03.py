"""Notebook 03's checkers accept the reference solutions and reject plausible wrong ones."""

from __future__ import annotations

import torch

import toycomp.prims as prims
from toycomp.exercises import nb03
from toycomp.prims.helpers import convert, upcast


# -- 1. result_dtype ---------------------------------------------------------------------------
def category(dtype):
    return 0 if dtype is torch.bool else 2 if dtype.is_floating_point else 1


def number_dtype(x):
    return torch.bool if isinstance(x, bool) else torch.int64 if isinstance(x, int) else (
        torch.get_default_dtype())


def result_dtype(*operands, tiers=True):
    groups = [[], [], []]
    for x in operands:
        if isinstance(x, (bool, int, float)):
            groups[2].append(number_dtype(x))
        else:
            groups[1 if x.ndim == 0 else 0].append(x.dtype)
    if not tiers:  # wrong: every operand promotes alike
        groups = [[d for g in groups for d in g]]
    result = None
    for dtypes in groups:
        if dtypes:
            dtype = dtypes[0]
            for d in dtypes[1:]:
                dtype = torch.promote_types(dtype, d)
            if result is None or category(dtype) > category(result):
                result = dtype
    return result


def test_result_dtype_accepts_the_reference():
    assert nb03.check_result_dtype(result_dtype).passed


def test_result_dtype_rejects_plain_promotion():
    verdict = nb03.check_result_dtype(lambda *ops: result_dtype(*ops, tiers=False))
    assert verdict.status == "failed" and "case 'int32[4] + 2'" in verdict.text
    assert "expected: torch.int32" in verdict.text and "got:      torch.int64" in verdict.text
    assert "tiers" in verdict.text


# -- 2. broadcast ------------------------------------------------------------------------------
def broadcast(a, shape, align_right=True):
    if list(a.shape) == list(shape):
        return a
    offset = len(shape) - a.ndim if align_right else 0
    return prims.broadcast_in_dim(a, list(shape), list(range(offset, offset + a.ndim)))


def test_broadcast_accepts_the_reference():
    verdict = nb03.check_broadcast(broadcast)
    assert verdict.passed and verdict.cases == 6


def test_broadcast_rejects_left_alignment():
    verdict = nb03.check_broadcast(lambda a, shape: broadcast(a, shape, align_right=False))
    assert verdict.status in ("failed", "error") and "case '[3] -> [2, 3]'" in verdict.text


# -- 3. silu_backward --------------------------------------------------------------------------
def silu_backward(grad_output, a, opmath=True):
    (g, x), dtype = upcast(grad_output, a) if opmath else ((grad_output, a), a.dtype)
    sigmoid = prims.reciprocal(prims.add(prims.exp(prims.neg(x)), 1.0))
    one_minus = prims.sub(1.0, sigmoid)
    out = prims.mul(g, prims.mul(sigmoid, prims.add(prims.mul(x, one_minus), 1.0)))
    return convert(out, dtype)


def test_silu_backward_accepts_the_reference():
    assert nb03.check_silu_backward(silu_backward).passed


def test_silu_backward_rejects_forgetting_the_chain_rule_and_aten_ops():
    def forgets_grad(grad_output, a):  # the derivative, not multiplied by grad_output
        (x,), dtype = (a,), a.dtype
        sigmoid = prims.reciprocal(prims.add(prims.exp(prims.neg(x)), 1.0))
        return prims.mul(sigmoid, prims.add(prims.mul(x, prims.sub(1.0, sigmoid)), 1.0))

    verdict = nb03.check_silu_backward(forgets_grad)
    assert verdict.status == "failed" and "case 'f32[8]'" in verdict.text
    assert "sigmoid(a) * (1 + a * (1 - sigmoid(a)))" in verdict.text

    verdict = nb03.check_silu_backward(lambda g, a: torch.ops.aten.silu_backward(g, a))
    assert verdict.status == "error" and "case 'f32[8]'" in verdict.text


# -- 4. softplus ------------------------------------------------------------------------------
def softplus(a, beta=1.0, threshold=20.0, use_threshold=True):
    x, dtype = upcast(a)
    scaled = prims.mul(x, beta)
    soft = prims.div(prims.log1p(prims.exp(scaled)), beta)
    if use_threshold:
        soft = prims.where(prims.gt(scaled, threshold), x, soft)
    return convert(soft, dtype)


def test_softplus_accepts_the_reference():
    assert nb03.check_softplus(softplus).passed


def test_softplus_rejects_a_missing_threshold():
    verdict = nb03.check_softplus(lambda a, b, t: softplus(a, b, t, use_threshold=False))
    assert verdict.status == "failed" and "large values, beta=1.0" in verdict.text
    assert "threshold" in verdict.text and "got:      tensor([" in verdict.text and "inf" in verdict.text
