"""Programs eager runs that used to stop with an internal error in the decompositions.

Each is compared with eager: values, gradients, and module state (running statistics).
"""

import copy

import pytest
import torch

import toycomp

BACKENDS = ["cpp", "triton"]


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
