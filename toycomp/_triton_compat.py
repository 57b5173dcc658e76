"""The one place where toycomp touches Triton's internals: its interpreter, run without a GPU.

What it touches, and why. DESIGN.md promises that ``backend="triton"`` runs on CPU tensors with
no environment variable from the user; Triton's own switch for that, ``TRITON_INTERPRET=1``, is
read when each ``@triton.jit`` function is decorated (see the Note below). So this module uses
three things that Triton does not document and may change between releases (toycomp runs with
Triton 3.6 on the GPU machine and 3.9 in CI):

* ``triton.runtime.interpreter.InterpretedFunction``, built from a ``JITFunction``'s ``.fn``;
* ``triton.runtime.jit.JITFunction.__call__``, patched while an interpreted kernel runs;
* the namespaces the interpreter monkeypatches (``triton.language``, ``tl.core``, ``tl.math``,
  ``tl.tensor``, ``tl.dtype``...), snapshotted and restored around each launch.

``toycomp.inductor.codegen.triton`` uses only ``interpreted_function`` and
``interpreting_device_calls``; a Triton upgrade is fixed here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


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
