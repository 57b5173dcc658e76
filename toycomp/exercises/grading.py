"""Grading: a notebook -> a score table of its exercises.

Input -> output: a student's (or the solved) notebook -> one row per exercise (status, points).
By default the notebook is executed in a fresh kernel first, with its check cells restored from
the solved notebook (so an edited check cell does not change the grade); ``execute=False`` reads
the outputs it was saved with. Every check shows its verdict with a JSON record
(``checking.VERDICT_MIMETYPE``), and that record is what is counted; an exercise whose check
never ran (a cell before it crashed) scores 0::

    $ python -m toycomp.exercises grade notebooks/02_aot_autograd.ipynb
    02_aot_autograd.ipynb
      ex  exercise                 status        points
       1  tanh_joint               passed         1 / 1
       2  naive_partition          not solved     0 / 2
      ...
          total                                   1 / 6

NB: nbgrader's ``autograde`` does the same with its gradebook; this needs no course directory.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import nbformat

from toycomp.exercises import checking
from toycomp.exercises.notebooks import SOLUTIONS, execute


@dataclasses.dataclass
class Row:
    number: int
    name: str
    status: str
    score: int
    points: int


def restore_check_cells(nb: nbformat.NotebookNode, solved: Path) -> int:
    """Give the check cells (nbgrader ``grade``) the solved notebook's source; returns how many
    were restored."""
    if not solved.exists():
        return 0
    reference = {c.metadata["nbgrader"]["grade_id"]: c.source
                 for c in nbformat.read(solved, as_version=4).cells
                 if c.metadata.get("nbgrader", {}).get("grade")}  # fmt: skip
    restored = 0
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in reference and cell.metadata["nbgrader"].get("grade"):
            cell.source, restored = reference[grade_id], restored + 1
    return restored


def verdict_records(nb: nbformat.NotebookNode) -> list[dict]:
    """The verdict records in a notebook's outputs, in order."""
    return [out["data"][checking.VERDICT_MIMETYPE] for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if checking.VERDICT_MIMETYPE in out.get("data", {})]


def expected_exercises(path: Path) -> list[checking.Exercise]:
    """The exercises of notebook ``0N_*.ipynb``: those its checker module nb0N declares."""
    number = path.name[:2]
    try:
        importlib.import_module(f"toycomp.exercises.nb{number}")
    except ModuleNotFoundError:
        return []
    return [ex for ex in checking.EXERCISES.values() if ex.notebook == number]


def grade(path: str | Path, run: bool = True) -> list[Row]:
    """The score table of one notebook (executed first unless ``run`` is False)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if run:
        restore_check_cells(nb, SOLUTIONS / path.name)
        nb = execute(nb, allow_errors=True)
    rows = {ex.id: Row(ex.number, ex.name, "not run", 0, ex.points)
            for ex in expected_exercises(path)}  # fmt: skip
    for record in verdict_records(nb):  # the last verdict of an exercise counts
        rows[record["id"]] = Row(record["number"], record["name"], record["status"],
                                 record["score"], record["points"])  # fmt: skip
    return sorted(rows.values(), key=lambda r: r.number)


def format_table(title: str, rows: list[Row]) -> str:
    lines = [title, f"  {'ex':>3}  {'exercise':24} {'status':12} {'points':>8}"]
    for r in rows:
        lines.append(f"  {r.number:>3}  {r.name:24} {r.status:12} {r.score:>3} / {r.points}")
    total, points = sum(r.score for r in rows), sum(r.points for r in rows)
    lines.append(f"  {'':>3}  {'total':24} {'':12} {total:>3} / {points}")
    return "\n".join(lines)
