"""What ``TORCH_LOGS`` prints for real ``torch.compile``, captured for the notebooks.

Input -> output: a function, its inputs and log artifacts (``aot_graphs=True``...) -> the log
lines that ``TORCH_LOGS="aot_graphs"`` would print while ``torch.compile(fn, backend=...)`` runs
once (forward, and backward when an input requires grad), tidied so that a notebook can show
them and nbval can compare them: no timestamps, process ids or file paths, no ``# File:``
provenance comments, type annotations or ``x = None`` statements, each line at most 100 columns
(a compile takes seconds, so this example is not run as a doctest)::

    lines = torch_logs(lambda x: torch.sin(x) * 2, torch.randn(4), aot_graphs=True)
    lines[:4] == ["===== Forward graph =====", "def forward(self, arg0_1):",
                  "    sin = torch.ops.aten.sin.default(arg0_1)",
                  "    mul = torch.ops.aten.mul.Tensor(sin, 2)"]

NB: ``torch._logging.set_logs`` is the in-process form of the ``TORCH_LOGS`` environment
variable (torch/_logging/_internal.py).
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any, Callable

import torch

WIDTH = 100
_PREFIX = re.compile(r"^[IWVDE]\d{4} [\d:.]+ \d+ \S+\] (?:\[[^\]]*\] )*")
_ANNOTATION = re.compile(r': "[^"]*"')


def tidy(line: str) -> str | None:
    """One log line as a notebook shows it, or None to leave it out."""
    line = _PREFIX.sub("", line).rstrip()
    if not line.strip() or line.strip().startswith("#") or "class GraphModule" in line:
        return None
    if line.startswith(("aot_config", "TRACED GRAPH")):
        return None
    line = _ANNOTATION.sub("", line.split(";  ")[0])
    line = re.sub(r"(=====.* graph) \d+ =====", r"\1 =====", line)  # a per-process counter
    line = line[4:] if line.startswith("    ") else line.strip() if "=====" in line else line
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def torch_logs(fn: Callable, *args: Any, backend: str = "aot_eager", **artifacts: bool) -> list[str]:
    """Run ``torch.compile(fn, backend=backend)(*args)`` once (and its backward when an input
    requires grad) with ``torch._logging.set_logs(**artifacts)``; return the tidied lines."""
    torch._dynamo.reset()
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        torch._logging.set_logs(**artifacts)
        try:
            out = torch.compile(fn, backend=backend)(*args)
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            if leaves:
                outs = out if isinstance(out, (tuple, list)) else (out,)
                torch.autograd.grad([o.sum() for o in outs], leaves)
        finally:
            torch._logging.set_logs()
    lines = (tidy(line) for line in buffer.getvalue().splitlines())
    return [line for line in lines if line is not None]
