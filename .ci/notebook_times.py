"""pytest plugin: each notebook's run time under nbval, printed after the tests.

``./dev.sh test`` loads it (``-p notebook_times``, with ``.ci/`` on ``PYTHONPATH``). nbval makes one
test item per cell; this adds up every item's set-up, call and tear-down time by notebook, which
includes the kernel's start (nbval starts it in the first cell's set-up)::

    ============================ notebook run times ============================
       41.2 s  notebooks/02_aot_autograd.ipynb (39 code cells)
       ...
      233.0 s  total
"""

from __future__ import annotations

import collections

TARGET = 60.0  # seconds: a notebook should run top to bottom in about a minute

_seconds: dict[str, float] = collections.defaultdict(float)
_cells: dict[str, set[str]] = collections.defaultdict(set)


def pytest_runtest_logreport(report) -> None:
    path, _, cell = report.nodeid.partition("::")
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration
        _cells[path].add(cell)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    write = terminalreporter.write_line
    terminalreporter.section("notebook run times")
    for path, seconds in _seconds.items():
        over = f"  (over the {TARGET:.0f} s target)" if seconds > TARGET else ""
        write(f"{seconds:8.1f} s  {path} ({len(_cells[path])} code cells){over}")
    write(f"{sum(_seconds.values()):8.1f} s  total")
