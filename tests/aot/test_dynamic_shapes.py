"""AOTAutograd with symbolic sizes: SymInt inputs, sizes saved for the backward, any batch size.

The graphs are traced once on fake tensors whose first dimension is a symbol, then run (as
GraphModules: stages 3-4 are not involved) on real tensors of several sizes; eager PyTorch is the
oracle for values and gradients.
"""

import pytest
import torch
import torch.nn.functional as F

import toycomp._torch_compat as compat
from toycomp.aot.aot_autograd import aot_function
from toycomp.aot.partitioners import default_partition, min_cut_rematerialization_partition
from toycomp.symbolic_shapes import free_symbols, is_symbolic, sym_expr

PARTITIONS = [default_partition, min_cut_rematerialization_partition]
RTOL, ATOL = 1e-4, 1e-5


def symbolic(*tensors, dims=None):
    """Fake tensors (one ShapeEnv) whose first dimension is a fresh symbol each."""
    mode = compat.symbolic_fake_tensor_mode()
    fakes = []
    for i, t in enumerate(tensors):
        kinds = ["dynamic"] + ["static"] * (t.dim() - 1) if dims is None else dims[i]
        fake = compat.fake_with_symbols(mode, t, kinds, f"L['arg{i}']")
        fakes.append(fake.requires_grad_(t.requires_grad))
    return fakes


def recording_compiler(log):
    def compiler(gm, example_inputs):
        log.append((gm, list(example_inputs)))
        return lambda args: gm(*args)

    return compiler


def check_against_eager(aot, fn, make_inputs, sizes=(2, 5, 17)):
    for n in sizes:
        inputs = make_inputs(n)
        ref = [x.detach().clone().requires_grad_(x.requires_grad)
               if isinstance(x, torch.Tensor) else x for x in inputs]  # fmt: skip
        expected, actual = fn(*ref), aot(*inputs)[0]
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
        pairs = [(a, r) for a, r in zip(inputs, ref)
                 if isinstance(a, torch.Tensor) and a.requires_grad]  # fmt: skip
        if pairs:
            tangent = torch.randn(expected.shape)
            grads = torch.autograd.grad(actual, [a for a, _ in pairs], tangent)
            ref_grads = torch.autograd.grad(expected, [r for _, r in pairs], tangent)
            for g, r in zip(grads, ref_grads):
                torch.testing.assert_close(g, r, rtol=RTOL, atol=ATOL)


def sin2_cos2(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


@pytest.mark.parametrize("partition", PARTITIONS)
def test_a_symbolic_batch_runs_on_every_batch_size(partition):
    (fake,) = symbolic(torch.randn(6, 3, requires_grad=True))
    log = []
    aot = aot_function(sin2_cos2, [fake], recording_compiler(log), partition_fn=partition)
    assert [n.meta["val"].shape[0] for n in aot.joint.graph.nodes if n.op == "placeholder"][0] \
        == fake.shape[0]
    check_against_eager(aot, sin2_cos2, lambda n: [torch.randn(n, 3, requires_grad=True)])
    assert len(log) == 2  # traced and compiled once, run for every size


def view_with_sizes(s, x):
    """Dynamo's graphs take sizes as inputs (``s0``) and compute with them."""
    flat = torch.sin(x).reshape(s * 3) ** 2
    return flat.view(s, 3) * s + torch.cos(x).sum(0) / s


@pytest.mark.parametrize("partition", PARTITIONS)
def test_symint_inputs_are_placeholders_and_the_backward_gets_its_sizes(partition):
    (fake,) = symbolic(torch.randn(6, 3, requires_grad=True))
    s0 = fake.shape[0]
    log = []
    aot = aot_function(view_with_sizes, [s0, fake], recording_compiler(log), partition_fn=partition)
    joint_inputs = [n.meta["val"] for n in aot.joint.graph.nodes if n.op == "placeholder"]
    assert is_symbolic(joint_inputs[0]) and sym_expr(joint_inputs[0]) == sym_expr(s0)
    (fw_gm, fw_examples), (bw_gm, bw_examples) = log
    assert is_symbolic(fw_examples[0]) and isinstance(fw_examples[1], torch.Tensor)
    # the backward takes saved tensors, then saved sizes, then tangents (as in PyTorch)
    kinds = ["size" if is_symbolic(e) else "tensor" for e in bw_examples]
    n_saved = len(aot.saved_values)
    assert kinds[:n_saved] == sorted(kinds[:n_saved], key=lambda k: k == "size")
    assert "size" in kinds[:n_saved]
    # every symbol of the backward's inputs is itself one of its inputs
    symbols = free_symbols([e for e in bw_examples if isinstance(e, torch.Tensor)])
    bound = {sym_expr(e) for e in bw_examples if is_symbolic(e)}
    assert symbols <= bound
    check_against_eager(
        aot, view_with_sizes, lambda n: [n, torch.randn(n, 3, requires_grad=True)]
    )


@pytest.mark.parametrize("partition", PARTITIONS)
def test_a_size_read_from_a_tensor_is_saved_not_the_tensor(partition):
    def fn(x):
        return torch.sin(x).sum(0) * x.shape[0]

    (fake,) = symbolic(torch.randn(6, 3, requires_grad=True))
    aot = aot_function(fn, [fake], partition_fn=partition)
    sizes = [n for n in aot.forward.graph.output_node().args[0] if is_symbolic(n.meta["val"])]
    assert [n.target for n in sizes] == [torch.ops.aten.sym_size.int]
    assert "primals_1" not in aot.saved_values or partition is default_partition
    check_against_eager(aot, fn, lambda n: [torch.randn(n, 3, requires_grad=True)])


def test_min_cut_saves_what_it_saves_for_static_sizes():
    """The min cut weighs a symbolic value by its example size: same choice as static."""
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, 16, requires_grad=True)

    def fn(x, w):
        return torch.tanh(x @ w).relu() * 2

    static = aot_function(fn, [x, w], partition_fn=min_cut_rematerialization_partition)
    fx_, fw = symbolic(x, w, dims=[["dynamic", "static"], ["static", "static"]])
    dynamic = aot_function(fn, [fx_, fw], partition_fn=min_cut_rematerialization_partition)
    tensors = [v for v in dynamic.saved_values if not v.startswith("sym_size")]
    assert tensors == static.saved_values
    check_against_eager(dynamic, fn, lambda n: [torch.randn(n, 32, requires_grad=True),
                                                torch.randn(32, 16, requires_grad=True)])


def test_mlp_loss_with_a_symbolic_batch():
    torch.manual_seed(0)
    w1, b1 = torch.randn(64, 16, requires_grad=True), torch.randn(64, requires_grad=True)
    w2, b2 = torch.randn(10, 64, requires_grad=True), torch.randn(10, requires_grad=True)

    def loss(w1, b1, w2, b2, x, target):
        return F.cross_entropy(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2), target)

    x, target = torch.randn(8, 16), torch.randint(0, 10, (8,))
    dims = [["static"] * p.dim() for p in (w1, b1, w2, b2)] + [["dynamic", "static"], ["duck"]]
    fakes = symbolic(w1, b1, w2, b2, x, target, dims=dims)
    for partition in PARTITIONS:
        aot = aot_function(loss, fakes, partition_fn=partition)

        def inputs(n):
            return [w1, b1, w2, b2, torch.randn(n, 16), torch.randint(0, 10, (n,))]

        check_against_eager(aot, loss, inputs, sizes=(2, 3, 31, 64))


def test_an_input_mutated_in_place_with_a_symbolic_size():
    def fn(x, buf):
        buf.add_(x.detach().sum(0))
        return x * 2

    x, buf = torch.randn(5, 3, requires_grad=True), torch.zeros(3)
    fakes = symbolic(x, buf, dims=[["dynamic", "static"], ["static"]])
    aot = aot_function(fn, fakes)
    for n in (2, 9):
        x, buf, ref_buf = torch.randn(n, 3, requires_grad=True), torch.ones(3), torch.ones(3)
        out = aot(x, buf)[0]
        torch.testing.assert_close(out, fn(x.detach(), ref_buf))
        torch.testing.assert_close(buf, ref_buf)


def test_inputs_that_disagree_with_the_traced_sizes_raise():
    (fake,) = symbolic(torch.randn(6, 3, requires_grad=True))
    aot = aot_function(view_with_sizes, [fake.shape[0], fake])
    with pytest.raises(RuntimeError, match="shape"):
        aot(4, torch.randn(5, 3))  # s0 is 4, but the tensor says 5
    with pytest.raises(RuntimeError, match="shape"):
        aot(5, torch.randn(5, 4))  # the static dimension changed


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic=True", "automatic"])
def test_dynamos_dynamic_graphs_through_aot(dynamic):
    """Dynamo's graphs with SymInt inputs (dynamic=True, or automatic dynamic shapes after a
    size change) go through AOT on Dynamo's fake tensors (stages 3-4 replaced by running the
    graphs); one symbolic graph serves every batch size."""
    from toycomp.pipeline import dynamo_examples

    graphs = []

    def backend(gm, example_inputs):
        examples = dynamo_examples(gm, example_inputs)
        graphs.append([type(e).__name__ for e in examples])
        aot = aot_function(gm, examples, partition_fn=min_cut_rematerialization_partition)
        return lambda *args: aot(*args)

    def fn(x, w):
        return (torch.tanh(x @ w).view(x.shape[0], -1) * x.shape[0]).sum(1)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    w = torch.randn(4, 6, requires_grad=True)
    check_against_eager(lambda *a: (compiled(*a),), fn,
                        lambda n: [torch.randn(n, 4, requires_grad=True), w], sizes=(3, 8, 5, 2))
    assert len(graphs) == (1 if dynamic else 2)
    assert graphs[-1][0] == "SymInt"  # the last graph takes the batch size as an input


@pytest.mark.parametrize("partition", PARTITIONS)
def test_a_size_output_is_a_python_int(partition):
    """Dynamo's graphs may return a size (``return y, x.shape[0] * 2``)."""

    def fn(s, x):
        return torch.sin(x) * s, s * 2

    (fake,) = symbolic(torch.randn(6, 3, requires_grad=True))
    aot = aot_function(fn, [fake.shape[0], fake], partition_fn=partition)
    for n in (2, 7):
        x = torch.randn(n, 3, requires_grad=True)
        out, size = aot(n, x)
        assert type(size) is int and size == 2 * n
        (grad,) = torch.autograd.grad(out.sum(), x)
        ref = x.detach().requires_grad_()
        (ref_grad,) = torch.autograd.grad(fn(n, ref)[0].sum(), ref)
        torch.testing.assert_close(out, fn(n, x.detach())[0])
        torch.testing.assert_close(grad, ref_grad)


@pytest.mark.parametrize("partition", PARTITIONS)
def test_float_sizes_in_the_graph(partition):
    """var's backward multiplies by 2 / (N - 1), a SymFloat: rebuilt as sym_float and a
    division of the size nodes."""

    def fn(x):
        return x.var((0, -1))

    (fake,) = symbolic(torch.randn(3, 23, requires_grad=True), dims=[["static", "dynamic"]])
    aot = aot_function(fn, [fake], partition_fn=partition)
    assert torch.sym_float in {n.target for n in aot.joint.graph.nodes}
    check_against_eager(aot, fn, lambda n: [torch.randn(3, n, requires_grad=True)])
