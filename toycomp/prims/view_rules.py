"""Stage 3b, the table continued: views, identity-like ops, copies and tensor creation.

Input IR -> output IR: ATen view ops become the four view prims (``reshape``, ``permute``,
``broadcast_in_dim``, ``slice``) with every size spelled out (no ``-1``, no negative dims, bounds
clamped); identity-like ops (``detach``, ``alias``, ``clone``, ``_to_copy`` to the same dtype)
return their input; creation ops become ``full`` / ``iota``. Example::

    t = aten.t(w)                 ->  permute = prims.permute(w, [1, 0])
    view = aten.view(s, [10])     ->  reshape = prims.reshape(s, [10])
    ones = aten.ones_like(loss)   ->  full = prims.full([], 1, torch.float32, 'cpu')

NB: in PyTorch this lives in torch/_refs/__init__.py (``_refs.view``, ``_refs.squeeze``,
``_refs.full``...) and torch/_decomp/decompositions.py (``slice_forward``, ``select``...).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.helpers import broadcast_to, convert, normalize_dim, reshape, result_type
from toycomp.prims import shift_rules
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.tensor_utils import python_number_dtype

aten = torch.ops.aten


def _ops(*names: str) -> list[Any]:
    """``aten.<name>.<overload>`` for each "name.overload" and its ``*_copy`` twin (which
    functionalization may produce), for those that exist in this PyTorch."""
    found = []
    for full_name in names:
        name, overload = full_name.split(".")
        for packet_name in (name, name + "_copy"):
            packet = getattr(aten, packet_name, None)
            if packet is not None and hasattr(packet, overload):
                found.append(getattr(packet, overload))
    return found


# --- identity-like --------------------------------------------------------------------------------
# [Note: identity-like ops]
# In a functional graph ``clone`` and ``detach`` only matter for autograd and memory ownership,
# not for values, so they disappear: the node's users read the input's value directly. A graph
# output that is then literally a graph input is the caller's (the inductor wrapper's) business.
@register(*_ops("detach.default", "alias.default", "lift_fresh.default", "lift_fresh_copy.default"))
@register(aten.clone.default, aten.contiguous.default)
def identity(a: Any, *, memory_format: Any = None) -> Any:
    return a


@register(aten._to_copy.default)
def to_copy(
    a: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> Any:
    if device is not None and torch.device(device) != a.device:
        raise Unsupported(f"_to_copy to another device ({a.device} -> {device})")
    if layout not in (None, torch.strided):
        raise Unsupported(f"_to_copy to layout {layout}")
    return convert(a, dtype)


@register(aten.copy.default)
def copy(a: Any, src: Any, non_blocking: bool = False) -> Any:
    if src.device != a.device:
        raise Unsupported(f"copy across devices ({src.device} -> {a.device})")
    return broadcast_to(convert(src, a.dtype), a.shape)


# --- views ----------------------------------------------------------------------------------------
def infer_size(shape: Sequence[int], numel: int) -> list[int]:
    """Resolve one ``-1`` in a view's ``shape`` for a tensor of ``numel`` elements."""
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    if math.prod(shape) != numel:
        raise ValueError(f"shape {shape} is invalid for {numel} elements")
    return shape


@register(*_ops("view.default", "_unsafe_view.default", "reshape.default"))
def view(a: Any, size: Sequence[int]) -> Any:
    return reshape(a, infer_size(size, a.numel()))


@register(*_ops("expand.default"))
def expand(a: Any, size: Sequence[int], *, implicit: bool = False) -> Any:
    offset = len(size) - a.ndim
    shape = [a.shape[i - offset] if s == -1 else s for i, s in enumerate(size)]
    return broadcast_to(a, shape)


@register(*_ops("permute.default"))
def permute(a: Any, dims: Sequence[int]) -> Any:
    dims = [normalize_dim(d, a.ndim) for d in dims]
    return a if dims == list(range(a.ndim)) else prims.permute(a, dims)


@register(*_ops("transpose.int"))
def transpose(a: Any, dim0: int, dim1: int) -> Any:
    dims = list(range(a.ndim))
    if a.ndim > 0:
        d0, d1 = normalize_dim(dim0, a.ndim), normalize_dim(dim1, a.ndim)
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(a, dims)


@register(*_ops("t.default"))
def t(a: Any) -> Any:
    return transpose(a, 0, 1) if a.ndim == 2 else a


@register(*_ops("unsqueeze.default"))
def unsqueeze(a: Any, dim: int) -> Any:
    dim = normalize_dim(dim, a.ndim + 1)
    return prims.reshape(a, [*a.shape[:dim], 1, *a.shape[dim:]])


@register(*_ops("squeeze.default", "squeeze.dim", "squeeze.dims"))
def squeeze(a: Any, dim: int | Sequence[int] | None = None) -> Any:
    if dim is None:
        dims = set(range(a.ndim))
    else:
        dims = {normalize_dim(d, a.ndim) for d in ([dim] if isinstance(dim, int) else dim)}
    return reshape(a, [s for d, s in enumerate(a.shape) if not (d in dims and s == 1)])


def _clamp_index(index: int | None, size: int, default: int) -> int:
    if index is None:
        return default
    if index < 0:
        index += size
    return min(max(index, 0), size)


@register(*_ops("slice.Tensor"))
def slice_(a: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    dim = normalize_dim(dim, a.ndim)
    size = a.shape[dim]
    start, end = _clamp_index(start, size, 0), _clamp_index(end, size, size)
    end = max(end, start)
    if (start, end, step) == (0, size, 1):
        return a
    return prims.slice(a, dim, start, end, step)


@register(*_ops("select.int"))
def select(a: Any, dim: int, index: int) -> Any:
    dim = normalize_dim(dim, a.ndim)
    index = index + a.shape[dim] if index < 0 else index
    if not 0 <= index < a.shape[dim]:
        raise IndexError(f"select index {index} out of range for size {a.shape[dim]}")
    picked = slice_(a, dim, index, index + 1)
    return prims.reshape(picked, [s for d, s in enumerate(a.shape) if d != dim])


@register(*_ops("split_with_sizes.default"))
def split_with_sizes(a: Any, split_sizes: Sequence[int], dim: int = 0) -> list[Any]:
    dim, start, out = normalize_dim(dim, a.ndim), 0, []
    for size in split_sizes:
        out.append(slice_(a, dim, start, start + size))
        start += size
    return out


@register(*_ops("split.Tensor"))
def split(a: Any, split_size: int, dim: int = 0) -> list[Any]:
    size = a.shape[normalize_dim(dim, a.ndim)]
    sizes = [min(split_size, size - s) for s in range(0, size, split_size)] if split_size else []
    return split_with_sizes(a, sizes or [size], dim)


@register(*_ops("unbind.int"))
def unbind(a: Any, dim: int = 0) -> list[Any]:
    return [select(a, dim, i) for i in range(a.shape[normalize_dim(dim, a.ndim)])]


@register(aten.repeat.default)
def repeat(a: Any, repeats: Sequence[int]) -> Any:
    """Tiles: ``a`` broadcast into ``[r0, s0, r1, s1, ...]`` (its dims at the odd places), then
    read as ``[r0 * s0, r1 * s1, ...]``: element ``i * s + j`` of a dim is ``a``'s ``j``."""
    if len(repeats) < a.ndim:
        raise Unsupported("repeat with fewer repeats than the tensor has dims")  # eager raises
    shape = [1] * (len(repeats) - a.ndim) + list(a.shape)
    tiled = [n for r, s in zip(repeats, shape) for n in (r, s)]
    spread = prims.broadcast_in_dim(reshape(a, shape), tiled, list(range(1, len(tiled), 2)))
    return reshape(spread, [r * s for r, s in zip(repeats, shape)])


# --- scatters: a mask along one dim (iota + eq + where) puts each piece in its place --------------
# [Note: scatters without a scatter prim]
# No prim writes a tensor at an offset: Inductor decomposes ``cat`` into ``constant_pad_nd`` and
# ``select_backward`` into ``select_scatter`` of zeros, and toycomp has neither. What the prims
# can say is "element i of this dim": an ``iota`` compared with a constant, broadcast to the
# result. So the ops whose pieces fill whole slots of one dim decompose into ``where``s that fuse
# with their producers: ``select_backward`` (one slot, zeros elsewhere), ``stack`` (slot i holds
# tensor i) and ``cat`` of equal sizes (a stack, reshaped; the backward of ``split``/``chunk``).
# A ``cat`` of unequal sizes needs shifted reads: a gather at ``i - offset`` (shift_rules.py). Likewise
# ``tril``/``triu`` compare a row iota with a column iota (the causal mask of attention).
def _slot(shape: Sequence[int], dim: int, index: int, device: Any) -> Any:
    """Bools of ``shape``: True where the index along ``dim`` equals ``index``."""
    slots = prims.eq(prims.iota(shape[dim], torch.int64, device), index)
    return prims.broadcast_in_dim(slots, list(shape), [dim])


def _spread(a: Any, shape: Sequence[int], dim: int) -> Any:
    """``a`` (``shape`` without ``dim``) broadcast along ``dim``."""
    return prims.broadcast_in_dim(a, list(shape), [d for d in range(len(shape)) if d != dim])


def _zero(dtype: torch.dtype) -> Any:
    return torch.zeros((), dtype=dtype).item()  # 0.0, 0 or False


@register(aten.select_backward.default)
def select_backward(grad: Any, input_sizes: Sequence[int], dim: int, index: int) -> Any:
    dim = normalize_dim(dim, len(input_sizes))
    index = index + input_sizes[dim] if index < 0 else index
    spread = _spread(grad, input_sizes, dim)
    return prims.where(_slot(input_sizes, dim, index, grad.device), spread, _zero(grad.dtype))


@register(aten.stack.default)
def stack(tensors: Sequence[Any], dim: int = 0) -> Any:
    first = tensors[0]
    if any(tuple(t.shape) != tuple(first.shape) for t in tensors):
        raise ValueError("stack expects each tensor to be equal size")
    dim = normalize_dim(dim, first.ndim + 1)
    shape = [*first.shape[:dim], len(tensors), *first.shape[dim:]]
    dtype = result_type(*tensors)
    out = _spread(convert(tensors[-1], dtype), shape, dim)
    for i in range(len(tensors) - 2, -1, -1):
        slot = _slot(shape, dim, i, first.device)
        out = prims.where(slot, _spread(convert(tensors[i], dtype), shape, dim), out)
    return out


@register(aten.cat.default)
def cat(tensors: Sequence[Any], dim: int = 0) -> Any:
    # ATen skips legacy empty 1-d tensors (unless all are), but their dtypes still promote: a
    # float32 torch.tensor([]) before bfloat16 keys (a key cache's first step) gives float32
    dtype = result_type(*tensors)
    tensors = [convert(t, dtype) for t in tensors if tuple(t.shape) != (0,)] or list(tensors)
    first = tensors[0]
    dim = normalize_dim(dim, first.ndim)
    if any(tuple(t.shape) != tuple(first.shape) for t in tensors):
        return shift_rules.cat_unequal(tensors, dim)  # shifted reads
    if len(tensors) == 1:
        return convert(first, dtype)
    stacked = stack(tensors, dim)
    size = first.shape[dim] * len(tensors)
    return prims.reshape(stacked, [*first.shape[:dim], size, *first.shape[dim + 1 :]])


def _triangle(a: Any, diagonal: int, keep: Any) -> Any:
    """``a`` where ``keep(column - row, diagonal)`` holds on its last two dims, else 0."""
    rows, cols = a.shape[-2:]
    shape = [rows, cols]
    row = prims.broadcast_in_dim(prims.iota(rows, torch.int64, a.device), shape, [0])
    col = prims.broadcast_in_dim(prims.iota(cols, torch.int64, a.device), shape, [1])
    mask = keep(prims.sub(col, row), diagonal)
    mask = prims.broadcast_in_dim(mask, list(a.shape), [a.ndim - 2, a.ndim - 1])
    return prims.where(mask, a, _zero(a.dtype))


@register(aten.tril.default)
def tril(a: Any, diagonal: int = 0) -> Any:
    return _triangle(a, diagonal, prims.le)


@register(aten.triu.default)
def triu(a: Any, diagonal: int = 0) -> Any:
    return _triangle(a, diagonal, prims.ge)


# --- creation -------------------------------------------------------------------------------------
def _check_layout(layout: Any) -> None:
    if layout not in (None, torch.strided):
        raise Unsupported(f"layout {layout}")


def _full(shape: Sequence[int], value: Any, dtype: torch.dtype, device: Any) -> Any:
    if isinstance(value, float) and not dtype.is_floating_point:
        if not value.is_integer() or dtype is torch.bool:  # ATen would round / test != 0
            raise Unsupported(f"fill value {value} for a {dtype} tensor")
        value = int(value)
    return prims.full(list(shape), value, dtype, torch.device(device or "cpu"))


@register(aten.full.default)
def full(size: Any, fill_value: Any, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return _full(size, fill_value, dtype or python_number_dtype(fill_value), device)


@register(aten.scalar_tensor.default)
def scalar_tensor(s: Any, *, dtype=None, layout=None, device=None, pin_memory=None) -> Any:
    _check_layout(layout)
    return _full([], s, dtype or torch.get_default_dtype(), device)


def _constant_factories(value: int) -> tuple[Any, Any, Any]:
    """The decompositions of ``zeros``, ``zeros_like`` and ``new_zeros`` (value 0), or ones."""

    def factory(size, *, dtype=None, layout=None, device=None, pin_memory=None, **_) -> Any:
        _check_layout(layout)
        return _full(size, value, dtype or torch.get_default_dtype(), device)

    def like(a, *, dtype=None, layout=None, device=None, pin_memory=None, **_) -> Any:
        _check_layout(layout)
        return _full(a.shape, value, dtype or a.dtype, device or a.device)

    def new(a, size, *, dtype=None, layout=None, device=None, pin_memory=None) -> Any:
        _check_layout(layout)
        return _full(size, value, dtype or a.dtype, device or a.device)

    return factory, like, new


# ``empty`` may hold anything, so zeros are a valid (and deterministic) choice.
zeros, zeros_like, new_zeros = _constant_factories(0)
register(*_ops("zeros.default", "zeros.memory_format", "empty.default"))(zeros)
register(*_ops("empty.memory_format"))(zeros)
register(*_ops("zeros_like.default", "empty_like.default"))(zeros_like)
register(*_ops("new_zeros.default", "new_empty.default"))(new_zeros)
ones, ones_like, new_ones = _constant_factories(1)
register(*_ops("ones.default", "ones.memory_format"))(ones)
register(*_ops("ones_like.default"))(ones_like)
register(*_ops("new_ones.default"))(new_ones)


@register(aten.full_like.default)
def full_like(a: Any, fill_value: Any, *, dtype=None, layout=None, device=None, **_) -> Any:
    _check_layout(layout)
    return _full(a.shape, fill_value, dtype or a.dtype, device or a.device)


@register(aten.new_full.default)
def new_full(a: Any, size: Any, fill_value: Any, *, dtype=None, device=None, **_) -> Any:
    return _full(size, fill_value, dtype or a.dtype, device or a.device)


@register(aten.fill.Scalar)
def fill(a: Any, value: Any) -> Any:
    return _full(a.shape, value, a.dtype, a.device)


@register(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(start: Any, end: Any = None, step: Any = 1, *, dtype=None, device=None, **_) -> Any:
    if end is None:
        start, end = 0, start
    if dtype is None:
        numbers = (start, end, step)
        dtype = torch.int64 if all(isinstance(v, int) for v in numbers) else None
    dtype = dtype or torch.get_default_dtype()
    length = max(math.ceil((end - start) / step), 0)
    if not dtype.is_floating_point and not all(isinstance(v, int) for v in (start, step)):
        raise Unsupported(f"arange with non-integer start/step into {dtype}")
    out = prims.iota(length, dtype, torch.device(device or "cpu"))
    out = out if step == 1 else prims.mul(out, step)
    return out if start == 0 else prims.add(out, start)
