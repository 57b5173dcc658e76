"""The student release (``python -m toycomp.exercises bundle DIR``): what it holds, that it
installs into a fresh venv and runs its notebooks there, and that it holds no solution."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import nbformat
import pytest

from toycomp.exercises import bundle, checking, notebooks

ROOT = Path(__file__).resolve().parents[2]
# The student notebooks run in the fresh venv: those that read benchmarks/ (the rest run in CI
# from the repository, and the bundle holds the same files).
RUN_IN_VENV = ["04", "05"]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return bundle.write(tmp_path_factory.mktemp("release") / "toycomp-course")


def texts(folder: Path):
    """(path, text) of every file under ``folder``: a notebook's cell sources and outputs."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            parts = [c.source for c in nb.cells]
            parts += [json.dumps(o, ensure_ascii=False) for c in nb.cells
                      for o in c.get("outputs", [])]  # fmt: skip
            yield path, "\n".join(parts)
        else:
            yield path, path.read_bytes().decode("utf-8", errors="replace")


def test_release_holds_the_course_and_no_solved_notebook_or_test(release):
    names = {p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file()}
    students = sorted(p.name for p in (ROOT / "notebooks").glob("0*.ipynb"))
    assert sorted(n.split("/")[1] for n in names if n.startswith("notebooks/")) == students
    assert {"pyproject.toml", "requirements.txt", "README.md", "toycomp/__init__.py",
            "toycomp/exercises/checking.py", "benchmarks/gpt.py"} <= names  # fmt: skip
    assert not [n for n in names if n.startswith(("tests/", "notebooks/solutions/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # Notebook 04's plot reads a stored run from benchmarks/results/: each file it names is there.
    (nb04,) = [(ROOT / "notebooks" / name).read_text() for name in students if name[:2] == "04"]
    for stored in set(re.findall(r"\d{4}-\d\d-\d\d-[\w.-]+\.jsonl?", nb04)):
        assert f"benchmarks/results/{stored}" in names, stored


def test_every_exercise_has_distinctive_solution_lines():
    """The search below means something only if each solution gives it lines to look for."""
    lines = bundle.solution_lines()
    for solved in notebooks.solved_notebooks():
        nb = nbformat.read(solved, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution") and "### BEGIN SOLUTION" in cell.source:
                body = cell.source.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
                found = [line for line in lines if line in body]
                assert found, f"{solved.name} {meta['grade_id']}: no distinctive line"


def test_release_holds_no_solution_line(release):
    lines = bundle.solution_lines()
    leaks = [(path.relative_to(release).as_posix(), line) for path, text in texts(release)
             for line in lines if line in text]  # fmt: skip
    report = "solution lines in the student release:\n" + "\n".join(
        f"{path}: {line!r}" for path, line in leaks)
    assert not leaks, report


def test_the_leak_search_finds_a_solution_wherever_it_hides(tmp_path):
    solved = notebooks.solved_notebooks()[1]
    lines = bundle.solution_lines([solved])
    line = sorted(lines)[0]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "copy.ipynb").write_bytes(solved.read_bytes())
    (tmp_path / "hint.py").write_text(f'"""A docstring that gives it away:\n    {line}\n"""\n')
    found = bundle.find_leaks(tmp_path, lines)
    assert any(f.startswith("hint.py: ") for f in found), found
    assert len([f for f in found if f.startswith("notebooks/copy.ipynb: ")]) == len(lines)
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "stub.py").write_text("def f():\n    raise NotImplementedError()\n")
    assert bundle.find_leaks(tmp_path / "clean", lines) == []
    with pytest.raises(FileExistsError):
        bundle.bundle(tmp_path)  # not empty: never written over


RUNNER = textwrap.dedent(
    """
    import sys, nbformat, toycomp
    from nbclient import NotebookClient
    print("toycomp from", toycomp.__file__, flush=True)
    for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
        nb = nbformat.read(src, as_version=4)
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": "."}}).execute()
        nbformat.write(nb, dst)
    """
)


def test_release_installs_in_a_fresh_venv_and_runs_its_notebooks(release, tmp_path):
    """``pip install`` of the release into a new venv (the big dependencies reached through a
    .pth to this interpreter's site-packages), then notebooks 04 and 05 run there to the end."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([python, "-c", where], check=True, capture_output=True,
                             text=True).stdout.strip()  # fmt: skip
    Path(purelib, "course-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONHASHSEED"] = "0"
    installed = tmp_path / "installed"  # pip builds in the source folder: build a copy
    subprocess.run(["cp", "-r", str(release), str(installed)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", str(installed)], check=True, env=env, cwd=tmp_path)  # fmt: skip
    students = {p.name[:2]: p.name for p in (release / "notebooks").glob("0*.ipynb")}
    args = []
    for number in RUN_IN_VENV:
        args += [students[number], str(tmp_path / students[number])]
    run = subprocess.run([python, "-c", RUNNER, *args], cwd=release / "notebooks", env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"toycomp from {purelib}/toycomp/__init__.py" in run.stdout
    for number in RUN_IN_VENV:
        nb = nbformat.read(tmp_path / students[number], as_version=4)
        checks = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        for cell in checks:  # every check ran on its stub
            records = [o["data"][checking.VERDICT_MIMETYPE] for o in cell.outputs
                       if checking.VERDICT_MIMETYPE in o.get("data", {})]  # fmt: skip
            assert [r["status"] for r in records] == ["not solved"], (number, cell.source)
        assert all(c.execution_count for c in nb.cells if c.cell_type == "code" and c.source)
