"""CPU stand-ins for the CUDA attention kernels: CI runs what they return through toycomp.

Input -> output: nothing; ``registered()`` is a context manager that gives
``aten._scaled_dot_product_{flash,efficient,cudnn}_attention`` (and their backwards) a CPU
kernel for as long as it is open. Each returns what its CUDA kernel returns, in kind, dtype,
shape and device (read from torch/_meta_registrations.py and
aten/src/ATen/native/transformers/cuda/attention.cu):

- flash: ``(out, lse, None, None, max_q: int, max_k: int, rng_state, unused, debug_mask)``
  with ``rng_state`` a (2,) uint64 tensor and ``unused`` a 0-d uint64 one, on the device;
- memory-efficient: ``(out, lse, seed, offset)``, the seed and offset 0-d int64 tensors on the
  CPU when the inputs are on CUDA (here: on the CPU, where everything is); ``lse`` padded to a
  multiple of 32 queries;
- cuDNN: ``(out, lse, None, None, max_q: int, max_k: int, seed, offset, None)``, ``lse`` of
  shape (B, H, L, 1).

The values are the math attention's, computed in float32. Dropout draws its mask from a
generator seeded by a number that the forward draws from the global generator and returns in its
seed tensor(s): the backward rebuilds the mask from the seed it is given, as the CUDA backwards
do from the Philox seed and offset. A backward handed the wrong seed (a copy made before the
forward wrote it, another call's) computes gradients for another mask, and the test sees it.

Autograd's formulas for these ops (derivatives.yaml) are registered for every device, so eager
on CPU tensors runs forward and backward through these kernels, as on CUDA; fake tensors use the
ops' meta functions, as when toycomp compiles for CUDA.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten


def _mask(seed: int, shape, p: float) -> torch.Tensor:
    """Dropout's keep mask, scaled by 1 / (1 - p): the same for the same seed."""
    gen = torch.Generator().manual_seed(int(seed))
    return (torch.rand(shape, generator=gen) >= p).float() / (1 - p)


def _draw_seed() -> int:
    """A seed from the global generator: seeded runs draw the same, as CUDA's Philox offset.
    (Drawn outside any dispatch mode: a tracer running this kernel must not record its ops.)"""
    with _disable_current_modes():
        return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def _scores(q, k, bias, causal, scale):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q.float() @ k.float().transpose(-2, -1) * scale
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    if bias is not None:
        s = s + bias.float()
    return s, scale


def _forward(q, k, v, bias, causal, scale, p, seed):
    s, _ = _scores(q, k, bias, causal, scale)
    lse = torch.logsumexp(s, -1)
    probs = torch.exp(s - lse[..., None])
    if p > 0:
        probs = probs * _mask(seed, probs.shape, p)
    return (probs @ v.float()).to(q.dtype), lse


def _backward(grad, q, k, v, bias, lse, causal, scale, p, seed):
    s, scale = _scores(q, k, bias, causal, scale)
    probs = torch.exp(s - lse[..., None])
    keep = _mask(seed, probs.shape, p) if p > 0 else torch.ones(())
    grad = grad.float()
    grad_v = (probs * keep).transpose(-2, -1) @ grad
    grad_probs = (grad @ v.float().transpose(-2, -1)) * keep
    grad_s = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    grad_q = grad_s @ k.float() * scale
    grad_k = grad_s.transpose(-2, -1) @ q.float() * scale
    return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), grad_s


def _seed_of(seed: torch.Tensor) -> int:
    with _disable_current_modes():
        return int(seed.flatten()[0].to(torch.int64))


# -- flash ------------------------------------------------------------------------------------
def flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    seed = _draw_seed() if dropout_p > 0 else 0
    out, lse = _forward(q, k, v, None, is_causal, scale, dropout_p, seed)
    rng_state = torch.tensor([seed, 0], dtype=torch.int64).to(torch.uint64)
    unused = torch.zeros((), dtype=torch.uint64)
    debug = torch.empty(0, dtype=q.dtype)
    return out, lse, None, None, q.shape[2], k.shape[2], rng_state, unused, debug


def flash_backward(grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal,
                   rng_state, unused, *, scale=None):  # fmt: skip
    assert (cum_q, cum_k, max_q, max_k) == (None, None, q.shape[2], k.shape[2])
    assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,)
    seed = _seed_of(rng_state)
    return _backward(grad, q, k, v, None, lse, is_causal, scale, dropout_p, seed)[:3]


# -- memory-efficient ----------------------------------------------------------------------------
def efficient(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
              scale=None):  # fmt: skip
    if attn_bias is not None:  # the CUDA kernel's check_supported: rows 16-byte aligned
        assert attn_bias.stride(-1) == 1 and all(
            st % 8 == 0 for n, st in zip(attn_bias.shape[:-1], attn_bias.stride()) if n > 1
        ), f"attn_bias is not correctly aligned: strides {attn_bias.stride()}"
    seed = _draw_seed() if dropout_p > 0 else 0
    out, lse = _forward(q, k, v, attn_bias, is_causal, scale, dropout_p, seed)
    b, h, lq = lse.shape
    padded = torch.zeros(b, h, math.ceil(lq / 32) * 32 if compute_log_sumexp else 0)
    padded[..., :lq] = lse if compute_log_sumexp else 0
    # like CUDA's: `out` made as (B, L, H, E), returned transposed
    out = out.transpose(1, 2).contiguous().transpose(1, 2)
    return out, padded, torch.tensor(seed), torch.tensor(0)


def efficient_backward(grad, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, grad_input_mask,
                       is_causal=False, *, scale=None):  # fmt: skip
    assert seed.shape == () and seed.dtype == torch.int64
    lq = q.shape[2]
    grads = _backward(grad, q, k, v, attn_bias, lse[..., :lq], is_causal, scale, dropout_p,
                      _seed_of(seed))  # fmt: skip
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3]:
        grad_bias = grads[3].to(attn_bias.dtype)
    return (*grads[:3], grad_bias)


# -- cuDNN ------------------------------------------------------------------------------------
def cudnn(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
          return_debug_mask=False, *, scale=None):  # fmt: skip
    seed = _draw_seed() if dropout_p > 0 else 0
    out, lse = _forward(q, k, v, attn_bias, is_causal, scale, dropout_p, seed)
    return (out, lse[..., None], None, None, q.shape[2], k.shape[2], torch.tensor(seed),
            torch.tensor(0), None)  # fmt: skip


def cudnn_backward(grad, q, k, v, out, lse, seed, offset, attn_bias, cum_q, cum_k, max_q, max_k,
                   dropout_p, is_causal, *, scale=None):  # fmt: skip
    assert (cum_q, cum_k, max_q, max_k) == (None, None, q.shape[2], k.shape[2])
    assert seed.shape == () and seed.dtype == torch.int64
    grads = _backward(grad, q, k, v, attn_bias, lse[..., 0], is_causal, scale, dropout_p,
                      _seed_of(seed))  # fmt: skip
    return grads[:3]


KERNELS = {
    "_scaled_dot_product_flash_attention": flash,
    "_scaled_dot_product_flash_attention_backward": flash_backward,
    "_scaled_dot_product_efficient_attention": efficient,
    "_scaled_dot_product_efficient_attention_backward": efficient_backward,
    "_scaled_dot_product_cudnn_attention": cudnn,
    "_scaled_dot_product_cudnn_attention_backward": cudnn_backward,
}


@contextlib.contextmanager
def registered():
    """The stand-ins as the ops' CPU kernels while the context is open."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        for name, fn in KERNELS.items():
            lib.impl(name, fn, "CPU")
        yield
    finally:
        lib._destroy()
