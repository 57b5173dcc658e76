"""Parallel compilation (``toycomp.config.compile_threads``): a graph's C++ kernels compiled at
once, in a pool of worker threads, a few kernels a compiler run (``cpp.batch_kernels``), and on
CUDA its Triton kernels compiled ahead of the first run.

Input -> output: a graph's generated kernels -> their loaded functions, the same ones a loop of
``cpp.load`` returns, in the same order. Each worker starts the C++ compiler as a subprocess and
waits, which releases the GIL, so ``compile_threads`` compilers run side by side: a graph of
twenty kernels compiles in about the time of twenty divided by the cores. The kernel cache is
safe under it: a miss is built under a per-entry lock, and files appear whole (see
[Note: cache security] in cache.py), so two graphs asking for one kernel compile it once::

    >>> from toycomp import config
    >>> workers() == (os.cpu_count() or 1), config.teach["compile_threads"]
    (True, False)

With ``cpp.batch_kernels`` the kernels are compiled as ``compile_threads`` translation units,
each the kernels' ``#include`` lines once, the code they all begin with once, then the rest of
each kernel's source in a namespace of its own (its helpers stay its own; its ``extern "C"``
function keeps its plain name)::

    #include <cmath>         <the lines all the    namespace toycomp_kernel_0 {   namespace ..._1 {
    ...                      kernels begin with>   <the rest of kernel_0>         <...>
                                                   }                              }

    >>> [len(g) for g in groups(list(range(5)), 2)]
    [3, 2]

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
(``AsyncCompile.triton`` precompiles each kernel's configs before the first run), each C++
kernel in a file of its own (``cpp_pybinding``); its C++ wrapper mode reads the common headers
from a precompiled header (``config.cpp_cache_precompile_headers``, cpp_builder.py).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import os
import pickle
import queue
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch

import toycomp.config as config
from toycomp._triton_compat import current_target
from toycomp._logging import log
from toycomp.inductor import cache, ir
from toycomp.inductor.codegen import cpp
from toycomp.inductor.codegen.common import GeneratedKernel
from toycomp.inductor.opt import libmvec, triton_worker

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
    """The C++ kernels' functions, in order: compiled a few a unit (``cpp.batch_kernels``:
    [Note: why batch the C++ compiles]) or one a compile, in the pool."""
    if config.cpp.batch_kernels and len(generated) > 1:
        return load_in_units(generated, workers())
    return compile_all(cpp.load, generated)


# --- C++: a few kernels a unit (cpp.batch_kernels) -----------------------------------------------
# [Note: why batch the C++ compiles]
# A small kernel takes the compiler about 0.37 s, of which about 0.27 s is reading the standard
# headers (<algorithm>, <cmath>, <limits>...: measured with g++ 12 on a 2-core x86 machine), the
# same for every kernel. With a graph's kernels in ``compile_threads`` units the headers are read
# once per unit, and so is the vector prefix all kernels begin with (opt/cpp_vector_prefix.py).
# A unit is compiled with the flags of all the vector-math functions its kernels ask for
# (opt/libmvec.py: ``-DTOYCOMP_SIMD_expf`` changes only the kernels that test it). A kernel
# whose source is not a block of includes and then code is compiled alone, as is every kernel
# of a unit that fails to compile (so that an error names its kernel, as before). The cache
# keys the unit's source: a second process compiling the same graph finds it. The GPT of
# notebook 05 (47 kernels, forward and backward) compiles its kernels in about 6 s instead of
# 23 s on that machine (benchmarks/compile_time.py).
_INCLUDE = re.compile(r"^\s*#\s*include\b")
_WANTED = re.compile(r"^#if defined\(TOYCOMP_SIMD_(\w+)\)", re.MULTILINE)  # as cpp.load reads
# A line such as ``TOYCOMP_SAME_LIBM_1(tanhf)`` (opt/libmvec.py) defines functions under fixed
# assembly names (``toycomp_tanhf`` and its vector clones): once per unit, outside the namespaces.
_DEFINES_SYMBOL = re.compile(r"^TOYCOMP_[A-Z0-9_]+\(\w+\)\s*$")


def groups(items: Sequence[T], n: int) -> list[list[T]]:
    """``items`` in ``min(n, len(items))`` groups of even sizes, in order."""
    k = max(min(n, len(items)), 1)
    size, extra = divmod(len(items), k)
    bounds = [i * size + min(i, extra) for i in range(k + 1)]
    return [list(items[bounds[i] : bounds[i + 1]]) for i in range(k) if bounds[i + 1] > bounds[i]]


def split_includes(source: str) -> tuple[list[str], str] | None:
    """(the leading ``#include`` lines, the rest), or None where an include comes later (inside
    an ``#if``, say: it cannot move out of the namespace)."""
    lines = source.splitlines()
    i = 0
    while i < len(lines) and (_INCLUDE.match(lines[i]) or not lines[i].strip()):
        i += 1
    rest = lines[i:]
    if any(_INCLUDE.match(line) for line in rest):
        return None
    return [line.strip() for line in lines[:i] if line.strip()], "\n".join(rest)


def unit_source(kernels: Sequence[GeneratedKernel]) -> str:
    """One translation unit holding ``kernels`` (each must pass ``split_includes``): their
    includes, the code they all begin with (the vector prefix: opt/cpp_vector_prefix.py) once,
    then the rest of each in its namespace."""
    includes: list[str] = []
    bodies = []
    for g in kernels:
        head, body = split_includes(g.source)  # type: ignore[misc]
        includes += [line for line in head if line not in includes]
        bodies.append(body.splitlines())
    shared = _shared_prefix(bodies)
    rests = [body[shared:] for body in bodies]
    hoisted = [line for rest in rests for line in rest if _DEFINES_SYMBOL.match(line)]
    parts = ["\n".join(includes), "\n".join(bodies[0][:shared]),
             "\n".join(dict.fromkeys(hoisted))]
    for i, (g, rest) in enumerate(zip(kernels, rests)):
        rest = "\n".join(line for line in rest if not _DEFINES_SYMBOL.match(line))
        parts.append(f"namespace toycomp_kernel_{i} {{\n{rest}\n}}  // {g.name}")
    return "\n\n".join(parts) + "\n"


def _shared_prefix(bodies: list[list[str]]) -> int:
    """How many leading lines all ``bodies`` share, cut where a namespace may open: after a
    blank line outside any brace, ``#if`` or macro continuation."""
    same = 0
    while all(same < len(b) and b[same] == bodies[0][same] for b in bodies):
        same += 1
    cut, braces, conditions, continued = 0, 0, 0, False
    for i, line in enumerate(bodies[0][:same]):
        text = line.strip()
        if continued or text.startswith("#"):
            word = text.lstrip("#").split(maxsplit=1)[0] if text.lstrip("#") else ""
            if not continued and word.startswith("if"):
                conditions += 1
            elif not continued and word == "endif":
                conditions -= 1
            continued = line.endswith("\\")
            continue
        code = line.split("//", 1)[0]
        braces += code.count("{") - code.count("}")
        if not text and braces == 0 and conditions == 0:
            cut = i + 1
    return cut


def load_unit(kernels: Sequence[GeneratedKernel]) -> list[Callable[..., None]]:
    """Compile ``kernels`` as one unit and load each; one at a time if that fails."""
    if len(kernels) > 1:
        source = unit_source(kernels)
        wanted = _WANTED.findall(source)
        try:  # with the flags cpp.load gives it (its scalar fallback is for one kernel alone)
            cache.compile_cpp(source, libmvec.vector_math_flags(wanted) if wanted else ())
        except (cache.CppCompileError, OSError):
            return [cpp.load(g) for g in kernels]  # so that an error names the kernel at fault
        return [cpp.load(replace(g, source=source)) for g in kernels]  # (found compiled)
    return [cpp.load(g) for g in kernels]


def load_in_units(generated: Sequence[GeneratedKernel], units: int) -> list[Callable[..., None]]:
    """The kernels' functions, in order: compiled as ``units`` units, side by side."""
    alone = [g for g in generated if split_includes(g.source) is None]
    batched = [g for g in generated if g not in alone]
    parts = groups(batched, units) + [[g] for g in alone]
    loaded = {}
    for part, fns in zip(parts, compile_all(load_unit, parts)):
        loaded.update({g.name: fn for g, fn in zip(part, fns)})
    return [loaded[g.name] for g in generated]


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
    if config.triton.compile_workers:  # into Triton's disk cache, where `warm` finds them
        target = current_target(device)
        compile_all(lambda job: _compile_in_worker(target, *job), jobs)

    def warm(job: tuple) -> None:
        jit_fn, args, meta = job
        try:
            with torch.cuda.device(device):
                jit_fn.warmup(*args, grid=(1,), **meta)
        except Exception as e:  # noqa: BLE001 - the launch compiles it again and reports
            log("output_code", "toycomp: compiling %s ahead failed (%r)", jit_fn.__name__, e)

    compile_all(warm, jobs)
    return len(jobs)


# --- Triton: compiled in worker processes (triton.compile_workers) --------------------------------
# [Note: Triton compiles in processes]
# Triton compiles a kernel in Python (its code generator) and in MLIR passes that hold the GIL,
# so the pool's threads compile about one kernel at a time: GPT-2's 140 kernels took 6.8 s in 32
# threads on an H200 host (benchmarks/results/2026-11-28-h200-compile-time.json). With
# ``triton.compile_workers`` each thread hands its kernel to a worker process of its own
# (triton_worker.py), which compiles it for the GPU's target into Triton's on-disk cache; the
# warm-up that follows, in this process, finds it there. A worker makes no CUDA context, so it
# runs whatever this process did with the GPU before. The workers start when AOT begins on CUDA
# inputs (``start_triton_workers``: they import torch and Triton while the graph is lowered) and
# live for the process, as Inductor's do; a worker that fails leaves its kernel to the warm-up
# here, which compiles it as before. On an H200 host, 32 workers started as the first graph's
# kernels were ready made GPT-2's kernels slower to compile than the threads (10.5 s, not 6.0).
_WORKER = str(Path(__file__).with_name("triton_worker.py"))
_workers: queue.SimpleQueue[_Worker] | None = None  # the idle ones


class _Worker:
    """One ``python triton_worker.py`` process, spoken to through its stdin and stdout."""

    def __init__(self) -> None:
        env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen([sys.executable, _WORKER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env)

    def compile(self, job: tuple) -> str:
        """``""``, or why the worker did not compile the kernel."""
        if self.process.poll() is not None:
            return f"the worker exited ({self.process.returncode})"
        try:
            triton_worker.write_message(self.process.stdin, job)
            answer = triton_worker.read_message(self.process.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            return repr(e)
        return "the worker exited" if answer is None else answer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # the worker reads the end of its jobs and exits


def start_triton_workers(example_inputs: Sequence[Any], backend: str | None) -> None:
    """Start the workers, if a graph of these inputs will compile Triton kernels for CUDA: at
    the start of AOT, so that they import torch and Triton while the graph is lowered."""
    if (config.triton.compile_workers and workers() > 1 and backend in (None, "triton")
            and any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)):  # fmt: skip
        _idle_workers()


def _idle_workers() -> queue.SimpleQueue[_Worker]:
    global _workers
    with _pools_lock:
        if _workers is None:  # at most 16: past that, their start costs more than they save
            _workers, started = queue.SimpleQueue(), [_Worker() for _ in range(min(workers(), 16))]
            for worker in started:
                _workers.put(worker)
            atexit.register(lambda: [w.close() for w in started])
        return _workers


def _compile_in_worker(target: tuple, jit_fn: Any, args: list, meta: dict) -> None:
    idle = _idle_workers()
    worker = idle.get()  # each thread of the pool holds one worker at a time
    try:
        module = sys.modules[jit_fn.fn.__module__]
        job = (target, module.__file__, module.__name__, jit_fn.fn.__name__, args, meta)
        if error := worker.compile(job):
            log("output_code", "toycomp: a worker did not compile %s (%s)", jit_fn.__name__, error)
    finally:
        idle.put(worker)
