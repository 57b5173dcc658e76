"""Stage 3b, helpers: explicit type promotion, broadcasting and dims for decompositions.

Input IR -> output IR: these helpers take tensors or proxies (anything with ``.shape``/``.dtype``)
and Python numbers, and call prims to make promotion and broadcasting explicit. Example: ATen's
``add.Tensor(x_f32[32, 10], b_f32[10])`` decomposes to::

    b1 = prims.broadcast_in_dim(b, [32, 10], [1]);  out = prims.add(x, b1)

and ``div.Tensor(i_int64[3], 2)`` to ``prims.div(prims.convert_element_type(i, float32), 2)``.
The dtypes follow ``torch.result_type``::

    >>> i32, i64 = torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int64)
    >>> result_type(i32, 2), result_type(i64, 2.5)
    (torch.int32, torch.float32)
    >>> elementwise_dtypes(i64, 2, kind=KIND.INT_TO_FLOAT)  # (computation, result), like sin
    (torch.float32, torch.float32)

NB: in PyTorch this lives in torch/_prims_common/__init__.py (``elementwise_dtypes``,
``ELEMENTWISE_TYPE_PROMOTION_KIND``) and torch/_refs/__init__.py (``_maybe_broadcast``,
``_make_elementwise_binary_reference``).
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, Callable, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.decomp_table import Unsupported
from toycomp.symbolic_shapes import is_symbolic  # noqa: F401 (the rules import it from here)
from toycomp.tensor_utils import python_number_dtype


class ELEMENTWISE_TYPE_PROMOTION_KIND(Enum):  # noqa: N801 (PyTorch's name)
    """How an op's result dtype follows from its promoted operand dtype."""

    DEFAULT = "default"  # the promoted dtype (add, mul, where...)
    INT_TO_FLOAT = "int_to_float"  # bool/int -> default float (sin, exp, true division...)
    ALWAYS_BOOL = "always_bool"  # comparisons compute in the promoted dtype, return bool
    BOOL_TO_LONG = "bool_to_long"  # pow: bool -> int64
    NO_OPMATH = "no_opmath"  # selections (where, clamp): compute in the result dtype itself


KIND = ELEMENTWISE_TYPE_PROMOTION_KIND


def is_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) or is_symbolic(x)


def number_dtype(x: Any) -> torch.dtype:
    """``python_number_dtype``, also for symbolic numbers (a SymInt is an int64 number)."""
    plain = {torch.SymBool: True, torch.SymInt: 1, torch.SymFloat: 1.0}.get(type(x), x)
    return python_number_dtype(plain)


def _category(dtype: torch.dtype) -> int:
    if dtype is torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 1


# [Note: type promotion]
# torch.result_type ranks operands in three tiers: tensors with dims, 0-d tensors, Python
# numbers. Within a tier dtypes promote normally (torch.promote_types). A lower tier only matters
# when it is of a higher *category* (bool < int < float < complex): then it decides the result -
# a 0-d tensor with its own dtype, a Python number with the default dtype of its category. So
# ``int32[3] + 2`` stays int32, ``f16[3] + 2.5`` stays float16, ``int64[3] + 2.5`` is float32.
def result_type(*args: Any) -> torch.dtype:
    """``torch.result_type`` for any number of tensors/proxies and Python numbers."""
    tiers: list[list[torch.dtype]] = [[], [], []]  # tensors with dims, 0-d tensors, numbers
    for a in args:
        if is_number(a):
            tiers[2].append(number_dtype(a))
        else:
            tiers[1 if a.ndim == 0 else 0].append(a.dtype)
    promoted = [functools.reduce(torch.promote_types, dtypes) for dtypes in tiers if dtypes]
    if not promoted:
        raise TypeError("result_type needs at least one operand")
    return max(promoted, key=_category)  # (of one category, the highest tier: max keeps the first)


# [Note: low precision computes in float32]
# ATen kernels compute float16/bfloat16 ops in float32 ("opmath") and round once when they store
# the result; torch._prims_common calls float32 the *computation dtype* of such ops. Computing
# ``mul(x_bf16, 0.1)`` in bfloat16 instead rounds 0.1 to bfloat16 first, and that extra rounding
# changes the last bit of about 1 result in 5. So ``elementwise`` converts low-precision operands
# to float32, applies the prim, and converts the result back (torch/_refs does the same with its
# ``elementwise_type_promotion_wrapper``); a chain of ops rounds between ops, exactly like eager.
# One wrinkle: a Python number operand. ATen's CPU kernels for mul and div keep it in float32,
# but add, sub, pow and the comparisons read it after TensorIterator cast it to the tensor's
# dtype (measured on torch 2.13; CUDA kernels keep full precision more often). Decompositions of
# those ops pass ``round_numbers=True``, which rounds the number in Python, at trace time.
def get_computation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16/bfloat16 compute in float32 (``torch._prims_common.get_computation_dtype``)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def elementwise_dtypes(*args: Any, kind: KIND = KIND.DEFAULT) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) of an elementwise op, as in torch._prims_common."""
    if any(isinstance(a, complex) or (not is_number(a) and a.dtype.is_complex) for a in args):
        raise Unsupported("complex numbers (no prim computes on them)")  # an ATen fallback
    dtype = result_type(*args)
    if kind is KIND.INT_TO_FLOAT and not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if kind is KIND.BOOL_TO_LONG and dtype is torch.bool:
        dtype = torch.int64
    result = torch.bool if kind is KIND.ALWAYS_BOOL else dtype
    return (dtype if kind is KIND.NO_OPMATH else get_computation_dtype(dtype)), result


def round_number(value: Any, dtype: torch.dtype) -> Any:
    """A Python float as ``dtype`` holds it (``0.1`` -> ``0.10009765625`` in bfloat16)."""
    if not isinstance(value, float) or dtype not in (torch.float16, torch.bfloat16):
        return value
    return torch.tensor(value, dtype=dtype).item()


def upcast(*args: Any) -> tuple[Any, torch.dtype]:
    """Operands in the dtype that composite float ops compute in ("opmath", as ATen kernels do):
    float16/bfloat16 -> float32, bool/int -> the default float dtype.

    Returns the converted operand (or tuple of them) and the dtype the result should have.
    """
    dtype = args[0].dtype
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    computation = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    out = tuple(convert(a, computation) for a in args)
    return (out[0] if len(out) == 1 else out), dtype


def convert(a: Any, dtype: torch.dtype | None) -> Any:
    """``a`` as ``dtype`` (Python numbers and None pass through; prims adopt the tensor's dtype)."""
    if dtype is None or a is None or is_number(a) or a.dtype == dtype:
        return a
    return prims.convert_element_type(a, dtype)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcasting of ``shapes`` (right-aligned; size 1 stretches)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, start=ndim - len(shape)):
            if size != 1 and out[i] not in (1, size):
                raise ValueError(f"shapes {[list(s) for s in shapes]} do not broadcast")
            out[i] = size if size != 1 else out[i]
    return tuple(out)


# A tuple compares its items before its lengths, and with dynamic shapes comparing ``s0`` with
# ``10`` records a guard (``s0 != 10``) that would recompile the graph when a batch of 10 comes.
def same_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    """``tuple(a) == tuple(b)``, comparing no sizes when the ranks differ."""
    return len(a) == len(b) and tuple(a) == tuple(b)


def broadcast_to(a: Any, shape: Sequence[int]) -> Any:
    """``a`` broadcast to ``shape`` with ``broadcast_in_dim`` (numbers, None, exact fits pass)."""
    if a is None or is_number(a) or same_shape(a.shape, shape):
        return a
    offset = len(shape) - a.ndim
    if offset < 0 or broadcast_shapes(a.shape, shape) != tuple(shape):
        raise ValueError(f"cannot broadcast {list(a.shape)} to {list(shape)}")
    return prims.broadcast_in_dim(a, list(shape), list(range(offset, len(shape))))


def elementwise(
    fn: Callable[..., Any], *args: Any, kind: KIND = KIND.DEFAULT, round_numbers: bool = False
) -> Any:
    """Promote and broadcast ``args`` explicitly, apply ``fn`` (a prim) in the computation
    dtype, convert the result. ``round_numbers``: see [Note: low precision computes in float32].
    """
    computation, result = elementwise_dtypes(*args, kind=kind)
    shape = broadcast_shapes(*(a.shape for a in args if not is_number(a)))
    promoted = result_type(*args)
    operands = [round_number(a, promoted) if round_numbers and is_number(a) else a for a in args]
    operands = [broadcast_to(convert(a, computation), shape) for a in operands]
    return convert(fn(*operands), result)


def normalize_dim(dim: int, ndim: int) -> int:
    """A possibly negative ``dim`` as an index in ``range(ndim)`` (0-d tensors accept 0 and -1)."""
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise IndexError(f"dim {dim} out of range for a {ndim}-d tensor")
    return dim % size


def reduction_dims(a: Any, dims: Sequence[int] | int | None) -> list[int]:
    """Sorted non-negative reduced dims; ``None`` or ``[]`` means all dims (ATen's convention)."""
    if isinstance(dims, int):
        dims = [dims]
    if not dims:
        return list(range(a.ndim))
    return sorted({normalize_dim(d, a.ndim) for d in dims if a.ndim > 0})


def reshape(a: Any, shape: Sequence[int]) -> Any:
    """``prims.reshape`` unless ``a`` already has ``shape``."""
    return a if same_shape(a.shape, shape) else prims.reshape(a, list(shape))


def reduce(prim: Any, a: Any, dims: Sequence[int] | int | None, keepdim: bool) -> Any:
    """Apply a reduction prim, then put the reduced dims back as size 1 if ``keepdim``."""
    dims = reduction_dims(a, dims)
    out = prim(a, dims)
    if keepdim:
        out = reshape(out, [1 if d in dims else s for d, s in enumerate(a.shape)])
    return out


def expand_back(reduced: Any, shape: Sequence[int], dims: Sequence[int]) -> Any:
    """Broadcast a reduction result (``dims`` removed) back to the full ``shape``."""
    kept = [d for d in range(len(shape)) if d not in dims]
    return prims.broadcast_in_dim(reduced, list(shape), kept)


# [Note: the corrected two-pass moments]
# Normalising a row that holds one value v (an expanded input, a constant region of an image)
# divides x - mean by sqrt(var + eps), about sqrt(eps): one rounding in mean = sum / n, about
# |v| * 1e-7, comes out 300 times larger. A row of 1,000 values 17.1 came out of layer_norm as
# 3.6e-3 where eager returns exactly 0 (its moments are exact on a constant row). So the
# statistics that are subtracted again come from the corrected two-pass algorithm (Chan, Golub
# and LeVeque): with d = x - sum(x) / n, the mean is sum(x) / n + sum(d) / n (sum(d) / n is the
# first mean's rounding error) and the sum of squares M2 = sum(d * d) - sum(d)^2 / n. On a
# constant row d is one exact value (Sterbenz), so the mean comes out exactly v and M2 exactly 0;
# on any other row the correction is below the rounding of the result. sum(d) is one more sum in
# the loop that sums d * d, and x is read at the same index as before: fusion is unchanged.
def corrected_moments(x: Any, dims: Sequence[int], count: Any) -> tuple[Any, Any]:
    """``(mean, M2)`` of ``x`` over ``dims`` (``count`` elements), M2 the sum of squared
    deviations, as in [Note: the corrected two-pass moments]."""
    first = prims.div(prims.sum(x, dims), count)
    d = prims.sub(x, expand_back(first, x.shape, dims))
    sum_d = prims.sum(d, dims)
    m2 = prims.sub(prims.sum(prims.mul(d, d), dims), prims.div(prims.mul(sum_d, sum_d), count))
    return prims.add(first, prims.div(sum_d, count)), prims.maximum(m2, 0.0)
