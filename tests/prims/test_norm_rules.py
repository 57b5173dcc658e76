"""Tests for toycomp.prims.norm_rules: BatchNorm, GroupNorm and their backwards decompose; values,
gradients and running statistics match eager's. Eager PyTorch is the oracle."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import toycomp
from tests.prims import compiled_samples
from toycomp.prims.decompositions import decompose, fallbacks

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

aten = torch.ops.aten
BATCH_NORM_OPS = {
    "aten.native_batch_norm.default", "aten._native_batch_norm_legit.default",
    "aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit_no_training.default",
    "aten._native_batch_norm_legit_functional.default", "aten.native_batch_norm_backward.default",
}  # fmt: skip


def opinfo_samples(name: str) -> list:
    """The OpInfo's fp32 samples with a channel dim (a 1-d input has none: it falls back, which
    the OpInfo sweep checks), inputs and parameters requiring grad."""
    info = next(i for i in op_db if i.name == name and not i.variant_test_name)
    torch.manual_seed(0)
    samples = info.sample_inputs("cpu", torch.float32, requires_grad=True)
    return info, [s for s in samples if s.input.ndim >= 2]


# One compiled function per OpInfo holds all its samples (training and eval mode, with and
# without weight/bias/running stats, 2-d to 4-d inputs, momentum 0, negative, and eps 0.6);
# each sample's outputs, input gradients and running statistics after the call are compared.
# native_batch_norm and _native_batch_norm_legit have the same samples: one backend each.
@pytest.mark.parametrize("name, backend", [
    ("nn.functional.batch_norm", "cpp"), ("nn.functional.batch_norm", "triton"),
    ("native_batch_norm", "triton"), ("_native_batch_norm_legit", "cpp"),
])  # fmt: skip
def test_opinfo_samples_compile_without_fallback(name, backend):
    info, samples = opinfo_samples(name)
    calls = compiled_samples.SampleCalls(info.op, samples)
    compiled = compiled_samples.check(calls.fn, calls.tensors, backend)
    assert not set(compiled_samples.fallbacks(compiled)) & BATCH_NORM_OPS


def _batch_norm_layouts(x_cl, x_bf16, x2, w, b, rm, rv, rm_b, rv_b):
    outs = []
    for training in (True, False):
        outs.append(F.batch_norm(x_cl, rm, rv, w, b, training, 0.2, 1e-3).relu())
        outs.append(F.batch_norm(x_bf16, rm_b, rv_b, w, b, training))  # float32 parameters
        outs.append(F.batch_norm(x2, None, None, None, None, True) if training else x2)
    return outs


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_channels_last_bfloat16_and_2d_inputs(backend):
    torch.manual_seed(0)
    x_cl = torch.randn(4, 3, 5, 6).to(memory_format=torch.channels_last)
    x_bf16 = (torch.randn(4, 3, 5, 6) * 4 + 1).bfloat16()
    x2, w, b = torch.randn(8, 3), torch.randn(3), torch.randn(3)
    stats = [torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.rand(3) + 0.5]
    tensors = [t.requires_grad_() for t in (x_cl, x_bf16, x2, w, b)] + stats
    # bfloat16 results round once from float32 in both: at most one bfloat16 step apart
    compiled = compiled_samples.check(_batch_norm_layouts, tensors, backend, rtol=1.6e-2, atol=1e-2)
    assert not set(compiled_samples.fallbacks(compiled)) & BATCH_NORM_OPS


def test_channels_last_result_keeps_eager_strides():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    rm, rv = torch.zeros(3), torch.ones(3)
    fn = lambda x: F.batch_norm(x, rm, rv, training=False) * 2  # noqa: E731
    got = toycomp.compile(fn, backend="cpp")(x)
    assert got.stride() == fn(x).stride()


# --- the decomposition itself: which ops, and the ones refused ---------------------------------
@pytest.mark.parametrize("training", [True, False])
def test_explain_lists_no_batch_norm_fallback(training):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train(training)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    explained = toycomp.explain(lambda x: model(x).relu().sum(), x, backend="triton")
    assert not set(explained.fallbacks) & BATCH_NORM_OPS, explained.fallbacks


def test_in_place_running_stat_update_is_refused_visibly():
    """A graph that was not functionalised keeps ``native_batch_norm``'s hidden update: the op
    stays a visible fallback (dropping the update would be silently wrong)."""
    x, rm, rv = torch.randn(4, 3, 5), torch.zeros(3), torch.ones(3)
    def fn(x, rm, rv):
        return aten.native_batch_norm(x, None, None, rm, rv, True, 0.1, 1e-5)[0]

    gm = make_fx(fn)(x, rm.clone(), rv.clone())
    dgm = decompose(gm, [x, rm, rv])
    assert fallbacks(dgm) == ["aten.native_batch_norm.default"]
    rm_ref, rv_ref = rm.clone(), rv.clone()
    torch.testing.assert_close(dgm(x, rm, rv), fn(x, rm_ref, rv_ref))
    torch.testing.assert_close((rm, rv), (rm_ref, rv_ref))


def test_eps_zero_on_a_constant_channel_gives_eager_invstd():
    """Eager's InvStd is 0, not inf, where the variance and eps are both 0."""
    x = torch.randn(4, 2, 3)
    x[:, 1] = 2.0
    def fn(x):
        return aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1, 0.0)

    dgm = decompose(make_fx(fn)(x), [x])
    assert fallbacks(dgm) == []
    for got, want in zip(dgm(x), fn(x), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_group_norm_trains_like_eager_with_dynamic_batch(backend):
    """GroupNorm and its backward decompose (no eager fallback): values and the input, weight
    and bias gradients match eager's for batches of 2, 3 and 5 under one dynamic compile."""
    torch.manual_seed(0)
    gn = nn.GroupNorm(2, 6)
    step = lambda x: gn(x).relu().sum()  # noqa: E731
    compiled = toycomp.compile(step, backend=backend, dynamic=True)
    for n in (2, 3, 5):
        x = torch.randn(n, 6, 4, 4)
        results = []
        for f in (compiled, step):
            gn.zero_grad()
            a = x.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                loss = f(a)
                loss.backward()
            results.append((loss.detach(), a.grad, gn.weight.grad.clone(), gn.bias.grad.clone()))
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert compiled.compile_count == 1
