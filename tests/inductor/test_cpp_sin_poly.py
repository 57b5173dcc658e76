"""Float sin and cos by one polynomial each (opt/cpp_vector_prefix.py, [Note: one polynomial for
sin and for cos]): every float of two binades and a sweep of the fast path's range against sin
and cos in double; eager PyTorch as the oracle is test_cpp_sincos.py's."""

import pytest
import torch

import toycomp
from toycomp.inductor.opt import libmvec

pytestmark = pytest.mark.skipif("sincosf" not in libmvec.vector_math_functions(),
                                reason="toycomp's vector sin/cos need GCC on x86_64 Linux")
MAX_ULP = 2.5  # measured 2.21 (Sleef's sinf_u35, which eager calls: 3.5 documented)


def _compile(fn):
    return toycomp.compile(fn, backend="cpp", options=toycomp.config.fast)


def floats_between(lo: float, hi: float, step: int = 1) -> torch.Tensor:
    """Every ``step``-th float in [lo, hi), 0 < lo < hi, in order of their bits."""
    lo_bits, hi_bits = (torch.tensor([v]).view(torch.int32).item() for v in (lo, hi))
    return torch.arange(lo_bits, hi_bits, step, dtype=torch.int32).view(torch.float32)


def ulp_error(got: torch.Tensor, x: torch.Tensor, ref) -> float:
    """The largest |got - ref(x)| in units of the float ulp at ref(x), computed in double."""
    want = ref(x.double())
    exponent = torch.frexp(want).exponent.clamp(min=-148)  # subnormal results: 2^-149
    ulp = torch.ldexp(torch.ones_like(want), (exponent - 24).double())
    return ((got.double() - want).abs() / ulp).max().item()


@pytest.mark.parametrize("name", ["sin", "cos"])
@pytest.mark.parametrize("lo, hi, step", [(0.5, 2.0, 1),            # every float of two binades
                                          (2.0**-30, 8192.0, 97)])  # and the fast path's range
def test_within_max_ulp_of_double(name, lo, hi, step):
    fn = _compile(lambda a: getattr(torch, name)(a))
    x = floats_between(lo, hi, step)
    for sign in (1, -1):
        for chunk in (sign * x).split(1 << 22):
            assert ulp_error(fn(chunk), chunk, getattr(torch, name)) <= MAX_ULP, (name, sign)


def test_sincos_gives_the_bits_of_sin_and_cos():
    # the fused call computes each function as alone: same bits, on a sweep with quadrant edges
    x = torch.cat([floats_between(2.0**-10, 8192.0, 4099), -floats_between(1.0, 8192.0, 4111)])
    both = _compile(lambda a: (torch.sin(a), torch.cos(a)))(x)
    alone = _compile(lambda a: torch.sin(a))(x), _compile(lambda a: torch.cos(a))(x)
    for got, want in zip(both, alone):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
