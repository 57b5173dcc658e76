"""Lowering (prims graph -> loop IR), checked end to end through the IR interpreter.

Graphs are built by hand with a tiny prims tracer (``trace_prims`` below), independent of the
decompositions; eager PyTorch (the prims' references and torch functions) is the oracle.
"""

import operator

import pytest
import torch
from torch.fx import Graph, GraphModule
from torch.fx.node import map_aggregate

import toycomp.prims as p
from toycomp.inductor import ir
from toycomp.inductor.interpret import run_lowered, run_scheduled
from toycomp.inductor.lowering import (
    REALIZE_READS_THRESHOLD,
    REALIZE_THRESHOLD,
    LoweringError,
    lower,
)
from toycomp.inductor.lowering_table import LOWERINGS
from toycomp.inductor.scheduler import schedule

aten = torch.ops.aten


def test_every_prim_has_a_lowering_rule():
    assert set(LOWERINGS) == set(p.PRIMS.values())


# --- a tiny tracer: prims called on _Proxy objects record FX nodes -------------------------------
class _Proxy:
    def __init__(self, node):
        self.node = node


class _Tracer:
    def __init__(self):
        self.graph = Graph()

    def emit(self, fn, args, kwargs):
        args, kwargs = map_aggregate(
            (args, kwargs), lambda v: v.node if isinstance(v, _Proxy) else v
        )
        return _Proxy(self.graph.call_function(fn, args, kwargs))


_TRACER = []


def extern(op, *args):
    """Call an ATen op from a traced function (recorded as an FX node), or eagerly."""
    if _TRACER:
        return _TRACER[-1].emit(op, args, {})
    return op(*args)


def trace_prims(fn, *inputs) -> GraphModule:
    """An FX graph of the prims that ``fn`` calls on ``inputs``' proxies."""
    tracer = _Tracer()
    proxies = [_Proxy(tracer.graph.placeholder(f"arg{k}")) for k in range(len(inputs))]
    _TRACER.append(tracer)
    try:
        with p.tracing(tracer):
            out = fn(*proxies)
    finally:
        _TRACER.pop()
    outs = out if isinstance(out, tuple) else (out,)
    tracer.graph.output(tuple(o.node if isinstance(o, _Proxy) else o for o in outs))
    return GraphModule(torch.nn.Module(), tracer.graph)


def compile_and_run(fn, *inputs):
    """lower + schedule + interpret; checks against eager ``fn``; returns the scheduled graph."""
    gm = trace_prims(fn, *inputs)
    lowered = lower(gm, list(inputs))
    scheduled = schedule(lowered)
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for outs in (run_lowered(lowered, list(inputs)), run_scheduled(scheduled, list(inputs))):
        assert len(outs) == len(expected)
        for got, want in zip(outs, expected):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return scheduled


def kernels(scheduled):
    return [s for s in scheduled.steps if isinstance(s, ir.Kernel)]


# --- tests ---------------------------------------------------------------------------------------
def f_running_example(x):
    return p.add(p.pow(p.sin(x), 2), p.pow(p.cos(x), 2))


def test_running_example_is_one_pointwise_buffer():
    x = torch.randn(1000)
    lowered = lower(trace_prims(f_running_example, x), [x])
    assert lowered.inputs == (ir.InputBuffer("arg0", (1000,), (1,), torch.float32),)
    [buf] = lowered.nodes
    assert isinstance(buf, ir.Pointwise) and buf.name == "buf0" and buf.size == (1000,)
    assert repr(buf.body) == "add(pow(sin(load(arg0, i0)), 2.0), pow(cos(load(arg0, i0)), 2.0))"
    assert lowered.outputs == (ir.TensorArg("buf0", (1000,), (1,)),)
    assert buf.origins == ("sin", "pow_1", "cos", "pow_2", "add")
    compile_and_run(f_running_example, x)


def test_lowering_is_deterministic():
    x = torch.randn(8, 10)
    f = lambda x: p.div(p.exp(x), p.broadcast_in_dim(p.sum(p.exp(x), [1]), (8, 10), (0,)))
    assert repr(lower(trace_prims(f, x), [x])) == repr(lower(trace_prims(f, x), [x]))


def test_views_are_index_substitutions_not_copies():
    x, b = torch.randn(6, 4), torch.randn(6)

    def f(x, b):
        t = p.permute(x, [1, 0])  # (4, 6)
        s = p.slice(t, 1, 1, 6, 2)  # (4, 3): columns 1, 3, 5
        r = p.reshape(s, [2, 6])
        bb = p.broadcast_in_dim(p.slice(b, 0, 0, 6, 1), (2, 6), (1,))
        return p.mul(p.add(r, 1.0), bb)

    scheduled = compile_and_run(f, x, b)
    lowered = lower(trace_prims(f, x, b), [x, b])
    assert len(lowered.nodes) == 1 and len(kernels(scheduled)) == 1


@pytest.mark.parametrize("view", ["permute", "slice", "broadcast", "reduction"])
def test_output_that_is_a_view_of_a_buffer_is_not_copied(view):
    x = torch.randn(6, 4)
    f = {
        "permute": lambda x: p.permute(x, [1, 0]),
        "slice": lambda x: p.slice(x, 0, 2, 6, 2),
        "broadcast": lambda x: p.broadcast_in_dim(x, (3, 6, 4), (1, 2)),
        "reduction": lambda x: p.permute(p.reshape(p.sum(x, [0]), [2, 2]), [1, 0]),
    }[view]
    scheduled = compile_and_run(f, x)
    arg = scheduled.outputs[0]
    expected = f(x)
    assert arg.size == tuple(expected.shape)
    if view != "reduction":
        assert arg.buffer == "arg0" and not scheduled.steps
        assert arg.stride == expected.stride() and arg.offset == expected.storage_offset()
    else:
        assert arg.buffer == "buf0" and arg.stride == (1, 2) and len(scheduled.steps) == 1


def test_non_contiguous_inputs_keep_their_strides():
    base = torch.randn(12, 20)
    x = base.t()[3:, ::2]  # (17, 6), strides (1, 40), storage offset 3
    y = torch.randn(6, 17).t()
    lowered = lower(trace_prims(lambda x, y: p.mul(x, y), x, y), [x, y])
    assert lowered.inputs[0].stride == (1, 40) and lowered.inputs[1].stride == (1, 17)
    compile_and_run(lambda x, y: p.add(p.mul(x, y), p.sin(x)), x, y)


def test_full_and_iota_one_hot_nll_loss():
    """nll_loss(log_probs, target) without gathers: iota == target -> where -> sum."""
    logp, target = torch.randn(5, 7).log_softmax(1), torch.tensor([0, 6, 3, 3, 1])

    def f(logp, target):
        classes = p.broadcast_in_dim(p.iota(7, torch.int64, "cpu"), (5, 7), (1,))
        mask = p.eq(classes, p.broadcast_in_dim(target, (5, 7), (0,)))
        picked = p.where(mask, logp, 0.0)
        per_sample = p.neg(p.sum(picked, [1]))
        weights = p.convert_element_type(p.sum(mask, [1]), torch.float32)  # 1 per row
        return p.div(p.sum(per_sample, [0]), p.sum(weights, [0])), p.sum(mask, [1])

    compile_and_run(f, logp, target)
    loss, counts = f(logp, target)
    torch.testing.assert_close(loss, torch.nn.functional.nll_loss(logp, target))
    assert counts.dtype == torch.int64  # sum of bool accumulates in int64, like eager


def test_full_constant_output_and_int_arithmetic():
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    f = lambda x: (
        p.full((2, 3), 1.5, torch.float32, "cpu"),
        p.div(p.mul(x, 3), p.add(x, 1)),  # true division of ints gives floats
        p.ge(p.sum(x, [0]), 10),
    )
    compile_and_run(f, x)


def test_extern_mm_between_pointwise_ops_reads_transpose_without_copy():
    x, w = torch.randn(4, 8), torch.randn(5, 8)

    def f(x, w):
        h = extern(aten.mm.default, p.sin(x), p.permute(w, [1, 0]))  # sin(x) @ w.T
        return p.maximum(h, 0.0)

    scheduled = compile_and_run(f, x, w)
    kinds = [type(s).__name__ for s in scheduled.steps]
    assert kinds == ["Kernel", "ExternKernel", "Kernel"]
    mm = scheduled.steps[1]
    assert mm.kernel == "aten.mm.default" and not mm.fallback
    assert mm.args == (ir.TensorArg("buf0", (4, 8), (8, 1)), ir.TensorArg("arg1", (8, 5), (1, 8)))
    assert (mm.size, mm.stride) == ((4, 5), (5, 1))


def test_other_aten_ops_are_visible_fallbacks():
    x = torch.randn(4, 6)
    f = lambda x: p.exp(extern(aten.cumsum.default, p.sin(x), 1))
    scheduled = compile_and_run(f, x)
    [ext] = [s for s in scheduled.steps if isinstance(s, ir.ExternKernel)]
    assert ext.kernel == "aten.cumsum.default" and ext.fallback


def test_unsupported_dtype_falls_back_to_the_prim_reference():
    z = torch.randn(4, dtype=torch.complex64)
    scheduled = compile_and_run(lambda z: p.mul(p.add(z, z), z), z)
    assert [s.kernel for s in scheduled.steps] == ["toycomp.prims.add", "toycomp.prims.mul"]
    assert all(s.fallback for s in scheduled.steps)


def test_unknown_target_raises_naming_the_op():
    g = Graph()
    x = g.placeholder("x")
    g.output((g.call_function(operator.getitem, (x, 0)),))
    with pytest.raises(LoweringError, match="getitem"):
        lower(GraphModule(torch.nn.Module(), g), [torch.randn(3, 4)])


def test_multi_user_big_value_is_realized_small_one_inlined():
    x = torch.randn(64)

    def big(v):
        for _ in range(REALIZE_THRESHOLD):
            v = p.sin(v)
        return v

    def f(x):
        s, b = p.sin(x), big(x)
        return p.add(p.mul(s, s), b), p.mul(p.cos(s), b)

    lowered = lower(trace_prims(f, x), [x])
    bodies = [repr(n.body) for n in lowered.nodes]
    assert len(lowered.nodes) == 3 and bodies[0].count("sin") == REALIZE_THRESHOLD
    assert all("load(buf0" in b for b in bodies[1:])
    scheduled = compile_and_run(f, x)
    assert len(kernels(scheduled)) == 1
    assert [a.name for a in scheduled.allocations] == ["buf1", "buf2"]


def test_a_value_reading_many_buffers_is_realized_once_for_its_users():
    inputs = [torch.randn(8, 16) for _ in range(REALIZE_READS_THRESHOLD + 1)]

    def f(*xs):  # a residual stream: the sum of every earlier output, used twice
        s = xs[0]
        for x in xs[1:]:
            s = p.add(s, x)
        return p.sum(s, [0]), p.exp(s)

    lowered = lower(trace_prims(f, *inputs), inputs)
    [pointwise] = [n for n in lowered.nodes if isinstance(n, ir.Pointwise) and "add" in repr(n.body)]
    users = [n for n in lowered.nodes if n is not pointwise]
    assert all(f"load({pointwise.name}" in repr(n.body) and "arg1" not in repr(n.body) for n in users)
    compile_and_run(f, *inputs)


def test_a_value_reading_few_buffers_is_inlined_into_its_users():
    inputs = [torch.randn(8, 16) for _ in range(REALIZE_READS_THRESHOLD)]

    def f(*xs):
        s = xs[0]
        for x in xs[1:]:
            s = p.add(s, x)
        return p.sum(s, [0]), p.exp(s)

    lowered = lower(trace_prims(f, *inputs), inputs)
    assert all("arg1" in repr(n.body) for n in lowered.nodes)  # each user reads the inputs


@pytest.mark.parametrize("view", ["permute", "reshape"])
def test_an_extern_reading_a_view_of_a_saved_value_stores_the_value_once(view):
    x, w = torch.randn(6, 4), torch.randn(6, 5)

    def f(x, w):
        y = p.mul(p.sin(x), 2.0)  # used by mm through a view, and returned (saved)
        v = p.permute(y, [1, 0]) if view == "permute" else p.reshape(y, [4, 6])
        return extern(aten.mm.default, v, w), y

    scheduled = compile_and_run(f, x, w)
    stores = [s for k in kernels(scheduled) for loop in k.loops for s in loop.body]
    assert len(stores) == 1  # y once; the mm reads it through a strided view
    [mm] = [s for s in scheduled.steps if isinstance(s, ir.ExternKernel)]
    assert mm.args[0].buffer == stores[0].buffer


def test_a_value_already_in_memory_is_not_stored_again_through_its_views():
    x, w = torch.randn(6, 8), torch.randn(6, 5)

    def f(x, w):  # qkv = x * 2 (two users: two slices); q: read by mm and returned
        qkv = p.mul(x, 2.0)
        q = p.permute(p.slice(qkv, 1, 0, 4), [1, 0])
        k = p.slice(qkv, 1, 4, 8)
        return extern(aten.mm.default, p.reshape(q, [4, 6]), w), q, p.exp(k)

    scheduled = compile_and_run(f, x, w)
    stored = [s.buffer for k in kernels(scheduled) for loop in k.loops for s in loop.body]
    assert len(stored) == 2  # q once (for the mm and as an output), exp(k); never all of qkv


def test_reduction_over_size_one_dims_is_a_view():
    x = torch.randn(4, 1, 5, dtype=torch.float64)
    lowered = lower(trace_prims(lambda x: p.exp(p.amax(x, [1])), x), [x])
    assert [type(n).__name__ for n in lowered.nodes] == ["Pointwise"]
    compile_and_run(lambda x: (p.exp(p.amax(x, [1])), p.sum(x, [])), x)


def test_extern_output_stride_comes_from_meta_val_and_origins_are_prims_nodes():
    x = torch.randn(4, 6)
    gm = trace_prims(lambda x: p.exp(extern(aten.t.default, p.sin(x))), x)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.meta["aten_origin"] = f"aten_{node.name}"
        if node.target == aten.t.default:  # pretend AOT recorded a contiguous result
            node.meta["val"] = torch.empty(6, 4, device="meta")
    lowered = lower(gm, [x])
    ext = lowered.nodes[1]
    assert (ext.size, ext.stride, ext.fallback) == ((6, 4), (4, 1), True)
    # origins name the prims graph's nodes (what viz boxes), not their ATen origins
    assert ext.origins == ("t_default",) and lowered.nodes[2].origins == ("exp",)
    scheduled = schedule(lowered)
    assert [k.origins for k in kernels(scheduled)] == [("sin",), ("exp",)]
    torch.testing.assert_close(run_scheduled(scheduled, [x])[0], torch.exp(torch.sin(x).t()))


def test_creation_only_graph():
    f = lambda: p.mul(p.convert_element_type(p.iota(5, torch.int32, "cpu"), torch.float32), 0.5)
    lowered = lower(trace_prims(f), [])
    assert lowered.device == torch.device("cpu") and lowered.inputs == ()
    torch.testing.assert_close(run_scheduled(schedule(lowered), [])[0], torch.arange(5) * 0.5)


# --- graph constants and multi-output externs, end to end -----------------------------------------
BACKENDS = ["cpp", "triton"]


def _grads(fn, *inputs):
    """Outputs of ``fn`` and the gradients of sum(first output * tangent) w.r.t. ``inputs``."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    tangent = torch.randn(outs[0].shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((outs[0] * tangent).sum(), inputs)
    return [o.detach() for o in outs], list(grads)


def _check_compiled(fn, backend, *inputs):
    import toycomp

    compiled = toycomp.compile(fn, backend=backend)
    for got, want in zip(_grads(compiled, *inputs), _grads(fn, *inputs), strict=True):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    return compiled


def constant_graph(with_view: bool) -> tuple[torch.nn.Module, Graph]:
    """A graph whose constant ``c`` is read by an extern (mm) and a kernel, and returned (and,
    ``with_view``, returned transposed too)."""
    root = torch.nn.Module()
    root.c = torch.randn(6, 3)
    g = Graph()
    x, c = g.placeholder("x"), g.get_attr("c")
    mm = g.call_function(aten.mm.default, (x, c))
    rows = g.call_function(p.slice, (c, 0, 0, 4))
    out = g.call_function(p.add, (mm, g.call_function(p.exp, (rows,))))
    extra = (g.call_function(p.permute, (c, [1, 0])),) if with_view else ()
    g.output((out, c, *extra))
    return root, g


def test_get_attr_lowers_to_a_constant_buffer_read_by_kernels_and_externs():
    from toycomp.inductor.wrapper import compile_graph

    root, g = constant_graph(with_view=False)
    x_val = torch.randn(4, 6)
    lowered = lower(GraphModule(root, g), [x_val])
    assert [(k.name, k.size) for k in lowered.constants] == [("c", (6, 3))]
    assert lowered.inputs == (ir.InputBuffer("x", (4, 6), (6, 1), torch.float32),)
    expected = (x_val @ root.c + root.c[:4].exp(), root.c)
    for backend in BACKENDS:
        compiled = compile_graph(schedule(lowered), backend)
        first = compiled([x_val])
        for got, want in zip(first, expected, strict=True):
            torch.testing.assert_close(got, want)
        first[1].add_(1.0)  # the caller owns returned tensors: the constant must not change
        torch.testing.assert_close(compiled([x_val])[1], root.c)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_constants_in_compiled_functions(backend):
    x = torch.randn(4, 2)
    _check_compiled(lambda x: (x * 2, torch.tensor([1.0, 2.0])), backend, x)
    _check_compiled(lambda x: x + torch.tensor(2.0), backend, x)
    _check_compiled(lambda x: (x @ torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sin(), backend, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_output_fallback_runs_visibly(backend):
    x = torch.randn(5, 7)

    def fn(x):
        values, indices = torch.max(x.sin(), 1)
        ordered, order = torch.sort(x, dim=0)
        return values * 2 + ordered[:, 0], indices, order.t()

    import toycomp

    compiled = toycomp.compile(fn, backend=backend)
    with torch.no_grad():
        got, want = compiled(x), fn(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    (forward,) = compiled.entries[0].graphs
    assert forward.fallbacks == ["aten.max.dim", "aten.sort.default"]
    externs = [s for s in forward.scheduled.steps if isinstance(s, ir.ExternKernel)]
    assert [len(e.outputs) for e in externs] == [2, 2] and all(e.fallback for e in externs)
    assert "buf1_0 = check_extern(buf1[0]" in forward.compiled.wrapper_source


# --- the interpreter knows graph constants and multi-output externs -------------------------------
def _run_both(lowered, inputs, expected):
    """run_lowered and run_scheduled on ``inputs`` agree with eager's ``expected`` outputs."""
    for outs in (run_lowered(lowered, inputs), run_scheduled(schedule(lowered), inputs)):
        assert len(outs) == len(expected)
        for got, want in zip(outs, expected, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_interpreter_binds_graph_constants():
    root, g = constant_graph(with_view=True)
    x_val = torch.randn(4, 6)
    lowered = lower(GraphModule(root, g), [x_val])
    assert [k.name for k in lowered.constants] == ["c"]
    expected = (x_val @ root.c + root.c[:4].exp(), root.c, root.c.t())
    _run_both(lowered, [x_val], expected)
    returned = run_lowered(lowered, [x_val])[1]
    returned.add_(1.0)  # the caller owns returned tensors: the constant must not change
    torch.testing.assert_close(lowered.constants[0].value, root.c)
    torch.testing.assert_close(run_scheduled(schedule(lowered), [x_val])[1], root.c)


def _max_and_sort_graph(use_values: bool) -> GraphModule:
    """values, indices = max(sin(x), 1); ordered, order = sort(x, 0); outputs built from them."""
    g = Graph()
    x = g.placeholder("x")
    mx = g.call_function(aten.max.dim, (g.call_function(p.sin, (x,)), 1))
    indices = g.call_function(operator.getitem, (mx, 1))
    srt = g.call_function(aten.sort.default, (x, 0))
    order = g.call_function(p.permute, (g.call_function(operator.getitem, (srt, 1)), [1, 0]))
    ordered = g.call_function(operator.getitem, (srt, 0))
    first_col = g.call_function(p.slice, (ordered, 1, 0, 1))  # (5, 1)
    if use_values:
        values = g.call_function(operator.getitem, (mx, 0))
        scaled = g.call_function(p.mul, (values, 2.0))  # (5,)
        col = g.call_function(p.reshape, (first_col, [5]))
        g.output((g.call_function(p.add, (scaled, col)), indices, order))
    else:
        g.output((indices, order, first_col))
    return GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("use_values", [True, False])
def test_interpreter_runs_multi_output_fallbacks(use_values):
    x = torch.randn(5, 7)
    lowered = lower(_max_and_sort_graph(use_values), [x])
    externs = [n for n in lowered.nodes if isinstance(n, ir.ExternKernel)]
    assert [e.kernel for e in externs] == ["aten.max.dim", "aten.sort.default"]
    assert all(e.fallback for e in externs)
    # an element nobody reads gets no buffer (max's values, when unused): never checked
    read = [[o.index for o in e.outputs] for e in externs]
    assert read == ([[0, 1], [0, 1]] if use_values else [[1], [0, 1]])
    values, indices = torch.max(x.sin(), 1)
    ordered, order = torch.sort(x, 0)
    if use_values:
        expected = (values * 2 + ordered[:, 0], indices, order.t())
    else:
        expected = (indices, order.t(), ordered[:, :1])
    _run_both(lowered, [x], expected)
