"""Tests for toycomp.prims.loss_rules (and ``xlogy``, ``linalg_vector_norm``): the elementwise losses and their backwards
decompose (no eager fallback), and compiled losses and gradients match eager's for every
reduction, on differences at the branch bounds, NaN and infinite inputs, with and without
weights. Eager PyTorch is the oracle."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import toycomp

_nan, _inf = float("nan"), float("inf")
WEIGHT, POS_WEIGHT = torch.linspace(0.5, 2, 48), torch.linspace(3, 0.2, 48)  # per class
LOSSES = {
    "mse": lambda x, t, reduction: F.mse_loss(x, t, reduction=reduction),
    "l1": lambda x, t, reduction: F.l1_loss(x, t, reduction=reduction),
    "smooth_l1": lambda x, t, reduction: F.smooth_l1_loss(x, t, reduction=reduction),
    "smooth_l1_beta": lambda x, t, reduction: F.smooth_l1_loss(x, t, reduction=reduction,
                                                               beta=0.5),
    "smooth_l1_beta0": lambda x, t, reduction: F.smooth_l1_loss(x, t, reduction=reduction,
                                                                beta=0.0),  # the L1 loss
    "huber": lambda x, t, reduction: F.huber_loss(x, t, reduction=reduction),
    "huber_delta": lambda x, t, reduction: F.huber_loss(x, t, reduction=reduction, delta=2.0),
    "bce_logits": lambda x, t, reduction: F.binary_cross_entropy_with_logits(
        x, t.sigmoid(), reduction=reduction),
    "bce_logits_weights": lambda x, t, reduction: F.binary_cross_entropy_with_logits(
        x, t.sigmoid(), weight=WEIGHT, pos_weight=POS_WEIGHT, reduction=reduction),
    "kl_div": lambda x, t, reduction: F.kl_div(  # xlogy, and bitwise_and in its backward
        x.log_softmax(-1), t.softmax(-1),
        reduction="batchmean" if reduction == "mean" else reduction),
}  # fmt: skip


def inputs(finite: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, target) of shape (4, 48): differences of exactly 0, +-0.5, +-1, +-2 (the branch
    bounds), and with ``finite`` False a NaN and infinities in x."""
    torch.manual_seed(0)
    x, t = torch.randn(4, 48) * 2, torch.randn(4, 48)
    x[0, :8] = t[0, :8] + torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, -0.0])
    if not finite:
        x[1, 3], x[2, 5], x[3, 7] = _nan, _inf, -_inf
    return x, t


# every case on the C++ backend; the interpreter, slower, one per loss
CASES = [(r, f, "cpp") for r in ("none", "mean", "sum") for f in (True, False)]
CASES.append(("mean", True, "triton"))


@pytest.mark.parametrize("reduction, finite, backend", CASES)
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_and_its_backward_compile_like_eager(name, reduction, finite, backend):
    loss = LOSSES[name]
    x0, t0 = inputs(finite)
    grad = torch.randn(4, 48) if reduction == "none" else torch.tensor(0.7)

    def step(f):
        x, t = x0.clone().requires_grad_(), t0.clone().requires_grad_()
        out = f(x, t, reduction)
        out.backward(grad)
        return out.detach(), x.grad, t.grad

    compiled = toycomp.compile(loss, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager fallback warns: none allowed
        got = step(compiled)
    for g, w in zip(got, step(loss), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_xlogy_zero_times_log_zero_and_nan():
    x = torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0, _nan, 0.0, 3.0, -0.0] * 4)
    y = torch.tensor([0.0, _nan, 5.0, 0.0, 3.0, 1.0, _inf, -1.0, 2.0] * 4)
    got = toycomp.compile(torch.xlogy, backend="cpp")(x, y)
    torch.testing.assert_close(got, torch.xlogy(x, y), rtol=1e-6, atol=0, equal_nan=True)


@pytest.mark.parametrize("order", [2, 1, _inf, -_inf, 0, 3, 0.5])
def test_vector_norms_and_gradients_like_eager(order):
    """linalg_vector_norm (nn_rules.py): a row of zeros (whose 2-norm's gradient eager masks to
    0), one with a NaN, one with an infinity, and ordinary rows; keepdim on and off."""
    torch.manual_seed(0)
    x0 = torch.randn(6, 40)
    x0[0], x0[1, 3], x0[2, 5] = 0.0, _nan, _inf
    for keepdim in (False, True):
        fn = lambda x: torch.linalg.vector_norm(x, order, dim=1, keepdim=keepdim)  # noqa: E731
        outs = []
        for f in (fn, toycomp.compile(fn, backend="cpp")):
            x = x0.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                out = f(x)
                out.sum().backward()
            outs.append((out.detach(), x.grad))
        for g, w in zip(*outs, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)
