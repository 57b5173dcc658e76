"""``toycomp.explain``: every stage's artefacts for one function and one set of inputs.

Input -> output: ``fn, *example_inputs`` -> an ``Explanation`` holding the captured graph and its
guards (or the graph break), the joint / forward / backward ATen graphs and the saved values, the
decomposed prims graphs and their fallbacks, the fused kernels with their source text, and the
wrapper code. It prints as text and renders as collapsible sections in a notebook::

    >>> import torch, toycomp
    >>> ex = toycomp.explain(lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, torch.randn(8))
    >>> len(ex.kernels), ex.kernels[0].backend      # one fused C++ kernel for the forward
    (1, 'cpp')
    >>> print(ex.draw("forward").source.splitlines()[0])   # the forward ATen graph, as DOT
    digraph "forward (ATen)" {

NB: PyTorch's counterparts are torch._dynamo.explain (graphs, graph breaks, guards) and
TORCH_LOGS="graph_code,aot_graphs,output_code" (every stage's code, printed as it compiles).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Callable

import torch.fx

import toycomp.viz as viz
from toycomp.pipeline import CompiledEntry, GraphArtefacts, build, check_choices


@dataclass
class Explanation:
    """Every stage's artefacts; see the module docstring."""

    entry: CompiledEntry

    # --- stage 1 ---------------------------------------------------------------------------
    @property
    def captured(self) -> torch.fx.GraphModule | None:
        return self.entry.captured.gm

    @property
    def guards(self) -> list:
        return list(self.entry.captured.guards)

    @property
    def graph_break(self) -> Any:
        return self.entry.captured.graph_break

    # --- stage 2 ---------------------------------------------------------------------------
    @property
    def joint(self) -> torch.fx.GraphModule | None:
        return self.entry.aot.joint if self.entry.aot else None

    @property
    def forward(self) -> torch.fx.GraphModule | None:
        return self.entry.aot.forward if self.entry.aot else None

    @property
    def backward(self) -> torch.fx.GraphModule | None:
        return self.entry.aot.backward if self.entry.aot else None

    @property
    def saved_values(self) -> list[str]:
        return list(self.entry.aot.saved_values) if self.entry.aot else []

    # --- stages 3 and 4 ----------------------------------------------------------------------
    def graph(self, name: str) -> GraphArtefacts:
        """The stage-3/4 artefacts of the ``"forward"`` or ``"backward"`` graph."""
        for artefacts in self.entry.graphs:
            if artefacts.name == name:
                return artefacts
        have = [g.name for g in self.entry.graphs]
        raise KeyError(f"no {name!r} graph was compiled (have: {have})")

    @property
    def kernels(self) -> list:
        """Every generated kernel (forward first), each with ``name``, ``source``, ``origins``."""
        return [k for g in self.entry.graphs for k in g.compiled.kernels]

    @property
    def eager_reason(self) -> str | None:
        """Why the whole graph runs eagerly (AOT refused a construct, e.g. ``resize_``), or None."""
        return self.entry.eager_reason

    @property
    def fallbacks(self) -> list[str]:
        """What runs eagerly because toycomp cannot compile it (empty is good): ATen ops it
        cannot decompose, or the whole graph, with the reason, when AOT refused it."""
        whole = [f"whole graph: {self.eager_reason}"] if self.eager_reason else []
        return whole + [op for g in self.entry.graphs for op in g.fallbacks]

    def draw(self, stage: str) -> viz.Drawing:
        """Draw ``"captured"``, ``"joint"``, ``"forward"``, ``"backward"``, ``"forward_prims"``
        or ``"backward_prims"`` (the prims graphs with their fused kernels boxed)."""
        if stage == "captured":
            return viz.draw(self.captured, title="captured (torch-level)")
        if stage in ("joint", "forward", "backward"):
            gm = getattr(self, stage)
            saved = self.saved_values if stage != "backward" else ()
            return viz.draw(gm, title=f"{stage} (ATen)", saved=saved)
        if stage.endswith("_prims"):
            artefacts = self.graph(stage[: -len("_prims")])
            groups = {k.name: list(k.origins) for k in artefacts.compiled.kernels}
            return viz.draw(artefacts.prims, title=f"{artefacts.name} (prims)", groups=groups)
        raise ValueError(f"unknown stage {stage!r}")

    # --- rendering ---------------------------------------------------------------------------
    def sections(self) -> list[tuple[str, str]]:
        """(title, text) pairs in pipeline order: what both renderings show."""
        out = [("1. captured graph", _code(self.captured) if self.captured else "(none)")]
        if self.graph_break is not None:
            out.append(("graph break: runs eagerly", str(self.graph_break)))
            return out
        out.append(("guards", "\n".join(str(g) for g in self.guards)))
        if self.eager_reason is not None:
            out.append(("runs eagerly", self.eager_reason))
            return out
        if self.joint is not None:
            out.append(("2. joint graph (ATen)", _code(self.joint)))
        out.append(("2. forward graph (ATen)", _code(self.forward)))
        if self.backward is not None:
            out.append(("2. backward graph (ATen)", _code(self.backward)))
            out.append(("saved for backward", ", ".join(self.saved_values)))
        for g in self.entry.graphs:
            out.append((f"3. {g.name} graph (prims)", _code(g.prims)))
            out.append((f"3. {g.name} fallbacks to eager", ", ".join(g.fallbacks) or "none"))
            for kernel in g.compiled.kernels:
                out.append((f"4. {g.name} {kernel.name} ({kernel.backend})", kernel.source))
            out.append((f"4. {g.name} wrapper", g.compiled.wrapper_source))
        return out

    def __str__(self) -> str:
        return "\n\n".join(f"== {title} ==\n{text.rstrip()}" for title, text in self.sections())

    def __repr__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        """One paragraph: graphs, kernels, fallbacks."""
        if self.graph_break is not None:
            return f"toycomp.explain: graph break, runs eagerly\n  {self.graph_break}"
        if self.eager_reason is not None:
            return f"toycomp.explain: runs eagerly\n  {self.eager_reason}"
        counts = ", ".join(
            f"{g.name}: {len(g.compiled.kernels)} kernel(s)" for g in self.entry.graphs
        )
        lines = [
            f"toycomp.explain: {len(self.captured.graph.nodes)} captured nodes, "
            f"{len(self.guards)} guards",
            f"  {counts}",
            f"  saved for backward: {', '.join(self.saved_values) or '-'}",
            f"  fallbacks to eager: {', '.join(self.fallbacks) or 'none'}",
        ]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [f"<pre>{html.escape(self.summary())}</pre>"]
        for title, text in self.sections():
            parts.append(
                f"<details><summary>{html.escape(title)}</summary>"
                f"<pre>{html.escape(text.rstrip())}</pre></details>"
            )
        return "\n".join(parts)


def _code(gm: torch.fx.GraphModule) -> str:
    return gm.code.strip()


def explain(
    fn: Callable,
    *example_inputs: Any,
    backend: str | None = None,
    partition: str = "min_cut",
    **kwargs: Any,
) -> Explanation:
    """Run every stage of toycomp on ``fn(*example_inputs, **kwargs)`` and keep what each made.

    Args:
        fn: a function or ``nn.Module``.
        *example_inputs: the inputs to trace with (tensors and Python values).
        backend: ``"cpp"``, ``"triton"`` or ``None`` as in ``toycomp.compile``.
        partition: ``"min_cut"`` or ``"default"`` as in ``toycomp.compile``.
        **kwargs: keyword arguments for ``fn``.

    Returns:
        An ``Explanation``: print it, or display it in a notebook.
    """
    check_choices(backend, partition)
    entry = build(fn, example_inputs, kwargs, backend, partition)
    entry.take_first_outputs()  # an Explanation keeps no tensors of the call
    return Explanation(entry)
