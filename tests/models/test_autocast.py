"""Mixed precision through toycomp, as people train: ``torch.autocast`` around the loss.

GPT-2 and Llama training steps (tests/models/hf_models.py; on CUDA every model of the suite)
under bf16 autocast, through ``toycomp.compile`` and ``torch.compile(backend="toycomp")``: loss
and every gradient within autocast's tolerance of eager autocast's (bf16 has 8 bits of mantissa:
torch.testing's bf16 rtol, 1.6e-2, with an absolute floor for gradients near zero), or at most
three times as far from a float64 run as eager's, as TorchInductor's accuracy check judges. The CUDA
cases (bf16, and fp16 with ``torch.amp.GradScaler``) skip without a GPU.

Also: what the backend returns to Dynamo is opaque to it, as Inductor's is, so that Dynamo
never traces toycomp's generated code as if it were the user's.
"""

from __future__ import annotations

import copy

import pytest
import torch

import toycomp
from tests.models.hf_models import MODELS, batch, build

RTOL, ATOL = 1.6e-2, 1e-3
PATHS = ["toycomp.compile", "torch.compile"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def amp_step(device: str, dtype: torch.dtype, scaler=None):
    """One training step with the forward and loss under autocast (the backward outside)."""

    def step(model, inputs):
        with torch.autocast(device, dtype=dtype):
            loss = model(**inputs).loss
        (scaler.scale(loss) if scaler is not None else loss).backward()
        return loss

    return step


def compiled(step, path: str):
    torch._dynamo.reset()
    return toycomp.compile(step) if path == "toycomp.compile" else torch.compile(
        step, backend="toycomp")


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def assert_as_close_as_eager(got, want, want64, name, rtol=RTOL, atol=ATOL):
    """``got`` is within autocast's tolerance of eager's ``want``, or no further from the float64
    result ``want64`` than eager is, as TorchInductor's accuracy check judges mixed precision
    (torch._dynamo.utils.same: RMSE at most 3 times eager's, plus tol / 10, tol 1e-2): two bf16
    computations of one function may differ by more than bf16's rtol where neither is wrong."""
    if torch.allclose(got, want, rtol=rtol, atol=atol):
        return
    error, eager_error = rmse(got, want64), rmse(want, want64)
    assert error <= 3 * eager_error + 1e-3, f"{name}: RMSE {error:.2e}, eager's {eager_error:.2e}"


def check_amp_step(name, path, device, dtype, scaler=None):
    model = build(name).eval().to(device)
    inputs = {k: v.to(device) for k, v in batch(name).items()}
    reference, reference64 = copy.deepcopy(model), copy.deepcopy(model).double()
    step = amp_step(device, dtype, scaler)
    loss_ref = step(reference, inputs)
    loss64 = reference64(**inputs).loss
    loss64.backward()
    loss = compiled(step, path)(model, inputs)
    assert loss.dtype == loss_ref.dtype == torch.float32  # autocast's loss is fp32
    assert_as_close_as_eager(loss, loss_ref, loss64, "loss")
    params = zip(model.named_parameters(), reference.parameters(), reference64.parameters())
    for (n, p), ref, ref64 in params:
        assert p.grad.dtype == ref.grad.dtype == torch.float32, n
        assert_as_close_as_eager(p.grad, ref.grad, ref64.grad, n)
    torch._dynamo.reset()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_bf16_autocast_training_step_cpu(name, path):
    check_amp_step(name, path, "cpu", torch.bfloat16)


@cuda
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_autocast_training_step_cuda(name, path):
    """Every model of the capture suite, with SDPA (flash or cuDNN under bf16 on a GPU)."""
    check_amp_step(name, path, "cuda", torch.bfloat16)


@cuda
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_fp16_autocast_with_grad_scaler_cuda(name, path):
    """fp16 with loss scaling: the scaled gradients, unscaled, match eager's."""
    scaler, scaler_ref = torch.amp.GradScaler("cuda"), torch.amp.GradScaler("cuda")
    model = build(name).eval().cuda()
    inputs = {k: v.cuda() for k, v in batch(name).items()}
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    loss_ref = amp_step("cuda", torch.float16, scaler_ref)(reference, inputs)
    loss = compiled(amp_step("cuda", torch.float16, scaler), path)(model, inputs)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-2, atol=1e-3)
    scaler.unscale_(opt)
    scaler_ref.unscale_(opt_ref)
    for (n, p), ref in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, ref.grad, rtol=1e-2, atol=1e-3, msg=n)
    scaler.step(opt), scaler_ref.step(opt_ref)
    scaler.update(), scaler_ref.update()
    assert scaler.get_scale() == scaler_ref.get_scale()  # same inf/nan verdict as eager
    torch._dynamo.reset()


def test_backend_callable_is_opaque_to_dynamo():
    """A toycomp-compiled graph called inside another Dynamo-compiled function: Dynamo treats
    it as a call it does not trace (a graph break), never capturing toycomp's code."""
    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) * 2)
    x = torch.randn(8, requires_grad=True)
    inner = toycomp.toycomp_backend(gm, [x])
    seen = []

    def counting(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    torch._dynamo.reset()
    outer = torch.compile(lambda x: inner(x)[0].cos(), backend=counting)
    out = outer(x)
    out.sum().backward()
    torch.testing.assert_close(out, (torch.sin(x) * 2).cos())
    torch.testing.assert_close(x.grad, -torch.sin(torch.sin(x) * 2) * 2 * torch.cos(x))
    ops = {n.target for g in seen for n in g.graph.nodes if n.op == "call_function"}
    assert torch.sin not in ops and seen, ops  # the graph after the break: only cos
    torch._dynamo.reset()


@pytest.mark.parametrize("path", PATHS)
def test_grad_scaler_state_stays_real_cpu(path):
    """``scaler.scale(loss)`` inside the compiled step: the scaler's lazily made scale tensor is
    a real tensor afterwards (never a fake one from tracing), and the scaled gradients match
    eager's within autocast's tolerance, on the first call and the next."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    reference = copy.deepcopy(model)
    x = torch.randn(32, 8)

    def make_step(net, scaler):
        def step(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = net(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            return loss
        return step

    scaler, scaler_ref = torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")
    step, step_ref = compiled(make_step(model, scaler), path), make_step(reference, scaler_ref)
    for _ in range(2):
        model.zero_grad(), reference.zero_grad()
        torch.testing.assert_close(step(x), step_ref(x), rtol=RTOL, atol=ATOL)
        assert type(scaler._scale) is torch.Tensor  # not a FakeTensor left by tracing
        assert scaler.get_scale() == scaler_ref.get_scale()
        for p, ref in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, ref.grad, rtol=RTOL, atol=ATOL * scaler.get_scale())
    torch._dynamo.reset()


@pytest.mark.parametrize("path", PATHS)
def test_layer_norm_of_a_bf16_activation_cpu(path):
    """A LayerNorm right after a bf16 matmul (an MLP-Mixer's, a ViT's after its patch embedding):
    under CPU autocast its input is bf16 and its weight float32, ATen's "mixed type", whose CPU
    kernel keeps the statistics in float32 while the meta kernel gives bf16. Values and
    gradients against eager's, through both paths."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4))  # fmt: skip
    x = torch.randn(8, 16)

    def step(m, forward):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward(x).float().square().mean()
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in m.named_parameters()}

    mine = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled_model = toycomp.compile(mine) if path == "toycomp.compile" else torch.compile(
        mine, backend="toycomp")
    (loss, grads), (want_loss, want) = step(mine, compiled_model), step(model, model)
    model64 = copy.deepcopy(model).double()
    model64.zero_grad(set_to_none=True)
    model64(x.double()).square().mean().backward()
    want64 = {n: p.grad for n, p in model64.named_parameters()}
    assert_as_close_as_eager(loss, want_loss, model64(x.double()).square().mean().detach(), "loss")
    for name in want:
        assert_as_close_as_eager(grads[name], want[name], want64[name], name)


def test_mixed_type_layer_norm_cpu():
    """``F.layer_norm`` of a bf16 tensor with float32 weight and bias, outside autocast: eager's
    result and input gradient."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 32, dtype=torch.bfloat16, requires_grad=True)
    w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)

    def fn(x, w, b):
        return torch.nn.functional.layer_norm(x, (32,), w, b)

    got = toycomp.compile(fn)(x, w, b)
    want = fn(x, w, b)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    g = torch.randn_like(want)
    got_grads = torch.autograd.grad(toycomp.compile(fn)(x, w, b), (x, w, b), g)
    want_grads = torch.autograd.grad(fn(x, w, b), (x, w, b), g)
    for got_g, want_g in zip(got_grads, want_grads):
        assert got_g.dtype == want_g.dtype
        torch.testing.assert_close(got_g, want_g, rtol=RTOL, atol=5e-2)
