"""The one place where toycomp touches Triton's internals: its interpreter, run without a GPU.

What it touches, and why. DESIGN.md promises that ``backend="triton"`` runs on CPU tensors with
no environment variable from the user; Triton's own switch for that, ``TRITON_INTERPRET=1``, is
read when each ``@triton.jit`` function is decorated (see the Note below). So this module uses
three things that Triton does not document and may change between releases (toycomp runs with
Triton 3.6 on the GPU machine and 3.9 in CI):

* ``triton.runtime.interpreter.InterpretedFunction``, built from a ``JITFunction``'s ``.fn``;
* ``triton.runtime.jit.JITFunction.__call__``, patched while an interpreted kernel runs;
* the namespaces the interpreter monkeypatches (``triton.language``, ``tl.core``, ``tl.math``,
  ``tl.tensor``, ``tl.dtype``...), snapshotted and restored around each launch;
* on CUDA, a compiled kernel's launcher (``CompiledKernel.run``, ``.function``,
  ``.packed_metadata``), called directly once ``JITFunction.run`` has compiled it (see
  [Note: lean launches]);
* the driver's ``get_current_target`` here, and in the compile workers
  (inductor/opt/triton_worker.py) ``driver.set_active`` with a driver that only names a target.

``toycomp.inductor.codegen.triton`` uses only ``InterpretedKernel`` (CPU tensors) and
``LeanLauncher`` (CUDA), the CUDA wrapper ``raw_stream``; a Triton upgrade is fixed here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch


def interpreted_function(jit_fn: Any) -> Any:
    """The ``@triton.jit`` function ``jit_fn`` as Triton's interpreter runs it (NumPy, on CPU):
    launched like the kernel itself, ``fn[grid](*args, **meta)``."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(jit_fn.fn)


# [Note: Triton's interpreter without TRITON_INTERPRET]
# TRITON_INTERPRET=1 makes `@triton.jit` return an InterpretedFunction instead of a JITFunction,
# but it is read when each function is decorated, including triton.language's own jit functions
# (tl.sum, tl.max are @triton.jit code), so setting it later is too late. Instead we build the
# InterpretedFunction ourselves from the plain Python function (`jit_fn.fn`), and while it runs
# we make calls to other jit functions (tl.sum, our helpers) interpret too. The interpreter
# patches triton.language while it runs and, for such nested calls, does not undo all of it
# (a later CUDA compile in the same process would then fail), so we snapshot and restore the
# patched namespaces. Nothing global outlives a launch, and one module serves CUDA tensors too.
@contextlib.contextmanager
def interpreting_device_calls() -> Iterator[None]:
    """While active, calling a JITFunction runs it in Triton's interpreter."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    original = JITFunction.__call__
    saved = {obj: dict(vars(obj)) for obj in _language_namespaces()}

    def call(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
        return InterpretedFunction(self.fn)(*args, **kwargs)

    JITFunction.__call__ = call
    try:
        yield
    finally:
        JITFunction.__call__ = original
        for obj, attrs in saved.items():
            for name, value in list(vars(obj).items()):
                if name not in attrs:
                    delattr(obj, name)
                elif value is not attrs[name]:
                    setattr(obj, name, attrs[name])


def _language_namespaces() -> list[Any]:
    """The modules and classes that Triton's interpreter monkeypatches."""
    import triton.language as tl

    # (not tl.standard: the interpreter only adds names to it, which its cached rewrites need)
    objs = [tl, tl.core, tl.math, tl.tensor, tl.dtype]
    return objs + [getattr(tl.core, n) for n in ("tensor_descriptor_base",) if hasattr(tl.core, n)]


class InterpretedKernel:
    """``kernel[grid](*args, **meta)`` for CPU tensors, run by Triton's NumPy interpreter (see
    [Note: Triton's interpreter without TRITON_INTERPRET])."""

    def __init__(self, jit_fn: Any) -> None:
        self.fn = interpreted_function(jit_fn)

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            import numpy as np

            kwargs.pop("num_warps", None)
            # tl.where evaluates both branches: NumPy's warnings about the unused one are noise.
            with interpreting_device_calls(), np.errstate(all="ignore"):
                self.fn[grid](*args, **kwargs)

        return launch


# [Note: lean launches]
# `kernel[grid](*args, **meta)` goes through `JITFunction.run`, which on every launch reads
# Triton's settings, binds the arguments, specializes each one (a pointer 16-byte aligned? an
# int equal to 1, or a multiple of 16?), turns that into a cache key string, looks the compiled
# kernel up and asks it for launch metadata: tens of microseconds of Python per launch, and a
# training step launches hundreds of kernels (notebook 05's GPT step left the GPU idle 3.4 ms
# a step, Inductor's 1.6 ms). Inductor generates a launcher per compiled kernel that calls its
# binary directly. So do we: the first launch of a kind of arguments goes through Triton
# (which compiles and launches), later ones call `CompiledKernel.run` with the arguments in
# signature order. The kind of a tensor is what Triton specializes it on (dtype and 16-byte
# alignment); an int is keyed by its value, which decides its specialization (== 1, % 16 == 0,
# 32-bit range) and is cheaper to key on than those tests; the constexprs go in by name.
# The wrapper calls `kernel.run(stream, grid, *args, **meta)`: it has entered the kernel's
# device (its device guard) and read the current stream once per call, as Inductor's wrapper
# does (`get_raw_stream`), so a launch asks CUDA for neither. Tensors are passed as their
# addresses: given a tensor, Triton's launcher calls its data_ptr() and asks the CUDA driver
# whether the pointer is a device pointer, for every tensor of every launch; our wrapper has
# already checked every input's device (check_input), and allocates the rest on it. Launch
# hooks (a profiler such as Proton adds them to Triton's empty default chain) send every
# launch through Triton.
class LeanLauncher:
    """``kernel[grid](*args, **meta)`` on CUDA, for a ``JITFunction`` ``kernel``: the compiled
    kernel is called directly once Triton has compiled it for these argument kinds. A launcher
    launches on one device: ``device``, or the current one when it was made."""

    def __init__(self, jit_fn: Any, device: torch.device | None = None) -> None:
        from triton import knobs
        from triton.runtime import driver

        self.fn = jit_fn
        self.knobs = knobs.runtime
        self.driver = driver.active
        index = None if device is None else device.index
        self.device = torch.cuda.current_device() if index is None else index
        self.launches: dict[tuple, tuple] = {}  # argument kinds -> (run, function, meta, extra)
        self.fast_launches: dict[tuple, Callable] = {}  # argument kinds -> fast_launch(...)
        self.fast: Callable | None = None  # the fast launch of the last kind launched

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        """Triton's way to launch: on the current stream of the launcher's device."""
        def launch(*args: Any, **meta: Any) -> None:
            with torch.cuda.device(self.device):
                stream = self.driver.get_current_stream(self.device)
                self.run(stream, grid, *args, **meta)

        return launch

    def run(self, stream: int, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
        """Launch on ``stream``, the current stream of the launcher's device, which is the
        current device (the wrapper's device guard; see the Note)."""
        if self.fast is not None and self.fast(stream, grid, args, meta):
            return  # the same kind of arguments as the last launch ([Note: fast launches])
        key, values = [], []  # values: what the compiled kernel receives
        for a in args:
            if type(a) is int:  # = _specialization(a), as the next case
                key.append(a)
                values.append(a)
            elif isinstance(a, torch.Tensor):  # its address, read once (see the Note)
                address = a.data_ptr()
                key.append((a.dtype, address % 16 == 0))  # = _specialization(a)
                values.append(address)
            else:
                key.append(_specialization(a))
                values.append(a)
        key = (*key, *meta.items())
        known = self.launches.get(key)
        if known is None or _active(self.knobs.launch_enter_hook):
            kernel = self.fn[grid](*args, **meta)  # Triton compiles (once) and launches
            later = self.fn.arg_names[len(args) :]  # the constexprs given by name, in order
            extra = tuple(meta[name] for name in later)
            remember(self.launches, key, (kernel.run, kernel.function, kernel.packed_metadata,
                                          extra))  # fmt: skip
            return
        run, function, metadata, extra = known
        x, y, z = (*grid, 1, 1)[:3]
        run(x, y, z, stream, function, metadata, None, None, None, *values, *extra)
        if key not in self.fast_launches:
            hooked = lambda: _active(self.knobs.launch_enter_hook)  # noqa: E731
            remember(self.fast_launches, key, fast_launch(args, meta, known, hooked))
        self.fast = self.fast_launches[key]


# [Note: launch tables are bounded]
# Ints are keyed by value, so a kernel over symbolic sizes adds a kind for every size it meets
# (a batch of 17, 18, 19...), each with a generated fast launch: without a bound a long run
# with varying sizes would keep them all. A table holds at most MAX_LAUNCH_KINDS kinds and
# starts again empty when full: the next launch of a forgotten kind takes Triton's path, whose
# own cache is keyed by specialization (bounded), so forgetting costs time, never a result.
MAX_LAUNCH_KINDS = 64


def remember(table: dict, key: Any, value: Any) -> None:
    """``table[key] = value``, emptying ``table`` first when it is full (see [Note: launch
    tables are bounded])."""
    if len(table) >= MAX_LAUNCH_KINDS:
        table.clear()
    table[key] = value


# [Note: fast launches]
# Building the key above costs a few microseconds of Python per launch: a loop over the
# arguments, a tuple per tensor, a dictionary lookup. A wrapper's launch site passes the same
# kind of arguments at every call (its dtypes are checked or allocated, its sizes fixed), so,
# like the launcher Inductor generates per kernel (``_make_launchers``), each kind of arguments
# gets a function written for it, which checks a call against that kind in one expression and
# launches:
#     def fast(stream, grid, args, meta):
#         if len(args) != 3 or meta != META or hooked():
#             return False
#         a0, a1, a2 = args
#         if not (isinstance(a0, Tensor) and a0.dtype is D0 and isinstance(a1, Tensor) and
#                 a1.dtype is D1 and a2.__class__ is int and a2 == 1000):
#             return False
#         p0 = a0.data_ptr()
#         p1 = a1.data_ptr()
#         if not ((p0 | p1) & 15 == 0):  # both 16-byte aligned, as when it was compiled
#             return False
#         x, y, z = (*grid, 1, 1)[:3]
#         run(x, y, z, stream, function, metadata, None, None, None, p0, p1, a2, *EXTRA)
#         return True
# It accepts exactly the calls whose key is this kind (anything else returns False and takes
# the keyed path), so it launches nothing the keyed path would not. 1.7 us against 4.4 us for
# eight arguments on the 2-core CPU.
def fast_launch(args: tuple, meta: dict, known: tuple, hooked: Callable[[], bool]) -> Callable:
    """The function of the Note for the kind of ``args``/``meta``, launching ``known``'s
    compiled kernel: ``fast(stream, grid, args, meta)`` -> whether it launched."""
    run, function, metadata, extra = known
    env = {"Tensor": torch.Tensor, "run": run, "function": function, "metadata": metadata,
           "EXTRA": extra, "META": dict(meta), "hooked": hooked}  # fmt: skip
    checks, reads, values, aligned, misaligned = [], [], [], [], []
    for i, a in enumerate(args):
        if type(a) is int:  # as _specialization: its value
            checks.append(f"a{i}.__class__ is int and a{i} == {a!r}")
            values.append(f"a{i}")
        elif isinstance(a, torch.Tensor):  # its dtype and alignment; passed as its address
            env[f"D{i}"] = a.dtype
            checks.append(f"isinstance(a{i}, Tensor) and a{i}.dtype is D{i}")
            reads.append(f"    p{i} = a{i}.data_ptr()")
            (aligned if a.data_ptr() % 16 == 0 else misaligned).append(f"p{i}")
            values.append(f"p{i}")
        else:  # its type
            env[f"T{i}"] = type(a)
            checks.append(f"a{i}.__class__ is T{i}")
            values.append(f"a{i}")
    pointers = [f"({' | '.join(aligned)}) & 15 == 0"] if aligned else []
    pointers += [f"{p} & 15 != 0" for p in misaligned]
    names = "".join(f"a{i}, " for i in range(len(args)))
    passed = "".join(f"{v}, " for v in values)
    source = "\n".join([
        "def fast(stream, grid, args, meta):",
        f"    if len(args) != {len(args)} or meta != META or hooked():",
        "        return False",
        f"    {names}= args" if args else "    pass",
        f"    if not ({' and '.join(checks) or 'True'}):",
        "        return False",
        *reads,
        f"    if not ({' and '.join(pointers) or 'True'}):",
        "        return False",
        "    x, y, z = (*grid, 1, 1)[:3]",
        f"    run(x, y, z, stream, function, metadata, None, None, None, {passed}*EXTRA)",
        "    return True",
    ])  # fmt: skip
    exec(compile(source, "<toycomp fast launch>", "exec"), env)
    return env["fast"]


def _active(hook: Any) -> bool:
    """A launch hook is set: a function, or one of Triton's ``HookChain``s holding any."""
    return bool(getattr(hook, "calls", hook))


def _specialization(arg: Any) -> Any:
    """What a launch is keyed on for one argument: the kind Triton compiles it into, or finer
    (an int's value; see [Note: lean launches]). ``LeanLauncher.run`` computes it inline."""
    if type(arg) is int:
        return arg
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    return type(arg)


def raw_stream(device_index: int) -> int:
    """The current CUDA stream of a device, as the handle ``LeanLauncher.run`` takes (Inductor's
    ``get_raw_stream``)."""
    from triton.runtime import driver

    return driver.active.get_current_stream(device_index)


def current_target(device: torch.device) -> tuple[str, int, int]:
    """The GPU target Triton compiles for on ``device``: (backend, architecture, warp size),
    what a compile worker needs to compile for it without a GPU (opt/async_compile.py)."""
    from triton.runtime.driver import driver

    with torch.cuda.device(device):
        target = driver.active.get_current_target()
    return target.backend, target.arch, target.warp_size
