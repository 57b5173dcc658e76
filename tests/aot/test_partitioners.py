"""Tests for toycomp/aot/partitioners.py: min_cut_rematerialization_partition.

Eager PyTorch is the oracle for values and gradients; graph properties (what is saved, what is
recomputed) are checked on the graphs themselves.
"""

import torch
import torch.nn.functional as F
from torch import nn

from toycomp.aot import aot_autograd as aot
from toycomp.aot.partitioners import (
    default_partition,
    min_cut_rematerialization_partition,
    saved_bytes,
    should_ban_recomputation,
)

aten = torch.ops.aten
TOL = dict(rtol=1e-4, atol=1e-5)
min_cut = min_cut_rematerialization_partition


def sin_cos(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def count(gm, packet):
    return sum(getattr(n.target, "overloadpacket", None) is packet for n in gm.graph.nodes)


def random_nodes(gm):
    return [n.name for n in gm.graph.nodes
            if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())]  # fmt: skip


def check_against_eager(fn, inputs, partition_fn=min_cut, seed=0):
    """aot_function(fn, partition_fn) gives eager's outputs and gradients (same RNG seed)."""
    compiled = aot.aot_function(fn, inputs, partition_fn=partition_fn)
    results = []
    for run in (compiled, fn):
        args = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        torch.manual_seed(seed)
        outs = run(*args)
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        diff = [o for o in outs if o.requires_grad]
        torch.manual_seed(seed + 1)
        weights = [torch.randn_like(o) for o in diff]
        wrt = [a for a in args if a.requires_grad]
        grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(diff, weights)), wrt)
        results.append((outs, grads, args))
    (outs, grads, args), (e_outs, e_grads, e_args) = results
    for a, b in zip(outs + grads + tuple(args), e_outs + e_grads + tuple(e_args)):
        torch.testing.assert_close(a.detach(), b.detach(), **TOL)
    return compiled


# -- the running example --------------------------------------------------------------------------
def test_sin_cos_saves_only_x_and_recomputes_sin_and_cos():
    x = torch.randn(100, requires_grad=True)
    compiled = check_against_eager(sin_cos, [x])
    assert compiled.saved_values == ["primals_1"]
    # One sin and one cos in the backward (CSE merged the forward's and autograd's copies).
    assert count(compiled.backward, aten.sin) == 1 and count(compiled.backward, aten.cos) == 1
    bw_inputs = [n.name for n in compiled.backward.graph.nodes if n.op == "placeholder"]
    assert bw_inputs == ["primals_1", "tangents_1"]


def test_min_cut_partition_directly_has_default_partitions_contract():
    x = torch.randn(7, requires_grad=True)
    joint = aot.trace_joint(sin_cos, [x])
    forward, backward, saved = min_cut(joint, num_fwd_outputs=1)
    out, *saved_values = forward(x.detach())
    assert len(saved_values) == len(saved) == 1
    (grad,) = backward(*saved_values, torch.ones(7))
    (expected,) = torch.autograd.grad(sin_cos(x).sum(), x)
    torch.testing.assert_close(out, sin_cos(x.detach()), **TOL)
    torch.testing.assert_close(grad, expected, **TOL)


def test_sin_cos_through_toycomps_compilers():
    """The min-cut graphs go through stages 3 and 4 (C++) like the default ones."""
    from toycomp.pipeline import inductor_compiler

    x = torch.randn(64, requires_grad=True)
    graphs = []
    compiled = aot.aot_function(
        sin_cos,
        [x],
        fw_compiler=inductor_compiler("cpp", "forward", graphs),
        bw_compiler=inductor_compiler("cpp", "backward", graphs),
        partition_fn=min_cut,
    )
    (y,) = compiled(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    (expected,) = torch.autograd.grad(sin_cos(x).sum(), x)
    torch.testing.assert_close(y, sin_cos(x), **TOL)
    torch.testing.assert_close(g, expected, **TOL)
    assert [a.name for a in graphs] == ["forward", "backward"]


# -- a training step ------------------------------------------------------------------------------
def test_mlp_gradients_equal_eager_and_min_cut_saves_less():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]

    def loss(inputs, targets, w1, b1, w2, b2):
        return F.cross_entropy(F.linear(F.gelu(F.linear(inputs, w1, b1)), w2, b2), targets)

    inputs = [torch.randn(32, 64), torch.randint(0, 10, (32,)), *params]
    totals = {}
    for partition_fn in (default_partition, min_cut):
        compiled = check_against_eager(loss, inputs, partition_fn)
        totals[partition_fn.__name__] = saved_bytes(compiled.forward, compiled.saved_values)
    print(f"MLP saved bytes: {totals}")
    assert totals["min_cut_rematerialization_partition"] <= totals["default_partition"]
    # The matmul outputs are saved, never recomputed: the backward runs eager's three mm.
    assert "addmm" in compiled.saved_values and count(compiled.backward, aten.addmm) == 0
    assert count(compiled.backward, aten.mm) == 3


def test_matmul_is_saved_even_when_recomputing_it_would_save_bytes():
    # The backward needs x and w anyway (for the gradients), so by bytes alone recomputing
    # mm = x @ w would be free; it is banned from recomputation, so it is saved.
    def chain(x, w):
        return (x @ w).sin().cos()

    x, w = torch.randn(4, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)
    compiled = check_against_eager(chain, [x, w])
    assert "mm" in compiled.saved_values
    assert count(compiled.backward, aten.mm) == 2  # the two gradient matmuls only
    assert should_ban_recomputation(next(iter(compiled.forward.graph.find_nodes(
        op="call_function", target=aten.mm.default))))  # fmt: skip


def test_dropout_is_not_recomputed():
    def fn(x):
        return F.dropout(x.sin(), p=0.5, training=True).cos() * x

    x = torch.randn(1000, requires_grad=True)
    for seed in (0, 1):
        compiled = check_against_eager(fn, [x], seed=seed)
    assert random_nodes(compiled.forward) and not random_nodes(compiled.backward)


def test_dropout_module_in_an_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]

    def fn(x, w1, b1, w2, b2):
        return F.linear(F.dropout(F.relu(F.linear(x, w1, b1)), 0.3, True), w2, b2)

    compiled = check_against_eager(fn, [torch.randn(8, 16), *params], seed=3)
    assert not random_nodes(compiled.backward)


def test_batch_norm_tuple_outputs_and_mutated_running_stats():
    bn = nn.BatchNorm1d(6)

    def fn(x, weight, bias, mean, var):
        return F.batch_norm(x, mean, var, weight, bias, training=True).relu()

    params = [p.detach().clone().requires_grad_() for p in (bn.weight, bn.bias)]
    inputs = [torch.randn(5, 6, requires_grad=True), *params, torch.zeros(6), torch.ones(6)]
    compiled = check_against_eager(fn, inputs)
    assert compiled.mutated_inputs == [3, 4]
    # native_batch_norm returns a tuple: its getitems are saved, it is not recomputed.
    assert count(compiled.backward, aten.native_batch_norm) == 0
    assert any(name.startswith("getitem") for name in compiled.saved_values)


def test_gradients_that_need_nothing_saved_and_several_outputs():
    compiled = check_against_eager(lambda x, y: (x * 2 + y, (x * y).exp()), [
        torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)])  # fmt: skip
    assert "primals_1" in compiled.saved_values or "exp" in compiled.saved_values
    compiled = check_against_eager(lambda x: x * 2 + 1, [torch.randn(5, requires_grad=True)])
    assert compiled.saved_values == []


def test_pow_of_empty_tensors_recomputes_its_scalar_tensor():
    # pow's backward uses scalar_tensor(0.) (no tensor input); with empty tensors every value
    # costs 0 bytes, so the cut may save an empty value computed from it and also need it in the
    # backward: a creation op with no tensor input is recomputable, not a bad cut.
    assert not should_ban_recomputation(_scalar_tensor_node())
    x, y = torch.rand(0, 1, 3, requires_grad=True), torch.rand(0, 10, 3, requires_grad=True)
    check_against_eager(torch.pow, [x, y])


def _scalar_tensor_node():
    graph = torch.fx.Graph()
    return graph.call_function(aten.scalar_tensor.default, (0.0,))
