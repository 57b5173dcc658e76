"""Grading: a student's notebook -> a score table of its exercises.

Input -> output: a notebook (whatever its file name) -> one row per exercise of its solved
source (status, points). The grader

1. finds the solved notebook it comes from by its exercise metadata: the nbgrader ``grade_id``
   of its cells, never its file name (``02_aot_autograd (1).ipynb`` or
   ``jsmith_02_aot_autograd.ipynb`` grade as ``02_aot_autograd.ipynb`` does);
2. restores every check cell (nbgrader ``grade: true``) from the solved source, matched by
   ``grade_id``: an edited check cell gets the original source back, and a deleted one is put back
   after its exercise's solution cell;
3. runs the notebook in a fresh kernel (errors do not stop the run);
4. reads the verdict of each exercise ONLY from the outputs of its restored check cell. A verdict
   displayed by any other cell (a hand-made record, a checker called on a copied right answer)
   counts for nothing, and a check cell must show exactly one verdict, of its own exercise.

An exercise whose cells were all deleted is "missing", one whose check showed no verdict is
"not run" (or "error" when the check cell raised); all of them keep their points in the total::

    $ python -m toycomp.exercises grade "jsmith_02_aot_autograd.ipynb"
    jsmith_02_aot_autograd.ipynb (solved source: 02_aot_autograd.ipynb)
       ex  exercise                 status       points
        1  tanh_joint               passed        1 / 1
        2  naive_partition          not solved    0 / 2
        ...
           total                                  1 / 6

``run=False`` reads the outputs the notebook was saved with instead (of the check cells whose
source is the solved one): quick, but it trusts the saved file.

NB: nbgrader's ``autograde`` does the same with its gradebook (it also restores locked cells from
the source assignment); this needs no course directory.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import nbformat

from toycomp.exercises import checking
from toycomp.exercises.notebooks import SOLUTIONS, TIMEOUT, execute

# [Note: what grading trusts]
# The check cells run in the same kernel as the student's code. A record displayed by an IPython
# event hook lands in the check cell's outputs beside the real verdict: `judge` grades a cell with
# two verdicts "invalid". A student who monkeypatches the checker modules could still forge one;
# that needs deliberate code, which shows in the notebook's source (read it when a grade looks too
# good). What needs no such effort no longer works: a verdict displayed by another cell, an edited
# or deleted check cell, a renamed notebook, deleted exercise cells (graded "missing").


@dataclasses.dataclass
class Row:
    number: int
    name: str
    status: str
    score: int
    points: int


@dataclasses.dataclass(frozen=True)
class Check:
    """One graded exercise of a solved notebook: its check cell and what it grades."""

    grade_id: str  # the check cell's nbgrader id
    source: str  # its source in the solved notebook
    points: int
    solution_ids: tuple[str, ...]  # the solution cells since the previous check cell
    number: int
    name: str
    exercise_id: str | None  # "nb02.tanh_joint", from the solved notebook's saved verdict


def nbgrader_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def verdict_records(cell: nbformat.NotebookNode) -> list[dict]:
    """The verdict records a cell's outputs display, in order."""
    return [out["data"][checking.VERDICT_MIMETYPE] for out in cell.get("outputs", [])
            if checking.VERDICT_MIMETYPE in out.get("data", {})]  # fmt: skip


def read_checks(solved: nbformat.NotebookNode) -> list[Check]:
    """The graded exercises of a solved notebook, in order."""
    checks, solutions = [], []
    for cell in solved.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id"):
            solutions.append(meta["grade_id"])
        if not meta.get("grade"):
            continue
        # The solved notebook is committed executed: its check shows which exercise it grades.
        record = next(iter(verdict_records(cell)), None) or {}
        checks.append(Check(meta["grade_id"], cell.source, int(meta.get("points", 0)),
                            tuple(solutions), record.get("number", len(checks) + 1),
                            record.get("name", meta["grade_id"]), record.get("id")))  # fmt: skip
        solutions = []
    return checks


def find_solved(nb: nbformat.NotebookNode, solutions: Path = SOLUTIONS) -> Path:
    """The solved notebook in ``solutions`` that shares the most exercise ids with ``nb``."""
    ids = {nbgrader_id(c) for c in nb.cells} - {None}
    if not solutions.exists():
        raise LookupError(f"grading needs the solved notebooks ({solutions} is missing; the "
                          f"student release has none)")  # fmt: skip
    candidates = sorted(solutions.glob("*.ipynb")) if solutions.is_dir() else [solutions]
    shared = {}
    for path in candidates:
        theirs = {nbgrader_id(c) for c in nbformat.read(path, as_version=4).cells} - {None}
        if ids & theirs:
            shared[path] = len(ids & theirs)
    if not shared:
        raise LookupError(f"no solved notebook in {solutions} shares an exercise id (nbgrader "
                          f"grade_id) with this notebook: is it one of the course's?")  # fmt: skip
    best = max(shared.values())
    (path, *others) = [p for p, n in shared.items() if n == best]
    if others:
        names = ", ".join(p.name for p in [path, *others])
        raise LookupError(f"this notebook matches several solved notebooks equally: {names}")
    return path


def restore_check_cells(nb: nbformat.NotebookNode, checks: list[Check]) -> list[str]:
    """Give every check cell the solved notebook's source, put back the deleted ones after their
    exercise's solution cell; returns the grade_ids of the exercises that are missing."""
    missing = []
    for check in checks:
        cell = nbformat.v4.new_code_cell(check.source)
        meta = {"grade": True, "solution": False, "locked": True, "points": check.points}
        cell.metadata["nbgrader"] = {"grade_id": check.grade_id, **meta}
        places = [i for i, c in enumerate(nb.cells) if nbgrader_id(c) == check.grade_id]
        for i in places:  # whatever the student made of it (even a markdown cell)
            nb.cells[i] = copy.deepcopy(cell)
        if places:
            continue
        solutions = [i for i, c in enumerate(nb.cells) if nbgrader_id(c) in check.solution_ids]
        if solutions:
            nb.cells.insert(solutions[-1] + 1, cell)
        else:
            missing.append(check.grade_id)
    return missing


def judge(check: Check, cells: list[nbformat.NotebookNode]) -> tuple[str, dict]:
    """The status of one exercise from the outputs of its check cell(s), and its record."""
    status, record = "not run", {}
    for cell in cells:  # a duplicated check cell: the last one counts
        records = verdict_records(cell)
        if not records:
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            status = "error" if errors else status
            continue
        record = records[0]
        ok = len(records) == 1 and check.exercise_id in (None, record.get("id"))
        status = record.get("status", "invalid") if ok else "invalid"
    return status, record


def grade(path: str | Path, run: bool = True, solved: str | Path = SOLUTIONS,
          timeout: int = TIMEOUT) -> list[Row]:  # fmt: skip
    """The score table of one notebook, executed first unless ``run`` is False. ``solved`` is the
    folder of solved notebooks to match it against (or one solved notebook); a cell that runs
    past ``timeout`` seconds is interrupted, and the run goes on."""
    nb = nbformat.read(Path(path), as_version=4)
    source = find_solved(nb, Path(solved))
    checks = read_checks(nbformat.read(source, as_version=4))
    if run:
        missing = restore_check_cells(nb, checks)
        nb = execute(nb, allow_errors=True, timeout=timeout)
    else:  # the saved outputs, of the check cells that still have the solved source only
        sources = {c.grade_id: c.source for c in checks}
        for cell in nb.cells:
            if nbgrader_id(cell) in sources and cell.source != sources[nbgrader_id(cell)]:
                cell.outputs = []
        present = {nbgrader_id(c) for c in nb.cells}
        missing = [c.grade_id for c in checks if c.grade_id not in present]
    rows = []
    for check in checks:
        status, record = "missing", {}
        if check.grade_id not in missing:
            status, record = judge(check, [c for c in nb.cells if nbgrader_id(c) == check.grade_id])
        number, name = check.number, check.name
        if check.exercise_id is None:  # a solved notebook saved without outputs
            number, name = record.get("number", number), record.get("name", name)
        score = check.points if status == "passed" else 0
        rows.append(Row(number, name, status, score, check.points))
    return rows


def format_table(title: str, rows: list[Row]) -> str:
    lines = [title, f"  {'ex':>3}  {'exercise':24} {'status':12} {'points':>8}"]
    for r in rows:
        lines.append(f"  {r.number:>3}  {r.name:24} {r.status:12} {r.score:>3} / {r.points}")
    total, points = sum(r.score for r in rows), sum(r.points for r in rows)
    lines.append(f"  {'':>3}  {'total':24} {'':12} {total:>3} / {points}")
    return "\n".join(lines)
