"""``with`` on a context manager whose ``__enter__``/``__exit__`` are Python code:
``contextlib.nullcontext()`` (transformers' ``maybe_autocast`` returns one outside autocast, in
every Llama-style rotary embedding) and a user's own class. Their methods are inlined: one graph,
the side effects of ``__enter__``/``__exit__`` kept in order, as eager and Dynamo."""

from __future__ import annotations

import contextlib

import pytest
import torch

import toycomp
from tests.capture.checks import check, dynamo_counts


class Recorder:
    def __init__(self, log, value=2.0):
        self.log, self.value = log, value

    def __enter__(self):
        self.log.append("enter")
        return self.value

    def __exit__(self, exc_type, exc, tb):
        self.log.append("exit")


def null_context(x):
    with contextlib.nullcontext():
        y = x.sin()
    return y * 2


def null_context_as(x):
    with contextlib.nullcontext(3.0) as k:
        y = x * k
    return y.cos()


def maybe_autocast_off(x):
    """transformers.utils.generic.maybe_autocast(enabled=False) outside autocast."""
    ctx = torch.autocast(x.device.type) if torch.is_autocast_enabled(x.device.type) else \
        contextlib.nullcontext()
    with ctx:
        y = x.float() @ x.float().t()
    return y.relu()


def nested(x):
    with contextlib.nullcontext(), torch.no_grad():
        y = x * 2
    return y + x


@pytest.mark.parametrize("fn", [null_context, null_context_as, maybe_autocast_off, nested])
def test_nullcontext_in_one_graph(fn):
    x = torch.randn(4, 4, requires_grad=fn is not nested)
    expected, out = check(fn, x)
    torch.testing.assert_close(out, expected)


def test_user_context_manager_side_effects_in_order():
    def fn(x, log):
        log.append("before")
        with Recorder(log) as k:
            y = x * k
        log.append("after")
        return y.exp()

    x = torch.randn(8)
    eager_log, compiled_log = [], []
    expected = fn(x, eager_log)
    out = toycomp.compile(fn)(x, compiled_log)
    torch.testing.assert_close(out, expected)
    assert compiled_log == eager_log == ["before", "enter", "exit", "after"]
    graphs, breaks = dynamo_counts(fn, x, [])
    assert (graphs, breaks) == (1, 0)


def test_graph_break_inside_a_user_context_manager_is_visible():
    def fn(x):
        with contextlib.nullcontext(2.0) as k:
            print("a graph break")
            y = x * k
        return y

    x = torch.randn(4)
    with pytest.warns(UserWarning, match="graph break inside `with"):
        out = toycomp.compile(fn)(x)
    torch.testing.assert_close(out, fn(x))


def test_transformers_maybe_autocast():
    generic = pytest.importorskip("transformers.utils.generic")

    def fn(x):
        with generic.maybe_autocast(device_type=x.device.type, enabled=False):
            y = x.sin() * x.cos()
        return y

    x = torch.randn(16)
    expected, out = check(fn, x)  # one graph, no break (before: the frame ran eagerly)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(toycomp.compile(fn)(x), expected)
