"""Parallel compilation (``toycomp.config.compile_threads``): a graph's C++ kernels compiled at
once, in a pool of worker threads.

Input -> output: a graph's generated kernels -> their loaded functions, the same ones a loop of
``cpp.load`` returns, in the same order. Each worker starts the C++ compiler as a subprocess and
waits, which releases the GIL, so ``compile_threads`` compilers run side by side: a graph of
twenty kernels compiles in about the time of twenty divided by the cores. The kernel cache is
safe under it: a miss is built under a per-entry lock, and files appear whole (see
[Note: cache security] in cache.py), so two graphs asking for one kernel compile it once::

    >>> from toycomp import config
    >>> workers() == (os.cpu_count() or 1), config.teach["compile_threads"]
    (True, False)

The pool lives for the process (one per size), as Inductor's does, so a model's forward and
backward graphs reuse its threads.

NB: in PyTorch this is torch/_inductor/async_compile.py (``AsyncCompile``, sized by
``config.compile_threads``), whose workers are subprocesses compiling C++ and Triton alike.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Sequence, TypeVar

import toycomp.config as config

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
    with _pools_lock:
        pool = _pools.get(n) or _pools.setdefault(
            n, ThreadPoolExecutor(max_workers=n, thread_name_prefix="toycomp-compile")
        )
    futures = [pool.submit(load, g) for g in generated]
    wait(futures)  # all of them: no compiler left running behind an error
    return [f.result() for f in futures]
