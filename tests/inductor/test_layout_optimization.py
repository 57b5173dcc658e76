"""Channels-last convolutions and outputs in eager's layout (toycomp/inductor/opt/
layout_optimization.py, the flag ``layout_optimization``). The pass runs on CUDA; ATen's CPU
convolutions take either layout, so these tests let it run on the CPU too (``DEVICES``) and
check what it plans there: the convolution's activations stored channels-last where they are
computed, its results planned so, a graph's outputs written in eager's layout by its kernels,
and every value and gradient as eager's, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import toycomp
from tests.prims import compiled_samples
from toycomp.inductor import ir
from toycomp.inductor.lowering import lower
from toycomp.inductor.opt import layout_optimization
from toycomp.inductor.opt.layout_optimization import channels_last_strides

aten = torch.ops.aten


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(layout_optimization, "DEVICES", {"cuda", "cpu"})


def depthwise(x, w):  # ConvNeXt's: a 7x7 filter a channel, its result read N, H, W, C
    return F.conv2d(torch.relu(x) * 2, w, padding=3, groups=x.shape[1]).permute(0, 2, 3, 1) + 1


def conv_externs(fn, *inputs, **flags):
    """The convolution ExternKernels of ``fn``'s forward, lowered with ``flags``."""
    compiled = toycomp.compile(fn, backend="cpp")
    compiled(*inputs)
    (graph,) = compiled.entries[0].graphs
    with toycomp.config.patch(**flags):
        lowered = lower(graph.prims, list(inputs))
    return [n for n in lowered.nodes if isinstance(n, ir.ExternKernel) and "convolution" in n.kernel]


BF16 = torch.bfloat16


def test_depthwise_convolution_reads_and_writes_channels_last(on_cpu):
    x, w = torch.randn(2, 8, 10, 10, dtype=BF16), torch.randn(8, 1, 7, 7, dtype=BF16)
    (conv,) = conv_externs(depthwise, x, w)
    assert conv.args[0].stride == channels_last_strides((2, 8, 10, 10))  # stored so, not copied
    assert conv.stride == channels_last_strides((2, 8, 10, 10))
    (conv,) = conv_externs(depthwise, x, w, layout_optimization=False)
    assert conv.args[0].stride == (800, 100, 10, 1) == conv.stride


def test_only_in_half_precision_where_the_graph_is_channels_last_around_it(on_cpu, monkeypatch):
    x, w = torch.randn(2, 8, 10, 10, dtype=BF16), torch.randn(8, 1, 7, 7, dtype=BF16)
    (conv,) = conv_externs(lambda x, w: F.conv2d(x * 2, w, groups=8) + 1, x, w)  # read NCHW
    assert conv.args[0].stride == (800, 100, 10, 1)
    (conv,) = conv_externs(depthwise, x.float(), w.float())  # fp32: as it was
    assert conv.args[0].stride == (800, 100, 10, 1)
    monkeypatch.setattr(layout_optimization, "DEVICES", {"cuda"})
    (conv,) = conv_externs(depthwise, x, w)  # the CPU: as it was
    assert conv.args[0].stride == (800, 100, 10, 1)


def test_an_input_already_in_memory_is_copied_once_for_two_convolutions(on_cpu):
    def fn(x, w, v):
        return (F.conv2d(x, w, padding=1, groups=8).permute(0, 2, 3, 1),
                F.conv2d(x, v, padding=1, groups=8).permute(0, 2, 3, 1))

    x, w, v = (torch.randn(s, dtype=BF16) for s in [(2, 8, 6, 6), (8, 1, 3, 3), (16, 1, 3, 3)])
    a, b = conv_externs(fn, x, w, v)
    assert a.args[0] == b.args[0] and a.args[0].stride == channels_last_strides((2, 8, 6, 6))


@pytest.mark.parametrize("groups, dtype", [
    (8, torch.bfloat16),  # depthwise
    (2, torch.bfloat16),  # grouped, strided
    (1, torch.float16),
])  # fmt: skip
def test_values_and_gradients_match_eager(on_cpu, monkeypatch, groups, dtype):
    """Two ConvNeXt blocks, forward and backward: each convolution reads and writes
    channels-last, forward and backward, and every value and gradient is eager's."""
    g = torch.Generator().manual_seed(0)
    stride = 2 if groups == 2 else 1
    x = torch.randn(2, 8, 12, 12, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(8, 8 // groups, 3, 3, generator=g) / 3).to(dtype).requires_grad_()
    fc = (torch.randn(8, 8, generator=g) / 3).to(dtype).requires_grad_()

    def block(x, w, fc):
        for s in (stride, 1):
            y = F.conv2d(x, w, stride=s, padding=1, groups=groups).permute(0, 2, 3, 1)
            y = F.gelu(F.layer_norm(y, (8,)) @ fc).permute(0, 3, 1, 2)
            x = y + (x if s == 1 else x[:, :, ::s, ::s])
        return x

    planned = []
    use = layout_optimization.use_channels_last
    monkeypatch.setattr(layout_optimization, "use_channels_last",
                        lambda g, node: planned.append(node.target) or use(g, node))
    compiled = compiled_samples.check(block, [x, w, fc], "cpp", rtol=2e-2, atol=2e-2)
    assert not compiled_samples.fallbacks(compiled)
    assert planned.count(aten.convolution.default) == 2
    assert planned.count(aten.convolution_backward.default) == 2


def _grads(fn, inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = fn(*inputs)
    return out, torch.autograd.grad(out.sum(), inputs)


# Outputs whose eager layout differs from the one lowering gives them: attention's saved
# ``.contiguous()`` of a transpose (which lowering keeps as a view of the matmul's result), a
# value eager lays out transposed (``x.t() / s``), a user's ``.t().contiguous()``, a permuted
# copy, a chunk of a matmul's result.
EAGER_LAYOUT_PROGRAMS = {
    "saved_transpose_contiguous": (
        lambda q, k: ((q @ k).transpose(1, 2).contiguous().view(2, 5, 12) ** 2).sum(),
        [(2, 3, 5, 4), (2, 3, 4, 4)]),
    "transpose_scaled": (lambda x: x.t() / x.sum(1), [(6, 5)]),
    "t_contiguous": (lambda x, y: (x @ y).t().contiguous(), [(4, 6), (6, 5)]),
    "permuted_output": (lambda x, y: (x + y).permute(2, 0, 1).contiguous(),
                        [(2, 3, 4), (2, 3, 4)]),
    "chunk_of_a_result": (lambda x, y: (x @ y)[:, :3].contiguous().t(), [(4, 6), (6, 5)]),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", list(EAGER_LAYOUT_PROGRAMS))
def test_outputs_in_eager_layout_are_written_by_kernels(on_cpu, backend, name):
    fn, shapes = EAGER_LAYOUT_PROGRAMS[name]
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=gen) for s in shapes]
    restrides = {}
    for flag in (False, True):
        with toycomp.config.patch(layout_optimization=flag):
            out, grads = _grads(toycomp.compile(fn, backend=backend), inputs)
            explanation = toycomp.explain(fn, *[t.detach().requires_grad_() for t in inputs],
                                          backend=backend)  # fmt: skip
        want_out, want_grads = _grads(fn, inputs)
        torch.testing.assert_close(out, want_out)
        assert out.stride() == want_out.stride()
        for g, w in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(g, w)
        sources = "\n".join(g.compiled.wrapper_source for g in explanation.entry.graphs)
        restrides[flag] = sources.count("restride(")
    assert restrides[True] == 0, restrides


def test_an_output_eager_lays_out_transposed_is_computed_in_one_kernel(on_cpu):
    fn = EAGER_LAYOUT_PROGRAMS["transpose_scaled"][0]
    x = torch.randn(6, 5)
    with toycomp.config.patch(layout_optimization=True):
        fused = toycomp.explain(fn, x, backend="cpp")
    with toycomp.config.patch(layout_optimization=False):
        plain = toycomp.explain(fn, x, backend="cpp")
    # the sum of row j, then row j divided by it: one kernel over x's rows, no copy after
    assert (len(fused.kernels), len(plain.kernels)) == (1, 2)
    assert "restride(" in plain.entry.graphs[0].compiled.wrapper_source
