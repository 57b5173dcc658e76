"""A worker process that compiles Triton kernels for a GPU it never touches
(``config.triton.compile_workers``; started by async_compile.py, run as a script).

Input -> output: jobs on stdin, each a pickled ``(target, path, module, kernel, args, meta)``
-> one pickled answer per job on stdout: ``""`` when the kernel compiled, else the error's text.
The compile lands in Triton's on-disk cache (``TRITON_CACHE_DIR``, inherited from the parent);
the parent's own ``warmup`` of the same kernel then finds it there, in a few milliseconds.

The parent holds the GPU. Here ``target`` (``("cuda", 90, 32)``: backend, architecture, warp
size) stands for it: a stand-in driver answers Triton's questions about the current device, so
no CUDA context is made and nothing here depends on how the parent started its GPU work. The
script imports only torch and Triton, and the kernel's module from the file the parent wrote:
Triton's cache key hashes the function's source and line, the target and the options, so the
two processes compute the same key.

NB: in PyTorch this is torch/_inductor/compile_worker/ (``SubprocMain``), whose workers compile
Triton kernels from their source for the parent's ``GPUTarget`` too
(torch/_inductor/runtime/triton_heuristics.py, ``CachingAutotuner.precompile``).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import warnings
from typing import Any, BinaryIO


def read_message(stream: BinaryIO) -> Any:
    """One length-prefixed pickle from ``stream``; None at its end."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(stream.read(int.from_bytes(head, "little")))


def write_message(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


class TargetOnlyDriver:
    """What Triton asks its driver while compiling (not launching): the current device, its
    stream and its target."""

    def __init__(self, target: tuple[str, int, int]) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget(*target)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


def compile_job(target: tuple[str, int, int], path: str, module_name: str, kernel: str,
                args: list, meta: dict) -> None:
    from triton.runtime.driver import driver

    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # Triton's inspect.getsource finds it again
        spec.loader.exec_module(module)
    driver.set_active(TargetOnlyDriver(target))  # type: ignore[arg-type]
    getattr(module, kernel).warmup(*args, grid=(1,), **meta)


def main() -> None:
    # Answers go on a copy of stdout; anything printed (by Triton, say) goes to stderr.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    warnings.simplefilter("ignore")  # Triton's warnings: the parent's warm-up gives them once
    import torch  # noqa: F401  (the jobs' arguments name torch dtypes)

    while (job := read_message(sys.stdin.buffer)) is not None:
        try:
            compile_job(*job)
            write_message(answers, "")
        except Exception as e:  # noqa: BLE001 - the parent compiles it again, and reports
            write_message(answers, f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    sys.path = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
    main()
