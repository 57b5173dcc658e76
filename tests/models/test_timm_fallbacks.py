"""timm image models (benchmarks/real_models.py's families) through toycomp: one training step
with no ATen fallback, loss and gradients equal to eager's. Skipped where timm is not installed
(it is not a requirement of the course). Small members of the families and 32x32 images keep
the CPU compile short: ConvNeXt (depthwise 7x7 convolutions, channels-last LayerNorm),
ResNet (strided convolutions, BatchNorm, max pooling) and RegNet (grouped convolutions; its stages
run `for block in self.children()`, one graph)."""

from __future__ import annotations

import copy

import pytest
import torch

import toycomp
from tests.models.test_fallbacks import fallbacks

timm = pytest.importorskip("timm")
MODELS = ["convnext_atto", "resnet10t", "regnetx_002"]
KNOWN: dict[str, list[str]] = {}  # what is left on purpose, by model: nothing


def step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss


@pytest.mark.parametrize("name", MODELS)
def test_training_step_has_no_fallback(name):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, drop_rate=0.0).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    reference = copy.deepcopy(model)
    loss_ref = step(reference, x)
    compiled = toycomp.compile(step)
    loss = compiled(model, x)
    torch.testing.assert_close(loss.detach(), loss_ref.detach(), rtol=1e-4, atol=1e-5)
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    assert fallbacks(compiled) == KNOWN.get(name, [])
