"""The optimisation ladder: an example compiled with the passes switched on one at a time.

Input -> output: a function and its example inputs -> one ``Rung`` per step, starting from the
``teach`` preset (every pass off) and adding one pass each step until the ``fast`` preset: the
pass's name, the lines of generated code (kernels and wrappers, forward and backward), the
number of kernels, and the time of one call (forward, and backward where an input requires grad)
on these inputs, measured here::

    >>> import torch, toycomp
    >>> f = lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2
    >>> rungs = ladder(f, torch.randn(1000), backend="cpp", repeat=3)
    >>> [r.name for r in rungs][:3]
    ['teach', '+ memory_planning', '+ cpp.layouts']
    >>> rungs[0].flags == toycomp.config.teach, rungs[-1].flags["cpp.simdlen"]
    (True, None)
    >>> rungs[0].code_lines < rungs[-1].code_lines  # the vector math preamble
    True

Notebook 04 prints these rows as its ladder table. The times are this machine's, noisy on a
shared CPU; compare rungs of one run only.

NB: Inductor has no such tool; each of its passes is one flag of torch/_inductor/config.py.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

import toycomp

# The passes in the order the ladder adds them: (flag, value when on, backends it changes).
STEPS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("memory_planning", True, ("cpp", "triton")),
    ("cpp.layouts", True, ("cpp",)),
    ("cpp.row_buffers", True, ("cpp",)),
    ("cpp.simdlen", None, ("cpp",)),
    ("split_reductions", True, ("triton",)),
    ("triton.mix_order_reduction", True, ("triton",)),
    ("triton.eviction_hints", True, ("triton",)),
    ("triton.divisible_by_16", True, ("triton",)),
    ("triton.lean_launch", True, ("triton",)),
    ("layout_optimization", True, ("triton",)),
    ("fast_guards", True, ("cpp", "triton")),
]
# Passes that change how long compiling takes, not the code or its time: the ladder leaves them
# off (as in teach) on every rung; benchmarks/compile_time.py measures them.
COMPILE_TIME_PASSES = ("compile_threads", "triton.compile_workers", "cpp.batch_kernels",
                       "kernel_cache")


@dataclass
class Rung:
    """One step of the ladder: the flags it compiled with and what came out."""

    name: str
    flags: dict[str, Any]
    code_lines: int  # kernels and wrappers, forward and backward
    kernels: int
    ms: float  # median time of one call (forward + backward where inputs require grad)

    def __repr__(self) -> str:
        return f"{self.name:32} {self.code_lines:6} lines {self.kernels:3} kernels {self.ms:9.3f} ms"


def ladder(fn: Callable, *inputs: Any, backend: str = "cpp", repeat: int = 20) -> list[Rung]:
    """The rungs from ``teach`` to ``fast`` for ``fn(*inputs)`` on ``backend``: each rung adds
    the next pass of ``STEPS`` that changes this backend's code, so the last one compiles as
    ``fast`` does (the other backend's flags aside)."""
    flags = dict(toycomp.config.teach)
    rungs = [_rung("teach", fn, inputs, backend, flags, repeat)]
    for name, on, backends in STEPS:
        if backend in backends:
            flags = {**flags, name: on}
            rungs.append(_rung(f"+ {name}", fn, inputs, backend, flags, repeat))
    return rungs


def _rung(name: str, fn: Callable, inputs: tuple, backend: str, flags: dict, repeat: int) -> Rung:
    with toycomp.config.patch(flags):
        explained = toycomp.explain(fn, *inputs, backend=backend)
    compiled = [g.compiled for g in (explained.entry.graphs if explained.entry else [])]
    lines = sum(len(k.source.splitlines()) for c in compiled for k in c.kernels)
    lines += sum(len(c.wrapper_source.splitlines()) for c in compiled)
    kernels = sum(len(c.kernels) for c in compiled)
    run = toycomp.compile(fn, backend=backend, options=flags)
    return Rung(name, dict(flags), lines, kernels, _time(run, inputs, repeat))


def _time(run: Callable, inputs: tuple, repeat: int) -> float:
    """Median milliseconds of one call (and backward, where an input requires grad)."""
    grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)

    def call() -> None:
        out = run(*inputs)
        if grad:
            out.sum().backward()

    call()  # compiles
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
