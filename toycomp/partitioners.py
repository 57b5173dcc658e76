"""Partitioners: joint forward+backward ATen graph -> forward graph + backward graph.

Input IR: the joint graph from ``toycomp.aot.trace_joint``: placeholders ``primals_1..`` and
``tangents_1..``; outputs ``(forward outputs..., gradient per primal or None)``; the first
``num_fwd_outputs`` outputs are the forward ones (``joint.meta["num_fwd_outputs"]``).

Output IR: two ATen-level ``torch.fx.GraphModule``s and the names of the saved values::

    forward(primals...)            -> (forward outputs..., saved values...)
    backward(saved..., tangents...) -> (gradients that are not None...)

Tiny example, ``f(x) = sin(x)``::

    joint:    sin = aten.sin(primals_1); cos = aten.cos(primals_1)
              mul = aten.mul(tangents_1, cos); return (sin, mul)
    forward:  sin = aten.sin(primals_1); return (sin, primals_1)        # saved: [primals_1]
    backward: cos = aten.cos(primals_1); mul = aten.mul(tangents_1, cos); return (mul,)

``default_partition`` is PyTorch's simplest policy: the forward graph is exactly what the forward
outputs need; everything else the backward needs is either saved (if the forward graph computes
it, primals included) or recomputed in the backward (``cos`` above). Cleverer policies
(``min_cut_rematerialization_partition``) choose what to save versus recompute by a min-cut.

NB: in PyTorch this lives in torch/_functorch/partitioners.py (``default_partition``,
``_extract_graph_with_inputs_outputs``, ``_extract_fwd_bwd_modules``).
"""

from __future__ import annotations

import operator

import torch.fx as fx

__all__ = ["default_partition", "extract_graph"]


def _is_primal(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" not in str(node.target)


def _is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


def _ancestors(roots: list[fx.Node], stop: set[fx.Node] = frozenset()) -> set[fx.Node]:
    """Every node that ``roots`` depend on, walking no further than the nodes in ``stop``."""
    seen: set[fx.Node] = set()
    todo = [r for r in roots if r is not None]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in stop:
            todo.extend(node.all_input_nodes)
    return seen


def extract_graph(
    joint: fx.GraphModule,
    inputs: list[fx.Node],
    outputs: list[fx.Node],
    nodes: set[fx.Node],
) -> fx.GraphModule:
    """Copy ``nodes`` (in the joint's order) into a new graph with ``inputs`` as placeholders.

    Node names and ``meta`` are kept, so ``sin`` in the joint is ``sin`` in the forward graph.

    Args:
        joint: the graph module the nodes come from (also the root for ``get_attr`` constants).
        inputs: joint nodes that become the new graph's placeholders, in order.
        outputs: joint nodes the new graph returns, as a tuple, in order.
        nodes: joint nodes to copy (must be closed under inputs, apart from ``inputs``).

    Returns:
        The new, linted ``GraphModule``.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in joint.graph.nodes:
        if node in nodes and node not in env and node.op not in ("placeholder", "output"):
            env[node] = graph.node_copy(node, lambda n: env[n])
        elif node in nodes and node.op == "placeholder" and node not in env:
            raise RuntimeError(f"partitioner: {node.name} is needed but is not an input")
    graph.output(tuple(env[o] for o in outputs))
    graph.lint()
    return fx.GraphModule(joint, graph)


def _forward_nodes(fwd_outputs: list[fx.Node], primals: list[fx.Node]) -> set[fx.Node]:
    """The joint nodes that the forward graph holds.

    [Note: what the forward graph holds]
    Exactly the ancestors of the forward outputs, plus every primal (the forward takes them
    all). A multi-output node (native_batch_norm...) cannot be saved as a tuple, so its
    getitem projections join the forward graph and are saved instead (PyTorch does the same).
    """
    fwd_nodes = _ancestors(fwd_outputs) | set(primals)
    for node in list(fwd_nodes):
        if isinstance(node.meta.get("val"), (tuple, list)):
            fwd_nodes.update(u for u in node.users if u.target is operator.getitem)
    return fwd_nodes


def default_partition(
    joint: fx.GraphModule, *, num_fwd_outputs: int | None = None
) -> tuple[fx.GraphModule, fx.GraphModule, list[str]]:
    """Split a joint graph into forward and backward graphs, like PyTorch's default_partition.

    Args:
        joint: joint forward+backward graph (``toycomp.aot.trace_joint``).
        num_fwd_outputs: how many leading outputs are forward outputs; defaults to
            ``joint.meta["num_fwd_outputs"]``.

    Returns:
        ``(forward_gm, backward_gm, saved_values)``: ``forward_gm(*primals)`` returns the forward
        outputs then the saved values; ``backward_gm(*saved, *tangents)`` returns the non-None
        gradients in primal order; ``saved_values`` lists the saved nodes' names.
    """
    if num_fwd_outputs is None:
        num_fwd_outputs = joint.meta["num_fwd_outputs"]
    outputs = list(joint.graph.output_node().args[0])
    fwd_outputs = outputs[:num_fwd_outputs]
    bwd_outputs = [o for o in outputs[num_fwd_outputs:] if o is not None]
    primals = [n for n in joint.graph.nodes if _is_primal(n)]
    tangents = [n for n in joint.graph.nodes if _is_tangent(n)]
    fwd_nodes = _forward_nodes(fwd_outputs, primals)
    # The backward graph: ancestors of the gradients, stopping at forward nodes. The forward
    # nodes where the walk stops are the saved values; everything else is recomputed.
    # Constants (get_attr) are never saved: both graphs simply read them.
    savable = {n for n in fwd_nodes if n.op != "get_attr"}
    reached = _ancestors(bwd_outputs, stop=savable)
    bwd_nodes = {n for n in reached if n not in savable}
    saved = [n for n in joint.graph.nodes if n in reached and n in savable]
    if any(_is_primal(n) for n in bwd_nodes) or any(_is_tangent(n) for n in fwd_nodes):
        raise RuntimeError("default_partition: primals/tangents ended up on the wrong side")

    forward = extract_graph(joint, primals, fwd_outputs + saved, fwd_nodes)
    backward = extract_graph(joint, saved + tangents, bwd_outputs, bwd_nodes | set(tangents))
    return forward, backward, [n.name for n in saved]
