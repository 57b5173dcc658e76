"""toycomp's own vector expf (opt/cpp_vector_prefix.py, [Note: toycomp's own expf]) against eager."""

import pytest
import torch

import toycomp

SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 0.5, 10.0, -10.0, 59.3, 80.0, 87.5, 88.3, 88.72,
           88.73, 89.0, 100.0, -87.0, -87.5, -100.0, -103.0, -103.9, -104.0, -110.0,
           float("inf"), float("-inf"), float("nan")]  # fmt: skip


def _compile(fn):
    return toycomp.compile(fn, backend="cpp", options=toycomp.config.fast)


@pytest.mark.parametrize("n", [1, 17, 1000, 4099])  # scalar, a vector and a remainder, threads
def test_exp_matches_eager(n):
    torch.manual_seed(0)
    x = torch.cat([torch.tensor(SPECIAL), torch.randn(n) * 30, torch.rand(n) * 20 - 100])
    got, want = _compile(lambda a: torch.exp(a))(x), torch.exp(x)
    # within 1e-6 relative, and subnormal results (below 2^-126) within one of their units
    torch.testing.assert_close(got, want, rtol=1e-6, atol=2**-149, equal_nan=True)
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got == 0, want == 0)


def test_exp_same_bits_in_every_lane():
    # one value in a vector lane and in the remainder of the loop: the same bits (the scalar
    # and the vector code compute alike)
    x = torch.full((37,), 1.2345678) * torch.arange(37) / 7 - 2
    y = torch.cat([x, x[:5]])
    got = _compile(lambda a: torch.exp(a))(y)
    assert torch.equal(got[37:], got[:5])


@pytest.mark.parametrize("fn", [lambda a: torch.sigmoid(a), lambda a: torch.softmax(a, -1),
                                lambda a: torch.nn.functional.silu(a), lambda a: a.exp().sum(-1)])
def test_exp_users_match_eager(fn):
    torch.manual_seed(1)
    x = torch.randn(64, 129) * 20
    torch.testing.assert_close(_compile(fn)(x), fn(x), rtol=1e-4, atol=1e-5)
