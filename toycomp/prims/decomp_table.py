"""Stage 3b, the registry: ``DECOMPOSITIONS``, ``register``, ``Unsupported`` and ``EXTERN_OPS``.

Input -> output: nothing runs here. The rule modules (``pointwise_rules.py``,
``activation_rules.py``, ``nn_rules.py``, ``view_rules.py``...) fill ``DECOMPOSITIONS`` (ATen
overload -> a Python function written with prims) with ``@register(aten.gelu.default)``, and
``decompositions.decompose`` reads it. A leaf module, so that the rules and the pass import it
rather than each other::

    >>> import torch
    >>> import toycomp.prims.decompositions  # the pass imports the rule modules, which fill it
    >>> DECOMPOSITIONS[torch.ops.aten.gelu.default].__module__
    'toycomp.prims.activation_rules'
    >>> sorted(str(op) for op in EXTERN_OPS - SDPA_OPS - CHECK_OPS)
    ['aten.bmm.default', 'aten.convolution.default', 'aten.convolution_backward.default', 'aten.mm.default']
    >>> str(aten._scaled_dot_product_flash_attention_for_cpu.default) in map(str, SDPA_OPS)
    True

NB: in PyTorch this lives in torch/_decomp/__init__.py (``global_decomposition_table``,
``register_decomposition``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from toycomp._torch_compat import assert_async

aten = torch.ops.aten

# [Note: extern ops]
# Matmul-like ops are not prims: a library kernel beats a generated loop, so they stay ATen calls
# that inductor runs as extern kernels (``ir.ExternKernel`` with ``fallback=False``). This is the
# one list of them: ``decompose`` keeps them as they are, ``lowering`` calls them, and any other
# ATen op left in a graph is a visible fallback. ``addmm`` and ``baddbmm`` are not in it: their
# decompositions call ``mm`` / ``bmm`` and leave the bias and the scaling to prims that fuse.
#
# [Note: attention kernels are externs]
# ``F.scaled_dot_product_attention`` reaches AOT's graphs as the fused kernel PyTorch picks for
# the device and dtype (flash attention on the CPU, memory-efficient attention for float32 on
# CUDA...), forward and backward, each returning the output and the statistics the backward
# needs. Like matmuls they are library kernels, which Inductor also calls as they are
# (``make_fallback`` in torch/_inductor/lowering.py); an attention written out with matmul,
# masked_fill and softmax is decomposed and fused instead (notebook 05 shows both).
_SDPA_KERNELS = (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
)  # fmt: skip
SDPA_OPS: frozenset[Any] = frozenset(
    getattr(aten, name + suffix).default
    for name in _SDPA_KERNELS
    for suffix in ("", "_backward")
    if hasattr(aten, name + suffix)
)


# [Note: checks that raise as eager does]
# A decomposition can lose an error eager raises: embedding written as a one-hot reduction
# returns zeros for an index out of range, where eager raises IndexError; nll_loss's one-hot pick
# a loss of 0 for a target out of range; and one_hot's own decomposition (ATen's, on fake
# tensors) skips its range check, so the capture calls check_one_hot before it. Such checks are small
# custom ops (torch.library, a stable API) that the decomposition calls as externs: the check
# runs in the compiled code and raises eager's error; the value passes through.
# On a GPU, eager checks on the device (a failed index is a "device-side assert" reported at
# the next synchronisation): reading the verdict back to the host would stall every step until
# the GPU caught up, so the check there is an asynchronous assert too.
# The wrapper calls the functions themselves (CHECK_FUNCTIONS), not through the dispatcher:
# 11 us less a call on the CPU, on the course MLP's step of about 300 us.
def check_indices(indices: torch.Tensor, size: int) -> torch.Tensor:
    """A copy of ``indices`` once each is known to lie in ``[0, size)`` (else IndexError)."""
    if indices.is_cuda:
        assert_async(((indices >= 0) & (indices < size)).all(), "index out of range in self")
    elif not _within(indices, size):
        raise IndexError("index out of range in self")
    return indices.clone()  # a custom op may not return its input itself


def check_bounds(indices: torch.Tensor, low: int, high: int, dim: int,
                 runtime_error: bool) -> torch.Tensor:  # fmt: skip
    """A copy of ``indices`` once each lies in ``[low, high)``, else the error of eager's index
    ops, ``index 6 is out of bounds for dimension 0 with size 6``: an IndexError from advanced
    indexing (``a[idx]``, index_put), a RuntimeError from gather, scatter and index_add."""
    if indices.is_cuda:
        assert_async(((indices >= low) & (indices < high)).all(), "index out of bounds")
    elif indices.numel() and not _within(indices - low, high - low):
        bad = indices[(indices < low) | (indices >= high)].flatten()[0].item()
        error = RuntimeError if runtime_error else IndexError
        raise error(f"index {bad} is out of bounds for dimension {dim} with size {high}")
    return indices.clone()


def check_targets(target: torch.Tensor, classes: int, ignore_index: int) -> torch.Tensor:
    """A copy of ``target`` once each is ``ignore_index`` or a class in ``[0, classes)`` (else
    nll_loss's IndexError)."""
    if target.is_cuda:
        bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
        assert_async(~bad.any(), "Target out of bounds (nll_loss)")
    elif not _within(target, classes):
        bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
        if bool(bad.any()):
            raise IndexError(f"Target {target[bad].flatten()[0].item()} is out of bounds.")
    return target.clone()


def check_one_hot(classes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """A copy of ``classes`` once each lies in ``[0, num_classes)`` (else one_hot's error)."""
    if classes.is_cuda:
        assert_async(((classes >= 0) & (classes < num_classes)).all(), "one_hot: Class values "
                     "must be non-negative and smaller than num_classes.")  # fmt: skip
    elif not _within(classes, num_classes):
        if bool((classes < 0).any()):
            raise RuntimeError("Class values must be non-negative.")
        raise RuntimeError("Class values must be smaller than num_classes.")
    return classes.clone()


def _within(t: torch.Tensor, size: int) -> bool:
    """Every element of ``t`` (on the CPU) lies in ``[0, size)``: one pass, two scalars."""
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return low.item() >= 0 and high.item() < size


CHECK_FUNCTIONS = {
    fn.__name__: fn for fn in (check_indices, check_bounds, check_targets, check_one_hot)
}
for _name, _fn in CHECK_FUNCTIONS.items():  # torch.ops.toycomp.<name>, with a fake: empty_like
    torch.library.custom_op(f"toycomp::{_name}", _fn, mutates_args=()).register_fake(
        lambda t, *sizes: torch.empty_like(t))
CHECK_OPS: frozenset[Any] = frozenset(
    getattr(torch.ops.toycomp, name).default for name in CHECK_FUNCTIONS
)
EXTERN_OPS: frozenset[Any] = (
    frozenset({aten.mm.default, aten.bmm.default, aten.convolution.default,
               aten.convolution_backward.default})
    | SDPA_OPS
    | CHECK_OPS
)

# ATen overload -> decomposition (a function of the op's arguments that calls prims).
DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {}


class Unsupported(NotImplementedError):
    """Raised by a decomposition that meets a case it cannot express: the ATen op falls back."""


def register(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``@register(aten.sin.default, ...)`` adds ``fn`` to ``DECOMPOSITIONS``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            DECOMPOSITIONS[op] = fn
        return fn

    return wrap
