"""Tests for ``bitwise_not`` (``~mask``, ``~n``): bools and signed integers decompose (logical_not,
``-a - 1``) and match eager on both backends; an unsigned integer falls back visibly."""

from __future__ import annotations

import pytest
import torch

import toycomp


def invert_and_use(t):
    return ~t, (~t).sum()  # (the sum: the inverted bits reach another kernel)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int16, torch.int32, torch.int64])
def test_bitwise_not_matches_eager(backend, dtype):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        x = torch.rand(5, 7, generator=g) > 0.5
    else:
        info = torch.iinfo(dtype)  # the extremes too: ~min is max
        x = torch.randint(-100, 100, (5, 7), generator=g).to(dtype)
        x[0, :2] = torch.tensor([info.min, info.max], dtype=dtype)
    ex = toycomp.explain(invert_and_use, x)
    assert "aten.bitwise_not.default" not in ex.fallbacks
    for got, want in zip(toycomp.compile(invert_and_use, backend=backend)(x), invert_and_use(x)):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_bitwise_not_of_unsigned_falls_back_visibly():
    x = torch.arange(0, 250, 7, dtype=torch.uint8)
    with pytest.warns(UserWarning, match="bitwise_not"):
        ex = toycomp.explain(lambda t: ~t, x)
    assert "aten.bitwise_not.default" in ex.fallbacks
    assert torch.equal(toycomp.compile(lambda t: ~t)(x), ~x)
