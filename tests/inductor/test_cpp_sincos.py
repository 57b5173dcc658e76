"""Float sin and cos in C++ kernels: toycomp's own, one sincos call for both (issue 9, CPU).

See [Note: one sincos for sin and cos] in toycomp/inductor/opt/libmvec.py. Eager PyTorch is
the oracle for values (within 4 ulp: eager calls Sleef's 3.5-ulp functions); the bits of a
value must not depend on whether its cosine is computed too, on vectorisation, or on the kernel.
"""

from __future__ import annotations

import math
import platform
import re

import pytest
import torch

from tests.inductor.test_cpp import compile_cpp
from toycomp.inductor import cache
from toycomp.inductor.codegen import common, cpp
from toycomp.inductor.opt import libmvec
from toycomp.inductor.indexing import r, x
from toycomp.inductor.ir import (
    Constant,
    Kernel,
    Load,
    Loop,
    Op,
    Store,
)

F32, F64 = torch.float32, torch.float64
ULP_TOLERANCE = 4
needs_sincos = pytest.mark.skipif(
    "sincosf" not in libmvec.vector_math_functions(),
    reason="toycomp's vector sin/cos need GCC on x86_64 Linux",
)


def run_cpp(kernels, inputs: dict, outputs: dict, dtype=F32):
    compiled = compile_cpp(kernels, inputs, outputs, dtype)
    return compiled, compiled(list(inputs.values()))


def values(dtype=F32) -> torch.Tensor:
    """Special values, every magnitude, 8192 and its neighbours (the fast path's limit), and a
    dense sweep of [-20, 20] and of [-8192, 8192]; a length that is no multiple of a vector."""
    special = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-40, 1e-30, 1e-7, 0.5, -0.5,
               math.pi / 4, math.pi / 2, math.pi, 3 * math.pi / 2, 8191.999, 8192.0, 8192.001,
               -8192.001, 1e4, -3e4, 1e5, 1e6, 1e20, -1e30, 3.4e38, -3.4e38]  # fmt: skip
    torch.manual_seed(0)
    magnitudes = torch.randn(4000, dtype=F64) * torch.logspace(-6, 8, 4000, dtype=F64)
    dense = [torch.linspace(-20, 20, 300001, dtype=F64), torch.linspace(-8192, 8192, 400003)]
    return torch.cat([torch.tensor(special, dtype=F64), magnitudes, *dense]).to(dtype)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many float32 values lie between a and b (0 for NaN and NaN)."""
    def ordered(t):
        i = t.view(torch.int32).long()
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)

    both_nan = a.isnan() & b.isnan()
    return torch.where(both_nan, 0, (ordered(a) - ordered(b)).abs())


def sin_cos_kernel(n: int, ops: tuple[str, ...], dtype=F32) -> Kernel:
    """One store per op of ``ops`` ("sin", "cos"), all of the same loaded value."""
    a = Load("arg0", x, dtype)
    stores = tuple(Store(f"out_{name}", x, Op(name, (a,), dtype)) for name in ops)
    dtypes = (("arg0", dtype), *((f"out_{name}", dtype) for name in ops))
    return Kernel("kernel_0", n, 1, (Loop(False, stores),), dtypes, ops)


def run_sin_cos(ops: tuple[str, ...], dtype=F32, v: torch.Tensor | None = None):
    v = values(dtype) if v is None else v
    n = v.numel()
    compiled, outs = run_cpp([sin_cos_kernel(n, ops, dtype)], {"arg0": v},
                             {f"out_{name}": (n,) for name in ops}, dtype)  # fmt: skip
    return compiled.kernels[0].source, dict(zip(ops, outs)), v


def body(source: str) -> str:
    return source.removeprefix(cpp.PREAMBLE)


# --- code generation --------------------------------------------------------------------------
def test_sin_and_cos_of_one_value_make_one_sincos_call():
    source = body(cpp.generate(sin_cos_kernel(1003, ("sin", "cos"))).source)
    assert source.count("toycomp_sincosf(tmp0, &tmp1, &tmp2);") == 1
    assert "toycomp_sinf(" not in source and "toycomp_cosf(" not in source
    assert "TOYCOMP_SINCOSF(sincosf)" in source and "TOYCOMP_SINCOSF(sinf)" not in source
    # cos first: the same call, the sine's name first
    source = body(cpp.generate(sin_cos_kernel(1003, ("cos", "sin"))).source)
    assert "float tmp1, tmp2;" not in source and "toycomp_sincosf(tmp0, &tmp2, &tmp1);" in source
    # alone, each keeps its own function
    source = body(cpp.generate(sin_cos_kernel(1003, ("sin",))).source)
    assert "toycomp_sinf(tmp0)" in source and "toycomp_sincosf" not in source


def test_sin_and_cos_of_different_values_stay_apart():
    a, b = Load("arg0", x, F32), Load("arg1", x, F32)
    stores = (Store("out0", x, Op("sin", (a,), F32)), Store("out1", x, Op("cos", (b,), F32)))
    dtypes = (("arg0", F32), ("arg1", F32), ("out0", F32), ("out1", F32))
    kernel = Kernel("kernel_0", 64, 1, (Loop(False, stores),), dtypes, ())
    source = body(cpp.generate(kernel).source)
    assert "toycomp_sinf(tmp0)" in source and "toycomp_cosf(tmp2)" in source
    assert "toycomp_sincosf" not in source


def test_fuse_sin_cos_rewrites_only_pairs():
    buf = common.IndentedBuffer()
    buf.writelines([
        "    float tmp1 = toycomp_cosf(tmp0);",
        "    float tmp2 = toycomp_sinf(tmp9);",
        "    float tmp3 = tmp1 + tmp2;",
        "    float tmp4 = toycomp_sinf(tmp0);",
    ])  # fmt: skip
    libmvec.fuse_sin_cos(buf)
    assert buf.lines == [
        "    float tmp4, tmp1;",
        "    toycomp_sincosf(tmp0, &tmp4, &tmp1);",
        "    float tmp2 = toycomp_sinf(tmp9);",
        "    float tmp3 = tmp1 + tmp2;",
    ]


def test_float64_keeps_std_sin_and_cos():
    source, outs, v = run_sin_cos(("sin", "cos"), F64)
    assert "std::sin(tmp0)" in source and "std::cos(tmp0)" in source
    assert "toycomp_" not in body(source)
    torch.testing.assert_close(outs["sin"], v.sin(), equal_nan=True)
    torch.testing.assert_close(outs["cos"], v.cos(), equal_nan=True)


# --- values ------------------------------------------------------------------------------------
def assert_within_ulps(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    distance = ulp_distance(got, want)
    worst = int(distance.argmax())
    assert distance.max() <= ULP_TOLERANCE, (name, got[worst].item(), want[worst].item())


@pytest.mark.parametrize("ops", [("sin", "cos"), ("sin",), ("cos",)])
def test_values_match_eager_within_4_ulp(ops):
    _, outs, v = run_sin_cos(ops)
    for name, out in outs.items():
        assert_within_ulps(out, getattr(v, name)(), name)
    signed_zero = (v == 0) & (outs.get("sin", v) == 0)
    assert torch.equal(outs.get("sin", v)[signed_zero].signbit(), v[signed_zero].signbit())


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_value_has_the_same_bits_alone_together_vectorised_or_not():
    """sin and cos from the sincos kernel, from sin-only and cos-only kernels, from a short
    kernel, and from a loop GCC cannot vectorise (each element needs the one before): the same
    bits, so values that must compare equal do (see [Note: vectorised libm] in cpp.py)."""
    _, together, v = run_sin_cos(("sin", "cos"))
    assert same_bits(together["sin"], run_sin_cos(("sin",))[1]["sin"])
    assert same_bits(together["cos"], run_sin_cos(("cos",))[1]["cos"])
    _, short, _ = run_sin_cos(("sin", "cos"), v=v[:7])
    assert same_bits(short["sin"], together["sin"][:7])
    # out[r + 1] = sin(a[r]) * cos(a[r]) + out[r] * 0 (a finite), after a loop that zeroes out
    n, finite = 1003, v[100:]
    prev, a = Load("buf0", r, F32), Load("arg0", r, F32)
    product = Op("mul", (Op("sin", (a,), F32), Op("cos", (a,), F32)), F32)
    zero = Op("mul", (prev, Op("sub", (prev, prev), F32)), F32)
    zeroes = Loop(True, (Store("buf0", r, Constant(0.0, F32)),))
    serial = Loop(True, (Store("buf0", r + 1, Op("add", (product, zero), F32)),))
    k = Kernel("kernel_0", 1, n - 1, (zeroes, serial), (("arg0", F32), ("buf0", F32)), ("s",))
    source = body(cpp.generate(k).source)
    assert source.count("#pragma omp simd") == 1 and "toycomp_sincosf(" in source
    _, (out,) = run_cpp([k], {"arg0": finite[: n - 1]}, {"buf0": (n,)})
    want = together["sin"][100 : 100 + n - 1] * together["cos"][100 : 100 + n - 1]
    assert same_bits(out[1:], want)


@needs_sincos
def test_the_vector_sincos_is_what_runs():
    source, outs, v = run_sin_cos(("sin", "cos"))
    wanted = re.findall(r"^#if defined\(TOYCOMP_SIMD_(\w+)\)", source, re.MULTILINE)
    flags = libmvec.vector_math_flags(wanted)
    assert flags == ("-DTOYCOMP_SIMD_sincosf", "-fno-builtin-sinf", "-fno-builtin-cosf")
    library = cache.compile_cpp(source, flags).read_bytes()  # a cache hit: what was loaded
    assert re.search(rb"_ZGV[bcde]N\d+vl4l4_toycomp_sincosf", library)


def test_scalar_fallback_compiles_and_matches(tmp_path, monkeypatch):
    """Without vector math (TOYCOMP_VECTOR_MATH=0, or a machine without it), the same source
    compiles to glibc's scalar sinf/cosf: values within 4 ulp of eager too."""
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TOYCOMP_VECTOR_MATH", "0")
    assert libmvec.vector_math_functions() == frozenset()
    source, outs, v = run_sin_cos(("sin", "cos"))
    assert "toycomp_sincosf(tmp0, &tmp1, &tmp2);" in source
    (library,) = (tmp_path / "cpp").glob("*.so")
    assert b"toycomp_sincosf" not in library.read_bytes()  # inlined: the scalar definition
    for name, out in outs.items():
        assert_within_ulps(out, getattr(v, name)(), name)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 only")
def test_sincos_probe_rejects_wrong_code(tmp_path, monkeypatch):
    monkeypatch.setenv("TOYCOMP_CACHE_DIR", str(tmp_path))
    if not libmvec.probe_sincos():
        pytest.skip("toycomp's vector sin/cos do not compile here")
    wrong = libmvec.PREAMBLE.replace("-0x1.921fb4p0f", "-0x1.9p0f")  # pi/2 rounded badly
    monkeypatch.setattr(libmvec, "PREAMBLE", wrong)
    assert not libmvec.probe_sincos()
