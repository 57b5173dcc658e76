"""Benchmark: eager vs torch.compile vs toycomp, as ratios measured in one run.

    python benchmarks/bench.py                 # CPU, and CUDA too when a GPU is present
    python benchmarks/bench.py --device cuda --repeat 50
    python benchmarks/bench.py --compile-time        # compile time only (CPU)

Programs: f(x) = sin(x)**2 + cos(x)**2 on 4M floats (forward; forward + backward), one training
step of the course's MLP (Linear(64,128) -> GELU -> Linear(128,10) -> cross_entropy, batch 32),
and a row softmax over an 8192 x 1000 matrix. Times are medians over ``--repeat`` batches of ten
calls after warm-up (compilation excluded); the ratios are what to read, since absolute times
depend on the machine. This is a measurement, not a test: nothing here asserts.

``--compile-time`` times compilation itself on chains of pointwise ops (``y = y * y.sigmoid() +
y.sin()``, four ops a step, forward + backward): toycomp's own time, from capture to generated
source, is a first call with the kernel cache already holding every kernel (so the C++ compiler
does not run), next to torch.compile's cold compile with its caches off.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

import toycomp


def sin2_cos2(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def row_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def make_programs(device: str) -> dict[str, tuple[Callable, Callable[[Callable], Callable]]]:
    """name -> (function to compile, runner(fn) -> a zero-argument callable doing one step)."""
    torch.manual_seed(0)
    x = torch.randn(4 * 1024 * 1024, device=device)
    xg = x.clone().requires_grad_(True)
    ones = torch.ones_like(x)
    rows = torch.randn(8192, 1000, device=device)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)
    ).to(device)
    batch = torch.randn(32, 64, device=device)
    target = torch.randint(0, 10, (32,), device=device)

    def mlp_loss(inp: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(inp), tgt)

    def fwd_bwd(fn: Callable) -> None:
        xg.grad = None
        fn(xg).backward(ones)

    def train_step(fn: Callable) -> None:
        model.zero_grad(set_to_none=True)
        fn(batch, target).backward()

    return {
        "sin²+cos² fwd, 4M": (sin2_cos2, lambda fn: lambda: fn(x)),
        "sin²+cos² fwd+bwd, 4M": (sin2_cos2, lambda fn: lambda: fwd_bwd(fn)),
        "MLP train step, b=32": (mlp_loss, lambda fn: lambda: train_step(fn)),
        "row softmax 8192x1000": (row_softmax, lambda fn: lambda: fn(rows)),
    }


def measure(step: Callable[[], object], device: str, repeat: int, batch: int = 10) -> float:
    """Median seconds per ``step()``, over ``repeat`` batches of ``batch`` back-to-back calls
    after three warm-up calls (which also compile). On a GPU the device is synchronised once
    per batch, so the time is that of the slower of host (Python, launches) and device."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        step()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(batch):
            step()
        sync()
        times.append((time.perf_counter() - start) / batch)
    return statistics.median(times)


def run(device: str, repeat: int) -> None:
    backend = "triton" if device == "cuda" else "cpp"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"\n{name}, toycomp backend {backend}, torch {torch.__version__}, median of {repeat}")
    header = f"{'program':<24}{'eager':>10}{'compile':>10}{'toycomp':>10}"
    print(header + f"{'eager/toycomp':>15}{'toycomp/compile':>17}")
    for label, (fn, runner) in make_programs(device).items():
        torch._dynamo.reset()
        eager = measure(runner(fn), device, repeat)
        compiled = measure(runner(torch.compile(fn)), device, repeat)
        ours = measure(runner(toycomp.compile(fn, backend=backend)), device, repeat)
        print(
            f"{label:<24}{eager * 1e3:>8.3f}ms{compiled * 1e3:>8.3f}ms{ours * 1e3:>8.3f}ms"
            f"{eager / ours:>14.2f}x{ours / compiled:>16.2f}x"
        )


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


def compile_times(ops: tuple[int, ...] = (40, 100, 200)) -> None:
    import warnings

    import torch._inductor.config as inductor_config

    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")

    print("\ncompile time, pointwise chains, forward + backward (CPU, C++ backend)")
    print(f"{'ops':>6}{'toycomp':>12}{'torch.compile':>16}{'toycomp/compile':>18}")
    x = torch.randn(1024, requires_grad=True)
    for n in ops:
        fn = pointwise_chain(n // 4)
        first_call_seconds(toycomp.compile(fn, backend="cpp"), x)  # fills the kernel cache
        ours = first_call_seconds(toycomp.compile(fn, backend="cpp"), x)
        torch._dynamo.reset()
        with inductor_config.patch(force_disable_caches=True):
            theirs = first_call_seconds(torch.compile(fn), x)
        print(f"{n:>6}{ours:>11.2f}s{theirs:>15.2f}s{ours / theirs:>17.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--compile-time", action="store_true", help="only the compile-time table")
    args = parser.parse_args()
    if args.compile_time:
        compile_times()
        return
    devices = [args.device] if args.device else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        run(device, args.repeat)


if __name__ == "__main__":
    main()
