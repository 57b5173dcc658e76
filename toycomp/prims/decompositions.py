"""Stage 3b: decompose an ATen graph into toycomp's primitives.

Input IR -> output IR: an ATen-level ``torch.fx.GraphModule`` (call_function targets are
``torch.ops.aten.X.overload``, as ``toycomp.aot`` or ``make_fx`` produce) -> a ``GraphModule`` whose
call_function targets are prims from ``toycomp.prims``, the matmul-like ops of ``EXTERN_OPS``, or,
for an ATen op with no decomposition, the ATen op itself kept as a visible FALLBACK
(``fallbacks(gm)`` lists them). Every node gets ``meta["val"]`` (a meta tensor: shape, dtype,
stride) and ``meta["aten_origin"]`` (the name of the ATen node it came from).

Tiny example, the forward of ``f(x) = sin(x)**2 + cos(x)**2``::

    sin = aten.sin(x);  pow_1 = aten.pow.Tensor_Scalar(sin, 2)        sin = prims.sin(x)
    cos = aten.cos(x);  pow_2 = aten.pow.Tensor_Scalar(cos, 2)   ->   mul = prims.mul(sin, sin)
    add = aten.add.Tensor(pow_1, pow_2)                                cos = prims.cos(x)
                                                                       mul_1 = prims.mul(cos, cos)
                                                                       add = prims.add(mul, mul_1)

A decomposition is an ordinary Python function registered for one or more ATen overloads and
written only with prims and Python arithmetic on sizes: the table ``DECOMPOSITIONS`` (in
``decomp_table.py``) is filled by ``pointwise_rules.py`` (pointwise), ``activation_rules.py``
(activations and their backwards), ``loss_rules.py`` (elementwise losses), ``nn_rules.py``
(softmax, nll_loss, matmuls, reductions, layer norm), ``index_rules.py`` (gathers and
scatters), ``shift_rules.py`` (pads, rolls, flips, cats), ``norm_rules.py`` (batch and group norm),
``pool_rules.py`` (max pooling) and ``view_rules.py`` (views, copies, creation), with
promotion/broadcast helpers in ``helpers.py``. ``decompose`` runs each one under
``prims.tracing(tracer)``: the prims it calls become FX nodes (the tracer, ``DecompTracer``, and
``Proxy`` live in ``decomp_tracer.py``; both are re-exported here).

NB: in PyTorch this lives in torch/_decomp/decompositions.py and torch/_refs.
"""

# [Note: Core ATen IR, PyTorch's prims and toycomp's prims]
# PyTorch has two decomposition targets. torch/_decomp/decompositions.py rewrites ATen into the
# "Core ATen IR" (~180 ops: still ``aten.add.Tensor`` with implicit broadcasting and promotion,
# ``aten.var_mean``, ``aten.convolution``...), which Inductor and torch.export consume: big enough
# that backends can pattern-match fused ops, small enough to lower by hand. torch/_refs rewrite
# ATen into ``torch._prims`` (~100 prims with PrimTorch's strict contract: same shapes and dtypes,
# explicit ``broadcast_in_dim`` / ``convert_element_type``), the path nvFuser used. toycomp takes
# the prims path with fewer prims (40), so inductor needs exactly one lowering per prim and no
# broadcasting or promotion logic at all; the price is longer graphs (softmax becomes 9 nodes)
# and no fused library kernels beyond the matmuls of EXTERN_OPS.

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
from torch import fx

import toycomp.prims as prims
from toycomp._torch_compat import (
    OpOverload,
    overload_name,
    returns_alias,
    schema_of,
)
from toycomp.prims import activation_rules, index_rules, nn_rules  # noqa: F401 (fill the table)
from toycomp.prims import avg_pool_rules, functional_rules, norm_rules, shift_rules  # noqa: F401
from toycomp.prims import loss_rules, pointwise_rules, pool_rules, view_rules  # noqa: F401
from toycomp.prims.decomp_table import CHECK_OPS, DECOMPOSITIONS, EXTERN_OPS, Unsupported
from toycomp.prims.decomp_tracer import (  # the tracer: Proxy, DecompTracer (re-exported)
    _META_MODE,
    DecompTracer,
    Proxy,
    _eval_op_on_meta,
    _meta_of,
    _node_of,
)
from toycomp.prims.symbolic_sizes import (
    SymbolicSizes,
    is_size_computation,
    symbolic_fake_mode,
)
from toycomp.tensor_utils import python_number_dtype, to_meta

aten = torch.ops.aten


# --- the pass --------------------------------------------------------------------------------
def decompose(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> fx.GraphModule:
    """Rewrite an ATen graph into prims, extern ops and visible ATen fallbacks (``fallbacks``
    lists them), given example tensors for its placeholders; a new GraphModule."""
    token = _META_MODE.set(symbolic_fake_mode(example_inputs))  # see the Note in that module
    try:
        return _decompose(gm, example_inputs)
    finally:
        _META_MODE.reset(token)


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    with _META_MODE.get(contextlib.nullcontext()):
        return to_meta(t)


def _decompose(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> fx.GraphModule:
    graph = fx.Graph()
    tracer = DecompTracer(graph)
    env: dict[fx.Node, Any] = {}
    inputs = iter(example_inputs)
    for node in gm.graph.nodes:
        tracer.origin, tracer.aten_node = node.name, node  # (as_strided reads its layout)
        if node.op in ("placeholder", "get_attr"):
            env[node] = _copy_input(gm, graph, node, inputs, tracer.sizes)
        elif node.op == "call_function":
            env[node] = _decompose_node(tracer, node, env)
        elif node.op == "output":
            _copy_output(graph, node, env, tracer.sizes)
        else:
            raise NotImplementedError(f"toycomp.decompositions: {node.op} node {node.name}")
    graph.eliminate_dead_code()
    if any(n.target in CHECK_OPS for n in graph.nodes):  # (checks that raise as eager does)
        _hoist_checks(graph)
    graph.lint()
    return fx.GraphModule(gm, graph)


# A check ([Note: checks that raise as eager does]) moves to just after its input: an
# nll_loss's target check, emitted after the log_softmax, would otherwise stand between the
# log_softmax kernel and the loss that the scheduler fuses with it.
def _hoist_checks(graph: fx.Graph) -> None:
    """Move each check to just after its inputs."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    inputs = [n for n in graph.nodes if n.op == "placeholder"]  # (a get_attr may come later)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in CHECK_OPS:
            after = max([*inputs[-1:], *node.all_input_nodes], key=order.__getitem__)
            after.append(node)  # (moving it earlier keeps the others' relative order)


def _copy_output(graph: fx.Graph, node: fx.Node, env: dict[fx.Node, Any], sizes: Any) -> None:
    """The output node; its values laid out as the ATen graph's are (the strides eager gives,
    which the backward's example inputs have too), the prims' meta values where unknown."""

    def val(n: fx.Node) -> Any:
        aten_val = n.meta.get("val")
        return _to_meta(aten_val) if isinstance(aten_val, torch.Tensor) else _meta_of(env[n])

    out = graph.output(_node_of(fx.node.map_arg(node.args[0], env.__getitem__), sizes.node))
    out.meta["aten_origin"] = node.name
    out.meta["val"] = fx.node.map_arg(node.args[0], val)


def _copy_input(
    gm: fx.GraphModule, graph: fx.Graph, node: fx.Node, inputs: Any, sizes: "SymbolicSizes"
) -> Any:
    """A placeholder (a tensor, or a number: a size such as Dynamo's s0) or a get_attr tensor."""
    placeholder = node.op == "placeholder"
    value = next(inputs, None) if placeholder else getattr(gm, node.target)
    new = graph.placeholder(node.name) if placeholder else graph.get_attr(node.target)
    number = placeholder and isinstance(value, (int, float, torch.SymInt, torch.SymFloat))
    if not number and not isinstance(value, torch.Tensor):
        raise TypeError(f"toycomp.decompositions: input {node.name} is not a tensor: {value!r}")
    new.meta["val"], new.meta["aten_origin"] = (value if number else _to_meta(value)), node.name
    if placeholder:
        sizes.add_input(new, new.meta["val"])
    return value if number else Proxy(new, new.meta["val"], value.device)


def _decompose_node(tracer: DecompTracer, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args = fx.node.map_arg(node.args, env.__getitem__)
    kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
    target = node.target
    if is_size_computation(node):  # sym_size(x, 0) * 4: computed now, a node again where used
        return target(*_meta_of(args), **_meta_of(kwargs))
    if target is operator.getitem and isinstance(args[0], (list, tuple)):  # a rule's results
        return args[0][args[1]]
    mutable = isinstance(target, OpOverload) and schema_of(target).is_mutable
    if mutable and target not in DECOMPOSITIONS:  # else the rule decides: [Note: batch norm]
        return _decompose_inplace(tracer, node, env, args, kwargs)
    return _decompose_op(tracer, node, target, args, kwargs)


def _wrap_numbers(node: fx.Node, target: Any, args: Any, kwargs: Any) -> Any:
    """``aten.add.Tensor(4, 3.3)``: a tensor op called with numbers only. Eager wraps the
    numbers into 0-d tensors (``tensor(7.3000)``); the rules expect at least one tensor, so the
    first argument becomes a 0-d ``prims.full`` of its Python dtype (promotion is unchanged: a
    0-d tensor and a number of another kind give the number's default dtype, as eager does)."""
    val = node.meta.get("val")
    schema = schema_of(target) if isinstance(target, OpOverload) else None
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    if (
        not isinstance(val, torch.Tensor)
        or schema is None
        or schema.arguments[0].type != "Tensor"
        or any(isinstance(v, (Proxy, torch.Tensor)) for v in leaves)
    ):
        return args
    first = prims.full([], args[0], python_number_dtype(args[0]), val.device)
    return (first, *args[1:])


def _decompose_op(tracer: DecompTracer, node: fx.Node, target: Any, args: Any, kwargs: Any) -> Any:
    if target in EXTERN_OPS or target is operator.getitem:  # (getitem: of an extern op's results)
        return tracer.emit(target, args, kwargs)
    if target not in DECOMPOSITIONS:
        return _fallback(tracer, node, target, args, kwargs, "no decomposition")
    if args and isinstance(args[0], (bool, int, float)):  # aten.add.Tensor(4, 3.3)
        with prims.tracing(tracer):  # (before the mark: a refused rule's fallback reads it)
            args = _wrap_numbers(node, target, args, kwargs)
    mark = len(tracer.emitted)
    try:
        with prims.tracing(tracer):
            out = DECOMPOSITIONS[target](*args, **kwargs)
    except Unsupported as e:  # the rule refuses these arguments: the ATen op itself, visibly
        _roll_back(tracer, mark)
        return _fallback(tracer, node, target, args, kwargs, str(e))
    _check_result(node, target, args, kwargs, out)
    return out


def _roll_back(tracer: DecompTracer, mark: int) -> None:
    """Erase the nodes a decomposition emitted before it refused (``Unsupported``)."""
    for n in reversed(tracer.emitted[mark:]):
        tracer.graph.erase_node(n)
    del tracer.emitted[mark:]


def _fallback(
    tracer: DecompTracer, node: fx.Node, target: Any, args: Any, kwargs: Any, reason: str
) -> Any:
    """Emit the ATen op ``target`` as it is (an extern call to eager PyTorch at run time)."""
    try:
        out = tracer.emit(target, args, kwargs)
    except RuntimeError:  # no meta kernel: trust the value recorded when the graph was traced
        val = node.meta.get("val")
        several = isinstance(val, (tuple, list))  # _histogramdd_bin_edges: a tuple of tensors
        vals = list(val) if several else [val]
        if not vals or not all(isinstance(v, torch.Tensor) for v in vals):
            raise
        if node.target is not target:
            raise
        meta = [_to_meta(v) for v in vals]
        out = tracer.emit(target, args, kwargs, val=meta if several else meta[0])
    out.node.meta["fallback_reason"] = reason
    return out


def _check_result(node: fx.Node, target: Any, args: Any, kwargs: Any, out: Any) -> None:
    """A decomposition must give the ATen op's shapes and dtypes (a cheap guard against bugs)."""
    if getattr(out, "node", None) is not None and out.node.meta.get("eager_sizes"):
        return  # sizes eager gave for the CPU kernel, not the meta kernel's (embedding_bag)
    expected = node.meta.get("val") if node.target is target else None  # in-place: see below
    if expected is None:
        expected = _eval_op_on_meta(target, args, kwargs)[0]
    got = list(out) if isinstance(out, (list, tuple)) else [out]
    want = list(expected) if isinstance(expected, (list, tuple)) else [expected]
    for g, w in zip(got, want, strict=True):
        if g is None:  # an output its output_mask leaves undefined (a backward's grad_input)
            continue
        if isinstance(w, torch.Tensor) and (g.shape != w.shape or g.dtype != w.dtype):
            raise _wrong_result(node, target, g, w)


def _wrong_result(node: fx.Node, target: Any, got: Any, want: torch.Tensor) -> RuntimeError:
    return RuntimeError(
        f"toycomp.decompositions: decomposition of {target} (node {node.name}) gave "
        f"{got.dtype}{list(got.shape)}, ATen gives {want.dtype}{list(want.shape)}"
    )


# [Note: in-place ops]
# toycomp.aot functionalizes, so its graphs hold no in-place ops. A graph from elsewhere may:
# ``relu_(exp(x))``. We rewrite ``op_(self, ...)`` as the functional ``op(self, ...)`` and make
# every later use of ``self`` read the result instead - which is only correct when nothing else
# can see the mutated storage: ``self`` must be a fresh intermediate (not a graph input, not a
# view) that nothing views. Otherwise we refuse loudly; keeping the in-place op would be wrong
# too, because identity-like decompositions (clone -> same value) may have made it alias
# something else.
def _decompose_inplace(
    tracer: DecompTracer, node: fx.Node, env: dict[fx.Node, Any], args: Any, kwargs: Any
) -> Any:
    op = node.target
    name = schema_of(op).name.split("::")[-1]
    packet = getattr(aten, name[:-1], None) if name.endswith("_") else None
    functional = getattr(packet, overload_name(op), None) if packet is not None else None
    group = _alias_group(node.args[0], tracer.alias_root) if functional is not None else None
    if group is None:
        raise RuntimeError(
            f"toycomp.decompositions: in-place {op} (node {node.name}) mutates a graph input or "
            "a view; functionalize the graph first (toycomp.aot does)"
        )
    out = _decompose_op(tracer, node, functional, args, kwargs)
    if out.dtype != args[0].dtype:
        with prims.tracing(tracer):
            out = prims.convert_element_type(out, args[0].dtype)
    for member in group:
        env[member] = out
    tracer.alias_root[node] = group[0]
    return out


def _alias_group(self_node: fx.Node, alias_root: dict[fx.Node, fx.Node]) -> list[fx.Node] | None:
    """``self_node``'s storage owner and the in-place results aliasing it; None if anything else
    (a graph input, a view) may alias it."""
    root = alias_root.get(self_node, self_node)
    if root.op != "call_function" or not isinstance(root.target, OpOverload):
        return None
    if returns_alias(root.target) or schema_of(root.target).is_mutable:
        return None
    group = [root] + [n for n, r in alias_root.items() if r is root]
    for member in group:
        for user in member.users:
            t = user.target
            if isinstance(t, OpOverload) and returns_alias(t) and not schema_of(t).is_mutable:
                return None
    return group


def fallbacks(gm: fx.GraphModule) -> list[str]:
    """Names of the ATen ops kept as fallbacks in a decomposed graph, in graph order, no repeats."""
    names: dict[str, None] = {}
    for node in gm.graph.nodes:
        t = node.target
        if node.op != "call_function" or prims.is_prim(t) or t in EXTERN_OPS:
            continue
        if t is not operator.getitem and not is_size_computation(node):  # (sizes: not an op)
            names[str(t)] = None
    return list(names)

