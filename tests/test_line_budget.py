"""Line budgets, as tinygrad's sz.py keeps them: the package, each stage, the number of
primitives, and the running example's teach path (docs/passes.md states and explains them).

The teach path is what benchmarks/reading_list.py prints: every toycomp function that
``toycomp.compile(f, options=toycomp.config.teach)`` runs for f(x) = sin(x)**2 + cos(x)**2 on the
CPU (forward and backward, first and second call, an empty kernel cache), each counted once with
all its lines. A budget is a ceiling set a little above today's count: raising one is a decision
to write down in docs/passes.md, not a test to loosen quietly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import toycomp.prims as prims

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import reading_list  # noqa: E402

# The running example's teach path, per stage (reading_list.STAGES), and in all. The goal is
# 2,500 lines in all (docs/passes.md says where the rest goes); these are today's ceilings.
# (capture's Python semantics and logs raised capture, aot and glue by about 170 lines in all:
# live dict views, class-keeping rebuilds, grad-mode outputs, the logging hooks)
TEACH_PATH_BUDGET = {
    "capture": 595,
    "aot": 405,
    "prims": 345,
    "inductor": 655,  # (the kernel cache became the kernel_cache pass: -104; lowering: -83; +3:
    # the hook of layout_optimization for graph outputs)
    "inductor/codegen": 255,  # (the vector, layout and row-buffer C++ in CppVecKernelCodegen)
    "inductor/opt": 0,  # the core never enters an optimisation pass in teach
    "glue": 225,
}
TEACH_PATH_TOTAL = 2500  # the goal: a student reads the running example's path in an afternoon
# Lines of the package's modules, per stage and in all (wc -l).
# (indirect indexing raised prims, inductor and codegen by about 600 lines in all: the gather
# and scatter prims with their rules and the shifted reads, Load/Store index values, ir.Scatter;
# capture grew by about 1,050 for the constructs of real code: sets, itertools, functools, live
# dict views, dataclass dicts, decorated frames, and by about 190 for copy.deepcopy/copy.copy
# while tracing and tensors nested in an op's result, and by about 100 for the special cases
# named as helpers off the teach path (their def lines and docstrings); exercises by about 380 for the unfakeable grader,
# the student bundle and notebook 05's checks; glue by the logs and the config; inductor and
# codegen by about 120 for the helpers that took the special cases off the teach path)
PACKAGE_BUDGET = {
    "capture": 6960,  # (+60: nn.Module's children()/modules() iterators while tracing,
    # variables/nn_module_iter.py, for timm's RegNet stages)
    "aot": 2200,
    "prims": 4150,  # (+11: the teach path's special cases moved into named helpers; +300: the
    # rules for what real models left to eager: functional_rules.py, avg_pool_rules.py)
    "inductor": 4350,
    "inductor/codegen": 2600,
    "inductor/opt": 3250,  # (+150: Triton's compiles in worker processes, triton_worker.py;
    # +50: graph outputs in eager's layout, layout_optimization.py;
    # +120: channels-last convolutions, layout_optimization.py; +230: batched C++ compiles and Triton's ahead-of-time compile,
    # async_compile.py, for the compile-time goal of the speed issue; +150: the C++ kernel's
    # vector, layout and row-buffer code moved out of codegen/cpp.py into CppVecKernelCodegen)
    "exercises": 2150,
    "glue": 2400,
}
PACKAGE_TOTAL = 27550  # (+150: Triton compile workers, opt/triton_worker.py; +120: channels-last
# convolutions, opt/layout_optimization.py)
MODULE_MAX_LINES = 500  # DESIGN.md aims under ~400
PRIMS_MAX = 44  # a closed set, kept small: a new primitive is a decision, not a failure


@pytest.fixture(scope="module")
def teach_path() -> list[reading_list.Function]:
    """The teach path, traced in a fresh process (nothing compiled or cached before)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "reading_list.py"), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [reading_list.Function(**f) for f in json.loads(proc.stdout.splitlines()[-1])]


def test_teach_path_stays_under_its_budgets(teach_path):
    totals = reading_list.stage_totals(teach_path)
    assert set(totals) <= set(TEACH_PATH_BUDGET), totals
    over = {s: n for s, n in totals.items() if n > TEACH_PATH_BUDGET[s]}
    assert not over, f"teach path over budget: {over} (see benchmarks/reading_list.py)"
    assert sum(totals.values()) <= TEACH_PATH_TOTAL, totals


def test_teach_path_is_counted_from_real_functions(teach_path):
    """The count can fail: it sees the stages' entry points, and each function's own lines."""
    names = {(f.module, f.name) for f in teach_path}
    for entry in [("pipeline.py", "compile"), ("aot/aot_autograd.py", "aot_function"),
                  ("prims/decompositions.py", "decompose"), ("inductor/lowering.py", "lower"),
                  ("inductor/scheduler.py", "schedule"), ("inductor/codegen/cpp.py", "generate"),
                  ("inductor/wrapper.py", "compile_graph")]:  # fmt: skip
        assert entry in names, entry
    import toycomp.inductor.scheduler as scheduler
    import inspect

    (f,) = [f for f in teach_path if f.name == "schedule"]
    assert f.lines == len(inspect.getsourcelines(scheduler.schedule)[0])


def test_fast_path_enters_the_passes():
    """The same trace with every optimisation on reaches opt/ (so the teach budget's 0 means
    something): traced in-process, the kernel cache warm or not."""
    path = reading_list.trace_functions(reading_list.running_example({}))
    assert reading_list.stage_totals(path).get("inductor/opt", 0) > 0


def test_package_stays_under_its_budgets():
    over = {}
    for stage, budget in PACKAGE_BUDGET.items():
        lines = reading_list.package_lines(stage)
        if lines > budget:
            over[stage] = lines
    assert not over, f"package over budget: {over}"
    assert reading_list.package_lines() <= PACKAGE_TOTAL


def test_modules_stay_readable_on_a_screen():
    long = {str(p.relative_to(reading_list.PACKAGE)): n for p in reading_list.PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MODULE_MAX_LINES}  # fmt: skip
    assert not long, long


def test_prim_set_stays_small():
    assert len(prims.PRIMS) <= PRIMS_MAX
