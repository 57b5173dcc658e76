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


@needs_cuda
def test_an_index_out_of_range_on_a_gpu_is_a_device_side_assert_as_in_eager():
    # A device-side assert leaves the CUDA context unusable: run it in a process of its own.
    code = (
        "import torch, toycomp, torch.nn.functional as F\n"
        "f = toycomp.compile(lambda i, w: F.embedding(i, w).sin(), backend='triton')\n"
        "w = torch.randn(10, 4, device='cuda')\n"
        "f(torch.tensor([1, 9], device='cuda'), w)\n"
        "f(torch.tensor([1, 10], device='cuda'), w)\n"
        "torch.cuda.synchronize()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "device-side assert" in run.stderr or "index out of range" in run.stderr


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
