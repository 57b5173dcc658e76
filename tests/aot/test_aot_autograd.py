"""Tests for toycomp/aot/ (stage 2): tracing, functionalisation, runtime. Eager is the oracle."""

import operator
import random

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import toycomp
from toycomp.aot import aot_autograd as aot
from toycomp.aot.partitioners import default_partition, min_cut_rematerialization_partition

aten = torch.ops.aten
TOL = dict(rtol=1e-4, atol=1e-5)


def sin_cos(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def packets(gm):
    return {getattr(t, "overloadpacket", t) for t in targets(gm)}


def run_eager(fn, inputs):
    """Eager oracle: outputs (as a tuple), grads of sum(outputs * weights), mutated inputs."""
    clones = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    outs = fn(*clones)
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    return outs, clones


def check_against_eager(fn, inputs, compiled=None):
    """Forward values, gradients and input mutations of aot_function(fn) equal eager's."""
    compiled = compiled or aot.aot_function(fn, inputs)
    eager_outs, eager_inputs = run_eager(fn, inputs)
    ours_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    ours = compiled(*ours_inputs)
    assert isinstance(ours, tuple) and len(ours) == len(eager_outs)
    for a, b in zip(ours, eager_outs):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(ours_inputs, eager_inputs):  # input mutations are visible to the caller
        torch.testing.assert_close(a.detach(), b.detach(), **TOL)
    diff = [(a, b) for a, b in zip(ours, eager_outs) if b.requires_grad]
    if diff:
        weights = [torch.randn_like(b) for _, b in diff]
        sum(((a * w).sum() for (a, _), w in zip(diff, weights))).backward()
        sum(((b * w).sum() for (_, b), w in zip(diff, weights))).backward()
        for a, b in zip(ours_inputs, eager_inputs):
            if b.requires_grad:
                assert (a.grad is None) == (b.grad is None)
                if b.grad is not None:
                    torch.testing.assert_close(a.grad, b.grad, **TOL)
    return compiled


def check_graph(gm):
    """lint passes and every node's meta['val'] matches what running the graph produces."""
    gm.graph.lint()
    for node in gm.graph.nodes:
        if node.op != "output":
            assert "val" in node.meta, node.name

    class Checker(fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if n.op == "output":
                return result
            vals = result if isinstance(result, (tuple, list)) else [result]
            metas = n.meta["val"] if isinstance(result, (tuple, list)) else [n.meta["val"]]
            for r, m in zip(vals, metas):
                if isinstance(r, torch.Tensor):
                    assert m.device.type == "meta"
                    assert (r.shape, r.dtype) == (m.shape, m.dtype), n.name
                    if n.op == "call_function" and r.numel() > 1:
                        assert r.stride() == m.stride(), n.name
            return result

    return Checker


def check_meta(gm, inputs):
    check_graph(gm)(gm).run(*inputs)


# -- the running example ------------------------------------------------------------------------
def test_sin_cos_forward_and_gradient_equal_eager():
    x = torch.randn(16, requires_grad=True)
    check_against_eager(sin_cos, [x])


def test_sin_cos_graphs():
    x = torch.randn(16, requires_grad=True)
    out = aot.aot_function(sin_cos, [x])
    joint_ops = packets(out.joint)
    assert {aten.sin, aten.cos, aten.pow, aten.add} <= joint_ops
    assert {aten.mul, aten.neg} <= joint_ops  # the backward: d sin = cos, d cos = -sin
    names = [n.name for n in out.joint.graph.nodes if n.op == "placeholder"]
    assert names == ["primals_1", "tangents_1"]
    # The forward graph holds only forward ops and no tangents.
    assert packets(out.forward) == {aten.sin, aten.cos, aten.pow, aten.add}
    fw_inputs = [n.name for n in out.forward.graph.nodes if n.op == "placeholder"]
    assert fw_inputs == ["primals_1"]
    # Saved values: returned by the forward after the output, read by the backward.
    fw_out = [n.name for n in out.forward.graph.output_node().args[0]]
    assert fw_out[1:] == out.saved_values and out.num_fwd_outputs == 1
    bw_inputs = [n for n in out.backward.graph.nodes if n.op == "placeholder"]
    assert [n.name for n in bw_inputs] == out.saved_values + ["tangents_1"]
    assert all(n.users for n in bw_inputs), "every saved value is read by the backward"
    for gm, inputs in [(out.joint, [x, torch.ones(16)]), (out.forward, [x])]:
        check_meta(gm, [i.detach() for i in inputs])
    saved = out.forward(x.detach())[1:]
    check_meta(out.backward, [*saved, torch.ones(16)])
    assert "--- backward ---" in repr(out) and "saved_values=" in repr(out)


def test_default_partition_directly():
    x = torch.randn(5, requires_grad=True)
    joint = aot.trace_joint(torch.sin, [x])
    forward, backward, saved = default_partition(joint)
    assert saved == ["primals_1"]
    assert packets(forward) == {aten.sin} and aten.cos in packets(backward)
    sin, primals_1 = forward(x.detach())
    (grad,) = backward(primals_1, torch.ones(5))
    torch.testing.assert_close(grad, torch.cos(x.detach()))


# -- a training step ------------------------------------------------------------------------------
def mlp_loss(x, target, w1, b1, w2, b2):
    return F.cross_entropy(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2), target)


def test_mlp_training_step_equals_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    x, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
    out = check_against_eager(mlp_loss, [x, target, *params])
    assert out.grad_inputs == [2, 3, 4, 5]
    assert aten.gelu_backward in packets(out.backward)
    # The same thing through functional_call on the module itself.
    names = [n for n, _ in model.named_parameters()]

    def module_loss(x, target, *ps):
        logits = torch.func.functional_call(model, dict(zip(names, ps)), (x,))
        return F.cross_entropy(logits, target)

    check_against_eager(module_loss, [x, target, *params])


def test_graph_module_input_and_multiple_outputs():
    def f(x, y):
        return x * y, (x + y).relu(), x.sum()

    gm = fx.symbolic_trace(f)
    inputs = [torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)]
    out = check_against_eager(gm, inputs)
    assert out.num_user_outputs == 3 and out.diff_outputs == [0, 1, 2]


def test_mixed_requires_grad():
    def f(x, w, b):
        return (x @ w + b).tanh()

    inputs = [torch.randn(3, 4), torch.randn(4, 5, requires_grad=True), torch.randn(5)]
    out = check_against_eager(f, inputs)
    assert out.grad_inputs == [1] and out.requires_grad == [False, True, False]
    assert len(out.backward.graph.output_node().args[0]) == 1
    joint_grads = list(out.joint.graph.output_node().args[0])[1:]
    assert joint_grads[0] is None and joint_grads[2] is None
    with pytest.raises(RuntimeError, match="require grad now"):
        out(*[i.detach().requires_grad_() for i in inputs])


def test_outputs_aliasing_inputs_and_each_other():
    def f(x):
        y = x * 2
        return x, x.view(-1), y, y, y.t()

    check_against_eager(f, [torch.randn(3, 4, requires_grad=True)])


def test_output_that_does_not_require_grad():
    def f(x):
        return x.sin(), x.argmax(), (x > 0)

    out = check_against_eager(f, [torch.randn(6, requires_grad=True)])
    assert out.diff_outputs == [0]
    assert [n.name for n in out.joint.graph.nodes if n.op == "placeholder"][-1] == "tangents_1"


# -- forward-only path ----------------------------------------------------------------------------
def test_forward_only_when_nothing_requires_grad():
    out = check_against_eager(sin_cos, [torch.randn(7)])
    assert out.joint is None and out.backward is None and out.saved_values == []
    assert packets(out.forward) == {aten.sin, aten.cos, aten.pow, aten.add}
    check_meta(out.forward, [torch.randn(7)])
    with pytest.raises(RuntimeError, match="traced without autograd"):
        out(torch.randn(7, requires_grad=True))


def test_forward_only_under_no_grad():
    x = torch.randn(7, requires_grad=True)
    with torch.no_grad():
        out = aot.aot_function(sin_cos, [x])
        (y,) = out(x)
    assert out.backward is None and not y.requires_grad
    torch.testing.assert_close(y, sin_cos(x.detach()), **TOL)


# -- constants, factories, scalars --------------------------------------------------------------
def test_constants_and_factory_ops():
    def f(x):
        c = torch.tensor([1.0, 2.0, 3.0])
        return x * 2.5 + c + torch.ones(3) * torch.arange(3) + torch.full((3,), 0.5).exp()

    out = check_against_eager(f, [torch.randn(3, requires_grad=True)])
    assert any(n.op == "get_attr" for n in out.joint.graph.nodes)
    assert {aten.lift_fresh, aten.ones, aten.arange} <= packets(out.forward)
    # a second call with new inputs is not baked into the graph
    check_against_eager(f, [torch.randn(3, requires_grad=True)], compiled=out)


def test_closed_over_tensor_requiring_grad_is_refused():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="closed-over tensor that requires grad"):
        aot.aot_function(lambda x: x * w, [torch.randn(3, requires_grad=True)])


def test_data_dependent_ops_are_refused():
    with pytest.raises(RuntimeError, match="nonzero"):
        aot.aot_function(lambda x: x.nonzero(), [torch.randn(4)])
    with pytest.raises(RuntimeError, match="_local_scalar_dense"):
        aot.aot_function(lambda x: x * x.sum().item(), [torch.randn(4)])


# -- functionalisation ----------------------------------------------------------------------------
def no_inplace_ops(gm):
    names = [str(t) for t in targets(gm)]
    return not any(n.split(".")[-2].endswith("_") or ".out" in n for n in names)


def test_inplace_on_intermediate():
    def f(x):
        y = x * 3
        y.mul_(2)
        y.add_(x, alpha=0.5)
        return y.sin()

    out = check_against_eager(f, [torch.randn(5, requires_grad=True)])
    assert no_inplace_ops(out.joint)
    check_against_eager(f, [torch.randn(5)])


def test_inplace_on_input_is_visible_to_the_caller():
    def f(x, buf):
        buf.mul_(2)
        return x * buf

    inputs = [torch.randn(4, requires_grad=True), torch.randn(4)]
    out = check_against_eager(f, inputs)  # also compares buf with eager's buf
    assert out.mutated_inputs == [1] and out.num_fwd_outputs == 2 and no_inplace_ops(out.joint)
    check_against_eager(f, [torch.randn(4), torch.randn(4)])  # forward-only path too
    buf = torch.ones(4)
    out(torch.randn(4), buf)
    out(torch.randn(4), buf)
    torch.testing.assert_close(buf, torch.full((4,), 4.0))  # applied once per call


def test_tracing_does_not_mutate_the_example_inputs():
    buf = torch.ones(3)
    aot.aot_function(lambda x: x.add_(1) * 2, [buf])
    torch.testing.assert_close(buf, torch.ones(3))


def test_relu_inplace_inside_a_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
    names = [n for n, _ in model.named_parameters()]

    def f(x, *ps):
        return torch.func.functional_call(model, dict(zip(names, ps)), (x,)).sum(-1)

    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    out = check_against_eager(f, [torch.randn(5, 8), *params])
    assert aten.relu in packets(out.joint) and no_inplace_ops(out.joint)
    check_against_eager(f, [torch.randn(2, 5, 8), *params])  # 3-D: linear goes via views


def test_copy_and_out_variants():
    def f(x, buf, dbl):
        buf.copy_(x[0].detach() * 2)  # same shape
        dbl.copy_(x.detach().sum(0, keepdim=True))  # broadcast + float32 -> float64
        y = torch.empty(3, 4)
        torch.mul(x.detach(), 3, out=y)
        return y + buf, dbl * 1

    inputs = [torch.randn(3, 4, requires_grad=True), torch.randn(4), torch.randn(2, 4).double()]
    out = check_against_eager(f, inputs)
    assert out.mutated_inputs == [1, 2] and no_inplace_ops(out.joint)
    assert {aten._to_copy, aten.expand} <= packets(out.joint)


# -- mutations that autograd records (issue 6, item 7) ---------------------------------------------
def check_autograd_mutation(fn, make_inputs, compiled):
    """Eager and ``compiled`` agree on outputs, the mutated inputs' values and histories (a loss
    reading them after the call), and the gradients of the leaves they came from."""
    results = []
    for run in (fn, compiled):
        torch.manual_seed(0)
        leaves, inputs = make_inputs()
        outs = as_tuple(run(*inputs))
        loss = sum((o * (k + 1)).sum() for k, o in enumerate(outs) if o.requires_grad)
        loss = loss + sum((x.sin() * 3).sum() for x in inputs if x.requires_grad)
        loss.backward()
        results.append((outs, [x.detach() for x in inputs], [leaf.grad for leaf in leaves]))
    (outs, values, grads), (ref_outs, ref_values, ref_grads) = results[1], results[0]
    for a, b in zip([*outs, *values, *grads], [*ref_outs, *ref_values, *ref_grads]):
        torch.testing.assert_close(a, b, **TOL)


def test_inplace_on_a_non_leaf_input_that_requires_grad():
    def g(x):
        x.mul_(2)
        return (x * x).sum()

    def make_inputs():
        a = torch.randn(4, requires_grad=True)
        return [a], [a * 1]  # not a leaf: eager lets g mutate it, and records it

    compiled = aot.aot_function(g, make_inputs()[1])
    assert compiled.mutated_inputs == [0] and compiled.diff_outputs == [0, 1]
    check_autograd_mutation(g, make_inputs, lambda x: compiled(x)[0])
    check_autograd_mutation(g, make_inputs, toycomp.compile(g, backend="cpp"))  # first call
    compiled_g = toycomp.compile(g, backend="cpp")
    compiled_g(make_inputs()[1][0])
    check_autograd_mutation(g, make_inputs, compiled_g)  # the compiled code, not the capture run
    assert len(compiled_g.entries) == 1 and compiled_g.eager_reason is None


def test_mutating_an_input_into_a_value_that_requires_grad():
    def f(x, buf):
        buf.copy_(x * 2)  # buf did not require grad; now it has x's history, as in eager
        return buf + 1

    def make_inputs():
        x = torch.randn(3, requires_grad=True)
        return [x], [x, torch.randn(3)]

    compiled = aot.aot_function(f, make_inputs()[1])
    check_autograd_mutation(f, make_inputs, lambda *args: compiled(*args)[0])


def test_mutating_a_leaf_that_requires_grad_fails_as_in_eager():
    def g(x):
        x.mul_(2)
        return x.sum()

    a = torch.randn(3, requires_grad=True)
    compiled = aot.aot_function(g, [(a * 1)])
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        g(a)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        compiled(a)


def test_saved_inputs_are_not_overwritten_by_the_epilogue():
    def f(x):
        y = x.unsqueeze(1).expand(4, 64).exp()  # min-cut saves the small old x, not exp
        x.mul_(2)
        return y

    def make_inputs():
        a = torch.randn(4, requires_grad=True)
        return [a], [a * 1]

    compiled = aot.aot_function(
        f, make_inputs()[1], partition_fn=min_cut_rematerialization_partition
    )
    assert compiled.saved_values == ["primals_1"]
    check_autograd_mutation(f, make_inputs, lambda x: compiled(x)[0])


def test_dtype_promotion_in_inplace_op():
    def f(x, h):
        h.mul_(x)  # float16 *= float32 stays float16
        return h.float() + x

    check_against_eager(f, [torch.randn(4), torch.randn(4).half()])


def test_inplace_through_views():
    def mutate_view_of_intermediate(x):
        y = x * 1
        y[0].mul_(2)
        y[:, 1:].add_(y[:, :1])
        return y

    def mutate_view_of_input(x):
        x[1:].add_(1)
        x.t()[0].mul_(3)
        x.unsqueeze(0)[:, :, -1].sub_(0.5)
        return x * 2

    out = check_against_eager(mutate_view_of_intermediate, [torch.randn(3, 2, requires_grad=True)])
    assert no_inplace_ops(out.joint) and aten.as_strided_scatter in packets(out.joint)
    check_against_eager(mutate_view_of_input, [torch.randn(3, 2)])
    check_against_eager(mutate_view_of_input, [torch.randn(4, 3).t()])  # strided input
    out = aot.aot_function(mutate_view_of_input, [torch.randn(3, 2)])
    check_against_eager(mutate_view_of_input, [torch.randn(2, 3).t()], compiled=out)


def test_copy_from_a_view_into_a_tensor_with_aliases():
    def f(x, y):
        z = x * 1
        row = z[0]
        z.copy_(y[1:3])  # z's new value is a view of y with a storage offset
        return row * 2, z

    check_against_eager(f, [torch.randn(2, 3, requires_grad=True), torch.randn(4, 3)])


def test_as_strided_on_an_input_with_a_storage_offset_is_refused():
    def f(x):
        return x.as_strided((2,), (1,), 1) * 2

    out = aot.aot_function(f, [torch.randn(4)])
    torch.testing.assert_close(out(torch.arange(4.0))[0], torch.tensor([2.0, 4.0]))
    with pytest.raises(RuntimeError, match="storage offset"):
        out(torch.arange(5.0)[1:])


def test_inplace_through_a_dtype_view_is_refused():
    def f(x):
        y = x * 1
        y.view(torch.int32).bitwise_or_(1)
        return y

    with pytest.raises(RuntimeError, match="aten.bitwise_or_"):
        aot.aot_function(f, [torch.randn(3, 2)])


def test_inplace_on_a_view_whose_base_is_not_read_again():
    def f(x):
        z = (x * 1).view(-1)
        z.add_(1)
        return z

    check_against_eager(f, [torch.randn(3, 2, requires_grad=True)])


# -- layouts: a node has its tensor's layout (functionalize.py) ---------------------------------
def significant_strides(t):
    return [s for n, s in zip(t.shape, t.stride()) if n > 1]


class LayoutChecker(fx.Interpreter):
    """Every call_function node's meta["val"] has the strides that replaying it gives (size-1
    dimensions aside: their strides are arbitrary, and eager picks them case by case)."""

    def run_node(self, n):
        result = super().run_node(n)
        if n.op == "call_function" and isinstance(result, torch.Tensor):
            meta = n.meta["val"]
            assert result.shape == meta.shape, n.name
            assert significant_strides(result) == significant_strides(meta), n.format_node()
        return result


def check_joint_meta(out, inputs):
    """The joint graph's meta["val"] strides are the real ones (replayed on real inputs)."""
    placeholders = [n for n in out.joint.graph.nodes if n.op == "placeholder"]
    tangents = [torch.ones(n.meta["val"].shape) for n in placeholders[len(inputs) :]]
    out.joint.graph.lint()
    LayoutChecker(out.joint).run(*[x.detach() for x in inputs], *tangents)


def copy_transposed_then_as_strided(a):
    r = torch.empty(5, 4)
    r.copy_(a.t())
    return r.as_strided([4], [1], 0) * 1, r.view(-1) * 1  # eager: a[:4, 0]; r's memory order


def copy_expanded_then_as_strided(v):
    r = torch.empty(3, 4)
    r.copy_(v)  # v: (4,) broadcast, stride 0 in dim 0
    return r.as_strided([2, 2], [4, 1], 2) + 0, r.view(2, 6) * 2


def copy_into_an_offset_view_then_as_strided(a):
    buf = torch.zeros(12)
    r = buf[2:12].view(2, 5)
    r.copy_(a.t())  # a: (5, 2)
    return r.as_strided([3], [2], 3) * 1, buf * 1  # storage offset 3: buf[3], buf[5], buf[7]


def as_strided_reaching_outside_its_view(a, b):
    x = a * 1
    row0, row1 = x[0], x[1]
    row1.copy_(b)  # row0 does not overlap row1: only x is regenerated
    return row0.as_strided([6], [1], 0) * 1, row1.as_strided([2], [3], 1) * 1


def as_strided_inplace(a):
    y = a * 1
    z = y.t()
    z.as_strided_([3], [4], 1)
    z.mul_(2)
    return y, z * 1


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (copy_transposed_then_as_strided, [(4, 5)]),
        (copy_expanded_then_as_strided, [(4,)]),
        (copy_into_an_offset_view_then_as_strided, [(5, 2)]),
        (as_strided_reaching_outside_its_view, [(2, 3), (3,)]),
        (as_strided_inplace, [(3, 4)]),
    ],
)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_views_after_copy_and_as_strided_see_the_real_layout(fn, shapes, requires_grad):
    torch.manual_seed(0)
    inputs = [torch.randn(s, requires_grad=requires_grad) for s in shapes]
    out = check_against_eager(fn, inputs)
    if requires_grad:
        check_joint_meta(out, inputs)


def inplace_on_a_row_then_transpose(x, m):
    y = x * 1
    y[1].mul_(2)
    return y.t() * m  # the gradient reaching CopySlices is transposed


def inplace_on_a_row_then_sum(x):
    y = x * 1
    y[1].mul_(2)
    return y.sum()  # the gradient reaching CopySlices is an expand (stride 0)


def test_gradient_through_copyslices_with_a_strided_incoming_gradient():
    torch.manual_seed(0)
    x, m = torch.randn(4, 5, requires_grad=True), torch.randn(5, 4)
    for fn, inputs in [(inplace_on_a_row_then_transpose, [x, m]), (inplace_on_a_row_then_sum, [x])]:
        out = check_against_eager(fn, inputs)
        check_joint_meta(out, inputs)
        (g,) = torch.autograd.grad(out(*inputs)[0].sum(), x)
        (ge,) = torch.autograd.grad(fn(*inputs).sum(), x)
        torch.testing.assert_close(g, ge, **TOL)


def inplace_on_a_row(x):
    y = x * 1
    y[1].mul_(2)
    return y


def test_gradient_with_a_storage_offset_reaches_as_strided_correctly():
    x = torch.randn(4, 5, requires_grad=True)
    out = aot.aot_function(inplace_on_a_row, [x])
    grad_out = torch.randn(21)[1:].view(4, 5)  # storage offset 1
    (g,) = torch.autograd.grad(out(x)[0], x, grad_out)
    (ge,) = torch.autograd.grad(inplace_on_a_row(x), x, grad_out)
    torch.testing.assert_close(g, ge, **TOL)


def test_as_strided_of_overwritten_memory_is_refused():
    def f(x):
        y = x * 1
        y.view(torch.int32)[0].bitwise_or_(1)  # no root of one dtype: y becomes stale
        return y.as_strided([2], [1], 0) * 1

    with pytest.raises(RuntimeError, match="aten.as_strided"):
        aot.aot_function(f, [torch.randn(3, 2)])


def test_writing_to_an_expanded_tensor_is_refused():
    def f(x):
        y = x * 1
        y.expand(2, 3).fill_(2.0)  # eager allows it: every element gets the same value
        return y

    with pytest.raises(NotImplementedError, match="aten.fill_"):
        aot.aot_function(f, [torch.randn(3)])


def test_closed_over_strided_constants_keep_their_layout():
    expanded, cols = torch.randn(1, 3).expand(4, 3), torch.randn(8, 6)[:, ::2]  # stride 0; gaps

    def f(x):
        return x * expanded.t(), x * cols.t()[:, :4], cols.view(4, 2, 3)[1:].sum()

    check_against_eager(f, [torch.randn(3, 4)])
    out = aot.aot_function(f, [torch.randn(3, 4)])
    check_meta(out.forward, [torch.randn(3, 4)])


# -- randomized in-place-through-view programs, compared with eager --------------------------
def _views(v):
    """Random views of ``v``: (name, args) the interpreter below knows."""
    dims = [d for d in range(v.ndim) if v.shape[d] > 1]
    out = [("unsqueeze", (0,)), ("transpose", (0, v.ndim - 1))] if v.ndim else []
    for d in dims:
        out += [("select", (d, v.shape[d] - 1)), ("slice", (d, 1, v.shape[d], 2))]
    if v.ndim >= 2:
        out.append(("diagonal", ()))
    if v.is_contiguous() and v.ndim:
        out.append(("view_flat", ()))
    if v.ndim <= 2 and v.numel() > 0:
        out.append(("reshape", ((-1,),)))
    return out


def _as_strided_args(rng, v):
    """size, stride, offset of a non-overlapping as_strided inside ``v``'s storage."""
    n = v.untyped_storage().nbytes() // v.element_size()
    a, b, s1 = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 2)
    s0 = b * s1 + rng.randint(0, 1)
    size, stride = ([a, b], [s0, s1]) if rng.random() < 0.5 else ([b, a], [s1, s0])
    last = (a - 1) * s0 + (b - 1) * s1
    return size, stride, rng.randint(0, max(0, n - 1 - last))


def _random_step(rng, env):
    i = rng.randrange(len(env))
    v = env[i]
    kind = rng.choice(["view", "view", "as_strided", "mul_", "add_", "copy_t", "copy_bcast",
                       "zero_", "fresh"])  # fmt: skip
    if kind == "view":
        views = _views(v)
        return ("view", i, *rng.choice(views)) if views else ("fresh", i)
    if kind == "as_strided":
        return ("as_strided", i, *_as_strided_args(rng, v))
    return (kind, i, rng.randrange(len(env)), round(rng.uniform(-2, 2), 2))


def _apply(step, env):
    kind, i, *rest = step
    v = env[i]
    if kind == "view":
        name, args = rest
        if name == "slice":  # v[..., start:end:step] in dimension d
            d, start, end, step_ = args
            env.append(v[(slice(None),) * d + (slice(start, end, step_),)])
        else:
            new = {"view_flat": lambda: v.view(-1), "diagonal": lambda: v.diagonal()}.get(name)
            env.append(new() if new else getattr(v, name)(*args))
    elif kind == "as_strided":
        env.append(v.as_strided(*rest))
    elif kind == "fresh":
        env.append(v * 1.5)
    else:
        j, c = rest
        if kind == "mul_":
            v.mul_(c)
        elif kind == "add_":
            v.add_(env[j].sum() * c)
        elif kind == "copy_t":  # a source laid out transposed
            src = torch.arange(v.numel(), dtype=v.dtype).reshape(v.shape[::-1]) * c
            v.copy_(src.permute(list(reversed(range(v.ndim)))) + env[j].sum() * 0.1)
        elif kind == "copy_bcast":  # a stride-0 source
            v.copy_((env[j].sum() * c).expand(v.shape))
        elif kind == "zero_":
            v.zero_()


def random_program(seed, n_steps, mutate_input):
    """A list of steps that eager PyTorch runs (forward and backward) without error."""
    rng = random.Random(seed)
    steps = []
    while len(steps) < n_steps:
        step = _random_step(rng, _run_program(steps, example_input(seed, mutate_input)))
        try:
            outs = _run_program(steps + [step], example_input(seed, mutate_input))
            if not mutate_input:
                sum(o.sum() for o in outs).backward()
        except RuntimeError:
            continue  # an op eager refuses (overlapping in-place, modified saved tensor...)
        steps.append(step)
    return steps


def example_input(seed, mutate_input):
    """A (4, 6) input; for odd seeds a transposed (strided) one."""
    x = torch.randn(4, 6) if seed % 2 else torch.randn(6, 4).t()
    return x.requires_grad_(not mutate_input)


def _run_program(steps, x):
    env = [x if not x.requires_grad else x * 1]
    for step in steps:
        _apply(step, env)
    return env


@pytest.mark.parametrize("mutate_input", [False, True])
@pytest.mark.parametrize("seed", range(16))
def test_random_inplace_through_view_programs_equal_eager(seed, mutate_input):
    steps = random_program(seed, 8, mutate_input)

    def program(x):
        return tuple(t * 1 for t in _run_program(steps, x))

    torch.manual_seed(seed)
    x = example_input(seed, mutate_input)
    out = check_against_eager(program, [x])
    if not mutate_input:
        check_joint_meta(out, [x])


def test_batch_norm_updates_running_stats_like_eager():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4)

    def f(x, weight, bias, mean, var, count):
        state = dict(weight=weight, bias=bias, running_mean=mean, running_var=var)
        state["num_batches_tracked"] = count
        return torch.func.functional_call(bn, state, (x,))

    inputs = [torch.randn(6, 4), torch.rand(4).requires_grad_(), torch.randn(4).requires_grad_()]
    inputs += [torch.randn(4), torch.rand(4) + 0.5, torch.tensor(0)]
    out = check_against_eager(f, inputs)
    assert out.mutated_inputs == [3, 4, 5]
    assert aten._native_batch_norm_legit_functional in packets(out.joint)


def test_rnn_is_recorded_as_native_ops():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4, batch_first=True)
    names = [n for n, _ in lstm.named_parameters()]

    def f(x, *ps):
        out, (h, c) = torch.func.functional_call(lstm, dict(zip(names, ps)), (x,))
        return out, h, c

    params = [p.detach().clone().requires_grad_() for p in lstm.parameters()]
    out = check_against_eager(f, [torch.randn(2, 3, 3), *params])
    assert not any("mkldnn" in str(t) or "cudnn" in str(t) for t in targets(out.joint))
    assert torch.backends.mkldnn.enabled  # the backend flags are restored after tracing


# -- compilers -----------------------------------------------------------------------------
def test_custom_compilers_are_used():
    calls = {"compile": [], "run": []}

    def counting_compiler(gm, example_inputs):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        assert len(example_inputs) == len(placeholders)
        for t, n in zip(example_inputs, placeholders):
            assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
            assert (t.shape, t.dtype) == (n.meta["val"].shape, n.meta["val"].dtype)
        calls["compile"].append(gm)

        def run(args):
            assert isinstance(args, list)
            calls["run"].append(gm)
            return gm(*args)

        return run

    x = torch.randn(10, requires_grad=True)
    out = aot.aot_function(sin_cos, [x], fw_compiler=counting_compiler)
    assert calls["compile"] == [out.forward, out.backward]
    check_against_eager(sin_cos, [x], compiled=out)
    assert calls["run"] == [out.forward, out.backward]
    # a compiler whose callable changes the results proves the compiled callables are used
    broken = aot.aot_function(
        sin_cos, [x], bw_compiler=lambda gm, ex: lambda args: [g * 0 + 7 for g in gm(*args)]
    )
    (y,) = broken(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, torch.full_like(x, 7.0))


def test_backward_example_inputs_are_the_real_saved_values():
    seen = {}

    def recording(gm, example_inputs):
        seen[gm] = example_inputs
        return lambda args: gm(*args)

    x = torch.randn(6, requires_grad=True)
    out = aot.aot_function(sin_cos, [x], fw_compiler=recording)
    fw_results = out.forward(x.detach())
    expected = [*fw_results[1:], torch.ones(6)]
    for got, want in zip(seen[out.backward], expected):
        torch.testing.assert_close(got, want)
    assert operator.getitem not in targets(out.forward)


# -- output aliasing ------------------------------------------------------------------------
COPY_OPS = {aten.clone.default, aten._to_copy.default}


class CopiesBecomeIdentity(fx.Interpreter):
    """What stages 3/4 do to a copy that keeps dtype and device: return its input."""

    def call_function(self, target, args, kwargs):
        src = args[0] if args else None
        same = isinstance(src, torch.Tensor) and kwargs.get("dtype", src.dtype) == src.dtype
        if target in COPY_OPS and same and kwargs.get("device", src.device) == src.device:
            return src
        return super().call_function(target, args, kwargs)


def copies_become_identity(gm, example_inputs):
    return lambda args: CopiesBecomeIdentity(gm).run(*args)


def storage(t):
    return t.untyped_storage().data_ptr()


def as_tuple(outs):
    return (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)


def sharing(outs, inputs):
    """For each output: does it share storage with each input, and with each earlier output?"""
    outs = as_tuple(outs)
    return [
        ([storage(o) == storage(x) for x in inputs], [storage(o) == storage(p) for p in outs[:i]])
        for i, o in enumerate(outs)
    ]


def eager_sharing(fn, inputs):
    clones = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    return sharing(fn(*clones), clones)


def clone_then_mutate(x, buf):
    y = buf.clone()
    buf.add_(1)
    return x * 2, y  # y holds buf's value from *before* the add


ALIASING_CASES = {
    "clone": lambda x: x.clone(),
    "clone_and_sin": lambda x: (x.clone(), x.sin()),
    "t_contiguous": lambda x: x.t().contiguous(),
    "to_copy": lambda x: x.to(torch.float32, copy=True),
    "mixed": lambda x: (x, x.t(), x.detach(), x[1:], x.clone(), x.contiguous(), x.t().clone()),
    "two_outputs_one_buffer": lambda x: ((y := x.sin()), y.clone(), y.view(-1)),
}


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", sorted(ALIASING_CASES))
def test_outputs_share_memory_only_where_eager_does(name, requires_grad):
    fn = ALIASING_CASES[name]
    x = torch.randn(4, 6, requires_grad=requires_grad)
    compiled = aot.aot_function(fn, [x], fw_compiler=copies_become_identity)
    check_against_eager(fn, [x], compiled=compiled)  # values and gradients
    ours = [x.detach().clone().requires_grad_(requires_grad)]
    assert sharing(compiled(*ours), ours) == eager_sharing(fn, [x])


def test_the_compiler_really_returns_inputs_and_the_runtime_copies():
    x = torch.randn(4, 6)
    compiled = aot.aot_function(lambda x: x.clone(), [x], fw_compiler=copies_become_identity)
    (raw,) = compiled.compiled_forward([x])
    assert raw is x  # what the runtime wrapper has to repair
    (out,) = compiled(x)
    out.add_(1)  # a user writing into the output must not change the input
    torch.testing.assert_close(out, x + 1)
    assert storage(out) != storage(x)
    # the copy has eager's strides, not the compiled graph's
    t_contiguous = aot.aot_function(
        lambda x: x.t().contiguous(), [x], fw_compiler=copies_become_identity
    )
    assert t_contiguous(x)[0].stride() == x.t().contiguous().stride() == (4, 1)


def test_copy_is_taken_before_the_input_mutation_epilogue():
    inputs = [torch.randn(3, requires_grad=True), torch.randn(3)]
    compiled = aot.aot_function(clone_then_mutate, inputs, fw_compiler=copies_become_identity)
    check_against_eager(clone_then_mutate, inputs, compiled=compiled)
    ours = [inputs[0].detach().clone().requires_grad_(), inputs[1].clone()]
    assert sharing(compiled(*ours), ours) == eager_sharing(clone_then_mutate, inputs)


def test_saved_values_are_not_copied():
    seen = []

    def recording_backward(gm, example_inputs):
        def run(args):
            seen.extend(storage(a) for a in args)
            return gm(*args)

        return run

    x = torch.randn(5, requires_grad=True)
    compiled = aot.aot_function(
        lambda x: (x.clone(), x.sin()),
        [x],
        fw_compiler=copies_become_identity,
        bw_compiler=recording_backward,
    )
    assert compiled.saved_values == ["primals_1"]  # cos(x) needs x
    clone, sin = compiled(x)
    (clone.sum() + sin.sum()).backward()
    assert storage(x) in seen and storage(clone) != storage(x)
    torch.testing.assert_close(x.grad, 1 + torch.cos(x.detach()))


def test_constant_outputs_are_fresh_on_every_call():
    def f(x):
        return x * 2, torch.tensor([1.0, 2.0])

    compiled = aot.aot_function(f, [torch.randn(2)])
    first = compiled(torch.randn(2))[1]
    first.add_(5)  # must not leak into the next call's result
    torch.testing.assert_close(compiled(torch.randn(2))[1], torch.tensor([1.0, 2.0]))


E2E_CASES = ["clone", "clone_and_sin", "t_contiguous", "mixed"]


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", E2E_CASES)
def test_toycomp_compile_outputs_alias_like_eager(name, requires_grad):
    fn = ALIASING_CASES[name]
    x = torch.randn(4, 10, requires_grad=requires_grad)
    compiled = toycomp.compile(fn, backend="cpp")
    check_against_eager(fn, [x], compiled=lambda *args: as_tuple(compiled(*args)))
    ours = [x.detach().clone().requires_grad_(requires_grad)]
    assert sharing(compiled(*ours), ours) == eager_sharing(fn, [x])


# -- in-place views (issue 6, item 6) --------------------------------------------------------------
def matmul(a, b):
    return torch.matmul(a, b)


def unsqueeze_then_squeeze(x):
    y = x * 1
    y.unsqueeze_(0)
    z = y * 2
    z.squeeze_(0)
    return y + 1, z


def transpose_and_t(x):
    y = x * 1
    y.transpose_(0, 1)
    z = y.reshape(-1) * 1
    y.t_()
    return y[0] * 1, z


INPLACE_VIEW_CASES = [
    (matmul, [(3,), (3, 1)]),  # matmul squeezes its (1, 1) mm result in place
    (matmul, [(1,), (1, 1)]),
    (matmul, [(2, 3), (3,)]),
    (unsqueeze_then_squeeze, [(3,)]),
    (transpose_and_t, [(2, 3)]),
]


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("fn, shapes", INPLACE_VIEW_CASES)
def test_inplace_views_are_described_by_their_result(fn, shapes, requires_grad):
    inputs = [torch.randn(s, requires_grad=requires_grad) for s in shapes]
    compiled = check_against_eager(fn, inputs)
    check_meta(compiled.forward, inputs)


# -- double backward (issue 6, item 2) -------------------------------------------------------------
def test_double_backward_is_refused_not_silently_wrong():
    a = torch.randn(5, requires_grad=True)
    compiled = toycomp.compile(lambda a: (a.sin() ** 2).sum(), backend="cpp")
    g, = torch.autograd.grad(compiled(a) + (a**3).sum(), a, create_graph=True)
    g_ref, = torch.autograd.grad((a.sin() ** 2).sum() + (a**3).sum(), a, create_graph=True)
    torch.testing.assert_close(g, g_ref, **TOL)  # first order: right, and differentiable
    with pytest.raises(RuntimeError, match="toycomp.*double backward.*uncompiled function"):
        torch.autograd.grad(g.sum(), a)  # would drop the compiled part's second derivative


def test_double_backward_through_aot_function_alone_is_refused():
    x = torch.randn(4, requires_grad=True)
    compiled = aot.aot_function(lambda x: x.exp() * x, [x])
    g, = torch.autograd.grad(compiled(x)[0].sum(), x, create_graph=True)
    torch.testing.assert_close(g, (x.exp() * (x + 1)).detach(), **TOL)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


def test_first_order_backward_is_unaffected_by_the_double_backward_guard():
    x = torch.randn(4, requires_grad=True)
    compiled = aot.aot_function(lambda x: x.exp() * x, [x])
    g, = torch.autograd.grad(compiled(x)[0].sum(), x)
    assert g.grad_fn is None and not g.requires_grad
    torch.testing.assert_close(g, (x.exp() * (x + 1)).detach(), **TOL)


# -- inference mode (issue 6, item 9) --------------------------------------------------------------
def test_inference_tensors_as_inputs_and_calls_under_inference_mode():
    def f(x, w, buf):
        buf.add_(1)
        return (x.sin() * w).sum(0) + buf

    with torch.inference_mode():
        x_inf, buf_inf = torch.randn(4, 3), torch.zeros(3)
    w = torch.randn(3, requires_grad=True)
    compiled = aot.aot_function(f, [x_inf, w, torch.zeros(3)])
    check_against_eager(f, [x_inf, w, torch.zeros(3)], compiled=compiled)
    with torch.inference_mode():  # inference tensors, in place, under inference mode
        out, = compiled(x_inf, w, buf_inf)
        torch.testing.assert_close(out, f(x_inf, w, torch.zeros(3)), **TOL)
        torch.testing.assert_close(buf_inf, torch.ones(3))
    with torch.inference_mode():  # traced under inference mode
        traced = aot.aot_function(f, [x_inf, w, buf_inf])
        out, = traced(torch.randn(4, 3), w, buf_inf)
    assert traced.backward is None and out.is_inference()
    torch.testing.assert_close(buf_inf, torch.full((3,), 2.0))  # tracing mutates copies


# -- extern outputs on another device (issue 6, item 10) -------------------------------------------
# On CUDA, aten._scaled_dot_product_efficient_attention returns its RNG seed and offset as CPU
# scalars, saved for the backward. This op does the same on a CPU-only machine: a result on
# its input's device, and an int64 scalar on another (the meta device, the only other one).
_SEED_LIB = torch.library.Library("toycomp_tests", "DEF")
_SEED_LIB.define("scale_with_seed(Tensor x) -> (Tensor, Tensor)")
_SEED_LIB.define("scale_with_seed_backward(Tensor grad, Tensor seed) -> Tensor")


def _scale_with_seed(x):
    return x * 2, torch.empty((), dtype=torch.int64, device="meta")


def _scale_with_seed_backward(grad, seed):
    assert seed.device.type == "meta", f"the seed arrived on {seed.device}"
    return grad * 2


_SEED_LIB.impl("scale_with_seed", _scale_with_seed, "CPU")
_SEED_LIB.impl("scale_with_seed", lambda x: (torch.empty_like(x), _scale_with_seed(x)[1]), "Meta")
for _key in ("CPU", "Meta"):  # a meta argument makes the dispatcher pick the Meta kernel
    _SEED_LIB.impl("scale_with_seed_backward", _scale_with_seed_backward, _key)
torch.library.register_autograd(
    "toycomp_tests::scale_with_seed",
    lambda ctx, grad, _: torch.ops.toycomp_tests.scale_with_seed_backward(grad, ctx.seed),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "seed", output[1]),
)


def scaled_sin_with_seed(x):
    y, _ = torch.ops.toycomp_tests.scale_with_seed(x.sin())
    return y.sum()


def test_backward_gets_extern_outputs_on_the_device_the_real_op_made_them():
    seen = {}

    def recording(name):
        def compiler(gm, example_inputs):
            seen[name] = {n.name: t.device.type for n, t in zip(gm.graph.nodes, example_inputs)}
            return lambda args: gm(*args)

        return compiler

    x = torch.randn(4, requires_grad=True)
    compiled = aot.aot_function(scaled_sin_with_seed, [x], recording("fw"), recording("bw"))
    assert seen["bw"] == {"primals_1": "cpu", "getitem_1": "meta", "tangents_1": "cpu"}
    cpu, meta = torch.device("cpu"), torch.device("meta")
    for gm in (compiled.joint, compiled.forward, compiled.backward):  # [Note: a node's device]
        devices = {n.name: n.meta["device"] for n in gm.graph.nodes if n.op != "output"}
        assert devices.pop("getitem_1") == meta, gm.code
        assert devices.pop("scale_with_seed", (cpu, meta)) == (cpu, meta)
        assert set(devices.values()) == {cpu}, devices
    check_against_eager(scaled_sin_with_seed, [x], compiled=compiled)


def test_every_node_records_its_device():
    x = torch.randn(3, 4, requires_grad=True)

    def f(x):
        y = x * 1
        y[0].add_(1)  # as_strided_scatter, regenerated views
        return y.t().contiguous(), torch.tensor([1.0, 2.0]) * x[:, :2]

    def g(x, buf, m, v):
        buf.copy_(x.detach().double().sum(0))  # _to_copy and expand of a value it writes
        return F.batch_norm(x, m, v, training=True) * 2  # a functionalised multi-output op

    stats = [torch.zeros(4).double(), torch.zeros(4), torch.ones(4)]
    for fn, inputs in [(f, [x]), (g, [x, *stats])]:
        joint = aot.trace_joint(fn, inputs)
        for node in joint.graph.nodes:
            if node.op != "output":
                devices = node.meta["device"]
                devices = devices if isinstance(devices, tuple) else (devices,)
                assert set(devices) - {None} == {torch.device("cpu")}, node.name


def test_toycomp_compile_with_an_extern_output_on_another_device():
    # [Note: extern seeds]: the compiled backward takes the seed on the device the op made it
    x = torch.randn(4, requires_grad=True)
    compiled = toycomp.compile(scaled_sin_with_seed, backend="cpp")
    check_against_eager(scaled_sin_with_seed, [x], compiled=lambda x: (compiled(x),))


# --- tracing on fake tensors (issue 7, item 2) --------------------------------------------------
def _views_and_mutations(x, w):
    y = x * 2
    y[0].add_(1)  # a write through a view: as_strided_scatter
    return (y.t() @ w).relu(), y.sum()


def _mutates_input(x, w):
    x.mul_(2)
    return torch.nn.functional.gelu(x + w.sum())


@pytest.mark.parametrize("fn", [_views_and_mutations, _mutates_input])
def test_aot_on_fake_inputs_records_the_real_trace(fn):
    from toycomp._torch_compat import fake_tensor_mode, is_fake

    x, w = torch.randn(3, 4), torch.randn(3, 5, requires_grad=True)
    fake_mode = fake_tensor_mode()
    fakes = [fake_mode.from_tensor(t) for t in (x, w)]
    real = aot.aot_function(fn, [x.clone(), w])
    fake = aot.aot_function(fn, fakes)
    for name in ("joint", "forward", "backward"):
        assert getattr(fake, name).code == getattr(real, name).code, name
    nodes = [n for n in fake.joint.graph.nodes if "val" in n.meta]
    assert not any(is_fake(n.meta["val"]) for n in nodes if isinstance(n.meta["val"], torch.Tensor))
    assert fake.mutated_inputs == real.mutated_inputs
    assert fake.output_alias_info == real.output_alias_info
    x1 = torch.randn(3, 4)
    x2 = x1.clone()
    for a, b in zip(fake(x1, w), real(x2, w)):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(x1, x2)


def test_inputs_keep_their_traced_layout_after_the_fast_check():
    """AOTOutput hands the compiled forward its inputs with the traced strides; after a call
    whose inputs needed no copy, a C++ check lets the same layouts through as they are
    ([Note: inputs checked once] in inductor/wrapper.py): other strides must still be copied."""
    seen = []

    def fw_compiler(gm, example_inputs):
        def run(args):
            seen.append([a.stride() for a in args])
            return gm(*args)
        return run

    def fn(a, b):
        return (a * b).sin()

    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)
    plain = lambda gm, example_inputs: (lambda args: gm(*args))  # noqa: E731
    compiled = aot.aot_function(fn, [a, b], fw_compiler=fw_compiler, bw_compiler=plain)
    for _ in range(2):
        check_against_eager(fn, [a, b], compiled=compiled)
    for other in (b.t().contiguous().t(), torch.randn(4, 6)[:, ::2]):
        check_against_eager(fn, [a, other], compiled=compiled)
        check_against_eager(fn, [a, b], compiled=compiled)
    assert seen and all(strides == [(3, 1), (3, 1)] for strides in seen)
    with pytest.raises(RuntimeError, match="expected a torch.float32 tensor of shape"):
        compiled(a, torch.randn(4, 4))


def test_outputs_and_inputs_neither_tensors_nor_sizes_are_refused_by_name():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="output 1 is a float, not a tensor or a size"):
        aot.aot_function(lambda t: (t.sin(), 1.5), [x])
    with pytest.raises(TypeError, match="an input is a str, not a tensor or a size"):
        aot.aot_function(lambda t, s: t.sin(), [x, "s"])
