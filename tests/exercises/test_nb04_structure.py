"""Notebook 04's shape: a main path short enough to read in a sitting, numbered sections that the
text's cross-references find, and an appendix numbered A.1, A.2, ... without gaps."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = [ROOT / "notebooks" / "solutions" / "04_inductor_triton.ipynb",
             ROOT / "notebooks" / "04_inductor_triton.ipynb"]  # fmt: skip
MAIN_PATH_CELLS = 60  # sections 1-5 and "What we built"; production detail goes to the appendix


def cells(path: Path) -> list:
    return nbformat.read(path, as_version=4).cells


def headings(nb_cells: list, level: str) -> list[tuple[int, str]]:
    """(cell number, title) of every markdown heading of ``level`` (such as ``"##"``)."""
    found = []
    for k, cell in enumerate(nb_cells):
        if cell.cell_type == "markdown":
            found += [(k, m) for m in re.findall(rf"^{level} (.*)$", cell.source, re.M)]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_main_path_length_and_numbered_sections(path):
    nb_cells = cells(path)
    sections = headings(nb_cells, "##")
    appendix = next(k for k, title in sections if title.startswith("Appendix"))
    assert appendix <= MAIN_PATH_CELLS, f"main path of {appendix} cells"
    numbered = [title.split(".")[0] for k, title in sections if k < appendix and title[0].isdigit()]
    assert numbered == [str(n) for n in range(1, len(numbered) + 1)], numbered
    text = "\n".join(c.source for c in nb_cells)
    cited = {int(n) for n in re.findall(r"\bsections? (\d)\b", text)}
    assert cited <= set(range(1, len(numbered) + 1)), cited


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_appendix_is_numbered_without_gaps_and_each_part_starts_a_cell(path):
    nb_cells = cells(path)
    parts = headings(nb_cells, "###")
    numbers = [title.split()[0] for _, title in parts if title.startswith("A.")]
    assert numbers == [f"A.{n}" for n in range(1, len(numbers) + 1)], numbers
    for k, title in parts:
        if title.startswith("A."):
            assert nb_cells[k].source.startswith(f"### {title}"), f"{title} is inside cell {k}"
    text = "\n".join(c.source for c in nb_cells)
    assert set(re.findall(r"\bA\.\d+", text)) == set(numbers)  # every reference finds its part


def test_indirect_indexing_is_taught_in_section_2():
    nb_cells = cells(NOTEBOOKS[0])
    start = next(k for k, t in headings(nb_cells, "##") if t.startswith("2."))
    end = next(k for k, t in headings(nb_cells, "##") if t.startswith("3."))
    section = [c for c in nb_cells[start:end] if c.cell_type == "code"]
    printed = "".join(o.get("text", "") for c in section for o in c.outputs)
    assert "ind0 = load(" in printed  # the loop IR's indirect load
    assert "int64_t tmp0 = in_ptr1[" in printed  # the C++ kernel loads the index first
    assert "+= load(" in printed  # the backward's scatter-add
    assert printed.count("IndexError: index out of range in self") == 2  # eager and toycomp
