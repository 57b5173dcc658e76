"""The student release: the course in one folder, with nothing of a solution in it.

Input -> output: the repository -> ``DIR``, what students install and open::

    python -m toycomp.exercises bundle DIR        (or ./dev.sh bundle DIR)

    DIR/README.md              how to install it and open the notebooks
    DIR/notebooks/0N_*.ipynb   the student notebooks (stubs, saved with their outputs)
    DIR/toycomp/               the package, checkers included (a check holds no answer)
    DIR/benchmarks/            what notebooks 04 and 05 read (gpt.py, stored results)
    DIR/pyproject.toml, requirements.txt, environment.yml, dev.sh   to install it

and never ``notebooks/solutions/``, ``tests/`` (the checkers' tests run the solutions) or the
instructors' ``notebooks/README.md``. The command refuses stale student notebooks, and after
copying it searches every file of ``DIR`` for the solved notebooks' solution lines (those between
``### BEGIN SOLUTION`` and ``### END SOLUTION``, but the trivially short ones): a bundle that holds
one is deleted and the command fails, naming the file and the line.

NB: nbgrader's ``generate_assignment`` makes the same release of a course's notebooks (its
``release/`` folder); the package and the data beside them are this course's own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat

from toycomp.exercises.notebooks import NOTEBOOKS, ROOT, check_generated, solved_notebooks

# What the release holds, relative to the repository root: folders are copied whole, minus the
# build and cache files of IGNORE.
FILES = ["pyproject.toml", "requirements.txt", "environment.yml", "dev.sh"]
FOLDERS = ["toycomp", "benchmarks"]
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", ".ipynb_checkpoints",
                                ".pytest_cache", "*.egg-info")  # fmt: skip
MIN_LINE = 20  # shorter solution lines ("return out", "else:") are not distinctive

README = """\
# toycomp: the course

PyTorch 2's `torch.compile` stack rebuilt small, in five notebooks (`notebooks/`). Each coding
exercise is a stub that raises `NotImplementedError`; complete it, run the check cell below it,
and read its verdict.

```bash
./dev.sh lab        # set up .venv (Python >= 3.10, the pinned packages), open JupyterLab
```

or, by hand: `python -m venv .venv && .venv/bin/pip install -r requirements.txt && \\
.venv/bin/pip install --no-deps -e .`, then `.venv/bin/jupyter lab notebooks/`.
`conda env create -f environment.yml` works too. No GPU is needed.

Hand in the notebook files as they are (any file name): your grade comes from the check cells,
run again on a fresh kernel.
"""


def solution_lines(solved: list[Path] | None = None) -> dict[str, str]:
    """The distinctive lines of every solution: {stripped line: "02_aot_autograd.ipynb"}.

    A solution line is distinctive unless it is short (``MIN_LINE``) or the student has it (or
    the value it assigns) anyway: in the compiler's own modules (``toycomp/`` but
    ``toycomp/exercises/``: the notebooks teach them, and many exercises rebuild a piece of them),
    or elsewhere in a solved notebook.
    """
    solved = solved if solved is not None else solved_notebooks()
    lines, shown = {}, []
    for path in solved:
        for cell in nbformat.read(path, as_version=4).cells:
            inside = False
            solution = cell.metadata.get("nbgrader", {}).get("solution")
            for line in cell.source.splitlines():
                mark = line.strip()
                if solution and mark in ("### BEGIN SOLUTION", "### END SOLUTION"):
                    inside = mark == "### BEGIN SOLUTION"
                elif inside:
                    lines.setdefault(mark, path.name)
                else:
                    shown.append(mark)
    package = ROOT / "toycomp"
    shown += [file_text(p) for p in package.rglob("*.py") if package / "exercises" not in p.parents]
    shown_text = "\n".join(shown)
    return {line: source for line, source in lines.items()
            if len(line) >= MIN_LINE and not any(part in shown_text for part in parts(line))}


def parts(line: str) -> list[str]:
    """What of a line the student may have read: the line, and the value of an assignment
    (``n = joint.meta["num_fwd_outputs"]`` gives nothing away when the notebook shows
    ``joint.meta["num_fwd_outputs"]``: the name is all the answer adds)."""
    target, eq, value = line.partition(" = ")
    simple = eq and target.replace("_", "").replace(", ", "").isalnum()
    return [line, value] if simple and len(value) >= MIN_LINE else [line]


def file_text(path: Path) -> str:
    """A file's text as a reader sees it: a notebook's cell sources and outputs, unescaped."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return text
    strings: list[str] = []

    def walk(value) -> None:  # a notebook stores text as a string or as a list of lines
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, list):
            strings.append("".join(v for v in value if isinstance(v, str)))
            for v in value:
                walk(v) if isinstance(v, (list, dict)) else None
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(json.loads(text))
    return "\n".join(strings)


def find_leaks(folder: Path, lines: dict[str, str]) -> list[str]:
    """``"notebooks/03_prims.ipynb: <line> (a solution line of 03_prims.ipynb)"`` for every
    solution line found in a file under ``folder``."""
    leaks = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        text = file_text(path)
        leaks += [f"{path.relative_to(folder)}: {line!r} (a solution line of {source})"
                  for line, source in lines.items() if line in text]  # fmt: skip
    return leaks


def bundle(out: str | Path) -> Path:
    """Write the student release into ``out`` (a new or empty folder), check that it holds no
    solution line, and return it."""
    out = write(out)
    leaks = find_leaks(out, solution_lines())
    if leaks:
        shutil.rmtree(out)
        raise RuntimeError("the bundle would hold solutions:\n  " + "\n  ".join(leaks))
    return out


def write(out: str | Path) -> Path:
    """Copy the release's files into ``out`` (a new or empty folder), unchecked."""
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    if any(out == d or d in out.parents for d in [ROOT / f for f in FOLDERS + ["notebooks"]]):
        raise ValueError(f"the bundle cannot go inside what it copies: {out}")
    stale = check_generated()
    if stale:
        raise RuntimeError("stale student notebooks (./dev.sh student): " + "; ".join(stale))
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copy2(ROOT / name, out / name)
    for name in FOLDERS:
        shutil.copytree(ROOT / name, out / name, ignore=IGNORE)
    (out / "notebooks").mkdir()
    for student in sorted(NOTEBOOKS.glob("0*.ipynb")):
        shutil.copy2(student, out / "notebooks" / student.name)
    (out / "README.md").write_text(README)
    return out
