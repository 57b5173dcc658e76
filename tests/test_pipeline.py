"""End to end: toycomp.compile, explain, the Dynamo backend and `python -m toycomp`.

Eager PyTorch is the oracle for every value and gradient.
"""

import gc
import random
import subprocess
import sys
import warnings
import weakref
from importlib.metadata import PackageNotFoundError, distribution, entry_points

import pytest
import torch
import torch.nn.functional as F

import toycomp

RTOL, ATOL = 1e-4, 1e-5
CPU_BACKENDS = ["cpp", "triton"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True, params=["fast", "teach"])
def preset(request):
    """Every test runs in both presets (toycomp.config.fast, the default, and teach): both must
    be eager's values, gradients and behaviour."""
    with toycomp.config.patch(**getattr(toycomp.config, request.param)):
        yield request.param


def sin2_cos2(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)
    )


def grads_of(fn, *inputs):
    """Values and input gradients of sum(fn(*inputs) * a fixed random tangent)."""
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*inputs)
    tangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    (out * tangent).sum().backward()
    return out.detach(), [t.grad for t in inputs if t.requires_grad]


def assert_close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)


def run_sin2_cos2(backend, device):
    x = torch.randn(1000, device=device, requires_grad=True)
    compiled = toycomp.compile(sin2_cos2, backend=backend)
    out, (grad,) = grads_of(compiled, x)
    out_ref, (grad_ref,) = grads_of(sin2_cos2, x)
    assert_close(out, out_ref)
    assert_close(grad, grad_ref)
    return compiled


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_sin2_cos2_one_kernel_each_way(backend):
    compiled = run_sin2_cos2(backend, "cpu")
    (entry,) = compiled.entries
    counts = {g.name: len(g.compiled.kernels) for g in entry.graphs}
    assert counts == {"forward": 1, "backward": 1}
    assert all(k.backend == backend for g in entry.graphs for k in g.compiled.kernels)


def mlp_step(model, batch, target, compiled_loss=None):
    model.zero_grad(set_to_none=True)
    loss_fn = compiled_loss or (lambda x, t: F.cross_entropy(model(x), t))
    loss = loss_fn(batch, target)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_mlp_training_step_matches_eager(backend):
    model = make_mlp()
    batch, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss_ref, grads_ref = mlp_step(model, batch, target)
    loss_fn = lambda x, t: F.cross_entropy(model(x), t)  # noqa: E731
    compiled = toycomp.compile(loss_fn, backend=backend)
    loss, grads = mlp_step(model, batch, target, compiled)
    torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=RTOL, atol=ATOL)
    (entry,) = compiled.entries
    for graph in entry.graphs:
        assert graph.fallbacks == [], f"{graph.name} fell back on {graph.fallbacks}"
        externs = [s for s in graph.scheduled.steps if not hasattr(s, "loops")]
        assert externs and all(not s.fallback for s in externs)
        # matmuls, and in the forward the targets' check ([Note: checks that raise as eager does])
        assert {s.kernel for s in externs if "mm" not in s.kernel} <= {
            "toycomp.check_targets.default"}
        assert graph.compiled.kernels, "the non-matmul work must run in toycomp's kernels"


def test_guards_reuse_and_recompile():
    compiled = toycomp.compile(sin2_cos2, backend="cpp")
    for x in (torch.randn(8), torch.randn(8), torch.randn(3, 4), torch.randn(8, dtype=torch.float64)):
        assert_close(compiled(x), sin2_cos2(x))
    assert len(compiled.entries) == 3  # same shape reused; new shape and new dtype recompiled


def test_python_value_guard_recompiles():
    def scale(x, k):
        return x * k if k > 1 else x - k

    compiled = toycomp.compile(scale, backend="cpp")
    x = torch.randn(5)
    for k in (2, 3, 0):
        assert_close(compiled(x, k), scale(x, k))
    assert len(compiled.entries) == 3


def branchy(x):
    if x.sum() > 0:  # branch on a tensor's value: the tracer cannot specialise it
        return x * 2
    return x - 1


def test_graph_break_gives_partial_graphs():
    compiled = toycomp.compile(branchy, backend="cpp")
    x = torch.ones(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for sign in (1, -1, 1):
            assert_close(compiled(sign * x), branchy(sign * x))
    assert compiled.compile_count == 3 and compiled.eager_reason is None  # sum; x * 2; x - 1
    ex = toycomp.explain(branchy, x, backend="cpp")
    assert (ex.graph_count, ex.graph_break_count) == (2, 1)
    (reason,) = ex.break_reasons
    assert "test_pipeline.py:" in reason and "if x.sum() > 0:" in reason
    assert any("__resume_at" in code for code in ex.transformed_code)
    assert len(ex.entries) == 2 and len(ex.kernels) == 2 and ex.guards
    titles = [title for title, _ in ex.sections()]
    assert "4. graph 1: forward kernel_0 (cpp)" in titles and "graph break" in ex.summary()


def test_unsupported_op_falls_back_visibly():
    def f(x):
        return torch.cumsum(torch.sin(x), dim=0) * 2

    x = torch.randn(16, requires_grad=True)
    ex = toycomp.explain(f, x, backend="cpp")
    assert any("cumsum" in op for op in ex.fallbacks)
    assert "cumsum" in str(ex)
    compiled = toycomp.compile(f, backend="cpp")
    with pytest.warns(UserWarning, match=r"toycomp: a graph of .*f calls eager PyTorch for "
                                         r"aten\.cumsum\.default"):  # fmt: skip
        out, (grad,) = grads_of(compiled, x)
    out_ref, (grad_ref,) = grads_of(f, x)
    assert_close(out, out_ref)
    assert_close(grad, grad_ref)


def test_a_frame_that_runs_eagerly_says_so_once():
    """A graph break with no point to resume from (here: inside a loop, as in Dynamo) runs the
    whole function eagerly: a warning naming the function and the reason, on the first call."""
    def f(x):
        for i in range(2):
            print(i)
            x = x + 1
        return x

    compiled = toycomp.compile(f, backend="cpp")
    with pytest.warns(UserWarning, match="toycomp: .*f: runs eagerly: graph break in a for/while"):
        assert_close(compiled(torch.ones(3)), f(torch.ones(3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(compiled(torch.ones(3)), f(torch.ones(3)))


def test_explain_shows_every_stage():
    x = torch.randn(100, requires_grad=True)
    ex = toycomp.explain(sin2_cos2, x, backend="cpp")
    titles = [title for title, _ in ex.sections()]
    for stage in ("captured", "joint", "forward graph (ATen)", "backward graph (ATen)", "prims",
                  "kernel_0", "wrapper"):
        assert any(stage in t for t in titles), stage
    assert "torch.sin" in ex.captured.code and ex.guards
    assert ex.saved_values and len(ex.kernels) == 2
    assert "<details>" in ex._repr_html_()
    for stage in ("captured", "joint", "forward", "backward", "forward_prims", "backward_prims"):
        assert "digraph" in ex.draw(stage).source
    # every computing prims node of the forward is boxed in the one fused kernel
    lines = ex.draw("forward_prims").text.splitlines()
    for node in ex.graph("forward").prims.graph.nodes:
        if node.op == "call_function":
            (line,) = [ln for ln in lines if ln.strip().startswith(f"{node.name} =")]
            assert "kernel_0" in line, line


def test_dynamo_backend_entry_point():
    installed = [ep.name for ep in entry_points(group="torch_dynamo_backends")]
    if "toycomp" not in installed:
        try:
            distribution("toycomp")
        except PackageNotFoundError:
            pytest.skip("toycomp is not pip-installed here, so its entry point is not registered")
        pytest.fail("toycomp is installed but registers no torch_dynamo_backends entry point")
    torch._dynamo.reset()
    x = torch.randn(64, requires_grad=True)
    compiled = torch.compile(sin2_cos2, backend="toycomp")
    out, (grad,) = grads_of(compiled, x)
    out_ref, (grad_ref,) = grads_of(sin2_cos2, x)
    assert_close(out, out_ref)
    assert_close(grad, grad_ref)


def test_dynamo_backend_trains_a_module():
    if "toycomp" not in [ep.name for ep in entry_points(group="torch_dynamo_backends")]:
        pytest.skip("toycomp is not pip-installed here, so its entry point is not registered")
    torch._dynamo.reset()
    model = make_mlp()
    batch, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss_ref, grads_ref = mlp_step(model, batch, target)
    compiled_model = torch.compile(model, backend="toycomp")
    loss, grads = mlp_step(model, batch, target, lambda x, t: F.cross_entropy(compiled_model(x), t))
    torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=RTOL, atol=ATOL)


def test_dynamo_backend_traces_on_fake_tensors(monkeypatch):
    """Compiling never computes on the user's data: the backend hands stages 2-4 Dynamo's fake
    tensors, static shapes included (real ones made AOT run a transformer's step while tracing);
    the compiled module still trains as eager does."""
    import toycomp.pipeline as pipeline
    from toycomp._torch_compat import is_fake

    seen, stages = [], pipeline.compile_stages_2_to_4

    def spy(gm, examples, *args, **kwargs):
        seen.append([x for x in examples if isinstance(x, torch.Tensor)])
        return stages(gm, examples, *args, **kwargs)

    monkeypatch.setattr(pipeline, "compile_stages_2_to_4", spy)
    torch._dynamo.reset()
    model = make_mlp()
    batch, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
    loss_ref, grads_ref = mlp_step(model, batch, target)
    compiled_model = torch.compile(model, backend=toycomp.toycomp_backend)
    loss, grads = mlp_step(model, batch, target, lambda x, t: F.cross_entropy(compiled_model(x), t))
    assert seen and all(is_fake(x) for tensors in seen for x in tensors)
    torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("fn", [lambda x: x[x > 0].sum() * 2, lambda x: torch.nonzero(x).sum()])
def test_dynamo_graph_with_sizes_from_the_data_runs_eagerly_visibly(fn):
    """Dynamo's capture_dynamic_output_shape_ops gives graphs whose sizes are read from the data
    (unbacked symbols): toycomp runs such a graph as captured, with a warning, not a crash."""
    torch._dynamo.reset()
    x = torch.randn(16)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        with pytest.warns(UserWarning, match="runs eagerly"):
            got = torch.compile(fn, backend=toycomp.toycomp_backend)(x)
    torch.testing.assert_close(got, fn(x))


def test_dynamo_backend_warns_of_a_fallback():
    """An op toycomp leaves to eager (an overlapping average pool) is as visible through
    ``torch.compile(backend="toycomp")`` as through ``toycomp.compile``: a warning naming it."""
    torch._dynamo.reset()
    x = torch.randn(1, 2, 6, 6, requires_grad=True)

    def fn(a):
        return F.avg_pool2d(a, 3, 1, 1) * 2

    with pytest.warns(UserWarning, match="calls eager PyTorch for aten.avg_pool2d"):
        got = torch.compile(fn, backend=toycomp.toycomp_backend)(x)
    torch.testing.assert_close(got, fn(x))


def test_python_dash_m_toycomp():
    result = subprocess.run(
        [sys.executable, "-m", "toycomp", "--size", "64"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    for text in ("torch.sin", "aten.sin", "prims", "kernel_0", "OK: values and gradients match eager"):
        assert text in result.stdout


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown backend"):
        toycomp.compile(sin2_cos2, backend="tpu")


@needs_cuda
def test_cuda_triton_end_to_end():
    compiled = run_sin2_cos2(None, "cuda")
    assert all(k.backend == "triton" for g in compiled.entries[0].graphs for k in g.compiled.kernels)
    model = make_mlp().cuda()
    batch, target = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    loss_ref, grads_ref = mlp_step(model, batch, target)
    loss, grads = mlp_step(model, batch, target, toycomp.compile(lambda x, t: F.cross_entropy(model(x), t)))
    torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=RTOL, atol=ATOL)


def test_warnings_do_not_fire_for_clean_programs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_sin2_cos2("cpp", "cpu")


@pytest.mark.parametrize("partition, saved", [("min_cut", ["primals_1"]),
                                              ("default", ["primals_1", "sin", "cos"])])
def test_partition_choice(partition, saved):
    x = torch.randn(256, requires_grad=True)
    compiled = toycomp.compile(sin2_cos2, backend="cpp", partition=partition)
    out, (grad,) = grads_of(compiled, x)
    out_ref, (grad_ref,) = grads_of(sin2_cos2, x)
    assert_close(out, out_ref)
    assert_close(grad, grad_ref)
    assert compiled.entries[0].aot.saved_values == saved
    assert toycomp.explain(sin2_cos2, x, partition=partition).saved_values == saved
    with pytest.raises(ValueError, match="unknown partition"):
        toycomp.compile(sin2_cos2, partition="greedy")


def test_fresh_outputs_mark_only_kernel_buffers_returned_once():
    def f(x):
        y = torch.sin(x)
        return y, x.t(), y  # a kernel output twice, and a view of the input

    x = torch.randn(3, 4)
    graph = toycomp.explain(f, x, backend="cpp").graph("forward").compiled
    # The capture returns y from the graph once and builds the tuple in Python.
    assert graph.fresh_outputs == (True, False)
    ex = toycomp.explain(lambda x: (torch.sin(x), x.t()), x, backend="cpp")
    assert ex.graph("forward").compiled.fresh_outputs == (True, False)
    out = toycomp.compile(f, backend="cpp")(x)
    assert out[0].data_ptr() != x.data_ptr() and out[1].data_ptr() == x.data_ptr()
    assert out[0].data_ptr() == out[2].data_ptr()  # eager returns the same tensor twice, too


def test_dynamo_backend_refuses_parameters_kept_as_attributes():
    model = torch.nn.Linear(3, 2)
    gm = torch.fx.symbolic_trace(model)  # keeps weight and bias as get_attr nodes
    with pytest.raises(NotImplementedError, match="requires grad"):
        toycomp.toycomp_backend(gm, [torch.randn(4, 3)])


# --- mutations toycomp cannot replay, and ones it can (issue 6, item 8) ---------------------------
def clamp_weights_then_apply(lin, x):
    with torch.no_grad():  # legal in eager: a leaf parameter mutated without autograd
        lin.weight.clamp_(-0.1, 0.1)
    return lin(x).sum()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_parameter_mutated_under_no_grad_is_replayed(backend):
    torch.manual_seed(0)
    lin, ref = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    ref.load_state_dict(lin.state_dict())
    compiled = toycomp.compile(lambda x: clamp_weights_then_apply(lin, x), backend=backend)
    for _ in range(2):  # the first call (compiles on fakes, then runs) and a cached one
        x = torch.randn(2, 4)
        out, out_ref = compiled(x), clamp_weights_then_apply(ref, x)
        out.backward(), out_ref.backward()
        assert_close(out, out_ref)
        for p, p_ref in zip(lin.parameters(), ref.parameters()):
            assert p.is_leaf and p.grad_fn is None
            assert_close(p, p_ref)
            assert_close(p.grad, p_ref.grad)
        with torch.no_grad():  # so that the next call clamps again
            lin.weight.mul_(3), ref.weight.mul_(3)
    assert len(compiled.entries) == 1 and compiled.eager_reason is None


def resize_input(x):
    x.resize_(6)
    return x * 2


def transpose_input(x):
    x.t_()
    return x + 1


@pytest.mark.parametrize("fn", [resize_input, transpose_input])
def test_metadata_mutation_of_an_input_falls_back_visibly(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bytecode capture warns here too
        ex = toycomp.explain(fn, torch.randn(2, 4), backend="cpp")
    assert ex.eager_reason and ex.fallbacks[0].startswith("whole graph: toycomp.aot")
    assert "runs eagerly" in ex.summary() and ex.eager_reason in str(ex)
    compiled = toycomp.compile(fn, backend="cpp")
    for call in range(2):  # the first call (the graph runs as captured), then eager
        x, x_ref = torch.arange(8.0).reshape(2, 4), torch.arange(8.0).reshape(2, 4)
        if call == 0:
            with pytest.warns(UserWarning, match="eagerly.*toycomp.aot"):
                out = compiled(x)
        else:
            out = compiled(x)
        out_ref = fn(x_ref)
        assert x.stride() == x_ref.stride()  # the mutation happened once, as in eager
        assert_close(x, x_ref)
        assert_close(out, out_ref)
    assert compiled.eager_reason is not None and not compiled.entries


# --- inference mode (issue 6, item 9) -------------------------------------------------------------
def test_inference_tensors_and_inference_mode():
    def f(x, w):
        return (x.sin() * w).sum(0)

    with torch.inference_mode():
        x_inf = torch.randn(4, 3)
    w = torch.randn(3, requires_grad=True)
    compiled = toycomp.compile(f, backend="cpp")
    out, (grad,) = grads_of(compiled, x_inf, w)
    out_ref, (grad_ref,) = grads_of(f, x_inf, w)
    assert_close(out, out_ref)
    assert_close(grad, grad_ref)
    with torch.inference_mode():
        x = torch.randn(4, 3)
        out = compiled(x, w)
        assert out.is_inference()
        assert_close(out, f(x, w))


# --- compiled entries keep metadata, not the first call's tensors (issue 6, item 16) --------------
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_compiled_entries_do_not_keep_inputs_alive(backend):
    def f(x, y, buf):
        buf.add_(1)
        return (x.sin() * y).sum() + buf.sum()

    compiled = toycomp.compile(f, backend=backend)
    tensors = [torch.randn(64, requires_grad=True), torch.randn(64), torch.zeros(3)]
    out = compiled(*tensors)
    out.backward()
    ex = toycomp.explain(f, *tensors, backend=backend)
    refs = [weakref.ref(t) for t in (*tensors, out)]
    del tensors, out
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)
    assert compiled.entries and ex.kernels  # still alive, still compiled


# --- the bytecode capture compiles on fake tensors (issue 7, item 2) ------------------------------
class RealOpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen ops that compute on real tensors (fake and meta ones are metadata only;
    views read no data: making a fake tensor from a real one detaches it)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs or {}))
                   if isinstance(a, torch.Tensor)]  # fmt: skip
        if not func.is_view and any(not toycomp._torch_compat.is_fake(t)
                                    and t.device.type != "meta" for t in tensors):  # fmt: skip
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_compiling_does_no_work_on_real_data():
    model = make_mlp()
    batch, target = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step(x, t):
        return F.cross_entropy(F.dropout(model(x), 0.1), t)

    compiled = toycomp.compile(step, backend="cpp")
    counts = []
    for _ in range(2):  # the first call compiles (on fakes), the second runs from the cache
        model.zero_grad(set_to_none=True)
        with RealOpCounter() as counter:
            compiled(batch, target).backward()
        counts.append(sorted(counter.ops))
    assert compiled.compile_count == 1
    assert counts[0] == counts[1]  # the first call's real work is the compiled code's alone


def test_explain_on_meta_inputs():
    model = make_mlp().to("meta")
    batch = torch.randn(32, 64, device="meta")
    target = torch.randint(0, 10, (32,), device="meta")
    ex = toycomp.explain(lambda x, t: F.cross_entropy(model(x), t), batch, target,
                         backend="cpp")  # fmt: skip
    assert ex.graph_count == 1 and ex.backward is not None and ex.kernels
    assert not ex.fallbacks and "mm" in ex.forward.code


STRIDE_CASES = {
    "mm_of_transposes": lambda x, y: x.t().t() @ y,
    "transposed_pointwise": lambda x, y: x.t() * 2,
    "permuted_sin": lambda x, y: x.reshape(2, 2, 6).permute(2, 0, 1).sin(),
    "sum_of_transpose": lambda x, y: x.t().sum(1, keepdim=True),
    "zero_of_a_copy": lambda x, y: x.t().clone().zero_(),
    "zeros_like": lambda x, y: torch.zeros_like(x.t()),
    "empty_like_fill": lambda x, y: torch.empty_like(x.t()).fill_(1),
    "softmax": lambda x, y: x.t().softmax(-1),
    "contiguous": lambda x, y: x.t().contiguous(),
    "gelu": lambda x, y: F.gelu(x.t()),
    "cat": lambda x, y: torch.cat([x.t(), y[:, :4]], 1),
    "expand_add": lambda x, y: x[:, :1].expand(4, 6) + 0,
    "to_float64": lambda x, y: x.t().to(torch.float64),
    "zero_input": lambda x, y: x.zero_(),
}


@pytest.mark.parametrize("name", list(STRIDE_CASES))
def test_compiled_strides_match_eager(name):
    """Compiling on fake tensors takes layouts from their meta kernels: they must be eager's."""
    fn = STRIDE_CASES[name]
    x, y = torch.randn(4, 6), torch.randn(6, 5)
    out = toycomp.compile(fn, backend="cpp")(x.clone(), y)
    ref = fn(x.clone(), y)
    assert_close(out, ref)
    assert out.stride() == ref.stride()


# --- dynamic shapes (issue 8): one recompile, then every batch size -----------------------------
BATCH_SIZES = random.Random(0).sample(range(2, 65), 63)  # 2..64, shuffled


def dynamo_compiler(backend):
    """``torch.compile``'s backend argument for toycomp with ``backend``, counting its calls."""
    calls = []

    def compiler(gm, example_inputs):
        calls.append(gm)
        return toycomp.toycomp_backend(gm, example_inputs, backend=backend)

    return compiler, calls


def check_running_example_every_batch_size(compiled):
    for n in BATCH_SIZES:
        x = torch.randn(n, 5, requires_grad=True)
        out, (grad,) = grads_of(compiled, x)
        out_ref, (grad_ref,) = grads_of(sin2_cos2, x)
        assert_close(out, out_ref)
        assert_close(grad, grad_ref)


def check_mlp_step_every_batch_size(model, compiled_loss):
    for n in BATCH_SIZES:
        batch, target = torch.randn(n, 64), torch.randint(0, 10, (n,))
        loss_ref, grads_ref = mlp_step(model, batch, target)
        loss, grads = mlp_step(model, batch, target, compiled_loss)
        torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
        for name in grads_ref:
            torch.testing.assert_close(grads[name], grads_ref[name], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic=True", "automatic"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_dynamic_shapes_running_example(backend, dynamic):
    compiled = toycomp.compile(sin2_cos2, backend=backend, dynamic=dynamic)
    check_running_example_every_batch_size(compiled)
    assert compiled.compile_count == (1 if dynamic else 2)  # automatic: static, then symbolic


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic=True", "automatic"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_dynamic_shapes_mlp_training_step(backend, dynamic):
    model = make_mlp()
    compiled = toycomp.compile(lambda x, t: F.cross_entropy(model(x), t), backend=backend,
                               dynamic=dynamic)
    check_mlp_step_every_batch_size(model, compiled)
    assert compiled.compile_count == (1 if dynamic else 2)
    forward = compiled.entries[-1].aot.forward
    assert any(isinstance(n.meta["val"], torch.SymInt)
               for n in forward.graph.nodes if n.op == "placeholder")  # fmt: skip


def test_dynamic_must_be_none_true_or_false():
    with pytest.raises(ValueError, match="dynamic"):
        toycomp.compile(sin2_cos2, dynamic="yes")


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic=True", "automatic"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_dynamo_dynamic_shapes_running_example(backend, dynamic):
    torch._dynamo.reset()
    compiler, calls = dynamo_compiler(backend)
    check_running_example_every_batch_size(torch.compile(sin2_cos2, backend=compiler,
                                                         dynamic=dynamic))
    assert len(calls) == (1 if dynamic else 2)  # automatic: static first, then one symbolic


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic=True", "automatic"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_dynamo_dynamic_shapes_mlp_training_step(backend, dynamic):
    torch._dynamo.reset()
    model = make_mlp()
    compiler, calls = dynamo_compiler(backend)
    loss_fn = torch.compile(lambda x, t: F.cross_entropy(model(x), t), backend=compiler,
                            dynamic=dynamic)
    check_mlp_step_every_batch_size(model, loss_fn)
    assert len(calls) == (1 if dynamic else 2)
    placeholders = [n for n in calls[-1].graph.nodes if n.op == "placeholder"]
    assert any(isinstance(n.meta["example_value"], torch.SymInt) for n in placeholders)


def test_explain_shows_symbols_dynamic_dims_and_shape_guards():
    def fn(x, y):
        return torch.sin(x).view(x.shape[0], -1).sum(1) * y

    x, y = torch.randn(8, 3), torch.randn(8)
    static = toycomp.explain(fn, x, y)
    assert static.symbols == {} and static.shape_guards == []
    ex = toycomp.explain(fn, x, y, dynamic=True)
    assert ex.symbols == {"s0": "L['x'].size(0)", "s1": "L['x'].size(1)"}
    assert ex.dynamic_dims == {"L['x']": [0, 1], "L['y']": [0]}
    assert "L['x'].size(0) >= 2" in ex.shape_guards
    assert "L['y'].size(0) == L['x'].size(0)" in ex.guards[0]  # duck sizing, in the guards
    text = str(ex)
    assert "== 1. dynamic shapes 0 ==" in text and "s0 = L['x'].size(0)" in repr(ex)
    toycomp.mark_dynamic(x, 0)
    marked = toycomp.explain(lambda x: torch.sin(x).view(x.shape[0], -1).sum(1), x)
    assert marked.symbols == {"s0": "L['x'].size(0)"} and marked.dynamic_dims == {"L['x']": [0]}


def test_a_marked_size_the_trace_specialises_is_guarded_and_correct():
    """x's batch is marked dynamic, but ``* y`` (static, 8) needs it to be 8: a guard."""
    def fn(x, y):
        return torch.sin(x).sum(1) * y

    x, y = torch.randn(8, 3), torch.randn(8)
    toycomp.mark_dynamic(x, 0)
    compiled = toycomp.compile(fn, backend="cpp")
    assert_close(compiled(x, y), fn(x, y))
    assert "L['x'].size(0) == 8" in compiled.context.log[-1].guards
    x, y = torch.randn(5, 3), torch.randn(5)
    assert_close(compiled(x, y), fn(x, y))
    assert compiled.compile_count == 2


def test_dynamic_shapes_with_views_and_size_outputs():
    def g(x, y):
        return (x.sin() * y).sum(0), x.shape[0] * 2

    compiled = toycomp.compile(g, backend="cpp")
    torch._dynamo.reset()
    dynamo = torch.compile(g, backend="toycomp", dynamic=True)
    for n in (5, 7, 9, 4):
        x = torch.randn(n + 1, 3)[1:]  # a view with a storage offset
        y = torch.randn(3, n).t()  # not contiguous
        for fn in (compiled, dynamo):
            out, size = fn(x, y)
            assert_close(out, g(x, y)[0])
            assert type(size) is int and size == 2 * n
    assert compiled.compile_count == 2


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_size_live_across_a_graph_break_compiles_twice(backend):
    def fn(x):
        n = x.shape[0] * 2
        print("n is", n)  # a graph break: the resume function receives n, an int
        return (x.sin() * n).sum(), n

    compiled = toycomp.compile(fn, backend=backend)
    for n in BATCH_SIZES[:10]:
        x = torch.randn(n, requires_grad=True)
        (out, m), (grad,) = compiled(x), torch.autograd.grad(compiled(x)[0], x)
        (ref, ref_m), (ref_grad,) = fn(x), torch.autograd.grad(fn(x)[0], x)
        assert_close(out, ref)
        assert_close(grad, ref_grad)
        assert m == ref_m
    assert compiled.compile_count == 2  # the resume function's graph: static, then symbolic


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_failing_shape_guards_recompile_through_every_stage(backend):
    """dynamic=True duck-sizes x and y (one symbol, guarded equal): a y of size 1 (it now
    broadcasts) or of another size fails that guard; each recompile stays correct."""

    def fn(x, y):
        return (x.sin() * y).sum(0)

    compiled = toycomp.compile(fn, backend=backend, dynamic=True)
    counts = []
    for n, m in [(5, 5), (7, 7), (7, 1), (6, 1), (6, 6), (9, 9), (8, 3)]:
        x, y = torch.randn(n, 4, requires_grad=True), torch.randn(m, 1, requires_grad=True)
        if m not in (1, n):
            with pytest.raises(RuntimeError):
                fn(x, y)  # eager refuses; so does the compiled function
            with pytest.raises(RuntimeError):
                compiled(x, y)
            continue
        out, grads = grads_of(compiled, x, y)
        out_ref, grads_ref = grads_of(fn, x, y)
        assert_close(out, out_ref)
        for g, r in zip(grads, grads_ref):
            assert_close(g, r)
        counts.append(compiled.compile_count)
    assert counts == [1, 1, 2, 2, 2, 2]  # (7, 1): y's size 1 is specialised, once


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_slice_length_specialised_by_a_guard_lowers(backend):
    """``x[1::3]`` of a dynamic dimension s0 has (s0 + 1) // 3 rows, which tracing specialised
    to 1 under a guard: the lowering's size and the node's meta size (1) are equal under the
    guards (``SizeVars.known_equal``). Sizes 3 and 4 share the dynamic compile; 5 has 2 such
    rows, fails the guard and recompiles."""

    def fn(x):
        return torch.rsqrt(x[1::3].abs() + 0.5).sum(-1) * x[0]

    compiled = toycomp.compile(fn, backend=backend)
    counts = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        for n in (2, 3, 4, 5, 8):
            x = torch.randn(n, 1, n)
            assert_close(compiled(x), fn(x))
            counts.append(compiled.compile_count)
    assert counts == [1, 2, 2, 3, 3]  # the second size makes the dimension dynamic


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_contiguous_stride_max_decided_by_the_guards_lowers(backend):
    """A contiguous tensor of size (5, 2, (s0 // 2 + 1) // 2) has the stride
    ``Max(1, (s0 // 2 + 1) // 2)`` (PyTorch's strides take ``max(size, 1)``). Algebra cannot
    order the two, the ShapeEnv (s0 >= 2) can: the graph compiles (it ran eagerly before)."""

    def fn(x):
        return torch.rsqrt(x.unflatten(1, (2, -1))[:, :, ::2].abs() + 0.5)

    compiled = toycomp.compile(fn, backend=backend)
    counts = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        for n in (8, 10, 12, 14, 22):
            x = torch.randn(5, n)
            assert_close(compiled(x), fn(x))
            counts.append(compiled.compile_count)
    assert counts == [1, 2, 2, 2, 2]


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_a_sparse_input_runs_eagerly_with_a_warning(layout):
    def f(x, y):
        return (x * 2).to_dense().sum(0) + y

    x = getattr(torch.randn(4, 3).relu(), f"to_{layout}")()
    y = torch.randn(3)
    compiled = toycomp.compile(f)
    with pytest.warns(UserWarning, match=f"is a torch.{layout} tensor"):
        got = compiled(x, y)
    torch.testing.assert_close(got, f(x, y))
    assert "strided tensors only" in toycomp.explain(f, x, y).summary()
    dense = torch.randn(4, 3)  # the guard sends dense inputs to a compiled entry
    torch.testing.assert_close(compiled(dense, y), f(dense, y))
    assert len(compiled.entries) == 1


def test_backend_follows_the_device_a_graph_computes_on_when_no_input_tells():
    """A graph of Python numbers that makes a CUDA tensor (GradScaler's lazily made scale:
    ``torch.full((), 65536.0, device="cuda")``) gets Triton, as its inputs would have said: the
    device the lowered graph computes on decides (read from its creation prims; no GPU needed)."""
    import toycomp.prims as prims
    from toycomp.inductor.lowering_meta import _graph_device
    from toycomp.pipeline import resolve_backend

    def prims_graph(device):
        graph = torch.fx.Graph()
        scale = graph.placeholder("scale")
        full = graph.call_function(prims.full, ((), 65536.0, torch.float32, device))
        graph.output((full, scale))
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    cuda, cpu = (_graph_device(prims_graph(torch.device(d)), [3.0]) for d in ("cuda", "cpu"))
    assert resolve_backend(None, [3.0], cuda) == "triton"
    assert resolve_backend(None, [3.0], cpu) == "cpp"
    assert resolve_backend(None, [3.0]) == "cpp"
    assert resolve_backend("cpp", [3.0], cuda) == "cpp"  # asked for: as asked
