"""The student-version generator and the grader, on a small notebook and on the real ones."""

from __future__ import annotations

import nbformat
import pytest

from toycomp.exercises import grading, notebooks

DEFINE_CHECK = '''import torch
from toycomp.exercises.checking import call, exercise, expect_close


@exercise("99", 1, "double", points=2)
def check_double(double):
    t = torch.arange(3.0)
    expect_close("arange", call("arange", double, t), 2 * t)'''

SOLUTION = '''def double(t):
    ### BEGIN SOLUTION
    return 2 * t
    ### END SOLUTION'''


def small_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    solution = nbformat.v4.new_code_cell(SOLUTION)
    solution.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False,
                                     "grade_id": "double", "schema_version": 3}
    check = nbformat.v4.new_code_cell("check_double(double)")
    check.metadata["nbgrader"] = {"solution": False, "grade": True, "locked": True, "points": 2,
                                  "grade_id": "check_double", "schema_version": 3}
    nb.cells = [nbformat.v4.new_code_cell(DEFINE_CHECK), solution, check,
                nbformat.v4.new_code_cell("print('the end')")]
    return nb


def test_student_version_replaces_the_solution_by_a_stub():
    student = notebooks.student_version(small_notebook())
    assert student.cells[1].source == (
        "def double(t):\n    # YOUR CODE HERE\n    raise NotImplementedError()")
    assert student.cells[2].source == "check_double(double)"


def test_solved_notebook_gets_full_marks_and_student_notebook_zero(tmp_path):
    solved = tmp_path / "99_small.ipynb"
    nbformat.write(small_notebook(), solved)
    rows = grading.grade(solved)
    assert [(r.name, r.status, r.score, r.points) for r in rows] == [("double", "passed", 2, 2)]

    student = tmp_path / "99_student.ipynb"
    nbformat.write(notebooks.student_version(small_notebook()), student)
    (row,) = grading.grade(student)
    assert (row.status, row.score) == ("not solved", 0)
    # the student notebook runs to the end, and the check printed one clean line
    executed = notebooks.execute(nbformat.read(student, as_version=4))
    assert executed.cells[3].outputs[0]["text"] == "the end\n"
    check_output = executed.cells[2].outputs[0]["data"]["text/plain"]
    assert check_output.startswith("… nb99 ex1 double: not solved yet") and "\n" not in check_output
    table = grading.format_table("99_student.ipynb", [row])
    assert table.splitlines()[-1].split() == ["total", "0", "/", "2"]


def test_a_crash_before_the_check_scores_zero(tmp_path):
    nb = small_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell("raise RuntimeError('boom')"))
    nb.cells[2].source = "def double(t):\n    return 2 * t"
    nb.cells.insert(0, nbformat.v4.new_code_cell("check_double = None  # defined later"))
    path = tmp_path / "99_crash.ipynb"
    nbformat.write(nb, path)
    (row,) = grading.grade(path)
    assert (row.status, row.score) == ("passed", 2)  # the crash does not stop the run
    nb.cells[3].source = "del double"
    nbformat.write(nb, path)
    assert grading.grade(path) == []  # no verdict at all: nothing recorded for nb99


@pytest.mark.parametrize("solved", notebooks.solved_notebooks(), ids=lambda p: p.name)
def test_committed_notebooks_full_marks_and_zero(solved):
    """The committed outputs (which nbval proves to be what a fresh run prints)."""
    rows = grading.grade(solved, run=False)
    assert len(rows) >= 4 and all(r.status == "passed" for r in rows), rows
    student = grading.grade(notebooks.student_path(solved), run=False)
    assert [r.name for r in student] == [r.name for r in rows]
    assert all(r.status == "not solved" and r.score == 0 for r in student), student


def test_committed_student_notebooks_are_generated():
    assert notebooks.check_generated() == []
