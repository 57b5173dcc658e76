"""Stage 3b, the table (what functionalization and autograd leave behind in real models):
``as_strided_scatter``, ``as_strided``, ``empty_strided`` and ``fill.Tensor``.

Input IR -> output IR: ATen ops -> prims.

* ``as_strided_scatter(a, src, size, stride, offset)`` is what AOT's functionalization writes for
  an in-place update of a view (``ids[:, 0] = start`` in BART and T5's ``shift_tokens_right``):
  a copy of ``a`` with ``src`` stored at the storage positions ``offset + sum(i_k * stride_k)``.
  It becomes one ``prims.scatter`` into ``a`` read in storage order. Example, ``a`` of (2, 3),
  ``size=(2,), stride=(3,), offset=0`` (column 0)::

      flat = prims.reshape(a, [6])
      positions = prims.add(prims.mul(prims.iota(2), 3), 0)       # 0 3
      out = prims.reshape(prims.scatter(flat, 0, positions, src, False), [2, 3])

* ``fill.Tensor(a, value)``: ``value`` (0-d) broadcast to ``a``'s shape.

(``convolution_backward`` is an extern: [Note: a convolution's backward is one extern] in
``decomp_table.py``.)

NB: in PyTorch ``as_strided_scatter`` is torch/_refs/__init__.py's (a prim of its own there),
``fill.Tensor`` torch/_decomp/decompositions.py's.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
from torch import fx

import toycomp.prims as prims
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.prims.helpers import convert, is_symbolic, reshape

aten = torch.ops.aten


def _concrete(*sizes: Any, op: str = "as_strided") -> None:
    if any(is_symbolic(s) for group in sizes for s in group):
        raise Unsupported(f"{op} with symbolic sizes")


# --- as_strided_scatter and as_strided ----------------------------------------------------------
# [Note: as_strided reads the ATen layout]
# as_strided reads memory, and a prim value has none: the rules read ``a`` in the order eager
# lays it out in memory, given by the strides of the ATen node's meta value (AOT makes them the
# real ones: [Note: as_strided reads memory]), not by those the prims happen to give (a mean's
# decomposition ends in a view; an empty_strided is a contiguous full). The offset counts from
# a's first element where a is a fresh tensor (a new result of an ATen op: offset 0, as in
# eager). A graph input or a view may start anywhere in a storage the graph cannot see: an
# explicit offset into one is refused.
def _aten_layout(a: Any) -> tuple[Any, bool]:
    """``a`` laid out as eager lays it out (a meta value, or ``a`` itself when the prims run
    eagerly) and whether an offset counts from its first element (see the Note above)."""
    if isinstance(a, torch.Tensor):
        return a, True
    node = getattr(prims.current_tracer(), "aten_node", None)
    if node is not None and node.target in _READ_MEMORY and isinstance(node.args[0], fx.Node):
        val = node.args[0].meta.get("val")
        if isinstance(val, torch.Tensor):
            return val, _is_fresh(node.args[0])
    return a.val, _owns_storage(a)  # decomposed outside the ATen graph: the prims' layout


def _is_fresh(node: fx.Node) -> bool:
    """``node`` (ATen) is a new tensor: an op's result that is not a view of an argument."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:  # one result of a multi-output op
        return isinstance(node.args[0], fx.Node) and _is_fresh(node.args[0])
    schema = getattr(node.target, "_schema", None)
    return schema is not None and all(r.alias_info is None for r in schema.returns)


def _dense_order(sizes: Sequence[int], strides: Sequence[int]) -> list[int] | None:
    """The dims from outermost to innermost in memory when these strides are dense (a
    permutation of a contiguous tensor's), else None."""
    order = sorted(range(len(sizes)), key=lambda d: -strides[d])  # stable: ties keep dim order
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return None
        expected *= sizes[d]
    return order


def _storage_order(val: Any) -> list[int]:
    """The dims of ``val`` from outermost to innermost in memory, as ``clone`` lays them out:
    its own order when it is dense, else row-major (clone makes it contiguous)."""
    order = _dense_order(list(val.shape), list(val.stride()))
    return list(range(val.ndim)) if order is None else order


def _positions(size: Sequence[int], stride: Sequence[int], offset: int, device: Any) -> Any:
    """The storage position of each element of the view, flattened: offset + sum_k i_k * s_k."""
    positions = prims.full(list(size), offset, torch.int64, device)
    for k, (n, step) in enumerate(zip(size, stride)):
        term = prims.mul(prims.iota(n, torch.int64, device), step)
        positions = prims.add(positions, prims.broadcast_in_dim(term, list(size), [k]))
    return reshape(positions, [_numel(size)])


def _numel(size: Sequence[int]) -> int:
    count = 1
    for n in size:
        count *= n
    return count


def _in_storage(a: Any, order: list[int], size: Sequence[int], stride: Sequence[int],
                low: int) -> Any:  # fmt: skip
    """``a`` flattened in storage order; raises Unsupported unless the view's positions (from
    ``low``, where ``a``'s first element is) all lie among ``a``'s elements."""
    if any(s < 0 for s in stride):
        raise Unsupported("as_strided with a negative stride")
    last = low + sum((n - 1) * s for n, s in zip(size, stride))
    if low < 0 or last >= a.numel():
        raise Unsupported("as_strided reading outside the tensor's own elements")
    stored = prims.permute(a, order) if order != list(range(a.ndim)) else a
    return reshape(stored, [a.numel()]), stored.shape


def _owns_storage(a: Any) -> bool:
    """``a`` is computed in the graph by an op that returns a new tensor (not a view)."""
    node = getattr(a, "node", None)
    if node is None or node.op != "call_function":
        return False
    if prims.is_prim(node.target):
        return prims.prim_kind(node.target) is not prims.PrimKind.VIEW
    return _is_fresh(node)


@register(aten.as_strided.default)
def as_strided(a: Any, size: Sequence[int], stride: Sequence[int],
               storage_offset: int | None = None) -> Any:  # fmt: skip
    _concrete(a.shape, size, stride, [storage_offset or 0])
    val, fresh = _aten_layout(a)
    order = _storage_order(val)
    if order == list(range(a.ndim)) and not val.is_contiguous():
        raise Unsupported("as_strided of a tensor that is not dense in memory")
    if storage_offset is not None and not fresh:
        # a graph input's (or a view's) place in its storage is not in its meta value (make_fx
        # and AOT record offset 0): an absolute offset cannot be read back to an element of a
        raise Unsupported("as_strided with a storage offset into a graph input or a view")
    base = val.storage_offset()  # where a's first element is in its storage
    offset = base if storage_offset is None else storage_offset
    if _numel(size) == 0:
        return prims.full(list(size), 0, a.dtype, a.device)
    flat, _ = _in_storage(a, order, size, stride, offset - base)
    rows = _positions(size, stride, offset - base, a.device)
    return reshape(prims.gather(flat, 0, rows), list(size))


@register(aten.as_strided_scatter.default)
def as_strided_scatter(a: Any, src: Any, size: Sequence[int], stride: Sequence[int],
                       storage_offset: int | None = None) -> Any:  # fmt: skip
    # eager: ``out = a.clone(); out.as_strided(size, stride, offset).copy_(src)``; the clone
    # starts its storage at 0 and keeps a's memory order (if dense)
    _concrete(a.shape, size, stride, [storage_offset or 0], op="as_strided_scatter")
    count = _numel(size)
    if count == 0 or a.numel() == 0:
        return a
    order = _storage_order(_aten_layout(a)[0])
    flat, stored_shape = _in_storage(a, order, size, stride, storage_offset or 0)
    rows = _positions(size, stride, storage_offset or 0, a.device)
    values = reshape(convert(src, a.dtype), [count])
    out = reshape(prims.scatter(flat, 0, rows, values, False), list(stored_shape))
    if order == list(range(a.ndim)):
        return out
    return prims.permute(out, [order.index(d) for d in range(a.ndim)])


_READ_MEMORY = (aten.as_strided.default, aten.as_strided_scatter.default)


@register(aten.empty_strided.default)
def empty_strided(size: Sequence[int], stride: Sequence[int], *, dtype=None, layout=None,
                  device=None, pin_memory=None) -> Any:  # fmt: skip
    # Its values are unspecified (zeros are as good as any), its strides are not: the as_strided
    # rules read them from the ATen graph ([Note: as_strided reads the ATen layout]), and an
    # ATen op left to eager (an as_strided with symbolic sizes) reads the memory the prims give.
    # So a full laid out in storage order, permuted back to ``size``: the same strides.
    _concrete(size, stride, op="empty_strided")
    dtype, device = dtype or torch.get_default_dtype(), device or "cpu"
    order = _dense_order(list(size), list(stride))
    if _numel(size) == 0:
        return prims.full(list(size), 0, dtype, device)
    if order is None:
        raise Unsupported("empty_strided with strides that are not dense")
    stored = prims.full([size[d] for d in order], 0, dtype, device)
    if order == list(range(len(size))):
        return stored
    return prims.permute(stored, [order.index(d) for d in range(len(size))])


@register(aten.fill.Tensor)
def fill_tensor(a: Any, value: Any) -> Any:
    if value.ndim != 0:
        raise Unsupported(f"fill with a {value.ndim}-d value tensor")
    return prims.broadcast_in_dim(convert(value, a.dtype), list(a.shape), [])

