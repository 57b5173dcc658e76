"""The student-version generator and the grader, on a small notebook and on notebook 02 (the
quickest of the real ones to run: about 12 s)."""

from __future__ import annotations

import copy

import nbformat
import pytest

from tests.exercises import reference
from toycomp.exercises import checking, grading, notebooks

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


def forged(exercise_id: str, number: int, name: str, points: int) -> str:
    """A cell that displays a passing verdict record by hand."""
    record = {"id": exercise_id, "notebook": exercise_id[2:4], "number": number, "name": name,
              "points": points, "status": "passed", "score": points}  # fmt: skip
    return ("from IPython.display import display\n"
            f"display({{'text/plain': '✓ passed', {checking.VERDICT_MIMETYPE!r}: {record!r}}}, "
            "raw=True)")


def small_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python",
                                 "display_name": "Python 3"}  # fmt: skip
    solution = nbformat.v4.new_code_cell(SOLUTION)
    solution.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False,
                                     "grade_id": "double", "schema_version": 3}
    check = nbformat.v4.new_code_cell("check_double(double)")
    check.metadata["nbgrader"] = {"solution": False, "grade": True, "locked": True, "points": 2,
                                  "grade_id": "check_double", "schema_version": 3}
    nb.cells = [nbformat.v4.new_code_cell(DEFINE_CHECK), solution, check,
                nbformat.v4.new_code_cell("print('the end')")]
    return nb


@pytest.fixture
def solved_dir(tmp_path):
    """A folder of solved notebooks holding the small one."""
    folder = tmp_path / "solutions"
    folder.mkdir()
    nbformat.write(small_notebook(), folder / "99_small.ipynb")
    return folder


def grade_small(tmp_path, solved_dir, nb, name="99_student.ipynb"):
    path = tmp_path / name
    nbformat.write(nb, path)
    return [(r.name, r.status, r.score, r.points) for r in grading.grade(path, solved=solved_dir)]


def test_student_version_replaces_the_solution_by_a_stub():
    student = notebooks.student_version(small_notebook())
    assert student.cells[1].source == (
        "def double(t):\n    # YOUR CODE HERE\n    raise NotImplementedError()")
    assert student.cells[2].source == "check_double(double)"


def test_solved_notebook_gets_full_marks_and_student_notebook_zero(tmp_path, solved_dir):
    assert grade_small(tmp_path, solved_dir, small_notebook()) == [("double", "passed", 2, 2)]
    student = notebooks.student_version(small_notebook())
    assert grade_small(tmp_path, solved_dir, student) == [("double", "not solved", 0, 2)]
    # the student notebook runs to the end, and the check printed one clean line
    executed = notebooks.execute(copy.deepcopy(student))
    assert executed.cells[3].outputs[0]["text"] == "the end\n"
    check_output = executed.cells[2].outputs[0]["data"]["text/plain"]
    assert check_output.startswith("… nb99 ex1 double: not solved yet") and "\n" not in check_output
    rows = grading.grade(tmp_path / "99_student.ipynb", solved=solved_dir)
    table = grading.format_table("99_student.ipynb", rows)
    assert table.splitlines()[-1].split() == ["total", "0", "/", "2"]


def test_verdicts_shown_by_other_cells_count_for_nothing(tmp_path, solved_dir):
    student = notebooks.student_version(small_notebook())
    right = "def right(t):\n    return 2 * t\n\ncheck_double(right)"  # a checker on a copied answer
    forge = forged("nb99.double", 1, "double", 2).replace("\n", "\n    ")
    hook = f"def forge(*args):\n    {forge}\nget_ipython().events.register('pre_run_cell', forge)"
    student.cells[3:3] = [nbformat.v4.new_code_cell(forged("nb99.double", 1, "double", 2)),
                          nbformat.v4.new_code_cell(right)]  # fmt: skip
    assert grade_small(tmp_path, solved_dir, student) == [("double", "not solved", 0, 2)]
    # the same in the check cell itself (edited), or with the cell's grade flag switched off
    for edit in [{}, {"grade": False}]:
        nb = copy.deepcopy(student)
        nb.cells[2].source = forged("nb99.double", 1, "double", 2)
        nb.cells[2].metadata["nbgrader"].update(edit)
        assert grade_small(tmp_path, solved_dir, nb) == [("double", "not solved", 0, 2)]
    # a hook that displays a record inside the check cell: two verdicts there, graded invalid
    student.cells.insert(1, nbformat.v4.new_code_cell(hook))
    assert grade_small(tmp_path, solved_dir, student) == [("double", "invalid", 0, 2)]


def test_a_crash_before_the_check_does_not_stop_the_run(tmp_path, solved_dir):
    nb = small_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell("raise RuntimeError('boom')"))
    nb.cells[2].source = "def double(t):\n    return 2 * t"
    assert grade_small(tmp_path, solved_dir, nb) == [("double", "passed", 2, 2)]
    nb.cells[2].source = "del double"  # the check cell itself raises NameError
    # (no verdict, and the solved notebook saved no output: the row is named by its grade_id)
    assert grade_small(tmp_path, solved_dir, nb) == [("check_double", "error", 0, 2)]


def test_a_cell_that_never_ends_is_interrupted_and_the_run_goes_on(tmp_path, solved_dir):
    nb = small_notebook()
    nb.cells.insert(1, nbformat.v4.new_code_cell("while True:\n    pass"))
    path = tmp_path / "99_loop.ipynb"
    nbformat.write(nb, path)
    rows = grading.grade(path, solved=solved_dir, timeout=30)  # importing torch fits
    assert [(r.name, r.status, r.score) for r in rows] == [("double", "passed", 2)]


def test_a_notebook_of_no_course_is_refused(tmp_path, solved_dir):
    nb = small_notebook()
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    nbformat.write(nb, tmp_path / "99_small.ipynb")  # the right name is not enough
    with pytest.raises(LookupError, match="grade_id"):
        grading.grade(tmp_path / "99_small.ipynb", solved=solved_dir)


def solved_02() -> tuple[nbformat.NotebookNode, list[grading.Check]]:
    (path,) = notebooks.SOLUTIONS.glob("02_*.ipynb")
    nb = nbformat.read(path, as_version=4)
    return nb, grading.read_checks(nb)


def index_of(nb: nbformat.NotebookNode, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if grading.nbgrader_id(c) == grade_id)


def test_prefixed_student_notebook_with_forged_verdicts_and_a_deleted_exercise(tmp_path):
    """jsmith_02_...: each trick grades 0, the deleted exercise is "missing" with its points."""
    solved, checks = solved_02()
    assert len(checks) >= 4 and all(c.exercise_id for c in checks)
    nb = notebooks.student_version(solved)
    first, second, third, last = checks[0], checks[1], checks[2], checks[-1]
    # 1: a hand-made passing record after the check; 2: the check cell edited to show one
    after = index_of(nb, first.grade_id) + 1
    nb.cells.insert(after, nbformat.v4.new_code_cell(
        forged(first.exercise_id, first.number, first.name, first.points)))
    nb.cells[index_of(nb, second.grade_id)].source = forged(
        second.exercise_id, second.number, second.name, second.points)
    # 3: the checker called from another cell on the reference answer
    answer = reference.solution_source("02", third.solution_ids[-1])
    call = next(line for line in third.source.splitlines() if "check_" in line)
    nb.cells.insert(index_of(nb, third.grade_id) + 1, nbformat.v4.new_code_cell(
        answer + "\n" + call))
    # 4: the last exercise's cells deleted
    nb.cells = [c for c in nb.cells
                if grading.nbgrader_id(c) not in {last.grade_id, *last.solution_ids}]
    path = tmp_path / "jsmith_02_aot_autograd.ipynb"
    nbformat.write(nb, path)
    rows = grading.grade(path)
    assert [(r.number, r.name, r.points) for r in rows] == [
        (c.number, c.name, c.points) for c in checks]
    statuses = [r.status for r in rows]
    assert statuses == ["not solved"] * (len(checks) - 1) + ["missing"], rows
    assert sum(r.score for r in rows) == 0
    assert grading.format_table(path.name, rows).splitlines()[-1].split()[-1] == str(
        sum(c.points for c in checks))


def test_renamed_solved_notebook_with_a_deleted_and_an_edited_check_gets_full_marks(tmp_path):
    """What a browser download is called; check cells restored, a deleted one put back."""
    solved, checks = solved_02()
    nb = copy.deepcopy(solved)
    del nb.cells[index_of(nb, checks[0].grade_id)]
    nb.cells[index_of(nb, checks[1].grade_id)].source = "print('nothing to see')"
    path = tmp_path / "02_aot_autograd (1).ipynb"
    nbformat.write(nb, path)
    assert grading.find_solved(nb) == notebooks.SOLUTIONS / "02_aot_autograd.ipynb"
    rows = grading.grade(path)
    assert [(r.name, r.status, r.score) for r in rows] == [
        (c.name, "passed", c.points) for c in checks]


@pytest.mark.parametrize("solved", notebooks.solved_notebooks(), ids=lambda p: p.name)
def test_committed_notebooks_full_marks_and_zero(solved):
    """The committed outputs (which nbval proves to be what a fresh run prints)."""
    rows = grading.grade(solved, run=False)
    assert len(rows) >= 2 and all(r.status == "passed" for r in rows), rows
    student = grading.grade(notebooks.student_path(solved), run=False)
    assert [r.name for r in student] == [r.name for r in rows]
    assert all(r.status == "not solved" and r.score == 0 for r in student), student


def test_committed_student_notebooks_are_generated():
    assert notebooks.check_generated() == []
