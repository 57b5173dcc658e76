"""Index substitution (``indexing.substitute``, [Note: substituting indices]): ``xreplace`` and a
cache in place of sympy's ``subs(..., simultaneous=True)``, with the same expressions, checked
against ``subs`` itself on the index shapes views and fusion make (floor divisions, modulos,
clamps with Min/Max, size symbols, swapped variables), and by brute force."""

import random

import sympy

from toycomp.inductor import indexing
from toycomp.inductor.indexing import FloorDiv, index_vars, modular, simplify_index, substitute

i0, i1, i2 = index_vars("i", 3)
s0 = indexing.size_symbol(0)


def _by_subs(index, mapping: dict, ranges: dict):
    """What the lowering and the scheduler computed before: ``subs``, then simplify."""
    return simplify_index(sympy.sympify(index).subs(mapping, simultaneous=True), ranges)


def _cases(rng: random.Random) -> list:
    cases = [i0, 7, 3 * i0 + i1, FloorDiv(6 * i0 + i1, 6), modular(6 * i0 + i1, 6),
             sympy.Min(i0 + 1, 5), sympy.Max(i1 - 2, 0) + 4 * i0, sympy.Min(i0, s0 - 1) * s0 + i1,
             FloorDiv(s0 * i0 + i1, s0), 12 * FloorDiv(i2, 3) + modular(i2, 3)]  # fmt: skip
    for _ in range(60):
        a, b, c, d = (rng.randint(0, 6) for _ in range(4))
        inner = FloorDiv(a * i0 + b * i1 + c * i2, d + 1)
        cases += [inner, modular(inner + i1, rng.randint(1, 5)), sympy.Min(inner, c + 2)]
    return cases


def _mappings() -> list[tuple[dict, dict]]:
    x, r = indexing.x, indexing.r
    return [
        ({i0: i1, i1: i0, i2: i2}, {i0: 4, i1: 6, i2: 5}),  # a transpose: names swapped at once
        ({i0: FloorDiv(x, 30), i1: modular(FloorDiv(x, 5), 6), i2: modular(x, 5)}, {x: 120}),
        ({i0: FloorDiv(x, 6), i1: modular(x, 6), i2: r}, {x: 24, r: 5}),
        ({i0: 2 * i1 + 1, i1: i0, i2: 0}, {i0: 6, i1: 2}),  # a strided slice, an index to 0
        ({i0: FloorDiv(x, s0), i1: modular(x, s0), i2: 1}, {x: 4 * s0}),  # symbolic sizes
    ]


def test_substitute_gives_what_subs_gives():
    rng = random.Random(0)
    compared = 0
    for mapping, ranges in _mappings():
        for index in _cases(rng):
            got = substitute(sympy.sympify(index), tuple(mapping.items()), tuple(ranges.items()))
            want = _by_subs(index, mapping, ranges)
            assert got == want and str(got) == str(want), (index, mapping, got, want)
            compared += 1
    assert compared > 500


def test_substitute_is_right_by_brute_force():
    """The moved index reads the element the original index reads, at every point."""
    x = indexing.x
    mapping = {i0: FloorDiv(x, 30), i1: modular(FloorDiv(x, 5), 6), i2: modular(x, 5)}
    for index in _cases(random.Random(1))[:40]:
        index = sympy.sympify(index).xreplace({s0: 3})
        moved = substitute(index, tuple(mapping.items()), ((x, 120),))
        for v in range(120):
            env = {i0: v // 30, i1: v // 5 % 6, i2: v % 5}
            assert _eval(moved, {x: v}) == _eval(index, env), (index, moved, v)


def test_the_cache_keys_on_the_ranges():
    """The same index and mapping simplify differently over other ranges: never mixed up."""
    index, mapping = FloorDiv(1000 * i0 + i1, 1000), ((i0, i0), (i1, i1))
    assert substitute(index, mapping, ((i0, 8), (i1, 1000))) == i0
    assert substitute(index, mapping, ((i0, 8), (i1, 2000))) == i0 + FloorDiv(i1, 1000)
    assert substitute(index, mapping, ((i0, 8), (i1, 1000))) == i0  # (a cache hit)


def test_a_bare_variable_moved_to_a_number_is_a_sympy_integer():
    """``xreplace`` returns a mapped value as given: an int must come back as sympy's."""
    got = substitute(i0, ((i0, 0),), ())
    assert isinstance(got, sympy.Integer) and got == 0


def _eval(expr, env: dict) -> int:
    expr = sympy.sympify(expr)
    if isinstance(expr, FloorDiv):
        return _eval(expr.args[0], env) // _eval(expr.args[1], env)
    if expr.is_Symbol:
        return env[expr]
    if expr.is_Integer:
        return int(expr)
    values = [_eval(a, env) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return sum(values)
    if isinstance(expr, sympy.Mul):
        out = 1
        for v in values:
            out *= v
        return out
    if isinstance(expr, (sympy.Min, sympy.Max)):
        return (min if isinstance(expr, sympy.Min) else max)(values)
    raise AssertionError(f"cannot evaluate {expr}")

