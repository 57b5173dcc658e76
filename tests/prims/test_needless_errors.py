"""Programs eager runs that used to stop with an internal error in the decompositions.

Each is compared with eager: values, gradients, and module state (running statistics).
"""

import copy

import pytest
import torch

import toycomp

BACKENDS = ["cpp", "triton"]


def _compile(fn, path):
    if path == "toycomp.compile":
        return toycomp.compile(fn)
    return torch.compile(fn, backend="toycomp")


def _grads(params):
    return [p.grad.clone() if p.grad is not None else None for p in params]


# --- batch norm backward with an input that does not require grad --------------------------
# Only the weight and bias need gradients: the backward's output_mask leaves grad_input
# undefined, and the decomposition returns None for it.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: torch.nn.BatchNorm2d(3), (2, 3, 4, 4)),
        (lambda: torch.nn.BatchNorm1d(5), (6, 5)),
        (lambda: torch.nn.BatchNorm1d(4), (3, 4, 7)),
        (lambda: torch.nn.BatchNorm2d(3, affine=False), (2, 3, 5, 5)),  # nothing needs a grad
    ],
    ids=["bn2d", "bn1d", "bn1d_3d", "bn2d_no_affine"],
)
def test_batch_norm_input_without_grad(make, shape, train, backend):
    torch.manual_seed(0)
    eager = make().train(train)
    with torch.no_grad():
        if eager.running_mean is not None:
            eager.running_mean.uniform_(-1, 1)
            eager.running_var.uniform_(0.5, 2)
    compiled_module = copy.deepcopy(eager)
    x = torch.randn(shape)
    weights = torch.linspace(-1, 1, x.numel()).reshape(shape)

    def fn(module, x):
        return (module(x) * weights).sum()

    expected = fn(eager, x)
    got = toycomp.compile(lambda x: fn(compiled_module, x), backend=backend)(x)
    torch.testing.assert_close(got, expected)
    if expected.requires_grad:
        expected.backward()
        got.backward()
    params_e, params_c = list(eager.parameters()), list(compiled_module.parameters())
    for ge, gc in zip(_grads(params_e), _grads(params_c)):
        torch.testing.assert_close(gc, ge)
    for be, bc in zip(eager.buffers(), compiled_module.buffers()):
        torch.testing.assert_close(bc, be)


# --- complex numbers in the gradient pass: a visible fallback, never an AttributeError -----
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: torch.view_as_real(torch.polar(a, b)).sum(),
        lambda a, b: (torch.view_as_real(torch.polar(a.abs() + 1, b)) * a[:, None]).sum(),
        lambda a, b: torch.view_as_real(torch.complex(a, b) * 2).pow(2).sum(),
        lambda a, b: torch.polar(a, b).abs().sum(),
    ],
    ids=["polar", "polar_mixed", "complex_mul", "polar_abs"],
)
def test_complex_in_the_gradient_pass(fn, backend):
    torch.manual_seed(0)
    a, b = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    a2, b2 = (t.detach().clone().requires_grad_() for t in (a, b))
    expected = fn(a, b)
    expected.backward()
    got = toycomp.compile(fn, backend=backend)(a2, b2)
    torch.testing.assert_close(got, expected)
    got.backward()
    torch.testing.assert_close(a2.grad, a.grad)
    torch.testing.assert_close(b2.grad, b.grad)


# --- x[mask] = v with gradients: the backward's x.grad[mask] has a data-dependent size -------
# The graph runs as captured (a visible fallback with a reason), never a FakeTensor error.
def _run_with_grads(fn, args, compiled):
    args = [a.detach().clone().requires_grad_(a.requires_grad) if a.is_floating_point() else a
            for a in args]  # fmt: skip
    out = compiled(*args)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return out, [a.grad for a in args if a.requires_grad]


@pytest.mark.parametrize("path", ["toycomp.compile", "torch.compile"])
@pytest.mark.parametrize(
    "fn, value_shape",
    [
        (lambda x, m, v: torch.index_put(x * 2, (m,), v), ()),
        (lambda x, m, v: x.clone().index_put_((m,), v, accumulate=True) * x, ()),
        (lambda x, m, v: torch.where(m, 0.0, x).index_put((m,), v.expand(m.shape)[m]), (6,)),
    ],
    ids=["index_put", "accumulate", "values_from_mask"],
)
def test_bool_mask_index_put_with_grad(fn, value_shape, path):
    torch.manual_seed(0)
    x, m = torch.randn(6, requires_grad=True), torch.rand(6) > 0.5
    v = torch.randn(value_shape, requires_grad=True)
    compiled = _compile(fn, path)
    expected, expected_grads = _run_with_grads(fn, [x, m, v], fn)
    got, got_grads = _run_with_grads(fn, [x, m, v], compiled)
    torch.testing.assert_close(got, expected)
    for e, g in zip(expected_grads, got_grads, strict=True):
        torch.testing.assert_close(g, e)


def test_bool_mask_setitem_with_grad_is_a_visible_fallback():
    def fn(x, m, v):
        y = x.clone()
        y[m] = v
        return y

    x, m, v = torch.randn(5, requires_grad=True), torch.rand(5) > 0.5, torch.tensor(2.0)
    v.requires_grad_()
    explanation = toycomp.explain(fn, x, m, v)
    assert "data-dependent" in (explanation.eager_reason or "")
    got, expected = toycomp.compile(fn)(x, m, v), fn(x, m, v)
    torch.testing.assert_close(got, expected)


# --- _embedding_bag: the CPU kernel's sizes, not the meta kernel's ---------------------------
@pytest.mark.parametrize("path", ["toycomp.compile", "torch.compile"])
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["sum", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "per_sample_weights"])
def test_embedding_bag(mode, weighted, path):
    if weighted and mode != 0:
        pytest.skip("per_sample_weights only with mode sum (eager's error)")
    torch.manual_seed(0)
    w, idx = torch.randn(10, 3, requires_grad=True), torch.randint(0, 10, (8,))
    off, psw = torch.tensor([0, 3, 5]), (torch.rand(8) if weighted else None)

    def fn(w, idx, off):
        out = torch.ops.aten._embedding_bag(w, idx, off, False, mode, False, psw)
        return out[0] * 2, out[2]  # the bags, and bag_size (an output the meta kernel sizes too)

    compiled = _compile(fn, path)
    w2 = w.detach().clone().requires_grad_()
    expected, got = fn(w, idx, off), compiled(w2, idx, off)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
    expected[0].sum().backward()
    got[0].sum().backward()
    torch.testing.assert_close(w2.grad, w.grad)
