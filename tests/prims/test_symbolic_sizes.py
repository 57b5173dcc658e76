"""Decomposition with dynamic shapes (toycomp/prims/symbolic_sizes.py): graphs traced by make_fx
with symbolic sizes, decomposed into prims graphs that compute their sizes from their inputs
and run on real tensors of any size. Eager PyTorch is the oracle."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import toycomp.prims as prims
from toycomp.prims.decompositions import decompose, fallbacks

aten = torch.ops.aten


def symbolic_graph(fn, *inputs):
    """``fn`` traced by make_fx with every size a symbol; its placeholders' fake values."""
    gm = make_fx(fn, tracing_mode="symbolic")(*inputs)
    return gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def shape_env_of(examples):
    t = next(v for v in examples if isinstance(v, torch.Tensor))
    return next(s for s in t.shape if isinstance(s, torch.SymInt)).node.shape_env


CASES = {
    "view_times_4_softmax": (lambda x: torch.softmax(x.view(x.shape[0] * 4, -1), -1), (8, 12)),
    "mean_over_symbolic_dims": (lambda x: x.mean() + x.mean(0), (5, 7)),
    "bias_broadcast": (lambda x: x + torch.arange(10.0), (6, 10)),
    "layer_norm": (lambda x: F.layer_norm(x, x.shape[-1:]), (3, 9)),
    "cross_entropy": (lambda x: F.cross_entropy(x, x.argmax(-1).detach()), (6, 5)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_prims_graph_computes_its_sizes_and_runs_at_any_size(case):
    fn, shape = CASES[case]
    gm, examples = symbolic_graph(fn, torch.randn(shape))
    prims_gm = decompose(gm, examples)
    print(fallbacks(prims_gm))
    assert set(fallbacks(prims_gm)) <= {"aten.argmax.default"}, fallbacks(prims_gm)
    for batch in (2, 9, 17):  # dim 1 keeps its value: the bias and the view rely on it
        x = torch.randn(batch, shape[1])
        torch.testing.assert_close(prims_gm(x), fn(x), rtol=1e-4, atol=1e-5)


def test_sizes_become_nodes_read_from_the_inputs():
    gm, examples = symbolic_graph(lambda x: x.view(x.shape[0] * 4, -1).sum(0) / x.shape[0],
                                  torch.randn(8, 12))  # fmt: skip
    prims_gm = decompose(gm, examples)
    code = prims_gm.code
    print(code)
    targets = [n.target for n in prims_gm.graph.nodes if n.op == "call_function"]
    assert aten.sym_size.int in targets and operator.mul in targets
    reshape = next(n for n in prims_gm.graph.nodes if n.target is prims.reshape)
    size_arg = reshape.args[1][0]
    assert isinstance(size_arg, torch.fx.Node) and size_arg.target is operator.mul
    assert all(isinstance(s, torch.SymInt) for s in reshape.meta["val"].shape[:1])


def test_decomposing_records_no_needless_guard():
    """Broadcasting a (10,) bias against (s0, 10) compares sizes of equal rank only: no guard
    ``s0 != 10`` (which would recompile when a batch of 10 comes) is left in the ShapeEnv."""
    x, b = torch.randn(6, 10), torch.randn(10)
    gm, examples = symbolic_graph(lambda x, b: torch.tanh(x + b), x, b)
    shape_env = shape_env_of(examples)
    before = len(shape_env.guards)
    decompose(gm, examples)
    assert len(shape_env.guards) == before, [g.expr for g in shape_env.guards[before:]]


def test_sym_int_inputs_are_placeholders():
    """Dynamo passes sizes as graph inputs (SymInt placeholders); the prims graph keeps them."""
    def f(n, x):
        return x.view(n, -1) * 2

    gm, examples = symbolic_graph(f, 4, torch.randn(4, 6))
    assert isinstance(examples[0], torch.SymInt)
    prims_gm = decompose(gm, examples)
    placeholders = [n for n in prims_gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(placeholders[0].meta["val"], torch.SymInt)
    x = torch.randn(5, 6)
    torch.testing.assert_close(prims_gm(5, x), f(5, x))
