"""Indirect indexing: loads and stores at indices read from a tensor (gathers and scatters).

The loop IR's passes on indirect loads checked directly; every op's values and gradients
through toycomp.compile (C++, and Triton's interpreter) against eager PyTorch; bounds checked as
eager checks them; the scatter's kernel kept apart by the scheduler.
"""

import pytest
import sympy
import torch
import torch.nn.functional as F

import toycomp
from toycomp.inductor import indexing, ir
from toycomp.inductor.loop_body import indirect_symbol

BACKENDS = ["cpp", "triton"]
i0, i1 = indexing.index_vars("i", 2)
ind0 = indirect_symbol(0)
f32, i64 = torch.float32, torch.int64


# --- the loop IR ---------------------------------------------------------------------------------
def embedding_body():
    index = ir.Load("idx", i0, i64)
    return ir.Op("sin", (ir.Load("w", 768 * ind0 + i1, f32, (index,)),), f32), index


def test_indirect_load_prints_its_index_values():
    body, _ = embedding_body()
    assert repr(body) == "sin(load(w, i1 + 768*ind0; ind0 = load(idx, i0)))"


def test_passes_visit_and_move_the_index_values():
    body, index = embedding_body()
    assert index in list(ir.walk(body)) and index in ir.post_order(body)
    moved = ir.substitute(body, {i0: indexing.x, i1: indexing.r})
    assert repr(moved) == "sin(load(w, 768*ind0 + r; ind0 = load(idx, x)))"
    renamed = ir.map_expr(body, lambda e: ir.Load("j", e.index, i64) if e is index else None)
    assert "ind0 = load(j, i0)" in repr(renamed)


def _steps(explained, name):
    return explained.graph(name).scheduled.steps


def test_an_indirect_load_never_fuses_with_its_producer_and_scatters_run_alone():
    w, idx = torch.randn(10, 4, requires_grad=True), torch.tensor([3, 3, 0])
    explained = toycomp.explain(lambda w, i: F.embedding(i, w.sin()).cos(), w, idx)
    assert not explained.fallbacks
    forward = [s for s in _steps(explained, "forward") if isinstance(s, ir.Kernel)]
    # the gather reads sin(w) inline, at the rows idx[n] only (no buffer for sin(w))
    assert any("sin(load(primals_1, 4*ind0" in repr(k) for k in forward)
    backward = [s for s in _steps(explained, "backward") if isinstance(s, ir.Kernel)]
    scatters = [k for k in backward if k.scatters()]
    assert len(scatters) == 1 and len(scatters[0].stores()) == 1  # alone in its kernel
    (store,) = scatters[0].stores()
    assert store.accumulate and store.indirect
    # the kernel that reads the scatter's result runs after it
    readers = [k for k in backward if store.buffer in k.reads()]
    assert all(backward.index(k) > backward.index(scatters[0]) for k in readers)


# --- values and gradients against eager ---------------------------------------------------------
def _check(fn, *args, backend, grad=True, dtype=torch.float32):
    """fn compiled by toycomp == fn in eager: values, and gradients of the float inputs."""
    eager = [a.detach().clone().requires_grad_(grad and a.is_floating_point()) for a in args]
    mine = [a.detach().clone().requires_grad_(grad and a.is_floating_point()) for a in args]
    expected = fn(*eager)
    got = toycomp.compile(fn, backend=backend)(*mine)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    if grad and expected.requires_grad:
        weights = torch.randn(expected.shape, dtype=expected.dtype)
        (expected * weights).sum().backward()
        (got * weights).sum().backward()
        for a, b in zip(eager, mine):
            if a.requires_grad:
                torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)


CASES = {
    "embedding": (lambda w, i: F.embedding(i, w), lambda: (torch.randn(11, 5), torch.tensor([[1, 10, 1], [0, 0, 4]]))),
    "embedding_int32": (lambda w, i: F.embedding(i, w), lambda: (torch.randn(7, 3), torch.tensor([6, 0, 6], dtype=torch.int32))),
    "embedding_padding": (lambda w, i: F.embedding(i, w, padding_idx=2), lambda: (torch.randn(6, 4), torch.tensor([2, 1, 2, 5]))),
    "embedding_of_computed": (lambda w, i: F.embedding(i, w.tanh() * 2).exp(), lambda: (torch.randn(9, 6), torch.tensor([8, 1, 1]))),
    "index_select": (lambda a, i: torch.index_select(a, 1, i), lambda: (torch.randn(4, 6, 3), torch.tensor([5, 0, 5, 2]))),
    "index_select_0": (lambda a, i: a.index_select(0, i) * 3, lambda: (torch.randn(5, 2), torch.tensor([4, 4, 1]))),
    "gather": (lambda a, i: torch.gather(a, 1, i), lambda: (torch.randn(3, 5), torch.tensor([[0, 4], [2, 2], [1, 3]]))),
    "gather_of_transpose": (lambda a, i: torch.gather(a.t(), 0, i), lambda: (torch.randn(5, 3), torch.tensor([[2, 0, 1], [1, 1, 0]]))),
    "gather_of_gather": (lambda a, i: torch.gather(torch.gather(a, 0, i), 1, i[:, :2]), lambda: (torch.randn(3, 3), torch.tensor([[2, 1, 0], [0, 0, 2]]))),
    "index_one": (lambda a, i: a[i], lambda: (torch.randn(5, 3), torch.tensor([[4, -1], [0, -5]]))),
    "index_two_broadcast": (lambda a, i: a[i, i[:1].t()], lambda: (torch.randn(4, 4, 2), torch.tensor([[0, -1, 3]]).t())),
    "index_not_adjacent": (lambda a, i: a[i, :, i], lambda: (torch.randn(3, 2, 3), torch.tensor([2, 0, -3]))),
    "index_middle": (lambda a, i: a[:, i] + 1, lambda: (torch.randn(2, 5, 3), torch.tensor([1, 4, 4]))),
    "scatter_add": (lambda a, i: torch.zeros(4, 3).scatter_add(0, i, a), lambda: (torch.randn(3, 3), torch.tensor([[3, 3, 0], [3, 1, 0], [2, 3, 3]]))),
    "scatter_add_empty": (lambda a, i: torch.ones(4, 3).scatter_add(0, i, a) * 2, lambda: (torch.randn(0, 3), torch.zeros(0, 3, dtype=torch.long))),
    "scatter_add_into": (lambda a, i: (a * 2).scatter_add(1, i, a[:, :2]), lambda: (torch.randn(3, 4), torch.tensor([[3, 3], [0, 1], [2, 2]]))),
    "scatter_src": (lambda a, i: torch.zeros(3, 5).scatter(1, i, a), lambda: (torch.randn(3, 2), torch.tensor([[4, 0], [1, 2], [3, 4]]))),
    "scatter_value": (lambda a, i: a.scatter(0, i, -1.5), lambda: (torch.randn(4, 2), torch.tensor([[3, 0], [1, 2]]))),
    "index_add": (lambda a, i: torch.ones(6, 3).index_add(0, i, a, alpha=0.5), lambda: (torch.randn(4, 3), torch.tensor([5, 0, 5, 5]))),
    "index_put_accumulate": (lambda a, i: torch.zeros(5, 2).index_put((i,), a, accumulate=True), lambda: (torch.randn(4, 2), torch.tensor([1, -1, 1, 0]))),
    "index_put_two": (lambda a, i: a.index_put((i, i), torch.tensor(9.0)), lambda: (torch.randn(4, 4), torch.tensor([0, 3, -2]))),
    "index_put_values": (lambda a, i: torch.zeros(3, 4).index_put((i,), a), lambda: (torch.randn(2, 4), torch.tensor([2, 0]))),
    "float64": (lambda w, i: F.embedding(i, w).sin(), lambda: (torch.randn(5, 3, dtype=torch.float64), torch.tensor([4, 0, 4]))),
}  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_values_and_gradients_match_eager(case, backend):
    fn, make = CASES[case]
    torch.manual_seed(0)
    _check(fn, *make(), backend=backend)


@pytest.mark.parametrize("case", ["embedding", "index_not_adjacent", "scatter_add", "index_put_two"])
def test_teach_preset_matches_eager(case):
    fn, make = CASES[case]
    torch.manual_seed(0)
    with toycomp.config.patch(**toycomp.config.teach):
        _check(fn, *make(), backend="cpp")


def test_integer_tables_are_gathered_exactly():
    table, idx = torch.arange(40).reshape(10, 4) * 1_000_003, torch.tensor([9, 0, 9])
    got = toycomp.compile(lambda t, i: F.embedding(i, t), backend="cpp")(table, idx)
    assert torch.equal(got, F.embedding(idx, table))


def test_index_ops_do_not_fall_back():
    w, idx, a = torch.randn(6, 3, requires_grad=True), torch.tensor([5, 1]), torch.randn(6, 3)

    def fn(w, idx, a):
        x = F.embedding(idx, w) + torch.gather(a, 0, idx[:, None].expand(2, 3)) + a[idx]
        return x.index_select(1, torch.tensor([2, 0])).sum() + torch.zeros(6, 3).index_add(0, idx, x).sum()

    assert toycomp.explain(fn, w, idx, a).fallbacks == []


def test_scatter_add_on_the_cpu_is_deterministic():
    """Repeated indices summed in the source's order: the same bits on every run."""
    torch.manual_seed(0)
    grad, idx = torch.randn(4096, 16), torch.randint(0, 3, (4096,))
    fn = toycomp.compile(lambda g, i: torch.zeros(3, 16).index_add(0, i, g), backend="cpp")
    first = fn(grad, idx)
    for _ in range(3):
        assert torch.equal(fn(grad, idx), first)
    torch.testing.assert_close(first, torch.zeros(3, 16).index_add(0, idx, grad))


def test_a_triton_scatter_adds_every_element_in_parallel():
    """An embedding's gradient on Triton: one atomic add per element of the source, over x
    alone, as Inductor's (over r, one program a column would add up every token in turn);
    under ``torch.use_deterministic_algorithms``, in the source's order, as on the CPU."""
    torch.manual_seed(0)
    w, idx = torch.randn(12, 8, requires_grad=True), torch.randint(0, 12, (40,))

    def fn(w, i):
        return F.embedding(i, w).sum()

    def scatter_kernel():
        explained = toycomp.explain(fn, w, idx, backend="triton")
        (kernel,) = [k for k in _steps(explained, "backward") if isinstance(k, ir.Kernel)
                     and k.scatters()]  # fmt: skip
        return kernel

    kernel = scatter_kernel()
    assert (kernel.numel, kernel.rnumel) == (40 * 8, 1)
    (grad,) = torch.autograd.grad(toycomp.compile(fn, backend="triton")(w, idx), w)
    torch.testing.assert_close(grad, torch.autograd.grad(fn(w, idx), w)[0])
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        kernel = scatter_kernel()
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert (kernel.numel, kernel.rnumel) == (8, 40)


# --- bounds: as eager ---------------------------------------------------------------------------
OUT_OF_RANGE = {
    "embedding": (lambda w, i: F.embedding(i, w), torch.tensor([0, 6])),
    "embedding_negative": (lambda w, i: F.embedding(i, w), torch.tensor([-1])),
    "index_select": (lambda w, i: w.index_select(1, i), torch.tensor([3])),
    "gather": (lambda w, i: torch.gather(w, 0, i[:, None]), torch.tensor([6])),
    "index": (lambda w, i: w[i], torch.tensor([6])),
    "index_too_negative": (lambda w, i: w[i], torch.tensor([-7])),
    "index_add": (lambda w, i: w.index_add(0, i, w[:1]), torch.tensor([6])),
    "scatter_add": (lambda w, i: w.scatter_add(0, i[:, None], w[:1, :1]), torch.tensor([-1])),
}  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_an_index_out_of_range_raises_as_in_eager(case, backend):
    """The error eager raises (IndexError or RuntimeError, by op), never a read or write out of
    bounds."""
    fn, idx = OUT_OF_RANGE[case]
    w = torch.randn(6, 3)
    with pytest.raises((IndexError, RuntimeError)) as eager:
        fn(w, idx)
    with pytest.raises(eager.type):
        toycomp.compile(fn, backend=backend)(w, idx)


def test_the_embedding_gradient_is_a_scatter_not_a_one_hot_matmul():
    w, idx = torch.randn(50, 8, requires_grad=True), torch.tensor([3, 3, 7])
    explained = toycomp.explain(lambda w, i: F.embedding(i, w).sum(), w, idx)
    steps = _steps(explained, "forward") + _steps(explained, "backward")
    assert not [s for s in steps if isinstance(s, ir.ExternKernel) and "mm" in s.kernel]
    kernels = [s for s in steps if isinstance(s, ir.Kernel)]
    assert all(k.rnumel != 50 for k in kernels)  # nothing loops over the vocabulary
    assert any(k.scatters() for k in kernels)


# --- shifted reads: index arithmetic, not indirect -----------------------------------------------
SHIFTS = {
    "pad": lambda a: F.pad(a, (1, 2, 0, 1), value=0.5).sin(),
    "pad_crop": lambda a: F.pad(a, (-1, 2)) * 2,
    "flip": lambda a: a.flip(0, 1).exp(),
    "roll": lambda a: a.roll(2, 1) + a.roll(-1, 0),
    "roll_flat": lambda a: a.roll(7),
    "cat_unequal": lambda a: torch.cat([a, a[:, :2].exp(), a[:, 1:]], 1),
    "slice_backward": lambda a: a[:, 1:4].exp() * 3,
    "slice_backward_negative": lambda a: a[-2:].tanh(),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(SHIFTS))
def test_shifted_reads_match_eager_without_fallbacks(case, backend):
    torch.manual_seed(0)
    a = torch.randn(3, 5)
    _check(SHIFTS[case], a, backend=backend)
    explained = toycomp.explain(SHIFTS[case], a.requires_grad_())
    assert explained.fallbacks == []
    steps = _steps(explained, "forward") + _steps(explained, "backward")
    kernels = [s for s in steps if isinstance(s, ir.Kernel)]
    assert not any(k.indirect() for k in kernels)  # plain index arithmetic


STRIDED_SLICES = {
    "every_other_column": lambda a: a[:, ::2].exp(),
    "odd_rows": lambda a: a[1::2] * 3,
    "two_steps_and_an_end": lambda a: a[::3, 1:5:2].sin(),
    "from_the_end": lambda a: a[-5::2].tanh(),  # (LeViT's attention subsampling: x[:, ::2])
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(STRIDED_SLICES))
def test_strided_slice_backward_is_a_scatter(case, backend):
    """The gradient of ``a[::2]`` stores each element at ``start + k * step``: no prim reads
    ``i % step``, so it is a scatter into zeros, not a fallback."""
    torch.manual_seed(0)
    a = torch.randn(7, 6)
    _check(STRIDED_SLICES[case], a, backend=backend)
    explained = toycomp.explain(STRIDED_SLICES[case], a.requires_grad_())
    assert explained.fallbacks == []
    assert any(k.scatters() for k in _steps(explained, "backward") if isinstance(k, ir.Kernel))


def test_index_arithmetic_fuses_into_one_kernel():
    a = torch.randn(3, 5)
    explained = toycomp.explain(lambda a: torch.cat([a.flip(1), F.pad(a, (1, 0))], 1).sin(), a)
    kernels = [s for s in _steps(explained, "forward") if isinstance(s, ir.Kernel)]
    assert len(kernels) == 1 and "Min(" in repr(kernels[0])
