"""A character-level GPT trained by toycomp: the model of notebook 05, and its GPU benchmark.

    python benchmarks/gpt.py                    # CPU, the notebook's small configuration
    python benchmarks/gpt.py --device cuda      # GPU-sized: 6 layers, d_model 384, context 256

The model is a decoder-only transformer in the style of nanoGPT: token and position embeddings,
``n_layer`` blocks of (LayerNorm, causal self-attention, residual, LayerNorm, GELU MLP,
residual), a final LayerNorm and a linear head, trained with cross-entropy over the characters
of Python's standard-library sources. The training step (forward, loss, backward) is what
``toycomp.compile`` compiles; AdamW stays eager (torch.optim, its ``foreach`` implementation).

The script trains the same model from the same initialisation on the same batches with eager
PyTorch, ``torch.compile`` and ``toycomp.compile`` (one run, one process), checks that the first
losses agree, and prints the median time per step (forward, backward and the optimizer step),
tokens per second, and toycomp / torch.compile. A measurement, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import copy
import math
import pathlib
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int = 32  # the context: characters the model sees at once
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    attention: str = "decomposed"  # or "sdpa": F.scaled_dot_product_attention(is_causal=True)


SMALL = dict(block_size=32, n_layer=2, n_head=4, n_embd=64)  # the notebook's, on a 2-core CPU
GPU_SIZED = dict(block_size=256, n_layer=6, n_head=6, n_embd=384)  # nanoGPT's Shakespeare-char


def causal_mask(t: int, device: torch.device) -> torch.Tensor:
    """(t, t) bools, True where query i may see key j (j <= i), built inside the graph."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.attention = cfg.n_head, cfg.attention
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            att = att.masked_fill(causal_mask(t, x.device).logical_not(), float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer over characters: (b, t) token ids -> (b, t, vocab) logits."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        return self.lm_head(self.ln_f(self.blocks(x)))


def loss_fn(model: GPT) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The function toycomp compiles: (inputs, targets) -> mean cross-entropy of the next char."""

    def loss(idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model(idx)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    return loss


# --- the data: Python's own sources, read from disk ----------------------------------------------
def read_corpus(max_chars: int = 1_000_000) -> str:
    """The first ``max_chars`` characters of the standard library's top-level ``.py`` files,
    in sorted order (the same text on every machine with the same Python version)."""
    stdlib = pathlib.Path(sys.modules["os"].__file__).parent
    parts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


class CharData:
    """Characters -> ids (sorted vocabulary), and seeded random batches of (inputs, targets)."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.data = torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())

    def batches(self, n: int, batch: int, block: int, seed: int = 0, device: str = "cpu"):
        """``n`` batches of (inputs, targets), each (batch, block); the same for the same seed."""
        gen = torch.Generator().manual_seed(seed)
        for _ in range(n):
            starts = torch.randint(len(self.data) - block - 1, (batch,), generator=gen)
            x = torch.stack([self.data[s : s + block] for s in starts.tolist()])
            y = torch.stack([self.data[s + 1 : s + 1 + block] for s in starts.tolist()])
            yield x.to(device), y.to(device)


def make_optimizer(model: nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, foreach=True)


def train_step(step: Callable, optimizer: torch.optim.Optimizer, x, y) -> torch.Tensor:
    """One training step: the (compiled) forward + loss, backward, then AdamW (eager)."""
    optimizer.zero_grad(set_to_none=True)
    loss = step(x, y)
    loss.backward()
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def sample(model: GPT, data: CharData, prompt: str, n: int, seed: int = 0) -> str:
    """``n`` characters after ``prompt``, sampled (multinomial, seeded) from eager ``model``."""
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    idx = data.encode(prompt)[None].to(device)
    for _ in range(n):
        logits = model(idx[:, -model.cfg.block_size :])[0, -1].float().cpu()
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
        idx = torch.cat([idx, nxt[None].to(device)], dim=1)
    return data.decode(idx[0])


# --- the benchmark ------------------------------------------------------------------------------
def time_steps(step: Callable[[], object], device: str, steps: int) -> float:
    """Median seconds per ``step()`` over ``steps`` calls (each synchronised on a GPU)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    import toycomp

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per compiler")
    parser.add_argument("--attention", choices=["decomposed", "sdpa"], default="decomposed")
    args = parser.parse_args()
    device = args.device
    sizes = GPU_SIZED if device == "cuda" else SMALL
    batch = args.batch or (64 if device == "cuda" else 16)
    data = CharData(read_corpus())
    cfg = GPTConfig(data.vocab_size, attention=args.attention, **sizes)
    torch.manual_seed(0)
    base = GPT(cfg).to(device)
    n_params = sum(p.numel() for p in base.parameters())
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{name}; torch {torch.__version__}; python {sys.version.split()[0]}", end="")
    if device == "cuda":
        import triton

        print(f"; triton {triton.__version__}", end="")
    print(f"\n{cfg}, batch {batch}, {n_params / 1e6:.2f}M parameters")
    tokens = batch * cfg.block_size
    warmup = 3
    batches = list(data.batches(warmup + args.steps, batch, cfg.block_size, device=device))
    compilers = {
        "eager": lambda fn: fn,
        "torch.compile": torch.compile,
        "toycomp": lambda fn: toycomp.compile(fn),
    }
    results, losses = {}, {}
    for label, compiler in compilers.items():
        model = copy.deepcopy(base)
        opt = make_optimizer(model)
        step = compiler(loss_fn(model))
        it = iter(batches)
        start = time.perf_counter()
        first = [train_step(step, opt, *next(it)) for _ in range(warmup)]
        compile_s = time.perf_counter() - start
        results[label] = time_steps(lambda: train_step(step, opt, *next(it)), device, args.steps)
        losses[label] = torch.stack(first).cpu()
        print(f"  {label}: first {warmup} steps (with compilation) {compile_s:.1f} s", flush=True)
    diff = (losses["toycomp"] - losses["eager"]).abs().max().item()
    print(f"first {warmup} losses, toycomp vs eager: max difference {diff:.1e}")
    print(f"{'':15}{'ms/step':>10}{'tokens/s':>12}{'vs eager':>10}{'toycomp/this':>14}")
    for label, seconds in results.items():
        print(
            f"{label:15}{seconds * 1e3:>10.2f}{tokens / seconds:>12,.0f}"
            f"{results['eager'] / seconds:>9.2f}x{results['toycomp'] / seconds:>13.2f}x"
        )


if __name__ == "__main__":
    main()
