"""Stage 4, index arithmetic: where element ``(i0, i1, ...)`` of a buffer lives in memory.

Input -> output: loop variables (``i0, i1, ...`` of a buffer, ``r0, r1, ...`` of its reduced
dims, the flat ``x`` and ``r`` of a kernel) -> integer sympy expressions over them, simplified
with what the variables' ranges say. A view is a substitution of variables in such an index::

    >>> i0, i1 = index_vars("i", 2)
    >>> linear_index((i0, i1), contiguous_strides((8, 1000)))  # element (i0, i1) of 8 x 1000
    1000*i0 + i1
    >>> unflatten_index(x, (8, 1000))  # the same element, from its flat position x
    (FloorDiv(x, 1000), x - 1000*FloorDiv(x, 1000))
    >>> simplify_index(FloorDiv(1000*i0 + i1, 1000), {i0: 8, i1: 1000})
    i0
    >>> index_bounds(1000*i0 + i1, {i0: 8, i1: 1000})
    (0, 7999)

NB: in PyTorch this lives in torch/utils/_sympy/functions.py (FloorDiv, ModularIndexing),
torch/_inductor/sizevars.py (``SizeVarAllocator.simplify_with_ranges``) and
torch/utils/_sympy/value_ranges.py (``bound_sympy``).
"""

from __future__ import annotations

import sympy


class FloorDiv(sympy.Function):
    """``a // b`` for non-negative integers (printed as ``/`` in C++, ``//`` in Triton)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1:
            return base
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):  # (a // b) // c == a // (b * c)
            return FloorDiv(base.args[0], base.args[1] * divisor)
        return None


def modular(base: sympy.Expr, divisor: int) -> sympy.Expr:
    """``base % divisor`` written as ``base - divisor * (base // divisor)`` so that sympy cancels
    the ``10*(x//10) + x%10`` patterns that flattening and unflattening produce."""
    if divisor == 1:
        return sympy.Integer(0)
    return base - divisor * FloorDiv(base, divisor)


def index_vars(prefix: str, n: int) -> tuple[sympy.Symbol, ...]:
    """Loop variables ``i0, i1, ...``: integer and non-negative, which lets sympy simplify."""
    return tuple(sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True) for k in range(n))


# The two flat variables of a kernel (Triton's xindex and rindex).
x, r = sympy.symbols("x r", integer=True, nonnegative=True)


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, running = [], 1
    for n in reversed(size):
        strides.append(running)
        running *= n
    return tuple(reversed(strides))


def linear_index(
    idx: tuple[sympy.Expr, ...], stride: tuple[int, ...], offset: int = 0
) -> sympy.Expr:
    """``offset + sum(i * s)``: the memory position of element ``idx`` of a strided tensor."""
    return sympy.Integer(offset) + sympy.Add(*(i * s for i, s in zip(idx, stride)))


def unflatten_index(flat: sympy.Expr, size: tuple[int, ...]) -> tuple[sympy.Expr, ...]:
    """The per-dimension indices of row-major position ``flat`` in a tensor of ``size``."""
    idx, inner = [], 1
    outer = next((dim for dim, n in enumerate(size) if n != 1), None)
    for dim, n in reversed(list(enumerate(size))):
        if n == 1:
            idx.append(sympy.Integer(0))
        elif dim == outer:  # the outermost index needs no modulo: flat < numel already bounds it
            idx.append(FloorDiv(flat, inner))
        else:
            idx.append(modular(FloorDiv(flat, inner), n))
        inner *= n
    return tuple(reversed(idx))


def numel(size: tuple[int, ...]) -> int:
    total = 1
    for n in size:
        total *= n
    return total


def simplify_index(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Expand ``expr`` and drop the ``//`` (and so ``%``) terms that the variables' ranges make
    trivial: with ``0 <= i1 < 1000``, ``(1000*i0 + i1) // 1000`` becomes ``i0``.

    ``ranges`` maps a variable to its extent (``i1 -> 1000``); other symbols are left alone.
    """
    return sympy.expand(_simplify_floordiv(sympy.expand(expr), ranges))


def _simplify_floordiv(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    if not expr.args:
        return expr
    args = [_simplify_floordiv(a, ranges) for a in expr.args]
    if not isinstance(expr, FloorDiv) or not args[1].is_Integer or args[1] <= 0:
        return expr.func(*args)
    divisor = int(args[1])
    whole, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(args[0])):
        coeff, _ = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % divisor == 0:
            whole += term
        else:
            rest += term
    # (a*d + b) // d == a + b // d, and b // d == 0 if 0 <= b < d
    bounds = index_bounds(rest, ranges)
    if bounds is not None and bounds[0] >= 0 and bounds[1] < divisor:
        return sympy.expand(whole / divisor)
    return sympy.expand(whole / divisor) + FloorDiv(rest, divisor)


def index_bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> tuple[int, int] | None:
    """Smallest and largest value of ``expr`` when each variable ``v`` of ``ranges`` runs over
    ``range(ranges[v])``; None when unknown (another symbol, or a function other than FloorDiv
    by a positive constant). Used to simplify ``//`` and to choose 32- or 64-bit indices."""
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        return (0, ranges[expr] - 1) if expr in ranges else None
    parts = [index_bounds(a, ranges) for a in expr.args]
    if any(p is None for p in parts):
        return None
    if isinstance(expr, sympy.Add):
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(expr, sympy.Mul):
        lo, hi = 1, 1
        for a, b in parts:
            corners = (lo * a, lo * b, hi * a, hi * b)
            lo, hi = min(corners), max(corners)
        return lo, hi
    if isinstance(expr, FloorDiv) and parts[1][0] == parts[1][1] and parts[1][0] > 0:
        return parts[0][0] // parts[1][0], parts[0][1] // parts[1][0]
    return None
