"""Solved notebooks -> student notebooks: nbgrader's ``ClearSolutions``, then a fresh run.

Input -> output: ``notebooks/solutions/0N_*.ipynb`` (the source of truth: every solution between
``### BEGIN SOLUTION`` / ``### END SOLUTION``, in cells that carry nbgrader's metadata) ->
``notebooks/0N_*.ipynb``, where each solution became ``raise NotImplementedError()``. The student
notebook is then executed top to bottom, so that it is committed with its outputs (every check
prints "not solved yet") and nbval can check it like any other notebook::

    solution cell                                   student cell
    def size_of(node):                              def size_of(node):
        ### BEGIN SOLUTION                              # YOUR CODE HERE
        val = node.meta["val"]              ->          raise NotImplementedError()
        ...
        ### END SOLUTION

``check_generated`` is what CI runs: it regenerates the student notebooks' *sources* (no
execution) and fails when a committed student notebook differs, so that nobody edits a student
notebook by hand or forgets to regenerate it; nbval then checks both versions' outputs.

The cell metadata is nbgrader's (``{"nbgrader": {"solution": true, "grade_id": ...}}`` on
exercise cells, ``"grade": true, "points": N, "locked": true`` on check cells), so a course that
runs nbgrader itself (``nbgrader generate_assignment``, formgrader) can use these notebooks too.

NB: nbgrader's own ``generate_assignment`` needs a course directory and a gradebook database;
toycomp uses only its ``ClearSolutions`` preprocessor (nbgrader/preprocessors/clearsolutions.py).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
TIMEOUT = 300  # seconds per cell


def solved_notebooks() -> list[Path]:
    """The solved notebooks, ``notebooks/solutions/0*.ipynb``, in order."""
    return sorted(SOLUTIONS.glob("0*.ipynb"))


def student_path(solved: Path) -> Path:
    return NOTEBOOKS / solved.name


def student_version(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student notebook of a solved one: solutions cleared, outputs removed (not run)."""
    from nbgrader.preprocessors import ClearSolutions

    nb = copy.deepcopy(nb)
    nb, _ = ClearSolutions(enforce_metadata=True).preprocess(nb, {})
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def execute(nb: nbformat.NotebookNode, allow_errors: bool = False,
            timeout: int = TIMEOUT) -> nbformat.NotebookNode:  # fmt: skip
    """Run every cell in a fresh kernel started from ``notebooks/``, as nbval and JupyterLab
    do (``PYTHONHASHSEED=0``, as ``./dev.sh`` sets it). With ``allow_errors``, a cell that raises
    or runs past ``timeout`` seconds (interrupted) does not stop the run."""
    from nbclient import NotebookClient

    os.environ["PYTHONHASHSEED"] = "0"  # inherited by the kernel
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            interrupt_on_timeout=allow_errors,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})  # fmt: skip
    client.execute()
    return nb


def generate(names: list[str] | None = None, run: bool = True) -> list[Path]:
    """Write the student notebook of each solved notebook (all, or those whose file name
    starts with one of ``names``: "02"), executed unless ``run`` is False."""
    written = []
    for solved in solved_notebooks():
        if names and not any(solved.name.startswith(n) for n in names):
            continue
        nb = student_version(nbformat.read(solved, as_version=4))
        if run:
            print(f"executing the student version of {solved.name} ...", flush=True)
            nb = execute(nb)
        out = student_path(solved)
        nbformat.write(nb, out)
        written.append(out)
    return written


def _sources(nb: nbformat.NotebookNode) -> list[tuple[str, str, dict]]:
    return [(c.cell_type, c.source, dict(c.metadata.get("nbgrader", {}))) for c in nb.cells]


def check_generated() -> list[str]:
    """Problems with the committed student notebooks: missing, or cells that differ from what
    ``generate`` makes of the solved notebook. Empty when all is well."""
    problems = []
    for solved in solved_notebooks():
        student = student_path(solved)
        if not student.exists():
            problems.append(f"{student.relative_to(ROOT)}: missing")
            continue
        want = _sources(student_version(nbformat.read(solved, as_version=4)))
        got = _sources(nbformat.read(student, as_version=4))
        if want != got:
            diff = next((i for i, (w, g) in enumerate(zip(want, got)) if w != g), len(got))
            problems.append(f"{student.relative_to(ROOT)}: cell {diff} differs from the solved "
                            f"notebook's student version")  # fmt: skip
    return problems
