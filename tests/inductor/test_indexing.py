"""Index arithmetic (toycomp/inductor/indexing.py), checked by brute force over small ranges."""

import itertools
import random

import sympy

from toycomp.inductor.indexing import (
    FloorDiv,
    index_bounds,
    index_vars,
    modular,
    simplify_index,
    r,
    x,
)


def test_simplify_index_agrees_with_brute_force():
    i0, i1 = index_vars("i", 2)
    ranges = {i0: 4, i1: 6}
    rng = random.Random(0)
    cases = [FloorDiv(6 * i0 + i1, 6), modular(6 * i0 + i1, 6), FloorDiv(i1 + 1, 6)]
    # as_strided's gather: a storage position, its row and its column mod 3 (a -13*(..) term)
    flat = 3 * (5 * i0 + i1) - 13 * FloorDiv(5 * i0 + i1, 5)
    cases += [modular(modular(flat, 6), 3), FloorDiv(flat, 3), modular(flat - 2 * i0, 4)]
    for _ in range(200):
        a, b, c, d = (rng.randint(0, 7) for _ in range(4))
        inner = FloorDiv(a * i0 + b * i1 + c, d + 1)
        cases += [inner, modular(inner + b * i0, rng.randint(1, 5)), FloorDiv(inner, 2)]
    for expr in cases:
        simple = simplify_index(expr, ranges)
        for v0, v1 in itertools.product(range(4), range(6)):
            env = {i0: v0, i1: v1}
            want = _eval_index(expr, env)
            assert _eval_index(simple, env) == want, (expr, simple, env)
            # C++ and Triton print // as a truncating division: no negative numerator
            assert _eval_index(simple, env, truncate=True) == want, (expr, simple, env)
    assert simplify_index(cases[0], ranges) == i0 and simplify_index(cases[1], ranges) == i1


def test_index_bounds_hold_and_are_exact_for_affine_indices():
    ranges = {x: 5, r: 7}
    affine = [3 * x + r, x - 2 * r + 4, 5 * x * r, sympy.Integer(9)]
    others = [FloorDiv(6 * r + x, 4), modular(x + 3 * r, 7)]
    for expr in affine + others:
        values = [_eval_index(expr, {x: a, r: b}) for a in range(5) for b in range(7)]
        lo, hi = index_bounds(expr, ranges)
        assert lo <= min(values) and max(values) <= hi, expr
        assert expr not in affine or (lo, hi) == (min(values), max(values)), expr
    assert index_bounds(x + index_vars("i", 1)[0], ranges) is None  # i0's range is unknown


def _eval_index(expr, env, truncate=False):
    """Exact integer evaluation of an index (independent of interpret.py); ``truncate``: each
    ``//`` rounds toward zero, as the generated C++ and Triton code's division does."""
    if isinstance(expr, FloorDiv):
        a, b = (_eval_index(e, env, truncate) for e in expr.args)
        return int(a / b) if truncate else a // b
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return env[expr]
    vals = [_eval_index(a, env, truncate) for a in expr.args]
    out = vals[0]
    for v in vals[1:]:
        out = out + v if expr.is_Add else out * v
    return out
