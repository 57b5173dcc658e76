"""Type promotion and broadcasting helpers of the decompositions (toycomp/prims/helpers.py)."""

import itertools

import torch

from toycomp.prims.helpers import result_type


def test_result_type_matches_torch():
    dtypes = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32,
              torch.float64]  # fmt: skip
    operands = [torch.ones(2, dtype=d) for d in dtypes] + [torch.tensor(1, dtype=d) for d in dtypes]
    operands += [True, 2, 2.5]
    for a, b in itertools.product(operands, repeat=2):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            assert result_type(a, b) == torch.result_type(a, b), (a, b)
