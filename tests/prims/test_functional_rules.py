"""Tests for toycomp.prims.functional_rules and avg_pool_rules: as_strided_scatter, as_strided,
fill.Tensor and avg_pool2d decompose (no ATen fallback), convolution_backward is one extern call,
and the compiled values and gradients match eager's on PyTorch's OpInfo samples and on the
cases real models meet; a builtin with no bytecode compiles. Eager PyTorch is the oracle."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import toycomp
from tests.prims import compiled_samples

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

RULE_OPS = {
    "aten.as_strided_scatter.default", "aten.fill.Tensor", "aten.convolution_backward.default",
    "aten.as_strided.default",
}  # fmt: skip
# OpInfo name -> every how many samples to take (each sample is one more graph region to compile)
CASES = {
    "as_strided_scatter": 1, "as_strided": 1, "nn.functional.conv1d": 3, "nn.functional.conv2d": 3,
    "nn.functional.conv3d": 4,
}  # fmt: skip


def opinfo_samples(name: str, every: int, dtype: torch.dtype = torch.float32) -> tuple:
    info = next(i for i in op_db if i.name == name and not i.variant_test_name)
    torch.manual_seed(0)
    samples = info.sample_inputs("cpu", dtype, requires_grad=dtype.is_floating_point)
    return info, list(itertools.islice(samples, 0, None, every))


def check_no_fallback(fn, tensors, backend="cpp", allowed=()):
    compiled = compiled_samples.check(fn, tensors, backend)
    left = set(compiled_samples.fallbacks(compiled)) & RULE_OPS - set(allowed)
    assert not left, compiled_samples.fallbacks(compiled)


@pytest.mark.parametrize("name", list(CASES))
def test_opinfo_samples_compile_without_fallback(name):
    info, samples = opinfo_samples(name, CASES[name])
    calls = compiled_samples.SampleCalls(info.op, samples)
    # as_strided at an absolute offset into a graph input falls back (see below)
    allowed = {"aten.as_strided.default"} if name.startswith("as_strided") else ()
    check_no_fallback(calls.fn, calls.tensors, allowed=allowed)


def _scatter_views(base, transposed, sliced, src2, src3):
    """as_strided_scatter into a contiguous, a transposed (dense, permuted), a sliced (offset,
    not dense) tensor, and an in-place write through a view (functionalization's form)."""
    out = [
        torch.as_strided_scatter(base, src2, (2, 3), (6, 2), 1),
        torch.as_strided_scatter(transposed, src2, (2, 3), (1, 5), 2),
        torch.as_strided_scatter(sliced, src3, (3,), (4,), 0),
    ]
    clone = base * 1
    clone[:, 0] = src3.sum()  # a 0-d tensor written into column 0: fill.Tensor + a scatter
    clone[1:, 2:] += 1  # through an offset view
    return out + [clone, base.t().as_strided((3, 2), (1, 3), 4), sliced.as_strided((2,), (2,))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_as_strided_scatter_strided_and_offset_inputs(dtype):
    g = torch.Generator().manual_seed(0)
    make = lambda *shape: (torch.randn(*shape, generator=g) * 10).to(dtype)  # noqa: E731
    grad = dtype.is_floating_point
    base = make(6, 5).requires_grad_(grad)
    transposed = make(5, 6).t().requires_grad_(False)
    sliced = make(4, 8)[1:, ::2]  # offset 8, strides (8, 2): clone makes it contiguous
    src2, src3 = make(2, 3).requires_grad_(grad), make(3).requires_grad_(grad)
    # the transposed and sliced ones as graph inputs keep their strides (detach, not clone)
    # the backward reads the tangent at an absolute storage offset (as_strided): a graph input's
    # offset is not in its meta value, so that one falls back (visibly, values still eager's)
    check_no_fallback(_scatter_views, [base, transposed, sliced, src2, src3],
                      allowed={"aten.as_strided.default"})


def test_empty_strided_then_filled():
    # empty_strided's strides matter to the views taken of it (autograd's grads of strided
    # inputs): the as_strided rules read them from the ATen graph (test_aten_layout.py)
    def fn(x, value):
        out = torch.empty_strided((3, 4), (1, 3))  # column-major
        out.fill_(value)
        return out + x

    compiled_samples.check(fn, [torch.randn(3, 4, requires_grad=True), torch.tensor(2.5)], "cpp")


def test_empty_strided():
    """The gradient of a minimum over a transposed input (autograd makes it with empty_strided
    and the input's strides): eager's values (fuzz seed 95)."""

    def fn(x0, x1):
        return torch.minimum(torch.log(x0.abs() + 0.01), x0) * x1

    g = torch.Generator().manual_seed(95)
    x0 = (torch.rand(1, 8, 7, generator=g) * 4 - 2).transpose(0, 2).requires_grad_()
    compiled_samples.check(fn, [x0, torch.rand(7, 1, 1, generator=g) * 4 - 2], "cpp")


def _aten_calls(compiled, op) -> list:
    """The calls of ATen overload ``op`` left in ``compiled``'s prims graphs (externs, fallbacks)."""
    return [n for entry in compiled.entries for g in entry.graphs
            for n in g.prims.graph.find_nodes(op="call_function", target=op)]  # fmt: skip


@pytest.mark.parametrize("groups, stride, padding, dilation, transposed", [
    (1, 16, 0, 1, False),  # a ViT's patch embedding
    (4, 1, 3, 1, False),  # depthwise with padding (ConvNeXt's 7x7)
    (2, 2, 1, 2, False),  # grouped, strided, dilated
    (2, 2, 1, 1, True),  # a transposed convolution (a decoder's upsampling)
])  # fmt: skip
def test_convolution_backward_is_one_extern(groups, stride, padding, dilation, transposed):
    """Its gradients match eager's, and the backward calls ``convolution_backward`` once, as
    Inductor does: no convolutions written in its place (cuDNN's swapped convolution of a
    depthwise layer is 100x slower than its own weight-gradient kernel)."""
    g = torch.Generator().manual_seed(0)
    k = 7 if groups == 4 else 3
    x = torch.randn(2, 4, 32, 32, generator=g, requires_grad=True)
    w = torch.randn(4 if transposed else 8, (8 if transposed else 4) // groups, k, k,
                    generator=g, requires_grad=True)  # fmt: skip
    b = torch.randn(8, generator=g, requires_grad=True)

    def fn(x, w, b):
        if transposed:
            return F.conv_transpose2d(x, w, b, stride, padding, 1, groups, dilation)
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    for inputs in ([x, w, b], [x.detach(), w, b]):  # pixels with no gradient: no grad_input
        compiled = compiled_samples.check(fn, inputs, "cpp")
        assert not compiled_samples.fallbacks(compiled)
        assert len(_aten_calls(compiled, torch.ops.aten.convolution_backward.default)) == 1
        assert len(_aten_calls(compiled, torch.ops.aten.convolution.default)) == 1  # the forward's


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_avg_pool2d_over_windows_that_tile_the_input(dtype):
    """DenseNet's transition (2, 2), ResNet-D's shortcut (ceil_mode, count_include_pad off), a
    3x3 window with rows left over (floor mode drops them), a divisor override, a 3-d input."""
    def fn(x, odd, c_hw):
        return [F.avg_pool2d(x, 2), F.avg_pool2d(x, 2, 2, ceil_mode=True, count_include_pad=False),
                F.avg_pool2d(odd, 3), F.avg_pool2d(odd, (2, 3), divisor_override=5),
                F.avg_pool2d(c_hw, 2)]

    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(2, 3, 8, 6, generator=g, dtype=dtype, requires_grad=True),
               torch.randn(1, 2, 10, 7, generator=g, dtype=dtype, requires_grad=True),
               torch.randn(3, 4, 4, generator=g, dtype=dtype, requires_grad=True)]
    compiled = compiled_samples.check(fn, tensors, "cpp")
    assert not {"aten.avg_pool2d.default", "aten.avg_pool2d_backward.default"} & set(
        compiled_samples.fallbacks(compiled))


def test_overlapping_avg_pool2d_falls_back_visibly():
    with pytest.warns(UserWarning, match="avg_pool2d"):
        ex = toycomp.explain(lambda a: F.avg_pool2d(a, 3, 1, 1), torch.randn(1, 2, 6, 6))
    assert "aten.avg_pool2d.default" in ex.fallbacks


@pytest.mark.parametrize("fn, args", [(torch.sin, (torch.randn(4, 5),)),
                                      (torch.add, (torch.randn(3), torch.randn(3)))])
def test_a_builtin_with_no_bytecode_is_compiled(fn, args):
    """``toycomp.compile(torch.sin)``: a C function has no bytecode to capture; it is called from
    a Python function that is captured instead (one graph, its kernel), not run eagerly."""
    compiled = toycomp.compile(fn)
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert compiled.eager_reason is None and len(compiled.entries) == 1
    assert compiled_samples.fallbacks(compiled) == []
