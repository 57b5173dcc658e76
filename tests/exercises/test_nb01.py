"""Notebook 01's checkers accept the reference solutions and reject plausible wrong ones.

The reference answers come from the solved notebook (tests/exercises/reference.py); the wrong
answers are written here.
"""

from __future__ import annotations

import dis
import inspect
import operator
import re
import sys

import nbformat
import pytest
import torch

from tests.exercises import reference
from tests.exercises.test_nb01_pythons import interpreter_cells
from toycomp.exercises import checking, nb01


@pytest.fixture(autouse=True)
def fresh_tries():
    """Each test starts with no earlier try of a prediction exercise in this process."""
    checking.TRIES.clear()


# -- 1. the UNARY_NEGATIVE handler, in the notebook's own interpreter ---------------------------
@pytest.fixture(scope="module")
def interpreter() -> dict:
    """The notebook's interpreter cells, run with real torch, and exercise 1's reference."""
    ns = {"dis": dis, "operator": operator, "sys": sys, "torch": torch}
    for cell in interpreter_cells():
        exec(compile(cell, "<notebook 01 interpreter>", "exec"), ns)
    return reference.solution_namespace("01", "nb01_ex1_unary_negative", **ns)


def check_with_handler(interpreter, handler):
    interpreter["HANDLERS"]["UNARY_NEGATIVE"] = handler
    return nb01.check_unary_negative(interpreter["trace_bytecode"])


def test_unary_negative_accepts_the_reference(interpreter):
    assert check_with_handler(interpreter, interpreter["unary_negative"]).passed


def test_unary_negative_rejects_a_dropped_negation(interpreter):
    verdict = check_with_handler(interpreter, lambda frame, inst: None)
    assert verdict.status == "failed" and "operator.neg" in verdict.text


def test_unary_negative_rejects_a_negation_computed_while_tracing(interpreter):
    def negate_now(frame, inst):  # calls the function instead of recording a node
        frame.stack.append(operator.neg(frame.stack.pop().meta["val"]))

    assert check_with_handler(interpreter, negate_now).status in ("failed", "error")


def test_unary_negative_reports_a_stub_as_not_solved(interpreter):
    def stub(frame, inst):
        raise NotImplementedError()

    assert check_with_handler(interpreter, stub).status == "not solved"


# -- 2. a guard for the naive tracer -----------------------------------------------------------
def shape_and_dtype_guard(example):  # forgets strides and requires_grad
    return lambda new: new.shape == example.shape and new.dtype == example.dtype


def test_tensor_guard_accepts_the_reference():
    tensor_guard = reference.solution("01", "nb01_ex2_tensor_guard", "tensor_guard", torch=torch)
    verdict = nb01.check_tensor_guard(tensor_guard)
    assert verdict.passed and verdict.cases == 7


def test_tensor_guard_rejects_a_guard_without_requires_grad_and_strides():
    verdict = nb01.check_tensor_guard(shape_and_dtype_guard)
    assert verdict.status == "failed" and "requires_grad" in verdict.text


# -- 3. predicting graph counts ----------------------------------------------------------------
def predicted():
    return reference.solution("01", "nb01_ex3_graph_counts", "predicted_graph_counts")()


def test_graph_counts_accepts_the_reference():
    assert nb01.check_graph_counts(predicted).passed


def test_graph_counts_rejects_a_break_on_a_python_int_without_giving_the_answer():
    wrong = {**predicted(), "branch_on_size": 2}
    verdict = nb01.check_graph_counts(lambda: wrong)
    assert verdict.status == "failed" and "'branch_on_size'" in verdict.text
    assert "expected: (shown after a correct answer" in verdict.text


def test_graph_counts_says_to_return_a_dict():
    verdict = nb01.check_graph_counts(lambda: [1, 1, 2, 2, 2])
    assert verdict.status == "failed" and "return a dict" in verdict.text


def test_printed_sources_carry_no_answers():
    for fn in nb01.GRAPH_COUNT_FUNCTIONS.values():
        assert "#" not in inspect.getsource(fn), fn.__name__


# -- 4. removing a graph break -----------------------------------------------------------------
def clip_by_max(x):  # the notebook's original, with its graph break
    m = x.max()
    if m > 1:
        return x / m
    return x


def test_break_free_accepts_the_reference():
    rewritten = reference.solution("01", "nb01_ex4_break_free", "clip_by_max_break_free",
                                   torch=torch)  # fmt: skip
    assert nb01.check_break_free(clip_by_max, rewritten).passed


def test_break_free_rejects_clamp_and_the_original_with_a_hint_that_is_not_the_answer():
    verdict = nb01.check_break_free(clip_by_max, lambda x: torch.clamp(x, max=1))
    assert verdict.status == "failed" and "same values" in verdict.text
    verdict = nb01.check_break_free(clip_by_max, clip_by_max)
    assert verdict.status == "failed" and "tensor operation" in verdict.text
    assert "where" not in verdict.text and "clamp" not in verdict.text


# -- the notebook's statements about its own code ------------------------------------------------
def test_headings_count_the_lines_of_their_code():
    """'A naive tracer in N lines' and 'A stack interpreter in N lines' count the non-blank
    lines of the cells tagged naive-tracer and bytecode-interpreter (within 5 lines)."""
    (path,) = reference.SOLUTIONS.glob("01_*.ipynb")
    cells = nbformat.read(path, as_version=4).cells
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    for heading, tag in [("A naive tracer", "naive-tracer"),
                         ("A stack interpreter", "bytecode-interpreter")]:  # fmt: skip
        stated = int(re.search(rf"## {heading} in (\d+) lines", text).group(1))
        code = "\n".join(c.source for c in cells if tag in c.metadata.get("tags", []))
        lines = sum(1 for line in code.splitlines() if line.strip())
        assert stated - 5 <= lines <= stated, (heading, stated, lines)
