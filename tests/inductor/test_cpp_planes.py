"""C++ reductions over planes equal eager (issue 9: BatchNorm's per-channel sums on a conv net).

See [Note: reductions over planes] in toycomp/inductor/opt/cpp_layout.py: a row reduction
whose r index divides r only by multiples of one extent P (H*W of an (N, C, H, W) tensor)
runs ``for r0 < rnumel/P: for r1 < P``. Eager is the oracle for values and gradients; H*W is
49, 196 and 15 (one plane each), 1 (no division at all), and a slice whose divisions share no
plane of PLANE_MIN or more (one flat loop). Also pinned: the row/column vote counts r1's
stride, and a whole-tensor reduction shares its planes between cores.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import toycomp
from toycomp.inductor import indexing, ir
from toycomp.inductor.codegen import cpp
from toycomp.inductor.opt import cpp_layout

FloorDiv, r, x = indexing.FloorDiv, indexing.r, indexing.x
DIMS = (0, 2, 3)  # a per-channel reduction of (N, C, H, W)


def reduction_sources(fn, *args, graph: str = "forward") -> list[str]:
    """The C++ function bodies of the kernels of ``fn`` that have an r loop."""
    steps = toycomp.explain(fn, *args).graph(graph).scheduled.steps
    kernels = [k for k in steps if isinstance(k, ir.Kernel) and any(lp.over_r for lp in k.loops)]
    return [cpp.generate(k).source.split('extern "C"')[-1] for k in kernels]


def check(fn, *args, backward: bool = False):
    """Compiled values (and gradients of every float input) equal eager's."""
    tol = {"rtol": 1e-4, "atol": 1e-5} if args[0].dtype == torch.float32 else {}
    leaves = [a.detach().requires_grad_(backward) for a in args]
    got = toycomp.compile(fn, backend="cpp")(*leaves)
    want = fn(*args)
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    if backward:
        grad_out = torch.randn_like(want)
        refs = [a.detach().requires_grad_() for a in args]
        got_grads = torch.autograd.grad(got, leaves, grad_out)
        want_grads = torch.autograd.grad(fn(*refs), refs, grad_out)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, **tol)


# --- the rewritten index --------------------------------------------------------------------
@pytest.mark.parametrize("plane, rnumel", [(49, 98), (12, 96), (16, 256), (15, 45)])
def test_plane_index_over_r_is_the_same_element(plane, rnumel):
    """r = plane*r0 + r1: every r (for a few x) addresses the element the flat index does."""
    index = (r + 3 * plane * x + 5 * plane * FloorDiv(r, plane) - FloorDiv(r, 2 * plane)
             + 7 * FloorDiv(r, 3 * plane) + FloorDiv(x, 4))  # fmt: skip
    split = cpp_layout.plane_index(index, plane, r)
    r0, r1 = sorted(split.free_symbols - {x}, key=str)
    assert [s.name for s in (r0, r1)] == ["r0", "r1"]
    assert not any(isinstance(f, FloorDiv) and r1 in f.free_symbols for f in split.atoms(FloorDiv))
    for xv in (0, 1, 5):
        for rv in range(rnumel):
            got = split.subs({r0: rv // plane, r1: rv % plane, x: xv})
            assert got == index.subs({r: rv, x: xv}), (xv, rv)


def test_reduction_plane_is_the_gcd_of_the_divisors_of_r():
    def kernel(*indices, rnumel=96):
        f32, sum_ = torch.float32, ir.ReductionType.SUM
        body = tuple(ir.Reduce(f"acc{i}", sum_, ir.Load("a", index, f32), f32)
                     for i, index in enumerate(indices))  # fmt: skip
        return ir.Kernel("k", 4, rnumel, (ir.Loop(True, body),), (("a", f32),), ())

    plane = cpp_layout.reduction_plane
    assert plane(kernel(r + 48 * FloorDiv(r, 12), FloorDiv(r, 24) + x)) == 12
    assert plane(kernel(r + 48 * FloorDiv(r, 12), FloorDiv(r, 8))) is None  # gcd 4 < PLANE_MIN
    assert plane(kernel(r + 96 * x)) is None  # no division: a flat loop is already contiguous
    assert plane(kernel(FloorDiv(r + x, 12))) is None  # r inside another division
    assert plane(kernel(FloorDiv(r, 96))) is None  # one plane only


# --- per-channel reductions of (N, C, H, W), compared with eager ----------------------------
# Compiled code receives its inputs with the strides it was compiled for, so a view that the
# kernel must index (a slice, a permutation) is taken inside the function: (input shape from
# the (N, C, H, W) the function reduces, the view).
VIEWS = {
    "contiguous": (lambda n, c, h, w: (n, c, h, w), lambda a: a),
    "sliced": (lambda n, c, h, w: (n, c, h, w + 3), lambda a: a[..., :-3]),  # rows of W + 3
    "channels_last": (lambda n, c, h, w: (n, h, w, c), lambda a: a.permute(0, 3, 1, 2)),
    "transposed_hw": (lambda n, c, h, w: (n, c, w, h), lambda a: a.transpose(2, 3)),
}
SHAPES = [(2, 5, 7, 7), (3, 4, 14, 14), (2, 6, 3, 5), (4, 3, 1, 1), (1, 3, 7, 7)]


def _statistics(a):
    return (a.sum(DIMS), a.mean(DIMS, keepdim=True), a.var(DIMS), a.amax(DIMS, keepdim=True),
            (a * a).sum(DIMS, keepdim=True) / a.std(DIMS, keepdim=True))  # fmt: skip


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_channel_sum_mean_var_match_eager(shape, view, dtype):
    input_shape, take_view = VIEWS[view]
    torch.manual_seed(0)
    check(lambda a: _statistics(take_view(a)), torch.randn(input_shape(*shape), dtype=dtype))


def test_a_non_contiguous_input_matches_eager():
    a = torch.randn(2, 5, 7, 7).to(memory_format=torch.channels_last)
    check(_statistics, a)
    check(_statistics, torch.randn(2, 5, 7, 10)[..., 2:9])


@pytest.mark.parametrize("shape, plane", [
    ((2, 5, 7, 7), 49), ((3, 4, 14, 14), 196), ((2, 6, 3, 5), 15), ((4, 3, 1, 1), None),
    ((1, 3, 7, 7), None),
])  # fmt: skip
def test_per_channel_sums_run_over_planes_of_h_times_w(shape, plane):
    """The r loop splits into planes of H*W; with one image, or 1 x 1 images (a column
    reduction), r is not divided and the loop stays flat."""
    (source,) = reduction_sources(lambda a: a.sum(DIMS), torch.randn(shape))
    if plane is None:
        assert "for (int64_t rindex" in source and "for (int64_t r1" not in source
    else:
        assert f"for (int64_t r1 = 0; r1 < {plane}; r1++)" in source and "rindex" not in source
        assert f"for (int64_t r0 = 0; r0 < {shape[0]}; r0++)" in source
        assert "/" not in source  # no division left in any index


def test_a_kernel_without_a_common_plane_keeps_one_r_loop():
    """Rows of W = 5 inside rows of 8: r is divided by 5 and 15, whose gcd 5 < PLANE_MIN."""
    fn = lambda a: a[..., :5].sum(DIMS)  # noqa: E731
    a = torch.randn(2, 3, 3, 8)
    (source,) = reduction_sources(fn, a)
    assert "for (int64_t rindex" in source and "for (int64_t r1" not in source
    assert "((rindex) / (5))" in source
    check(fn, a)


def test_a_broadcast_read_does_not_turn_a_reduction_over_planes_into_columns():
    """MobileNet-v2's last BatchNorm backward: the pooled gradient ``g[n, c] / 49`` (stride 1
    in x) and two reads of (N, C, 7, 7) (stride 1 in r1, none in r): a row reduction over
    planes of 49, not a column one gathering at a stride of 49 (see [Note: reductions over
    planes])."""

    def fn(a, b, g, mean):
        grad = torch.where((a > 0) & (a < 6), g[:, :, None, None] / 49, 0.0)
        return torch.stack([grad.sum(DIMS), (grad * (b - mean[:, None, None])).sum(DIMS)])

    args = torch.randn(2, 300, 7, 7) * 4, torch.randn(2, 300, 7, 7), torch.randn(2, 300), \
        torch.randn(300)  # fmt: skip
    steps = toycomp.explain(fn, *args).graph("forward").scheduled.steps
    (kernel,) = [k for k in steps if isinstance(k, ir.Kernel) and k.rnumel != 1]
    assert not cpp_layout.use_column_layout(kernel)
    assert "for (int64_t r1 = 0; r1 < 49; r1++)" in cpp.generate(kernel).source
    check(fn, *args)


# --- one row: a whole-tensor reduction, its planes shared between cores --------------------
@pytest.mark.parametrize("view", ["sliced", "transposed_hw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_whole_tensor_reductions_of_views_match_eager(view, dtype):
    """1280 planes of 40 (or 48): ``omp parallel for`` over r0 with the reduction clauses,
    ``omp simd`` over r1; NaN still wins the max."""
    input_shape, take_view = VIEWS[view]
    a = torch.randn(input_shape(16, 4, 20, 40) if view == "sliced" else (16, 4, 20, 48),
                    dtype=dtype)  # fmt: skip
    nan = a.clone()
    nan[3, 2, 1, 7] = float("nan")
    for fn, arg in [(lambda a: take_view(a).sum(), a), (lambda a: take_view(a).amax(), nan),
                    (lambda a: (take_view(a)[:, :, 2:] ** 2).mean(), a)]:  # fmt: skip
        (source,) = reduction_sources(fn, arg)
        assert "#pragma omp parallel for reduction(" in source and "for (int64_t r1 = 0" in source
        check(fn, arg)


def test_a_whole_tensor_reduction_of_few_planes_keeps_one_parallel_loop():
    """16 planes of 40 are too few to share out (PARALLEL_PLANES_MIN): one flat r loop."""
    fn = lambda a: a[..., :40].sum()  # noqa: E731
    a = torch.randn(2, 2, 4, 43)
    (source,) = reduction_sources(fn, a)
    assert "for (int64_t rindex" in source and "for (int64_t r1" not in source
    check(fn, a)


# --- BatchNorm's backward, and r loops that store and keep values ----------------------------
@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (3, 4, 14, 14), (2, 6, 3, 5), (4, 3, 1, 1)],
                         ids=lambda s: "x".join(map(str, s)))  # fmt: skip
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_gradients_match_eager(shape, training, dtype):
    """The weight and bias gradients are per-channel sums over (N, H, W) of the incoming
    gradient (times x-hat), ReLU6's mask fused in, as in MobileNet-v2's backward."""
    c = shape[1]
    mean, var = torch.randn(c, dtype=dtype), torch.rand(c, dtype=dtype) + 0.5

    def fn(x, w, b):
        return F.batch_norm(x, mean, var, w, b, training=training).clamp(0, 6)

    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    w, b = torch.rand(c, dtype=dtype), torch.randn(c, dtype=dtype)
    check(fn, x, w, b, backward=True)
    sources = reduction_sources(fn, x.requires_grad_(), w.requires_grad_(), b, graph="backward")
    if shape[2] * shape[3] > 1:
        assert any(f"r1 < {shape[2] * shape[3]};" in s for s in sources)


def test_an_entropy_over_n_h_w_keeps_exp_in_a_row_array_over_planes():
    """max, sum of exp, then the sum of p*log(p) with p = exp / sum: three r loops over planes
    of 49, the exp kept in a row array indexed by 49*r0 + r1 (see [Note: a row's costly
    values, kept] in cpp_row_buffers.py)."""

    def fn(a):
        e = torch.exp(a - a.amax(DIMS, keepdim=True))
        p = e / e.sum(DIMS, keepdim=True)
        return -(p * torch.log(p)).sum(DIMS)

    a = torch.randn(3, 4, 7, 7)
    (source,) = reduction_sources(fn, a)
    assert source.count("for (int64_t r1 = 0; r1 < 49; r1++)") == 3
    assert "row0[49*r0 + r1] = " in source and "= row0[49*r0 + r1];" in source
    check(fn, a, backward=True)


def test_dynamic_sizes_keep_a_flat_r_loop():
    """A symbolic H*W is no extent to split by: the kernel serves every size with one loop."""
    fn = lambda a: (a.sum(DIMS), a.var(DIMS))  # noqa: E731
    compiled = toycomp.compile(fn, backend="cpp", dynamic=True)
    for shape in [(2, 3, 7, 7), (3, 3, 14, 14), (2, 3, 3, 5)]:
        a = torch.randn(shape)
        torch.testing.assert_close(compiled(a), fn(a), rtol=1e-4, atol=1e-5)
