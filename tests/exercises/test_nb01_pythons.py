"""Notebook 01's bytecode interpreter and exercise 1 work on every Python from 3.10 to 3.13.

Each Python loads and calls ``torch.sin`` with other opcodes. The test takes the interpreter's
cells (tagged ``bytecode-interpreter`` in the solved notebook) and exercise 1's solution cell,
and runs them with exercise 1's check under each Python 3.10-3.13 that pyenv has installed
(``~/.pyenv/versions/3.1x.*``). Those Pythons have no torch: tests/exercises/torch_standin.py
stands in for the few parts of it that the interpreter uses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.exercises import reference

ROOT = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("torch_standin.py")
TAG = "bytecode-interpreter"


def python(minor: int) -> Path | None:
    """The newest pyenv Python 3.<minor>, or the running one if it is that version."""
    found = sorted(Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python"))
    if found:
        return found[-1]
    return Path(sys.executable) if sys.version_info[:2] == (3, minor) else None


def interpreter_cells() -> list[str]:
    (path,) = reference.SOLUTIONS.glob("01_*.ipynb")
    cells = nbformat.read(path, as_version=4).cells
    return [c.source for c in cells if TAG in c.metadata.get("tags", [])]


@pytest.fixture(scope="module")
def given() -> str:
    cells = interpreter_cells()
    assert cells, f"no cell of the solved notebook 01 is tagged {TAG!r}"
    solution = reference.solution_source("01", "nb01_ex1_unary_negative")
    return json.dumps({"cells": cells, "solution": solution})


@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_interpreter_and_exercise_1_on_python(minor, given):
    exe = python(minor)
    if exe is None:
        pytest.skip(f"Python 3.{minor} is not installed under ~/.pyenv/versions")
    run = subprocess.run([str(exe), "-I", str(STANDIN), str(ROOT)], input=given, text=True,
                         capture_output=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["python"] == [3, minor]
    # the running example: the same five operations as eager, computed on fake (empty) inputs
    assert report["ops"] == ["sin", "pow", "cos", "pow", "add"]
    assert report["graph_matches_eager"] and report["fake_output_has_no_data"]
    # an opcode the sketch does not handle (the if's jump, or 3.13's TO_BOOL before it) is
    # refused by name and line
    assert report["unsupported"].startswith("opcode ")
    assert report["unsupported"].endswith("(line 1 of branchy)")
    verdicts = report["verdicts"]
    assert verdicts["reference"][0] == "passed", verdicts["reference"][1]
    assert verdicts["stub"][0] == "not solved"
    assert verdicts["drops the minus"][0] == "failed"
    assert verdicts["negates twice"][0] == "failed"
