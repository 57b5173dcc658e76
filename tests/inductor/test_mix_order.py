"""Mix-order reductions: a column sum fused into the kernel of a row reduction over the same
rows ([Note: mix-order reductions] in split_reduction.py), checked against eager on Triton's
interpreter, against the IR interpreter, and for what it must leave alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import toycomp
from toycomp.inductor import ir
from toycomp.inductor.interpret import run_scheduled
from toycomp.inductor.opt.split_reduction import MIX_ORDER_ROWS

RTOL, ATOL = 1e-4, 1e-4


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def row_and_column_sums(x):
    return x.exp().sum(1), (x * 2).sum(0)


def mixed_kernels(graph) -> list[ir.Kernel]:
    return [k for k in graph.scheduled.steps if getattr(k, "rows_per_program", 0)]


def training_step(fn, inputs, backend="triton"):
    """Outputs and gradients of ``fn`` (compiled with ``backend``, or eager if None)."""
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    run = fn if backend is None else toycomp.compile(fn, backend=backend)
    out = run(*inputs)
    torch.manual_seed(1)
    out.backward(torch.randn_like(out))
    return [out.detach(), *[t.grad for t in inputs if t.requires_grad]]


CASES = {  # name: (fn, input sizes): rows 256 (16 a program), 200 (8), 100 (4), 3-D
    "layer_norm": (layer_norm, [(256, 96), (96,), (96,)]),
    "layer_norm 200 rows": (layer_norm, [(200, 64), (64,), (64,)]),
    "layer_norm 100 rows": (layer_norm, [(100, 64), (64,), (64,)]),
    "layer_norm batch x time": (layer_norm, [(4, 48, 32), (32,), (32,)]),
    "rms_norm": (rms_norm, [(128, 80), (80,)]),
    "layer_norm wide rows": (layer_norm, [(64, 1000), (1000,), (1000,)]),  # 4 rows a step
}


@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_eager(name):
    fn, sizes = CASES[name]
    torch.manual_seed(0)
    inputs = [torch.randn(s) for s in sizes]
    backward = toycomp.explain(fn, *[t.requires_grad_() for t in inputs], backend="triton")
    (kernel,) = mixed_kernels(backward.graph("backward"))  # the case is what it is named
    assert kernel.rows_per_program in (4, 8, 16)
    got, want = training_step(fn, inputs), training_step(fn, inputs, backend=None)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


def test_a_row_and_a_column_sum_of_one_input_share_a_pass():
    torch.manual_seed(0)
    x = torch.randn(512, 40)
    graph = toycomp.explain(row_and_column_sums, x, backend="triton").graph("forward")
    (kernel,) = mixed_kernels(graph)
    assert kernel.reads().count("primals_1") == 1 and len(graph.scheduled.steps) == 2
    partial = next(s for s in kernel.stores() if isinstance(s, ir.ColumnReduce))
    assert partial.buffer in kernel.writes()
    want = row_and_column_sums(x)
    for got in (toycomp.compile(row_and_column_sums, backend="triton")(x),
                run_scheduled(graph.scheduled, [x])):  # fmt: skip
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


def test_the_generated_kernel_takes_rows_per_program():
    x = torch.randn(256, 96)
    graph = toycomp.explain(row_and_column_sums, x, backend="triton").graph("forward")
    (kernel,) = mixed_kernels(graph)
    generated = next(k for k in graph.compiled.kernels if k.name == kernel.name)
    rows = kernel.rows_per_program
    assert f"RSPLIT={rows}" in generated.call and f"[({256 // rows},)]" in generated.call
    assert "for xstep in range(0, RSPLIT, XBLOCK):" in generated.source
    assert generated.configs == (dict(generated.configs[0]),)  # nothing to autotune
    assert rows == MIX_ORDER_ROWS[0]  # 256 rows: fewer programs than the target, at least 16


UNARY = {"exp": torch.exp, "sin": torch.sin, "tanh": torch.tanh, "abs": torch.abs}


@pytest.mark.parametrize("seed", range(8))
def test_random_row_and_column_reductions_match_eager(seed):
    """Random shapes and bodies: row sums or means, their use in the rows, column sums of
    other products of the same input, with and without keepdim."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    rows, cols = pick([12, 24, 48, 64, 100, 256]), pick([3, 17, 130, 600, 2000])
    f, h = pick(list(UNARY.values())), pick(list(UNARY.values()))
    mean, keep = pick([True, False]), pick([True, False])

    def fn(x, w):
        y = f(x) * w
        row = y.mean(1, keepdim=True) if mean else y.sum(1, keepdim=True)
        col = (y * h(x)).sum(0, keepdim=keep)
        return y - row, col, x.sum(0) * 0.5

    x, w = torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)
    graph = toycomp.explain(fn, x, w, backend="triton").graph("forward")
    assert mixed_kernels(graph), graph.scheduled
    for got, want in zip(toycomp.compile(fn, backend="triton")(x, w), fn(x, w), strict=True):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "fn, size",
    [
        (lambda x: (x.sum(1), x.sum(0)), (97, 64)),  # prime rows: no exact chunk of >= 4
        (lambda x: (x.sum(1), x.sum(0)), (64, 5000)),  # rows too long to hold in registers
        (lambda x: (x.amax(1), x.amax(0)), (256, 64)),  # max: the ordinary split
        (lambda x: x.sum(0), (256, 64)),  # no row reduction to share
        (lambda x: (x.sum(1), x.sum(0)), (256, 1)),  # one column
    ],
    ids=["prime rows", "long rows", "amax", "column sum alone", "one column"],
)
def test_what_stays_unmixed_is_still_right(fn, size):
    torch.manual_seed(0)
    x = torch.randn(size)
    graph = toycomp.explain(fn, x, backend="triton").graph("forward")
    assert not mixed_kernels(graph)
    assert not any(getattr(n, "mix_order_rows", 0) for n in graph.lowered.nodes)
    for g, w in zip(toycomp.compile(fn, backend="triton")(x), fn(x), strict=True):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


def test_the_cpp_backend_keeps_its_kernels():
    x = torch.randn(256, 96)
    graph = toycomp.explain(row_and_column_sums, x, backend="cpp").graph("forward")
    assert not mixed_kernels(graph)
    for g, w in zip(toycomp.compile(row_and_column_sums, backend="cpp")(x),
                    row_and_column_sums(x), strict=True):  # fmt: skip
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


def test_dynamic_sizes_keep_the_ordinary_split():
    x = torch.randn(256, 96)
    explanation = toycomp.explain(row_and_column_sums, x, backend="triton", dynamic=True)
    assert not mixed_kernels(explanation.graph("forward"))
    compiled = toycomp.compile(row_and_column_sums, backend="triton", dynamic=True)
    for rows in (256, 200):
        y = torch.randn(rows, 96)
        for g, w in zip(compiled(y), row_and_column_sums(y), strict=True):
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


def test_half_precision_partials_accumulate_in_float32():
    torch.manual_seed(0)
    inputs = [torch.randn(256, 64), torch.randn(64), torch.randn(64)]
    half = [t.half() for t in inputs]
    graph = toycomp.explain(layer_norm, *[t.requires_grad_() for t in half], backend="triton")
    (kernel,) = mixed_kernels(graph.graph("backward"))
    partials = [s for s in kernel.stores() if isinstance(s, ir.ColumnReduce)]
    assert partials and all(s.dtype == torch.float32 for s in partials)
    got = training_step(layer_norm, half)
    want = training_step(layer_norm, inputs, backend=None)  # fp32 eager: the exact answer
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float16
        torch.testing.assert_close(g.float(), w, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["layer_norm", "layer_norm batch x time", "rms_norm"])
def test_cuda_values_and_gradients_match_eager(name):
    fn, sizes = CASES[name]
    torch.manual_seed(0)
    inputs = [torch.randn(s, device="cuda") for s in sizes]
    got, want = training_step(fn, inputs), training_step(fn, inputs, backend=None)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)
