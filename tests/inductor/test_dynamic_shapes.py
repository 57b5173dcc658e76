"""Stages 3-4 with dynamic shapes (issue 8): one symbolic compile serves every size.

The graphs come from PyTorch itself, so these tests do not depend on toycomp's capture: Dynamo
(``torch.compile(dynamic=True)``) and AOTAutograd (``aot_module_simplified``) hand toycomp's
stages 3-4 (``decompose``, ``lower``, ``schedule``, ``compile_graph``) ATen graphs whose inputs
are fake tensors with SymInt sizes and SymInt placeholders. Eager PyTorch is the oracle for
values and gradients; every test runs on the C++ backend and on Triton's interpreter.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_module_simplified
from torch.fx.experimental.proxy_tensor import make_fx

from toycomp.inductor import ir
from toycomp.inductor.codegen import cpp, triton
from toycomp.inductor.interpret import run_lowered, run_scheduled
from toycomp.inductor.lowering import lower
from toycomp.inductor.scheduler import schedule
from toycomp.inductor.wrapper import CompiledGraph, compile_graph
from toycomp.prims.decompositions import decompose, fallbacks

RTOL, ATOL = 1e-4, 1e-5
BACKENDS = ["cpp", "triton"]
BATCH_SIZES = list(range(2, 65))
random.Random(0).shuffle(BATCH_SIZES)


@dataclass
class Compiled:
    """What stages 3-4 made of one graph that AOT handed over."""

    name: str
    prims: torch.fx.GraphModule
    lowered: ir.LoweredGraph
    scheduled: ir.ScheduledGraph
    compiled: CompiledGraph

    def kernels(self) -> list[ir.Kernel]:
        return [s for s in self.scheduled.steps if isinstance(s, ir.Kernel)]


def stages_3_4(backend: str, name: str, record: list[Compiled]):
    """An AOT compiler running toycomp's decompose, lower, schedule and compile_graph."""

    def compiler(gm, example_inputs):
        prims_gm = decompose(gm, example_inputs)
        assert fallbacks(prims_gm) == [], fallbacks(prims_gm)
        lowered = lower(prims_gm, example_inputs)
        scheduled = schedule(lowered)
        compiled = compile_graph(scheduled, backend)
        compiled._boxed_call = True  # AOT calls it with the list of inputs
        record.append(Compiled(name, prims_gm, lowered, scheduled, compiled))
        return compiled

    return compiler


def compile_dynamic(fn, backend: str, record: list[Compiled], dynamic: bool | None = True):
    """``torch.compile(fn, dynamic=True)`` with stages 3-4 of toycomp as AOT's compilers
    (``dynamic=None``: only the dims marked with ``torch._dynamo.mark_dynamic`` are symbols)."""

    def dynamo_backend(gm, example_inputs):
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=stages_3_4(backend, "forward", record),
            bw_compiler=stages_3_4(backend, "backward", record),
        )

    torch._dynamo.reset()
    return torch.compile(fn, backend=dynamo_backend, dynamic=dynamic)


def values_and_grads(fn, *inputs, mark_batch=False):
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    if mark_batch:
        torch._dynamo.mark_dynamic(inputs[0], 0)
    out = fn(*inputs)
    tangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * tangent).sum().backward()
    return out.detach(), [t.grad for t in inputs if t.requires_grad]


def check_against_eager(fn, compiled, *inputs, mark_batch=False):
    out, grads = values_and_grads(compiled, *inputs, mark_batch=mark_batch)
    out_ref, grads_ref = values_and_grads(fn, *inputs)
    torch.testing.assert_close(out, out_ref, rtol=RTOL, atol=ATOL)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=RTOL, atol=ATOL)


def run_sizes(fn, make_inputs, backend, sizes, batch_only=False):
    """Compile ``fn`` once with dynamic shapes, call it for each size; return the record.
    ``batch_only``: only dim 0 of the first input is a symbol (``mark_dynamic``)."""
    record: list[Compiled] = []
    compiled = compile_dynamic(fn, backend, record, None if batch_only else True)
    for n in sizes:
        check_against_eager(fn, compiled, *make_inputs(n), mark_batch=batch_only)
    return record


def sin2_cos2(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def symbolic(record: list[Compiled]) -> bool:
    return all(k.size_symbols() for c in record for k in c.kernels())


# --- the running example and the MLP training step: batch sizes 2..64, one compile --------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_running_example_one_compile_for_batch_sizes_2_to_64(backend):
    record = run_sizes(sin2_cos2, lambda n: [torch.randn(n, 3)], backend, BATCH_SIZES)
    assert [c.name for c in record] == ["forward", "backward"]
    assert symbolic(record)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_training_step_one_compile_for_batch_sizes_2_to_64(backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)
    )
    loss_fn = lambda x, t: F.cross_entropy(model(x), t)  # noqa: E731
    record: list[Compiled] = []
    compiled = compile_dynamic(loss_fn, backend, record)
    for n in BATCH_SIZES:
        x, t = torch.randn(n, 64), torch.randint(0, 10, (n,))
        grads = []
        for fn in (compiled, loss_fn):
            model.zero_grad(set_to_none=True)
            loss = fn(x, t)
            loss.backward()
            grads.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
        for got, want in zip(*grads, strict=True):
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert [c.name for c in record] == ["forward", "backward"]
    assert any(k.size_symbols() for c in record for k in c.kernels())


# --- what symbolic kernels look like ---------------------------------------------------------
def test_kernels_take_sizes_as_arguments():
    """The kernel of ``x * 2`` on an (s0, 4) tensor: numel 4*s0 in its repr, a C++ loop bound
    and a Triton mask from the argument s0, and no concrete size anywhere in the source."""
    record = run_sizes(lambda x: x * 2, lambda n: [torch.randn(n, 4)], "cpp", [37, 5], True)
    (kernel,) = record[0].kernels()
    assert re.match(r"kernel_0\(numel=4\*s0, rnumel=1\)", repr(kernel)), repr(kernel)
    source = cpp.generate(kernel).source.split('extern "C"')[-1]
    print(source)
    assert "const int64_t s0" in source and "xindex < 4*s0" in source
    generated = triton.generate(kernel)
    print(generated.source.split("@triton.jit")[-1], generated.call, sep="\n")
    signature = "def kernel_0(in_ptr0, out_ptr0, s0, xnumel, XBLOCK: tl.constexpr, INDEX_INT64"
    assert signature in generated.source and "cdiv(4*s0, 1024)" in generated.call
    # 32-bit indices unless this call's sizes need 64: decided by the wrapper, per call
    int64 = re.search(r"INDEX_INT64=(.*?), XBLOCK", generated.call).group(1)
    assert eval(int64, {"s0": 37}) is False and eval(int64, {"s0": 2**29}) is True
    for text in (source, generated.source, record[0].compiled.wrapper_source):
        assert "37" not in text  # the example size is nowhere: one source for every size
    assert "s0 = " in record[0].compiled.wrapper_source


def test_static_graphs_have_no_size_arguments():
    x = torch.randn(6, 4)
    gm = make_fx(sin2_cos2)(x)
    (kernel,) = [s for s in schedule(lower(decompose(gm, [x]), [x])).steps]
    assert kernel.size_symbols() == () and kernel.numel == 24
    assert "int64_t s" not in cpp.generate(kernel).source


# --- shapes: shared symbols, reductions, views, broadcasting ---------------------------------
CASES = {
    # two dims that share one symbol: x is square
    "square_transpose": (lambda x: torch.sin(x) * x.t() + x.sum(0), lambda n: [torch.randn(n, n)]),
    # reductions over the symbolic dim
    "softmax_over_batch": (lambda x: torch.softmax(x, 0), lambda n: [torch.randn(n, 6)]),
    "softmax_rows": (lambda x: torch.softmax(x * 3, -1), lambda n: [torch.randn(6, n)]),
    "sum_dim0": (lambda x: x.sum(0) + 1, lambda n: [torch.randn(n, 8)]),
    "mean_all": (lambda x: (x * x).mean(), lambda n: [torch.randn(n, 3)]),
    "layer_norm": (
        lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
        lambda n: [torch.randn(4, n), torch.randn(n), torch.randn(n)],
    ),
    "layer_norm_static_width": (
        lambda x: F.layer_norm(x, (16,)) * 2,
        lambda n: [torch.randn(n, 16)],
    ),
    # views with symbolic sizes (the first: only the batch dim is a symbol, see BATCH_ONLY)
    "view_times_4": (
        lambda x: torch.softmax(x.view(x.shape[0] * 4, -1), -1),
        lambda n: [torch.randn(n, 12)],
    ),
    "reshape_to_swapped_sizes": (  # (s0, s1) -> (s0*s1,) -> (s1, s0): indices // s0, % s0
        lambda x: x.reshape(x.shape[0] * x.shape[1]).sin().reshape(x.shape[1], x.shape[0]).sum(0),
        lambda n: [torch.randn(n + 1, 2 * n)],
    ),
    "flatten_and_split": (
        lambda x: x.reshape(-1).cos().view(x.shape[0], 3, 4).sum(1),
        lambda n: [torch.randn(n, 12)],
    ),
    # broadcasting a symbolic dim against a static one
    "broadcast_bias": (
        lambda x, b: torch.tanh(x + b),
        lambda n: [torch.randn(n, 8), torch.randn(8)],
    ),
    "outer": (
        lambda a, b: a.unsqueeze(1) * b.unsqueeze(0),
        lambda n: [torch.randn(n), torch.randn(7)],
    ),
    # floats made from the sizes (SymFloats: var's 1 / (N - 1), mse's 2 / N), kernel arguments
    "var_std": (
        lambda x: x.var((0, -1)) * x + x.std(0),
        lambda n: [torch.randn(n, 6)],
    ),
    "mse_loss": (
        lambda x, y: F.mse_loss(x, y),
        lambda n: [torch.randn(n, 3), torch.randn(n, 3)],
    ),
    "log_softmax_nll": (
        lambda x, t: F.cross_entropy(x, t),
        lambda n: [torch.randn(n, 7), torch.randint(0, 7, (n,))],
    ),
}


# Only dim 0 of the first input is a symbol (with all dims dynamic, ``view(4*s0, -1)`` of an
# (s0, s1) tensor has the size ``Max(1, s1 // 4)``, which toycomp refuses: the graph would run
# eagerly).
BATCH_ONLY = {"view_times_4"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_shapes_match_eager(case, backend):
    fn, make_inputs = CASES[case]
    record = run_sizes(fn, make_inputs, backend, [5, 3, 17, 2, 64], case in BATCH_ONLY)
    assert [c.name for c in record] == ["forward", "backward"], [c.name for c in record]
    assert any(k.size_symbols() for c in record for k in c.kernels())
    if case in ("var_std", "mse_loss"):  # the scale is a float argument f0, made by the wrapper
        assert any(c.scheduled.scalars for c in record)
        assert any(" = 2" in c.compiled.wrapper_source for c in record)


# --- the IR interpreter and the prims graph run with any size --------------------------------
def test_interpreter_and_prims_graph_run_symbolic_graphs():
    fn = lambda x: torch.softmax(x.view(x.shape[0] * 4, -1), -1).sum(0)  # noqa: E731
    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(8, 12))
    examples = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    prims_gm = decompose(gm, examples)
    lowered = lower(prims_gm, examples)
    scheduled = schedule(lowered)
    assert "numel=4*s0" in repr(scheduled) or "rnumel=4*s0" in repr(scheduled), scheduled
    for n in (3, 8, 21):
        x = torch.randn(n, 12)
        want = fn(x)
        torch.testing.assert_close(prims_gm(x), want, rtol=RTOL, atol=ATOL)
        for run in (run_lowered(lowered, [x]), run_scheduled(scheduled, [x])):
            torch.testing.assert_close(run[0], want, rtol=RTOL, atol=ATOL)


def test_a_broken_size_relation_is_an_error_not_a_wrong_index():
    """Two dims that share s0 must stay equal: the wrapper's input check refuses a call that
    breaks the relation (the caller's shape guards normally recompile before that)."""
    gm = make_fx(lambda x: x + x.t(), tracing_mode="symbolic")(torch.randn(5, 5))
    examples = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    compiled = compile_graph(schedule(lower(decompose(gm, examples), examples)), "cpp")
    x = torch.randn(7, 7)
    torch.testing.assert_close(compiled([x])[0], x + x.t())
    with pytest.raises(ValueError, match="compiled for"):
        compiled([torch.randn(7, 6)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduction_over_a_symbolic_row_fits_both_short_and_long_rows(backend):
    """Triton generates a persistent and a looped variant of a reduction over a symbolic
    rnumel and picks one per call: rows of 37 and of 5000 (> PERSISTENT_MAX_RNUMEL) elements."""
    fn = lambda x: torch.softmax(x, -1)  # noqa: E731
    record = run_sizes(fn, lambda n: [torch.randn(3, n)], backend, [37, 5000, 6])
    assert [c.name for c in record] == ["forward", "backward"]
    if backend == "triton":
        (forward,) = record[0].compiled.kernels
        assert "def kernel_0(" in forward.source and "def kernel_0_looped(" in forward.source
        assert "if s1 <= 4096 else kernel_0_looped" in forward.call, forward.call


# --- [Note: alignment of symbolic sizes] --------------------------------------------------------
def test_alignment_is_the_largest_power_of_two_up_to_16_dividing_a_size():
    from toycomp.inductor.runtime import alignment

    for n in range(0, 300):
        expected = max(a for a in (1, 2, 4, 8, 16) if n % a == 0)
        assert alignment(n) == expected, n


def _triton_version() -> tuple[int, ...]:
    import triton

    return tuple(int(part) for part in triton.__version__.split(".")[:2])


@pytest.mark.skipif(_triton_version() < (3, 9), reason="older interpreters cannot run it forced")
def test_dynamic_triton_kernels_rebuild_sizes_as_visible_multiples(monkeypatch):
    """The kernel takes ``s1_ALIGN`` and rebuilds ``s1`` from it; the wrapper passes the
    alignment on CUDA (1 for the interpreter). Forced on here, the values stay eager's."""
    import toycomp
    import toycomp.inductor.wrapper as wrapper
    from toycomp.inductor.runtime import alignment

    f = lambda x: torch.softmax(x, -1)  # noqa: E731
    kernel = toycomp.explain(f, torch.randn(8, 100), backend="triton", dynamic=True)
    [generated] = kernel.graph("forward").compiled.kernels
    assert "s1 = (s1 // s1_ALIGN) * s1_ALIGN" in generated.source
    assert "s1_ALIGN=alignment(s1)" in generated.call
    assert wrapper._namespace(torch.device("cpu"))["alignment"](1000) == 1
    assert wrapper._namespace(torch.device("cuda"))["alignment"](1000) == 8
    namespace = wrapper._namespace
    monkeypatch.setattr(wrapper, "_namespace", lambda d: {**namespace(d), "alignment": alignment})
    compiled = toycomp.compile(f, backend="triton", dynamic=True)
    for shape in [(8, 1000), (5, 37), (16, 24), (3, 2), (4, 4100)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(compiled(x), f(x))
