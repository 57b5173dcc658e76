"""Stage 3b, the table (max pooling): ATen -> prims decompositions of ``max_pool2d`` and its
backward, with views, ``iota`` masks and ``where`` only.

Input IR -> output IR: like ``nn_rules.py``, each function takes an ATen op's arguments
(``Proxy`` objects while ``decompose`` traces, or real tensors) and returns its results computed
with prims. The forward is an elementwise running maximum over the kh * kw strided slices of
the (padded) input, one slice per window position, and the argmax's flat index rides along;
everything is pointwise, so the pooling fuses with the ReLU before it. Example,
``aten.max_pool2d_with_indices(x, [2, 2], [2, 2])`` on x of shape (N, C, 4, 4)::

    v00 = prims.slice(prims.slice(x, 2, 0, 3, 2), 3, 0, 3, 2)   # x[:, :, 0::2, 0::2]: (N, C, 2, 2)
    v01 = prims.slice(prims.slice(x, 2, 0, 3, 2), 3, 1, 4, 2)   # x[:, :, 0::2, 1::2]
    keep = prims.logical_and(prims.logical_not(prims.gt(v01, v00)), prims.eq(v01, v01))
    out = prims.where(keep, v00, v01);   index = prims.where(keep, index00, index01)   ...

NB: in PyTorch, Inductor lowers these ops itself with indexed loads (torch/_inductor/lowering.py,
``max_pool2d_with_indices_backward``; torch/_inductor/decomposition.py for the forward), and
eager's CPU kernels are in aten/src/ATen/native/cpu/MaxPoolKernel.cpp.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.prims.helpers import convert, get_computation_dtype, is_symbolic

aten = torch.ops.aten


# [Note: padding without a pad prim]
# A padded window reads before the first row (or past the last): no prim reads out of bounds.
# But views compose: broadcasting a dim of size n to (copies, n) and reshaping it to copies * n
# repeats it, so a slice of that reads x[(lo + i) mod n], for any offset lo (a *circular* read;
# inductor turns it into index arithmetic with a modulo, nothing is copied). A ``where`` on an
# ``iota`` mask then replaces what wrapped around by the padding value (-inf for the maximum).
# Without padding the read is a plain strided slice. Broadcasting to (copies, n, repeat) also
# repeats each element ``repeat`` times in a row: the inverse of a strided slice that the
# backward needs ([Note: max pooling's backward]).
def _circular_slice(x: Any, dim: int, lo: int, length: int, repeat: int = 1) -> Any:
    """``y[i] = x[((lo + i) mod (n * repeat)) // repeat]`` along ``dim`` for ``i < length``:
    each element ``repeat`` times in a row, read circularly from ``lo``; views only."""
    n = x.shape[dim] * repeat
    if repeat == 1 and 0 <= lo and lo + length <= n:
        return x if (lo, length) == (0, n) else prims.slice(x, dim, lo, lo + length)
    start = lo % n  # where element lo sits in the first copy
    copies = -(-(start + length) // n)  # ceil
    shape = [*x.shape[:dim], copies, x.shape[dim], repeat, *x.shape[dim + 1 :]]
    kept = [d if d < dim else d + 1 if d == dim else d + 2 for d in range(x.ndim)]
    tiled = prims.broadcast_in_dim(x, shape, kept)
    flat = prims.reshape(tiled, [*x.shape[:dim], copies * n, *x.shape[dim + 1 :]])
    return prims.slice(flat, dim, start, start + length)


def _index_line(length: int, step: int, offset: int, device: Any) -> Any:
    """The int64 line ``offset + step * i`` for ``i < length``."""
    line = prims.iota(length, torch.int64, device)
    return prims.add(prims.mul(line, step), offset)


def _in_range(line: Any, low: int, high: int) -> Any:
    """Bools: ``low <= line < high``."""
    return prims.logical_and(prims.ge(line, low), prims.lt(line, high))


def _on_last_two(t: Any, shape: Sequence[int], dim: int) -> Any:
    """A 1-d tensor along ``dim`` (one of the last two dims) broadcast to ``shape``."""
    return prims.broadcast_in_dim(t, list(shape), [dim])


class Window(NamedTuple):
    """One spatial dim of a pooling: input size, output size, kernel, stride, padding,
    dilation, and the dim's index in the tensor."""

    size: int
    out: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    dim: int

    def positions(self, k: int, device: Any) -> Any:
        """Input position read at window offset ``k`` by each output position (int64 line)."""
        return _index_line(self.out, self.stride, k * self.dilation - self.padding, device)


def _pair(value: Sequence[int] | int, default: Sequence[int]) -> tuple[int, int]:
    value = [value] if isinstance(value, int) else list(value) or list(default)
    return (value[0], value[-1])


def _output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """ATen's ``pooling_output_shape`` (torch/_meta_registrations.py)."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def _windows(
    a: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool
) -> tuple[Window, Window]:
    if a.ndim not in (3, 4):
        raise Unsupported(f"max_pool2d of a {a.ndim}-d input")
    if not a.dtype.is_floating_point:
        raise Unsupported(f"max_pool2d of {a.dtype}")
    if any(is_symbolic(a.shape[d]) for d in (-2, -1)):
        raise Unsupported("max_pool2d with symbolic height or width")
    kernel = _pair(kernel_size, ())
    strides, pads, dils = _pair(stride, kernel), _pair(padding, (0,)), _pair(dilation, (1,))
    windows = []
    for i, dim in enumerate((a.ndim - 2, a.ndim - 1)):
        args = (kernel[i], strides[i], pads[i], dils[i])
        out = _output_size(a.shape[dim], *args, ceil_mode)
        windows.append(Window(a.shape[dim], out, *args, dim))
    return windows[0], windows[1]


def _padded(x: Any, wh: Window, ww: Window, fill: float) -> Any:
    """``x`` with the padding its windows read (``fill`` there), as views and one ``where``."""
    xp, lines = x, []
    for w in (wh, ww):
        length = (w.out - 1) * w.stride + (w.kernel - 1) * w.dilation + 1
        xp = _circular_slice(xp, w.dim, -w.padding, length)
        if w.padding > 0 or length > w.size + w.padding:
            lines.append((w, _index_line(length, 1, -w.padding, x.device)))
    if not lines:
        return xp
    masks = [_on_last_two(_in_range(line, 0, w.size), xp.shape, w.dim) for w, line in lines]
    inside = masks[0] if len(masks) == 1 else prims.logical_and(*masks)
    return prims.where(inside, xp, fill)


def _window_values(xp: Any, wh: Window, ww: Window, kh: int, kw: int) -> Any:
    """What window offset (kh, kw) reads for every output position: two strided slices."""
    for w, k in ((wh, kh), (ww, kw)):
        start = k * w.dilation
        xp = prims.slice(xp, w.dim, start, start + (w.out - 1) * w.stride + 1, w.stride)
    return xp


def _flat_index(rows: Any, cols: Any, ww: Window, shape: Sequence[int], row_dim: int) -> Any:
    """``row * width + col`` (the indices max_pool2d returns) for a line of rows and a line of
    columns, broadcast to ``shape`` (rows along ``row_dim``, columns along the next dim)."""
    plane = [rows.shape[0], cols.shape[0]]
    row_part = prims.broadcast_in_dim(prims.mul(rows, ww.size), plane, [0])
    col_part = prims.broadcast_in_dim(cols, plane, [1])
    flat = prims.add(row_part, col_part)
    return prims.broadcast_in_dim(flat, list(shape), [row_dim, row_dim + 1])


def _first_nonnegative(w: Window, device: Any) -> Any:
    """Per output position, the first window position at or after 0 (eager's starting index)."""
    first = w.positions(w.kernel - 1, device)
    for k in range(w.kernel - 2, -1, -1):
        pos = w.positions(k, device)
        first = prims.where(prims.ge(pos, 0), pos, first)
    return first


def _keeps_best(value: Any, best: Any) -> Any:
    """Bools: eager's ``!(value > best || isnan(value))``, the running maximum stays."""
    return prims.logical_and(prims.logical_not(prims.gt(value, best)), prims.eq(value, value))


# [Note: max pooling's argmax]
# Eager's CPU kernel starts each window with max = -inf and the index of its first position
# that is not in the top or left padding, then walks the window row by row and takes a value
# where ``value > max || isnan(value)``: the first maximum wins, a NaN wins and stays (unless
# a later NaN comes). We walk the kh * kw slices in the same order with the same rule, written
# as where(keep, old, new) with keep = !(new > old) && new == new; the padding reads -inf, which
# never wins. On float16/bfloat16 the comparisons run in float32 (exact either way).
@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(
    a: Any, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
    ceil_mode: bool = False,
) -> tuple[Any, Any]:  # fmt: skip
    wh, ww = _windows(a, kernel_size, stride, padding, dilation, ceil_mode)
    x = convert(a, get_computation_dtype(a.dtype))
    xp = _padded(x, wh, ww, -math.inf)
    shape = [*a.shape[:-2], wh.out, ww.out]
    best = prims.full(shape, -math.inf, x.dtype, a.device)
    first = [_first_nonnegative(w, a.device) for w in (wh, ww)]
    index = _flat_index(*first, ww, shape, wh.dim)
    corner = _flat_index(wh.positions(0, a.device), ww.positions(0, a.device), ww, shape, wh.dim)
    for kh in range(wh.kernel):
        for kw in range(ww.kernel):
            value = _window_values(xp, wh, ww, kh, kw)
            here = prims.add(corner, kh * wh.dilation * ww.size + kw * ww.dilation)
            keep = _keeps_best(value, best)
            best, index = prims.where(keep, best, value), prims.where(keep, index, here)
    return convert(best, a.dtype), index


# [Note: max pooling's backward]
# grad_input[p] = sum of grad_out[o] over the output positions o whose index[o] is p: a
# scatter-add, which no prim does. Turned around it is a gather, as Inductor writes it: window
# offset (kh, kw) of output position o reads input position o * stride - padding + offset *
# dilation in each dim, so an input position p gets, for each offset, grad_out at the ONE output
# position (if any) whose window read p at that offset - where index[o] == p. Reading "the
# output position that lands on p" is a view: the inverse of a strided slice, spread each dim
# by the stride (broadcast to (out, stride) and reshape: o repeated) and shift it by the offset
# (a circular slice, [Note: padding without a pad prim]); a 1-d mask keeps the input positions
# that some o really lands on. The kh * kw terms add up in one pointwise kernel over the input
# grid; Inductor's lowering needs fewer terms (only the ceil(kernel / stride) windows that can
# hold a position) thanks to indexed loads. Indices are trusted to lie in their own window, as
# ``max_pool2d_with_indices`` makes them (autograd's only source of this op).
def _land(t: Any, w: Window, offset: int) -> Any:
    """``y[i] = t[(i - offset) // stride]`` along ``w.dim`` for the ``w.size`` input positions
    ``i`` (views only; meaningful where ``_landed`` is true)."""
    return _circular_slice(t, w.dim, -offset, w.size, repeat=w.stride)


def _landed(w: Window, offset: int, shape: Sequence[int], device: Any) -> Any:
    """Bools, true where input position ``i`` along ``w.dim`` is ``o * stride + offset`` for
    some output position ``o``; broadcast to ``shape``."""
    line = _index_line(w.size, 1, -offset, device)
    hit = _in_range(line, 0, w.out * w.stride)
    if w.stride > 1:
        slots = prims.eq(prims.iota(w.stride, torch.int64, device), 0)
        first_of_slot = _circular_slice(slots, 0, -offset, w.size, repeat=1)
        hit = prims.logical_and(hit, first_of_slot)
    return _on_last_two(hit, shape, w.dim)


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(
    grad_out: Any, a: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
    ceil_mode: bool, indices: Any,
) -> Any:  # fmt: skip
    wh, ww = _windows(a, kernel_size, stride, padding, dilation, ceil_mode)
    g = convert(grad_out, get_computation_dtype(grad_out.dtype))
    rows, cols = (_index_line(w.size, 1, 0, a.device) for w in (wh, ww))
    position = _flat_index(rows, cols, ww, a.shape, wh.dim)  # p = row * width + col
    offsets_h = [kh * wh.dilation - wh.padding for kh in range(wh.kernel)]
    offsets_w = [kw * ww.dilation - ww.padding for kw in range(ww.kernel)]
    landed_w = [_landed(ww, ow, a.shape, a.device) for ow in offsets_w]
    total = None
    for oh in offsets_h:
        grad_h, index_h = _land(g, wh, oh), _land(indices, wh, oh)
        landed_h = _landed(wh, oh, a.shape, a.device)
        for ow, landed in zip(offsets_w, landed_w):
            grad_here, index_here = _land(grad_h, ww, ow), _land(index_h, ww, ow)
            hit = prims.logical_and(prims.eq(index_here, position), landed)
            hit = prims.logical_and(hit, landed_h)
            share = prims.where(hit, grad_here, 0.0)
            total = share if total is None else prims.add(total, share)
    return convert(total, a.dtype)
