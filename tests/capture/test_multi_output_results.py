"""Ops that return several tensors, some inside a nested list (``histogramdd``'s
``(hist, [edges, ...])``, ``meshgrid``, ``aminmax``, ``frexp``, ``sort``, ``unique``...): every
tensor the user gets back is a real one computed by the compiled code, never a fake example value
from tracing. Eager is the oracle for values, Dynamo for graph counts.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils._pytree import tree_leaves

import toycomp
from toycomp.capture.convert_frame import CompileContext, summarize
from toycomp.capture.variables.base import ConstantVariable

FNS = {
    "histogramdd": lambda x, w: torch.histogramdd(x, bins=[3, 3], weight=w),
    "histogramdd_edges_arith": lambda x, w: [e * 2 + 1 for e in torch.histogramdd(x, 4)[1]],
    "histogramdd_edges_sum": lambda x, w: sum(torch.histogramdd(x, [4, 4], weight=w).bin_edges),
    "histogram": lambda x, w: torch.histogram(x[:, 0], bins=5, weight=w),
    "meshgrid": lambda x, w: torch.meshgrid(x[:, 0], w, indexing="ij"),
    "meshgrid_sum": lambda x, w: sum(torch.meshgrid(x[:, 0], w, indexing="xy")) * 2,
    "aminmax": lambda x, w: torch.aminmax(x, dim=0),
    "aminmax_diff": lambda x, w: torch.aminmax(x).max - torch.aminmax(x).min,
    "frexp": lambda x, w: torch.frexp(x),
    "sort": lambda x, w: torch.sort(x, dim=0, descending=True),
    "sort_values_arith": lambda x, w: torch.sort(w).values.cumsum(0) + 1,
    "unique": lambda x, w: torch.unique(torch.round(x), return_inverse=True, return_counts=True),
    "split": lambda x, w: [t.sum() for t in torch.split(w, 6)],
    "unbind": lambda x, w: torch.unbind(x * 3, 1),
    "chunk": lambda x, w: torch.chunk(w, 3),
    "broadcast_tensors": lambda x, w: torch.broadcast_tensors(x, w[:1]),
    "nested_list_out": lambda x, w: (x.sum(), [x * 2, (w + 1, [w.neg()])]),
}


def inputs(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.randn(20, 2, dtype=dtype), torch.rand(20, dtype=dtype)


def assert_real_and_equal(got, expected):
    got, expected = tree_leaves(got), tree_leaves(expected)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert type(g) is torch.Tensor  # never a FakeTensor
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name", FNS)
def test_toycomp_compile_returns_real_tensors(name):
    fn = FNS[name]
    x, w = inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # histogramdd is an ATen fallback: it warns
        assert_real_and_equal(toycomp.compile(fn)(x, w), fn(x, w))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["meshgrid_sum", "aminmax", "frexp", "sort", "nested_list_out"])
def test_other_dtypes(name, dtype):
    fn = FNS[name]
    x, w = inputs(dtype)
    assert_real_and_equal(toycomp.compile(fn)(x, w), fn(x, w))


@pytest.mark.parametrize("name", FNS)
def test_capture_graph_counts_match_dynamo(name):
    """One graph each, as Dynamo makes, with no frame run eagerly."""
    fn = FNS[name]
    x, w = inputs()
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    out = context.frame_for(fn)(x, w)
    ex = summarize(context, out)
    assert_real_and_equal(out, fn(x, w))
    torch._dynamo.reset()
    dynamo = torch._dynamo.explain(fn)(x, w)
    torch._dynamo.reset()
    assert ex.graph_count == dynamo.graph_count, ex.break_reasons
    if name != "unique":  # a data-dependent size: both run it eagerly, counting breaks apart
        assert ex.graph_break_count == dynamo.graph_break_count == 0, ex.break_reasons


def test_a_fake_tensor_never_becomes_a_constant():
    """A fake tensor that capture forgot to wrap is a bug: it must not reach the user's code."""
    fake = torch._subclasses.FakeTensorMode()
    with fake:
        t = torch.empty(2)
    for value in (t, [t], (1, [2, t])):
        with pytest.raises(AssertionError, match="fake tensor"):
            ConstantVariable(value)
    assert ConstantVariable((1, [2.0, "a"])).as_python_constant() == (1, [2.0, "a"])
