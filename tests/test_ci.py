"""CI's entry point, ``.ci/run``, on a stand-in ``dev.sh`` (its passes, what fails it), and
the plugin that prints each notebook's run time, on a one-cell notebook."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]

STAND_IN = """#!/usr/bin/env bash
echo "dev.sh $* ATEN=${ATEN_CPU_CAPABILITY:-} OMP=${OMP_NUM_THREADS:-}"
[ "$1" = site ] && exit "${RCS:-0}"
case "${ATEN_CPU_CAPABILITY:-}" in avx2) exit "${RC1:-0}";; default) exit "${RC2:-0}";; esac
exit "${RC3:-0}"
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    (tmp_path / ".ci").mkdir()
    shutil.copy2(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "dev.sh").write_text(STAND_IN)
    (tmp_path / "dev.sh").chmod(0o755)
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    for name in ["notebooks/01_a.ipynb", "notebooks/02_b.ipynb", "notebooks/solutions/01_a.ipynb"]:
        (tmp_path / name).write_text("{}")
    return tmp_path


def ci(checkout: Path, rc1: int, rc2: int, rc3: int = 0, rcs: int = 0
       ) -> subprocess.CompletedProcess:
    env = dict(os.environ, RC1=str(rc1), RC2=str(rc2), RC3=str(rc3), RCS=str(rcs))
    env.pop("ATEN_CPU_CAPABILITY", None), env.pop("OMP_NUM_THREADS", None)
    return subprocess.run([str(checkout / ".ci" / "run")], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_ci_runs_the_tests_on_avx2_then_the_notebooks_on_other_kernels(checkout):
    run = ci(checkout, 0, 0)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("dev.sh")]
    assert lines[:2] == ["dev.sh test ATEN=avx2 OMP=",
                         "dev.sh test notebooks/solutions/01_a.ipynb notebooks/02_b.ipynb "
                         "ATEN=default OMP=1"]  # fmt: skip
    assert lines[2].startswith("dev.sh test tests/inductor/test_cpp") and "ATEN= OMP=" in lines[2]
    assert lines[3] == "dev.sh site --check ATEN= OMP="


@pytest.mark.parametrize("rc1, rc2, rc3", [(1, 0, 0), (0, 1, 0), (0, 0, 1), (5, 0, 0),
                                           (0, 5, 0), (0, 0, 5), (2, 5, 0)])
def test_ci_fails_when_any_pass_fails_or_collects_nothing(checkout, rc1, rc2, rc3):
    run = ci(checkout, rc1, rc2, rc3)
    assert run.returncode != 0
    stand_in = [line for line in run.stdout.splitlines() if line.startswith("dev.sh test")]
    assert len(stand_in) == 3  # the later passes run all the same
    if 5 in (rc1, rc2, rc3):
        assert "collected no tests" in run.stdout


def test_ci_fails_when_the_site_check_fails(checkout):
    run = ci(checkout, 0, 0, rcs=1)
    assert run.returncode != 0 and "site: ./dev.sh site --check: exit 1" in run.stdout


def test_ci_fails_without_notebooks(checkout):
    shutil.rmtree(checkout / "notebooks")
    run = ci(checkout, 0, 0)
    assert run.returncode != 0 and "no notebook found" in run.stdout


def test_each_notebooks_run_time_is_printed(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python",
                                 "display_name": "Python 3"}  # fmt: skip
    cell = nbformat.v4.new_code_cell("print('hi')")
    cell.execution_count, cell.outputs = 1, [nbformat.v4.new_output("stream", text="hi\n")]
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "one.ipynb")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / ".ci"), str(ROOT)]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "notebook_times", "--nbval",
                          "--nbval-current-env", "-p", "no:cacheprovider", "one.ipynb"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "notebook run times" in run.stdout
    (line,) = [line for line in run.stdout.splitlines() if line.endswith("(1 code cells)")]
    assert line.split()[1:] == ["s", "one.ipynb", "(1", "code", "cells)"]
    assert float(line.split()[0]) > 0
