"""Embedding's and nll_loss's decompositions keep eager's errors; embedding keeps its inf/NaN
placement."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import toycomp

BACKENDS = ["cpp", "triton"]


def embed(indices, weight):
    return F.embedding(indices, weight).sin().sum(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_out_of_range_raises_as_in_eager(backend):
    weight = torch.randn(10, 4)
    compiled = toycomp.compile(embed, backend=backend)
    compiled(torch.tensor([[1, 3], [0, 9]]), weight)
    for bad in ([[1, 3], [0, 10]], [[-1, 3], [0, 2]]):
        with pytest.raises(IndexError, match="index out of range"):
            embed(torch.tensor(bad), weight)
        with pytest.raises(IndexError, match="index out of range"):
            compiled(torch.tensor(bad), weight)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inf_in_the_gradient_stays_in_its_row(backend):
    weight = torch.randn(10, 4, requires_grad=True)
    indices = torch.tensor([[1, 3, 3], [0, 9, 2]])
    out, ref = toycomp.compile(embed, backend=backend)(indices, weight), embed(indices, weight)
    grad = torch.randn_like(ref)
    grad[0, 1] = float("inf")
    (got,) = torch.autograd.grad(out, weight, grad)
    (expected,) = torch.autograd.grad(ref, weight, grad)
    torch.testing.assert_close(got, expected, equal_nan=True)
    assert torch.isfinite(got[[4, 5, 6, 7, 8]]).all()  # rows no index points at stay zero
    assert not toycomp.explain(embed, indices, weight).fallbacks


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_and_infinities_of_the_gradient_land_where_eager_puts_them(backend):
    weight = torch.randn(10, 4, requires_grad=True)
    indices = torch.tensor([[1, 3, 3, 5], [0, 9, 2, 5]])
    out, ref = toycomp.compile(embed, backend=backend)(indices, weight), embed(indices, weight)
    grad = torch.randn(4, 4)  # row j reaches weight rows indices[0, j] and indices[1, j]
    grad[0, 1], grad[3, 2] = float("inf"), float("nan")
    grad[1, 0], grad[2, 0] = float("inf"), -float("inf")  # both reach weight[3, 0]: NaN there
    (got,) = torch.autograd.grad(out, weight, grad)
    (expected,) = torch.autograd.grad(ref, weight, grad)
    torch.testing.assert_close(got, expected, equal_nan=True)


LOSSES = {
    "cross_entropy": lambda x, y: F.cross_entropy(x, y),
    "nll_loss sum, ignore 2": lambda x, y: F.nll_loss(x, y, ignore_index=2, reduction="sum"),
    "nll_loss none, ignore -7": lambda x, y: F.nll_loss(x, y, ignore_index=-7, reduction="none"),
    "one sample": lambda x, y: F.cross_entropy(x[0], y[0]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(LOSSES))
def test_a_target_out_of_range_raises_as_in_eager(name, backend):
    """A one-hot nll_loss would pick no class for a target out of range (a loss of 0): eager's
    IndexError instead, for the forward alone and for a training step; ignore_index passes."""
    loss = LOSSES[name]
    x = torch.randn(4, 5, requires_grad=True)
    compiled = toycomp.compile(loss, backend=backend)
    for good in ([0, 4, 2, 1], [2, 2, 3, 0], [-7, 1, 2, 3]):
        target = torch.tensor(good)
        try:
            expected = loss(x, target)
        except IndexError:  # -7 is only ignored by the loss that names it
            with pytest.raises(IndexError, match="out of bounds"):
                compiled(x, target)
            continue
        torch.testing.assert_close(compiled(x, target), expected)
    for bad in ([5, 0, 2, 1], [-1, 1, 0, 3], [100, 1, 2, 3]):  # (the first: for "one sample")
        target = torch.tensor(bad)
        with pytest.raises(IndexError, match="out of bounds"):
            loss(x, target)
        with pytest.raises(IndexError, match="out of bounds"):
            compiled(x, target).sum().backward()
        with torch.no_grad(), pytest.raises(IndexError, match="out of bounds"):
            compiled(x, target)


ONE_HOTS = {
    "positional": lambda i: F.one_hot(i, 5).float().sum(0),
    "keyword": lambda i: F.one_hot(i * 2, num_classes=5).sum(0),
    "in a graph": lambda i: (F.one_hot(i + 1, 6).float() @ torch.arange(6.0)).exp(),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(ONE_HOTS))
def test_one_hot_of_a_class_out_of_range_raises_as_in_eager(name, backend):
    """ATen's one_hot, traced on fake tensors, skips eager's range check: the capture checks
    the classes first (toycomp::check_one_hot), with eager's RuntimeError."""
    fn = ONE_HOTS[name]
    compiled = toycomp.compile(fn, backend=backend)
    for classes in ([0, 2, 1], [4, 5, 6], [-1, 0, 1], [-3, 1, 2]):
        classes = torch.tensor(classes)
        try:
            expected = fn(classes)
        except RuntimeError as e:
            message = str(e).split(".")[0].removeprefix("one_hot: ")
            with pytest.raises(RuntimeError, match=message):
                compiled(classes)
        else:
            torch.testing.assert_close(compiled(classes), expected)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_the_index_check_on_a_gpu_does_not_wait_for_the_gpu():
    weight = torch.randn(10, 4, device="cuda")
    indices = torch.tensor([[1, 3], [0, 9]], device="cuda")
    compiled = toycomp.compile(embed, backend="triton")
    expected = embed(indices, weight)
    torch.testing.assert_close(compiled(indices, weight), expected)  # compiles, syncs
    torch.cuda.set_sync_debug_mode("error")  # any host-device synchronisation now raises
    try:
        out = compiled(indices, weight)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out, expected)


GPU_CHECKS = {  # a compiled function, a good input, a bad one (the other argument: x)
    "embedding": ("lambda i, x: F.embedding(i, x).sin()", "[1, 9]", "[1, 10]"),
    "cross_entropy": ("lambda t, x: F.cross_entropy(x, t)", "[0, 9, -100]", "[0, 10, 2]"),
    "cross_entropy, ignore 3": ("lambda t, x: F.cross_entropy(x, t, ignore_index=3)",
                                "[0, 9, 3]", "[0, -100, 3]"),
    "one_hot": ("lambda c, x: F.one_hot(c, 10).float() @ x", "[0, 9, 4]", "[-1, 2, 3]"),
    "strided targets": ("lambda t, x: F.cross_entropy(x, t[:, 0])", "[[1, 0], [2, 0], [3, 0]]",
                        "[[1, 0], [10, 0], [3, 0]]"),
}  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("name", list(GPU_CHECKS))
def test_a_value_out_of_range_on_a_gpu_is_a_device_side_assert_as_in_eager(name):
    """[Note: checks in one launch]: the good input gives eager's values, the bad one a
    device-side assert (which leaves the CUDA context unusable: each case in a process of its
    own)."""
    fn, good, bad = GPU_CHECKS[name]
    code = (
        "import torch, toycomp, torch.nn.functional as F\n"
        f"fn = {fn}\n"
        "f = toycomp.compile(fn, backend='triton')\n"
        "x = torch.randn(3, 10, device='cuda') if 'embedding' not in %r else "
        "torch.randn(10, 4, device='cuda')\n"
        "x = x.t().contiguous() if 'one_hot' in %r else x\n"
        f"i = torch.tensor({good}, device='cuda')\n"
        "torch.testing.assert_close(f(i, x), fn(i, x))\n"
        "torch.cuda.synchronize()\n"
        "print('good ok', flush=True)\n"
        f"f(torch.tensor({bad}, device='cuda'), x)\n"
        "torch.cuda.synchronize()\n"
    ) % (name, name)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "good ok" in run.stdout, run.stderr[-2000:]
    assert run.returncode != 0
    assert "device-side assert" in run.stderr or "out of" in run.stderr


@needs_cuda
def test_a_check_on_a_gpu_is_one_kernel():
    """The target check of a training step is one launch of ``check_range_kernel``, not the
    chain of small kernels its torch-op spelling launches (compare, any, assert, clone)."""
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(8, 5).cuda()
    step = toycomp.compile(lambda x, t: F.cross_entropy(model(x), t), backend="triton")
    x, t = torch.randn(6, 8, device="cuda"), torch.tensor([0, 4, 2, 1, 3, 3], device="cuda")
    step(x, t).backward()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(x, t).backward()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("check_range_kernel" in k for k in kernels) == 1, kernels
    assert not any("assert_async" in k or "compare_scalar" in k for k in kernels), kernels


def test_the_check_kernel_copies_its_input():
    """The kernel of [Note: checks in one launch], in Triton's interpreter: each kind of check
    writes the values it read. (The interpreter does not run tl.device_assert: the asserts are
    tested on a GPU, above.)"""
    from toycomp._triton_compat import interpreted_function
    from toycomp.inductor import check_kernels

    kernel = interpreted_function(check_kernels.check_range_kernel)
    for check in (check_kernels.INDICES, check_kernels.TARGETS, check_kernels.ONE_HOT):
        t = torch.randint(0, 10, (2500,))
        out = torch.full_like(t, -1)
        grid = (triton_cdiv(t.numel(), check_kernels.BLOCK),)
        kernel[grid](t, out, t.numel(), 10, 0, BLOCK=check_kernels.BLOCK, CHECK=check,
                     HAS_IGNORE=False)  # fmt: skip
        assert torch.equal(out, t)


def triton_cdiv(n, d):
    return -(-n // d)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integers_to_a_negative_power_raise_as_in_eager(backend):
    """Eager refuses ``int_tensor ** -1`` (the result would be 0 or 1 under integer rounding):
    the op runs as an eager fallback, which raises; other exponents still compile."""
    x = torch.tensor([2, 3, -1])
    for fn in (lambda a: a ** -1 + 1, lambda a: a.pow(-2), lambda a: (a > 0) ** -1):
        with pytest.raises(RuntimeError, match="negative integer powers"):
            fn(x)
        with pytest.raises(RuntimeError, match="negative integer powers"):
            toycomp.compile(fn, backend=backend)(x)
    for fn in (lambda a: a ** 2 + 1, lambda a: a.float() ** -1, lambda a: a ** 0):
        torch.testing.assert_close(toycomp.compile(fn, backend=backend)(x), fn(x))
        assert not toycomp.explain(fn, x).fallbacks


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_eager_across_a_graph_break(mode):
    """embedding_bag's meta kernel sizes offset2bag and bag_size unlike its CPU kernel, so no
    graph can hold it: the capture breaks there, and values and gradients are eager's."""
    def fn(indices, weight, offsets):
        return F.embedding_bag(indices, weight.tanh(), offsets, mode=mode).sin().sum()

    indices, offsets = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2, 5])
    weight = torch.randn(10, 3, requires_grad=True)
    expected = fn(indices, weight, offsets)
    (grad_expected,) = torch.autograd.grad(expected, weight)
    got = toycomp.compile(fn)(indices, weight, offsets)
    (grad,) = torch.autograd.grad(got, weight)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad, grad_expected)
    ex = toycomp.explain(fn, indices, weight, offsets)
    assert ex.graph_break_count == 1 and "embedding_bag" in ex.break_reasons[0]


@pytest.mark.parametrize("dynamic", [None, True])
def test_one_hot_through_the_dynamo_backend_raises_as_in_eager(dynamic):
    """``torch.compile(backend="toycomp")``: Dynamo's graph gets the same check as toycomp's own
    capture (with dynamic sizes the graph is traced on fake tensors, and ATen's one_hot there
    skips the check: a class out of range gave a row of zeros)."""
    def fn(i):
        return F.one_hot(i, 5).float().sum(0) + F.one_hot(i * 1, num_classes=5).sum(0)

    compiled = torch.compile(fn, backend=toycomp.toycomp_backend, dynamic=dynamic)
    good = torch.tensor([0, 2, 4])
    torch.testing.assert_close(compiled(good), fn(good))
    for bad, message in (([0, 7], "smaller than num_classes"), ([-1, 2, 3], "non-negative")):
        with pytest.raises(RuntimeError, match=message):
            fn(torch.tensor(bad))
        with pytest.raises(RuntimeError, match=message):
            compiled(torch.tensor(bad))
