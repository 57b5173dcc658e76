"""Tests for toycomp/aot/compile_utils.py: fx_graph_cse. Eager PyTorch is the oracle."""

import operator

import torch
import torch.fx as fx

from tests.aot.test_partitioners import check_against_eager, count, sin_cos
from toycomp.aot import aot_autograd as aot
from toycomp.aot.compile_utils import fx_graph_cse

aten = torch.ops.aten


def test_cse_merges_duplicate_pure_nodes_and_keeps_values():
    x = torch.randn(9, requires_grad=True)
    joint = aot.trace_joint(sin_cos, [x])
    assert count(joint, aten.sin) == 2 and count(joint, aten.cos) == 2
    cse = fx.GraphModule(joint, fx_graph_cse(joint.graph))
    assert count(cse, aten.sin) == 1 and count(cse, aten.cos) == 1
    assert all("val" in n.meta for n in cse.graph.nodes if n.op != "output")
    args = (x.detach(), torch.randn(9))
    for a, b in zip(cse(*args), joint(*args)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cse_never_merges_random_nodes():
    def fn(x):
        return x * torch.rand_like(x) + x * torch.rand_like(x)

    x = torch.randn(8, requires_grad=True)
    joint = aot.trace_joint(fn, [x])
    assert count(fx.GraphModule(joint, fx_graph_cse(joint.graph)), aten.rand_like) == 2
    check_against_eager(fn, [x], seed=5)


def test_cse_keys_constants_by_type_and_sign_and_keeps_outputs_and_inplace_ops():
    graph = fx.Graph()
    x = graph.placeholder("x")
    calls = [
        (aten.pow.Tensor_Scalar, (x, 2)), (aten.pow.Tensor_Scalar, (x, 2.0)),
        (aten.mul.Tensor, (x, 0.0)), (aten.mul.Tensor, (x, -0.0)),
        (aten.add_.Tensor, (x, 1)), (aten.add_.Tensor, (x, 1)),
        (aten.sin.default, (x,)), (aten.sin.default, (x,)),
    ]  # fmt: skip
    nodes = [graph.call_function(op, args) for op, args in calls]
    graph.output(tuple(nodes[:6]) + (graph.call_function(aten.neg.default, (nodes[7],)),))
    new = fx_graph_cse(graph)
    kept = [n.target for n in new.nodes if n.op == "call_function"]
    assert kept.count(aten.pow.Tensor_Scalar) == 2 and kept.count(aten.mul.Tensor) == 2
    assert kept.count(aten.add_.Tensor) == 2  # in-place: never merged
    assert kept.count(aten.sin.default) == 1  # the second sin is not returned: merged


def test_cse_keys_tensor_constants_by_value_and_merges_equal_slices():
    graph = fx.Graph()
    x = graph.placeholder("x")
    zeros, one_inside = torch.zeros(2000), torch.zeros(2000)
    one_inside[1000] = 1.0  # the same (abbreviated) repr as zeros, another value
    assert repr(zeros) == repr(one_inside)
    adds = [graph.call_function(aten.add.Tensor, (x, t)) for t in (zeros, zeros, one_inside)]
    items = [graph.call_function(operator.getitem, (x, s))
             for s in (slice(0, 2), slice(0, 2), slice(0, 3))]  # fmt: skip
    graph.output(tuple(graph.call_function(aten.neg.default, (n,)) for n in adds + items))
    kept = [n for n in fx_graph_cse(graph).nodes if n.op == "call_function"]
    assert sum(n.target is aten.add.Tensor for n in kept) == 3  # tensor constants: no key
    assert [n.args[1] for n in kept if n.target is operator.getitem] == [slice(0, 2), slice(0, 3)]


def test_cse_does_not_merge_returned_nodes():
    x = torch.randn(4, requires_grad=True)
    compiled = check_against_eager(lambda t: (t.clone(), t.clone()), [x])
    a, b = compiled(x.detach())
    assert a.data_ptr() != b.data_ptr()
