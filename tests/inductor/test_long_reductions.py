"""Long reductions are as accurate as eager's: the error against a float64 reference is bounded
by eager's own error (twice it, or two float32/float16 epsilons when eager happens to land on
the correctly rounded result: a computed sum must round at least once).

C++ at 10^7-1.6*10^7 elements, where a sum accumulated lane by lane drifted (1e-6 to 2e-2 off,
eager 3e-8 to 2.5e-4; see [Note: a cascade for long rows] in cpp_reduction.py). Triton runs
through its interpreter, hundreds of times slower: at 2^21-2^22 elements, the sizes where its
split reductions (a tree per chunk, then a tree over the chunks) already apply.
"""

import pytest
import torch

import toycomp


def _relative_error(value, reference):
    return ((value.double() - reference).abs().max() / reference.abs().max()).item()


def _check_accuracy(fn, x, backend):
    reference = fn(x.double())
    eager = _relative_error(fn(x), reference)
    got = toycomp.compile(fn, backend=backend)(x)
    assert got.dtype == fn(x).dtype
    bound = 2 * max(eager, torch.finfo(got.dtype).eps)
    assert _relative_error(got, reference) <= bound, (eager, _relative_error(got, reference))


def _uniform(n, dtype=torch.float32, shift=0.0, shape=None):
    x = torch.rand(n, generator=torch.Generator().manual_seed(n)) + shift
    return x.to(dtype).reshape(shape or (n,))


@pytest.mark.parametrize(
    "name, fn, make",
    [
        ("sum", lambda x: x.sum(), lambda: _uniform(10_000_000)),
        ("mean_bf16", lambda x: x.mean(), lambda: _uniform(10_000_000, torch.bfloat16)),
        ("var", lambda x: x.var(), lambda: _uniform(16_000_000, shift=10.0)),  # mean >> std
        ("std_fp16", lambda x: x.std(), lambda: _uniform(16_000_000, torch.float16)),
        ("row_sums", lambda x: x.sum(1), lambda: _uniform(12_000_000, shape=(3, 4_000_000))),
        ("column_sums", lambda x: x.sum(0), lambda: _uniform(10_000_000, shape=(1_250_000, 8))),
        ("var_dim", lambda x: x.var(1), lambda: _uniform(10_000_000, shift=3.0, shape=(2, -1))),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_long_reduction_cpp(name, fn, make):
    _check_accuracy(fn, make(), "cpp")


@pytest.mark.parametrize(
    "name, fn, make",
    [
        ("sum", lambda x: x.sum(), lambda: _uniform(2**22)),
        ("row_sums", lambda x: x.sum(1), lambda: _uniform(2**21, shape=(2, 2**20))),
        ("var_fp16", lambda x: x.var(), lambda: _uniform(2**21, torch.float16)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_long_reduction_triton(name, fn, make):
    _check_accuracy(fn, make(), "triton")


def test_long_sum_propagates_inf_and_nan():
    # the cascade adds blocks: an inf or NaN in any block still reaches the result
    x = torch.rand(3_000_000)
    x[1_234_567] = float("inf")
    assert toycomp.compile(lambda x: x.sum(), backend="cpp")(x).item() == float("inf")
    x[2_000_001] = float("nan")
    assert toycomp.compile(lambda x: (x * 2).sum(), backend="cpp")(x).isnan().item()
