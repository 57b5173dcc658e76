"""Partitioners: joint forward+backward ATen graph -> forward graph + backward graph.

Input IR: the joint graph from toycomp/aot/aot_autograd.py's ``trace_joint``: placeholders
``primals_1..`` and ``tangents_1..``; outputs ``(forward outputs..., gradient per primal or
None)``; the first ``num_fwd_outputs`` outputs are the forward ones
(``joint.meta["num_fwd_outputs"]``).

Output IR: two ATen-level ``torch.fx.GraphModule``s and the names of the saved values::

    forward(primals...)            -> (forward outputs..., saved values...)
    backward(saved..., tangents...) -> (gradients that are not None...)

``default_partition`` is PyTorch's simplest policy: the forward graph is exactly what the forward
outputs need; everything else the backward needs is either saved (if the forward graph computes
it, primals included) or recomputed in the backward (``cos`` below). For ``f(x) = sin(x)``:

    >>> import torch
    >>> from toycomp.aot.aot_autograd import trace_joint
    >>> joint = trace_joint(torch.sin, [torch.randn(3, requires_grad=True)])
    >>> forward, backward, saved = default_partition(joint)
    >>> print(forward.code.strip())
    def forward(self, primals_1):
        sin = torch.ops.aten.sin.default(primals_1)
        return (sin, primals_1)
    >>> print(backward.code.strip())
    def forward(self, primals_1, tangents_1):
        cos = torch.ops.aten.cos.default(primals_1);  primals_1 = None
        mul = torch.ops.aten.mul.Tensor(tangents_1, cos);  tangents_1 = cos = None
        return (mul,)
    >>> saved
    ['primals_1']

``min_cut_rematerialization_partition`` chooses what to save by a minimum cut of a flow graph
weighted by the values' sizes, recomputing cheap pointwise and view ops in the backward; it first
merges duplicate nodes (``fx_graph_cse``, toycomp/aot/compile_utils.py):

    >>> f = lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2
    >>> joint = trace_joint(f, [torch.randn(3, requires_grad=True)])
    >>> default_partition(joint)[2], min_cut_rematerialization_partition(joint)[2]
    (['primals_1', 'sin', 'cos'], ['primals_1'])

NB: in PyTorch this lives in torch/_functorch/partitioners.py (``default_partition``,
``min_cut_rematerialization_partition``, ``solve_min_cut``, ``_extract_graph_with_inputs_outputs``,
``_extract_fwd_bwd_modules``).
"""

from __future__ import annotations

import math
import operator

import networkx as nx
import torch
import torch.fx as fx

from toycomp.aot.compile_utils import fx_graph_cse, is_random
from toycomp.symbolic_shapes import free_symbols, hint, is_symbolic, sym_expr

__all__ = [
    "RECOMPUTABLE_OPS", "VIEW_OPS", "default_partition", "extract_graph", "is_size",
    "min_cut_rematerialization_partition", "saved_bytes", "should_ban_recomputation",
    "solve_min_cut", "with_sizes",
]  # fmt: skip

aten = torch.ops.aten


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
        if node not in seen:
            seen.add(node)
            todo.extend(node.all_input_nodes if node not in stop else ())
    return seen


def extract_graph(joint: fx.GraphModule, inputs: list, outputs: list, nodes: set) -> fx.GraphModule:
    """A graph of ``nodes`` (joint's order, names, meta) from ``inputs`` to ``outputs``."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in joint.graph.nodes:
        if node in nodes and node not in env and node.op not in ("placeholder", "output"):
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[o] for o in outputs))
    graph.lint()
    return fx.GraphModule(joint, graph)


def is_size(node: fx.Node) -> bool:
    """Does ``node`` compute a size (a SymInt or an int), not a tensor?"""
    return is_symbolic(node.meta.get("val")) or type(node.meta.get("val")) is int


# [Note: saving sizes] With dynamic shapes the backward's inputs have symbolic sizes
# (``tangents_1`` is (s0, 3)), and its compiler must know every symbol of them at run time,
# not only those its ops read. Like PyTorch's partitioner (``saved_sym_nodes``), we save a
# node holding each such symbol (a SymInt primal, or ``aten.sym_size.int`` of a primal); the
# forward returns them after the saved tensors, and the backward takes them in that order.
# A size computed from the primals alone is a forward node in both partitioners: saving it
# costs nothing, and recomputing it in the backward could need the tensor it is read from.
def with_sizes(joint: fx.GraphModule, saved: list[fx.Node], tangents: list[fx.Node]) -> list:
    """The saved values, tensors first, then the sizes the backward needs."""
    saved = sorted(saved, key=is_size)  # (a stable sort: in graph order)
    if any(free_symbols(n.meta.get("val")) for n in saved + tangents):  # dynamic shapes
        saved += _symbol_holders(joint, saved + tangents, [n for n in saved if is_size(n)])
    return saved


def _symbol_holders(joint: fx.GraphModule, nodes: list[fx.Node], sizes: list[fx.Node]) -> list:
    """A node holding each symbol of ``nodes``' values that no size in ``sizes`` is."""
    bound = {sym_expr(n.meta["val"]) for n in sizes if is_symbolic(n.meta["val"])}
    holders: dict = {}
    for node in joint.graph.nodes:
        val = node.meta.get("val")
        if is_symbolic(val) and sym_expr(val).is_Symbol:
            holders.setdefault(sym_expr(val), node)
    extra = []
    for node in nodes:
        for symbol in sorted(free_symbols(node.meta.get("val")) - bound, key=str):
            if symbol not in holders:
                raise RuntimeError(f"partitioner: no node of the joint graph holds {symbol}")
            extra.append(holders[symbol])
            bound.add(symbol)
    return extra


def _forward_nodes(fwd_outputs: list[fx.Node], primals: list[fx.Node]) -> set[fx.Node]:
    """The joint nodes that the forward graph holds.

    [Note: what the forward graph holds]
    Exactly the ancestors of the forward outputs, plus every primal (the forward takes them
    all). A multi-output node (native_batch_norm...) cannot be saved as a tuple, so its
    getitem projections join the forward graph and are saved instead (PyTorch does the same).
    A size computed from the primals alone (``3 * primals_1``, ``sym_size(primals_2, 0)``) is
    a forward node too: saving it costs nothing, unlike the tensor it may be read from.
    """
    fwd_nodes = _ancestors(fwd_outputs) | set(primals)
    for node in primals[0].graph.nodes if primals else ():
        if is_size(node) and node.op == "call_function" and set(node.all_input_nodes) <= fwd_nodes:
            fwd_nodes.add(node)
    for node in list(fwd_nodes):
        if isinstance(node.meta.get("val"), (tuple, list)):
            fwd_nodes.update(u for u in node.users if u.target is operator.getitem)
    return fwd_nodes


def default_partition(
    joint: fx.GraphModule, *, num_fwd_outputs: int | None = None
) -> tuple[fx.GraphModule, fx.GraphModule, list[str]]:
    """Split a joint graph into forward and backward graphs, like PyTorch's default_partition.

    Args:
        joint: joint forward+backward graph (``trace_joint`` in aot_autograd.py).
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
    saved = with_sizes(joint, saved, tangents)  # [Note: saving sizes]
    fwd_nodes |= _ancestors(saved)
    if any(_is_primal(n) for n in bwd_nodes) or any(_is_tangent(n) for n in fwd_nodes):
        raise RuntimeError("default_partition: primals/tangents ended up on the wrong side")

    forward = extract_graph(joint, primals, fwd_outputs + saved, fwd_nodes)
    backward = extract_graph(joint, saved + tangents, bwd_outputs, bwd_nodes | set(tangents))
    return forward, backward, [n.name for n in saved]


# -- the min-cut partitioner ------------------------------------------------------------------
# [Note: what may be recomputed]
# Recomputing a value in the backward is cheap only if the backward's kernels can absorb it:
# pointwise ops fuse into the kernel that uses them (a few instructions per element, no memory
# traffic), views cost nothing. Like PyTorch's "fusible" / default_recomputable_ops list, we
# allow exactly those (and getitem); everything else computed by the forward is banned from
# recomputation: matmuls and convolutions (expensive), reductions and normalisations such as
# _log_softmax (they read their whole input again; PyTorch allows reductions whose output is not
# much smaller than their input), and random ops (a second draw gives different numbers, so the
# gradient would be wrong). as_strided is not in the list: its offsets are storage-absolute.
# PyTorch adds more heuristics (a bias towards values close to the backward, never recomputing
# a value the backward must write to memory anyway, is_materialized_backwards); toycomp weighs
# a value by its size in bytes only. A creation op with no tensor input (scalar_tensor from a
# Python number, full, zeros: PyTorch lists them among its recomputable ops) reads nothing, so
# it is recomputable too, unless random: the backward makes its own copy.
VIEW_OPS = frozenset({
    aten.view, aten._unsafe_view, aten.reshape, aten.t, aten.transpose, aten.permute,
    aten.expand, aten.squeeze, aten.unsqueeze, aten.slice, aten.select, aten.alias,
    aten.detach, aten.diagonal, aten.unfold,
})  # fmt: skip
_POINTWISE_OPS = frozenset({
    aten.add, aten.sub, aten.rsub, aten.mul, aten.div, aten.neg, aten.abs, aten.sign,
    aten.exp, aten.expm1, aten.log, aten.log1p, aten.log2, aten.sqrt, aten.rsqrt,
    aten.reciprocal, aten.pow, aten.sin, aten.cos, aten.tan, aten.tanh, aten.sigmoid,
    aten.erf, aten.relu, aten.gelu, aten.silu, aten.gelu_backward, aten.threshold_backward,
    aten.clamp, aten.clamp_min, aten.clamp_max, aten.maximum, aten.minimum, aten.where,
    aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge, aten.logical_not, aten.bitwise_not,
    aten._to_copy, aten.clone, aten.fill, aten.zeros_like, aten.ones_like, aten.full_like,
})  # fmt: skip
RECOMPUTABLE_OPS = VIEW_OPS | _POINTWISE_OPS


def should_ban_recomputation(node: fx.Node) -> bool:
    """True for a call the backward must not recompute ([Note: what may be recomputed])."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    packet = getattr(node.target, "overloadpacket", None)
    return is_random(node) or (bool(node.all_input_nodes) and packet not in RECOMPUTABLE_OPS)


# [Note: weights] Saving a tuple costs infinitely much (its ``getitem``s are saved instead), and so
# does saving a view (its base is: PyTorch's ``recompute_views``).
def _weight(node: fx.Node) -> float:
    """The cost of saving ``node``: its size in bytes ([Note: weights])."""
    val = node.meta.get("val")
    if is_size(node):  # a number: as cheap as it gets ([Note: saving sizes])
        return 1
    is_view = getattr(node.target, "overloadpacket", None) in VIEW_OPS
    if is_view or not isinstance(val, torch.Tensor):
        return math.inf
    return hint(val.numel()) * val.element_size()  # a symbolic size weighs its example value


def _tangent_closure(joint: fx.GraphModule, tangents: list[fx.Node]) -> set[fx.Node]:
    """The tangents and every node computed from them: these can only run in the backward."""
    closure = set(tangents)
    for node in joint.graph.nodes:
        if node.op != "output" and not closure.isdisjoint(node.all_input_nodes):
            closure.add(node)
    return closure


def _flow_graph(joint: fx.GraphModule, required_fw: set, required_bw: set) -> nx.DiGraph:
    """The flow graph of [Note: the flow graph], vertices named ``<node>_in`` / ``<node>_out``."""
    flow = nx.DiGraph()
    flow.add_nodes_from(["source", "sink"])
    for node in list(joint.graph.nodes)[:-1]:  # (the last node is the output)
        node_in, node_out = f"{node.name}_in", f"{node.name}_out"
        if node in required_bw:  # from a tangent: drains; a gradient the forward computes: saved
            flow.add_edge(node_out if node in required_fw else node_in, "sink", capacity=math.inf)
        if node in required_bw and node not in required_fw:
            continue
        banned = (node in required_fw or is_random(node)) and should_ban_recomputation(node)
        if node.op == "placeholder" or banned or (is_size(node) and node not in required_bw):
            flow.add_edge("source", node_in, capacity=math.inf)
        flow.add_edge(node_in, node_out, capacity=_weight(node))
        users = [f"{user.name}_in" for user in node.users if user.op != "output"]
        flow.add_edges_from([(node_out, user) for user in users], capacity=math.inf)
    return flow


# [Note: the flow graph]
# Each joint node ``n`` becomes two vertices joined by an edge ``n_in -> n_out`` whose
# capacity is what saving ``n`` costs (``_weight``); each use of ``n`` is an edge
# ``n_out -> user_in`` of infinite capacity. The source feeds every primal (the forward starts
# from them) and every forward node that must not be recomputed (``should_ban_recomputation``);
# every node computed from a tangent drains into the sink (it can only run in the backward),
# and so does every gradient. A finite cut between source and sink cuts only ``n_in -> n_out``
# edges: saving those nodes lets the backward compute all it needs from them and the
# tangents, recomputing the nodes on the sink's side. The minimum cut is the cheapest set.
def solve_min_cut(joint: fx.GraphModule, required_fw: set, required_bw: set) -> list[fx.Node]:
    """The nodes to save, in graph order: the minimum cut of [Note: the flow graph]."""
    flow = _flow_graph(joint, required_fw, required_bw)
    try:
        _, (source, sink) = nx.minimum_cut(flow, "source", "sink")
    except nx.NetworkXUnbounded as e:
        raise RuntimeError(_NO_FINITE_CUT) from e
    return [n for n in joint.graph.nodes if f"{n.name}_in" in source and f"{n.name}_out" in sink]


_NO_FINITE_CUT = (
    "min_cut_rematerialization_partition: the backward needs a value that can be neither saved "
    "nor recomputed (no finite cut)"
)


def min_cut_rematerialization_partition(
    joint: fx.GraphModule, *, num_fwd_outputs: int | None = None
) -> tuple[fx.GraphModule, fx.GraphModule, list[str]]:
    """``default_partition``, saving the cheapest values (by size) and recomputing the rest."""
    n_fwd = joint.meta["num_fwd_outputs"] if num_fwd_outputs is None else num_fwd_outputs
    joint = fx.GraphModule(joint, fx_graph_cse(joint.graph))
    outputs = list(joint.graph.output_node().args[0])
    fwd_outputs, bwd_outputs = outputs[:n_fwd], [o for o in outputs[n_fwd:] if o is not None]
    primals = [n for n in joint.graph.find_nodes(op="placeholder") if not _is_tangent(n)]
    tangents = [n for n in joint.graph.find_nodes(op="placeholder") if _is_tangent(n)]
    required_fw = _ancestors(fwd_outputs) | set(primals)
    required_bw = _tangent_closure(joint, tangents) | set(bwd_outputs)
    cut = set(solve_min_cut(joint, required_fw, required_bw))
    reached = _ancestors(bwd_outputs, stop=cut)  # the backward: it recomputes what is not cut
    saved = [n for n in joint.graph.nodes if n in reached and n in cut]
    if any(map(is_size, joint.graph.nodes)):  # dynamic shapes: [Note: saving sizes]
        saved = with_sizes(joint, saved, tangents)
    fwd_nodes = _ancestors(fwd_outputs + saved) | set(primals)
    forward = extract_graph(joint, primals, fwd_outputs + saved, fwd_nodes)
    backward = extract_graph(joint, saved + tangents, bwd_outputs, (reached - cut) | set(tangents))
    return forward, backward, [n.name for n in saved]


def saved_bytes(forward: fx.GraphModule, saved_values: list[str]) -> int:
    """Bytes of the saved values (each counted as if it had its own storage: views and inputs
    may in fact share memory with tensors that are alive anyway)."""
    vals = {n.name: n.meta.get("val") for n in forward.graph.nodes}
    tensors = [vals[name] for name in saved_values if isinstance(vals[name], torch.Tensor)]
    return sum(hint(t.numel()) * t.element_size() for t in tensors)  # sizes: example values
