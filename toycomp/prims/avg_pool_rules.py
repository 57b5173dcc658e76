"""Stage 3b, the table (average pooling): ``avg_pool2d`` and its backward over windows that do not
overlap (kernel == stride, no padding: DenseNet's transitions, ResNet-D's shortcut), as views
and a sum.

Input IR -> output IR: ATen ops -> prims. With windows that tile the input, ``avg_pool2d`` is a
reshape that gives each window its own two dims, then a mean over them; its backward spreads
each output's gradient over its window (``broadcast_in_dim``), divided by the window's size.
Example, ``avg_pool2d(x, 2)`` on ``x`` of (N, C, 4, 6)::

    windows = prims.reshape(x, [N, C, 2, 2, 3, 2])   # (.., out row, row in window, ..)
    out = prims.mul(prims.sum(windows, [3, 5]), 0.25)

Overlapping or padded windows fall back visibly (Unsupported).

NB: in PyTorch this lives in torch/_inductor/lowering.py (``avg_pool2d``, ``avg_pool2d_backward``:
Inductor lowers both with its own loops over the window).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.prims.helpers import is_symbolic, reshape
from toycomp.prims.shift_rules import constant_pad_nd

aten = torch.ops.aten


def _tiles(x: Any, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
           ceil_mode: bool) -> tuple[list[int], list[int]]:  # fmt: skip
    """(kernel, number of windows) per spatial dim, or Unsupported if the windows overlap,
    leave gaps, are padded, or ceil_mode adds a partial one."""
    kernel = list(kernel) * (2 // len(kernel))
    stride = list(stride or kernel) * (2 // len(stride or kernel))
    if any(is_symbolic(s) for s in x.shape):
        raise Unsupported("avg_pool2d with symbolic sizes")
    if kernel != stride or any(padding):
        raise Unsupported("avg_pool2d with overlapping, spaced or padded windows")
    sizes = list(x.shape[-2:])
    counts = [n // k for n, k in zip(sizes, kernel)]
    if ceil_mode and any(n % k for n, k in zip(sizes, kernel)):
        raise Unsupported("avg_pool2d whose ceil_mode adds a partial window")
    if 0 in counts:
        raise Unsupported("avg_pool2d to an empty output")
    return kernel, counts


@register(aten.avg_pool2d.default)
def avg_pool2d(x: Any, kernel_size: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Any:  # fmt: skip
    (kh, kw), (oh, ow) = _tiles(x, kernel_size, stride, padding, ceil_mode)
    lead = list(x.shape[:-2])
    n = len(lead)
    # floor mode drops the rows and columns that fill no window
    if x.shape[-2] != oh * kh:
        x = prims.slice(x, n, 0, oh * kh)
    if x.shape[-1] != ow * kw:
        x = prims.slice(x, n + 1, 0, ow * kw)
    windows = reshape(x, [*lead, oh, kh, ow, kw])
    return prims.mul(prims.sum(windows, [n + 1, n + 3]), 1.0 / (divisor_override or kh * kw))


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad: Any, x: Any, kernel_size: Sequence[int], stride: Sequence[int],
                        padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> Any:  # fmt: skip
    (kh, kw), (oh, ow) = _tiles(x, kernel_size, stride, padding, ceil_mode)
    lead = list(x.shape[:-2])
    n = len(lead)
    scaled = prims.mul(grad, 1.0 / (divisor_override or kh * kw))
    spread = prims.broadcast_in_dim(scaled, [*lead, oh, kh, ow, kw],
                                    [*range(n), n, n + 2])  # fmt: skip
    out = reshape(spread, [*lead, oh * kh, ow * kw])
    missing = [x.shape[-1] - ow * kw, x.shape[-2] - oh * kh]  # the dropped rows get zeros
    if any(missing):
        out = constant_pad_nd(out, [0, missing[0], 0, missing[1]], 0.0)
    return out
