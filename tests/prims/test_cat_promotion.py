"""``cat`` promotes over every input, the legacy empty ``torch.tensor([])`` ones included, as ATen
does (they are skipped for the shapes only): a float32 empty cache before bfloat16 keys gives
float32. Both backends and both capture paths, against eager."""

from __future__ import annotations

import pytest
import torch

import toycomp

CASES = {
    "empty f32 then bf16": (lambda: [torch.tensor([]), torch.randn(2, 3).bfloat16()], 0),
    "bf16 then empty f32": (lambda: [torch.randn(2, 3).bfloat16(), torch.tensor([])], 1),
    "empty f64 then int": (lambda: [torch.tensor([], dtype=torch.float64),
                                    torch.arange(6).reshape(2, 3)], 0),
    "f16 and f32, unequal": (lambda: [torch.randn(2, 3).half(), torch.randn(1, 3)], 0),
    "all empty": (lambda: [torch.tensor([]), torch.tensor([], dtype=torch.float64)], 0),
}  # fmt: skip


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("case", list(CASES))
def test_cat_result_dtype_and_values_as_eager(case, backend):
    make, dim = CASES[case]
    tensors = make()

    def f(*ts):
        return torch.cat(ts, dim) * 2

    want = f(*tensors)
    got = toycomp.compile(f, backend=backend)(*tensors)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_cat_with_an_empty_cache_through_dynamo():
    keys = torch.randn(2, 2, 8, 8).bfloat16()

    def f(cache, k):
        return torch.cat([cache, k], dim=-2).float().sum(-1)

    torch._dynamo.reset()
    got = torch.compile(f, backend="toycomp")(torch.tensor([]), keys)
    torch.testing.assert_close(got, f(torch.tensor([]), keys))
    torch._dynamo.reset()
