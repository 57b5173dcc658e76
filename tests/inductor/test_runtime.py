"""The run-time checks that the generated wrapper and the IR interpreter share (runtime.py)."""

import operator

import pytest
import torch

import toycomp
import toycomp.prims as prims
from toycomp.inductor.lowering import lower
from toycomp.inductor.runtime import check_extern, check_input, resolve_extern, restride

CPU = torch.device("cpu")
aten = torch.ops.aten


def test_check_input_ignores_strides_of_size_one_dims_only():
    row = torch.empty(4, 1).t()  # size (1, 4), stride (1, 1)
    check_input(row, (1, 4), (4, 1), torch.float32, CPU, "a")
    with pytest.raises(ValueError, match="input a: compiled for"):
        check_input(torch.empty(4, 3).t(), (3, 4), (4, 1), torch.float32, CPU, "a")
    with pytest.raises(ValueError, match="input a: compiled for"):
        check_input(row, (1, 4), (4, 1), torch.float64, CPU, "a")
    with pytest.raises(TypeError, match="expected a tensor"):
        check_input(3.0, (), (), torch.float32, CPU, "a")


def test_check_extern_copies_into_the_planned_layout():
    t = torch.randn(3, 4)
    assert check_extern(t, (3, 4), (4, 1), torch.float32, "buf0") is t
    moved = check_extern(t.t().contiguous().t(), (3, 4), (4, 1), torch.float32, "buf0")
    assert moved.stride() == (4, 1) and torch.equal(moved, t)
    with pytest.raises(RuntimeError, match="extern kernel for buf0: expected"):
        check_extern(t, (4, 3), (3, 1), torch.float32, "buf0")


def test_resolve_extern():
    assert resolve_extern("aten.mm.default") is torch.ops.aten.mm.default
    assert resolve_extern("toycomp.prims.sin") is prims.PRIM_INFO[prims.sin].ref
    with pytest.raises(RuntimeError, match="not found"):
        resolve_extern("aten.no_such_op.default")


# --- results laid out like eager's, overlapping ones included (issue 6 item 5) ------------------
def _layouts():
    base = torch.arange(12.0).reshape(3, 4)
    return {
        "expanded": torch.arange(3.0).expand(4, 3),  # stride (0, 1)
        "expanded scalar": torch.tensor(2.0).expand(3, 4),  # stride (0, 0)
        "expanded column": torch.arange(3.0)[:, None].expand(3, 5),  # stride (1, 0)
        "overlapping windows": torch.arange(7.0).unfold(0, 3, 2),  # stride (2, 1)
        "windows of an expand": base[:, None].expand(3, 2, 4).unfold(2, 2, 1),
        "with gaps": base[:, :2],  # stride (4, 1): a chunk of a bigger tensor
        "empty": torch.empty(0, 3).expand(0, 3),
    }


@pytest.mark.parametrize("name", list(_layouts()))
def test_restride_gives_eager_layout_in_fresh_storage(name):
    eager = _layouts()[name]
    out = restride(eager.contiguous(), eager.stride())
    assert out.shape == eager.shape and out.stride() == eager.stride()
    assert torch.equal(out, eager)
    if eager.numel():
        assert out.untyped_storage().data_ptr() != eager.untyped_storage().data_ptr()
    moved = check_extern(eager.contiguous(), tuple(eager.shape), eager.stride(), eager.dtype, "b")
    assert moved.stride() == eager.stride() and torch.equal(moved, eager)


def _grads(fn, inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = fn(*inputs)
    return out, torch.autograd.grad(out.sum(), inputs)


STRIDE_ZERO_PROGRAMS = {  # the backward of a sum is an expand: eager returns stride-0 gradients
    "sum0_mul": (lambda x, w: x.sum(0) * w, [(3, 4), (4,)]),
    "tanh_sum": (lambda x: torch.tanh(x.sum()), [(3, 4)]),
    "sum_sigmoid": (lambda x: x.sum(-1).sigmoid(), [(3, 4)]),
    "sum_exp_sum": (lambda x: x.sum(1).exp().sum(), [(3, 4)]),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", list(STRIDE_ZERO_PROGRAMS))
def test_stride_zero_gradients(backend, name):
    fn, shapes = STRIDE_ZERO_PROGRAMS[name]
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=gen) for s in shapes]
    out, grads = _grads(toycomp.compile(fn, backend=backend), inputs)
    want_out, want_grads = _grads(fn, inputs)
    torch.testing.assert_close(out, want_out)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
        assert g.shape == w.shape


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_expanded_output_is_an_expanded_view_of_fresh_storage(backend):
    x = torch.randn(1, 3)
    x_before = x.clone()
    out = toycomp.compile(lambda x: (x * 2).expand(4, 3), backend=backend)(x)
    want = (x * 2).expand(4, 3)
    assert torch.equal(out, want) and out.stride() == want.stride()
    out[0].add_(1)  # every row sees it, as in eager's expanded result; the input is untouched
    assert torch.equal(out, want + 1) and torch.equal(x, x_before)


def test_an_attention_seed_is_checked_on_any_device():
    # [Note: extern seeds]: the efficient-attention backward's seed and offset are 0-d
    # tensors that its fake implementation puts on the GPU and the real one on the CPU
    g = torch.fx.Graph()
    names = ["grad", "q", "k", "v", "out", "lse", "seed", "offset"]
    ph = {n: g.placeholder(n) for n in names}
    backward = g.call_function(aten._scaled_dot_product_efficient_attention_backward.default, (
        ph["grad"], ph["q"], ph["k"], ph["v"], None, ph["out"], ph["lse"], ph["seed"],
        ph["offset"], 0.0, [True, True, True, False]))
    g.output([g.call_function(operator.getitem, (backward, 0))])
    qkv = [torch.empty(2, 2, 8, 16, device="meta") for _ in range(5)]
    seeds = [torch.empty((), dtype=torch.long, device="meta") for _ in range(2)]
    lowered = lower(torch.fx.GraphModule({}, g), [*qkv, torch.empty(2, 2, 32, device="meta"),
                                                  *seeds])  # fmt: skip
    assert [b.name for b in lowered.inputs if b.any_device] == ["seed", "offset"]
    seed = torch.tensor(7)
    check_input(seed, (), (), torch.int64, None, "seed")  # any device
    with pytest.raises(ValueError, match="seed"):
        check_input(seed, (), (), torch.int64, torch.device("meta"), "seed")
    with pytest.raises(ValueError, match="seed"):
        check_input(seed, (), (), torch.int32, None, "seed")


# --- [Note: inputs checked once]: one C++ check of many inputs, check_input when it fails ------
def _perturbations(t: torch.Tensor) -> dict:
    """Tensors like ``t`` in all but one of what the fast check must see."""
    return {
        "other strides": t.t().contiguous().t(),
        "other dtype": t.double(),
        "other shape": torch.randn(t.shape[0], t.shape[1] + 1),
        "requires grad": t.clone().requires_grad_(),
        "a parameter": torch.nn.Parameter(t.clone(), requires_grad=False),
        "a view with gaps": torch.randn(t.shape[0], 2 * t.shape[1])[:, ::2],
    }


@pytest.mark.parametrize("what", list(_perturbations(torch.randn(3, 4))))
def test_layouts_seen_is_false_for_any_other_layout(what):
    from toycomp._torch_compat import LayoutsSeen

    a, b = torch.randn(3, 4), torch.randn(3, 4)
    seen = LayoutsSeen()
    assert not seen.check(a, b)  # nothing remembered yet
    seen.remember(a, b)
    assert seen.check(torch.randn(3, 4), torch.randn(3, 4))  # other tensors, same layouts
    assert not seen.check(a, _perturbations(b)[what])
    assert not seen.check(a) and not seen.check(a, b, b)  # another number of tensors
    seen.remember(a, a, b)  # a tensor given twice: the same tensor must be there again
    assert seen.check(b, b, a) and not seen.check(a, torch.randn(3, 4), b)


def _many_inputs(shapes: list[tuple]):
    """A graph of one input per shape (more than wrapper.FEW_INPUTS): the inputs' sum times the
    first, compiled for the C++ backend; the graph, example inputs and the eager function."""
    from toycomp.inductor import wrapper
    from toycomp.inductor.scheduler import schedule
    from toycomp.prims.decompositions import decompose

    assert len(shapes) > wrapper.FEW_INPUTS

    def f(*xs):
        total = xs[0]
        for x in xs[1:]:
            total = aten.add.Tensor(total, x)
        return (aten.mul.Tensor(total, xs[0]),)

    graph = torch.fx.Graph()
    xs = [graph.placeholder(f"x{i}") for i in range(len(shapes))]
    total = xs[0]
    for x in xs[1:]:
        total = graph.call_function(aten.add.Tensor, (total, x))
    graph.output((graph.call_function(aten.mul.Tensor, (total, xs[0])),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    examples = [torch.randn(s) for s in shapes]
    return wrapper.compile_graph(schedule(lower(decompose(gm, examples), examples)), "cpp"), f


def test_a_wrapper_with_many_inputs_checks_each_when_the_fast_check_fails():
    compiled, f = _many_inputs([(3, 4)] * 6)
    assert "if not inputs_seen.check(" in compiled.wrapper_source
    xs = [torch.randn(3, 4) for _ in range(6)]
    for _ in range(2):  # the second call takes the fast check
        torch.testing.assert_close(compiled(xs)[0], f(*xs)[0])
    ys = [torch.randn(3, 4) for _ in xs]
    torch.testing.assert_close(compiled(ys)[0], f(*ys)[0])
    for what, other in _perturbations(xs[3]).items():
        call = [*xs[:3], other, *xs[4:]]
        if what in ("requires grad", "a parameter"):  # check_input accepts these: still right
            torch.testing.assert_close(compiled(call)[0], f(*[c.detach() for c in call])[0])
            continue
        with pytest.raises(ValueError, match="input x3: compiled for"):
            compiled(call)
        torch.testing.assert_close(compiled(xs)[0], f(*xs)[0])  # the fast check again
    torch.testing.assert_close(compiled([xs[0]] * 6)[0], f(*[xs[0]] * 6)[0])  # one tensor, 6x


def test_the_fast_check_keeps_check_inputs_leniency_for_size_one_dims():
    compiled, f = _many_inputs([(1, 4)] * 5)
    rows = [torch.randn(4, 1).t() for _ in range(5)]  # size (1, 4), stride (1, 1)
    torch.testing.assert_close(compiled(rows)[0], f(*rows)[0])
    xs = [torch.randn(1, 4) for _ in range(5)]  # stride (4, 1) again
    torch.testing.assert_close(compiled(xs)[0], f(*xs)[0])
