"""Integer arithmetic as eager PyTorch does it, on every integer dtype and both backends.

Eager wraps around on overflow (two's complement, modulo 2**bits): ``9 ** 87`` in uint8 is 249,
``-INT_MIN`` is ``INT_MIN``. C++ leaves signed overflow undefined and ``std::pow`` goes through
``double`` (so it saturates); the kernels must wrap as eager does. Eager is the oracle for every
value; the inputs are chosen to overflow.
"""

import pytest
import torch

import toycomp

INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
BACKENDS = ["cpp", "triton"]


def _check(fn, *args, backend):
    expected = fn(*[a.clone() for a in args])
    got = toycomp.compile(fn, backend=backend)(*[a.clone() for a in args])
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def _ints(dtype, shape, low, high, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=gen).to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_pow_wraps_around(dtype, backend):
    x = _ints(dtype, (16, 16), 0, 10)
    e = _ints(dtype, (16, 16), 0, 90, seed=1)
    _check(lambda x: torch.pow(x, 87), x, backend=backend)  # one constant exponent
    _check(lambda x: (x**5, x**3, x**63), x, backend=backend)  # odd exponents, other bits
    _check(torch.pow, x, e, backend=backend)  # a tensor of exponents
    _check(lambda e: torch.pow(3, e), e, backend=backend)  # a number to a tensor power


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64], ids=str)
def test_pow_by_a_negative_integer_tensor(dtype, backend):
    # ATen's powi: 1 ** -k = 1, (-1) ** -k = +-1, anything else ** -k = 0 (no error for tensors).
    x = torch.tensor([1, -1, -1, 2, -3, 0, 5, 1], dtype=dtype)
    e = torch.tensor([-3, -3, -4, -1, -2, 3, 0, 7], dtype=dtype)
    _check(torch.pow, x, e, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_add_mul_neg_abs_wrap_around(dtype, backend):
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, info.max, info.max - 1, 0, 1, info.min + 1], dtype=dtype)
    y = torch.tensor([info.min, 3, info.max, info.max, info.min, -1 % (info.max + 1)]).to(dtype)
    _check(lambda x, y: (x + y, x - y, x * y, x * 1000 + 77777), x, y, backend=backend)
    _check(lambda x: (-x, x.abs(), x.neg().abs() * 3), x, backend=backend)
    _check(lambda x: (x.sum(), (x * x).sum(0)), x, backend=backend)  # sums wrap too


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_division_and_remainder_signs(dtype, backend):
    a = _ints(dtype, (64,), -100, 100)
    b = _ints(torch.int64, (64,), 1, 9, seed=2)
    if dtype.is_signed:
        b = b * torch.where(torch.arange(64) % 3 == 0, -1, 1)
    b = b.to(dtype)
    _check(
        lambda a, b: (
            torch.floor_divide(a, b),
            torch.remainder(a, b),
            torch.fmod(a, b),
            torch.div(a, b, rounding_mode="trunc"),
            torch.div(a, b, rounding_mode="floor"),
            torch.div(a, b),  # true division: a float result
            a % 7,
            a // -3 if dtype.is_signed else a // 3,
        ),
        a,
        b,
        backend=backend,
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_shifts(dtype, backend):
    a = _ints(dtype, (32,), -100, 100)
    s = _ints(dtype, (32,), 0, 7, seed=3)
    _check(lambda a, s: (a << 3, a >> 2, a << s, a >> s), a, s, backend=backend)
