"""Triton spellings of toycomp's prims: the ``TRITON_OPS`` rule table and ``tl.*``-only helpers.

Input -> output: a prim name and its arguments' source text -> a Triton expression::

    >>> TRITON_OPS["sin"]("tmp0"), TRITON_OPS["tanh"]("tmp0"), TRITON_OPS["mul"]("tmp0", "tmp1")
    ('tl.sin(tmp0)', '_tanh(tmp0)', 'tmp0 * tmp1')

``tl`` has no ``tanh``, ``log1p`` or ``pow`` and Triton's CPU interpreter cannot run
``libdevice``, so those three are small ``@triton.jit`` helpers written with ``tl.*``
primitives, as are the bf16 <-> fp32 conversions (see [Note: fp16 and bf16 conversions]);
``triton.py`` pastes the ones a kernel uses into its module. Everything here exists
in Triton 3.6 and 3.9.

NB: in PyTorch this lives in torch/_inductor/codegen/triton.py (TritonOverrides) and
torch/_inductor/runtime/triton_helpers.py (maximum/minimum with NaN, libdevice wrappers).
"""

from __future__ import annotations

from typing import Callable

import torch

from toycomp.inductor import ir
from toycomp.inductor.codegen.common import LOW_PRECISION, infix_rules

TRITON_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}  # fmt: skip


def triton_type(dtype: torch.dtype) -> str:
    if dtype not in TRITON_TYPES:
        raise NotImplementedError(f"Triton backend: dtype {dtype} is not supported")
    return TRITON_TYPES[dtype]


# [Note: fp16 and bf16 conversions]
# Eager PyTorch converts anything to fp16/bf16 through fp32 (c10::Half and c10::BFloat16 are
# built from a float): fp64 -> fp32 -> bf16 rounds twice, and we must round the same way, so
# every narrowing goes through fp32 first. bf16 <-> fp32 is then written with integer ops on
# the bits (bf16 is the top half of an fp32), as c10::BFloat16 does it, rather than with
# `.to(tl.bfloat16)`: Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding to
# nearest even, flushes subnormals wrongly both ways and turns fp64/int -> bf16 into garbage
# bits (`astype(uint16)`). The bit version is exact on a GPU too, so one source serves both.
def triton_convert(value: str, dtype: torch.dtype, src: torch.dtype | None = None) -> str:
    """``convert_element_type`` of ``value`` (computed in ``src``; None: unknown) to ``dtype``:
    to bool is ``!= 0``; fp16/bf16 round (see the Note), then compute in fp32."""
    if dtype == torch.bool:
        return f"{value} != 0"
    if dtype in LOW_PRECISION:
        return triton_widen(triton_narrow(value, dtype, src), dtype)
    return f"{value}.to({triton_type(dtype)})"


def triton_narrow(value: str, dtype: torch.dtype, src: torch.dtype | None = None) -> str:
    """``value`` (computed in ``src``) as a tensor of storage dtype ``dtype``, rounded like eager
    (fp16/bf16 through fp32: see [Note: fp16 and bf16 conversions])."""
    if dtype not in LOW_PRECISION:
        return f"{value}.to({triton_type(dtype)})"
    if src != torch.float32:
        value = f"{value}.to(tl.float32)"
    if dtype == torch.bfloat16:
        return f"_fp32_to_bf16({value})"
    return f"{value}.to(tl.float16)"


def triton_widen(value: str, dtype: torch.dtype) -> str:
    """A loaded ``dtype`` value in its compute dtype: fp16/bf16 -> fp32 (exact), else as is."""
    if dtype == torch.bfloat16:
        return f"_bf16_to_fp32({value})"
    if dtype == torch.float16:
        return f"{value}.to(tl.float32)"
    return value


# [Note: maximum and NaN]
# torch.maximum / torch.amax propagate NaN; tl.maximum's default does not (on a GPU it is
# fmaxf). `where((a > b) | (a != a), a, b)` is NaN when either side is NaN, for every dtype, and
# b on a -0.0/0.0 tie, as C++'s max_propagate_nan (see [Note: maximum, minimum, NaN and signed
# zero] in toycomp/prims/__init__.py).
TRITON_OPS: dict[str, Callable[..., str]] = {
    **infix_rules(),  # add, sub, mul, div and the comparisons
    "neg": lambda a: f"-{a}",
    "abs": lambda a: f"tl.abs({a})",
    "exp": lambda a: f"tl.exp({a})",
    "log": lambda a: f"tl.log({a})",
    "log1p": lambda a: f"_log1p({a})",
    "sqrt": lambda a: f"tl.sqrt({a})",
    "rsqrt": lambda a: f"tl.rsqrt({a})",
    "reciprocal": lambda a: f"1.0 / {a}",
    "sin": lambda a: f"tl.sin({a})",
    "cos": lambda a: f"tl.cos({a})",
    "tanh": lambda a: f"_tanh({a})",
    "erf": lambda a: f"tl.erf({a})",
    "floor": lambda a: f"tl.floor({a})",
    "sign": lambda a: f"({a} > 0).to({a}.dtype) - ({a} < 0).to({a}.dtype)",  # sign(NaN) = 0
    "logical_not": lambda a: f"{a} == 0",
    "pow": lambda a, b: f"_pow({a}, {b})",
    "maximum": lambda a, b: f"tl.where(({a} > {b}) | ({a} != {a}), {a}, {b})",
    "minimum": lambda a, b: f"tl.where(({a} < {b}) | ({a} != {a}), {a}, {b})",
    "logical_and": lambda a, b: f"({a} != 0) & ({b} != 0)",
    "where": lambda c, a, b: f"tl.where({c}, {a}, {b})",
    "convert_element_type": triton_convert,
}

# name -> source of a @triton.jit helper (pasted into a kernel's module when used).
HELPERS = {
    "_tanh": '''@triton.jit
def _tanh(x):
    # (1 - e) / (1 + e) with e = exp(-2|x|) cannot overflow; a Taylor series near 0 keeps
    # the relative error small where 1 - e cancels.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = x * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0)))
    return tl.where(tl.abs(x) < 0.01, small, tl.where(x < 0, -t, t))
''',
    "_log1p": '''@triton.jit
def _log1p(x):
    # Kahan's trick: log(u) * x / (u - 1) with u = 1 + x corrects the rounding of 1 + x.
    u = x + 1.0
    d = tl.where(u == 1.0, 1.0, u - 1.0)
    y = tl.log(u) * (x / d)
    return tl.where(u == 1.0, x, tl.where(u == float("inf"), u, y))
''',
    "_fp32_to_bf16": '''@triton.jit
def _fp32_to_bf16(x):
    # Round to nearest even on the bits, as c10::BFloat16 does; every NaN becomes 0x7fc0.
    u = x.to(tl.uint32, bitcast=True)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = tl.where(x != x, 0x7FC0, rounded)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
''',
    "_bf16_to_fp32": '''@triton.jit
def _bf16_to_fp32(x):
    # A bf16 is the top half of an fp32: exact, subnormals included.
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
''',
    "_pow": '''@triton.jit
def _pow(a, b):
    # |a| ** b through exp2/log2, then C's pow rules for a < 0, b == 0 and a == 1.
    mag = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    neg = tl.where(b_odd, -mag, mag)
    neg = tl.where(b_int | (a == float("-inf")), neg, float("nan"))
    out = tl.where(a < 0, neg, mag)
    return tl.where((b == 0) | (a == 1), 1.0, out)
''',
    "_pow_int": '''@triton.jit
def _pow_int(a, b):
    # Integers: repeated squaring (ATen's powi), wrapping around on overflow as eager does.
    # A negative exponent: 1 ** b = 1, (-1) ** b = +-1, else 0.
    one = a * 0 + 1
    minus_one = 0 - one
    result = one
    base = a
    e = tl.where(b < 0, b * 0, b)
    for _ in tl.static_range(64):  # (enough bits for any integer exponent)
        result = tl.where((e & 1) == 1, result * base, result)
        base = base * base
        e = e >> 1
    flip = tl.where((b & 1) == 1, minus_one, one)
    small = tl.where(a == one, one, tl.where(a == minus_one, flip, one * 0))
    return tl.where(b < 0, small, result)
''',
}


# [Note: one reduction for a float max]
# tl.max ignores NaN (on a GPU it combines with fmaxf), while torch.amax returns NaN when a row
# holds one. Counting the NaNs in a second tl.max made each float max two block reductions,
# each a round trip through shared memory between the program's warps. One reduction suffices
# if it is over integers ordered like the floats: a float's bits read as a signed integer are
# ordered like the float for positive floats and reversed for negative ones, so flipping a
# negative float's magnitude bits (``key = bits ^ ((bits >> 31) & 0x7FFFFFFF)``, its own
# inverse) orders them all, -0.0 just below 0.0. A NaN gets the key that wins (the largest for
# a max, the smallest for a min), and the winning key turns back into the float. On the H100
# the softmax forward kernel (8192 x 4096) went from 95.4 to 94.9 us (Inductor's: 93.5-94.0).
# Inductor writes ``tl.reduce(x, 1, maximum)`` with a NaN-aware combine function instead, which
# Triton's interpreter runs one element at a time in Python: minutes for a small softmax.
def final_reduction(acc: str, t: str, kind: ir.ReductionType, dtype: torch.dtype) -> list[str]:
    """``acc = reduce(t, axis=1)`` as an [XBLOCK, 1] column; max/min propagate NaN like torch
    (one reduction over ordered integer keys: see [Note: one reduction for a float max])."""
    if kind == ir.ReductionType.SUM:
        return [f"{acc} = tl.sum({t}, 1)[:, None]"]
    fn = "tl.max" if kind == ir.ReductionType.MAX else "tl.min"
    if not dtype.is_floating_point:
        return [f"{acc} = {fn}({t}, 1)[:, None]"]
    bits = 64 if dtype == torch.float64 else 32
    itype, ftype, mask = f"tl.int{bits}", f"tl.float{bits}", hex(2 ** (bits - 1) - 1)
    nan_key = mask if kind == ir.ReductionType.MAX else str(-(2 ** (bits - 1)))
    key = f"{acc}_key"
    return [
        f"{key} = {t}.to({itype}, bitcast=True)",
        f"{key} = {key} ^ (({key} >> {bits - 1}) & {mask})  # ordered like the floats",
        f"{key} = tl.where({t} != {t}, {nan_key}, {key})  # a NaN wins",
        f"{key} = {fn}({key}, 1)[:, None]",
        f"{key} = {key} ^ (({key} >> {bits - 1}) & {mask})",
        f"{acc} = {key}.to({ftype}, bitcast=True)",
    ]
