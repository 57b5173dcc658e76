"""Drawings of every IR in the pipeline, as deterministic graphviz DOT text.

Input -> output: a ``torch.fx.GraphModule`` (any stage: captured, joint, forward/backward,
decomposed) -> a ``Drawing`` that shows as SVG in a notebook (when the graphviz ``dot`` program is
installed) and as text everywhere else::

    >>> import torch, torch.fx, toycomp
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) ** 2)
    >>> drawing = toycomp.viz.draw(gm, title="captured")   # a notebook shows it as SVG
    >>> print(drawing.source.splitlines()[0])              # the DOT text
    digraph captured {

Saved values (what the forward graph keeps for the backward) are drawn in orange; fused groups
(the kernels inductor made) are drawn as boxes around the nodes they contain; stored values (the
buffers that go to memory) get a thick red outline and their buffer's name.

NB: PyTorch has torch.fx.passes.graph_drawer.FxGraphDrawer (pydot), which draws one node per FX
node with all its metadata; ours is smaller so that the picture of sin**2 + cos**2 stays readable.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Iterable, Mapping

import torch
import torch.fx

_SAVED_COLOR = "#f5a623"
_INPUT_COLOR = "#d6eaf8"
_OUTPUT_COLOR = "#d5f5e3"
_STORED_COLOR = "#c0392b"
_DOT_HINT = (
    "(install the graphviz 'dot' program to see this as a picture: "
    "sudo apt-get install graphviz / brew install graphviz / conda install graphviz)"
)

_DTYPE_ABBR = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.bool: "b8", torch.uint8: "u8",
}  # fmt: skip


def describe_value(node: torch.fx.Node) -> str:
    """``f32[32, 10]`` for a node whose ``meta["val"]`` is a tensor, else ``""``."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return ""
    return f"{_DTYPE_ABBR.get(val.dtype, str(val.dtype))}{list(val.shape)}"


def target_name(node: torch.fx.Node) -> str:
    """A short readable name for what a node calls: ``aten.sin``, ``prims.sin``, ``torch.sin``."""
    target = node.target
    if node.op == "call_method":
        return f".{target}"
    if type(target).__name__ == "OpOverload":  # torch.ops.aten.sin.default -> "aten.sin"
        return ".".join(str(target).split(".")[:2])
    module = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", str(target))
    if module.startswith("toycomp.prims"):
        return f"prims.{name}"
    if module.startswith("torch") or module == "_operator" or module == "operator":
        return f"{'torch' if module.startswith('torch') else 'operator'}.{name}"
    return name


@dataclass(frozen=True)
class Drawing:
    """A graph drawing: ``.source`` is the DOT text; notebooks show it as an SVG picture."""

    source: str
    text: str

    def _repr_svg_(self) -> str | None:
        if shutil.which("dot") is None:
            return None  # Jupyter then shows __repr__, the text version with an install hint
        import graphviz  # imported on use: toycomp itself runs without the bindings

        return graphviz.Source(self.source).pipe(format="svg", encoding="utf-8")

    def __repr__(self) -> str:
        hint = "" if shutil.which("dot") else "\n" + _DOT_HINT
        return self.text + hint


def _node_attrs(
    node: torch.fx.Node, saved: set[str], stored: Mapping[str, str]
) -> dict[str, str]:
    value = describe_value(node)
    if node.op == "placeholder":
        label, attrs = node.name, {"shape": "ellipse", "style": "filled", "fillcolor": _INPUT_COLOR}
    elif node.op == "output":
        label, attrs = "output", {"shape": "ellipse", "style": "filled", "fillcolor": _OUTPUT_COLOR}
    elif node.op == "get_attr":
        label, attrs = f"{node.name}\\n(constant)", {"shape": "box"}
    else:
        label, attrs = f"{node.name}\\n{target_name(node)}", {"shape": "box"}
    if value:
        label += f"\\n{value}"
    if node.name in saved:
        attrs = {**attrs, "style": "filled,bold", "fillcolor": _SAVED_COLOR}
        label += "\\n(saved for backward)"
    if node.name in stored:
        attrs = {**attrs, "color": _STORED_COLOR, "penwidth": "3"}
        label += f"\\nstored: {stored[node.name]}"
    return {"label": label, **attrs}


def format_args(node: torch.fx.Node) -> str:
    """``sin, 2`` for ``pow(sin, 2)``: node arguments by name, constants as written."""
    parts = [str(a) for a in node.args] + [f"{k}={v}" for k, v in node.kwargs.items()]
    return ", ".join(parts)


def _text_lines(
    gm: torch.fx.GraphModule, saved: set[str], group_of: Mapping[str, str], stored: Mapping
) -> list[str]:
    lines = []
    for node in gm.graph.nodes:
        inputs = "" if node.op == "placeholder" else format_args(node)
        what = node.op if node.op in ("placeholder", "output") else target_name(node)
        extra = [describe_value(node)] if describe_value(node) else []
        if node.name in saved:
            extra.append("saved")
        if node.name in stored:
            extra.append(f"stored: {stored[node.name]}")
        if node.name in group_of:
            extra.append(group_of[node.name])
        tail = f"   [{', '.join(extra)}]" if extra else ""
        lines.append(f"  {node.name} = {what}({inputs}){tail}")
    return lines


def draw(
    gm: torch.fx.GraphModule,
    *,
    title: str = "graph",
    saved: Iterable[str] = (),
    groups: Mapping[str, Iterable[str]] | None = None,
    stored: Mapping[str, str] | None = None,
) -> Drawing:
    """Draw an FX graph.

    Args:
        gm: the GraphModule of any stage.
        title: shown above the picture.
        saved: node names to mark as saved for the backward pass.
        groups: ``{"kernel_0": ["sin", "mul", ...], ...}``: nodes boxed together (fused kernels).
        stored: ``{"sin": "buf1", ...}``: nodes whose value is stored in memory, and the buffer.

    Returns:
        A ``Drawing``: SVG in notebooks, text (with the DOT source in ``.source``) elsewhere.
    """
    import graphviz  # imported on use: toycomp itself runs without the bindings

    saved, stored = set(saved), dict(stored or {})
    group_of = {name: group for group, names in (groups or {}).items() for name in names}
    dot = graphviz.Digraph(name=title, graph_attr={"label": title, "labelloc": "t", "rankdir": "TB"})
    dot.attr("node", fontname="Helvetica", fontsize="11")
    clusters: dict[str, graphviz.Digraph] = {}
    for group in (groups or {}):
        cluster = graphviz.Digraph(name=f"cluster_{group}")
        cluster.attr(label=group, style="rounded,dashed", color="#4a90d9", fontcolor="#4a90d9")
        clusters[group] = cluster
    for node in gm.graph.nodes:
        target = clusters.get(group_of.get(node.name, ""), dot)
        target.node(node.name, **_node_attrs(node, saved, stored))
    for cluster in clusters.values():
        dot.subgraph(cluster)
    for node in gm.graph.nodes:
        for arg in node.all_input_nodes:
            dot.edge(arg.name, node.name)
    text = "\n".join([f"{title}:"] + _text_lines(gm, saved, group_of, stored))
    return Drawing(dot.source, text)
