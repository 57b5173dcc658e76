"""The primitives themselves (toycomp/prims/__init__.py): the closed set and eager references."""

import numpy as np
import pytest
import torch

import toycomp.prims as prims

RTOL, ATOL = 1e-4, 1e-5


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)


def _pos(*shape):
    return torch.rand(*shape) + 0.1


x34, y34, p = torch.randn(3, 4), torch.randn(3, 4), _pos(3, 4)
PRIM_CHECKS = {  # name -> (args, what the prim must equal, computed another way)
    "neg": ((x34,), lambda: -x34),
    "abs": ((x34,), lambda: x34 * x34.sign()),
    "exp": ((x34,), lambda: torch.e**x34),
    "log": ((p,), lambda: torch.from_numpy(np.log(p.numpy()))),
    "log1p": ((x34.abs(),), lambda: torch.log(1 + x34.abs())),
    "sqrt": ((p,), lambda: p**0.5),
    "rsqrt": ((p,), lambda: 1 / p**0.5),
    "reciprocal": ((p,), lambda: 1 / p),
    "sin": ((x34,), lambda: x34.sin()),
    "cos": ((x34,), lambda: torch.sin(x34 + torch.pi / 2)),
    "tanh": ((x34,), lambda: (torch.exp(2 * x34) - 1) / (torch.exp(2 * x34) + 1)),
    "erf": ((x34,), lambda: torch.special.erf(x34)),
    "floor": ((x34 * 3,), lambda: (x34 * 3) - torch.remainder(x34 * 3, 1)),
    "sign": ((x34,), lambda: (x34 > 0).float() - (x34 < 0).float()),
    "logical_not": ((x34 > 0,), lambda: x34 <= 0),
    "add": ((x34, y34), lambda: x34 + y34),
    "sub": ((x34, 2.0), lambda: x34 - 2),
    "mul": ((x34, y34), lambda: x34 * y34),
    "div": ((x34, p), lambda: x34 * (1 / p)),
    "pow": ((p, y34), lambda: torch.exp(y34 * torch.log(p))),
    "maximum": ((x34, y34), lambda: torch.where(x34 > y34, x34, y34)),
    "minimum": ((x34, y34), lambda: torch.where(x34 < y34, x34, y34)),
    "eq": ((x34, x34.round()), lambda: (x34 - x34.round()) == 0),
    "ne": ((x34, 0.5), lambda: ~(x34 == 0.5)),
    "lt": ((x34, y34), lambda: y34 > x34),
    "le": ((x34, y34), lambda: y34 >= x34),
    "gt": ((x34, y34), lambda: y34 < x34),
    "ge": ((x34, y34), lambda: y34 <= x34),
    "logical_and": ((x34 > 0, y34 > 0), lambda: (x34 > 0) & (y34 > 0)),
    "where": ((x34 > 0, x34, 0.0), lambda: x34 * (x34 > 0)),
    "convert_element_type": ((x34 * 10, torch.int32), lambda: (x34 * 10).trunc().int()),
    "sum": ((x34, [1]), lambda: x34 @ torch.ones(4)),
    "amax": ((x34, [0]), lambda: x34.max(dim=0).values),
    "amin": ((x34, [0, 1]), lambda: x34.min()),
    "broadcast_in_dim": ((y34[0], [3, 4], [1]), lambda: y34[0].repeat(3, 1)),
    "reshape": ((x34, [2, 6]), lambda: x34.flatten().view(2, 6)),
    "permute": ((x34, [1, 0]), lambda: x34.T),
    "slice": ((x34, 1, 1, 4, 2), lambda: x34[:, 1:4:2]),
    "full": (([2, 3], 1.5, torch.float32, "cpu"), lambda: torch.ones(2, 3) * 1.5),
    "iota": ((5, torch.int64, "cpu"), lambda: torch.tensor([0, 1, 2, 3, 4])),
    "gather": ((x34, 0, torch.tensor([[2, 0, 1, 1]])), lambda: torch.stack(
        [x34[2, 0], x34[0, 1], x34[1, 2], x34[1, 3]])[None]),
    "scatter": ((torch.zeros(2, 2), 0, torch.tensor([[1, 1], [1, 0]]), torch.ones(2, 2), True),
                lambda: torch.tensor([[0.0, 1.0], [2.0, 1.0]])),
}


def test_prim_set_is_closed_and_covered():
    # (how many there may be is a budget: tests/test_line_budget.py)
    assert set(PRIM_CHECKS) == set(prims.PRIMS)


@pytest.mark.parametrize("name", sorted(PRIM_CHECKS))
def test_prim_reference(name):
    args, expected = PRIM_CHECKS[name]
    close(prims.PRIMS[name](*args), expected())


def test_python_numbers_do_not_promote():
    i = torch.arange(4, dtype=torch.int32)
    assert prims.add(i, 2).dtype == torch.int32
    assert prims.mul(torch.ones(2, dtype=torch.float16), 3.0).dtype == torch.float16


def test_each_prim_is_defined_under_its_name():
    """``prims.sin`` is the prim named "sin": every prim can be found by grepping its name."""
    for name, prim in prims.PRIMS.items():
        assert getattr(prims, name) is prim and prims.PRIM_INFO[prim].name == name


@pytest.mark.parametrize("n", [1, 7, 100])  # ATen's scalar loop, and its vectorised one
def test_maximum_minimum_keep_nan_and_give_b_on_a_signed_zero_tie(n):
    """[Note: maximum, minimum, NaN and signed zero]: one rule at every length (torch.maximum
    returns a on a -0.0/0.0 tie in its scalar loop and b in its vectorised one)."""
    nan = float("nan")
    a = torch.tensor([-0.0, 0.0, nan, 1.0, nan, 2.0]).repeat(n)
    b = torch.tensor([0.0, -0.0, 1.0, nan, nan, -3.0]).repeat(n)
    for prim, want in ((prims.maximum, 2.0), (prims.minimum, -3.0)):
        out = prim(a, b)
        assert torch.equal(out.isnan(), a.isnan() | b.isnan())
        assert torch.equal(out[0::6].signbit(), b[0::6].signbit())  # the ties: b's zero
        assert torch.equal(out[1::6].signbit(), b[1::6].signbit())
        assert (out[5::6] == want).all()
