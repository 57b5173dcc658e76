"""Iterating an nn.Module's children inside the compiled function: ``for block in
self.children()`` (timm's RegNet stages), ``named_children()``, ``modules()`` and
``named_modules()`` on plain modules as on containers. Eager is the oracle for values, real
Dynamo for graph counts (one graph, no break)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.capture.checks import check


class Stage(nn.Module):
    """A plain module (not a container) whose forward runs its children in order."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.act = nn.ReLU()

    def forward(self, x):
        for block in self.children():
            x = block(x)
        return x


class Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.skip = None  # a None child is left out, as in eager
        self.b = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.shared = self.a  # the same module twice: yielded once

    def forward(self, x):
        for name, m in self.named_children():
            x = m(x) * (2.0 if name == "b" else 1.0)
        return x


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.GELU()))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                x = x + m.bias.sum()
        names = [n for n, _ in self.named_modules()]
        return self.head(self.body(x)) * len(names)


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def test_children_of_a_plain_module():
    stage = Stage().eval()
    expected, out = check(lambda x: stage(x), _x(2, 3, 5, 5))
    torch.testing.assert_close(out, expected)


def test_children_in_a_try_block():
    stage = Stage().eval()

    def fn(x):
        try:
            for block in stage.children():
                x = block(x)
        except RuntimeError:
            x = x * 0
        return x

    expected, out = check(fn, _x(2, 3, 5, 5))
    torch.testing.assert_close(out, expected)


def test_named_children_skips_none_and_duplicates():
    model = Named()
    expected, out = check(lambda x: model(x), _x(3, 4))
    torch.testing.assert_close(out, expected)


def test_modules_and_named_modules_recurse():
    model = Deep()
    expected, out = check(lambda x: model(x), _x(3, 4))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("container", [nn.Sequential, nn.ModuleList])
def test_children_of_containers(container):
    items = [nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3)]
    layers = nn.Sequential(*items) if container is nn.Sequential else nn.ModuleList(items)

    def fn(x):
        for i, layer in enumerate(layers.children()):
            x = layer(x) + i
        return x

    expected, out = check(fn, _x(2, 4))
    torch.testing.assert_close(out, expected)


def test_a_child_added_later_recompiles():
    """The names of the children are guarded: a new child changes what the loop runs."""
    import toycomp

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            for block in self.children():
                x = block(x)
            return x

    chain = Chain()
    compiled = toycomp.compile(lambda x: chain(x))
    x = _x(2, 4)
    torch.testing.assert_close(compiled(x), chain(x))
    chain.b = nn.Tanh()
    torch.testing.assert_close(compiled(x), chain(x))
    assert compiled.compile_count == 2
