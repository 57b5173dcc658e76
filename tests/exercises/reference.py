"""The reference answers, read from the solved notebooks (never copied into the tests).

The checker tests take each exercise's solution from its solution cell in
``notebooks/solutions/0N_*.ipynb`` (nbgrader metadata ``solution: true``, ``grade_id``), so the
student release, which has no solved notebooks, holds no answer::

    tanh_joint = reference.solution("02", "tanh_joint", aten=torch.ops.aten)
"""

from __future__ import annotations

from pathlib import Path

import nbformat

SOLUTIONS = Path(__file__).resolve().parents[2] / "notebooks" / "solutions"


def solution_source(notebook: str, grade_id: str) -> str:
    """The source of the solution cell ``grade_id`` of solved notebook ``notebook`` ("02")."""
    (path,) = SOLUTIONS.glob(f"{notebook}_*.ipynb")
    for cell in nbformat.read(path, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id") == grade_id:
            return cell.source
    raise KeyError(f"{path.name} has no solution cell {grade_id!r}")


def solution_namespace(notebook: str, grade_id: str, **globals_) -> dict:
    """Runs the solution cell with ``globals_`` (the names it reads from earlier cells) and
    returns the names it defines."""
    namespace = dict(globals_)
    source = solution_source(notebook, grade_id)
    exec(compile(source, f"<{notebook} solution {grade_id}>", "exec"), namespace)
    return namespace


def solution(notebook: str, grade_id: str, name: str | None = None, **globals_):
    """The object the solution cell defines under ``name`` (default: ``grade_id``)."""
    return solution_namespace(notebook, grade_id, **globals_)[name or grade_id]
