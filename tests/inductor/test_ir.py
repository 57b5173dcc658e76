"""Loop-IR expressions are DAGs (see [Note: expressions are DAGs] in
toycomp/inductor/loop_body.py): every pass visits each shared node once, nothing recurses as
deep as the expression, and compile time grows linearly with the graph (issue 6, item 11)."""

from __future__ import annotations

import cProfile
import pstats
import re

import torch

import toycomp
from toycomp.inductor import interpret, ir
from toycomp.inductor.codegen import cpp, triton
from toycomp.inductor.indexing import x
from toycomp.inductor.ir import Constant, Kernel, Load, Loop, Op, Store

F32 = torch.float32


def chain(depth: int, leaf: ir.Expr = Load("a", x, F32)) -> ir.Expr:
    """``y = y * sigmoid(y) + sin(y)``, ``depth`` times: each ``y`` is used three times by the
    next, so the tree has about 3**depth nodes and the DAG 8 * depth + 1."""
    y = leaf
    for _ in range(depth):
        sigmoid = Op("reciprocal", (Op("add", (Op("exp", (Op("neg", (y,), F32),), F32),
                                               Constant(1.0, F32)), F32),), F32)  # fmt: skip
        y = Op("add", (Op("mul", (y, sigmoid), F32), Op("sin", (y,), F32)), F32)
    return y


def chain_kernel(depth: int) -> Kernel:
    loop = Loop(False, (Store("out", x, chain(depth)),))
    return Kernel("kernel_0", 64, 1, (loop,), (("a", F32), ("out", F32)), ("chain",))


def test_walk_and_post_order_visit_each_shared_node_once():
    expr = chain(12)
    nodes = list(ir.walk(expr))
    assert len(nodes) == 8 * 12 + 1 == len({id(n) for n in nodes})
    assert nodes[0] is expr  # parents before children
    order = ir.post_order(expr)
    assert len(order) == len(nodes) and order[-1] is expr
    position = {id(n): k for k, n in enumerate(order)}  # children before parents
    ops = [n for n in order if isinstance(n, Op)]
    assert all(position[id(a)] < position[id(n)] for n in ops for a in n.args)
    assert len(list(ir.walk(expr, expr.args[1]))) == len(nodes)  # one walk over several roots


def test_rewrites_keep_sharing():
    expr = chain(12)
    moved = ir.substitute(expr, {x: 2 * x})
    assert len(list(ir.walk(moved))) == len(list(ir.walk(expr)))
    y = moved.args[1].args[0]  # the sin's argument is the mul's first argument: still one object
    assert y is moved.args[0].args[0]
    loads = [e for e in ir.walk(moved) if isinstance(e, Load)]
    assert [load.index for load in loads] == [2 * x]
    # a rewrite that changes nothing rebuilds nothing
    assert ir.map_expr(expr, lambda e: None) is expr


def test_printing_names_shared_nodes_of_big_expressions():
    small = Op("mul", (Op("sin", (Load("a", x, F32),), F32),) * 2, F32)
    assert repr(small) == "mul(sin(load(a, x)), sin(load(a, x)))"  # small: a tree, as before
    text = repr(chain(40))  # 3**40 nodes as a tree
    assert text.startswith("let t0 = ") and len(text) < 100 * 40


def test_deep_expressions_need_no_recursion():
    """A chain deeper than Python's recursion limit: walked, rewritten, printed, generated in
    both languages and interpreted."""
    depth = 1500
    kernel = chain_kernel(depth)
    expr = kernel.loops[0].body[0].value
    assert len(ir.post_order(expr)) == 8 * depth + 1
    assert ir.substitute(expr, {x: x + 1}) is not expr
    assert "let" in repr(kernel)
    source = cpp.generate(kernel).source
    assert source.count("toycomp_sinf(tmp") == depth  # each shared value computed once
    assert triton.generate(kernel).source.count("tl.sin(") == depth
    a = torch.randn(64) * 0.1
    graph = ir.ScheduledGraph(
        (ir.InputBuffer("a", (64,), (1,), F32),),
        (ir.AllocatedBuffer("out", (64,), (1,), F32),),
        (kernel,),
        (ir.TensorArg("out", (64,), (1,)),),
        torch.device("cpu"),
    )
    (out,) = interpret.run_scheduled(graph, [a])
    want = a.double()
    for _ in range(depth):
        want = want * want.sigmoid() + want.sin()
    torch.testing.assert_close(out, want.float(), rtol=1e-3, atol=1e-4)


def calls(fn) -> int:
    """Python function calls made by ``fn()`` (a structural count: no clock involved)."""
    profile = cProfile.Profile()
    profile.runcall(fn)
    return pstats.Stats(profile).total_calls


def test_code_generation_grows_linearly():
    small, big = (calls(lambda: cpp.generate(chain_kernel(d))) for d in (6, 12))
    assert big < 2.5 * small, (small, big)  # it was 3**depth


def pointwise_chain(n: int):
    def f(y):
        for _ in range(n):
            y = y * y.sigmoid() + y.sin()
        return y

    return f


def compile_chain(n: int) -> None:
    """Values and gradients of the chain, compiled (C++), checked against eager."""
    f = pointwise_chain(n)
    a = torch.randn(64, requires_grad=True)
    out = toycomp.compile(f, backend="cpp")(a)
    (grad,) = torch.autograd.grad(out.sum(), a)
    want = f(a)
    (want_grad,) = torch.autograd.grad(want.sum(), a)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-5)


def test_compile_time_grows_linearly_with_a_pointwise_chain():
    """Capture to generated source, forward and backward: twice the chain, about twice the
    work (it was 3**n: n = 6 took 20 s, n = 40 did not finish). Counted in function calls."""
    compile_chain(2)  # first compile: imports and one-time probes
    small, big = calls(lambda: compile_chain(3)), calls(lambda: compile_chain(6))
    assert big < 2.6 * small, (small, big)


def test_chain_kernels_compute_each_value_once():
    n = 8
    ex = toycomp.explain(pointwise_chain(n), torch.randn(64, requires_grad=True))
    forward, backward = (k.source for k in ex.kernels)
    assert len(re.findall(r"toycomp_sinf\(tmp", forward)) == n
    assert len(re.findall(r"toycomp_expf\(tmp", forward)) == n
    for fn in ("sinf", "cosf", "expf"):  # the backward recomputes the forward's values, once
        assert len(re.findall(rf"toycomp_{fn}\(tmp", backward)) <= n, fn
