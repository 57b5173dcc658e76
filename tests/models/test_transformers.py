"""HuggingFace ``transformers`` models through toycomp: the code people actually run.

Eleven architectures (tests/models/hf_models.py: tiny configs, random weights), each with its
default attention (SDPA) and with ``attn_implementation="eager"``, one training step
(``loss = model(**batch).loss; loss.backward()``):

* capture, for all 22: no frame runs eagerly, and no more graphs nor graph breaks than real
  Dynamo makes of the same step (measured here, with ``torch._dynamo.explain``); the captured
  graphs, run as they are, give eager's loss and gradients;
* the whole pipeline (``toycomp.compile``: AOT, prims, C++ kernels) for one model of each
  family: loss and every gradient equal to eager's (fp32: rtol 1e-4, atol 1e-5: two layers
  add no depth that needs more);
* the way users call a model: ``toycomp.compile(model)`` then ``model(**batch)``, and an
  inference forward under ``torch.no_grad()``.

Models run in eval mode (dropout off): dropout's random stream is not eager's in a compiled
graph, so a training-mode comparison would compare two random draws. Compiling every model
through stages 2-4 would take CI minutes per model (C++ compiles); the capture checks cover
every model, the compiled checks one of each kind.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from tests.models.hf_models import MODELS, batch, build, train_step
from toycomp.capture.convert_frame import CompileContext, summarize

import toycomp

RTOL, ATOL = 1e-4, 1e-5
ATTENTIONS = ["sdpa", "eager"]
# one model of each family: learned positions + tied head, encoder MLM, rotary + GQA,
# encoder-decoders (BART; T5 with its default config, whose forward deep-copies it), vision
COMPILED = ["gpt2", "bert", "llama", "bart", "t5", "vit"]


def eager_step(model, inputs):
    """The oracle: eager's loss and every parameter's gradient."""
    model.zero_grad(set_to_none=True)
    loss = train_step(model, inputs)
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def check_same(loss, grads, loss_ref, grads_ref):
    torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
    assert grads.keys() == grads_ref.keys()
    for name, ref in grads_ref.items():
        if ref is None:  # not reached by the loss (a pooler): None, as in eager
            assert grads[name] is None, name
        else:
            torch.testing.assert_close(grads[name], ref, rtol=RTOL, atol=ATOL, msg=name)


def eager_frames(log) -> list[str]:
    """Records of frames (or frame tails) that run eagerly instead of being compiled."""
    return [f"{r.frame}: {r.break_reason}" for r in log
            if r.break_reason and (r.break_reason.startswith(("frame skipped", "runs eagerly"))
                                   or "step_unsupported" in r.break_reason)]


def dynamo_counts(model, inputs) -> tuple[int, int]:
    """Real Dynamo's graph count and number of graph breaks on the same training step."""
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = torch._dynamo.explain(train_step)(copy.deepcopy(model), inputs)
    torch._dynamo.reset()
    return ex.graph_count, len(ex.break_reasons)


@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("name", list(MODELS))
def test_capture_matches_dynamo(name, attn):
    model, inputs = build(name, attn).eval(), batch(name)
    loss_ref, grads_ref = eager_step(copy.deepcopy(model), inputs)
    context = CompileContext(lambda gm, example_inputs: gm.forward)  # graphs run as captured
    ex = summarize(context, context.frame_for(train_step)(model, inputs))
    check_same(ex.out.detach(), {n: p.grad for n, p in model.named_parameters()},
               loss_ref, grads_ref)
    assert eager_frames(context.log) == []
    assert ex.graph_count >= 1
    graphs, breaks = dynamo_counts(build(name, attn).eval(), inputs)
    assert ex.graph_count <= graphs, (ex.graph_count, graphs, ex.break_reasons)
    assert ex.graph_break_count <= breaks, (ex.graph_break_count, breaks, ex.break_reasons)


@pytest.mark.parametrize("name", COMPILED)
def test_training_step_compiled(name):
    model, inputs = build(name).eval(), batch(name)
    loss_ref, grads_ref = eager_step(copy.deepcopy(model), inputs)
    step = toycomp.compile(train_step)
    loss = step(model, inputs).detach()
    grads = {n: p.grad for n, p in model.named_parameters()}
    check_same(loss, grads, loss_ref, grads_ref)
    assert step.eager_reason is None and eager_frames(step.context.log) == []
    assert len(step.entries) == 1  # the forward and loss: one graph, through stages 2-4


def test_compiled_model_called_as_users_do():
    """``toycomp.compile(model)``, then ``model(**batch)`` in training and under no_grad."""
    model, inputs = build("llama").eval(), batch("llama")
    reference = copy.deepcopy(model)
    loss_ref, grads_ref = eager_step(reference, inputs)
    compiled = toycomp.compile(model)
    out = compiled(**inputs)
    assert type(out).__name__ == "CausalLMOutputWithPast" and out.logits.shape[:2] == (2, 8)
    out.loss.backward()
    check_same(out.loss.detach(), {n: p.grad for n, p in model.named_parameters()},
               loss_ref, grads_ref)
    with torch.no_grad():
        logits_ref = reference(input_ids=inputs["input_ids"]).logits
        logits = compiled(input_ids=inputs["input_ids"]).logits
    assert not logits.requires_grad
    torch.testing.assert_close(logits, logits_ref, rtol=RTOL, atol=ATOL)
    assert compiled.eager_reason is None and eager_frames(compiled.context.log) == []
