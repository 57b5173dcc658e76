"""Where in the user's code: Python frames -> the user's source line for nodes and graph breaks.

Input -> output: the Python call stack at a torch call (walked up to the frame that started the
capture) -> a ``Location`` (file, line, function, text) of the innermost *user* frame, i.e. the
first frame outside torch and toycomp. toycomp/capture/tracer.py writes it into every node
(``meta["stack_trace"]``, ``meta["source_line"]``) and into every ``GraphBreak``.

Tiny example::

    def f(x):                       # user_location(root) inside the torch.sin call:
        return torch.sin(x) + 1     #   Location("f.py", 2, "f", "return torch.sin(x) + 1")
                                    # node.meta["source_line"] == "line 2: return torch.sin(x) + 1"

Calls made inside a custom ``autograd.Function.apply`` are reported as a graph break at the
``apply`` call: recording its forward ops would silently drop its custom backward.

NB: in PyTorch this lives in torch/_dynamo/ (symbolic_convert.py keeps the instruction being
interpreted and its ``speculate_subgraph``/``graph_break`` messages; output_graph.py writes
``node.meta["stack_trace"]`` from ``InstructionTranslator.frame_summary()``).
"""

from __future__ import annotations

import inspect
import linecache
import os
import types
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "GraphBreak",
    "Location",
    "definition_site",
    "graph_break_at",
    "node_source_meta",
    "user_location",
]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TOYCOMP_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_AUTOGRAD_FUNCTION_FILE = os.path.join(_TORCH_DIR, "autograd", "function.py")


@dataclass(frozen=True)
class GraphBreak:
    """Why capture stopped, and the user's source line where it happened."""

    reason: str
    filename: str
    lineno: int
    source_line: str

    def __str__(self) -> str:
        return f"graph break at line {self.lineno}: `{self.source_line}`\n  {self.reason}"


class Location(NamedTuple):
    filename: str
    lineno: int
    function: str
    text: str


def user_location(root_frame: types.FrameType | None) -> tuple[Location, GraphBreak | None]:
    """The innermost user frame (outside torch and toycomp) of the current torch call.

    Args:
        root_frame: the frame that started the capture; the walk up the stack stops there.

    Returns:
        ``(location, None)``; or ``(location, graph_break)`` when the call was made inside a
        custom ``autograd.Function``, which the caller must refuse.
    """
    frame, user = inspect.currentframe(), None
    innermost_library = None
    while frame is not None and frame is not root_frame:
        filename = frame.f_code.co_filename
        if filename == _AUTOGRAD_FUNCTION_FILE and frame.f_code.co_name == "apply":
            caller = _location(frame.f_back)
            name = getattr(frame.f_locals.get("cls"), "__name__", "autograd.Function")
            reason = f"custom autograd.Function {name}.apply (its backward cannot be traced)"
            return caller, graph_break_at(reason, caller)
        is_library = filename.startswith((_TORCH_DIR, _TOYCOMP_DIR))
        if user is None and not is_library:
            user = frame
        if innermost_library is None and filename.startswith(_TORCH_DIR):
            if not filename.endswith("overrides.py"):
                innermost_library = frame
        frame = frame.f_back
    return _location(user or innermost_library), None


def definition_site(reason: str, code: types.CodeType | None) -> GraphBreak:
    """A GraphBreak pointing at the first line of ``code`` (for breaks outside any torch call)."""
    if code is None:
        return GraphBreak(reason, "<unknown>", 0, "")
    text = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    return GraphBreak(reason, code.co_filename, code.co_firstlineno, text)


def graph_break_at(reason: str, where: Location) -> GraphBreak:
    """A GraphBreak for ``reason`` at ``where``."""
    return GraphBreak(reason, where.filename, where.lineno, where.text)


def node_source_meta(where: Location) -> dict[str, str]:
    """The ``stack_trace`` and ``source_line`` entries of a node recorded at ``where``."""
    return {
        "stack_trace": (
            f'  File "{where.filename}", line {where.lineno}, in {where.function}\n'
            f"    {where.text}\n"
        ),
        "source_line": f"line {where.lineno}: {where.text}",
    }


def _location(frame: types.FrameType | None) -> Location:
    if frame is None:
        return Location("<unknown>", 0, "<unknown>", "")
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(filename, lineno).strip()
    return Location(filename, lineno, frame.f_code.co_name, text)
