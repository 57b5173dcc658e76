"""The run-time checks that the generated wrapper and the IR interpreter share (runtime.py)."""

import pytest
import torch

import toycomp.prims as prims
from toycomp.inductor.runtime import check_extern, check_input, resolve_extern

CPU = torch.device("cpu")


def test_check_input_ignores_strides_of_size_one_dims_only():
    row = torch.empty(4, 1).t()  # size (1, 4), stride (1, 1)
    check_input(row, (1, 4), (4, 1), torch.float32, CPU, "a")
    with pytest.raises(ValueError, match="input a: compiled for"):
        check_input(torch.empty(4, 3).t(), (3, 4), (4, 1), torch.float32, CPU, "a")
    with pytest.raises(ValueError, match="input a: compiled for"):
        check_input(row, (1, 4), (4, 1), torch.float64, CPU, "a")
    with pytest.raises(TypeError, match="expected a tensor"):
        check_input(3.0, (), (), torch.float32, CPU, "a")


def test_check_extern_copies_into_the_planned_layout():
    t = torch.randn(3, 4)
    assert check_extern(t, (3, 4), (4, 1), torch.float32, "buf0") is t
    moved = check_extern(t.t().contiguous().t(), (3, 4), (4, 1), torch.float32, "buf0")
    assert moved.stride() == (4, 1) and torch.equal(moved, t)
    with pytest.raises(RuntimeError, match="extern kernel for buf0: expected"):
        check_extern(t, (4, 3), (3, 1), torch.float32, "buf0")


def test_resolve_extern():
    assert resolve_extern("aten.mm.default") is torch.ops.aten.mm.default
    assert resolve_extern("toycomp.prims.sin") is prims.PRIM_INFO[prims.sin].ref
    with pytest.raises(RuntimeError, match="not found"):
        resolve_extern("aten.no_such_op.default")
