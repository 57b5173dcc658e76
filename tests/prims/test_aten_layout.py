"""as_strided and empty_strided read the layout eager gives ([Note: as_strided reads the ATen
layout] in toycomp/prims/functional_rules.py): ConvNeXt's head pools to one pixel with
``adaptive_avg_pool2d``, which eager writes as ``mean(...).as_strided(...)`` and whose gradient
autograd builds in an ``empty_strided`` buffer. Values and gradients are eager's (the oracle),
with no ATen fallback for as_strided or empty_strided."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.prims import compiled_samples

MEMORY_OPS = {"aten.as_strided.default", "aten.empty_strided.default"}


def check_compiled(fn, tensors):
    compiled = compiled_samples.check(fn, tensors, "cpp")
    left = set(compiled_samples.fallbacks(compiled)) & MEMORY_OPS
    assert not left, compiled_samples.fallbacks(compiled)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_head_pools_to_one_pixel(dtype, channels_last):
    """ConvNeXt's head: pool to 1x1, a LayerNorm over channels (permute, norm, permute back),
    flatten, linear."""

    def head(x, w, nw, nb, fw):
        x = F.conv2d(x, w, padding=1)
        x = F.adaptive_avg_pool2d(x, 1)
        x = F.layer_norm(x.permute(0, 2, 3, 1), (8,), nw, nb).permute(0, 3, 1, 2)
        return F.linear(x.flatten(1), fw)

    g = _gen()
    x = torch.randn(2, 3, 5, 5, generator=g, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    params = [torch.randn(*s, generator=g, dtype=dtype) for s in [(8, 3, 3, 3), (8,), (8,), (4, 8)]]
    check_compiled(head, [x.requires_grad_(), *(p.requires_grad_() for p in params)])


@pytest.mark.parametrize("size", [1, (1, 1)])
def test_adaptive_avg_pool_to_one(size):
    def fn(x):
        return F.adaptive_avg_pool2d(x * 2, size).sin()

    x = torch.randn(3, 4, 6, 6, generator=_gen(1), requires_grad=True)
    check_compiled(fn, [x])


def test_as_strided_of_a_fresh_result_at_an_offset():
    """An explicit offset counts from the first element of an op's new result, in the memory
    order eager gives it (a transposed result keeps its strides: here the sum of a permuted
    tensor)."""

    def fn(x):
        y = (x * 3).permute(1, 0, 2).contiguous()  # fresh, row-major (4, 3, 5)
        a = y.as_strided((2, 3), (5, 1), 7)
        b = (x + 1).as_strided((4, 2), (15, 2), 3)  # x + 1 keeps x's (row-major) strides
        return a.exp(), b * b

    check_compiled(fn, [torch.randn(3, 4, 5, generator=_gen(2), requires_grad=True)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_empty_strided_read_through_its_strides(dtype):
    """An empty_strided buffer filled through an as_strided view of its storage: the strides
    given (column-major here) decide which element each write lands on."""

    def fn(x):
        out = torch.empty_strided((3, 4), (1, 3), dtype=x.dtype)
        out.as_strided((12,), (1,)).copy_(x.flatten())  # storage order: column-major
        return out + 1

    x = (torch.randn(3, 4, generator=_gen(3)) * 10).to(dtype)
    check_compiled(fn, [x])


def test_gradient_through_a_transposed_input_uses_empty_strided():
    """autograd makes the gradient of a strided input with empty_strided and the input's
    strides (fuzz seed 95)."""

    def fn(x0, x1):
        return torch.minimum(torch.log(x0.abs() + 0.01), x0) * x1

    g = _gen(95)
    x0 = (torch.rand(1, 8, 7, generator=g) * 4 - 2).transpose(0, 2).requires_grad_()
    check_compiled(fn, [x0, torch.rand(7, 1, 1, generator=g) * 4 - 2])


def test_empty_strided_with_symbolic_sizes_stays_eager():
    """After a size change the sizes are symbols: empty_strided and the as_strided_scatter
    reading it both run eagerly (visibly), with eager's gradients (fuzz seed 95, resized)."""
    import toycomp

    def fn(x0, x1):
        return torch.minimum(torch.log(x0.abs() + 0.01), x0) * x1

    compiled = toycomp.compile(fn)
    for n in (7, 9):
        g = _gen(95)
        x0 = (torch.rand(1, 8, n, generator=g) * 4 - 2).transpose(0, 2)
        x1 = torch.rand(n, 1, 1, generator=g) * 4 - 2
        a, b = x0.clone().requires_grad_(), x0.clone().requires_grad_()
        compiled(a, x1).square().sum().backward()
        fn(b, x1).square().sum().backward()
        torch.testing.assert_close(a.grad, b.grad)
