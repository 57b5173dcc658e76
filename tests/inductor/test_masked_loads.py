"""Loads masked by ``where`` ([Note: loads masked by where] in codegen/masked_loads.py): which
loads get a mask, and programs full of ``where`` (cat, pad, embedding, persistent reductions that
use a value under two different conditions) compared with eager on the Triton backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import toycomp
from toycomp.inductor import ir
from toycomp.inductor.codegen.masked_loads import MAX_TERMS, load_conditions
from toycomp.inductor.indexing import r, x

F32, BOOL = torch.float32, torch.bool


def cond(name: str, index=x) -> ir.Op:
    """A bool condition that reads no buffer: ``index(x) < 4`` (``name`` keeps them apart)."""
    return ir.Op("lt", (ir.IndexValue(index + len(name), torch.int64), ir.Constant(4, torch.int64)), BOOL)


def where(c, a, b) -> ir.Op:
    return ir.Op("where", (c, a, b), F32)


def add(a, b) -> ir.Op:
    return ir.Op("add", (a, b), F32)


def masks_by_buffer(roots) -> dict[str, list[list[tuple[ir.Expr, bool]]]]:
    return {buffer: terms for (buffer, _), terms in load_conditions(roots).items()}


def test_each_branch_is_masked_by_its_side_of_the_condition():
    c, a, b = cond("c"), ir.Load("a", x, F32), ir.Load("b", x, F32)
    masks = masks_by_buffer([where(c, a, b)])
    assert masks == {"a": [[(c, True)]], "b": [[(c, False)]]}


def test_nested_where_conjoins_and_a_smaller_term_absorbs_a_larger_one():
    c, d = cond("c"), cond("dd")
    a, b, e = ir.Load("a", x, F32), ir.Load("b", x, F32), ir.Load("e", x, F32)
    inner = where(d, a, b)
    masks = masks_by_buffer([where(c, inner, e), where(c, a, e)])
    assert masks["b"] == [[(c, True), (d, False)]]
    assert masks["a"] == [[(c, True)]]  # (c and d) or c == c
    assert masks["e"] == [[(c, False)]]


def test_a_load_used_in_both_branches_or_outside_a_where_is_not_masked():
    c, a, b = cond("c"), ir.Load("a", x, F32), ir.Load("b", x, F32)
    assert "a" not in masks_by_buffer([where(c, a, a)])
    assert "a" not in masks_by_buffer([where(c, a, b), add(a, b)])
    assert "a" in masks_by_buffer([where(c, a, b), b])  # another statement reading only b


def test_too_many_paths_make_a_load_unconditional():
    a = ir.Load("a", x, F32)
    conds = [cond("c" * (i + 1)) for i in range(MAX_TERMS + 1)]
    roots = [where(c, a, ir.Constant(0.0, F32)) for c in conds]
    assert "a" not in masks_by_buffer(roots)
    assert len(masks_by_buffer(roots[:MAX_TERMS])["a"]) == MAX_TERMS


def test_a_condition_reading_a_masked_load_masks_nothing():
    # a is needed under c (c reads a) or under c2; c2 = where(d, a > 0, ...) reads a itself
    a, b, d = ir.Load("a", x, F32), ir.Load("b", x, F32), cond("d")
    positive = ir.Op("gt", (a, ir.Constant(0.0, F32)), BOOL)
    c2 = ir.Op("where", (d, positive, ir.Constant(False, BOOL)), BOOL)
    masks = masks_by_buffer([where(c2, a, b)])
    assert "a" not in masks and "b" not in masks  # a is masked by d; c2 reads a: no mask for b
    plain = ir.Op("gt", (b, ir.Constant(0.0, F32)), BOOL)  # a condition reading an unmasked load
    assert masks_by_buffer([where(plain, a, ir.Constant(0.0, F32))])["a"] == [[(plain, True)]]


def test_a_load_along_x_takes_no_condition_that_varies_along_r():
    a = ir.Load("a", x, F32)
    assert "a" not in masks_by_buffer([where(cond("c", index=r), a, ir.Constant(0.0, F32))])
    a_r = ir.Load("a", x * 8 + r, F32)
    assert "a" in masks_by_buffer([where(cond("c", index=r), a_r, ir.Constant(0.0, F32))])


# --- end to end, against eager ----------------------------------------------------------------
def special(*shape, seed=0) -> torch.Tensor:
    """Random values with inf and NaN sprinkled in: a masked load must not let them through."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g)
    flat = t.view(-1)
    flat[::7] = float("nan")
    flat[3::11] = float("inf")
    return t


def cat3(a, b, c):
    return torch.cat([a, b, c], dim=1) * 2


def cat_rows(a, b):
    return torch.cat([a.sin(), b], dim=0).cos()


def causal(a, b):
    return torch.tril(a.exp(), diagonal=1) + b


def picked(a):  # select_backward: one slot of the gradient holds grad, the others zeros
    return a[:, 2].sin() + torch.stack([a[0], a[1].cos()]).sum(0)


def select(a, b, c):
    return torch.where(a > 0, b.exp(), c)


def softmax_of_cat(a, b):  # a persistent reduction: the cat feeds the max, the sum and the store
    return torch.cat([a, b], dim=1).softmax(-1)


def where_then_sum(x0, x1, x2):  # a masked value used by two loops of one persistent kernel
    v = torch.where(x2 > 0, (x0 - x1).sum(0, keepdim=True), x2)
    return torch.erf(F.gelu(v))


CASES = [
    (cat3, [(6, 4, 5), (6, 4, 5), (6, 4, 5)]),
    (cat_rows, [(5, 7), (5, 7)]),
    (causal, [(6, 6), (6, 6)]),
    (picked, [(5, 5)]),
    (select, [(50,), (50,), (50,)]),
    (softmax_of_cat, [(8, 30), (8, 50)]),
    (where_then_sum, [(33,), (33,), (2,)]),
]


@pytest.mark.parametrize("fn,shapes", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("values", ["finite", "special"])
def test_programs_full_of_where_match_eager(fn, shapes, values):
    def inputs():
        make = special if values == "special" else lambda *s, seed: torch.randn(*s)
        torch.manual_seed(0)
        return [make(*s, seed=i).requires_grad_() for i, s in enumerate(shapes)]

    expected_in, actual_in = inputs(), inputs()
    expected = fn(*expected_in)
    actual = toycomp.compile(fn, backend="triton")(*actual_in)
    torch.testing.assert_close(actual, expected, equal_nan=True)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    actual.backward(grad)
    for a, e in zip(actual_in, expected_in):
        torch.testing.assert_close(a.grad, e.grad, equal_nan=True)


def test_cat_reads_each_input_only_where_selected():
    shapes = CASES[0][1]
    source = toycomp.explain(cat3, *(torch.randn(s) for s in shapes), backend="triton")
    kernel = str(source).split("forward kernel_0 (triton)")[1].split("forward wrapper")[0]
    loads = [line for line in kernel.splitlines() if "tl.load(" in line]
    assert len(loads) == 3 and all("xmask & (" in line for line in loads)


def test_embedding_matches_eager_with_masked_rows():
    torch.manual_seed(0)
    weight = special(11, 6).requires_grad_()
    idx = torch.tensor([[0, 3, 10], [4, 4, 1]])
    clean = torch.randn(11, 6).requires_grad_()
    for w in (clean, weight):  # NaN rows of the weight must stay in their own rows
        expected = F.embedding(idx, w)
        actual = toycomp.compile(F.embedding, backend="triton")(idx, w)
        torch.testing.assert_close(actual, expected, equal_nan=True)
