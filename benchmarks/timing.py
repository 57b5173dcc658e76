"""How the benchmark measures: device time, per-call time, copy bandwidth, peak memory.

    device time   CUDA: ``triton.testing.do_bench``'s median (CUDA events around each call, L2
                  cleared between calls); CPU: the median of single calls (``perf_counter``)
    per-call time the median, over batches of back-to-back calls with one synchronisation each,
                  of a batch's wall time / its length: on a GPU the slower of host (guards,
                  wrappers, launches) and device; on the CPU the same as the device time.
                  Compared steps (eager's and each compiler's step of one row or one model)
                  take turns, in rounds (``in_turns``): the figure is the median of the rounds
    copy rate     a large ``dst.copy_(src)``, bytes read plus bytes written over its median time
                  (and, for each memory-bound row, a copy that moves the row's own bytes)
    kernel time   CUDA: the summed device time of the kernels (and copies) one step launches,
                  from ``torch.profiler``, the median over a few steps: what the generated
                  code costs the GPU, with the host's gaps between launches left out
    peak memory   CUDA: ``torch.cuda.max_memory_allocated`` during one step, less what was
                  allocated before it; CPU: the same figure read from ``torch.profiler``'s
                  memory events (every allocation through PyTorch's CPU allocator: eager's
                  outputs, Inductor's and toycomp's buffers alike; not a C++ kernel's stack)

Warm-up calls run first (compilation and caches stay out of the numbers).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from typing import Any, Callable

import torch

Step = Callable[[], Any]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def seconds_of_one_call(step: Step, device: str) -> float:
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - start


def cpu_times(step: Step, budget_s: float, at_least: int = 5) -> list[float]:
    """Seconds of single calls, as many as fit in ``budget_s`` (at least ``at_least``)."""
    first = min(seconds_of_one_call(step, "cpu") for _ in range(2))  # warm-up
    count = max(at_least, min(100, int(budget_s / max(first, 1e-6))))
    return [seconds_of_one_call(step, "cpu") for _ in range(count)]


def device_seconds(step: Step, device: str, budget_s: float) -> float:
    """Median device time of one step (see the module docstring)."""
    if device == "cuda":
        import triton.testing

        # 100 ms of warm-up: the GPU's clocks drop while a compiler runs on the host
        ms = triton.testing.do_bench(step, warmup=100, rep=int(budget_s * 1e3),
                                     return_mode="median")
        return ms * 1e-3
    return statistics.median(cpu_times(step, budget_s))


def per_call_seconds(step: Step, device: str, budget_s: float) -> float:
    """Median wall time per call over batches of back-to-back calls (one sync a batch)."""
    if device != "cuda":
        return device_seconds(step, device, budget_s)
    one = min(seconds_of_one_call(step, device) for _ in range(3))  # warm-up
    batch = max(1, min(100, int(0.02 / max(one, 1e-7))))  # batches of about 20 ms
    count = max(5, min(50, int(budget_s / max(one * batch, 1e-7))))
    times = []
    for _ in range(count):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(batch):
            step()
        synchronize(device)
        times.append((time.perf_counter() - start) / batch)
    return statistics.median(times)


ROUNDS = 5  # rounds of steps taking turns


def in_turns(steps: dict[str, Step], measure: Callable[[Step], float], rounds: int = ROUNDS
             ) -> dict[str, list[float]]:  # fmt: skip
    """``measure(step)`` of each step in ``rounds`` rounds, the steps taking turns (each round
    starts one step later): name -> its figure in each round.

    On a lent machine the host's speed drifts by 20-30% over minutes, and a step of many small
    launches (a training step) is bound by the host, so steps timed one after the other are
    compared under different conditions; taking turns spreads the drift over all of them."""
    names = list(steps)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            seconds[name].append(measure(steps[name]))
    return seconds


def per_call_seconds_in_turns(
    steps: dict[str, Step], device: str, budget_s: float, rounds: int = ROUNDS
) -> dict[str, list[float]]:
    """``per_call_seconds`` of each step, in turns (``in_turns``): ``budget_s`` a step in all."""
    return in_turns(steps, lambda step: per_call_seconds(step, device, budget_s / rounds), rounds)


def kernel_seconds(step: Step, steps: int = 5) -> float:
    """Median over ``steps`` steps of the summed device time of one step's kernels (CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    sums = []
    for _ in range(steps):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        sums.append(sum(e.device_time for e in kernels) * 1e-6)  # us -> s
    return statistics.median(sums)


def copy_bandwidth(device: str, quick: bool = False) -> float:
    """Bytes per second of a device-to-device copy, bytes read plus bytes written."""
    numel = (1 << 20 if quick else 1 << 28) if device == "cuda" else (1 << 18 if quick else 1 << 25)
    return 8 * numel / copy_seconds(8 * numel, device, 0.2 if quick else 1.0)


def copy_seconds(nbytes: int, device: str, budget_s: float) -> float:
    """Device time of a ``dst.copy_(src)`` of float32 tensors that moves ``nbytes`` (read plus
    written)."""
    src = torch.randn(max(1, nbytes // 8), device=device)
    dst = torch.empty_like(src)
    return device_seconds(lambda: dst.copy_(src), device, budget_s)


def peak_memory_bytes(step: Step, device: str) -> int:
    """Peak bytes allocated during one step beyond those allocated before it."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    return cpu_peak_memory_bytes(step)


def cpu_peak_memory_bytes(step: Step) -> int:
    """The highest "Total Allocated" of the profiler's memory events during one step, less the
    total before its first event.

    (Read from the exported Chrome trace: ``FunctionEvent`` lists an allocation made inside an
    op under the op, not as a memory event of its own. The running total does not restart at
    zero with each profiler, hence the baseline.)"""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    if not memory:
        return 0
    totals = [e["args"]["Total Allocated"] for e in memory]
    baseline = totals[0] - memory[0]["args"]["Bytes"]
    return max(*totals, baseline) - baseline  # 0: the step freed (old gradients) more than it took


def first_call_seconds(step: Step, device: str) -> float:
    """Wall time of a first call: compilation, then one step."""
    return seconds_of_one_call(step, device)
