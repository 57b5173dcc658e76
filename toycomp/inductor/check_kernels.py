"""Stage 4, run time on CUDA: the checks of [Note: checks that raise as eager does], one launch each.

Input -> output: an index tensor on a GPU and the range it must lie in -> a copy of it, written by
one Triton kernel that asserts on the device, as eager's own kernels do. The generated wrapper
calls these in place of ``prims.decomp_table``'s functions when it runs on CUDA; a wrapper on the
CPU never imports this module, nor Triton through it.

NB: in PyTorch, Inductor puts the same assert inside the kernel that does the indirect load
(``ops.check_bounds``, ``tl.device_assert`` in torch/_inductor/codegen/triton.py).
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from toycomp._triton_compat import LeanLauncher, raw_stream
from toycomp.prims import decomp_table

BLOCK = 1024
INDICES, TARGETS, ONE_HOT = 0, 1, 2  # which check: its message (a constant in the kernel)


# [Note: checks in one launch]
# Written with torch ops, a check on the GPU is a chain of small kernels: nll_loss's target check
# is (t < 0) | (t >= classes), & (t != ignore_index), any, ~, assert_async and a clone, eight
# launches of about 10-25 us of host time each, on a course MLP step of about 1 ms that the host
# bounds. Here it is one kernel that reads each value once, asserts, and writes the copy; debug=True
# is what makes Triton keep tl.device_assert in the compiled kernel (it drops them otherwise).
@triton.jit(debug=True)
def check_range_kernel(in_ptr, out_ptr, n, size, ignore_index, BLOCK: tl.constexpr,
                       CHECK: tl.constexpr, HAS_IGNORE: tl.constexpr):  # fmt: skip
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    value = tl.load(in_ptr + offsets, mask=mask, other=0)
    ok = (value >= 0) & (value < size)
    if HAS_IGNORE:
        ok = ok | (value == ignore_index)
    ok = ok | ~mask
    if CHECK == 0:
        tl.device_assert(ok, "index out of range in self")
    elif CHECK == 1:
        tl.device_assert(ok, "Target out of bounds (nll_loss)")
    else:
        tl.device_assert(ok, "one_hot: Class values must be non-negative and smaller than "
                         "num_classes.")  # fmt: skip
    tl.store(out_ptr + offsets, value, mask=mask)


_launchers: dict[int, LeanLauncher] = {}  # device index -> its launcher


def checked_copy(t: torch.Tensor, size: int, check: int, ignore_index: int | None) -> torch.Tensor:
    """A copy of the CUDA tensor ``t``, written by one launch of ``check_range_kernel``."""
    out = torch.empty_like(t)
    n = t.numel()
    index = t.device.index
    if index not in _launchers:
        _launchers[index] = LeanLauncher(check_range_kernel, t.device)
    _launchers[index].run(raw_stream(index), (triton.cdiv(n, BLOCK),), t, out, n, size,
                          0 if ignore_index is None else ignore_index, BLOCK=BLOCK, CHECK=check,
                          HAS_IGNORE=ignore_index is not None)  # fmt: skip
    return out


def _fits(t: torch.Tensor) -> bool:
    """One kernel over ``t``'s memory covers it: contiguous, not empty, 32-bit offsets."""
    return t.is_contiguous() and 0 < t.numel() < 2**31


def check_indices(indices: torch.Tensor, size: int) -> torch.Tensor:
    if not _fits(indices):
        return decomp_table.check_indices(indices, size)
    return checked_copy(indices, size, INDICES, None)


def check_bounds(indices: torch.Tensor, low: int, high: int, dim: int,
                 runtime_error: bool) -> torch.Tensor:  # fmt: skip
    if low != 0 or not _fits(indices):  # (negative indices allowed: the torch ops' check)
        return decomp_table.check_bounds(indices, low, high, dim, runtime_error)
    return checked_copy(indices, high, INDICES, None)


def check_targets(target: torch.Tensor, classes: int, ignore_index: int) -> torch.Tensor:
    if not _fits(target):
        return decomp_table.check_targets(target, classes, ignore_index)
    return checked_copy(target, classes, TARGETS, ignore_index)


def check_one_hot(classes: torch.Tensor, num_classes: int) -> torch.Tensor:
    if not _fits(classes):
        return decomp_table.check_one_hot(classes, num_classes)
    return checked_copy(classes, num_classes, ONE_HOT, None)


CUDA_CHECK_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    fn.__name__: fn for fn in (check_indices, check_bounds, check_targets, check_one_hot)
}
assert CUDA_CHECK_FUNCTIONS.keys() == decomp_table.CHECK_FUNCTIONS.keys()
