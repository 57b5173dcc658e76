"""Which toycomp functions run for an example, stage by stage: the reading list, with line counts.

    python benchmarks/reading_list.py                  # the running example, teach preset
    python benchmarks/reading_list.py --preset fast    # the same example, every optimisation on
    python benchmarks/reading_list.py --summary        # one line per stage, no function list

The running example is ``f(x) = sin(x)**2 + cos(x)**2`` on the CPU through ``toycomp.compile``:
forward and backward, first call (capture and compile) and second call (guards, cached code).
Every toycomp function that executes is counted once, with all of its source lines (what a
student must read to follow the path), grouped by stage as the package's folders are. Module
bodies (imports) are not counted. tests/test_line_budget.py keeps these counts under the
budgets that docs/passes.md states.

NB: tinygrad's sz.py counts a package's lines the same way for its CI budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Callable

import torch

PACKAGE = Path(__file__).resolve().parents[1] / "toycomp"

# Stage of a module path (relative to toycomp/): the first rule whose prefix matches.
STAGES = [
    ("capture", "capture/"),
    ("aot", "aot/"),
    ("prims", "prims/"),
    ("inductor/opt", "inductor/opt/"),
    ("inductor/codegen", "inductor/codegen/"),
    ("inductor", "inductor/"),
    ("exercises", "exercises/"),
    ("glue", ""),
]
STAGE_ORDER = [name for name, _ in STAGES]


def stage_of(relpath: str) -> str:
    return next(name for name, prefix in STAGES if relpath.startswith(prefix))


@dataclasses.dataclass(frozen=True)
class Function:
    """One executed toycomp function: where it is and how many source lines it has."""

    module: str  # path relative to toycomp/
    name: str  # co_qualname
    first_line: int
    lines: int

    @property
    def stage(self) -> str:
        return stage_of(self.module)


_NOT_FUNCTIONS = {"<module>", "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}


def _function_of(code: CodeType) -> Function | None:
    path = Path(code.co_filename)
    # Module bodies are imports; comprehensions are lines of the function around them.
    if not path.is_relative_to(PACKAGE) or code.co_name in _NOT_FUNCTIONS:
        return None
    try:
        source, first = inspect.getsourcelines(code)
    except (OSError, TypeError):  # generated code (exec'd wrappers) has no source file
        return None
    name = getattr(code, "co_qualname", code.co_name)
    return Function(str(path.relative_to(PACKAGE)), name, first, len(source))


def trace_functions(run: Callable[[], Any]) -> list[Function]:
    """The toycomp functions ``run()`` executes, each once, in the order they first ran."""
    seen: dict[CodeType, None] = {}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code not in seen:
            seen[frame.f_code] = None

    sys.setprofile(profile)
    threading.setprofile(profile)  # kernels compile on a thread pool
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    found = (_function_of(code) for code in seen)
    # Nested functions lie inside their parent's lines: count only the outermost one.
    functions = [f for f in found if f is not None]
    return [f for f in functions if not _inside_another(f, functions)]


def _inside_another(f: Function, functions: list[Function]) -> bool:
    return any(g is not f and g.module == f.module and g.first_line <= f.first_line
               and f.first_line + f.lines <= g.first_line + g.lines
               and g.lines > f.lines for g in functions)  # fmt: skip


def running_example(options: dict[str, Any]) -> Callable[[], None]:
    """sin²+cos² through ``toycomp.compile`` on the CPU: forward and backward, two calls."""
    import toycomp

    def f(x):
        return torch.sin(x) ** 2 + torch.cos(x) ** 2

    def run() -> None:
        compiled = toycomp.compile(f, options=options)
        for _ in range(2):  # the first call compiles, the second runs the cached code
            x = torch.randn(1000, requires_grad=True)
            compiled(x).sum().backward()

    return run


def reading_list(preset: str = "teach") -> list[Function]:
    """The functions the running example executes under ``toycomp.config.<preset>``, in a
    process that has imported toycomp and compiled nothing yet, with an empty kernel cache
    (the path of a student's first run: C++ compiled, probes run)."""
    import toycomp

    options = getattr(toycomp.config, preset)
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["TOYCOMP_CACHE_DIR"] = cache_dir
        return trace_functions(running_example(options))


def stage_totals(functions: list[Function]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for f in functions:
        totals[f.stage] += f.lines
    return {stage: totals[stage] for stage in STAGE_ORDER if stage in totals}


def package_lines(stage: str | None = None) -> int:
    """Lines of the package's modules (of one stage), as ``wc -l`` counts them."""
    paths = [p for p in PACKAGE.rglob("*.py")
             if stage is None or stage_of(str(p.relative_to(PACKAGE))) == stage]  # fmt: skip
    return sum(len(p.read_text().splitlines()) for p in paths)


def print_reading_list(functions: list[Function], summary: bool = False) -> None:
    by_stage: dict[str, list[Function]] = defaultdict(list)
    for f in functions:
        by_stage[f.stage].append(f)
    for stage in STAGE_ORDER:
        if stage not in by_stage:
            continue
        fs = by_stage[stage]
        print(f"== {stage}: {sum(f.lines for f in fs)} lines in {len(fs)} functions")
        if summary:
            continue
        by_module: dict[str, list[Function]] = defaultdict(list)
        for f in fs:
            by_module[f.module].append(f)
        for module, mfs in by_module.items():
            print(f"  {module} ({sum(f.lines for f in mfs)} lines)")
            for f in sorted(mfs, key=lambda f: f.first_line):
                print(f"    {f.first_line:5d} {f.name} ({f.lines})")
    modules = len({f.module for f in functions})
    print(f"== total: {sum(f.lines for f in functions)} lines of {len(functions)} functions "
          f"in {modules} modules")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="teach", choices=["teach", "fast"])
    parser.add_argument("--summary", action="store_true", help="one line per stage")
    parser.add_argument("--json", action="store_true", help="the functions, as JSON")
    args = parser.parse_args()
    functions = reading_list(args.preset)
    if args.json:
        print(json.dumps([dataclasses.asdict(f) for f in functions]))
    else:
        print_reading_list(functions, args.summary)


if __name__ == "__main__":
    main()
