"""Notebook 03's checkers accept the reference solutions and reject plausible wrong ones.

The reference answers come from the solved notebook (tests/exercises/reference.py); the wrong
answers are written here.
"""

from __future__ import annotations

import functools

import torch

import toycomp.prims as prims
from tests.exercises import reference
from toycomp.exercises import nb03
from toycomp.prims.helpers import convert, upcast


def solution(name: str):
    return reference.solution("03", name, torch=torch, prims=prims)


# -- 1. result_dtype ---------------------------------------------------------------------------
def plain_promotion(*operands):  # wrong: every operand promotes alike, whatever its tier
    def dtype(x):
        if isinstance(x, bool):
            return torch.bool
        if isinstance(x, (int, float)):
            return torch.int64 if isinstance(x, int) else torch.get_default_dtype()
        return x.dtype

    return functools.reduce(torch.promote_types, map(dtype, operands))


def test_result_dtype_accepts_the_reference():
    assert nb03.check_result_dtype(solution("result_dtype")).passed


def test_result_dtype_rejects_plain_promotion():
    verdict = nb03.check_result_dtype(plain_promotion)
    assert verdict.status == "failed" and "case 'int32[4] + 2'" in verdict.text
    assert "expected: torch.int32" in verdict.text and "got:      torch.int64" in verdict.text
    assert "tiers" in verdict.text


# -- 2. broadcast ------------------------------------------------------------------------------
def broadcast_left_aligned(a, shape):  # wrong: dim i of a stays dim i
    if list(a.shape) == list(shape):
        return a
    return prims.broadcast_in_dim(a, list(shape), list(range(a.ndim)))


def test_broadcast_accepts_the_reference():
    verdict = nb03.check_broadcast(solution("broadcast"))
    assert verdict.passed and verdict.cases == 6


def test_broadcast_rejects_left_alignment_with_a_hint():
    verdict = nb03.check_broadcast(broadcast_left_aligned)
    assert verdict.status in ("failed", "error") and "case '[3] -> [2, 3]'" in verdict.text
    assert "hint:     prims.broadcast_in_dim(a, shape, broadcast_dimensions)" in verdict.text


def test_broadcast_with_a_torch_function_gets_a_hint_not_only_the_error():
    verdict = nb03.check_broadcast(lambda a, shape: torch.broadcast_to(a, shape))
    assert verdict.status == "error" and "must be Tensor, not Proxy" in verdict.text
    assert "hint:     the check traces broadcast on Proxy values" in verdict.text


# -- 3. silu_backward --------------------------------------------------------------------------
def test_silu_backward_accepts_the_reference():
    assert nb03.check_silu_backward(solution("silu_backward")).passed


def test_silu_backward_rejects_forgetting_the_chain_rule_and_aten_ops():
    def forgets_grad(grad_output, a):  # the derivative, not multiplied by grad_output
        sigmoid = prims.reciprocal(prims.add(prims.exp(prims.neg(a)), 1.0))
        return prims.mul(sigmoid, prims.add(prims.mul(a, prims.sub(1.0, sigmoid)), 1.0))

    verdict = nb03.check_silu_backward(forgets_grad)
    assert verdict.status == "failed" and "case 'f32[8]'" in verdict.text
    assert "sigmoid(a) * (1 + a * (1 - sigmoid(a)))" in verdict.text

    verdict = nb03.check_silu_backward(lambda g, a: torch.ops.aten.silu_backward(g, a))
    assert verdict.status == "error" and "case 'f32[8]'" in verdict.text
    assert "hint:     the check traces the decomposition on Proxy values" in verdict.text


def test_silu_backward_rejects_a_result_left_in_float32_and_broken_prim_contracts():
    def no_convert(grad_output, a):  # upcasts, but returns float32 for float16 inputs
        (g, x), _ = upcast(grad_output, a)
        sigmoid = prims.reciprocal(prims.add(prims.exp(prims.neg(x)), 1.0))
        return prims.mul(g, prims.mul(sigmoid, prims.add(prims.mul(x, prims.sub(1.0, sigmoid)), 1)))

    verdict = nb03.check_silu_backward(no_convert)
    assert verdict.status == "failed" and "case 'f16[16]'" in verdict.text
    assert "expected: torch.float16" in verdict.text and "(helpers.convert)" in verdict.text

    def wrong_broadcast(grad_output, a):
        return prims.mul(grad_output, prims.broadcast_in_dim(a, [3], [0]))

    verdict = nb03.check_silu_backward(wrong_broadcast)
    assert verdict.status == "error" and "hint:     a prim refused its arguments" in verdict.text


# -- 4. softplus ------------------------------------------------------------------------------
def softplus_without_threshold(a, beta=1.0, threshold=20.0):  # wrong: exp overflows
    x, dtype = upcast(a)
    return convert(prims.div(prims.log1p(prims.exp(prims.mul(x, beta))), beta), dtype)


def test_softplus_accepts_the_reference():
    softplus = reference.solution("03", "softplus", torch=torch, prims=prims, upcast=upcast,
                                  convert=convert)  # fmt: skip
    assert nb03.check_softplus(softplus).passed


def test_softplus_rejects_a_missing_threshold():
    verdict = nb03.check_softplus(softplus_without_threshold)
    assert verdict.status == "failed" and "large values, beta=1.0" in verdict.text
    assert "threshold" in verdict.text and "got:      tensor([" in verdict.text
    assert "inf" in verdict.text
