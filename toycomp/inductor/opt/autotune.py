"""Stage 4c (Triton on CUDA), autotuning: a kernel's candidate launch configs -> the fastest one.

Input -> output: a launcher (``kernel[grid](*args, **meta)``: a ``LeanLauncher`` on CUDA) and
``GeneratedKernel.configs`` (from ``candidate_configs`` in codegen/triton_heuristics.py) -> an
``Autotuner``, launched the same way. Its first launch times each candidate on the call's own
arguments and keeps the fastest, for this process and, through the kernel cache, the next; every
launch runs the winner, over a grid computed for its ``XBLOCK``. With a stand-in kernel that
records its launches, and a stand-in timer that says the second config is faster::

    >>> class Recorder:
    ...     launches = []
    ...     def __getitem__(self, grid):
    ...         return lambda *args, **meta: self.launches.append((grid, meta))
    >>> configs = ({"XBLOCK": 1024, "num_warps": 4}, {"XBLOCK": 2048, "num_warps": 8})
    >>> times = iter([2.0, 1.0])  # milliseconds, one per config
    >>> tuner = Autotuner(Recorder(), ("in_ptr0", "out_ptr0", "xnumel"), configs, "source",
    ...                   "kernel_0", timer=lambda fn: (fn(), next(times))[1], disk=False)
    >>> a, out = torch.ones(8192), torch.empty(8192)
    >>> tuner[(8,)](a, out, 8192, XBLOCK=1024, num_warps=4)  # the wrapper's line: config 0
    >>> tuner.launcher.launches[-1]  # what ran: config 1, over cdiv(8192, 2048) programs
    ((4,), {'XBLOCK': 2048, 'num_warps': 8})

NB: in PyTorch this lives in torch/_inductor/runtime/triton_heuristics.py (``CachingAutotuner``:
``benchmark_all_configs``, ``clone_args`` for mutated arguments) and
torch/_inductor/runtime/autotune_cache.py (the choice on disk); Triton's own autotuner is
``triton.autotune`` (triton/runtime/autotuner.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import os
from typing import Any, Callable, Iterator, Sequence

import torch

from toycomp.inductor import cache

# [Note: autotuning]
# Which block sizes are fastest depends on the GPU, the sizes and the kernel's arithmetic; the
# rules of [Note: Triton block sizes] cannot know all three, a stopwatch can. So, as Inductor
# does, each kernel has a few candidate configs ([Note: autotuning candidates]), and on CUDA the
# first launch of a kernel times each of them on the call's own arguments (Triton's do_bench:
# CUDA events around ~20 ms of launches, the L2 cache flushed before each) and keeps the
# fastest. What makes that safe and cheap:
# * Timing must not change a result. A kernel may read what it writes (an input mutated in
#   place, ``x += y``; a buffer reused in place), and timing launches it many times: ``y``
#   would be added again each time. So each written argument (``out_ptr*``, named by
#   ``KernelCodegen.__init__`` in common.py) is replaced by a copy of its storage, viewed the
#   same way. The timed launches write only copies and read the untouched originals; then the
#   real launch runs once, on the real buffers.
# * The grid depends on XBLOCK. The wrapper's line names the first config and its grid (what
#   the interpreter runs); the Autotuner launches the winner over cdiv(xnumel, XBLOCK) programs.
# * A choice made by noise is no choice: timings of equal configs differ by ~0.5% between runs
#   (H100: three persistent softmax configs at 136.9-137.7 us), so another candidate replaces
#   the fixed config only when it is at least MIN_GAIN faster; the choice then stays put.
# * Static sizes only. With symbolic sizes each call may bring new sizes, each worth a new
#   round of timing (Inductor times once, on size hints, and keeps that choice for all sizes):
#   such kernels launch their fixed config, and a reduction over a symbolic rnumel keeps
#   ``reduction_blocks``' per-call choice. Never on the interpreter (NumPy's timings say nothing
#   about a GPU, and CI output must not depend on timings), nor while a CUDA graph is being
#   captured (timing synchronises): the fixed config runs, and nothing is remembered.
# * The choice is kept in memory and in the kernel cache (``autotune/<key>.json``), keyed by
#   the kernel's name and source hash, the GPU's name, Triton's version, the candidates and the
#   arguments' sizes and dtypes: another process launches the winner without timing. The file
#   is data, never code, yet it is read only as [Note: cache security] allows, and only a config
#   among the candidates is accepted (a wrong RBLOCK could make a persistent row too short).
# * Why not ``triton.autotune``: its configs live in the generated source, which is one for CPU
#   and CUDA (and several configs fail in the interpreter); every launch would go through its
#   Python, losing [Note: lean launches]; it restores mutated arguments only when the decorator
#   names them; and its cache is not toycomp's private one. It would save about 60 lines.
# It runs when asked for ([Note: autotuning is asked for]); ``TOYCOMP_AUTOTUNE=0`` turns it off
# (each kernel launches its fixed config), as ``TOYCOMP_VECTOR_MATH=0`` turns off libmvec. The
# cost, once per kernel, sizes and GPU: one Triton compile per candidate (Triton caches those
# on disk too) and ~25 ms of timing each.
# What it found on the H100 for issue 9's softmax, layer_norm, MLP and column-sum rows: the
# fixed configs were within 2% of the best candidate for all but 3 of 18 kernels (two outer
# reductions, 5.8 -> 4.9 us and 20.7 -> 19.8 us, took [32, 16] tiles; a 32M-element pointwise
# kernel took XBLOCK 512 with 8 warps, 144 -> 140 us), so the rows' times moved within noise.
TIMING_MS = {"warmup": 5, "rep": 20}
MIN_GAIN = 0.02  # another config must beat the fixed one by 2%
_CHOSEN: dict[str, dict[str, int]] = {}  # key -> config: the choices of this process


# [Note: autotuning is asked for]
# Each candidate costs a Triton compile on the first call: ~0.3 s a kernel, so a model of 250
# kernels took 3 minutes to start on the H100, and the measured rows moved within noise (above).
# So, as torch.compile's ``mode="max-autotune"``, toycomp autotunes when asked: with
# ``toycomp.compile(fn, mode="max-autotune")`` (the graphs compiled under ``requested(True)``)
# or ``TOYCOMP_AUTOTUNE=1``; ``TOYCOMP_AUTOTUNE=0`` turns it off in every mode.
_REQUESTED: contextvars.ContextVar[bool] = contextvars.ContextVar("autotune", default=False)


def enabled() -> bool:
    """Whether CUDA kernels loaded now are autotuned (see [Note: autotuning is asked for])."""
    env = os.environ.get("TOYCOMP_AUTOTUNE")
    return _REQUESTED.get() if env is None else env != "0"


@contextlib.contextmanager
def requested(on: bool) -> Iterator[None]:
    """Kernels loaded inside are autotuned if ``on`` (and TOYCOMP_AUTOTUNE does not say)."""
    token = _REQUESTED.set(on)
    try:
        yield
    finally:
        _REQUESTED.reset(token)


def autotuned(launcher: Any, jit_fn: Any, generated: Any) -> Any:
    """``launcher`` for the ``@triton.jit`` ``jit_fn`` of ``generated`` (a ``GeneratedKernel``),
    wrapped in an ``Autotuner`` when there are several configs to choose among."""
    if len(generated.configs) < 2 or not enabled():
        return launcher
    args = (jit_fn.arg_names, generated.configs, generated.source, generated.name)
    return Autotuner(launcher, *args)


def benchmark(fn: Callable[[], Any]) -> float:
    """Milliseconds per call of ``fn`` on the GPU (median; see [Note: autotuning])."""
    from triton.testing import do_bench

    return do_bench(fn, return_mode="median", **TIMING_MS)


class Autotuner:
    """``kernel[grid](*args, **meta)`` that launches the fastest of ``configs``, chosen at the
    first launch with these sizes (see [Note: autotuning]); ``configs[0]`` is the one the
    wrapper's line names, whose ``grid`` and ``meta`` are replaced."""

    def __init__(
        self,
        launcher: Any,
        arg_names: Sequence[str],
        configs: Sequence[dict[str, int]],
        source: str,
        name: str,
        timer: Callable[[Callable[[], Any]], float] = benchmark,
        disk: bool = True,
    ) -> None:
        self.launcher, self.name, self.timer, self.disk = launcher, name, timer, disk
        self.configs = [dict(c) for c in configs]
        self.written = [i for i, a in enumerate(arg_names) if a.startswith("out_ptr")]
        self.xnumel = list(arg_names).index("xnumel")
        self.source_hash = cache.sha256(source.encode())
        self.chosen: dict[tuple, tuple[tuple[int], dict]] = {}  # int args -> grid, meta
        self.timings: dict[str, list[float]] = {}  # key -> ms per config, when timed here

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return functools.partial(self.launch, grid)

    def launch(self, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
        grid, meta = self.configured(grid, args, meta)
        self.launcher[grid](*args, **meta)

    def run(self, stream: int, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
        """The CUDA wrapper's launch (``LeanLauncher.run``): the chosen config on ``stream``."""
        grid, meta = self.configured(grid, args, meta)
        self.launcher.run(stream, grid, *args, **meta)

    def configured(self, grid: tuple[int, ...], args: Sequence[Any], meta: dict) -> tuple:
        """``(grid, meta)`` of the config chosen for these sizes, choosing it the first time."""
        sizes = tuple(a for a in args if type(a) is int)  # (static: the same at every call)
        choice = self.chosen.get(sizes)
        if choice is None:
            if _capturing(args):  # no timing inside a CUDA graph capture: the fixed config
                return grid, meta
            config = self.choose(args, meta)
            choice = self.chosen[sizes] = (self.grid(config, args), {**meta, **config})
        return choice

    def grid(self, config: dict[str, int], args: Sequence[Any]) -> tuple[int]:
        return (-(-args[self.xnumel] // config["XBLOCK"]),)

    def choose(self, args: Sequence[Any], meta: dict[str, Any]) -> dict[str, int]:
        """The config remembered for this key (memory, then disk), else the fastest one now."""
        parts = self.key_parts(args)
        key = cache.content_hash(json.dumps(parts, sort_keys=True))
        config = _CHOSEN.get(key) or (load_choice(key, parts, self.configs) if self.disk else None)
        if config is None:
            timings = self.benchmark_all_configs(args, meta)
            config = self.configs[fastest(timings)]
            self.timings[key] = timings
            if self.disk:
                store_choice(key, parts, config, timings)
        _CHOSEN[key] = config
        return config

    def benchmark_all_configs(self, args: Sequence[Any], meta: dict[str, Any]) -> list[float]:
        """Milliseconds per launch of each config, on copies of the written arguments."""
        timed_args = list(args)
        for i in self.written:
            timed_args[i] = clone_storage(args[i])
        timings = []
        for config in self.configs:
            launch = functools.partial(self.launcher[self.grid(config, args)], *timed_args)
            try:
                timings.append(self.timer(functools.partial(launch, **{**meta, **config})))
            except Exception:  # noqa: BLE001 - e.g. too many registers: not a candidate here
                timings.append(math.inf)  # (the first config is the one that runs if all fail)
        return timings

    def key_parts(self, args: Sequence[Any]) -> dict[str, Any]:
        """What the choice depends on, as JSON values (see [Note: autotuning])."""
        import triton

        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return {
            "kernel": self.name,
            "source_sha256": self.source_hash,
            "device": device_name(tensors[0].device) if tensors else "none",
            "triton": triton.__version__,
            "configs": self.configs,
            "args": [describe(a) for a in args],
        }

    def __repr__(self) -> str:
        chosen = [meta for _, meta in self.chosen.values()]
        return f"Autotuner({self.name}, {len(self.configs)} configs, chosen: {chosen})"


def fastest(timings: list[float]) -> int:
    """The index of the fastest config; 0 (the fixed one) unless another beats it by
    ``MIN_GAIN``."""
    best = min(range(len(timings)), key=timings.__getitem__)
    return best if timings[best] < timings[0] * (1 - MIN_GAIN) else 0


def describe(arg: Any) -> Any:
    """An argument as the key sees it: a tensor's dtype and sizes, an int's value."""
    if isinstance(arg, torch.Tensor):
        return f"{arg.dtype}{list(arg.shape)}"
    return arg if type(arg) in (int, bool) else type(arg).__name__


@functools.lru_cache(maxsize=None)
def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def clone_storage(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``'s whole storage, viewed as ``t`` is (sizes, strides, offset): a kernel
    indexing from ``t``'s data pointer finds everything where it was."""
    copy = torch.empty(0, dtype=t.dtype, device=t.device)
    return copy.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())


def _capturing(args: Sequence[Any]) -> bool:
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    return cuda and torch.cuda.is_current_stream_capturing()


# --- the choice on disk ---------------------------------------------------------------------
def load_choice(key: str, parts: dict, configs: list[dict]) -> dict[str, int] | None:
    """The config stored under ``key``, if its record names exactly ``parts`` and the config
    is one of ``configs``; else None (a miss: time them)."""
    record = cache.load_record("autotune", key)
    if not isinstance(record, dict) or record.get("key") != json.loads(json.dumps(parts)):
        return None
    config = record.get("config")
    return dict(config) if config in configs else None


def store_choice(key: str, parts: dict, config: dict, timings: list[float]) -> None:
    """Remember ``config`` under ``key``, with what it depends on and the timings seen."""
    record = {"key": parts, "config": config, "timings_ms": timings}
    try:
        cache.store_record("autotune", key, record)
    except OSError:  # a full disk: this process still remembers it
        pass
