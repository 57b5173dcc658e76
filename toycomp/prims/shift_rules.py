"""Stage 3b, the table (shifted reads): pads, rolls, flips, cats of unequal sizes, slice_backward.

Input IR -> output IR: each of these ops reads its input at an index shifted or mirrored along a
dim, ``out[i] = a[i - 2]`` or ``a[n - 1 - i]``, with a constant where the input has no element.
The prims say "at an index computed from ``iota``" with ``prims.gather``, and lowering turns
such an index into plain index arithmetic (see [Note: index arithmetic is not indirect] in
inductor/lowering_indexing.py); the positions outside the input are a ``where``. Example,
``aten.constant_pad_nd(a, [1, 2], 0.5)`` on ``a`` of (3,)::

    i = prims.iota(6)                                           # 0 1 2 3 4 5
    rows = prims.minimum(prims.maximum(prims.sub(i, 1), 0), 2)  # clamped: never out of bounds
    inside = prims.logical_and(prims.ge(i, 1), prims.lt(i, 4))
    out = prims.where(inside, prims.gather(a, 0, rows), 0.5)    # 0.5 a0 a1 a2 0.5 0.5

NB: in PyTorch this lives in torch/_refs/__init__.py (``constant_pad_nd``, ``roll``, ``flip``),
torch/_decomp/decompositions.py (``slice_backward``) and torch/_inductor/lowering.py (``cat``,
``constant_pad_nd``: Inductor lowers them with ``ops.index_expr`` and masked loads).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.prims.helpers import convert, normalize_dim, reshape, result_type

aten = torch.ops.aten


def _read(a: Any, dim: int, index: Any) -> Any:
    """``a`` read along ``dim`` at ``index`` (1-d, int64: one entry per output position)."""
    shape = [*a.shape[:dim], index.shape[0], *a.shape[dim + 1 :]]
    return prims.gather(a, dim, prims.broadcast_in_dim(index, shape, [dim]))


def _mask(a_shape: Sequence[int], dim: int, inside: Any) -> Any:
    return prims.broadcast_in_dim(inside, list(a_shape), [dim])


def _shifted(a: Any, dim: int, offset: int, length: int) -> Any:
    """``out[i] = a[i - offset]`` along ``dim`` for ``length`` positions; where ``i - offset``
    is outside ``a`` the value is some element of ``a`` (the index is clamped): mask it."""
    n = a.shape[dim]
    i = prims.iota(length, torch.int64, a.device)
    return _read(a, dim, prims.minimum(prims.maximum(prims.sub(i, offset), 0), n - 1))


def _inside(offset: int, n: int, length: int, device: Any) -> Any:
    """Bools over ``length`` positions: ``offset <= i < offset + n``."""
    i = prims.iota(length, torch.int64, device)
    return prims.logical_and(prims.ge(i, offset), prims.lt(i, offset + n))


@register(aten.constant_pad_nd.default)
def constant_pad_nd(a: Any, pad: Sequence[int], value: Any = 0) -> Any:
    out = a
    for k in range(len(pad) // 2):
        dim, before, after = a.ndim - 1 - k, pad[2 * k], pad[2 * k + 1]
        n = out.shape[dim]
        length = n + before + after
        if length <= 0 or n == 0:
            raise Unsupported("constant_pad_nd to an empty dim or from one")
        if before == 0 and after == 0:
            continue
        shifted = _shifted(out, dim, before, length)
        inside = _inside(before, n, length, a.device)
        number = _number(value, a.dtype)
        shape = [*out.shape[:dim], length, *out.shape[dim + 1 :]]
        out = prims.where(_mask(shape, dim, inside), shifted, number)
    return out


def _number(value: Any, dtype: torch.dtype) -> Any:
    """The pad value as a Python number of ``dtype``'s kind (as the pad's result holds it)."""
    return torch.tensor(value).to(dtype).item()


@register(aten.flip.default)
def flip(a: Any, dims: Sequence[int]) -> Any:
    out = a
    for dim in {normalize_dim(d, a.ndim) for d in dims}:
        n = a.shape[dim]
        if n > 1:
            out = _read(out, dim, prims.sub(n - 1, prims.iota(n, torch.int64, a.device)))
    return out


@register(aten.roll.default)
def roll(a: Any, shifts: Sequence[int], dims: Sequence[int] = ()) -> Any:
    if not dims:  # the flattened tensor, rolled
        return reshape(roll(reshape(a, [a.numel()]), shifts, [0]), list(a.shape))
    out = a
    for shift, dim in zip(shifts, dims):
        dim = normalize_dim(dim, a.ndim)
        n = a.shape[dim]
        if n == 0 or shift % n == 0:
            continue
        s = shift % n  # out[i] = a[i - s] for i >= s, a[i - s + n] below
        wrapped = _mask(out.shape, dim, prims.lt(prims.iota(n, torch.int64, a.device), s))
        out = prims.where(wrapped, _shifted(out, dim, s - n, n), _shifted(out, dim, s, n))
    return out


def cat_unequal(tensors: Sequence[Any], dim: int) -> Any:
    """``cat`` of tensors of unequal sizes along ``dim``: each read shifted to its offset."""
    dtype = result_type(*tensors)
    tensors = [convert(t, dtype) for t in tensors if t.shape[dim] != 0] or [tensors[0]]
    length = sum(t.shape[dim] for t in tensors)
    shape = [*tensors[0].shape[:dim], length, *tensors[0].shape[dim + 1 :]]
    offsets = [sum(t.shape[dim] for t in tensors[:k]) for k in range(len(tensors))]
    out = _shifted(tensors[-1], dim, offsets[-1], length)
    i = prims.iota(length, torch.int64, tensors[0].device)
    for t, offset in zip(tensors[-2::-1], offsets[-2::-1]):
        before = _mask(shape, dim, prims.lt(i, offset + t.shape[dim]))
        out = prims.where(before, _shifted(t, dim, offset, length), out)
    return out


@register(aten.slice_backward.default)
def slice_backward(grad: Any, input_sizes: Sequence[int], dim: int, start: int, end: int,
                   step: int) -> Any:  # fmt: skip
    dim = normalize_dim(dim, len(input_sizes))
    n = input_sizes[dim]
    start = min(max(start + n if start < 0 else start, 0), n)
    m = grad.shape[dim]
    if m == 0 or n == 0:
        return prims.full(list(input_sizes), 0, grad.dtype, grad.device)
    if step != 1:  # a read would need i % step, which no prim has: store at start + k*step
        rows = prims.add(prims.mul(prims.iota(m, torch.int64, grad.device), step), start)
        zeros = prims.full(list(input_sizes), 0, grad.dtype, grad.device)
        return prims.scatter(zeros, dim, prims.broadcast_in_dim(rows, list(grad.shape), [dim]),
                             grad, False)  # fmt: skip
    shifted = _shifted(grad, dim, start, n)
    inside = _mask(list(input_sizes), dim, _inside(start, m, n, grad.device))
    return prims.where(inside, shifted, torch.zeros((), dtype=grad.dtype).item())
