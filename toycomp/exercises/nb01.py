"""Checks for notebook 01 (graph capture): the student's code against toycomp and Dynamo.

Each check takes what the exercise cell defined and prints a verdict (toycomp/exercises/checking.py):

1. ``check_unary_negative(trace_bytecode)``: the notebook's stack interpreter, with the student's
   ``UNARY_NEGATIVE`` handler, on functions that negate tensors: the graph's values against
   eager, and one ``operator.neg`` node per ``-`` (Dynamo's graph has the same).
2. ``check_tensor_guard(tensor_guard)``: a guard for the naive tracer; on pairs of tensors, its
   verdict against toycomp's compiled guard function for a graph traced on the first.
3. ``check_graph_counts(predicted_graph_counts)``: predicted graph counts of a few functions,
   against toycomp's capture and ``torch._dynamo.explain``.
4. ``check_break_free(clip_by_max, clip_by_max_break_free)``: a rewrite without the graph
   break; values against the original on several inputs, one graph in toycomp and in Dynamo.

NB: PyTorch's counterparts: torch/_dynamo/symbolic_convert.py (opcode handlers),
torch/_dynamo/guards.py (guards), ``torch._dynamo.explain`` (graph counts and break reasons).
"""

from __future__ import annotations

import contextlib
import io
import operator
from typing import Callable

import torch

from toycomp.exercises.checking import (call, exercise, expect, expect_close, expect_equal,
                                        expect_prediction)  # fmt: skip

# [Note: exercise 1 runs without the compiler]
# Exercise 1's check needs only torch.fx (and checking.py): the capture modules are imported by
# the checks that use them. So a test can run the notebook's interpreter and this check on every
# Python from 3.10 to 3.13 with a small stand-in for torch (tests/exercises/test_nb01_pythons.py).


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _dynamo_graph_count(fn: Callable, *args) -> int:
    import torch._dynamo  # private API: only to compare with the real thing

    torch._dynamo.reset()
    with contextlib.redirect_stdout(io.StringIO()):
        return torch._dynamo.explain(fn)(*args).graph_count


# -- 1. one more opcode ------------------------------------------------------------------------
def _negate_sin(x):
    return -torch.sin(x)


def _double_negation(x):
    return torch.cos(-x) - -x


@exercise("01", 1, "unary_negative", points=1)
def check_unary_negative(trace_bytecode: Callable) -> None:
    """``trace_bytecode(fn, *inputs) -> GraphModule`` with a ``UNARY_NEGATIVE`` handler."""
    for name, fn, negations in [("-torch.sin(x)", _negate_sin, 1),
                                ("torch.cos(-x) - -x", _double_negation, 2)]:  # fmt: skip
        x = _randn(7)
        gm = call(name, trace_bytecode, fn, x)
        expect(isinstance(gm, torch.fx.GraphModule), name, "a torch.fx.GraphModule", type(gm),
               "trace_bytecode returns the traced graph")  # fmt: skip
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        expect_equal(name, targets.count(operator.neg), negations,
                     "push frame.call(operator.neg, [value]): one neg node per unary minus")
        x_new = _randn(7, seed=1)
        out = call(name, gm, x_new)
        out = out[0] if isinstance(out, (tuple, list)) and len(out) == 1 else out
        expect_close(name, out, fn(x_new),
                     "the graph must compute what the function computes, on any input")


# -- 2. a guard for the naive tracer ----------------------------------------------------------
def _guard_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    x = _randn(4, 3)
    return [
        ("same metadata, new data", x, _randn(4, 3, seed=1)),
        ("another shape", x, _randn(5, 3)),
        ("another dtype", x, _randn(4, 3, dtype=torch.float64)),
        ("requires_grad", x, _randn(4, 3).requires_grad_(True)),
        ("transposed (same shape, other strides)", x, _randn(3, 4).t()),
        ("a 1-d tensor", x, _randn(12)),
        ("same again, f64 example", _randn(2, dtype=torch.float64), _randn(2, dtype=torch.float64)),
    ]


def _toycomp_accepts(example: torch.Tensor, new: torch.Tensor) -> bool:
    """toycomp's own guard function for a graph traced on ``example``, applied to ``new``."""
    from toycomp.capture.convert_frame import compile_frame

    compiled = compile_frame(lambda x: x * x.shape[0], lambda gm, inputs: gm.forward)
    compiled(example)
    (entry,) = compiled.entries
    return bool(entry.check({"x": new}, {}))


@exercise("01", 2, "tensor_guard", points=1)
def check_tensor_guard(tensor_guard: Callable) -> None:
    """``tensor_guard(example) -> (new -> bool)``: may a trace on ``example`` serve ``new``?"""
    for name, example, new in _guard_cases():
        check = call(name, tensor_guard, example)
        expect(callable(check), name, "a function of the new tensor", type(check),
               "tensor_guard returns a function: lambda new: ...")  # fmt: skip
        got = call(name, check, new)
        expected = _toycomp_accepts(example, new)
        expect_equal(name, bool(got), expected,
                     "compare every property the trace depended on: shape, stride, dtype, "
                     "device and requires_grad (toycomp's guard function checks each)")


# -- 3. predicting graph counts ---------------------------------------------------------------
def _straight(x):
    return torch.relu(x) * 2 + 1


def _branch_on_size(x):
    if x.shape[0] > 2:
        return torch.sin(x)
    return torch.cos(x)


def _branch_on_value(x):
    if x.max() > 0:
        return torch.sin(x)
    return torch.cos(x)


def _item_then_more(x):
    scale = x.abs().sum().item()
    return torch.tanh(x) / scale


def _print_between(x):
    y = torch.sin(x)
    print("y computed")
    return y * 2


GRAPH_COUNT_FUNCTIONS = {
    "straight": _straight,
    "branch_on_size": _branch_on_size,
    "branch_on_value": _branch_on_value,
    "item_then_more": _item_then_more,
    "print_between": _print_between,
}


@exercise("01", 3, "graph_counts", points=1)
def check_graph_counts(predicted_graph_counts: Callable) -> None:
    """``predicted_graph_counts() -> {name: number of graphs}`` for GRAPH_COUNT_FUNCTIONS."""
    from toycomp.capture.convert_frame import explain as capture_explain

    predictions = call("predictions", predicted_graph_counts)
    expect(isinstance(predictions, dict) and set(predictions) == set(GRAPH_COUNT_FUNCTIONS),
           "predictions", f"a dict with keys {sorted(GRAPH_COUNT_FUNCTIONS)}",
           predictions, "return a dict: {function name: number of graphs}, one entry per "
           "function")  # fmt: skip
    x = _randn(6).abs() + 0.5  # positive: the value branch takes its first arm
    for name, fn in GRAPH_COUNT_FUNCTIONS.items():
        with contextlib.redirect_stdout(io.StringIO()):
            ours = capture_explain(fn, x)
        dynamo = _dynamo_graph_count(fn, x)
        expect(ours.graph_count == dynamo, name, f"toycomp {dynamo}", ours.graph_count,
               "toycomp and Dynamo disagree here: report it")  # fmt: skip
        expect_prediction(name, predictions[name], dynamo,
                          "a graph breaks where Python needs a tensor's data, or where it must run "
                          "Python code itself; Python values such as sizes are decided while "
                          "tracing")  # fmt: skip


# -- 4. removing a graph break ----------------------------------------------------------------
def _break_free_cases() -> list[tuple[str, torch.Tensor]]:
    return [("max above 1", _randn(8) * 3), ("max below 1", _randn(8) * 0.1),
            ("all negative", -(_randn(8).abs()) - 0.1), ("2-d", _randn(3, 5) * 2)]  # fmt: skip


@exercise("01", 4, "break_free", points=1)
def check_break_free(original: Callable, rewritten: Callable) -> None:
    """``rewritten`` computes what ``original`` does, in one graph (no graph break)."""
    from toycomp.capture.convert_frame import explain as capture_explain

    for name, x in _break_free_cases():
        expect_close(name, call(name, rewritten, x.clone()), original(x.clone()),
                     "the rewrite must compute the same values as the original")
    x = _break_free_cases()[0][1]
    with contextlib.redirect_stdout(io.StringIO()):
        ours = call("toycomp capture", capture_explain, rewritten, x)
    expect(ours.graph_break_count == 0 and ours.graph_count == 1, "toycomp capture",
           "1 graph, 0 graph breaks",
           f"{ours.graph_count} graph(s), breaks: {[r.split(' (')[0] for r in ours.break_reasons]}",
           "an if on a tensor's value needs that value in Python, which breaks the graph; "
           "compute every outcome as a tensor and let a tensor operation choose")  # fmt: skip
    dynamo = _dynamo_graph_count(rewritten, x)
    expect_equal("Dynamo", dynamo, 1, "Dynamo should also capture one graph")
