"""Stage 4, run time: what compiled code calls while it runs, shared by the wrapper and interpreter.

Input -> output: real tensors and the layouts the loop IR was compiled for -> the same tensors
checked (or copied into those layouts), and the eager functions that extern kernels name. The
generated wrapper (``wrapper.py``) finds these functions in its namespace, and the IR interpreter
(``interpret.py``) calls the same ones, so both run a graph by the same rules::

    >>> import torch
    >>> resolve_extern("aten.mm.default")
    <OpOverload(op='aten.mm', overload='default')>
    >>> t = check_extern(torch.ones(4, 2).t(), (2, 4), (4, 1), torch.float32, "buf0")
    >>> t.stride()  # an extern returned other strides than planned: copied into the planned ones
    (4, 1)
    >>> reinterpret_tensor(torch.arange(6.0), (2, 2), (1, 2), 1)  # TensorArg(buf, size, stride, 1)
    tensor([[1., 3.],
            [2., 4.]])

NB: in PyTorch the wrapper's run-time helpers are ``assert_size_stride`` and
``_reinterpret_tensor`` (C++, in torch/csrc/dynamo/guards.cpp), called from the code that
torch/_inductor/codegen/wrapper.py writes; extern kernels are resolved by
torch/_inductor/ir.py (``ExternKernel``, ``FallbackKernel``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from toycomp.tensor_utils import same_strides


def resolve_extern(kernel: str) -> Callable[..., Any]:
    """The eager function an ``ir.ExternKernel`` calls: ``"aten.mm.default"`` is
    ``torch.ops.aten.mm.default``; ``"toycomp.prims.sin"`` (a visible fallback for a prim that
    cannot be lowered) is the eager reference of toycomp's prim (NOT ``torch.ops.prims.sin``,
    PyTorch's own, different prims). A clear error if there is no such function."""
    try:
        if kernel.startswith("toycomp.prims."):
            import toycomp.prims as prims  # local import: the runtime needs prims only here

            return prims.PRIM_INFO[prims.PRIMS[kernel.removeprefix("toycomp.prims.")]].ref
        fn: Any = torch.ops
        for part in kernel.split("."):
            fn = getattr(fn, part)
        return fn
    except (AttributeError, KeyError, RuntimeError) as e:
        raise RuntimeError(f"extern kernel {kernel!r} not found") from e


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)``: the number of blocks of ``b`` covering ``a`` (a Triton grid)."""
    return -(-a // b)


def alignment(n: int) -> int:
    """The largest power of two up to 16 dividing ``n`` (16 for 0): what a dynamic Triton
    kernel may assume of a size (see [Note: alignment of symbolic sizes] in triton.py)."""
    return min(n & -n, 16) if n else 16


def reinterpret_tensor(t: torch.Tensor, size: tuple, stride: tuple, offset: int) -> torch.Tensor:
    """The view ``TensorArg(buffer, size, stride, offset)``: offset counts from ``t``'s start."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


# [Note: results laid out like eager's, overlapping ones included]
# An output (or an extern's result) is copied into the strides eager gives it. Those may leave
# gaps (a chunk of a bigger tensor) or make elements share memory: eager returns expanded views
# (the backward of `x.sum()` is `grad.expand(x.shape)`, stride 0) and overlapping windows
# (`unfold`). `empty_strided(size, stride).copy_(t)` refuses the latter ("more than one element
# of the written-to tensor refers to a single memory location"). Elements that share a location
# hold the same value in eager's result, so we write each location once: a stride-0 dimension is
# narrowed to its first index, what is left is copied when its strides cannot overlap, else
# scattered through the storage positions of its elements. The result is fresh storage viewed
# with eager's strides: its values, shape and strides are eager's, it aliases nothing else, and
# writing into it is refused where eager refuses it too.
def restride(t: torch.Tensor, stride: tuple) -> torch.Tensor:
    """A copy of ``t`` laid out with ``stride`` (see the Note: gaps and overlaps allowed)."""
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    if out.numel() == 0:
        return out
    core, core_out = t, out
    for dim, (n, step) in enumerate(zip(t.shape, stride)):
        if step == 0 and n > 1:
            core, core_out = core.narrow(dim, 0, 1), core_out.narrow(dim, 0, 1)
    if not _may_overlap(core_out):
        core_out.copy_(core)
        return out
    footprint = 1 + sum((n - 1) * s for n, s in zip(core_out.shape, core_out.stride()))
    storage = out.as_strided((footprint,), (1,), out.storage_offset())
    positions = torch.arange(footprint, device=t.device).as_strided(core.shape, core_out.stride())
    storage[positions.reshape(-1)] = core.reshape(-1)
    return out


def _may_overlap(t: torch.Tensor) -> bool:
    """True unless each dimension, by increasing stride, steps past all the smaller ones."""
    span = 1  # elements reached by the dimensions seen so far
    for s, n in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if s < span:
            return True
        span += (n - 1) * s
    return False


# [Note: inputs checked once]
# Kernels index inputs with the sizes and strides they were compiled for, so the wrapper checks
# every input on every call (check_input; Inductor's assert_size_stride). In Python that costs
# about 1.5 us an input, and a training step's two wrappers take hundreds (a MobileNet-v2 step
# checks 717). So a wrapper with more than FEW_INPUTS tensor inputs first asks one C++ call
# (Dynamo's TensorGuards, through _torch_compat.LayoutsSeen) whether they have exactly the
# layouts of the last inputs that passed; only when they do not does it run check_input on
# each (which raises on a real mismatch) and remember them. That call is stricter than
# check_input (equal strides in size-1 dims too, the same requires_grad and tensor class), so
# it can send a call the slow way, never let through one that check_input would refuse. The
# AOT runtime's _with_layouts checks its inputs the same way before it copies any.
FEW_INPUTS = 4


def check_input(
    t: torch.Tensor, size: tuple, stride: tuple, dtype: torch.dtype,
    device: torch.device | None, name: str
) -> None:
    """Raise unless ``t`` has the layout its kernels were compiled for (``_check_input_fully``)."""
    if isinstance(t, torch.Tensor) and t.dtype is dtype and t.stride() == stride:  # the usual
        if t.shape == size and t.device == device:
            return
    _check_input_fully(t, size, stride, dtype, device, name)


def _check_input_fully(
    t: torch.Tensor, size: tuple, stride: tuple, dtype: torch.dtype,
    device: torch.device | None, name: str
) -> None:
    """``check_input`` for an input unlike the layout it was compiled for: raise unless only
    what kernels never read (a size-0/1 dim's stride, a device index left open) differs.
    ``device`` None: any device (see [Note: extern seeds] in lowering.py)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"input {name}: expected a tensor, got {type(t).__name__}")
    same_device = device is None or (
        t.device.type == device.type and device.index in (None, t.device.index))
    if t.dtype != dtype or not same_device or not same_strides((size, stride), t):
        got = f"{tuple(t.shape)}, stride {t.stride()}, {t.dtype} on {t.device}"
        want = f"{tuple(size)}, stride {tuple(stride)}, {dtype} on {device}"
        raise ValueError(f"input {name}: compiled for {want}, got {got}")


def check_extern(t: Any, size: tuple, stride: tuple, dtype: torch.dtype, name: str) -> torch.Tensor:
    """An extern result as lowering planned it (size, dtype); one with other strides than
    planned is copied into the planned layout (eager kernels may choose their own strides)."""
    # the common case first, cheaply, as in check_input (a step checks a hundred externs)
    if isinstance(t, torch.Tensor) and t.dtype is dtype and t.stride() == stride:
        if t.shape == size:
            return t
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(size) or t.dtype != dtype:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise RuntimeError(f"extern kernel for {name}: expected {tuple(size)} {dtype}, got {got}")
    if same_strides((size, stride), t):
        return t
    return restride(t, stride)
