"""``capture_graph``: one function -> its one torch-level graph, for the notebooks of stages 2-4.

``toycomp.compile`` never needs this: it hands each graph the capture makes straight to stages
2-4. Notebooks 02 and 03 want to hold the graph of a function with no graph break, run it, and
give it to AOTAutograd themselves; ``capture_graph`` traces ``fn`` on fake tensors (nothing of
``fn`` runs) and returns the graph with the real tensors it reads, in placeholder order::

    >>> import torch
    >>> captured = capture_graph(lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, torch.ones(8))
    >>> [node.name for node in captured.gm.graph.nodes]
    ['l_x', 'sin', 'pow_1', 'cos', 'pow_2', 'add', 'output']
    >>> captured.input_sources, captured.gm(*captured.example_inputs)[0][:2]
    (["L['x']"], tensor([1., 1.]))

NB: in PyTorch the nearest thing is ``torch._dynamo.export`` / ``torch.export``, which also
capture one whole graph and fail on a graph break.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from toycomp.capture.convert_frame import CompileContext


@dataclass
class CapturedGraph:
    """A captured graph, the real inputs it reads (in placeholder order) and its guards."""

    gm: torch.fx.GraphModule
    example_inputs: list[torch.Tensor]
    guards: str
    sources: list = field(default_factory=list, repr=False)  # capture/sources.py's Sources
    fn: Callable | None = field(default=None, repr=False)

    @property
    def input_sources(self) -> list[str]:
        """Where each placeholder is read from, as the guards spell it (``L['x']``...)."""
        return [s.name() for s in self.sources]

    def flatten_inputs(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """The graph's inputs for the call ``fn(*args, **kwargs)`` (parameters included)."""
        bound = inspect.signature(self.fn, follow_wrapped=False).bind(*args, **kwargs)
        bound.apply_defaults()
        return [s.read(bound.arguments, self.fn.__globals__, self.fn) for s in self.sources]


def capture_graph(fn: Callable, *args: Any, **kwargs: Any) -> CapturedGraph:
    """Trace ``fn(*args, **kwargs)`` (on fake tensors) into exactly one graph.

    Raises:
        RuntimeError: ``fn`` has a graph break (it would need several graphs: use
            ``toycomp.explain``), or traces no tensor operation.
    """
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    graphs: list[torch.fx.GraphModule] = []
    frame = CompileContext(lambda gm, example_inputs: graphs.append(gm) or gm.forward)
    compiled = frame.frame_for(target)
    bound = inspect.signature(target, follow_wrapped=False).bind(*args, **kwargs)
    bound.apply_defaults()
    entry = compiled.compile(dict(bound.arguments))  # traces and compiles; runs nothing
    record = frame.log[-1]
    if entry is None or record.break_reason is not None:
        raise RuntimeError(f"capture_graph: {record.break_reason}; use toycomp.explain")
    if len(graphs) != 1:
        raise RuntimeError(f"capture_graph: {len(graphs)} graphs (expected exactly one)")
    gm = graphs[0]
    sources = gm.meta["input_sources"]
    inputs = [s.read(bound.arguments, target.__globals__, target) for s in sources]
    return CapturedGraph(gm, inputs, record.guards, sources, target)
