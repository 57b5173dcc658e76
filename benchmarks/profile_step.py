"""Where one benchmark row's step goes: kernels launched, GPU busy time, wall time per step.

    python benchmarks/profile_step.py "sin²+cos² fwd+bwd" --device cuda
    python benchmarks/profile_step.py "course MLP" --compilers eager toycomp --steps 10

For each compiler: the kernels (and memsets/copies) the device ran per step and their summed
time (torch.profiler, over ``--steps`` steps after warm-up), next to the per-call wall time
measured without the profiler (benchmarks/timing.py). A step whose wall time is far above its
GPU busy time is bound by the host (guards, wrappers, autograd, launches), not the device.
On the CPU only the wall time and the profiler's top ops are shown.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ modules
import bench  # noqa: E402
import timing  # noqa: E402
from workloads import ROWS  # noqa: E402


def device_events(prof, device: str) -> list:
    wanted = DeviceType.CUDA if device == "cuda" else DeviceType.CPU
    events = [e for e in prof.key_averages() if e.device_type == wanted]
    if device == "cpu":  # top-level ops only would need the tree: show self time instead
        return sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return sorted(events, key=lambda e: e.self_device_time_total, reverse=True)


def profile_compiler(case, compiler: str, device: str, steps: int) -> None:
    fn, _ = bench.first_call(case, compiler, device)
    step = case.step_of(fn)
    wall = timing.per_call_seconds(step, device, 0.3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        timing.synchronize(device)
    events = device_events(prof, device)
    if device == "cuda":
        launches = sum(e.count for e in events) / steps
        busy = sum(e.self_device_time_total for e in events) / steps
        print(f"{compiler:<14} wall {wall * 1e6:9.1f}us   GPU busy {busy:9.1f}us   "
              f"device ops a step {launches:5.1f}")  # fmt: skip
    else:
        print(f"{compiler:<14} wall {wall * 1e6:9.1f}us")
    for e in events[:6]:
        us = (e.self_device_time_total if device == "cuda" else e.self_cpu_time_total) / steps
        print(f"    {e.count / steps:4.1f}x {us:9.1f}us  {e.key[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rows", nargs="+", help="rows whose name contains one of these")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--compilers", nargs="+", choices=bench.COMPILERS,
                        default=list(bench.COMPILERS))  # fmt: skip
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for row in ROWS:
        case = row.case(device)
        if case is None or not any(r in row.name for r in args.rows):
            continue
        print(f"\n{row.name} {case.shape} ({device})")
        for compiler in args.compilers:
            profile_compiler(case, compiler, device, args.steps)


if __name__ == "__main__":
    main()
