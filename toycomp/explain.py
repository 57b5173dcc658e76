"""``toycomp.explain``: every stage's artefacts for one function and one set of inputs.

Input -> output: ``fn, *example_inputs`` -> an ``Explanation`` holding the captured graphs, their
guards and graph breaks, the joint / forward / backward ATen graphs and the saved values, the
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
from dataclasses import dataclass, field
from typing import Any, Callable

import torch.fx

import toycomp.viz as viz
from toycomp.capture.convert_frame import CompileContext, ExplainOutput, summarize
from toycomp.capture.dynamic_shapes import DynamicShapes
from toycomp.pipeline import (
    CompiledEntry,
    GraphArtefacts,
    GraphCompiler,
    check_choices,
    frame_target,
)


@dataclass
class Explanation:
    """Every stage's artefacts; see the module docstring.

    ``entries`` holds every captured graph's artefacts, in compile order; ``entry`` is the
    first (the stage 2-4 properties below read it); ``dynamo`` is what ``torch._dynamo.explain``
    would report (graph breaks, transformed code, guards).
    """

    entry: CompiledEntry | None
    entries: list[CompiledEntry]
    dynamo: ExplainOutput
    shapes: list[DynamicShapes] = field(default_factory=list)  # per compile with symbols

    # --- stage 1, as torch._dynamo.explain reports it -----------------------------------------
    @property
    def graph_count(self) -> int:
        return self.dynamo.graph_count

    @property
    def graph_break_count(self) -> int:
        return self.dynamo.graph_break_count

    @property
    def break_reasons(self) -> list[str]:
        """Each graph break's reason and user source line."""
        return list(self.dynamo.break_reasons)

    @property
    def transformed_code(self) -> list[str]:
        """The Python text that runs instead of each compiled frame."""
        return list(self.dynamo.transformed_code)

    @property
    def captured(self) -> torch.fx.GraphModule | None:
        """The first captured (torch-level) graph."""
        return self.entry.gm if self.entry else None

    @property
    def guards(self) -> list[str]:
        """Each compiled frame's guard function, as Python text."""
        return [g for g in self.dynamo.guards if g]

    @property
    def symbols(self) -> dict[str, str]:
        """Each size symbol and where it is read: ``{"s0": "L['x'].size(0)"}``."""
        return {k: v for shapes in self.shapes for k, v in shapes.symbols.items()}

    @property
    def dynamic_dims(self) -> dict[str, list[int]]:
        """Each input's dimensions traced as symbols: ``{"L['x']": [0]}``."""
        return {k: v for shapes in self.shapes for k, v in shapes.dynamic_dims.items()}

    @property
    def shape_guards(self) -> list[str]:
        """The guards on symbolic sizes (ranges, then what the trace relied on)."""
        return [g for shapes in self.shapes for g in shapes.guards]

    # --- stage 2 ---------------------------------------------------------------------------
    @property
    def joint(self) -> torch.fx.GraphModule | None:
        return self.entry.aot.joint if self.entry and self.entry.aot else None

    @property
    def forward(self) -> torch.fx.GraphModule | None:
        return self.entry.aot.forward if self.entry and self.entry.aot else None

    @property
    def backward(self) -> torch.fx.GraphModule | None:
        return self.entry.aot.backward if self.entry and self.entry.aot else None

    @property
    def saved_values(self) -> list[str]:
        return list(self.entry.aot.saved_values) if self.entry and self.entry.aot else []

    # --- stages 3 and 4 ----------------------------------------------------------------------
    def graph(self, name: str) -> GraphArtefacts:
        """The stage-3/4 artefacts of the ``"forward"`` or ``"backward"`` graph."""
        graphs = self.entry.graphs if self.entry else []
        for artefacts in graphs:
            if artefacts.name == name:
                return artefacts
        have = [g.name for g in graphs]
        raise KeyError(f"no {name!r} graph was compiled (have: {have})")

    @property
    def kernels(self) -> list:
        """Every generated kernel (forward first), each with ``name``, ``source``, ``origins``."""
        return [k for e in self.entries for g in e.graphs for k in g.compiled.kernels]

    @property
    def eager_reason(self) -> str | None:
        """Why a whole graph runs eagerly (AOT refused a construct, e.g. ``resize_``), or None."""
        return "; ".join(e.eager_reason for e in self.entries if e.eager_reason) or None

    @property
    def fallbacks(self) -> list[str]:
        """What runs eagerly because toycomp cannot compile it (empty is good): ATen ops it
        cannot decompose, or the whole graph, with the reason, when AOT refused it."""
        whole = [f"whole graph: {self.eager_reason}"] if self.eager_reason else []
        return whole + [op for e in self.entries for g in e.graphs for op in g.fallbacks]

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
        counts = f"graph_count={self.graph_count}, graph_break_count={self.graph_break_count}"
        out = [("1. graphs and graph breaks", "\n".join([counts, *self.break_reasons]))]
        out += [(f"1. transformed code {i}", code) for i, code in enumerate(self.transformed_code)]
        out += [(f"1. guards {i}", text) for i, text in enumerate(self.guards)]
        out += [(f"1. dynamic shapes {i}", str(shapes)) for i, shapes in enumerate(self.shapes)]
        for i, entry in enumerate(self.entries):
            out += _entry_sections(entry, f"graph {i}: " if len(self.entries) > 1 else "")
        return out

    def __str__(self) -> str:
        return "\n\n".join(f"== {title} ==\n{text.rstrip()}" for title, text in self.sections())

    def __repr__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        """One paragraph: graphs, kernels, fallbacks."""
        head = [f"toycomp.explain: {self.graph_count} graph(s), "
                f"{self.graph_break_count} graph break(s)"]  # fmt: skip
        head += [f"  break: {reason}" for reason in self.break_reasons]
        if self.eager_reason is not None:
            return "\n".join([*head, f"toycomp.explain: runs eagerly\n  {self.eager_reason}"])
        if self.entry is None:
            return "\n".join(head or ["toycomp.explain: no graph"])
        counts = ", ".join(
            f"{g.name}: {len(g.compiled.kernels)} kernel(s)" for e in self.entries for g in e.graphs
        )
        nodes = sum(len(e.gm.graph.nodes) for e in self.entries)
        lines = [
            *head,
            f"toycomp.explain: {nodes} captured nodes, {len(self.guards)} guards",
            *([f"  dynamic sizes: {_symbols_text(self.symbols)}"] if self.symbols else []),
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


def _entry_sections(entry: CompiledEntry, prefix: str) -> list:
    """The sections of one captured graph, stage by stage."""
    out = [(f"1. {prefix}captured graph", _code(entry.gm))]
    if entry.eager_reason is not None:
        return out + [(f"{prefix}runs eagerly", entry.eager_reason)]
    aot = entry.aot
    if aot.joint is not None:
        out.append((f"2. {prefix}joint graph (ATen)", _code(aot.joint)))
    out.append((f"2. {prefix}forward graph (ATen)", _code(aot.forward)))
    if aot.backward is not None:
        out.append((f"2. {prefix}backward graph (ATen)", _code(aot.backward)))
        out.append((f"{prefix}saved for backward", ", ".join(aot.saved_values)))
    for g in entry.graphs:
        out.append((f"3. {prefix}{g.name} graph (prims)", _code(g.prims)))
        out.append((f"3. {prefix}{g.name} fallbacks to eager", ", ".join(g.fallbacks) or "none"))
        for kernel in g.compiled.kernels:
            out.append((f"4. {prefix}{g.name} {kernel.name} ({kernel.backend})", kernel.source))
        out.append((f"4. {prefix}{g.name} wrapper", g.compiled.wrapper_source))
    return out


def _code(gm: torch.fx.GraphModule) -> str:
    return gm.code.strip()


def _symbols_text(symbols: dict[str, str]) -> str:
    return ", ".join(f"{s} = {source}" for s, source in symbols.items())


def explain(
    fn: Callable,
    *example_inputs: Any,
    backend: str | None = None,
    partition: str = "min_cut",
    dynamic: bool | None = None,
    **kwargs: Any,
) -> Explanation:
    """Run every stage of toycomp on ``fn(*example_inputs, **kwargs)`` and keep what each made.

    Args:
        fn: a function or ``nn.Module``.
        *example_inputs: the inputs to trace with (tensors and Python values). They may be on
            the ``meta`` device: compiling computes nothing on them.
        backend: ``"cpp"``, ``"triton"`` or ``None`` as in ``toycomp.compile``.
        partition: ``"min_cut"`` or ``"default"`` as in ``toycomp.compile``.
        dynamic: as in ``toycomp.compile``; ``True`` (or inputs marked with
            ``toycomp.mark_dynamic``) shows the graphs with symbolic sizes, their symbols
            (``explanation.symbols``), dynamic dimensions and shape guards.
        **kwargs: keyword arguments for ``fn``.

    Returns:
        An ``Explanation``: print it, or display it in a notebook.

    ``fn`` is called once, compiled (like ``torch._dynamo.explain``): its Python side effects
    and in-place updates of the inputs happen once.
    """
    check_choices(backend, partition)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    compiler = GraphCompiler(backend, partition, name)
    context = CompileContext(compiler, dynamic=dynamic)
    out = context.frame_for(frame_target(fn))(*example_inputs, **kwargs)
    del out  # an Explanation keeps no tensors of the call
    entries = list(compiler.log)
    shapes = [r.shapes for r in context.log if r.shapes is not None]
    return Explanation(entries[0] if entries else None, entries, summarize(context), shapes)
