"""Common-subexpression elimination: an ATen graph -> the same graph, duplicate pure calls merged.

Input IR: an ATen-level FX graph, usually the joint graph of toycomp/aot/aot_autograd.py, where
autograd's formulas recompute values the forward already has. Output IR: a new graph in which
each pure call (same op, same arguments) appears once; kept nodes keep their names and meta.
``sin(x)**2 + cos(x)**2``'s joint graph computes ``sin`` and ``cos`` twice:

    >>> import torch
    >>> from toycomp.aot.aot_autograd import trace_joint
    >>> f = lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2
    >>> joint = trace_joint(f, [torch.randn(3, requires_grad=True)])
    >>> trig = (torch.ops.aten.sin.default, torch.ops.aten.cos.default)
    >>> [n.name for n in joint.graph.nodes if n.target in trig]
    ['sin', 'cos', 'sin_1', 'cos_1']
    >>> [n.name for n in fx_graph_cse(joint.graph).nodes if n.target in trig]
    ['sin', 'cos']

The min-cut partitioner (toycomp/aot/partitioners.py) runs it first.

NB: in PyTorch this lives in torch/_functorch/compile_utils.py (``fx_graph_cse``).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from toycomp._torch_compat import OpOverload, schema_of, tree_flatten

__all__ = ["fx_graph_cse", "is_random"]

aten = torch.ops.aten


# Ops that allocate without initialising: two results are not "the same value" (PyTorch skips
# aten.empty in fx_graph_cse too).
_UNINITIALIZED = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty}


def is_random(node: fx.Node) -> bool:
    """An op that draws from the RNG (ATen tags them ``nondeterministic_seeded``)."""
    target = node.target
    return isinstance(target, OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def _is_pure(node: fx.Node) -> bool:
    """A call whose result depends only on its arguments: safe to merge with an equal call."""
    target = node.target  # (a placeholder's or get_attr's target is a string)
    if not isinstance(target, OpOverload):
        return target is operator.getitem
    impure = schema_of(target).is_mutable or is_random(node)  # in place, or a draw from the RNG
    return not impure and target.overloadpacket not in _UNINITIALIZED


# [Note: CSE keys] A node's key is its target and the ``repr`` of its arguments, each argument
# node replaced by its merged copy (whose repr is its name, unique in the new graph). ``repr``
# keeps apart the constants that ``==`` would merge: ``pow(x, 2)`` and ``pow(x, 2.0)``,
# ``mul(x, 0.0)`` and ``mul(x, -0.0)``, ``True`` and ``1``, a list and a tuple; and it keys what
# ``hash`` cannot (a slice). A tensor constant is compared by value, never by its repr (which
# abbreviates large tensors), so a node taking one gets no key.
def _cse_key(node: fx.Node, env: dict[fx.Node, fx.Node]) -> tuple | None:
    """The key of [Note: CSE keys], or None if the node has none."""
    if any(isinstance(a, torch.Tensor) for a in tree_flatten((node.args, node.kwargs))[0]):
        return None
    return node.target, repr(fx.node.map_arg((node.args, node.kwargs), lambda n: env[n]))


# [Note: CSE before partitioning]
# The joint graph often computes a value twice: autograd's formula for ``sin`` recomputes
# ``cos(x)`` in the backward although the forward computed ``cos(x)`` for ``cos(x)**2``.
# Merged, the partitioner sees one ``cos`` that both halves need, and can decide once whether
# to save or recompute it. Random ops are never merged (two ``rand_like(x)`` are two draws),
# nor in-place or allocating ones; and a node the graph returns is never replaced by an
# earlier equal one (eager returned distinct tensors). Kept nodes keep their names and meta.
def fx_graph_cse(graph: fx.Graph) -> fx.Graph:
    """One node for equal calls of a pure op, in a new graph ([Note: CSE before partitioning])."""
    new_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    seen: dict[tuple, fx.Node] = {}
    returned = set(graph.output_node().all_input_nodes)
    for node in graph.nodes:
        key = _cse_key(node, env) if _is_pure(node) else None
        if key is not None and key in seen and node not in returned:
            env[node] = seen[key]
        else:
            env[node] = new_graph.node_copy(node, lambda n: env[n])
            seen.setdefault(key, env[node])  # (the None key is never looked up)
    new_graph.lint()
    return new_graph
