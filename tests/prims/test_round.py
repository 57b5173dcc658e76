"""``torch.round`` with and without ``decimals``, and Python's ``round`` inside a compiled
function: compiled to kernels (no ATen fallback, no graph break), bit for bit eager's values
for float32/float64/float16/bfloat16, ties to even and the sign of zero included. Eager is the
oracle, Dynamo for graph counts.
"""

from __future__ import annotations

import pytest
import torch

import toycomp

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
BACKENDS = ["cpp", "triton"]
SPECIAL = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.0, -0.0, -0.3, 0.3, 0.49999997, 1e-8, -1e-8,
           12345.5, 2.0**24 + 2, -(2.0**23) - 1, 1e30, float("inf"), float("-inf"), float("nan"),
           0.125, 0.005, 0.015, 0.025, 1.005, -0.045, 150.0, -250.0, 49.999, 5e-5]  # fmt: skip


def values(dtype):
    torch.manual_seed(0)
    random = torch.randn(200, dtype=torch.float64) * torch.logspace(-3, 5, 200, dtype=torch.float64)
    return torch.cat([torch.tensor(SPECIAL, dtype=torch.float64), random]).to(dtype)


def assert_same_bits(got, expected):
    assert type(got) is torch.Tensor and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    number = ~expected.isnan()  # a NaN's sign bit means nothing (eager's bfloat16 sets it)
    assert torch.equal(got.signbit()[number], expected.signbit()[number])  # -0.0 stays -0.0


def compiled_without_fallback(fn, *args, backend):
    ex = toycomp.explain(fn, *args, backend=backend)
    assert ex.graph_count == 1 and ex.graph_break_count == 0, ex.break_reasons
    assert ex.fallbacks == [], ex.fallbacks
    return toycomp.compile(fn, backend=backend)(*args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("decimals", [None, 0, 1, 2, 3, 5, -1, -2])
def test_torch_round_matches_eager_bits(decimals, dtype, backend):
    x = values(dtype)
    kw = {} if decimals is None else {"decimals": decimals}
    fn = lambda x: torch.round(x * 1, **kw)  # noqa: E731 (an intermediate, not only an input)
    assert_same_bits(compiled_without_fallback(fn, x, backend=backend), fn(x))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_method_round_fused_with_other_ops(dtype):
    x = values(dtype)[20:].reshape(5, -1).t()  # a transposed input
    fn = lambda x: (x * 3 - 1).round(decimals=1).relu() * 2 + x.round()  # noqa: E731
    torch.testing.assert_close(compiled_without_fallback(fn, x, backend="cpp"), fn(x),
                               rtol=0, atol=0)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
def test_round_of_integers_is_the_identity(dtype):
    x = torch.arange(10).to(dtype)
    fn = lambda x: torch.round(x) * 2  # noqa: E731
    got = compiled_without_fallback(fn, x, backend="cpp")
    assert got.dtype == fn(x).dtype and torch.equal(got, fn(x))


def test_round_with_decimals_of_integers_raises_like_eager():
    x = torch.arange(10)
    with pytest.raises(RuntimeError):
        torch.round(x, decimals=1)
    with pytest.raises(Exception, match="round"):
        toycomp.compile(lambda x: torch.round(x, decimals=1), backend="cpp")(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("decimals", [0, 2, -1])
def test_round_gradient_is_zero_like_eager(decimals, dtype):
    x = values(dtype)[:40].nan_to_num().clamp(-1e4, 1e4).requires_grad_()
    fn = lambda x: (torch.round(x * 3, decimals=decimals) + x * 2).sum()  # noqa: E731
    (expected,) = torch.autograd.grad(fn(x), x)
    (got,) = torch.autograd.grad(toycomp.compile(fn, backend="cpp")(x), x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def py_round_floats(x):
    return x * round(3.14159, 2) + round(1234.5, -2) + round(2.5) + round(-0.5, 0)


def py_round_size(x):
    return x.reshape(round(x.shape[0] / 2.5), -1) * round(x.shape[0] / 3, 1)


@pytest.mark.parametrize("fn", [py_round_floats, py_round_size])
def test_python_round_inside_a_compiled_function(fn):
    x = torch.randn(10, 4)
    torch._dynamo.reset()
    dynamo = torch._dynamo.explain(fn)(x)
    torch._dynamo.reset()
    ex = toycomp.explain(fn, x, backend="cpp")
    assert (ex.graph_count, ex.graph_break_count) == (dynamo.graph_count, 0), ex.break_reasons
    torch.testing.assert_close(toycomp.compile(fn, backend="cpp")(x), fn(x), rtol=0, atol=0)


def test_python_round_of_a_tensor_raises_like_eager():
    fn = lambda x: round(x, 2)  # noqa: E731 (Tensor has no __round__)
    x = torch.randn(3)
    with pytest.raises(TypeError, match="__round__"):
        fn(x)
    with pytest.raises(TypeError, match="__round__"):
        toycomp.compile(fn, backend="cpp")(x)
