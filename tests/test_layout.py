"""The package's shape: no module-level import cycles, and docstring examples that still run."""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "toycomp"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(path: Path, name: str) -> set[str]:
    """Modules named by the imports that run when ``path`` is imported (not those inside
    functions or under ``if TYPE_CHECKING``). ``from a import b`` names ``a`` and ``a.b``."""
    is_package = path.name == "__init__.py"
    base = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for stmt in ast.parse(path.read_text()).body:
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
            continue
        nodes = ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt]
        for node in nodes:
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parent = base.split(".")[: len(base.split(".")) - node.level + 1]
                    source = ".".join(parent + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                found |= {source} | {f"{source}.{alias.name}" for alias in node.names}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in module_level_imports(path, name) if m in paths and m != name}
        for name, path in paths.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (first == last), or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for succ in sorted(graph[node]):
            if state.get(succ) == "open":
                return path[path.index(succ) :] + [succ]
            if succ not in state and (cycle := visit(succ)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_module_level_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


MODULES = sorted(module_name(p) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    """Every ``>>>`` example in the package's docstrings runs and prints what it shows."""
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, report=False)
    failed = f"{result.failed} of {result.attempted} doctest examples failed in {name}"
    assert result.failed == 0, failed


def readme_layout_rows() -> dict[str, str]:
    """The README's layout table: first cell (a path) -> the rest of the row."""
    text = (PACKAGE.parent / "README.md").read_text()
    table = text[text.index("## Layout") :]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            rows[cells[0]] = cells[1]
    return rows


def test_readme_layout_table_names_every_module():
    """The README's layout table names every module: a top-level module anywhere in the table, a
    stage module in its package's row (a sub-package, like ``variables/``, by its folder)."""
    rows = readme_layout_rows()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        if relative.parent == Path("toycomp"):
            assert any(path.name in f"{p} {h}" for p, h in rows.items()), f"{relative} unlisted"
            continue
        # the nearest package with a row of its own: toycomp/capture/variables/x.py -> capture/
        package, name = relative.parent, path.name
        while f"`{package.as_posix()}/`" not in rows:
            package, name = package.parent, f"{package.name}/"
        if name != "__init__.py":
            assert name in rows[f"`{package.as_posix()}/`"], f"{relative} unlisted in the README"
