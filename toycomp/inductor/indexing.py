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

With dynamic shapes, sizes are expressions over the size symbols ``s0, s1, ...`` (each a size
that is at least 2: sizes 0 and 1 are always specialised), and the same rules hold for every
value of them::

    >>> s0 = size_symbol(0)
    >>> simplify_index(FloorDiv(s0*i0 + i1, s0), {i0: 8, i1: s0})
    i0
    >>> index_bounds(s0*i0 + i1, {i0: 8, i1: s0})
    (0, 8*s0 - 1)

NB: in PyTorch this lives in torch/utils/_sympy/functions.py (FloorDiv, ModularIndexing),
torch/_inductor/sizevars.py (``SizeVarAllocator.simplify_with_ranges``) and
torch/utils/_sympy/value_ranges.py (``bound_sympy``).
"""

from __future__ import annotations

import functools
import math

import sympy


class FloorDiv(sympy.Function):
    """``a // b`` for non-negative integers (printed as ``/`` in C++, ``//`` in Triton)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1 or base == 0:
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


# [Note: size symbols]
# A dynamic size is a symbol ``s0, s1, ...`` (sizevars.py makes them from PyTorch's SymInts).
# It is integer and positive for sympy, and toycomp knows one more fact: it is at least 2,
# because sizes 0 and 1 are always specialised (they change broadcasting and strides). Every
# decision taken on symbolic sizes must hold for every such value: ``known_nonnegative`` proves
# ``e >= 0`` by writing each symbol as ``2 + t`` with ``t >= 0`` and checking that every term of
# the expanded polynomial is nonnegative (a sufficient test: it never proves a falsehood, and may
# fail to prove a truth, which then makes the caller take the cautious path: no fusion, a
# realized copy, 64-bit indices). Index variables (``i0``, ``x``, ``r``) are nonnegative.
SIZE_SYMBOL_MIN = 2


def size_symbol(k: int) -> sympy.Symbol:
    """The size symbol ``s<k>``."""
    return sympy.Symbol(f"s{k}", integer=True, positive=True)


def is_size_symbol(symbol: sympy.Basic) -> bool:
    return isinstance(symbol, sympy.Symbol) and symbol == size_symbol_named(symbol.name)


def size_symbol_named(name: str) -> sympy.Symbol | None:
    return size_symbol(int(name[1:])) if name[:1] == "s" and name[1:].isdigit() else None


def scalar_symbol(k: int) -> sympy.Symbol:
    """``f<k>``: a float computed from the sizes by the wrapper (``2.0 / (s0*s1 - 1)``, the
    scale of var's backward), a kernel argument like a size."""
    return sympy.Symbol(f"f{k}", real=True)


def is_scalar_symbol(symbol: sympy.Basic) -> bool:
    name = getattr(symbol, "name", "")
    return name[:1] == "f" and name[1:].isdigit() and symbol == scalar_symbol(int(name[1:]))


def size_symbols(*exprs) -> list[sympy.Symbol]:
    """The size symbols in ``exprs`` (``s2`` < ``s10``), then scalars ``f0``...: kernel args."""
    found: set[sympy.Symbol] = set()
    for e in exprs:
        if isinstance(e, (tuple, list)):
            found.update(size_symbols(*e))
        elif isinstance(e, sympy.Basic):
            found.update(v for v in e.free_symbols if is_size_symbol(v) or is_scalar_symbol(v))
    return sorted(found, key=lambda v: (v.name[0] == "f", int(v.name[1:])))


def is_static(value) -> bool:
    """An int, or a sympy expression without symbols."""
    return not isinstance(value, sympy.Basic) or not value.free_symbols


def known_nonnegative(expr) -> bool:
    """True when ``expr >= 0`` for all values of its variables (see [Note: size symbols])."""
    expr = sympy.sympify(expr)
    return bool(expr >= 0) if expr.is_number else _symbolic_nonnegative(expr)


def _symbolic_nonnegative(expr: sympy.Expr) -> bool:
    """Each size symbol written ``2 + t``: is every term of the expansion nonnegative?"""
    shift = {v: v + SIZE_SYMBOL_MIN for v in expr.free_symbols if is_size_symbol(v)}
    shifted = expr.xreplace(shift)
    floors = [e for e in sympy.preorder_traversal(shifted) if isinstance(e, FloorDiv)]
    shifted = shifted.xreplace({f: _floordiv_at_least(f) for f in floors})
    for term in sympy.Add.make_args(sympy.expand(shifted)):
        coeff, rest = term.as_coeff_Mul()
        if coeff < 0 or not all(_nonnegative_factor(f) for f in sympy.Mul.make_args(rest)):
            return False
    return True


def _floordiv_at_least(f: FloorDiv) -> sympy.Expr:
    """``base // d`` as ``(its smallest value) + t`` with ``t >= 0``, when ``base`` only grows
    with its (nonnegative) variables: ``(s + 2) // 2`` is ``1 + t``. Else ``f`` itself (>= 0)."""
    base, divisor = f.args
    base = sympy.expand(base)
    if not divisor.is_Integer or divisor <= 0 or base.has(FloorDiv):
        return f
    if not all(v.is_nonnegative for v in base.free_symbols):
        return f
    if any(c < 0 for c in sympy.Poly(base, *base.free_symbols).coeffs()):
        return f
    smallest = int(base.subs({v: 0 for v in base.free_symbols}))
    return smallest // int(divisor) + sympy.Dummy("t", integer=True, nonnegative=True)


def _nonnegative_factor(f: sympy.Expr) -> bool:
    if isinstance(f, sympy.Pow):
        return f.exp.is_Integer and f.exp > 0 and _nonnegative_factor(f.base)
    return bool(f.is_nonnegative) or isinstance(f, FloorDiv) or f.is_number and f >= 0


def known_equal(a, b) -> bool:
    """``a == b`` for every value of the symbols (ints or sympy expressions)."""
    if is_static(a) and is_static(b):
        return a == b
    return sympy.expand(sympy.sympify(a) - b) == 0


def known_less(a, b) -> bool:
    """``a < b`` for every value of the symbols."""
    if is_static(a) and is_static(b):
        return a < b
    return known_nonnegative(sympy.sympify(b) - a - 1)


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides: dim k steps over the sizes after it (multiplied innermost first)."""
    return tuple(math.prod(reversed(size[k + 1 :])) for k in range(len(size)))


def linear_index(idx: tuple, stride: tuple, offset: int = 0) -> sympy.Expr:
    """``offset + sum(i * s)``: the memory position of element ``idx`` of a strided tensor."""
    return sympy.sympify(offset) + sympy.Add(*(i * s for i, s in zip(idx, stride)))


def unflatten_index(flat: sympy.Expr, size: tuple[int, ...]) -> tuple[sympy.Expr, ...]:
    """The per-dimension indices of row-major position ``flat`` in a tensor of ``size``."""
    quotients = [FloorDiv(flat, stride) for stride in contiguous_strides(size)]  # % 1 is 0
    outer = next((d for d, n in enumerate(size) if n != 1), None)  # no %: flat < numel bounds it
    return tuple(q if d == outer else modular(q, size[d]) for d, q in enumerate(quotients))


def numel(size: tuple[int, ...]) -> int:
    """The product of ``size``: an int, or an expanded sympy expression (``4*s0``)."""
    total = math.prod(size)
    return total if is_static(total) else sympy.expand(total)


# [Note: substituting indices]
# Views and fusion move a body by substituting loop variables in each index, then simplifying
# the result over the new variables' ranges. Two choices keep this cheap, which matters for
# compile time (a transformer's layers repeat the same views on the same shapes):
# - ``xreplace``, not ``subs``: the keys are plain symbols, for which both give the same
#   expression, but ``subs(..., simultaneous=True)`` goes through dummies and sympy's matching
#   of every sub-expression against every key, several times slower;
# - a cache keyed by (index, mapping, ranges): sympy expressions are immutable and hashable,
#   and the result depends on nothing else, so a repeated view costs a dictionary look-up
#   (sympy's own ``Min``/``Max`` evaluation is the costliest part of a rebuild).
@functools.lru_cache(maxsize=1 << 16)
def substitute(index: sympy.Expr, mapping: tuple, ranges: tuple) -> sympy.Expr:
    """``index`` with ``mapping``'s (variable, expr) pairs put in, simplified over ``ranges``."""
    return simplify_index(sympy.sympify(index.xreplace(dict(mapping))), dict(ranges))


def simplify_index(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """Expand ``expr``, dropping ``//`` terms its ranges make trivial (``(1000*i0+i1)//1000``)."""
    if not expr.has(FloorDiv):  # nothing more to simplify
        return sympy.expand(expr)
    return sympy.expand(_simplify_floordiv(sympy.expand(expr), ranges))


def _simplify_floordiv(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    if not expr.args:
        return expr
    args = [_simplify_floordiv(a, ranges) for a in expr.args]
    if isinstance(expr, FloorDiv) and _known_positive(args[1]):
        return _split_floordiv(*args, ranges)  # a // d with d > 0: split off the part d divides
    return expr.func(*args)


def _split_floordiv(base: sympy.Expr, divisor: sympy.Expr, ranges) -> sympy.Expr:
    """``(a*d + b) // d`` is ``a + b // d``, and ``b // d`` is 0 when ``0 <= b < d``. Only for
    ``b >= 0``: C++ and Triton print // as a division that truncates toward zero."""
    whole, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(base)):
        if _divides(divisor, term):
            whole += term
        else:
            rest += term
    bounds = index_bounds(rest, ranges)
    if bounds is None or not known_nonnegative(bounds[0]):
        return FloorDiv(base, divisor)
    if known_less(bounds[1], divisor):
        return sympy.expand(whole / divisor)
    return sympy.expand(whole / divisor) + FloorDiv(rest, divisor)


def _known_positive(divisor: sympy.Expr) -> bool:
    if divisor.is_Integer:
        return divisor > 0
    return known_nonnegative(divisor - 1)


def _divides(divisor: sympy.Expr, term: sympy.Expr) -> bool:
    """``term`` is ``divisor`` times a polynomial with integer coefficients."""
    if divisor.is_Integer:
        coeff, _ = term.as_coeff_Mul()
        return coeff.is_Integer and int(coeff) % int(divisor) == 0
    quotient = sympy.cancel(term / divisor)
    numerator, denominator = sympy.fraction(quotient)
    return denominator == 1 and quotient.as_coeff_Mul()[0].is_Integer


Bounds = tuple[sympy.Expr, sympy.Expr]


def index_bounds(expr: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> Bounds | None:
    """Smallest and largest value of ``expr`` when each variable ``v`` of ``ranges`` runs over
    ``range(ranges[v])``; None when unknown (a function other than FloorDiv by a positive
    divisor, a product whose signs are unknown). Used to simplify ``//`` and to choose 32- or
    64-bit indices. Ints when everything is static; with size symbols (not in ``ranges``: one
    value for the whole kernel) the bounds are expressions in them, e.g. ``(0, 8*s0 - 1)``."""
    if expr.is_Integer:
        return int(expr), int(expr)
    if expr.is_Symbol:
        if expr in ranges:
            return 0, _static(ranges[expr] - 1)
        return (expr, expr) if is_size_symbol(expr) else None
    parts = [index_bounds(a, ranges) for a in expr.args]
    if any(p is None for p in parts):
        return None
    if isinstance(expr, sympy.Add):
        return _static(sum(p[0] for p in parts)), _static(sum(p[1] for p in parts))
    if isinstance(expr, sympy.Mul):
        return _product_bounds(parts)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
        return _product_bounds([parts[0]] * int(expr.exp))
    if isinstance(expr, FloorDiv) and parts[1][0] == parts[1][1] and _known_positive(
        sympy.sympify(parts[1][0])
    ):
        d = parts[1][0]
        return _static(FloorDiv(parts[0][0], d)), _static(FloorDiv(parts[0][1], d))
    if isinstance(expr, (sympy.Min, sympy.Max)):
        return _min_max_bounds(isinstance(expr, sympy.Min), parts)
    return None


def _min_max_bounds(is_min: bool, parts: list[Bounds]) -> Bounds | None:
    """Bounds of ``Min(a, b, ...)``: at least the smallest lower bound (None if which one is
    unknown), at most the smallest upper bound, or any one of them (each is one: a ragged
    split's ``Min(row, s0 - 1)`` is at most ``s0 - 1``, however large ``row`` gets). ``Max``:
    the mirror image, as ``Max(a, b) == -Min(-a, -b)``."""
    if not is_min:
        parts = [(-sympy.sympify(hi), -sympy.sympify(lo)) for lo, hi in parts]
    lows, highs = ([sympy.sympify(p[k]) for p in parts] for k in (0, 1))
    lowest = [a for a in lows if all(known_nonnegative(b - a) for b in lows)]
    if not lowest:
        return None
    highest = [a for a in highs if all(known_nonnegative(b - a) for b in highs)]
    lo, hi = lowest[0], (highest or highs)[0]
    return (_static(lo), _static(hi)) if is_min else (_static(-hi), _static(-lo))


def _product_bounds(parts: list[Bounds]) -> Bounds | None:
    if all(is_static(a) and is_static(b) for a, b in parts):
        lo, hi = 1, 1
        for a, b in parts:
            corners = (lo * a, lo * b, hi * a, hi * b)
            lo, hi = min(corners), max(corners)
        return lo, hi
    # Symbolic: every factor nonnegative, except perhaps one negative constant.
    negative = [p for p in parts if is_static(p[1]) and p[1] < 0 and p[0] == p[1]]
    rest = [p for p in parts if p not in negative]
    if len(negative) > 1 or not all(known_nonnegative(a) for a, _ in rest):
        return None
    lo = _static(sympy.Mul(*(a for a, _ in rest)))
    hi = _static(sympy.Mul(*(b for _, b in rest)))
    if negative:
        c = negative[0][0]
        lo, hi = _static(c * hi), _static(c * lo)
    return lo, hi


def _static(value):
    """A sympy number as a Python int (static results stay ints), an expression expanded."""
    value = sympy.sympify(value)
    return int(value) if value.is_Integer else sympy.expand(value)
