"""Forcing AVX2 on an AVX-512 CPU (cpp.simdlen = 256, ATEN_CPU_CAPABILITY=avx2): the flags, and
values as eager's for the vector math functions ([Note: forcing AVX2] in cache.py)."""

import platform

import pytest
import torch

import toycomp
from toycomp.inductor import cache

x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 only")


@x86
def test_isa_flags(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert cache.isa_flags() == ()
    with toycomp.config.patch({"cpp.simdlen": 256}):
        assert cache.isa_flags() == ("-mno-avx512f",)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert cache.isa_flags() == ("-mno-avx512f",)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert cache.isa_flags() == ()


@x86
@pytest.mark.parametrize("simdlen", [256, None])
@pytest.mark.parametrize("op", ["sin", "cos", "exp", "tanh", "sigmoid", "sin_cos"])
def test_vector_math_matches_eager(op, simdlen):
    fn = {"sin_cos": lambda x: torch.sin(x) * torch.cos(x)}.get(op) or getattr(torch, op)
    # lanes of every kind: small, near multiples of pi/2, beyond 8192, inf, nan, a ragged tail
    x = torch.cat([torch.randn(4099) * 10, torch.tensor([1e4, -3e4, 1e5, float("inf"), float("nan"),
                                                         -0.0, 0.0, 1.5707964, 3.1415927])])
    with toycomp.config.patch({"cpp.simdlen": simdlen}):
        compiled = toycomp.compile(lambda t: fn(t))
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-5, equal_nan=True)
