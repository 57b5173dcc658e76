"""toycomp's flags: one per optimisation, and two presets, ``teach`` and ``fast``.

Every measure that exists only for speed is a named pass behind one of these flags (the passes
live in toycomp/inductor/opt/, one a file; docs/passes.md lists them with their hook points).
``teach`` turns them all off: what is left is the plain pipeline a student reads, and it must give
the same values and gradients as ``fast``, the default, which turns them all on::

    >>> import toycomp
    >>> toycomp.config.split_reductions, toycomp.config.teach["split_reductions"]
    (True, False)
    >>> with toycomp.config.patch(**toycomp.config.teach):
    ...     toycomp.config.cpp.simdlen
    0
    >>> toycomp.config.cpp.simdlen is None  # None: the widest vectors this CPU has
    True

``toycomp.compile(fn, options=toycomp.config.teach)`` applies flags to one compiled function
only, as ``torch.compile(fn, options={...})`` does. Flags are read when a graph is compiled (and
the guards built), so changing one does not touch code compiled before; the kernel cache keys
generated source, which every code-changing flag changes.

NB: in PyTorch this is torch/_inductor/config.py (``split_reductions``, ``memory_planning``,
``max_autotune``, ``cpp.simdlen``, ``triton.cudagraphs``, ``triton.mix_order_reduction``...),
whose ``patch`` this module's mirrors (torch/utils/_config_module.py), and
torch/_dynamo/config.py for capture.
"""

from __future__ import annotations

import contextlib
from typing import Any

# --- the flags (their defaults are the fast preset) ---------------------------------------------
# A long reduction with few outputs becomes a partial reduction over chunks plus a small
# finishing one (Triton; after lowering: inductor/opt/split_reduction.py).
split_reductions = True
# The wrapper reuses dead buffers, in place where safe, and matmuls write into them (with
# ``out=``); off: each buffer is allocated before its first write (inductor/opt/memory_planning.py).
memory_planning = True
# Triton on CUDA: time a few launch configs per kernel at its first call, keep the fastest
# (inductor/opt/autotune.py); compile(mode="max-autotune") sets it. Off in both presets.
max_autotune = False
# Capture: guard paths shared by several lines read once (a regular-expression rewrite of the
# guard text), the tensors of a model's attributes checked by one C++ call
# (capture/guard_check.py: [Note: guards name shared prefixes], [Note: tensor guards in one call]),
# a call's arguments bound by position without ``inspect`` (capture/convert_frame.py); and the AOT
# runtime's inputs checked by one C++ call (aot/runtime_wrappers.py). (TorchDynamo's counterpart
# is its C++ GuardManager tree.)
fast_guards = True
# CUDA: a bf16/fp16 convolution in a graph channels-last around it (ConvNeXt's) reads and writes
# its activations channels-last, the layout cuDNN computes in; a graph output that eager lays out
# otherwise (a saved transpose) is computed in that layout by a kernel, not copied there by ATen
# after (inductor/opt/layout_optimization.py).
layout_optimization = True
# The C++ kernels of a graph compile at once, this many compilers side by side (None: one per
# core; False, 0 or 1: one after another) in a pool of threads (inductor/opt/async_compile.py).
compile_threads: int | None = None
# Compiled C++ kept on disk between runs, keyed by a hash of its source, compiler, flags and CPU
# (inductor/cache.py: [Note: cache security]); off: each library is compiled into a fresh
# temporary folder. (Inductor's code cache, which has no switch; its graph cache: fx_graph_cache.)
kernel_cache = True


class cpp:
    """The C++ backend (Inductor: ``config.cpp``)."""

    # Vector width: None = this CPU's (``omp simd`` pointwise loops, glibc's vector libm, toycomp's
    # own sincos: inductor/opt/libmvec.py, opt/cpp_vector_prefix.py); 0 = scalar ``std::sin``,
    # the C++ a student reads; 256 = AVX2's width on an AVX-512 CPU, as ATEN_CPU_CAPABILITY=avx2
    # ([Note: forcing AVX2] in cache.py). (Inductor: the same values; 0 turns off CppVecKernel.)
    simdlen: int | None = None
    # Reductions over columns, loops over planes, sibling reductions in one pass
    # (inductor/opt/cpp_layout.py).
    layouts = True
    # A row's costly values computed once and kept for the next loop (opt/cpp_row_buffers.py).
    row_buffers = True
    # A graph's C++ kernels compiled as one unit per compile thread (inductor/opt/async_compile.py).
    batch_kernels = True


class triton:
    """The Triton backend (Inductor: ``config.triton``)."""

    # Each compiled graph replayed as one CUDA graph (inductor/opt/cudagraphs.py);
    # compile(mode="reduce-overhead") sets it. Off in both presets.
    cudagraphs = False
    # A column sum fused with a row reduction of the same input (opt/split_reduction.py).
    mix_order_reduction = True
    # evict_first / evict_last hints on loads, and the L2-size rule that picks them
    # (codegen/triton_heuristics.py: [Note: eviction policy]).
    eviction_hints = True
    # On CUDA, kernels launched through Triton's low-level launcher, ``kernel.run(stream0, ...)``
    # ([Note: lean launches] in _triton_compat.py); off: ``kernel[grid](...)``, no autotuning.
    lean_launch = True
    # Each integer size also passed as ``s0_ALIGN``, the power of two up to 16 dividing it, so
    # that Triton knows loads are aligned ([Note: alignment of symbolic sizes] in triton.py).
    divisible_by_16 = True
    # On CUDA, with compile_threads, the Triton kernels compiled in worker processes, side by side
    # ([Note: Triton compiles in processes] in opt/async_compile.py); off: in the threads.
    compile_workers = True


# Flags that stay off in both presets (asked for: mode="reduce-overhead", "max-autotune").
_REQUESTED_ONLY = ("max_autotune", "triton.cudagraphs")
_NAMESPACES = {"cpp": cpp, "triton": triton}


def _owner(name: str) -> tuple[Any, str]:
    """The object holding flag ``name`` (``"cpp.simdlen"`` -> ``cpp``) and its attribute."""
    if name not in DEFAULTS:
        raise AttributeError(f"toycomp.config has no flag {name!r}; flags: {sorted(DEFAULTS)}")
    namespace, _, attr = name.rpartition(".")
    return _NAMESPACES.get(namespace, _module), attr


def get(name: str) -> Any:
    """The current value of flag ``name`` (``"split_reductions"``, ``"cpp.simdlen"``)."""
    owner, attr = _owner(name)
    return getattr(owner, attr)


def snapshot() -> dict[str, Any]:
    """Every flag's current value: what the kernel cache and explain record."""
    return {name: get(name) for name in DEFAULTS}


class patch(contextlib.ContextDecorator):
    """Set flags inside a ``with`` block or a decorated function, as
    ``torch._inductor.config.patch`` does: ``patch(split_reductions=False)``,
    ``patch({"cpp.simdlen": 0})`` or ``patch(**toycomp.config.teach)``. Unknown names raise."""

    def __init__(self, changes: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.changes = check_options({**(changes or {}), **kwargs})
        self._saved: list[dict[str, Any]] = []  # the values each (nested) entry replaced

    def __enter__(self) -> None:
        self._saved.append({name: getattr(*_owner(name)) for name in self.changes})
        for name, value in self.changes.items():
            setattr(*_owner(name), value)

    def __exit__(self, *exc: Any) -> None:
        for name, value in self._saved.pop().items():
            setattr(*_owner(name), value)


def check_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """``toycomp.compile(fn, options=...)``: a dict of flags, checked now (unknown names raise)."""
    for name in options or {}:
        _owner(name)
    return dict(options or {})


import sys as _sys  # noqa: E402  (the module itself, for the flat flags)

_module = _sys.modules[__name__]
_FLAT = ("split_reductions", "memory_planning", "max_autotune", "fast_guards", "compile_threads",
         "kernel_cache", "layout_optimization")
DEFAULTS: dict[str, Any] = {name: getattr(_module, name) for name in _FLAT}
DEFAULTS |= {f"{ns}.{attr}": value for ns, owner in _NAMESPACES.items()
             for attr, value in vars(owner).items() if not attr.startswith("_")}  # fmt: skip

# The presets: dicts of flags, for patch(**preset) and compile(options=preset).
fast: dict[str, Any] = dict(DEFAULTS)
teach: dict[str, Any] = {
    name: (0 if name == "cpp.simdlen" else False) for name in DEFAULTS
}
