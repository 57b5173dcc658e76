"""Parallel compilation (``toycomp.config.compile_threads``): a graph's C++ kernels compiled at
once, in a pool of worker threads, and on CUDA its Triton kernels compiled ahead of the first run.

Input -> output: a graph's generated kernels -> their loaded functions, the same ones a loop of
``cpp.load`` returns, in the same order. Each worker starts the C++ compiler as a subprocess and
waits, which releases the GIL, so ``compile_threads`` compilers run side by side: a graph of
twenty kernels compiles in about the time of twenty divided by the cores. The kernel cache is
safe under it: a miss is built under a per-entry lock, and files appear whole (see
[Note: cache security] in cache.py), so two graphs asking for one kernel compile it once::

    >>> from toycomp import config
    >>> workers() == (os.cpu_count() or 1), config.teach["compile_threads"]
    (True, False)

Triton compiles a ``@triton.jit`` kernel at its first launch, for the kinds of arguments it
is given; the first run of a graph would compile its kernels one after another.
``precompile_triton`` reads each kernel's launch line (``kernel_0[grid](buf0, buf1, 1024,
XBLOCK=128)``), gives Triton the same kinds ahead of time (``JITFunction.warmup`` with the
buffers' dtypes, 16-byte-aligned, and the sizes) in the pool, and the first launch finds the
kernel compiled. A launch line with symbolic sizes, or a launch with other kinds (a tensor not
16-byte aligned), compiles at the launch as before: a warm-up changes no result, only when
the compile happens. On the CPU, Triton's interpreter compiles nothing, and nothing is done.

The pool lives for the process (one per size), as Inductor's does, so a model's forward and
backward graphs reuse its threads.

NB: in PyTorch this is torch/_inductor/async_compile.py (``AsyncCompile``, sized by
``config.compile_threads``), whose workers are subprocesses compiling C++ and Triton alike
(``AsyncCompile.triton`` precompiles each kernel's configs before the first run).
"""

from __future__ import annotations

import ast
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Sequence, TypeVar

import torch

import toycomp.config as config
from toycomp._logging import log
from toycomp.inductor import cache, ir
from toycomp.inductor.codegen import cpp
from toycomp.inductor.codegen.common import GeneratedKernel
from toycomp.inductor.opt import cpp_batch

T = TypeVar("T")
R = TypeVar("R")
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def workers() -> int:
    """How many compilers run at once: ``compile_threads`` (False or 0: one), None: one per core."""
    if config.compile_threads is None:
        return os.cpu_count() or 1
    return max(int(config.compile_threads), 1)


def compile_all(load: Callable[[T], R], generated: Sequence[T]) -> list[R]:
    """``[load(g) for g in generated]``, the loads running in the pool. The first error raised
    by a load is raised here (after the others finished), as the loop would raise it."""
    n = workers()
    if n <= 1 or len(generated) <= 1:
        return [load(g) for g in generated]
    futures = [_pool(n).submit(load, g) for g in generated]
    wait(futures)  # all of them: no compiler left running behind an error
    return [f.result() for f in futures]


def _pool(n: int) -> ThreadPoolExecutor:
    with _pools_lock:
        return _pools.get(n) or _pools.setdefault(
            n, ThreadPoolExecutor(max_workers=n, thread_name_prefix="toycomp-compile")
        )


def compile_cpp(generated: Sequence[GeneratedKernel]) -> list[Callable[..., None]]:
    """The C++ kernels' functions, in order: compiled a few a unit (``cpp.batch_kernels``,
    opt/cpp_batch.py: [Note: why batch the C++ compiles]) or one a compile, in the pool."""
    if config.cpp.batch_kernels and len(generated) > 1:
        return cpp_batch.load_all(generated, workers(), compile_all)
    return compile_all(cpp.load, generated)


# --- Triton: kernels compiled ahead of the first run ----------------------------------------------
def buffer_dtypes(scheduled: ir.ScheduledGraph) -> dict[str, torch.dtype]:
    """Each buffer name of the wrapper -> its dtype."""
    dtypes = {b.name: b.dtype for b in (*scheduled.inputs, *scheduled.allocations)
              if isinstance(b, (ir.InputBuffer, ir.AllocatedBuffer))}  # fmt: skip
    dtypes |= {c.name: c.value.dtype for c in scheduled.constants}
    for step in scheduled.steps:
        if isinstance(step, ir.ExternKernel):
            dtypes |= {o.name: o.dtype for o in step.outputs} or {step.name: step.dtype}
    return dtypes


def warmup_args(call: str, dtypes: dict[str, torch.dtype]) -> tuple[str, list, dict] | None:
    """(kernel name, arguments, constexprs) of a one-line launch, ``kernel[grid](...)`` or
    ``kernel.run(stream0, grid, ...)``, with each buffer replaced by its dtype (Triton's
    ``warmup`` takes a dtype for a tensor); None where an argument is not known before the run."""
    try:
        node = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:  # several lines: block sizes picked per call (a symbolic rnumel)
        return None
    if not isinstance(node, ast.Call):
        return None
    func, args = node.func, list(node.args)
    if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):
        name = func.value.id
    elif (isinstance(func, ast.Attribute) and func.attr == "run"
          and isinstance(func.value, ast.Name) and len(args) >= 2):  # fmt: skip
        name, args = func.value.id, args[2:]
    else:
        return None
    values: list[Any] = []
    for a in args:
        if isinstance(a, ast.Name) and a.id in dtypes:
            values.append(dtypes[a.id])
        elif isinstance(a, ast.Constant) and type(a.value) in (int, float, bool):
            values.append(a.value)
        else:  # a symbolic size, an expression: known at the call only
            return None
    meta = {}
    for k in node.keywords:
        if k.arg is None or not isinstance(k.value, ast.Constant):
            return None
        meta[k.arg] = k.value.value
    return name, values, meta


def precompile_triton(generated: Sequence[GeneratedKernel], scheduled: ir.ScheduledGraph,
                      device: torch.device) -> int:
    """Compile the graph's Triton kernels for their launch lines' arguments, side by side in
    the pool (CUDA, ``compile_threads`` above one); how many were given to Triton."""
    if device.type != "cuda" or workers() <= 1:
        return 0
    dtypes, jobs = buffer_dtypes(scheduled), []
    for g in generated:
        spec = warmup_args(g.call, dtypes)
        if spec is not None:
            module = cache.load_python_module(g.source, "triton")  # the one the launch uses
            jobs.append((getattr(module, spec[0]), spec[1], spec[2]))
    if len(jobs) < 2:
        return 0  # one kernel: as fast compiled at its launch

    def warm(job: tuple) -> None:
        jit_fn, args, meta = job
        try:
            with torch.cuda.device(device):
                jit_fn.warmup(*args, grid=(1,), **meta)
        except Exception as e:  # noqa: BLE001 - the launch compiles it again and reports
            log("output_code", "toycomp: compiling %s ahead failed (%r)", jit_fn.__name__, e)

    compile_all(warm, jobs)
    return len(jobs)
