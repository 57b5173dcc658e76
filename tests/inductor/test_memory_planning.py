"""Memory planning (toycomp/inductor/opt/memory_planning.py): reuse, in place, matmuls with out=.

Eager PyTorch is the oracle: every graph where a buffer is (or must not be) reused is run and
compared with eager, on both backends (Triton through its interpreter on CPU tensors). A reuse
that is not safe overwrites a value that is still read or returned, so the comparison fails.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import toycomp
import toycomp.pipeline as pipeline
from benchmarks.timing import cpu_peak_memory_bytes
from toycomp.inductor import wrapper
from toycomp.inductor.opt import memory_planning
from toycomp.inductor.ir import (
    AllocatedBuffer,
    Constant,
    ExternKernel,
    InputBuffer,
    Kernel,
    Load,
    Loop,
    Op,
    ScheduledGraph,
    Store,
    TensorArg,
)
from toycomp.inductor.indexing import x
from toycomp.inductor.lowering import lower
from toycomp.inductor.scheduler import schedule
from toycomp.prims.decompositions import decompose

F32 = torch.float32
BACKENDS = ["cpp", "triton"]
aten = torch.ops.aten


def check(got, want):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def compile_aten(fn, inputs, backend, memory_planning=True):
    """An ATen-level function through stages 3-4, as the pipeline compiles a graph."""
    gm = torch.fx.symbolic_trace(fn)
    scheduled = schedule(lower(decompose(gm, inputs), inputs))
    return wrapper.compile_graph(scheduled, backend, memory_planning)


def reuse_lines(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if "# reuse" in line]


# --- reuse happens, and the values stay eager's ----------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_matmul_result_is_reused(backend):
    """a@w@w@w: the first product is dead once the second is computed, so the third writes
    into it (``out=``), instead of a fresh allocation."""
    a, w = torch.randn(8, 16), torch.randn(16, 16) / 4

    def f(a, w):
        return aten.mm.default(aten.mm.default(aten.mm.default(a, w), w), w)

    compiled = compile_aten(f, [a, w], backend)
    (got,) = compiled([a, w])
    check(got, a @ w @ w @ w)
    source = compiled.wrapper_source
    assert "buf2 = buf0; del buf0  # reuse" in source, source
    assert "aten.mm.out(buf1, w, out=buf2)" in source, source
    assert "aten.mm.default" not in source


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_step_in_place(backend):
    """An MLP training step: values and gradients are eager's, and both wrappers write the
    GELU (forward) and its gradient (backward) over the matmul they read."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    inp, target = torch.randn(32, 16, requires_grad=True), torch.randn(32, 8)

    def loss_fn(inp):
        return torch.nn.functional.mse_loss(model(inp), target)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        inp.grad = None
        loss = fn(inp)
        loss.backward()
        return [loss.detach(), inp.grad, *(p.grad for p in model.parameters())]

    for got, want in zip(grads(toycomp.compile(loss_fn, backend=backend)), grads(loss_fn)):
        check(got, want)
    explanation = toycomp.explain(loss_fn, inp, backend=backend)
    for graph in explanation.entry.graphs:
        source = graph.compiled.wrapper_source
        assert any(line.endswith("# reuse in place") for line in reuse_lines(source)), source


def test_no_kernel_writes_in_place_on_cuda():
    """On CUDA the plan reuses buffers but never writes in place (slower there: see the
    Note); the same graph's plan for the CPU does write in place."""
    def fn(a, w):
        return aten.gelu.default(aten.mm.default(a, w))

    a, w = torch.randn(8, 16), torch.randn(16, 32)
    gm = torch.fx.symbolic_trace(fn)
    scheduled = schedule(lower(decompose(gm, [a, w]), [a, w]))
    keep = {b.name for b in scheduled.inputs}
    last = memory_planning.last_uses(scheduled, keep)
    in_place_lines = {
        allowed: [
            line
            for before in memory_planning.plan_memory(scheduled, last, True, allowed).before
            for line in before
            if getattr(line, "in_place", False)
        ]
        for allowed in (True, False)
    }
    assert in_place_lines[True] and not in_place_lines[False]
    cuda_graph = dataclasses.replace(scheduled, device=torch.device("cuda"))
    kernels = [wrapper.triton.generate(k) for k in cuda_graph.steps if isinstance(k, Kernel)]
    source = wrapper.WrapperCodegen(cuda_graph, kernels).generate()
    assert "in place" not in source and "aten.mm.out" in source, source


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_shapes_reuse_equal_size_expressions(backend):
    """With a symbolic batch the buffers are (s0, 16): the third product reuses the first,
    whose size expression is the same, for every batch size of one compiled graph."""
    w = torch.randn(16, 16) / 4

    def f(a):
        return ((a @ w) @ w) @ w

    compiled = toycomp.compile(f, backend=backend, dynamic=True)
    for batch in (8, 5, 11):
        a = torch.randn(batch, 16)
        check(compiled(a), f(a))
    assert compiled.compile_count == 1
    explanation = toycomp.explain(f, torch.randn(8, 16), backend=backend, dynamic=True)
    (graph,) = explanation.entry.graphs
    source = graph.compiled.wrapper_source
    assert "empty_strided((s0, 16)" in source, source
    assert any(line.endswith("; del buf0  # reuse") for line in reuse_lines(source)), source


# --- reuse that would be wrong is not done ----------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_buffer_read_later_is_not_reused(backend):
    """``y1`` is read by the last step: the third product must not take its memory."""
    a, w = torch.randn(8, 16), torch.randn(16, 16) / 4

    def f(a, w):
        y1 = aten.mm.default(a, w)
        y3 = aten.mm.default(aten.mm.default(y1, w), w)
        return aten.add.Tensor(y3, y1)

    compiled = compile_aten(f, [a, w], backend)
    (got,) = compiled([a, w])
    check(got, a @ w @ w @ w + a @ w)
    assert not any(line.endswith("del buf0  # reuse") for line in reuse_lines(
        compiled.wrapper_source))  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_is_not_reused(backend):
    """``y1`` is returned: a later buffer of its size must not be written into it."""
    a, w = torch.randn(8, 16), torch.randn(16, 16) / 4

    def f(a, w):
        y1 = aten.mm.default(a, w)
        return y1, aten.mm.default(aten.mm.default(y1, w), w)

    got = compile_aten(f, [a, w], backend)([a, w])
    check(got[0], a @ w)
    check(got[1], a @ w @ w @ w)


def alias_graph() -> ScheduledGraph:
    """buf0 = sin(a); buf1 = aten.alias(buf0) (a view of buf0: buf0's name is dead after it);
    buf2 = 3*cos(a); buf3 = buf1 + buf2 (three kernels). Returns buf3 and buf2."""
    size, stride = (4, 8), (8, 1)
    load_a = Load("a", x, F32)

    def kernel(name, out, value, reads):
        dtypes = tuple((b, F32) for b in (*reads, *out))
        stores = tuple(Store(b, x, v) for b, v in zip(out, value))
        return Kernel(name, 32, 1, (Loop(False, stores),), dtypes, (name,))

    sin = kernel("kernel_0", ["buf0"], [Op("sin", (load_a,), F32)], ["a"])
    alias = ExternKernel("buf1", "aten.alias.default", (TensorArg("buf0", size, stride),), (),
                         size, stride, F32, fallback=True, origins=("alias",))  # fmt: skip
    cos3 = Op("mul", (Op("cos", (load_a,), F32), Constant(3.0, F32)), F32)
    cos = kernel("kernel_1", ["buf2"], [cos3], ["a"])
    add = Op("add", (Load("buf1", x, F32), Load("buf2", x, F32)), F32)
    last = kernel("kernel_2", ["buf3"], [add], ["buf1", "buf2"])
    return ScheduledGraph(
        inputs=(InputBuffer("a", size, stride, F32),),
        allocations=tuple(AllocatedBuffer(n, size, stride, F32) for n in ("buf0", "buf2", "buf3")),
        steps=(sin, alias, cos, last),
        outputs=(TensorArg("buf3", size, stride), TensorArg("buf2", size, stride)),
        device=torch.device("cpu"),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffer_behind_a_view_is_not_reused(backend, monkeypatch):
    """``buf1`` (an extern's result) is a view of ``buf0``: ``buf0``'s name dies at the extern,
    its memory does not. Reusing it for ``buf2`` would overwrite what ``buf1`` shows (the
    second half of the test turns the rule off and sees exactly that)."""
    a = torch.randn(4, 8)
    want = [torch.sin(a) + 3 * torch.cos(a), 3 * torch.cos(a)]
    compiled = wrapper.compile_graph(alias_graph(), backend)
    for got, expected in zip(compiled([a]), want):
        check(got, expected)
    assert not reuse_lines(compiled.wrapper_source), compiled.wrapper_source

    monkeypatch.setattr(memory_planning, "_maybe_aliased", lambda graph: set())
    unsafe = wrapper.compile_graph(alias_graph(), backend)
    assert "buf2 = buf0; del buf0  # reuse" in unsafe.wrapper_source
    assert not torch.allclose(unsafe([a])[0], want[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_in_place_when_read_at_another_index(backend):
    """out[i, j] = y[j, i] + y[i, j] reads ``y`` at two indices: writing ``out`` over ``y``
    would let an early element's store change a later element's load."""
    a = torch.randn(8, 8)

    def f(a):
        y = aten.mm.default(a, a)
        return aten.add.Tensor(aten.permute.default(y, [1, 0]), y)

    compiled = compile_aten(f, [a], backend)
    (got,) = compiled([a])
    check(got, (a @ a).T + a @ a)
    assert "in place" not in compiled.wrapper_source, compiled.wrapper_source


def test_non_contiguous_matmul_result_keeps_the_default_call():
    """``out=`` only where the planned strides are the contiguous ones ``mm.out`` gives."""
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    mm = ExternKernel("buf0", "aten.mm.default", (TensorArg("a", (8, 16), (16, 1)),
                      TensorArg("b", (16, 4), (4, 1))), (), (8, 4), (1, 8), F32, False)  # fmt: skip
    graph = ScheduledGraph(
        inputs=(InputBuffer("a", (8, 16), (16, 1), F32), InputBuffer("b", (16, 4), (4, 1), F32)),
        allocations=(),
        steps=(mm,),
        outputs=(TensorArg("buf0", (8, 4), (1, 8)),),
        device=torch.device("cpu"),
    )
    compiled = wrapper.compile_graph(graph, "cpp")
    (got,) = compiled([a, b])
    check(got, a @ b)
    assert got.stride() == (1, 8)
    assert "aten.mm.default(a, b)" in compiled.wrapper_source


# --- the plan lowers the peak of a training step ----------------------------------------------
def test_training_step_peak_is_lower_than_unplanned(monkeypatch):
    """A wide-batch MLP step (the activations dominate): the planned wrapper's peak, measured
    with the benchmark's CPU peak-memory function, is below the unplanned one's by at least
    one (batch, hidden) buffer."""
    torch.manual_seed(0)
    batch, hidden = 2048, 256
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.GELU(),
                                torch.nn.Linear(hidden, 16))  # fmt: skip
    inp, grad = torch.randn(batch, 16), torch.randn(batch, 16)

    def peak(memory_planning: bool) -> int:
        plain = functools.partial(wrapper.compile_graph, memory_planning=memory_planning)
        monkeypatch.setattr(pipeline, "compile_graph", plain)
        compiled = toycomp.compile(model, backend="cpp")

        def step():
            model.zero_grad(set_to_none=True)
            compiled(inp).backward(grad)

        step()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        model(inp).backward(grad)
        for g, p in zip(got, model.parameters()):
            check(g, p.grad)
        step()
        return min(cpu_peak_memory_bytes(step) for _ in range(2))

    planned, unplanned = peak(True), peak(False)
    one_buffer = batch * hidden * 4  # less 1%: the two peaks fall a weight gradient apart
    assert unplanned - planned >= 0.99 * one_buffer, (planned, unplanned)


def test_backward_frees_saved_values_yet_retain_graph_works():
    """The backward wrapper deletes each saved value after its last use (``args.clear()``,
    then ``del``); with ``retain_graph=True`` autograd keeps them, so a second backward
    gives eager's gradients again (accumulated), and without it a second backward fails as
    eager's does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    inp = torch.randn(16, 8)
    explanation = toycomp.explain(model, inp, backend="cpp")
    backward = [g for g in explanation.entry.graphs if g.name == "backward"][0]
    source = backward.compiled.wrapper_source
    assert "args.clear()" in source and "addmm" in source.split("args.clear()")[1], source
    assert any(line.strip().startswith("del ") and "addmm" in line
               for line in source.splitlines()), source  # fmt: skip

    def twice(fn, retain):
        model.zero_grad(set_to_none=True)
        out = fn(inp).square().sum()
        out.backward(retain_graph=retain)
        out.backward()
        return [p.grad for p in model.parameters()]

    for got, want in zip(twice(toycomp.compile(model, backend="cpp"), True), twice(model, True)):
        check(got, want)
    with pytest.raises(RuntimeError, match="second time"):
        twice(model, False)
    with pytest.raises(RuntimeError, match="second time"):
        twice(toycomp.compile(model, backend="cpp"), False)
