"""Tensor-metadata helpers that every stage shares.

Each stage describes tensors by their metadata (shape, strides, dtype) rather than their data:
capture and AOT record it, decompositions and lowering compute with it, the wrapper checks real
results against it. These few helpers have one home here so that the stages agree on it.

    >>> import torch
    >>> to_meta(torch.ones(2, 3).t())
    tensor(..., device='meta', size=(3, 2))
    >>> same_strides(torch.empty(1, 4), torch.empty(4, 1).t())  # size-1 dims' strides don't matter
    True
    >>> python_number_dtype(2), python_number_dtype(2.0), python_number_dtype(True)
    (torch.int64, torch.float32, torch.bool)
"""

from __future__ import annotations

from typing import Any

import torch


def to_meta(t: torch.Tensor) -> torch.Tensor:
    """An empty meta tensor with ``t``'s shape, stride and dtype (a node's ``meta["val"]``)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def to_meta_value(value: Any) -> Any:
    """``to_meta`` on a tensor or on each tensor of a tuple/list; other values unchanged."""
    if isinstance(value, (tuple, list)):
        return tuple(to_meta_value(v) for v in value)
    return to_meta(value) if isinstance(value, torch.Tensor) else value


def same_strides(expected: torch.Tensor | tuple, t: torch.Tensor) -> bool:
    """Same shape, and the same strides in every dimension that has more than one element.

    A dimension of size 0 or 1 is never stepped over, so its stride is irrelevant (PyTorch's
    kernels are free to report any value there, and do: compare ``torch.empty(1, 4).stride()``
    with ``torch.empty(4, 1).t().stride()``). ``expected`` is a tensor or a (size, stride) pair.
    """
    size, stride = (expected.shape, expected.stride()) if isinstance(expected, torch.Tensor) else expected
    shape, t_stride = t.shape, t.stride()
    if shape != tuple(size):
        return False
    if t_stride == tuple(stride):  # the common case, checked once per call of every kernel
        return True
    return all(a == b for n, a, b in zip(shape, stride, t_stride) if n > 1)


def python_number_dtype(x: bool | int | float | complex) -> torch.dtype:
    """``torch.tensor(x).dtype`` (floats: the default dtype, float32 unless set otherwise)."""
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, complex):
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    return torch.get_default_dtype()
