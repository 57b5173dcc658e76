"""Tiny HuggingFace ``transformers`` models for the tests: configs built in code, random weights,
nothing downloaded. Two layers, hidden size 32, sequences of 8 tokens: what the capture meets
in a real model (decorated ``forward``s, ``ModelOutput``s, masks, caches, rotary embeddings)
at a size the CPU compiles in seconds.
"""

from __future__ import annotations

import torch

transformers = __import__("pytest").importorskip("transformers")

BATCH, SEQ, VOCAB = 2, 8, 96
LAYERS = dict(num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=32)

# name -> (config class, model class, config arguments, the loss the head computes)
MODELS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(n_positions=32, n_embd=32, n_layer=2, n_head=2), "ForCausalLM"),
    "bert": ("BertConfig", "BertForMaskedLM",
             dict(hidden_size=32, max_position_embeddings=32, **LAYERS), "ForMaskedLM"),
    "distilbert": ("DistilBertConfig", "DistilBertForMaskedLM",
                   dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                        max_position_embeddings=32), "ForMaskedLM"),
    "albert": ("AlbertConfig", "AlbertForMaskedLM",
               dict(embedding_size=16, hidden_size=32, max_position_embeddings=32, **LAYERS),
               "ForMaskedLM"),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM",
                dict(hidden_size=32, max_position_embeddings=40, **LAYERS), "ForMaskedLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER, "ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM", DECODER, "ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", DECODER, "ForCausalLM"),
    "t5": ("T5Config", "T5ForConditionalGeneration",
           dict(d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                decoder_start_token_id=0), None),
    "bart": ("BartConfig", "BartForConditionalGeneration",
             dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                  max_position_embeddings=32), None),
    "vit": ("ViTConfig", "ViTForImageClassification",
            dict(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_labels=3,
                 **LAYERS), None),
}


def build(name: str, attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    """A tiny ``name`` model with random weights (``attn``: "sdpa" or "eager")."""
    config_cls, model_cls, kwargs, loss_type = MODELS[name]
    extra = {} if name == "vit" else dict(vocab_size=VOCAB)
    config = getattr(transformers, config_cls)(attn_implementation=attn, **kwargs, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config)
    if loss_type is not None:
        # A class name that names no loss (GPT2LMHeadModel) leaves ``model.loss_type`` None,
        # and each step then logs a warning (``logger.warning_once``: a graph break in Dynamo
        # and toycomp alike) before taking the default; naming the default avoids it.
        model.loss_type = loss_type
    return model


def batch(name: str, seed: int = 1) -> dict:
    """Inputs and labels for one training step of ``name``."""
    g = torch.Generator().manual_seed(seed)
    if name == "vit":
        return dict(pixel_values=torch.randn(BATCH, 3, 16, 16, generator=g),
                    labels=torch.randint(0, 3, (BATCH,), generator=g))
    inputs = dict(input_ids=torch.randint(3, VOCAB, (BATCH, SEQ), generator=g),
                  labels=torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))
    return inputs


def train_step(model, batch):
    """What a training loop runs: the loss, then its backward."""
    out = model(**batch)
    out.loss.backward()
    return out.loss
