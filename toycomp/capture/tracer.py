"""The tracer: a Python function + example inputs -> a torch-level FX graph + guards.

``capture(fn, *example_inputs)`` runs ``fn`` once, eagerly, on the real example inputs, while a
``TorchFunctionMode`` watches every torch-level call (operators on tensors, ``torch.*``, tensor
methods, ``torch.nn.functional``). Each call is executed for real *and* appended to a
``torch.fx.Graph``; each result tensor is remembered as the output of its node:

    >>> import torch
    >>> def f(x):
    ...     return torch.sin(x) ** 2 + torch.cos(x) ** 2
    >>> captured = capture(f, torch.randn(1000))
    >>> print(captured.gm.code.strip())
    def forward(self, x):
        sin = torch.sin(x)
        pow_1 = sin ** 2;  sin = None
        cos = torch.cos(x);  x = None
        pow_2 = cos ** 2;  cos = None
        add = pow_1 + pow_2;  pow_1 = pow_2 = None
        return (add,)
    >>> for guard in captured.guards[2:5]:
    ...     print(guard)
    x.shape == (1000,)
    x.stride() == (1,)
    x.dtype == torch.float32

nn.Modules are inlined (their ``forward`` just runs); parameters, buffers and tensors read from
globals or closures are *lifted* to extra graph inputs after the user's inputs. Which calls are
recorded and which break the graph is decided by toycomp/capture/rules.py, where each node comes
from in the user's code by source_lines.py; the capture run's in-place updates and RNG draws are
undone by side_effects.py; the result is a ``CapturedGraph`` (captured_graph.py).

How this differs from TorchDynamo: Dynamo does not run ``fn``. It interprets the *bytecode* of the
frame symbolically (with fake tensors), so it sees every Python operation, not only torch calls.
When it meets something it cannot trace it compiles the partial graph so far, emits bytecode that
runs the offending instruction eagerly, and continues in a generated *resume function* that is
captured again. toycomp's tracer only sees torch calls, so on such a construct it gives up on the
whole function: it reports a ``GraphBreak`` and the caller runs ``fn`` eagerly.

NB: in PyTorch this lives in torch/_dynamo/ (symbolic_convert.py interprets bytecode,
output_graph.py builds the FX graph, guards.py builds guards).
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import types
from typing import Any, Callable

import torch
import torch.fx
from torch.overrides import TorchFunctionMode

from toycomp._torch_compat import _set_grad_enabled, tree_flatten
from toycomp.capture import guards as G
from toycomp.capture import rules as R
from toycomp.capture.captured_graph import CapturedGraph, ConstantOutput, LiftedTensor
from toycomp.capture.rules import GraphBreakError
from toycomp.capture.side_effects import CreationTracker, SideEffects, storage_ptr
from toycomp.capture.source_lines import (
    GraphBreak,
    Location,
    definition_site,
    graph_break_at,
    node_source_meta,
    user_location,
)
from toycomp.tensor_utils import to_meta

__all__ = ["capture"]


def capture(fn: Callable, *example_inputs: Any, **example_kwargs: Any) -> CapturedGraph:
    """Trace ``fn`` on real example inputs into a torch-level FX graph with guards.

    ``fn`` runs once eagerly on the example inputs, so its side effects (in-place updates of
    inputs, parameters, buffers; random numbers drawn) have happened once, as in an eager call,
    and its result is kept in ``example_outputs``. To run the graph for this same call instead,
    call ``undo_side_effects()`` first. On a graph break this undo is done already, so the caller
    can simply run ``fn`` eagerly.

    Args:
        fn: a function or ``nn.Module`` taking tensors and Python constants.
        *example_inputs: positional example arguments.
        **example_kwargs: keyword example arguments.

    Returns:
        A CapturedGraph. When the tracer hit a construct it cannot capture, ``gm`` is None and
        ``graph_break`` says what and where (no exception is raised).
    """
    signature = G.signature_of(fn)
    leaves, structure = G.flatten_user_inputs(signature, example_inputs, example_kwargs)
    state_guards, state_readers = G.state_guards(fn)
    guards = G.input_guards(leaves, structure) + state_guards
    result = CapturedGraph(fn, None, guards, signature=signature, state_readers=state_readers)
    tracer = _Tracer(fn)
    try:
        tracer.add_inputs(leaves)
        out = tracer.run(fn, example_inputs, example_kwargs)
        result.output_spec, result.output_leaves = tracer.add_outputs(out)
    except Exception as e:  # fn may also fail *because* it caught a GraphBreakError
        if not isinstance(e, GraphBreakError) and tracer.graph_break is None:
            raise
        tracer.graph_break = tracer.graph_break or tracer.locate(str(e))
    result.side_effects = tracer.side_effects
    if tracer.graph_break is not None:
        result.graph_break = tracer.graph_break
        try:
            result.undo_side_effects()  # so that the caller can run fn eagerly instead
        except RuntimeError as e:
            reason = f"{result.graph_break.reason} [{e}]"
            result.graph_break = dataclasses.replace(result.graph_break, reason=reason)
        return result
    result.gm = torch.fx.GraphModule(torch.nn.Module(), tracer.graph)
    result.gm.graph.lint()
    result.lifted = tracer.lifted
    result.example_outputs = out
    result.example_inputs = [t for _, t in leaves if isinstance(t, torch.Tensor)]
    result.example_inputs += [lifted.fetch() for lifted in tracer.lifted]
    for lifted in tracer.lifted:
        result.guards += G.tensor_guards(lifted.name, lifted.fetch())
    return result


# ----------------------------------------------------------------------------------------------
# The tracer
# ----------------------------------------------------------------------------------------------

class _CaptureMode(TorchFunctionMode):
    """Sends every torch-level call to the tracer.

    While ``__torch_function__`` runs, PyTorch pops the mode, so the torch calls made *inside*
    ``func`` (F.linear inside nn.Linear, aten ops inside F.cross_entropy) are not seen: only the
    outermost call is recorded.
    """

    def __init__(self, tracer: _Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.tracer.handle(func, types, args, kwargs or {})


class _Tracer:
    """Builds the FX graph while ``fn`` runs; ``env`` maps live tensors to the nodes making them."""

    def __init__(self, fn: Callable):
        self.graph = torch.fx.Graph()
        # id -> (tensor, node); holding the tensor keeps its id from being reused.
        self.env: dict[int, tuple[torch.Tensor, torch.fx.Node]] = {}
        self.lifted: list[LiftedTensor] = []
        self.known_sources = G.lifted_tensor_sources(fn)
        self.last_placeholder: torch.fx.Node | None = None
        self.graph_break: GraphBreak | None = None
        self.root_frame: types.FrameType | None = None
        self.side_effects = SideEffects()
        self.creations = CreationTracker(self.side_effects)
        self.traced_storages: set[int] = set()  # storages of tensors computed by graph nodes
        self.fn_code = getattr(getattr(fn, "forward", fn), "__code__", None)

    # -- inputs and outputs ------------------------------------------------------------------

    def add_inputs(self, leaves: list[tuple[str, Any]]) -> None:
        for source, value in leaves:
            if isinstance(value, torch.nn.Module):  # its tensors would be frozen, unguarded
                raise GraphBreakError(
                    f"argument {source} is an nn.Module: capture the module itself, or close "
                    "over it, so its parameters are lifted"
                )
            if isinstance(value, torch.Tensor):
                R.check_tensor_type(value, f"input {source}")
                node = self._placeholder(G.placeholder_name(source), value)
                if id(value) not in self.env:
                    self._bind(value, node)  # the same tensor passed twice: first one wins

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        self.root_frame = inspect.currentframe()
        self.side_effects.start()
        try:
            with self.creations, _CaptureMode(self):
                return fn(*args, **kwargs)
        finally:
            self.side_effects.finish()

    def add_outputs(self, out: Any) -> tuple[Any, list]:
        """Make the output node; return (treespec, leaves) to rebuild ``out`` from a flat tuple."""
        values, spec = tree_flatten(out)
        nodes: list[torch.fx.Node] = []
        leaves: list = []
        for value in values:
            if isinstance(value, torch.Tensor):
                leaves.append(len(nodes))
                nodes.append(self._node_for(value))
            else:
                leaves.append(ConstantOutput(value))
        output = self.graph.output(tuple(nodes))
        output.meta["val"] = tuple(n.meta["val"] for n in nodes)
        return spec, leaves

    def _placeholder(self, name: str, t: torch.Tensor) -> torch.fx.Node:
        # Lifted tensors go after every placeholder made so far (inserting_before(None): first).
        if self.last_placeholder is None:
            insertion_point = self.graph.inserting_before(None)
        else:
            insertion_point = self.graph.inserting_after(self.last_placeholder)
        with insertion_point:
            node = self.graph.placeholder(name)
        node.meta["val"] = to_meta(t)
        self.last_placeholder = node
        self.side_effects.watch(node.name, t)
        return node

    def _bind(self, t: torch.Tensor, node: torch.fx.Node) -> None:
        self.env[id(t)] = (t, node)
        if node.op != "placeholder":
            self.traced_storages.add(storage_ptr(t))  # env keeps t alive: no pointer reuse

    def _node_for(self, t: torch.Tensor) -> torch.fx.Node:
        """The node computing ``t``; unknown tensors from outside ``fn`` are lifted."""
        entry = self.env.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1]
        R.check_tensor_type(t, "a tensor")
        if self.creations.made(t) or storage_ptr(t) in self.traced_storages - {0}:
            raise GraphBreakError(
                "a tensor was created by code the tracer cannot see (autograd.Function.apply, "
                "nn.Parameter(...), torch.Tensor._make_subclass, ...)"
            )
        known, name, source, fetch = self.known_sources.get(id(t), (None, None, None, None))
        if known is not t:
            name = source = f"const_{sum(lt.name.startswith('const_') for lt in self.lifted)}"
            fetch = _constant(t)
        node = self._placeholder(name, t)
        self.lifted.append(LiftedTensor(node.name, source, fetch))
        self._bind(t, node)
        return node

    # -- one torch call ----------------------------------------------------------------------

    def handle(self, func: Callable, types_: tuple, args: tuple, kwargs: dict) -> Any:
        """Called by the mode for every torch call: check, map args to nodes, run, record."""
        where = self._where()
        try:
            for t in types_:
                R.check_tensor_type(t, "argument")
            R.check_supported(func, args, kwargs)
            node_args, node_kwargs = self._to_nodes(args), self._to_nodes(kwargs)
        except GraphBreakError as e:
            self.graph_break = self.graph_break or graph_break_at(e.reason, where)
            raise
        result = func(*args, **kwargs)
        try:
            return self._record(func, node_args, node_kwargs, result, where)
        except GraphBreakError as e:
            self.graph_break = self.graph_break or graph_break_at(e.reason, where)
            raise

    def _to_nodes(self, value: Any) -> Any:
        """Replace tensors in (nested) call arguments by nodes; check the rest is printable."""
        if isinstance(value, torch.Tensor):
            return self._node_for(value)
        if isinstance(value, (tuple, list)):
            mapped = [self._to_nodes(v) for v in value]
            return mapped if isinstance(value, list) else tuple(mapped)
        if isinstance(value, dict):
            return {k: self._to_nodes(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(*(self._to_nodes(v) for v in (value.start, value.stop, value.step)))
        for python_type in (bool, int, float, complex):  # numpy scalars -> plain Python
            if isinstance(value, python_type):
                return python_type(value)
        if isinstance(value, G.CONSTANT_TYPES) or value is Ellipsis:
            return value
        raise GraphBreakError(f"unsupported argument of type {type(value).__name__}")

    def _record(self, func, node_args, node_kwargs, result, where: Location) -> Any:
        name = R.func_name(func)
        tensors_in = any(isinstance(a, torch.fx.Node) for a in tree_flatten(node_args)[0])
        tensors_in |= any(isinstance(a, torch.fx.Node) for a in tree_flatten(node_kwargs)[0])
        if isinstance(result, torch.Tensor):
            node = self._call(func, node_args, node_kwargs, where, to_meta(result))
            self._bind(result, node)
        elif R.is_tensor_sequence(result):
            vals = tuple(None if r is None else to_meta(r) for r in result)
            node = self._call(func, node_args, node_kwargs, where, vals)
            for i, r in enumerate(result):
                if r is not None:
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta.update(node.meta, val=vals[i])
                    self._bind(r, item)
        elif func is _set_grad_enabled or name == "__setitem__":
            self._call(func, node_args, node_kwargs, where, None)
        elif tensors_in and name not in R.METADATA:
            raise GraphBreakError(
                f"{R.display_name(func)} returns a Python {type(result).__name__}, not a tensor: "
                "a graph cannot hold it and no guard covers it"
            )
        return result

    def _call(self, func, args, kwargs, where: Location, val: Any) -> torch.fx.Node:
        op, target, args, kwargs = R.target_for(func, args, kwargs)
        node = self.graph.create_node(op, target, args, kwargs)
        node.meta["val"] = val
        node.meta.update(node_source_meta(where))
        return node

    # -- where are we in the user's code? ----------------------------------------------------

    def _where(self) -> Location:
        """The user's source line of the current torch call (source_lines.py).

        Also refuses calls made inside a custom ``autograd.Function``: recording its forward ops
        would silently drop its custom backward.
        """
        where, graph_break = user_location(self.root_frame)
        if graph_break is not None:
            self.graph_break = self.graph_break or graph_break
            raise GraphBreakError(graph_break.reason)
        return where

    def locate(self, reason: str) -> GraphBreak:
        """A GraphBreak pointing at ``fn``'s definition (for breaks outside any torch call)."""
        return definition_site(reason, self.fn_code)


def _constant(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: t

