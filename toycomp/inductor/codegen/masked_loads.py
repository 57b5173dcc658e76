"""Stage 4c (Triton backend): the loads that only one branch of a ``where`` needs, and when.

Input -> output: the statements of one ``ir.Loop`` -> for each load used only under ``where``
conditions, those conditions (a disjunction of conjunctions), which the Triton code generator
adds to the load's mask so that elements whose value is never selected are not read. For
``cat([a, b])`` along dim 0 of two 4-row tensors::

    >>> import sympy, torch
    >>> from toycomp.inductor import ir
    >>> from toycomp.inductor.indexing import x
    >>> f32 = torch.float32
    >>> first = ir.Op("lt", (ir.IndexValue(x // 8, torch.int64), ir.Constant(4, torch.int64)),
    ...               torch.bool)
    >>> a, b = ir.Load("a", x, f32), ir.Load("b", x - 32, f32)
    >>> masks = load_conditions([ir.Op("where", (first, a, b), f32)])
    >>> [(load, [[(c.name, taken) for c, taken in term] for term in terms])
    ...  for load, terms in masks.items()]
    [(('a', x), [[('lt', True)]]), (('b', x - 32), [[('lt', False)]])]

NB: in PyTorch this is ``ops.masked`` (torch/_inductor/codegen/triton.py, ``TritonKernel.masked``
and ``mask_loads``): lowerings of ``cat``, ``constant_pad_nd`` and indexing wrap the loads of
each branch in a masked sub-block. toycomp's lowerings only write ``where``; the mask is found
afterwards, here.
"""

from __future__ import annotations

import sympy
import torch

from toycomp.inductor import indexing, ir

# One path from a statement to a load: the where-conditions it passed (by node id: nodes are
# shared, and hashing a frozen dataclass walks its whole tree), each with the branch taken
# (True: the value if the condition holds). The empty term: a path with no where.
Term = frozenset  # of (id of a condition node, bool)
MAX_TERMS = 4  # more paths than this: the mask would cost more than it saves; load always


# [Note: loads masked by where]
# `cat([q, k, v], 1)` lowers to where(i1 < 64, load(q), where(i1 < 128, load(k), load(v))), and
# `tl.where` evaluates both branches: every element of the output reads all three inputs, three
# times the bytes of a copy (0.13 ms a layer in notebook 05's GPT backward, where Inductor's cat
# takes 0.05 ms). A load that no element selects need not happen: Triton's masked-off lanes
# issue no memory transaction. So for each load we collect, over every path from the loop's
# statements to it, the where-conditions the path passes (its branch: c or not c); the load is
# needed where any path's conditions all hold, and is masked by that (`other=0`, a value no
# `where` selects). One path without a where makes it unconditional. Two limits keep this
# simple and safe: a condition may read only unconditional loads (so no mask depends on a
# masked load, or on the load it masks), and a load indexed by x alone takes no condition that
# varies along r (its block shape would change).
def load_conditions(roots: list[ir.Expr]) -> dict[tuple[str, sympy.Expr], list[list]]:
    """``(buffer, index)`` -> the terms (lists of ``(condition, branch)``) under which that load
    is needed, for the loads some ``where`` makes conditional (the others are left out)."""
    paths: dict[int, set[Term]] = {id(r): {Term()} for r in roots}
    conditions: dict[int, ir.Expr] = {}  # by id
    order = ir.post_order(*roots)
    for node in reversed(order):  # parents before children: a node's paths are all known
        terms = paths[id(node)]
        if isinstance(node, ir.Load):  # an indirect load's index values: read unconditionally
            for value in node.indirect:
                _add(paths, value, {Term()})
        if not isinstance(node, ir.Op):
            continue
        if node.name == "where" and _is_condition(node.args[0]):
            cond = node.args[0]
            conditions[id(cond)] = cond
            _add(paths, cond, terms)
            _add(paths, node.args[1], {t | {(id(cond), True)} for t in terms})
            _add(paths, node.args[2], {t | {(id(cond), False)} for t in terms})
        else:
            for arg in node.args:
                _add(paths, arg, terms)
    needed: dict[tuple[str, sympy.Expr], set[Term]] = {}
    for node in order:
        if isinstance(node, ir.Load) and not node.indirect:  # (an indirect one: never masked)
            _merge(needed.setdefault((node.buffer, node.index), set()), paths[id(node)])
    masked = {key for key, terms in needed.items() if Term() not in terms}
    usable = {key for key in masked if all(
        _usable(conditions[c], key, masked) for t in needed[key] for c, _ in t
    )}
    position = {id(node): i for i, node in enumerate(order)}  # a fixed order: same source

    def in_order(term: Term) -> list[tuple[int, bool]]:
        return sorted((position[c], taken) for c, taken in term)

    return {
        key: [[(order[p], taken) for p, taken in t] for t in sorted(map(in_order, needed[key]))]
        for key in sorted(usable, key=str)
    }


def _is_condition(cond: ir.Expr) -> bool:
    return not isinstance(cond, ir.Constant) and cond.dtype == torch.bool


def _usable(cond: ir.Expr, key: tuple[str, sympy.Expr], masked: set) -> bool:
    """``cond`` may mask load ``key``: it reads no masked load, and varies along r only if the
    load does."""
    load_uses_r = indexing.r in sympy.sympify(key[1]).free_symbols
    for node in ir.walk(cond):
        if isinstance(node, ir.Load) and not node.indirect and (node.buffer, node.index) in masked:
            return False
        index = getattr(node, "index", None)
        if index is not None and not load_uses_r:
            if indexing.r in sympy.sympify(index).free_symbols:
                return False
    return True


def _add(paths: dict[int, set[Term]], node: ir.Expr, terms: set[Term]) -> None:
    _merge(paths.setdefault(id(node), set()), terms)


def _merge(into: set[Term], terms: set[Term]) -> None:
    """``into |= terms``, simplified: a smaller term absorbs a larger one (``c`` makes ``c and d``
    redundant), and two terms that differ in one condition's branch only merge (``c and d``,
    ``not c and d``: ``d``)."""
    pending = list(terms)
    while pending:
        t = pending.pop()
        if any(kept <= t for kept in into):
            continue
        into -= {kept for kept in into if t <= kept}
        other = next((k for k in into if len(k ^ t) == 2 and len({c for c, _ in k ^ t}) == 1), None)
        if other is not None:  # resolve: the merged term may absorb or merge again
            into.discard(other)
            pending.append(t & other)
            continue
        into.add(t)
    if len(into) > MAX_TERMS:
        into.clear()
        into.add(Term())
