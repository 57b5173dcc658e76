"""Split reductions and outer-reduction tiles on the Triton backend (split_reduction.py,
triton_heuristics.py), run by Triton's interpreter on CPU tensors.

Eager PyTorch is the oracle for values and gradients; the structural checks read the lowered
and scheduled graphs that ``toycomp.explain`` keeps, and the generated launch lines.
"""

from __future__ import annotations

import pytest
import sympy
import torch

import toycomp
from toycomp.inductor import ir
from toycomp.inductor.codegen import triton_heuristics
from toycomp.inductor.codegen.common import IndexPrinter
from toycomp.inductor.codegen.cpp import CppPrinter
from toycomp.inductor.indexing import index_bounds, index_vars, r, size_symbol, x
from toycomp.inductor.scheduler import schedule
from toycomp.inductor.opt.split_reduction import (
    ReductionHint,
    node_hint,
    num_splits,
    split_reduction,
    split_reductions,
)
from toycomp.inductor.wrapper import compile_graph

F32 = torch.float32
RTOL, ATOL = 1e-4, 1e-5


def nan_columns(rows: int, cols: int) -> torch.Tensor:
    t = torch.randn(rows, cols)
    t[rows - 1, 0] = float("nan")  # in the last chunk
    t[min(3, rows - 1), cols - 1] = float("nan")  # in the first
    return t


def check_values(fn, *inputs, rtol=RTOL, atol=ATOL):
    out = toycomp.compile(fn, backend="triton")(*inputs)
    torch.testing.assert_close(out, fn(*inputs), rtol=rtol, atol=atol, equal_nan=True)


CASES = {  # name: (fn, make inputs)
    "column sum": (lambda t: t.sum(0), lambda: [torch.randn(1024, 37)]),
    "column mean": (lambda t: t.mean(0), lambda: [torch.randn(512, 24)]),
    "long rows": (lambda t: t.sum(1), lambda: [torch.randn(3, 16384)]),
    "whole sum": (lambda t: t.sum(), lambda: [torch.randn(128, 96)]),
    "amax NaN": (lambda t: t.amax(0), lambda: [nan_columns(768, 8)]),
    "amin NaN": (lambda t: t.amin(0), lambda: [nan_columns(768, 8)]),
    "int32 sum": (lambda t: t.sum(0), lambda: [torch.randint(-9, 9, (1024, 5), dtype=torch.int32)]),
    "int64 amax": (lambda t: t.amax(0), lambda: [torch.randint(-99, 99, (512, 6))]),
    "prime rows": (lambda t: t.sum(0), lambda: [torch.randn(1031, 8)]),  # ragged chunks
    "prime rows amax NaN": (lambda t: t.amax(0), lambda: [nan_columns(1031, 8)]),
    "prime rows amin NaN": (lambda t: t.amin(0), lambda: [nan_columns(1031, 8)]),
    "prime rows int32 sum": (
        lambda t: t.sum(0), lambda: [torch.randint(-9, 9, (1031, 5), dtype=torch.int32)]
    ),
    "prime rows int64 amin": (lambda t: t.amin(0), lambda: [torch.randint(-99, 99, (1031, 6))]),
    "prime long rows": (lambda t: t.sum(1), lambda: [torch.randn(3, 16411)]),
    "prime batch_norm dims": (lambda t: t.sum((0, 2)), lambda: [torch.randn(131, 4, 17)]),
    "size 1": (lambda t: t.sum(0), lambda: [torch.randn(1, 4096)]),
    "size 0": (lambda t: t.sum(0), lambda: [torch.randn(0, 8)]),
    "no outputs": (lambda t: t.sum(0), lambda: [torch.randn(16384, 0)]),
    "no outputs amax": (lambda t: t.amax(1), lambda: [torch.randn(0, 9000)]),
    "softmax dim 0": (lambda t: t.softmax(0), lambda: [torch.randn(600, 8)]),
}


@pytest.mark.parametrize("name", CASES)
def test_values_match_eager(name):
    fn, make = CASES[name]
    check_values(fn, *make())


def test_bfloat16_sum_keeps_fp32_partials():
    ((i0,), (r0,)) = index_vars("i", 1), index_vars("r", 1)
    body = ir.Load("a", i0 + 16 * r0, torch.bfloat16)
    node = ir.Reduction("buf0", (16,), (1024,), ir.ReductionType.SUM, torch.bfloat16, body)
    partial, final = split_reduction(node, *num_splits(node))
    assert (partial.dtype, final.dtype, final.body.dtype) == (F32, torch.bfloat16, F32)
    check_values(lambda t: t.sum(0), torch.randn(1024, 16).bfloat16(), rtol=1e-2, atol=1e-2)


def values_and_grads(fn, inputs):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*inputs)
    tangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * tangent).sum().backward()
    return [out.detach()] + [t.grad for t in inputs]


def layer_norm(t, w, b):
    return torch.nn.functional.layer_norm(t, t.shape[-1:], w, b)


def batch_norm_affine(t, w, b):  # training-mode statistics over (N, H, W), per channel
    mean = t.mean((0, 2, 3), keepdim=True)
    var = ((t - mean) ** 2).mean((0, 2, 3), keepdim=True)
    return (t - mean) / torch.sqrt(var + 1e-5) * w[:, None, None] + b[:, None, None]


GRAD_CASES = {
    "layer_norm": (layer_norm, lambda: [torch.randn(1024, 24), torch.randn(24), torch.randn(24)]),
    "batch_norm": (
        batch_norm_affine,
        lambda: [torch.randn(16, 4, 8, 8), torch.randn(4), torch.randn(4)],
    ),
    "linear bias": (
        lambda t, w, b: t @ w + b,
        lambda: [torch.randn(1024, 8), torch.randn(8, 16), torch.randn(16)],
    ),
}


@pytest.mark.parametrize("name", GRAD_CASES)
def test_weight_and_bias_gradients_match_eager(name):
    fn, make = GRAD_CASES[name]
    inputs = make()
    got = values_and_grads(toycomp.compile(fn, backend="triton"), inputs)
    expected = values_and_grads(fn, inputs)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=RTOL, atol=1e-4)


def test_layer_norm_weight_gradient_is_split_with_its_producer_fused():
    inputs = [torch.randn(1024, 24), torch.randn(24), torch.randn(24)]
    inputs = [t.requires_grad_(True) for t in inputs]
    backward = toycomp.explain(layer_norm, *inputs, backend="triton").graph("backward")
    partials = [n for n in backward.lowered.nodes if n.name.endswith("_split")]
    assert len(partials) == 2  # weight and bias gradients
    weight = next(n for n in partials if "mul" in repr(n.body))  # grad * xhat, fused
    assert weight.size[1:] == (24,) and weight.size[0] > 1
    # both partial sums in one kernel, in ONE pass over r (the gradient is read once): the
    # row kernel's first pass, beside its row sums ([Note: mix-order reductions])
    (kernel,) = [k for k in backward.scheduled.steps if weight.name in k.writes()]
    first = next(loop for loop in kernel.loops if loop.over_r)
    partial_sums = [s for s in first.body if isinstance(s, ir.ColumnReduce)]
    assert {s.buffer for s in partial_sums} == {p.name for p in partials}, kernel


def test_column_sum_is_two_kernels_with_a_wide_tile():
    t = torch.randn(1024, 96)
    graph = toycomp.explain(lambda t: t.sum(0), t, backend="triton").graph("forward")
    partial_kernel, finish = graph.scheduled.steps
    splits = graph.lowered.nodes[0].size[0]
    assert (partial_kernel.numel, partial_kernel.rnumel) == (splits * 96, 1024 // splits)
    assert (finish.numel, finish.rnumel) == (96, splits)
    call = graph.compiled.kernels[0].call
    assert "XBLOCK=64, RBLOCK=8" in call, call  # 64 neighbouring columns, 8 rows a step


def test_cpp_backend_is_unchanged():
    t = torch.randn(1024, 96)
    graph = toycomp.explain(lambda t: t.sum(0), t, backend="cpp").graph("forward")
    assert [n.name for n in graph.lowered.nodes] == ["buf0"]
    lowered = toycomp.explain(lambda t: t.sum(0), t, backend="triton").graph("forward").lowered
    assert split_reductions(lowered, "cpp") is lowered


def test_when_not_to_split():
    def reduction(size, rsize, body, dtype=F32):
        return ir.Reduction("buf0", size, rsize, ir.ReductionType.SUM, dtype, body)

    ((i0,), (r0,)) = index_vars("i", 1), index_vars("r", 1)
    column = ir.Load("a", i0 + 96 * r0, F32)
    assert node_hint(reduction((96,), (4096,), column)) == ReductionHint.OUTER
    assert num_splits(reduction((96,), (4096,), column)) is not None
    assert num_splits(reduction((96,), (4096,), column, torch.bool)) is None
    assert num_splits(reduction((65536,), (4096,), column)) is None  # enough programs
    row = ir.Load("a", 4096 * i0 + r0, F32)
    assert node_hint(reduction((96,), (4096,), row)) == ReductionHint.INNER
    assert num_splits(reduction((96,), (4096,), row)) is None  # a short row: one kernel


def test_outer_tile_without_a_split():
    """Many columns (no split needed) still get the wide tile, and it is looped."""
    load = ir.Load("a", 5000 * r + x, F32)
    loops = (ir.Loop(True, (ir.Reduce("acc", ir.ReductionType.SUM, load, F32),)),)
    kernel = ir.Kernel("kernel_0", 5000, 300, loops, (("a", F32),), ())
    assert triton_heuristics.kernel_hint(kernel) == ReductionHint.OUTER
    blocks = triton_heuristics.block_sizes(kernel)
    assert blocks["XBLOCK"] == 64 and blocks["RBLOCK"] < 300


def test_ragged_split_clamps_the_rows_and_drops_those_past_the_end():
    ((i0,), (r0,)) = index_vars("i", 1), index_vars("r", 1)
    node = ir.Reduction(
        "buf0", (96,), (4099,), ir.ReductionType.MAX, F32, ir.Load("a", i0 + 96 * r0, F32)
    )
    dim, splits, hint = num_splits(node)  # 4099 is prime: no exact chunks, ragged ones
    partial, final = split_reduction(node, dim, splits, hint)
    chunk = -(-4099 // splits)
    assert partial.reduction_size == (chunk,) and chunk * (splits - 1) < 4099 < chunk * splits
    assert partial.body.name == "where" and partial.body.args[2].value == float("-inf")
    (load,) = [e for e in ir.walk(partial.body) if isinstance(e, ir.Load)]
    assert any(isinstance(e, sympy.Min) for e in sympy.preorder_traversal(load.index))
    t = nan_columns(4099, 96)
    check_values(lambda t: t.amax(0), t)


def test_exact_splits_are_unchanged():
    t = torch.randn(1024, 96)
    graph = toycomp.explain(lambda t: t.sum(0), t, backend="triton").graph("forward")
    assert "Min" not in repr(graph.lowered) and "where" not in repr(graph.lowered)


DYNAMIC_BATCHES = (300, 17, 2, 1, 4096 + 3, 64)
DYNAMIC_CASES = {  # name: (fn, make inputs at batch n)
    "column sum": (lambda t: t.sum(0), lambda n: [torch.randn(n, 40)]),
    "amax NaN": (lambda t: t.amax(0), lambda n: [nan_columns(n, 8)]),
    "amin NaN": (lambda t: t.amin(0), lambda n: [nan_columns(n, 8)]),
    "int32 sum": (lambda t: t.sum(0), lambda n: [torch.randint(-9, 9, (n, 5), dtype=torch.int32)]),
    "int64 amax": (lambda t: t.amax(0), lambda n: [torch.randint(-99, 99, (n, 6))]),
}


def dynamically(fn, how: str, first: list):
    """``fn`` compiled for sizes that change: ``dynamic=True``, or dim 0 marked dynamic."""
    if how == "mark_dynamic":
        for t in first:
            toycomp.mark_dynamic(t, 0)
        return toycomp.compile(fn, backend="triton")
    return toycomp.compile(fn, backend="triton", dynamic=True)


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
@pytest.mark.parametrize("name", DYNAMIC_CASES)
def test_dynamic_sizes_match_eager(name, how):
    fn, make = DYNAMIC_CASES[name]
    first = make(1024)
    compiled = dynamically(fn, how, first)
    for inputs in [first] + [make(n) for n in DYNAMIC_BATCHES]:
        torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=RTOL, atol=1e-4,
                                   equal_nan=True)  # fmt: skip
    assert compiled.compile_count <= 2  # the symbolic graph, and batch 1 (always specialised)


@pytest.mark.parametrize("how", ["dynamic=True", "mark_dynamic"])
def test_dynamic_layer_norm_gradients_match_eager(how):
    make = lambda n: [torch.randn(n, 24), torch.randn(24), torch.randn(24)]  # noqa: E731
    first = make(1024)
    compiled = dynamically(layer_norm, how, first)
    for inputs in [first] + [make(n) for n in DYNAMIC_BATCHES]:
        got, expected = values_and_grads(compiled, inputs), values_and_grads(layer_norm, inputs)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=RTOL, atol=1e-4)


def test_dynamic_sizes_are_split_into_ragged_chunks():
    inputs = [torch.randn(1024, 24), torch.randn(24), torch.randn(24)]
    inputs = [t.requires_grad_(True) for t in inputs]
    explained = toycomp.explain(layer_norm, *inputs, backend="triton", dynamic=True)
    backward = explained.graph("backward")
    partials = [n for n in backward.lowered.nodes if n.name.endswith("_split")]
    assert len(partials) == 2 and all("Min(s" in repr(n.body) for n in partials)  # w and b
    source = "".join(k.source for k in backward.compiled.kernels)
    assert "tl.minimum(" in source


def test_dynamic_splits_follow_the_example_sizes():
    """The symbols' example values choose ``splits``, so it is the static graph's choice."""
    t, fn = torch.randn(2048, 64), lambda t: t.sum(0)
    static = toycomp.explain(fn, t, backend="triton").graph("forward").lowered
    dynamic = toycomp.explain(fn, t, backend="triton", dynamic=True).graph("forward").lowered
    splits = static.nodes[0].size[0]
    assert dynamic.nodes[0].size[0] == splits and "Min(s0 - 1" in repr(dynamic.nodes[0])
    ((i0,), (r0,)), (s0, s1) = (index_vars("i", 1), index_vars("r", 1)), map(size_symbol, (0, 1))
    body = ir.Load("a", i0 + s1 * r0, F32)
    node = ir.Reduction("buf0", (s1,), (s0,), ir.ReductionType.SUM, F32, body)
    assert num_splits(node, {s0: 2048, s1: 64})[1] == splits
    assert num_splits(node)[1] != splits  # without hints: every size taken as SIZE_GUESS


def test_min_prints_in_both_languages_and_bounds_an_index():
    s0 = size_symbol(0)
    index = 96 * sympy.Min(r + 16 * x, s0 - 1) + 5
    assert "tl.minimum(s0 - 1, " in IndexPrinter().doprint(index)
    assert "std::min<int64_t>(s0 - 1, " in CppPrinter().doprint(index)
    assert index_bounds(index, {x: 8, r: 1000}) == (5, 96 * s0 - 91)
    assert index_bounds(sympy.Max(r, 7), {r: 1000}) == (7, 999)


def test_cpp_backend_runs_a_ragged_split():
    """The C++ backend never splits, but a graph holding Min still compiles and runs there."""
    t = torch.randn(1031, 8)
    lowered = toycomp.explain(lambda t: t.sum(0), t, backend="triton").graph("forward").lowered
    assert "Min" in repr(lowered)
    compiled = compile_graph(schedule(lowered), "cpp")
    (out,) = compiled([t])
    assert "std::min<int64_t>(" in compiled.kernels[0].source
    torch.testing.assert_close(out, t.sum(0), rtol=RTOL, atol=ATOL)
