"""A function passed to a torch function (``checkpoint(torch.sin, x)``, OpInfo's
``wrapper_set_seed(torch.empty_strided, ...)``): FX prints a graph's constants as Python and a
function has no literal, so the call is a visible graph break, never a graph FX cannot compile.
Eager is the oracle for values and gradients."""

import pytest
import torch
from torch.testing._utils import wrapper_set_seed
from torch.utils.checkpoint import checkpoint

import toycomp


def checkpointed(x):
    return checkpoint(torch.sin, x * 2, use_reentrant=False).sum()


def seeded(x):
    return wrapper_set_seed(torch.cos, x + 1) * 3


def seeded_factory(x):
    return x + wrapper_set_seed(torch.full, (3, 4), 2.0)


@pytest.mark.parametrize("fn", [checkpointed, seeded, seeded_factory])
def test_a_function_argument_breaks_the_graph_visibly(fn):
    x = torch.randn(3, 4, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    want = fn(x_ref)
    got = toycomp.compile(fn)(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    reasons = toycomp.explain(fn, x.detach()).break_reasons
    assert any("passed to a torch function" in r for r in reasons), reasons
