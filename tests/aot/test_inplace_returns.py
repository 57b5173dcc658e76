"""In-place ops return their input, as in eager: ``x.add_(y)`` is ``x`` itself, so writes
through the result reach ``x``; through ``toycomp.compile`` and ``torch.compile(backend=...)``."""

import pytest
import torch

import toycomp


def _compilers(fn):
    return [toycomp.compile(fn, backend="cpp"), torch.compile(fn, backend="toycomp")]


@pytest.mark.parametrize("path", [0, 1], ids=["toycomp.compile", "torch.compile"])
@pytest.mark.parametrize(
    "op",
    [
        lambda x, y: x.add_(y),
        lambda x, y: x.mul_(y).sub_(2),  # a chain: each returns x
        lambda x, y: x.clamp_(min=0),
        lambda x, y: x.copy_(y),
        lambda x, y: x.t_(),  # a metadata mutation
        lambda x, y: torch.add(y, 1, out=x),
    ],
    ids=["add_", "mul_sub_", "clamp_", "copy_", "t_", "out="],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_inplace_result_is_the_input(op, dtype, path):
    x0, y = torch.randn(3, 4).mul(5).to(dtype), torch.randn(3, 4).mul(5).to(dtype)
    x_eager, x = x0.clone(), x0.clone()
    expected = op(x_eager, y)
    got = _compilers(op)[path](x, y)
    assert got is x  # eager: expected is x_eager
    assert expected is x_eager
    torch.testing.assert_close(x, x_eager)
    got.fill_(7)  # a write through the result reaches x
    assert bool((x == 7).all())


@pytest.mark.parametrize("path", [0, 1], ids=["toycomp.compile", "torch.compile"])
def test_inplace_result_with_other_outputs(path):
    def fn(x, y):
        z = x.mul_(2).add_(y)
        return z, z * 2, y.add_(1)

    x, y = torch.randn(5), torch.randn(5)
    xe, ye = x.clone(), y.clone()
    expected = fn(xe, ye)
    got = _compilers(fn)[path](x, y)
    assert got[0] is x and got[2] is y and got[1] is not x
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)


def test_inplace_result_carries_gradients():
    # x does not require grad, y does: after x.add_(y), x (and the result, x itself) does.
    def fn(x, y):
        return x.add_(y * 3)

    y = torch.randn(4, requires_grad=True)
    y_eager = y.detach().clone().requires_grad_()
    x = torch.randn(4)
    x_eager = x.clone()
    expected = fn(x_eager, y_eager)
    got = toycomp.compile(fn)(x, y)
    assert got is x and got.requires_grad
    (got * torch.arange(4.0)).sum().backward()
    (expected * torch.arange(4.0)).sum().backward()
    torch.testing.assert_close(y.grad, y_eager.grad)
