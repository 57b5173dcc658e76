"""Tests for toycomp.prims.activation_rules: each activation and the backward op autograd calls
for it decompose (no eager fallback), and compiled values and gradients match eager's on the
values where formulas differ: NaN, infinities, signed zeros, each branch's bounds, tiny and
large numbers. Eager PyTorch is the oracle."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import toycomp

_nan, _inf = float("nan"), float("inf")
EDGES = [-0.0, 0.0, _nan, _inf, -_inf, 1e-30, -1e-30, 1e-10, -1e-10, 1e-5, -1e-5, 0.5, -0.5,
         3.0, -3.0, 2.9999, -2.9999, 3.0001, -3.0001, 10.0, -10.0, 19.99, 20.0, 20.01, -20.0,
         40.0, -40.0, 88.0, 88.8, -88.0, -104.0, -110.0]  # fmt: skip

ACTIVATIONS = {
    "silu": F.silu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": F.elu,
    "elu_alpha": lambda x: F.elu(x, alpha=0.5),
    "celu": lambda x: F.celu(x, alpha=2.0),  # input_scale 1 / alpha
    "selu": F.selu,  # scale and alpha
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=1.0),
    "logsigmoid": F.logsigmoid,
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "mish": F.mish,
    "expm1": torch.expm1,
}


def inputs() -> torch.Tensor:
    torch.manual_seed(0)
    spread = torch.linspace(-8.0, 8.0, 97)
    return torch.cat([torch.tensor(EDGES), spread, torch.randn(64) * 4])


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_and_its_backward_compile_like_eager(name, backend):
    fn = ACTIVATIONS[name]
    x = inputs()
    grad = torch.randn_like(x)

    def step(f):
        a = x.clone().requires_grad_()
        out = f(a)
        out.backward(grad)
        return out.detach(), a.grad

    compiled = toycomp.compile(fn, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an eager fallback warns: none allowed
        got = step(compiled)
    want = step(fn)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=4e-6, atol=1e-7, equal_nan=True)


def test_expm1_keeps_the_digits_near_zero():
    """[Note: expm1 from exp and log]: within a few ulps of eager where exp(x) - 1 would keep
    none (x = 1e-10) or few (x = 1e-4), a signed zero kept, the ends exact."""
    tiny = torch.tensor([1e-38, 1e-20, 1e-10, -1e-10, 3e-8, 1e-6, -1e-4, 1e-4, 0.01, -0.3])
    x = torch.cat([tiny, torch.tensor([-0.0, 0.0, 88.0, 89.0, -20.0, -104.0, -_inf, _inf])])
    got = toycomp.compile(torch.expm1, backend="cpp")(x)
    want = torch.expm1(x)
    ulps = ((got.double() - want.double()).abs() / torch.finfo(torch.float32).eps
            / want.double().abs().clamp_min(1e-38))  # fmt: skip
    assert ulps[: len(tiny)].max() <= 4, ulps
    assert torch.equal(got[len(tiny):], want[len(tiny):]), (got, want)
    assert torch.equal(got.signbit(), want.signbit())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["elu", "hardswish", "hardsigmoid", "leaky_relu", "relu6"])
def test_backward_at_nan_and_bounds_follows_cuda_eager(name):
    """[Note: each device's kernel at NaN]: on CUDA, the gradient at a NaN or at a bound
    exactly is CUDA eager's, which differs from the CPU's vector loop for elu, hardswish and
    hardtanh (relu6)."""
    fn = {"relu6": F.relu6}.get(name) or ACTIVATIONS[name]
    x0 = torch.tensor([_nan, 3.0, -3.0, 0.0, -0.0, 6.0, 1.0, -1.0] * 16, device="cuda")
    grad = torch.arange(1.0, 129.0, device="cuda")
    grads = []
    for f in (fn, toycomp.compile(fn)):
        x = x0.clone().requires_grad_()
        f(x).backward(grad)
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=0, equal_nan=True)
