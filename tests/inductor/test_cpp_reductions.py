"""C++ reductions in both layouts equal eager (issue 9: column reductions, parallel reductions).

See [Note: row and column reductions] and [Note: summing in blocks] in
toycomp/inductor/codegen/cpp_reduction.py, [Note: one pass for sibling reductions] in
cpp_layout.py, [Note: a row's costly values, kept] in cpp_row_buffers.py. Eager is the oracle
for values and gradients; the sizes are odd (no multiple of a vector width or of XBLOCK /
RBLOCK), empty, or one long, and some are symbolic.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import toycomp
from toycomp.inductor import ir
from toycomp.inductor.codegen import cpp, cpp_reduction
from toycomp.inductor.opt import cpp_layout
from toycomp.inductor.lowering import lower
from toycomp.inductor.scheduler import schedule
from toycomp.inductor.wrapper import compile_graph
from toycomp.prims.decompositions import decompose

RTOL, ATOL = 1e-4, 1e-5


def compiled_kernels(fn, *args) -> list[ir.Kernel]:
    graph = toycomp.explain(fn, *args).graph("forward")
    return [s for s in graph.scheduled.steps if isinstance(s, ir.Kernel)]


def check(fn, *args, backward: bool = False, **tolerance):
    """Compiled values (and gradients of every float input) equal eager's."""
    tolerance = tolerance or {"rtol": RTOL, "atol": ATOL}
    leaves = [a.detach().requires_grad_(backward and a.is_floating_point()) for a in args]
    got = toycomp.compile(fn, backend="cpp")(*leaves)
    want = fn(*args)
    torch.testing.assert_close(got, want, equal_nan=True, **tolerance)
    if backward:
        grads = [a for a in leaves if a.requires_grad]
        grad_out = torch.randn_like(want)
        got_grads = torch.autograd.grad(got, grads, grad_out)
        refs = [a.detach().requires_grad_(a.requires_grad) for a in leaves]
        want_grads = torch.autograd.grad(fn(*refs), [r for r in refs if r.requires_grad], grad_out)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, **tolerance)


# --- the layout decision, pinned on the generated C++ ------------------------------------------
def test_column_sum_walks_rows_outside_a_vector_loop_over_outputs():
    """``x.sum(0)``: tiles of XBLOCK outputs, the r loop outside the vectorised tile loop."""
    (kernel,) = compiled_kernels(lambda a: a.sum(0), torch.randn(300, 517))
    assert cpp_layout.use_column_layout(kernel)
    source = cpp.generate(kernel).source
    body = source[source.index('extern "C"') :]
    assert f"x0 += {cpp_reduction.XBLOCK}" in body
    r_loop, tile_loop = body.index("for (int64_t rindex"), body.index("for (int64_t xi = 0; xi <")
    assert body.index("for (int64_t r0") < r_loop
    assert r_loop < body.index("#pragma omp simd\n", r_loop) < body.index("xi++)\n", r_loop)
    assert "reduction(" not in body  # no OpenMP reduction clause: one accumulator per output
    assert tile_loop < r_loop  # the accumulators' initialisation comes first


def test_row_reductions_stay_row_major():
    """A softmax reads rows contiguously: r stays the inner, vectorised loop."""
    (kernel,) = compiled_kernels(lambda a: torch.softmax(a, -1), torch.randn(300, 517))
    assert not cpp_layout.use_column_layout(kernel)
    body = cpp.generate(kernel).source.split('extern "C"')[-1]
    assert "reduction(max_nan:amax" in body and "reduction(+:sum" in body


def test_layer_norm_weight_and_bias_gradients_share_one_pass():
    """The two column sums of LayerNorm's backward read the incoming gradient once."""
    x, w, b = (torch.randn(*s, requires_grad=True) for s in [(40, 24), (24,), (24,)])
    graph = toycomp.explain(lambda x, w, b: F.layer_norm(x, (24,), w, b), x, w, b).graph(
        "backward"
    )
    kernels = [s for s in graph.scheduled.steps if isinstance(s, ir.Kernel)]
    column = [k for k in kernels if cpp_layout.use_column_layout(k)]
    assert len(column) == 1
    merged = cpp_layout.merge_reduction_loops(column[0])
    r_loops = [loop for loop in merged.loops if loop.over_r]
    assert len(r_loops) == 1 and sum(isinstance(s, ir.Reduce) for s in r_loops[0].body) == 2


# --- values and gradients ----------------------------------------------------------------------
SHAPES = [(300, 517), (1, 7), (7, 1), (1, 1), (129, 3), (3, 129), (0, 5), (5, 0)]


@pytest.mark.parametrize("shape", SHAPES)
def test_column_row_and_whole_sums(shape):
    a = torch.randn(*shape)
    check(lambda a: (a.sum(0), a.sum(1), a.sum()), a)


def test_long_column_sum_is_accurate():
    """4096 rows: a single float accumulator per column would be off by ~5e-4 (see [Note:
    summing in blocks]); the blocked sum stays within the tests' tolerance of eager."""
    torch.manual_seed(0)
    check(lambda a: a.sum(0), torch.randn(4096, 300))


def test_whole_sum_over_many_elements_runs_in_parallel_and_matches():
    torch.manual_seed(0)
    check(lambda a: a.sum(), torch.randn(1 << 20), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dim", [0, 1])
def test_max_and_min_propagate_nan(dim):
    a = torch.randn(261, 67)
    a[5, 3] = float("nan")
    a[7, 10] = float("inf")
    a[9, 11] = -float("inf")
    check(lambda a: (a.amax(dim), a.amin(dim), a.max(dim).values), a)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_reductions(dtype):
    a = torch.randint(-50, 50, (133, 71)).to(dtype)
    check(lambda a: (a.sum(0), a.sum(1), a.amax(0), a.amin(1)), a)


def test_bool_any_all_over_columns():
    a = torch.rand(133, 71) > 0.99
    check(lambda a: (a.any(0), a.all(0), a.any(1)), a)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_column_sums_accumulate_in_float(dtype):
    a = torch.randn(257, 131).to(dtype)
    check(lambda a: (a.sum(0), a.float().sum(0)), a, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("shape", [(33, 517), (300, 7)])
def test_softmax_values_and_gradients(shape):
    check(lambda a: torch.softmax(a, -1), torch.randn(*shape), backward=True)
    check(lambda a: torch.softmax(a, 0), torch.randn(*shape), backward=True)


@pytest.mark.parametrize("shape", [(67, 300), (300, 5)])
def test_layer_norm_weight_and_bias_gradients(shape):
    x, w, b = torch.randn(*shape), torch.randn(shape[-1]), torch.randn(shape[-1])
    check(lambda x, w, b: F.layer_norm(x, shape[-1:], w, b), x, w, b, backward=True)


def test_bias_gradient_of_a_linear_layer():
    x, w, b = torch.randn(301, 40), torch.randn(24, 40), torch.randn(24)
    check(lambda x, w, b: torch.tanh(F.linear(x, w, b)), x, w, b, backward=True)


def test_column_reduction_with_a_transcendental_body():
    check(lambda a: (torch.exp(a).sum(0), torch.sin(a).amax(0)), torch.randn(77, 301))


# --- a vector tail (see [Note: a vector tail] in cpp_reduction.py) ------------------------------
def test_a_row_loop_calling_exp_is_split_at_a_multiple_of_the_vector_width():
    """Rows of 1000: the loop computing exp runs over 992, then over the last 8; the max loop
    and the store loop call no SIMD function, so GCC vectorises their tails by itself."""
    (kernel,) = compiled_kernels(lambda a: torch.softmax(a, -1), torch.randn(8, 1000))
    body = cpp.generate(kernel).source.split('extern "C"')[-1]
    assert "rindex = 0; rindex < 992;" in body and "rindex = 992; rindex < 1000;" in body
    assert body.count("rindex = 0; rindex < 1000;") == 2
    (kernel,) = compiled_kernels(lambda a: torch.softmax(a, -1), torch.randn(8, 1024))
    assert "rindex = 1024" not in cpp.generate(kernel).source  # no tail to split off


@pytest.mark.parametrize("width", [15, 16, 17, 31, 100, 1007])
def test_row_loops_split_for_a_vector_tail_match_eager(width):
    """Every element is computed once, whichever of the two loops it falls in."""
    a = torch.randn(13, width)
    a[3, -1] = float("nan")
    check(lambda a: (torch.exp(a).sum(-1), torch.tanh(a).amax(-1), torch.sin(a) * a), a)
    check(lambda a: torch.log_softmax(a * 3, -1), torch.randn(13, width), backward=True)


# --- dynamic shapes -----------------------------------------------------------------------------
def test_symbolic_column_and_row_reductions():
    """One kernel compiled with symbolic sizes serves every size, in both layouts."""
    fn = lambda a: (a.sum(0), a.amax(0), a.sum(1), torch.softmax(a, -1))  # noqa: E731
    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(5, 6))
    examples = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    scheduled = schedule(lower(decompose(gm, examples), examples))
    kernels = [s for s in scheduled.steps if isinstance(s, ir.Kernel)]
    assert any(cpp_layout.use_column_layout(k) for k in kernels)
    assert any(k.size_symbols() for k in kernels)
    compiled = compile_graph(scheduled, "cpp")
    for shape in [(1, 1), (300, 517), (3, 257), (600, 2), (2, 2)]:
        a = torch.randn(*shape)
        a[0, 0] = float("nan") if shape[0] > 2 else a[0, 0]
        torch.testing.assert_close(tuple(compiled([a])), fn(a), equal_nan=True, rtol=RTOL,
                                   atol=ATOL)  # fmt: skip


# --- values kept in row arrays ------------------------------------------------------------------
def test_softmax_computes_exp_once_per_element():
    """The sum loop keeps exp(a - max) in a row array; the store loop reads it back."""
    (kernel,) = compiled_kernels(lambda a: torch.softmax(a, -1), torch.randn(33, 517))
    body = cpp.generate(kernel).source.split('extern "C"')[-1]
    # (twice in the text: the sum loop is split for its vector tail, see the tests below)
    assert body.count("toycomp_expf(") == body.count("row0[rindex] = ") == 2
    assert "= row0[rindex];" in body


def test_kept_values_are_not_confused_with_similar_ones():
    """exp(a), exp(2a) and exp(a) + 1 in one row kernel: only the equal one is shared."""

    def fn(a):
        total = torch.exp(a).sum(-1, keepdim=True)
        return torch.exp(a) / total, torch.exp(a * 2) / total, (torch.exp(a) + 1) * total

    check(fn, torch.randn(37, 301))
    check(lambda a: torch.log_softmax(a, -1), torch.randn(37, 301), backward=True)


def test_dynamic_layer_norm_and_softmax_gradients_over_batch_sizes():
    """``dynamic=True``: one compile of each serves batch sizes with odd and tiny row counts;
    the column sums of the weight and bias gradients run over a symbolic number of rows."""
    ln = lambda x, w, b: F.layer_norm(x, (37,), w, b)  # noqa: E731
    sm = lambda x: torch.softmax(x, -1) * x  # noqa: E731
    compiled_ln = toycomp.compile(ln, backend="cpp", dynamic=True)
    compiled_sm = toycomp.compile(sm, backend="cpp", dynamic=True)
    w, b = torch.randn(37, requires_grad=True), torch.randn(37, requires_grad=True)
    for batch in [300, 1, 17, 2]:
        x = torch.randn(batch, 37, requires_grad=True)
        grad = torch.randn(batch, 37)
        for fn, compiled, inputs in [(ln, compiled_ln, (x, w, b)), (sm, compiled_sm, (x,))]:
            got = torch.autograd.grad(compiled(*inputs), inputs, grad)
            want = torch.autograd.grad(fn(*inputs), inputs, grad)
            for g, e in zip(got, want):
                torch.testing.assert_close(g, e, rtol=RTOL, atol=ATOL)


# --- few outputs, many rows: the rows shared out between threads --------------------------------
def test_column_reduction_with_few_outputs_shares_rows_between_threads():
    """A single tile of 48 outputs over 20000 rows: the threads share the row blocks and
    combine their arrays in thread order (the same bits on every run); NaN still wins."""
    fn = lambda a: (a.sum(0), a.amax(0), a.amin(0))  # noqa: E731
    a = torch.randn(20000, 48)
    a[5, 3], a[19999, 7] = float("nan"), float("nan")
    (kernel,) = compiled_kernels(fn, a)
    body = cpp.generate(kernel).source.split('extern "C"')[-1]
    assert "#pragma omp for schedule(static)" in body and "ordered" in body
    check(fn, a)
    compiled = toycomp.compile(fn, backend="cpp")
    first, again = compiled(a), compiled(a)
    assert all(torch.equal(f.view(torch.int32), g.view(torch.int32)) for f, g in zip(first, again))
    ints = torch.randint(-1000, 1000, (20001, 5))
    check(lambda a: (a.sum(0), a.amax(0)), ints)
