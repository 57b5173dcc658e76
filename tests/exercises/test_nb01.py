"""Notebook 01's checkers accept the reference solutions and reject plausible wrong ones."""

from __future__ import annotations

import operator

import torch

from toycomp.capture.captured_graph import capture_graph
from toycomp.exercises import nb01


# -- 1. the UNARY_NEGATIVE handler: traced here by toycomp's own capture -----------------------
def trace_bytecode(fn, *inputs):
    return capture_graph(fn, *inputs).gm


def trace_dropping_negation(fn, *inputs):  # a handler that pushed its operand back unchanged
    gm = capture_graph(fn, *inputs).gm
    for node in list(gm.graph.nodes):
        if node.target is operator.neg:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def test_unary_negative_accepts_a_correct_interpreter():
    assert nb01.check_unary_negative(trace_bytecode).passed


def test_unary_negative_rejects_a_dropped_negation():
    verdict = nb01.check_unary_negative(trace_dropping_negation)
    assert verdict.status == "failed" and "operator.neg" in verdict.text


def test_unary_negative_reports_a_stub_as_not_solved():
    def stub(fn, *inputs):
        raise NotImplementedError

    assert nb01.check_unary_negative(stub).status == "not solved"


# -- 2. a guard for the naive tracer -----------------------------------------------------------
def tensor_guard(example):
    def metadata(t):
        return t.shape, t.stride(), t.dtype, t.device, t.requires_grad

    return lambda new: type(new) is torch.Tensor and metadata(new) == metadata(example)


def shape_and_dtype_guard(example):  # forgets strides and requires_grad
    return lambda new: new.shape == example.shape and new.dtype == example.dtype


def test_tensor_guard_accepts_the_reference():
    verdict = nb01.check_tensor_guard(tensor_guard)
    assert verdict.passed and verdict.cases == 7


def test_tensor_guard_rejects_a_guard_without_requires_grad_and_strides():
    verdict = nb01.check_tensor_guard(shape_and_dtype_guard)
    assert verdict.status == "failed" and "requires_grad" in verdict.text


# -- 3. predicting graph counts ----------------------------------------------------------------
RIGHT = {"straight": 1, "branch_on_size": 1, "branch_on_value": 2, "item_then_more": 2,
         "print_between": 2}  # fmt: skip


def test_graph_counts_accepts_the_right_predictions():
    assert nb01.check_graph_counts(lambda: dict(RIGHT)).passed


def test_graph_counts_rejects_a_break_on_a_python_int():
    verdict = nb01.check_graph_counts(lambda: {**RIGHT, "branch_on_size": 2})
    assert verdict.status == "failed" and "'branch_on_size'" in verdict.text


# -- 4. removing a graph break -----------------------------------------------------------------
def clip_by_max(x):
    m = x.max()
    if m > 1:
        return x / m
    return x


def clip_by_max_break_free(x):
    m = x.max()
    return torch.where(m > 1, x / m, x)


def test_break_free_accepts_torch_where():
    assert nb01.check_break_free(clip_by_max, clip_by_max_break_free).passed


def test_break_free_rejects_clamp_and_the_original():
    verdict = nb01.check_break_free(clip_by_max, lambda x: torch.clamp(x, max=1))
    assert verdict.status == "failed" and "same values" in verdict.text
    verdict = nb01.check_break_free(clip_by_max, clip_by_max)
    assert verdict.status == "failed" and "torch.where" in verdict.text


def test_graph_count_functions_are_what_the_notebook_prints():
    assert set(nb01.GRAPH_COUNT_FUNCTIONS) == set(RIGHT)
    assert all(isinstance(fn, type(clip_by_max)) for fn in nb01.GRAPH_COUNT_FUNCTIONS.values())
