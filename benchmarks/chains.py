"""Compile time against graph size: pointwise chains of 40 to 200 ops (``bench.py --compile-time``).

The chain is ``y = y * y.sigmoid() + y.sin()`` repeated (four ops a step), forward + backward on
1024 floats. toycomp's own time (capture to generated source) is the first call of a fresh
``toycomp.compile`` while the kernel cache already holds every kernel, so the C++ compiler does
not run; torch.compile's is a cold compile (``torch._dynamo.reset()``, Inductor's caches off).
Issue 9 asks for a 200-op chain under 2 s, and for time linear in the number of ops.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import torch

import toycomp


def pointwise_chain(steps: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def chain(y: torch.Tensor) -> torch.Tensor:
        for _ in range(steps):
            y = y * y.sigmoid() + y.sin()
        return y

    return chain


def first_call_seconds(compiled: Callable, x: torch.Tensor) -> float:
    """Seconds of the first call (compilation) of a training step: forward and backward."""
    start = time.perf_counter()
    compiled(x).sum().backward()
    return time.perf_counter() - start


def compile_times(ops: tuple[int, ...] = (40, 100, 200), device: str = "cpu") -> list[dict]:
    import torch._inductor.config as inductor_config

    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
    print(f"\ncompile time, pointwise chains, forward + backward ({device})")
    print(f"{'ops':>6}{'toycomp':>12}{'torch.compile':>16}{'toycomp/compile':>18}")
    x = torch.randn(1024, device=device, requires_grad=True)
    rows = []
    for n in ops:
        fn = pointwise_chain(n // 4)
        first_call_seconds(toycomp.compile(fn), x)  # fills the kernel cache
        ours = first_call_seconds(toycomp.compile(fn), x)
        torch._dynamo.reset()
        with inductor_config.patch(force_disable_caches=True):
            theirs = first_call_seconds(torch.compile(fn), x)
        print(f"{n:>6}{ours:>11.2f}s{theirs:>15.2f}s{ours / theirs:>17.2f}x")
        rows.append({"ops": n, "toycomp_s": ours, "torch_compile_cold_s": theirs})
    return rows
