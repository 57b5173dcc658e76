"""Functionalisation's helpers: which ATen ops write to what, and tensors as memory.

Input -> output: ATen ``OpOverload``s and real tensors -> facts that the recorder of
toycomp/aot/functionalize.py decides with: the arguments an op mutates and its out-of-place twin
(from the op's schema), and where a tensor lives in its storage (byte extents, layouts, aliasing).

    >>> x, y = torch.randn(4, 6), torch.randn(4, 6)
    >>> [name for name, _ in mutated_args(aten.add_.Tensor, (x, y), {})]
    ['self']
    >>> op, result_of_mutated, other_results = functional_variant(aten.add_.Tensor, ["self"])
    >>> str(op), result_of_mutated, other_results
    ('aten.add.Tensor', [0], [])
    >>> same_view(x[1], x.t()[:, 1]), same_view(x[0], x[:, 0])  # one piece of memory, one layout?
    (True, False)
    >>> covers(extent(x), extent(x[1]))  # x is a root for writes to x[1]
    True

NB: in PyTorch this lives in torch/_functorch/_aot_autograd/functional_utils.py
(``has_data_mutation``, ``gen_alias_from_base``...), torchgen's schema model
(``FunctionSchema.kind()``, ``SchemaKind.inplace``) and torch/_prims_common
(``is_non_overlapping_and_dense``, ``compute_required_storage_length``).
"""

from __future__ import annotations

from typing import Any

import torch

from toycomp._torch_compat import schema_of, storage_identity

__all__ = [
    "AS_STRIDED_OPS",
    "BATCH_NORM_OPS",
    "DATA_DEPENDENT_OPS",
    "FUNCTIONAL_OVERRIDES",
    "UNSUPPORTED_MUTATIONS",
    "bind_arguments",
    "copy_like",
    "covers",
    "extent",
    "functional_variant",
    "geometry",
    "is_dense",
    "mutated_args",
    "non_overlapping",
    "overlaps",
    "same_view",
    "span",
    "storage_key",
]

aten = torch.ops.aten


# -- which ATen ops write to what ----------------------------------------------------------------
def _ops(*names: str) -> set:
    """The ATen overloads named ``packet.overload`` that exist in this PyTorch build."""
    found = set()
    for name in names:
        packet, overload = name.split(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            found.add(op)
    return found


# Results that depend on tensor *values*: tracing them on one example would bake it in.
DATA_DEPENDENT_OPS = _ops(
    "_local_scalar_dense.default", "nonzero.default", "masked_select.default",
    "_unique2.default", "unique_dim.default", "unique_consecutive.default",
    "repeat_interleave.Tensor", "bincount.default",
)  # fmt: skip
UNSUPPORTED_MUTATIONS = _ops(
    "set_.source_Tensor", "set_.source_Storage", "set_.source_Storage_storage_offset",
    "resize_.default", "resize_as_.default", "cudnn_batch_norm.default",
    "miopen_batch_norm.default",
)  # fmt: skip
# Functional versions that are not "drop the trailing underscore".
FUNCTIONAL_OVERRIDES = dict(zip(_ops("normal_.default"), _ops("normal_functional.default")))
# [Note: batch norm's hidden mutation]
# native_batch_norm updates running_mean/running_var in place, but its schema does not say so
# (no `Tensor(a!)`). We rewrite it, in training mode, to _native_batch_norm_legit_functional,
# whose outputs 3 and 4 are the new running statistics (that is what PyTorch does too).
BATCH_NORM_OPS = _ops("native_batch_norm.default", "_native_batch_norm_legit.default")
# Views that read memory rather than values: [Note: as_strided reads memory].
AS_STRIDED_OPS = _ops("as_strided.default", "as_strided_.default")


def bind_arguments(func, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Argument name -> value for a call of the ATen op ``func`` (defaults not filled in)."""
    return {a.name: v for a, v in zip(schema_of(func).arguments, args)} | kwargs


def mutated_args(func, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """(argument name, tensor) for every tensor that ``func`` writes to, in schema order."""
    if func in BATCH_NORM_OPS:  # [Note: batch norm's hidden mutation]
        return _batch_norm_mutations(func, bind_arguments(func, args, kwargs))
    names = [a.name for a in schema_of(func).arguments if a.is_write]
    return _written_tensors(func, names, bind_arguments(func, args, kwargs)) if names else []


def _batch_norm_mutations(func, bound: dict) -> list[tuple[str, torch.Tensor]]:
    """The running statistics, which batch norm updates when training."""
    names = ["running_mean", "running_var"] if bound.get("training", False) else []
    return _written_tensors(func, names, bound)


def _written_tensors(func, names: list[str], bound: dict) -> list[tuple[str, torch.Tensor]]:
    """The tensors bound to ``names``, refusing mutations that toycomp cannot functionalise."""
    mutated = [(n, bound[n]) for n in names if bound.get(n) is not None]
    if mutated and func in UNSUPPORTED_MUTATIONS:
        raise NotImplementedError(f"toycomp.aot: {func} (in-place) is not supported")
    for name, value in mutated:
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"toycomp.aot: {func} mutates a list of tensors ({name})")
    return mutated


def functional_variant(func, mutated: list[str]) -> tuple[Any, list[int], list[int]]:
    """The out-of-place twin of ``func``.

    Returns ``(functional_op, result index per mutated arg, result index per op output that is
    not a mutated arg)``.
    """
    if func in BATCH_NORM_OPS:
        return aten._native_batch_norm_legit_functional.default, [3, 4], [0, 1, 2]
    arguments = schema_of(func).arguments
    outs = [a.name for a in arguments if a.is_out]
    if func in FUNCTIONAL_OVERRIDES:
        return FUNCTIONAL_OVERRIDES[func], [0], []
    name = func.overloadpacket.__name__
    base = name[:-1] if name.endswith("_") and not outs else name
    packet = getattr(aten, base, None)
    want = [(a.name, a.type) for a in arguments if a.name not in outs]
    for overload in packet.overloads() if packet is not None else []:
        candidate = schema_of(getattr(packet, overload))
        args = [(a.name, a.type) for a in candidate.arguments]
        if not candidate.is_mutable and args == want:
            return getattr(packet, overload), list(range(len(mutated))), []
    raise NotImplementedError(f"toycomp.aot: no out-of-place version of {func} to functionalise")


# -- memory and layout --------------------------------------------------------------------------
def copy_like(t: torch.Tensor, like: torch.Tensor | tuple) -> torch.Tensor:
    """A copy of ``t`` with ``like``'s (a tensor's, or (shape, strides)) layout, if possible."""
    shape, stride = (like.shape, like.stride()) if isinstance(like, torch.Tensor) else like
    try:
        return torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t.detach())
    except RuntimeError:  # e.g. expanded (stride 0) layouts cannot be written to
        return t.detach().clone(memory_format=torch.contiguous_format)


def storage_key(t: torch.Tensor) -> tuple | None:
    """Equal for tensors sharing a storage; None for a size or an empty storage (shares none)."""
    storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
    if storage is None or storage.nbytes() == 0:
        return None
    if storage.device.type == "meta":  # fake and meta tensors: no data pointer to compare
        return (t.device, "meta", storage_identity(storage))
    return (t.device, storage.data_ptr())


def extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte range [lo, hi) of its storage that ``t`` may touch."""
    size = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return t.storage_offset() * size, (t.storage_offset() + last + 1) * size


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, strides, storage offset and dtype (e.g. ``x`` and ``x.detach()``)."""
    return (a.shape, a.stride(), a.storage_offset(), a.dtype) == (
        b.shape,
        b.stride(),
        b.storage_offset(),
        b.dtype,
    )


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: its elements fill a contiguous block of memory."""
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def geometry(t: torch.Tensor, root: torch.Tensor) -> tuple[list[int], list[int], int]:
    """(size, stride, storage offset relative to ``root``) of the view ``t``."""
    return list(t.shape), list(t.stride()), t.storage_offset() - root.storage_offset()


def non_overlapping(t: torch.Tensor) -> bool:
    """No two elements of ``t`` share memory (gaps allowed, unlike ``is_dense``)."""
    end = 0  # the furthest element reachable with the smaller strides
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if stride <= end:
            return False
        end += stride * (size - 1)
    return True


def span(size: list[int], stride: list[int], offset: int, itemsize: int) -> tuple | None:
    """The byte range [lo, hi) that ``as_strided(size, stride, offset)`` reads (None: nothing)."""
    if 0 in size:
        return None
    last = sum((n - 1) * s for n, s in zip(size, stride))
    return offset * itemsize, (offset + last + 1) * itemsize


def covers(outer: tuple[int, int], inner: tuple[int, int]) -> bool:
    """Does the byte range ``outer`` contain ``inner``?"""
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def overlaps(region: tuple[int, int], lo: int, hi: int) -> bool:
    """Does the byte range ``region`` meet [lo, hi)?"""
    return region[0] < hi and lo < region[1]
