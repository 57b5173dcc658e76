"""Notebook 04's exercises (TorchInductor: loops, fusion, code generation): the checks.

Input -> output: what the student wrote in ``notebooks/04_inductor_triton.ipynb`` -> a short
verdict (``checking.Verdict``), printed by the check cell. Each check runs the student's code on
several cases and compares with eager PyTorch and with toycomp's own stage 4:

1. ``check_lowering(lower_rev)``: a lowering rule for a new prim, ``rev`` (``torch.flip``), as
   index arithmetic; the loop IR it makes is run by toycomp's interpreter and compared with
   ``torch.flip`` (PyTorch's Inductor lowers ``prims.rev`` the same way);
2. ``check_can_fuse(can_fuse)``: may a pointwise consumer join its reduction producer's kernel?
   Compared with what toycomp's scheduler decides;
3. ``check_triton_softmax(softmax_kernel)``: a row softmax hand-written in Triton, run on Triton's
   CPU interpreter, compared with ``torch.softmax`` and with toycomp's generated Triton kernel;
4. ``check_kernel_counts(predict_kernel_counts)``: the number of kernels toycomp makes for small
   programs (``KERNEL_COUNT_PROGRAMS``), predicted before running them; the expected counts are
   toycomp's own, on both backends (C++ and Triton), counted when the check runs.

Each check is one call in the notebook's check cell: ``nb04.check_lowering(lower_rev)``.

NB: in PyTorch, ``prims.rev`` is lowered in torch/_inductor/lowering.py (``rev``), fusion is
decided in torch/_inductor/scheduler.py (``can_fuse``), and the Triton tutorial "Fused Softmax"
(python/tutorials/02-fused-softmax.py in the Triton repository) is the hand-written kernel.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import sympy
import torch

from toycomp.exercises.checking import (Failure, call, exercise, expect, expect_close, expect_equal,
                                        expect_prediction)  # fmt: skip
from toycomp.inductor import indexing, ir
from toycomp.inductor.interpret import run_lowered
from toycomp.inductor.lowering import lower
from toycomp.inductor.scheduler import schedule
from toycomp.inductor.tensor_value import TensorValue, strided_load
from toycomp.prims.decompositions import decompose

aten = torch.ops.aten


# --- exercise 1: a lowering rule for prims.rev (torch.flip) -----------------------------------
# (case name, size, stride, dims): element (i0, i1, ...) of the input lives at sum(stride * i).
REV_CASES = [
    ("1-D, dims [0]", (5,), (1,), [0]),
    ("2-D, dims [1]", (3, 4), (4, 1), [1]),
    ("2-D, dims [0, 1]", (3, 4), (4, 1), [0, 1]),
    ("2-D, dims [-1]", (3, 4), (4, 1), [-1]),
    ("transposed input, dims [0]", (4, 3), (1, 4), [0]),
    ("3-D, dims [0, 2]", (2, 3, 4), (12, 4, 1), [0, 2]),
    ("size-1 dim, dims [0, 1]", (1, 4), (4, 1), [0, 1]),
]


@exercise("04", 1, "lowering", points=1)
def check_lowering(lower_rev: Callable[..., TensorValue]) -> None:
    """``lower_rev(g, out, a, dims)`` -> the TensorValue of ``torch.flip(a, dims)``."""
    gen = torch.Generator().manual_seed(0)
    for case, size, stride, dims in REV_CASES:
        storage = torch.randn(max(1, sum((n - 1) * s for n, s in zip(size, stride)) + 1),
                              generator=gen)  # fmt: skip
        data = storage.as_strided(size, stride)
        a = strided_load("a", size, stride, torch.float32)
        value = call(case, lower_rev, None, torch.empty(size, device="meta"), a, list(dims))
        expected = torch.flip(data, dims)
        _expect_tensor_value(case, value, size)
        _expect_in_bounds(case, value.body, size, storage.numel())
        got = _run_body(value, storage, size, stride)
        expect_close(case, got, expected, hint=_rev_hint(value, dims))


def _expect_tensor_value(case: str, value: Any, size: tuple[int, ...]) -> None:
    if not isinstance(value, TensorValue):
        hint = "return reindex(a, size, index): a TensorValue, like the rules for permute/slice"
        raise Failure(case, "a TensorValue", type(value).__name__, hint)
    expect_equal(case, tuple(value.size), size, "flip keeps the size of its input")


def _expect_in_bounds(case: str, body: ir.Expr, size: tuple[int, ...], numel: int) -> None:
    """Every load of ``body`` reads inside the input's memory for every (i0, i1, ...) in range."""
    ranges = dict(zip(indexing.index_vars("i", len(size)), size))
    for e in ir.walk(body):
        if isinstance(e, ir.Load):
            bounds = indexing.index_bounds(sympy.sympify(e.index), ranges)
            if bounds is None or bounds[0] < 0 or bounds[1] >= numel:
                got = f"load({e.buffer}, {e.index}) reads elements {bounds} of 0..{numel - 1}"
                hint = "element i of a dim of size n comes from element n - 1 - i"
                raise Failure(case, f"loads inside 0..{numel - 1}", got, hint)


def _run_body(value: TensorValue, storage: torch.Tensor, size, stride) -> torch.Tensor:
    """Realize ``value`` as the only buffer of a LoweredGraph and run it with the interpreter."""
    out_stride = indexing.contiguous_strides(size)
    lowered = ir.LoweredGraph(
        inputs=(ir.InputBuffer("a", tuple(size), tuple(stride), torch.float32),),
        nodes=(ir.Pointwise("buf0", tuple(size), torch.float32, value.body),),
        outputs=(ir.TensorArg("buf0", tuple(size), out_stride),),
        device=torch.device("cpu"),
    )
    (out,) = run_lowered(lowered, [storage.as_strided(size, stride)])
    return out


def _rev_hint(value: TensorValue, dims: list[int]) -> str:
    return (f"your body is {value.body!r}; dims {dims} must read from the other end, "
            "the other dims unchanged")  # fmt: skip


# --- exercise 2: fusion legality -------------------------------------------------------------
def _row_scaled(x):  # x / x.sum(1, keepdim=True)
    return aten.div.Tensor(x, aten.sum.dim_IntList(x, [1], True))


def _column_scaled(x):  # x / x.sum(1)[None, :]
    return aten.div.Tensor(x, aten.unsqueeze.default(aten.sum.dim_IntList(x, [1]), 0))


def _column_centered(x):  # x - x.mean(0)
    return aten.sub.Tensor(x, aten.mean.dim(x, [0]))


def _last_dim_scaled(x):  # x / x.sum(2, keepdim=True), x 3-D
    return aten.div.Tensor(x, aten.sum.dim_IntList(x, [2], True))


def _plane_scaled(x):  # x / x.sum((1, 2), keepdim=True), x 3-D
    return aten.div.Tensor(x, aten.sum.dim_IntList(x, [1, 2], True))


def _row_sums_doubled(x):  # x.sum(1) * 2
    return aten.mul.Tensor(aten.sum.dim_IntList(x, [1]), 2)


def _outer_sum(x):  # s[:, None] + s[None, :] with s = x.sum(1)
    s = aten.sum.dim_IntList(x, [1])
    return aten.add.Tensor(aten.unsqueeze.default(s, 1), aten.unsqueeze.default(s, 0))


# (case name as the student reads it, ATen-level program, input size)
FUSION_CASES = [
    ("x / x.sum(1, keepdim=True)", _row_scaled, (6, 5)),
    ("x / x.sum(1)[None, :]", _column_scaled, (6, 6)),
    ("x - x.mean(0)", _column_centered, (6, 5)),
    ("x / x.sum(2, keepdim=True), x 3-D", _last_dim_scaled, (3, 4, 5)),
    ("x / x.sum((1, 2), keepdim=True)", _plane_scaled, (3, 4, 5)),
    ("x.sum(1) * 2", _row_sums_doubled, (6, 5)),
    ("s[:, None] + s[None, :], s = x.sum(1)", _outer_sum, (6, 6)),
]


def fusion_case(program: Callable, size: tuple[int, ...]) -> tuple[ir.LoweredGraph, bool]:
    """The lowered graph of ``program`` (a Reduction ``buf0``, then a Pointwise ``buf1`` that
    loads it) and whether toycomp's scheduler puts both in one kernel."""
    x = torch.randn(size)
    lowered = lower(decompose(torch.fx.symbolic_trace(program), [x]), [x])
    kinds = [type(n) for n in lowered.nodes]
    if kinds != [ir.Reduction, ir.Pointwise]:  # the checker's own cases must have this shape
        raise RuntimeError(f"fusion case {program.__name__} lowers to {kinds}")
    kernels = [s for s in schedule(lowered).steps if isinstance(s, ir.Kernel)]
    return lowered, len(kernels) == 1


@exercise("04", 2, "can_fuse", points=1)
def check_can_fuse(can_fuse: Callable[[ir.Reduction, ir.Pointwise], bool]) -> None:
    """``can_fuse(producer, consumer)`` agrees with toycomp's scheduler on every case."""
    for case, program, size in FUSION_CASES:
        lowered, fused = fusion_case(program, size)
        producer, consumer = lowered.nodes
        got = call(case, can_fuse, producer, consumer)
        expect(isinstance(got, bool), case, "True or False", got, "return a bool")
        reads = ", ".join(repr(e) for e in ir.walk(consumer.body)
                          if getattr(e, "buffer", None) == producer.name)  # its loads of it
        hint = (f"{producer.name} has {indexing.numel(producer.size)} rows; the consumer "
                f"{list(consumer.size)} reads {reads}")  # fmt: skip
        expect_equal(case, got, fused, hint)


# --- exercise 3: softmax by hand in Triton ----------------------------------------------------
SOFTMAX_CASES = [
    ("8 x 1000, as in section 3", (8, 1000), 1.0),
    ("3 x 7 (7 columns: a partial block)", (3, 7), 1.0),
    ("1 x 1", (1, 1), 1.0),
    ("4 x 16, values up to 1000 (exp overflows)", (4, 16), 1000.0),
    ("2 x 5, all values near -1000", (2, 5), -1000.0),
]


def launch_softmax(kernel: Any, x: torch.Tensor) -> torch.Tensor:
    """``kernel[(rows,)](x, out, cols, BLOCK=next_power_of_2(cols))`` on Triton's CPU
    interpreter: one program per row, as the notebook's stub promises."""
    from triton.runtime.errors import InterpreterError

    from toycomp.inductor.codegen.triton import InterpretedKernel
    from toycomp.inductor.codegen.triton_heuristics import next_power_of_2

    rows, cols = x.shape
    out = torch.full_like(x, float("nan"))
    try:
        InterpretedKernel(kernel)[(rows,)](x, out, cols, BLOCK=next_power_of_2(cols))
    except InterpreterError as e:  # the interpreter wraps the kernel's own exception
        raise (e.__cause__ or e) from None
    return out


def generated_softmax(x: torch.Tensor) -> torch.Tensor:
    """The row softmax through toycomp's generated Triton kernel (on the interpreter)."""
    import toycomp

    return toycomp.compile(lambda t: torch.softmax(t, -1), backend="triton")(x)


@exercise("04", 3, "triton_softmax", points=2)
def check_triton_softmax(softmax_kernel: Any) -> None:
    """The student's ``@triton.jit`` kernel against torch.softmax and toycomp's kernel."""
    gen = torch.Generator().manual_seed(0)
    for case, size, scale in SOFTMAX_CASES:
        x = torch.randn(size, generator=gen)
        x = x * scale if scale > 0 else x + scale
        got = call(case, launch_softmax, softmax_kernel, x)
        expected = torch.softmax(x, -1)
        generated = generated_softmax(x)
        if not torch.allclose(generated, expected, rtol=1e-4, atol=1e-5):  # toycomp's own bug
            raise RuntimeError(f"toycomp's generated softmax is wrong on {case}")
        expect_close(case, got, expected, hint=_softmax_hint(got, x))


def _softmax_hint(got: torch.Tensor, x: torch.Tensor) -> str:
    if torch.isnan(got).any():
        return "NaN: exp overflows (subtract the row max first), or a column was not stored"
    if x.shape[1] != 1 << math.ceil(math.log2(x.shape[1])):
        return "masked lanes (cols >= n_cols) must not count: load them as -inf (exp gives 0)"
    return "out[i, j] = exp(x[i, j] - max_j x[i, :]) / sum_k exp(x[i, k] - max_j x[i, :])"


# --- exercise 4: predicting kernel counts ------------------------------------------------------
def _chain(x):
    return torch.relu(x * 2 + 1).sqrt()


def _two_outputs(x):
    return x.sin(), x.cos() * 2


def _linear_relu(x, w):
    return torch.relu(x @ w + 1)


def _softmax(x):
    return torch.softmax(x, -1)


def _both_sums(x):
    return x.sum(1), x.sum(0)


def _transpose_scaled(x):
    return x.t() / x.sum(1)


def _column_centered_program(x):
    return x - x.mean(0)


# name -> the program; every one runs on x = torch.randn(64, 32) (and w = torch.randn(32, 16)):
# not square, so that a row sum and a column sum do not happen to have the same sizes.
KERNEL_COUNT_PROGRAMS: dict[str, Callable] = {
    "chain": _chain,
    "two_outputs": _two_outputs,
    "linear_relu": _linear_relu,
    "softmax": _softmax,
    "both_sums": _both_sums,
    "transpose_scaled": _transpose_scaled,
    "column_centered": _column_centered_program,
}

KERNEL_COUNT_HINTS = {
    "two_outputs": "two outputs over the same elements can be stored by one loop",
    "linear_relu": "a matmul is an extern call (aten.mm), not a generated kernel",
    "both_sums": "a kernel has one (numel, rnumel): x.sum(1) makes 64 sums of 32 elements, "
    "x.sum(0) 32 sums of 64 (on Triton in the fast preset: a mix-order pass and its finishing sum)",
    "transpose_scaled": "element (i, j) of x.t() / s reads s[j]: not the row i of a kernel over i",
    "column_centered": "x.mean(0) reduces over rows: its consumer reads it by column",
}


def program_inputs(program: Callable) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(64, 32, generator=gen)]
    if program is _linear_relu:
        inputs.append(torch.randn(32, 16, generator=gen))
    return inputs


def toycomp_kernel_count(program: Callable, backend: str = "cpp") -> int:
    """How many kernels toycomp generates for ``program``'s forward graph on ``backend``."""
    import toycomp

    return len(toycomp.explain(program, *program_inputs(program), backend=backend).kernels)


@exercise("04", 4, "kernel_counts", points=1)
def check_kernel_counts(predict_kernel_counts: Callable[[], dict[str, int]]) -> None:
    """The student's predictions against the kernels toycomp generates, with each backend (the
    two agree on these programs: one prediction per program)."""
    predicted = call("predictions", predict_kernel_counts)
    expect(isinstance(predicted, dict), "predictions", "a dict", type(predicted).__name__)
    missing = [name for name in KERNEL_COUNT_PROGRAMS if name not in predicted]
    expect(not missing, "predictions", "a count for every program", f"missing {missing}")
    for name, program in KERNEL_COUNT_PROGRAMS.items():
        hint = KERNEL_COUNT_HINTS.get(name, "count the groups the scheduler can fuse (section 3)")
        for backend in ("cpp", "triton"):
            case = f"{name}, {backend}"
            call(case, lambda: None)  # counted as a case
            expect_prediction(case, predicted[name], toycomp_kernel_count(program, backend), hint)
