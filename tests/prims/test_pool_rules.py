"""Tests for toycomp.prims.pool_rules: max_pool2d with indices and its backward decompose, and
compiled values, indices and gradients match eager's. Eager PyTorch is the oracle."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import toycomp
from tests.prims import compiled_samples

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

POOL_OPS = {
    "aten.max_pool2d_with_indices.default", "aten.max_pool2d_with_indices_backward.default",
}  # fmt: skip
# The OpInfos enumerate 24 argument sets (ceil_mode, padding, dilation, return_indices) for each
# of 6 kernel/stride pairs and 10 inputs (3-d, 4-d, channels-last), 1440 samples. Every 181st
# (8 samples) visits 8 argument sets and most kernel/stride pairs and inputs. Each pooling is
# ~300 prims forward and backward (compile time), so fewer where the same code runs again:
# Triton's interpreter, and the backward's own OpInfo (max_pool2d's gradients run it too).
CASES = {
    ("nn.functional.max_pool2d", "cpp"): 181, ("nn.functional.max_pool2d", "triton"): 263,
    ("max_pool2d_with_indices_backward", "triton"): 409,
}  # fmt: skip

def opinfo_samples(name: str, every: int) -> tuple:
    info = next(i for i in op_db if i.name == name and not i.variant_test_name)
    torch.manual_seed(0)
    samples = info.sample_inputs("cpu", torch.float32, requires_grad=True)
    return info, list(itertools.islice(samples, 0, None, every))


@pytest.mark.parametrize("name, backend", list(CASES))
def test_opinfo_samples_compile_without_fallback(name, backend):
    info, samples = opinfo_samples(name, CASES[name, backend])
    calls = compiled_samples.SampleCalls(info.op, samples)
    compiled = compiled_samples.check(calls.fn, calls.tensors, backend)
    assert not set(compiled_samples.fallbacks(compiled)) & POOL_OPS


def _pools(x, x_ties, x_bf16):
    return [
        F.max_pool2d(x, 3, 2, 1, return_indices=True),
        F.max_pool2d(x_ties, 3, 1, 1, ceil_mode=True, return_indices=True),
        F.max_pool2d(x_bf16, 2, return_indices=True),
    ]


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_nan_inf_ties_and_bfloat16_follow_eager(backend):
    """Eager's rule: the first maximum of a window wins, a NaN wins (the last NaN of a window),
    a window of -inf gives the index of its first position inside the input."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 9)
    x[0, 0, 1, 1] = x[0, 0, 2, 2] = float("nan")
    x[1, 1, :4, :4] = -float("inf")
    x_ties = torch.randint(0, 3, (2, 3, 6, 6)).float()  # many equal maxima
    x_bf16 = torch.randn(2, 3, 6, 8).bfloat16()
    tensors = [t.requires_grad_() for t in (x, x_ties, x_bf16)]
    compiled = compiled_samples.check(_pools, tensors, backend)
    assert not set(compiled_samples.fallbacks(compiled)) & POOL_OPS


@pytest.mark.parametrize("training", [True, False])
def test_explain_lists_no_pool_or_batch_norm_fallback(training):
    """A ResNet stem (convolution, BatchNorm, ReLU, max pool) compiles with no fallback (the
    convolution's backward: prims/functional_rules.py)."""
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    stem.train(training)
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    explained = toycomp.explain(lambda x: stem(x).sum(), x, backend="triton")
    assert explained.fallbacks == []



def test_dynamic_shapes_batch_norm_decomposes_pooling_falls_back_visibly():
    """With every size symbolic BatchNorm still decomposes (its counts are SymInts); max pooling
    with a symbolic height or width stays an eager fallback that names its reason."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    ref = copy.deepcopy(model)
    compiled = toycomp.compile(lambda x: model(x).sum(), backend="cpp", dynamic=True)
    for n in (2, 3):
        x = torch.randn(n, 3, 8 + n, 7, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        compiled(x).backward()
        ref(x_ref).sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        torch.testing.assert_close(list(model.buffers()), list(ref.buffers()))
    assert len(compiled.entries) == 1
    graphs = compiled.entries[0].graphs
    assert sorted(f for g in graphs for f in g.fallbacks) == sorted(POOL_OPS)
    reasons = {n.meta.get("fallback_reason") for g in graphs for n in g.prims.graph.nodes}
    assert "max_pool2d with symbolic height or width" in reasons
