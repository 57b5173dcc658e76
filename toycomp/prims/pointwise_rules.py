"""Stage 3b, the table (pointwise ops): one decomposition per ATen op, in prims.

Input IR -> output IR: each function takes the ATen op's arguments (``Proxy`` objects while
``toycomp.prims.decompositions.decompose`` traces it, or real tensors when called eagerly - prims
run their references then) and returns what the ATen op returns, computed with prims plus Python
arithmetic on sizes. Example::

    @register(aten.clamp.default)
    def clamp(a, min=None, max=None): ...   # -> maximum, minimum prims

Broadcasting and type promotion are explicit here (``elementwise``, ``broadcast_to``,
``convert``), because prims take same-shape same-dtype operands; those helpers live in
``helpers.py``. This module holds the pointwise ops; the activations with their backwards are
in ``activation_rules.py``, reductions, softmax, losses, matmuls and normalization in
``nn_rules.py``, views, creation and copies in ``view_rules.py``. All register into
``decomp_table.DECOMPOSITIONS``, and ``decompositions.py`` imports them.

NB: in PyTorch this lives in torch/_decomp/decompositions.py and torch/_refs/__init__.py (e.g.
``_refs.nn.functional.gelu``); ``torch._prims_common`` holds the type-promotion helpers.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import torch

import toycomp.prims as prims
from toycomp.prims.helpers import (
    ELEMENTWISE_TYPE_PROMOTION_KIND as KIND,
    broadcast_shapes,
    broadcast_to,
    convert,
    elementwise,
    elementwise_dtypes,
    is_number,
    round_number,
)
from toycomp.prims.decomp_table import Unsupported, register

aten = torch.ops.aten


# --- pointwise --------------------------------------------------------------------------------
# Ops whose ATen CPU kernels round a Python number to the tensor's dtype first (see
# [Note: low precision computes in float32] in helpers.py); mul and div do not.
_ROUNDS_NUMBERS = {"maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"}


def _pointwise(prim: Any, kind: KIND, *ops: Any) -> Any:
    """Register, for the ATen ``ops``, the decomposition that is one prim: promote and broadcast
    the operands explicitly (``elementwise``), apply ``prim``, convert to the result dtype."""
    round_numbers = prim.__name__ in _ROUNDS_NUMBERS

    def decomp(*args: Any) -> Any:
        return elementwise(prim, *args, kind=kind, round_numbers=round_numbers)

    decomp.__name__ = decomp.__qualname__ = prim.__name__
    return register(*ops)(decomp)


neg = _pointwise(prims.neg, KIND.DEFAULT, aten.neg.default)
abs = _pointwise(prims.abs, KIND.DEFAULT, aten.abs.default)  # noqa: A001 (ATen's name)
floor = _pointwise(prims.floor, KIND.DEFAULT, aten.floor.default)
sign = _pointwise(prims.sign, KIND.DEFAULT, aten.sign.default)


@register(aten.sgn.default)
def sgn(a: Any) -> Any:
    """``abs``'s backward is ``grad * sgn(x)``: for real numbers ``sgn`` is ``sign``
    (complex ones, ``x / |x|``, toycomp does not compute)."""
    if a.dtype.is_complex:
        raise Unsupported("sgn of a complex tensor")
    return sign(a)


exp = _pointwise(prims.exp, KIND.INT_TO_FLOAT, aten.exp.default)
log = _pointwise(prims.log, KIND.INT_TO_FLOAT, aten.log.default)
log1p = _pointwise(prims.log1p, KIND.INT_TO_FLOAT, aten.log1p.default)
sqrt = _pointwise(prims.sqrt, KIND.INT_TO_FLOAT, aten.sqrt.default)
rsqrt = _pointwise(prims.rsqrt, KIND.INT_TO_FLOAT, aten.rsqrt.default)
reciprocal = _pointwise(prims.reciprocal, KIND.INT_TO_FLOAT, aten.reciprocal.default)
sin = _pointwise(prims.sin, KIND.INT_TO_FLOAT, aten.sin.default)
cos = _pointwise(prims.cos, KIND.INT_TO_FLOAT, aten.cos.default)
tanh = _pointwise(prims.tanh, KIND.INT_TO_FLOAT, aten.tanh.default)
erf = _pointwise(prims.erf, KIND.INT_TO_FLOAT, aten.erf.default)

mul = _pointwise(prims.mul, KIND.DEFAULT, aten.mul.Tensor, aten.mul.Scalar)
div = _pointwise(prims.div, KIND.INT_TO_FLOAT, aten.div.Tensor, aten.div.Scalar)
maximum = _pointwise(prims.maximum, KIND.DEFAULT, aten.maximum.default)
minimum = _pointwise(prims.minimum, KIND.DEFAULT, aten.minimum.default)
eq = _pointwise(prims.eq, KIND.ALWAYS_BOOL, aten.eq.Tensor, aten.eq.Scalar)
ne = _pointwise(prims.ne, KIND.ALWAYS_BOOL, aten.ne.Tensor, aten.ne.Scalar)
lt = _pointwise(prims.lt, KIND.ALWAYS_BOOL, aten.lt.Tensor, aten.lt.Scalar)
le = _pointwise(prims.le, KIND.ALWAYS_BOOL, aten.le.Tensor, aten.le.Scalar)
gt = _pointwise(prims.gt, KIND.ALWAYS_BOOL, aten.gt.Tensor, aten.gt.Scalar)
ge = _pointwise(prims.ge, KIND.ALWAYS_BOOL, aten.ge.Tensor, aten.ge.Scalar)


def _add_or_sub(prim: Any, a: Any, b: Any, alpha: Any) -> Any:
    """``a + alpha * b`` (or ``-``), computed in one go: rounded once, like ATen's kernel."""
    if alpha == 1 or is_number(b):
        b = b * alpha if is_number(b) else b
        return elementwise(prim, a, b, round_numbers=True)
    return elementwise(lambda x, y: prim(x, prims.mul(y, alpha)), a, b, round_numbers=True)


@register(aten.add.Tensor, aten.add.Scalar)
def add(a: Any, b: Any, alpha: Any = 1) -> Any:
    return _add_or_sub(prims.add, a, b, alpha)


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return _add_or_sub(prims.sub, a, b, alpha)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a: Any, b: Any, alpha: Any = 1) -> Any:
    return sub(b, a, alpha)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    if rounding_mode is None:
        return elementwise(prims.div, a, b, kind=KIND.INT_TO_FLOAT)
    computation, _ = elementwise_dtypes(a, b)
    if rounding_mode != "trunc" or not computation.is_floating_point:
        raise Unsupported(f"div with rounding_mode={rounding_mode!r} on {computation}")
    return elementwise(lambda x, y: trunc(prims.div(x, y)), a, b)  # like ATen: trunc(a / b)


@register(aten.isnan.default)
def isnan(a: Any) -> Any:  # NaN is the one value unequal to itself (no -ffast-math: cache.py)
    if not a.dtype.is_floating_point:
        return prims.full(list(a.shape), False, torch.bool, a.device)
    return prims.ne(a, a)


@register(aten.xlogy.Tensor)
def xlogy(a: Any, b: Any) -> Any:
    """``x * log(y)``, 0 where x == 0 (a KL divergence's 0 log 0), NaN where y is, as ATen."""

    def formula(x: Any, y: Any) -> Any:
        out = prims.where(prims.eq(x, 0), 0.0, prims.mul(x, prims.log(y)))
        return prims.where(prims.ne(y, y), y, out)  # y NaN

    return elementwise(formula, a, b, kind=KIND.INT_TO_FLOAT)


@register(aten.trunc.default)
def trunc(a: Any) -> Any:
    if not a.dtype.is_floating_point:
        return a
    return prims.where(prims.lt(a, 0), prims.neg(prims.floor(prims.neg(a))), prims.floor(a))


@register(aten.ceil.default)
def ceil(a: Any) -> Any:
    return prims.neg(prims.floor(prims.neg(a))) if a.dtype.is_floating_point else a


@register(aten.logical_not.default)
def logical_not(a: Any) -> Any:
    return prims.logical_not(convert(a, torch.bool))


@register(aten.logical_and.default)
def logical_and(a: Any, b: Any) -> Any:
    shape = broadcast_shapes(a.shape, b.shape)
    a, b = (broadcast_to(convert(t, torch.bool), shape) for t in (a, b))
    return prims.logical_and(a, b)


@register(aten.logical_or.default)
def logical_or(a: Any, b: Any) -> Any:
    return prims.logical_not(logical_and(logical_not(a), logical_not(b)))


@register(aten.bitwise_and.Tensor)
def bitwise_and(a: Any, b: Any) -> Any:
    """On bools (masks: xlogy's backward ands two) the logical op; no prim has integer bits."""
    if is_number(a) or is_number(b) or a.dtype != torch.bool or b.dtype != torch.bool:
        raise Unsupported("bitwise_and of integers (only of bools)")
    return logical_and(a, b)


@register(aten.bitwise_not.default)
def bitwise_not(a: Any) -> Any:
    """On bools ``~mask``; on signed integers ``-1 - a`` (two's complement: the same bits)."""
    if a.dtype == torch.bool:
        return prims.logical_not(a)
    if a.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64):
        raise Unsupported(f"bitwise_not of {a.dtype}")
    return prims.sub(-1, a)  # (no step overflows: -1 - min is max)


@register(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(a: Any, exponent: Any) -> Any:
    computation, result = elementwise_dtypes(a, exponent, kind=KIND.BOOL_TO_LONG)
    if not result.is_floating_point and not result.is_complex and exponent < 0:
        raise Unsupported("pow of integers by a negative integer")  # eager's error, at run time
    a, exponent = convert(a, computation), round_number(exponent, result)
    if exponent == 1:
        out = a
    elif exponent == 2:  # like Inductor: small integer powers become multiplications
        out = prims.mul(a, a)
    elif exponent == 0:
        out = prims.full(a.shape, 1, computation, a.device)
    else:
        out = prims.pow(a, exponent)
    return convert(out, result)


@register(aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_tensor(a: Any, b: Any) -> Any:
    return elementwise(prims.pow, a, b, kind=KIND.BOOL_TO_LONG, round_numbers=True)


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(cond: Any, a: Any, b: Any) -> Any:
    computation, _ = elementwise_dtypes(a, b, kind=KIND.NO_OPMATH)  # a selection: no rounding
    shapes = [t.shape for t in (cond, a, b) if not is_number(t)]
    shape = broadcast_shapes(*shapes)
    a, b = (broadcast_to(convert(t, computation), shape) for t in (a, b))
    cond = broadcast_to(convert(cond, torch.bool), shape)
    if is_number(a) and is_number(b):
        a = prims.full(shape, a, computation, cond.device)
    return prims.where(cond, a, b)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(a: Any, mask: Any, value: Any) -> Any:
    if is_number(value) and isinstance(value, float) and not a.dtype.is_floating_point:
        raise Unsupported(f"masked_fill of a {a.dtype} tensor with float {value}")
    # Out of place, eager broadcasts self and mask together: a (5,) self with a (5, 5) mask
    # gives a (5, 5) result. The value is a number or a 0-d tensor.
    shape = broadcast_shapes(a.shape, mask.shape)
    value = value if is_number(value) else broadcast_to(convert(value, a.dtype), shape)
    return prims.where(broadcast_to(mask, shape), value, broadcast_to(a, shape))


# Eager's clamp with a single Python-number NaN bound changed between releases (torch 2.11's CPU
# kernel ignores the bound, torch 2.13's returns NaN): ask the installed PyTorch once.
_EAGER_CLAMP_KEEPS_NAN_SCALAR = bool(torch.clamp(torch.ones(1), min=math.nan).isnan())


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(a: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 (ATen's names)
    if not _EAGER_CLAMP_KEEPS_NAN_SCALAR and (min is None) != (max is None):
        min, max = (None if is_number(v) and math.isnan(v) else v for v in (min, max))
    bounds = [v for v in (min, max) if v is not None]
    computation, _ = elementwise_dtypes(a, *bounds, kind=KIND.NO_OPMATH)
    shape = broadcast_shapes(*(v.shape for v in (a, *bounds) if not is_number(v)))
    out, min, max = (broadcast_to(convert(v, computation), shape) for v in (a, min, max))
    # The bound first: on a tie (-0.0 vs 0.0) the prim returns its second argument, x, as
    # eager's clamp does; a NaN x or bound still wins (see [Note: maximum, minimum, NaN and
    # signed zero] in prims/__init__.py).
    if min is not None:
        out = prims.maximum(min, out)
    if max is not None:
        out = prims.minimum(max, out)
    return out


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(a: Any, min: Any) -> Any:  # noqa: A002
    return clamp(a, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(a: Any, max: Any) -> Any:  # noqa: A002
    return clamp(a, None, max)


@register(aten.hardtanh.default)
def hardtanh(a: Any, min_val: Any = -1.0, max_val: Any = 1.0) -> Any:
    if not a.dtype.is_floating_point:  # eager keeps the dtype: the limits truncate to integers
        if a.dtype == torch.uint8 and min(min_val, max_val) < 0:
            raise Unsupported("hardtanh of an unsigned tensor with negative limits")  # eager's
        min_val, max_val = int(min_val), int(max_val)
    return clamp(a, min_val, max_val)


# [Note: round half to even, from floor]
# ATen's round is C's nearbyint: ties go to the even neighbour (round(2.5) == 2.0), zero keeps
# its sign (round(-0.3) == -0.0). With f = floor(x), d = x - f is exact: the result is f + 1
# above the tie, f below it, and at the tie f + 1 where f is odd. Big floats have d == 0; inf
# and NaN give d = NaN and f. A zero takes x's sign from x * 0. With decimals, ATen's kernel
# scales in the computation dtype and rounds once: nearbyint(x * 10**d) / 10**d (d > 0).
def _round_half_even(x: Any) -> Any:
    f = prims.floor(x)
    d, up = prims.sub(x, f), prims.add(f, 1.0)
    odd = prims.ne(prims.sub(f, prims.mul(prims.floor(prims.mul(f, 0.5)), 2.0)), 0.0)
    r = prims.where(prims.gt(d, 0.5), up, prims.where(prims.lt(d, 0.5), f,
                                                       prims.where(odd, up, f)))  # fmt: skip
    return prims.where(prims.eq(r, 0.0), prims.mul(x, 0.0), r)


@register(aten.round.default, aten.round.decimals)
def round(a: Any, decimals: int = 0) -> Any:  # noqa: A001 (ATen's name)
    if not a.dtype.is_floating_point:
        if decimals == 0:
            return a  # integers round to themselves, as eager's
        raise Unsupported(f"round with decimals of a {a.dtype} tensor")  # eager raises too
    s = float(10 ** builtins.abs(decimals))
    if decimals >= 0:
        return elementwise(lambda x: prims.div(_round_half_even(prims.mul(x, s)), s), a)
    return elementwise(lambda x: prims.mul(_round_half_even(prims.div(x, s)), s), a)
