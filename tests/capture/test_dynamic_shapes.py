"""Capture with dynamic shapes: automatic dynamic, dynamic=True/False, mark_dynamic, shape guards.

The captured graphs run as they are (``gm.forward``: stages 2-4 are not involved); eager PyTorch
is the oracle for every result, and each kind of shape guard is made to fail once to check that
the recompile stays correct.
"""

import random

import pytest
import torch

import toycomp
from toycomp.capture.convert_frame import compile_frame

SIZES = random.Random(0).sample(range(2, 65), 63)  # batch sizes 2..64, shuffled


def compile_eager(fn, dynamic=None):
    """``fn`` through the capture, each graph run as captured; ``graphs`` logs what it made."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    return compile_frame(fn, backend, dynamic=dynamic), graphs


def guards_of(cf, i=-1) -> list[str]:
    return cf.entries[i].check.conditions


def same(actual, expected):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected)
    else:
        assert type(actual) is type(expected) and actual == expected


def sin2_cos2(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def test_automatic_dynamic_two_compiles_for_every_batch_size():
    cf, graphs = compile_eager(sin2_cos2)
    for n in SIZES:
        x = torch.randn(n, 5)
        same(cf(x), sin2_cos2(x))
    assert len(cf.entries) == len(graphs) == 2  # static, then symbolic
    (static_gm, static_ex), (dynamic_gm, dynamic_ex) = graphs
    assert [type(e).__name__ for e in static_ex] == ["FakeTensor"]
    assert [type(e).__name__ for e in dynamic_ex] == ["SymInt", "FakeTensor"]
    assert [n.name for n in dynamic_gm.graph.nodes if n.op == "placeholder"] == ["s0", "l_x"]
    assert "L['x'].shape == (" + str(SIZES[0]) + ", 5)" in guards_of(cf, 0)
    guards = guards_of(cf)
    assert "L['x'].size(0) >= 2" in guards and "L['x'].size(1) == 5" in guards
    assert not any("L['x'].shape ==" in g for g in guards)


def test_dynamic_true_is_symbolic_from_the_first_compile_and_false_never():
    cf, graphs = compile_eager(sin2_cos2, dynamic=True)
    for n in SIZES[:10]:
        x = torch.randn(n, 5)
        same(cf(x), sin2_cos2(x))
    assert len(cf.entries) == 1
    assert [type(e).__name__ for e in graphs[0][1]] == ["SymInt", "SymInt", "FakeTensor"]
    cf, graphs = compile_eager(sin2_cos2, dynamic=False)
    for n in (3, 4, 5):
        x = torch.randn(n, 5)
        same(cf(x), sin2_cos2(x))
    assert len(cf.entries) == 3
    assert all(isinstance(e, torch.Tensor) for _, ex in graphs for e in ex)


def test_mark_dynamic_makes_the_first_compile_symbolic():
    x = torch.randn(6, 5)
    toycomp.mark_dynamic(x, -2)
    cf, graphs = compile_eager(sin2_cos2, dynamic=False)
    same(cf(x), sin2_cos2(x))
    assert [type(e).__name__ for e in graphs[0][1]] == ["SymInt", "FakeTensor"]
    assert "L['x'].size(0) >= 2" in guards_of(cf)
    x = torch.randn(9, 5)
    same(cf(x), sin2_cos2(x))  # reused for another size
    assert len(cf.entries) == 1
    with pytest.raises(IndexError):
        toycomp.mark_dynamic(x, 2)


def test_torch_compile_agrees_on_what_is_dynamic():
    """Dynamo's graph for the same calls takes the same size inputs (its symbol is s77)."""
    dynamo_inputs = []

    def kinds(example_inputs):
        return ["size" if isinstance(e, torch.SymInt) else "tensor" for e in example_inputs]

    def backend(gm, example_inputs):
        dynamo_inputs.append(kinds(example_inputs))
        return gm.forward

    def fn(x, w):
        return torch.tanh(x @ w)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    cf, graphs = compile_eager(fn)
    w = torch.randn(4, 3)
    for n in (5, 8, 11):
        x = torch.randn(n, 4)
        same(cf(x, w), fn(x, w))
        compiled(x, w)
    assert [kinds(ex) for _, ex in graphs] == dynamo_inputs == [["tensor"] * 2,
                                                                ["size", "tensor", "tensor"]]


# --- sizes 0 and 1 stay specialised; each kind of shape guard fails once, correctly ------------
def test_a_size_that_turns_1_fails_the_range_guard_and_recompiles():
    def fn(x, y):
        return x + y  # y of size 1 broadcasts: a different computation

    cf, _ = compile_eager(fn)
    for n in (4, 5, 7):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        same(cf(x, y), fn(x, y))
    assert "L['y'].size(0) >= 2" in guards_of(cf)
    x, y = torch.randn(6, 3), torch.randn(1, 3)
    same(cf(x, y), fn(x, y))
    assert len(cf.entries) == 3
    assert "L['y'].size(0) == 1" in guards_of(cf)  # specialised, not a symbol
    x, y = torch.randn(0, 3), torch.randn(0, 3)
    same(cf(x, y), fn(x, y))


def test_duck_sized_inputs_that_stop_being_equal_recompile():
    def fn(x, y):
        return x.sum(0) * 2 + y.sum(0)

    cf, graphs = compile_eager(fn, dynamic=True)
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    same(cf(x, y), fn(x, y))
    assert "L['y'].size(0) == L['x'].size(0)" in guards_of(cf)  # one symbol for both
    x, y = torch.randn(7, 3), torch.randn(7, 3)
    same(cf(x, y), fn(x, y))
    assert len(cf.entries) == 1
    x, y = torch.randn(7, 3), torch.randn(4, 3)
    same(cf(x, y), fn(x, y))
    assert len(cf.entries) == 2
    assert [type(e).__name__ for e in graphs[-1][1]].count("SymInt") == 3  # s0, s1, s2: 3 == 3


def test_sizes_the_graph_needs_equal_are_guarded_equal():
    def fn(x, y):
        return x * y.flip(0)  # broadcasting (n,) with (m,): the trace needs n == m

    cf, _ = compile_eager(fn)
    for n in (3, 4):
        x, y = torch.randn(n), torch.randn(n)
        same(cf(x, y), fn(x, y))
    assert "L['x'].size(0) == L['y'].size(0)" in guards_of(cf)
    x, y = torch.randn(6), torch.randn(1)  # no longer equal (y broadcasts): recompile
    same(cf(x, y), fn(x, y))
    assert len(cf.entries) == 3


def test_a_python_branch_on_a_size_is_guarded():
    def fn(x):
        if x.shape[0] > 8:
            return x.sin()
        return x.cos()

    cf, _ = compile_eager(fn)
    for n in (3, 4, 5, 6):
        x = torch.randn(n)
        same(cf(x), fn(x))
    assert len(cf.entries) == 2 and "L['x'].size(0) <= 8" in guards_of(cf)
    for n in (9, 12, 7):
        x = torch.randn(n)
        same(cf(x), fn(x))
    assert len(cf.entries) == 3 and "L['x'].size(0) > 8" in guards_of(cf)


def test_what_a_view_needed_is_guarded():
    def fn(x):
        return x.view(-1, 4).sum(1)

    cf, _ = compile_eager(fn)
    for n in (8, 12, 20):
        x = torch.randn(n)
        same(cf(x), fn(x))
    assert len(cf.entries) == 2
    assert any("% 4 == 0" in g for g in guards_of(cf))
    with pytest.raises(RuntimeError, match="invalid for input of size 10"):
        fn(torch.randn(10))
    with pytest.raises(RuntimeError, match="invalid for input of size 10"):
        cf(torch.randn(10))  # the guard fails; the retrace meets eager's own error


def test_a_size_used_as_a_python_int_specialises_with_a_guard():
    def fn(x):
        out = x
        for i in range(x.shape[0]):  # unrolled: one graph per length
            out = out + i
        return out

    cf, _ = compile_eager(fn)
    for n in (3, 4, 4, 3, 5):
        x = torch.randn(n)
        same(cf(x), fn(x))
    assert "L['x'].size(0) == 4" in guards_of(cf, 1)
    assert len(cf.entries) == 3  # 3, then 4 (symbolic, specialised), then 5


# --- Python ints made from sizes are SymInts in the graph -------------------------------------
def test_sizes_in_python_arithmetic_and_views():
    def fn(x, y):
        n, d = x.shape
        half = n // 2
        z = x.view(x.size(0), -1).reshape(n * d) * (n - 1)
        return z[: half * d] + y.new_ones(half * d) * d, half

    cf, graphs = compile_eager(fn)
    for n in (4, 6, 9, 17):
        x, y = torch.randn(n, 3), torch.randn(2)
        out, half = cf(x, y)
        ref, ref_half = fn(x, y)
        same(out, ref)
        same(half, ref_half)  # a size returned to Python is a plain int
    assert len(cf.entries) == 2
    gm = graphs[-1][0]
    assert any(node.target is __import__("operator").floordiv for node in gm.graph.nodes)


def test_a_size_across_a_graph_break():
    def fn(x):
        n = x.shape[0] * 2
        print("n is", n)  # graph break: n is rebuilt from x.size(0) in plain Python
        return x.sum() * n, n

    cf, _ = compile_eager(fn)
    for n in SIZES[:12]:
        x = torch.randn(n)
        out, m = cf(x)
        ref, ref_m = fn(x)
        same(out, ref)
        same(m, ref_m)
    # fn and its resume function, each static then symbolic: the resume function's int
    # argument n became a symbol too (automatic dynamic ints)
    assert len(cf.context.log) == 4


def test_automatic_dynamic_ints():
    def scale(x, k):
        return x * k if k > 1 else x - k

    cf, graphs = compile_eager(scale)
    for k in (2, 3, 5, 7, 0, 1, -4, 9):
        x = torch.randn(4)
        same(cf(x, k), scale(x, k))
    assert [type(e).__name__ for e in graphs[1][1]] == ["FakeTensor", "SymInt"]
    guards = guards_of(cf, 1)
    assert "type(L['k']) is int" in guards and "L['k'] >= 2" in guards  # a size's range
    assert len(cf.entries) == 5  # 2, then k symbolic (>= 2), then 0, 1, -4 specialised
    cf, _ = compile_eager(scale, dynamic=False)
    for k in (2, 3, 5):
        same(cf(torch.ones(4), k), scale(torch.ones(4), k))
    assert len(cf.entries) == 3 and "L['k'] == 5" in guards_of(cf)


def test_the_guard_function_stays_readable():
    cf, _ = compile_eager(sin2_cos2)
    cf(torch.randn(4, 3))
    cf(torch.randn(5, 3))
    source = cf.entries[-1].check.source
    for line in ("L['x'].dim() == 2", "L['x'].size(1) == 3", "L['x'].stride() == (3, 1)",
                 "L['x'].size(0) >= 2"):
        assert line in source
    assert cf.entries[-1].check.failing_guard({"x": torch.randn(1, 3)}, {}) == \
        "L['x'].size(0) >= 2"


def test_a_size_formatted_into_text_is_its_number():
    """``str(s0)`` is "s0": text made from a size specialises it (guarded), never the symbol."""

    def fn(x):
        return x * 2, f"batch {x.shape[0]}, {str(x.size(0))}, {x.shape}, {x.shape[0]!r}"

    cf, _ = compile_eager(fn)
    for n in (3, 4, 5, 4):
        x = torch.randn(n)
        out, text = cf(x)
        same(out, fn(x)[0])
        same(text, fn(x)[1])
    assert "L['x'].size(0) == 4" in guards_of(cf, 1)


def test_a_size_is_an_int_to_the_users_code():
    def fn(x):
        n = x.shape[0]
        return (x * n if isinstance(n, int) else x), type(n) is int, isinstance(x.shape, tuple)

    cf, _ = compile_eager(fn)
    for n in (3, 4, 5):
        x = torch.randn(n)
        for got, want in zip(cf(x), fn(x)):
            same(got, want)
    assert len(cf.entries) == 2
