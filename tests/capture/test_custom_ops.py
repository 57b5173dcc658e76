"""``torch.library.custom_op`` operators inside a compiled function, called as the decorated
function (a ``CustomOpDef``) or through ``torch.ops``: the graph calls the operator, its fake
implementation gives the metadata, the compiled code calls it as an extern (visible in
``toycomp.explain``), with its autograd registration for the backward. An operator whose fake
implementation makes a data-dependent size (``ctx.new_dynamic_size()``) breaks the graph, as
in Dynamo by default, and the break names the operator and the user's line. Eager is the oracle
for values and gradients, Dynamo for graph and break counts.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import toycomp
from toycomp.capture.convert_frame import CompileContext, summarize


@torch.library.custom_op("toycomp_test::positive_indices", mutates_args=())
def positive_indices(x: torch.Tensor) -> torch.Tensor:
    """A custom nonzero: the indices of the positive elements of a 1-d tensor."""
    return torch.nonzero(x > 0).squeeze(1)


@positive_indices.register_fake
def _(x):
    return x.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.int64)


@torch.library.custom_op("toycomp_test::first_k", mutates_args=())
def first_k(x: torch.Tensor) -> torch.Tensor:
    """The first k rows, k the number of positive elements in the first column."""
    return x[: int((x[:, 0] > 0).sum())].clone()


@first_k.register_fake
def _(x):
    return x.new_empty((torch.library.get_ctx().new_dynamic_size(), *x.shape[1:]))


@torch.library.custom_op("toycomp_test::count_positive", mutates_args=())
def count_positive(x: torch.Tensor) -> int:
    return int((x > 0).sum())


@count_positive.register_fake
def _(x):
    return torch.library.get_ctx().new_dynamic_size()


@torch.library.custom_op("toycomp_test::scale_shift", mutates_args=())
def scale_shift(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s + 1


@scale_shift.register_fake
def _(x, s):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.s = inputs[1]


scale_shift.register_autograd(lambda ctx, g: (g * ctx.s, None), setup_context=_setup)


def nonzero_between(x):
    y = x[:, 0] * 2
    idx = positive_indices(y)
    return idx.to(x.dtype) + 1, y.sum()


def first_k_between(x):
    return first_k(torch.relu(x) - 0.1) * 3 + 1


def count_then_slice(x):
    n = count_positive(x * 2)
    return x[:n] + 1


def through_torch_ops(x):
    idx = torch.ops.toycomp_test.positive_indices(x[:, 1] - 0.5)
    return idx * 2


DATA_DEPENDENT = [nonzero_between, first_k_between, count_then_slice, through_torch_ops]
OPS = {nonzero_between: "positive_indices", first_k_between: "first_k",
       count_then_slice: "count_positive", through_torch_ops: "positive_indices"}


def capture(fn, *args):
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = context.frame_for(fn)(*args)
    return out, summarize(context, out)


def dynamo_counts(fn, *args):
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return ex.graph_count, ex.graph_break_count


def assert_same(got, expected):
    got, expected = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert type(g) is torch.Tensor
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("fn", DATA_DEPENDENT, ids=lambda f: f.__name__)
def test_data_dependent_size_breaks_as_dynamo_naming_the_op(fn):
    torch.manual_seed(0)
    x = torch.randn(12, 3)
    out, ex = capture(fn, x)
    assert_same(out, fn(x))
    assert (ex.graph_count, ex.graph_break_count) == dynamo_counts(fn, x)
    (reason,) = ex.break_reasons
    assert f"toycomp_test.{OPS[fn]}" in reason and "test_custom_ops.py" in reason, reason
    assert "internal error" not in reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fn", DATA_DEPENDENT, ids=lambda f: f.__name__)
def test_data_dependent_size_compiled_values(fn, dtype):
    torch.manual_seed(1)
    x = torch.randn(9, 3, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(toycomp.compile(fn)(x), fn(x))


def custom_op_in_the_middle(x):
    return scale_shift(x.sin(), 3.0).cos() * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_custom_op_is_an_extern_with_its_gradient(dtype):
    torch.manual_seed(2)
    x = torch.randn(5, 4, dtype=dtype, requires_grad=True)
    expected = custom_op_in_the_middle(x)
    (grad_expected,) = torch.autograd.grad(expected.sum(), x)
    ex = toycomp.explain(custom_op_in_the_middle, x)
    assert (ex.graph_count, ex.graph_break_count) == dynamo_counts(custom_op_in_the_middle, x)
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons
    assert any("scale_shift" in op for op in ex.fallbacks), ex.fallbacks  # visible
    with pytest.warns(UserWarning, match="scale_shift"):
        got = toycomp.compile(custom_op_in_the_middle)(x)
    (grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad, grad_expected)
