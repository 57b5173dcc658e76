"""A character-level GPT trained by toycomp: the model of notebook 05, and its GPU benchmark.

    python benchmarks/gpt.py                    # CPU, the notebook's small configuration
    python benchmarks/gpt.py --device cuda      # GPU-sized: 6 layers, d_model 384, context 256
    python benchmarks/gpt.py --device cuda --attention decomposed,sdpa
    python benchmarks/gpt.py --device cuda --dtype bf16  # forward and loss under bf16 autocast

The model is a decoder-only transformer in the style of nanoGPT: token and position embeddings,
``n_layer`` blocks of (LayerNorm, causal self-attention, residual, LayerNorm, GELU MLP,
residual), a final LayerNorm and a linear head, trained with cross-entropy over characters.
The text is read from disk: the Zen of Python (the standard library's ``this.py``, the same in
every Python version, so notebook 05's outputs do not depend on it) or the first megabyte of
the standard library's own sources. The training step (forward, loss, backward) is what
``toycomp.compile`` compiles; AdamW stays eager (torch.optim, its ``foreach`` implementation).

The script trains the same model from the same initialisation on the same batches with eager
PyTorch, ``torch.compile`` and ``toycomp.compile``, in one process, checks that the first losses
agree, and prints the median time per training step (forward, backward and AdamW), tokens per
second and the ratios; then, on a GPU, one profiled step of each: kernels launched and their
device time, which tells host overhead from slow kernels. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import codecs
import copy
import gc
import math
import pathlib
import re
import statistics
import sys
import sysconfig
import time
from collections import Counter
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


# --- the data: read from the standard library on disk --------------------------------------------
STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])


def zen_of_python() -> str:
    """The Zen of Python: ``this.py`` holds it ROT13-encoded (and prints it when imported)."""
    source = (STDLIB / "this.py").read_text(encoding="utf-8")
    return codecs.decode(source.split('"""')[1], "rot13")


def stdlib_sources(max_chars: int = 1_000_000) -> str:
    """The first ``max_chars`` characters of the standard library's top-level ``.py`` files in
    sorted order (which differ from one Python version to the next)."""
    parts, total = [], 0
    for path in sorted(STDLIB.glob("*.py")):
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        total += len(parts[-1])
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


def make_optimizer(model: nn.Module, lr: float = 3e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, foreach=True)


def train_step(step: Callable, optimizer: torch.optim.Optimizer, x, y) -> torch.Tensor:
    """One training step: the (compiled) forward + loss, backward, then AdamW (eager)."""
    optimizer.zero_grad(set_to_none=True)
    loss = step(x, y)
    loss.backward()
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def sample(model: GPT, data: CharData, prompt: str, n: int, temperature: float = 1.0,
           seed: int = 0) -> str:  # fmt: skip
    """``prompt`` and ``n`` characters sampled after it from eager ``model``: softmax(logits /
    temperature), drawn with a seeded generator (the same text on every run)."""
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    idx = data.encode(prompt)[None].to(device)
    for _ in range(n):
        logits = model(idx[:, -model.cfg.block_size :])[0, -1].float().cpu()
        nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)
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


def profile_step(step: Callable[[], object]) -> tuple[int, float]:
    """(GPU kernels launched, their total device time in seconds) in one ``step()``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels), sum(e.device_time for e in kernels) * 1e-6  # us -> s


def top_kernels(label: str, step: Callable, model: nn.Module, x, y, origins: dict, k: int) -> None:
    """Print the ``k`` GPU kernels with the most device time in the forward, then in the
    backward, of one call of ``step``; toycomp's with the FX nodes they came from."""
    from torch.profiler import ProfilerActivity, profile

    def run(graph: str, fn: Callable[[], object]) -> None:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        totals, counts = Counter(), Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                totals[e.name] += e.device_time * 1e-3
                counts[e.name] += 1
        print(f"  {label} {graph}: {sum(counts.values())} kernels, {sum(totals.values()):.2f} ms")
        for name, ms in totals.most_common(k):
            made_of = origins.get((graph, name), "")
            print(f"    {ms:7.3f} ms {counts[name]:3d}x {name[:70]} {made_of}"[:160])

    model.zero_grad(set_to_none=True)
    holder = []
    run("forward", lambda: holder.append(step(x, y)))
    run("backward", lambda: holder[0].backward())


def toycomp_origins(compiled) -> dict:
    """(graph name, kernel name) -> the prims it computes (names without _N), for top_kernels."""
    out = {}
    for g in compiled.entries[0].graphs:
        for kernel in g.compiled.kernels:
            ops = dict.fromkeys(re.sub(r"_\d+$", "", o) for o in kernel.origins)
            out[(g.name, kernel.name)] = ",".join(ops)
    return out


def kernel_counts(compiled) -> str:
    """toycomp's generated kernels + extern calls per graph: "forward 18+13, backward 31+28"."""
    graphs = compiled.entries[0].graphs
    return ", ".join(
        f"{g.name} {len(g.compiled.kernels)}+{len(g.compiled.externs)}" for g in graphs
    )


def under_autocast(step: Callable, device: str) -> Callable:
    """``step`` run under bf16 autocast, as mixed-precision training runs its forward and loss
    (the backward, outside it, follows the forward's dtypes)."""

    def run(x, y):
        with torch.autocast(device, dtype=torch.bfloat16):
            return step(x, y)

    return run


def benchmark(
    data: CharData, device: str, attention: str, batch: int, steps: int, top: int = 0,
    dtype: str = "fp32",
) -> None:
    import toycomp

    sizes = GPU_SIZED if device == "cuda" else SMALL
    cfg = GPTConfig(data.vocab_size, attention=attention, **sizes)
    torch.manual_seed(0)
    base = GPT(cfg).to(device)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"\n{cfg}\nbatch {batch}, {n_params / 1e6:.2f}M parameters, {dtype}", flush=True)
    tokens, warmup = batch * cfg.block_size, 3
    batches = list(data.batches(warmup + steps + 1, batch, cfg.block_size, device=device))
    compilers = {"eager": lambda fn: fn, "torch.compile": torch.compile, "toycomp": toycomp.compile}
    results, losses, profiles = {}, {}, {}
    for label, compiler in compilers.items():
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        opt = make_optimizer(model)
        compiled = step = compiler(loss_fn(model))
        if dtype == "bf16":
            step = under_autocast(compiled, device)
        it = iter(batches)
        start = time.perf_counter()
        losses[label] = torch.stack([train_step(step, opt, *next(it)) for _ in range(warmup)])
        first = time.perf_counter() - start
        gc.collect()  # the compilers' garbage: no collection of it inside the timed steps
        results[label] = time_steps(lambda: train_step(step, opt, *next(it)), device, steps)
        if device == "cuda":
            try:
                profiles[label] = profile_step(lambda: train_step(step, opt, *batches[-1]))
            except Exception as e:  # noqa: BLE001 - a measurement: report and go on
                print(f"  {label}: profiling failed: {e!r}")
                profiles[label] = (-1, 0.0)
        if top and device == "cuda" and label != "eager":
            origins = toycomp_origins(compiled) if label == "toycomp" else {}
            top_kernels(label, step, model, *batches[-1], origins, top)
        extra = f"; toycomp kernels+externs {kernel_counts(compiled)}" if label == "toycomp" else ""
        print(f"  {label}: first {warmup} steps (compiling) {first:.1f} s{extra}", flush=True)
    diff = (losses["toycomp"] - losses["eager"]).abs().max().item()
    print(f"first {warmup} losses {losses['eager'].tolist()}; toycomp - eager: {diff:.1e}")
    print(f"{'':15}{'ms/step':>10}{'tokens/s':>12}{'vs eager':>10}{'toycomp/this':>14}", end="")
    print(f"{'GPU kernels':>13}{'kernel ms':>11}" if profiles else "")
    for label, seconds in results.items():
        print(
            f"{label:15}{seconds * 1e3:>10.2f}{tokens / seconds:>12,.0f}"
            f"{results['eager'] / seconds:>9.2f}x{results['toycomp'] / seconds:>13.2f}x", end=""
        )
        count, device_s = profiles.get(label, (None, None))
        print(f"{count:>13}{device_s * 1e3:>11.2f}" if profiles else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch", type=int, default=None, help="64 on cuda, 16 on cpu")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per compiler")
    parser.add_argument("--attention", default="decomposed", help="decomposed, sdpa or both")
    parser.add_argument("--text", choices=["stdlib", "zen"], default="stdlib")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: forward and loss under bf16 autocast")
    parser.add_argument("--top", type=int, default=0, help="on cuda: print the N slowest kernels")
    args = parser.parse_args()
    data = CharData(stdlib_sources() if args.text == "stdlib" else zen_of_python())
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    versions = f"torch {torch.__version__}, python {sys.version.split()[0]}"
    if args.device == "cuda":
        import triton

        versions += f", triton {triton.__version__}, CUDA {torch.version.cuda}"
    print(f"{time.strftime('%Y-%m-%d')}, {name}, {versions}")
    print(f"text: {args.text}, {len(data.data):,} characters, vocabulary {data.vocab_size}")
    batch = args.batch or (64 if args.device == "cuda" else 16)
    for attention in args.attention.replace("both", "decomposed,sdpa").split(","):
        benchmark(data, args.device, attention, batch, args.steps, args.top, args.dtype)


if __name__ == "__main__":
    main()
