"""OutputGraph: the FX graph being built while tracing, on fake tensors, with its guards.

The interpreter hands every tensor operation to ``create_call``, which adds one node to
``self.graph`` and runs the operation on fake tensors (``FakeTensorMode``: metadata, no data) so
the result's shape and dtype are known. Tensors read from outside become placeholders through
``add_input``, which also guards their metadata and which inputs are the same object; closing
the graph guards which inputs it mutates share memory with another ([Note: inputs that share
memory]). Nothing here computes on the user's data, and no random numbers are drawn.

>>> import torch
>>> from toycomp.capture.sources import LocalSource
>>> out = OutputGraph(lambda x: x, {})
>>> x = out.wrap(torch.ones(2), LocalSource("x"))
>>> y = out.create_call("call_function", torch.sin, [x], {})
>>> y.example.shape, type(y.example).__name__
(torch.Size([2]), 'FakeTensor')
>>> out.graph_module([y]).code.strip().splitlines()[1]
'    sin = torch.sin(l_x);  l_x = None'

NB: in PyTorch this lives in torch/_dynamo/output_graph.py (OutputGraph, ``compile_subgraph``);
the fake tensors are torch/_subclasses/fake_tensor.py.
"""

from __future__ import annotations

import contextlib
import operator
import types
from typing import Any

import torch
import torch.fx

import toycomp._torch_compat as compat
from toycomp.capture.codegen import PyCodegen
from toycomp.capture.dynamic_shapes import (
    DynamicShapes,
    FrameState,
    RestartWithSymbols,
    SymbolicSizes,
    layout_guard_parts,
    new_symbols,
    shape_guard_lines,
)
from toycomp.capture.guard_builder import GuardBuilder, shares_memory
from toycomp.capture.side_effects_replay import SideEffects
from toycomp.capture.sources import AttrSource, LocalSource, Source, placeholder_name
from toycomp.capture.variables.base import ConstantVariable, Unsupported, VariableTracker
from toycomp.capture.variables.builder import VariableBuilder
from toycomp.capture.variables.lists import (
    BaseListVariable,
    DictVariable,
    ListVariable,
    NamedTupleVariable,
    TupleVariable,
)
from toycomp.capture.variables.tensor import TensorVariable
from toycomp.symbolic_shapes import is_symbolic, sym_expr, to_fx


class OpaqueVariable(VariableTracker):
    """A graph node whose value is not a tensor (the autocast state ``_enter_autocast`` returns)."""

    def __init__(self, proxy):
        self.proxy = proxy


class OutputGraph:
    """One graph under construction, for the frame of ``fn`` with globals ``f_globals``."""

    def __init__(self, fn, f_globals: dict, dynamic: bool | None = False,
                 frame_state: FrameState | None = None, symbolic: bool = False):
        self.fn = fn
        self.root_globals = f_globals
        self.graph = torch.fx.Graph()
        self.graph_inputs: list[Source] = []  # where each placeholder is read from, in order
        self.inputs: list[tuple[Source, torch.Tensor, TensorVariable]] = []  # while tracing only
        self.fake_mode = compat.symbolic_fake_tensor_mode() if symbolic else \
            compat.fake_tensor_mode()
        self.shape_env = compat.fake_mode_shape_env(self.fake_mode)  # None: no size is a symbol
        self.shapes = SymbolicSizes(dynamic, frame_state or FrameState())  # dynamic_shapes.py
        self.guards = GuardBuilder(fn)
        self.guards.global_state()
        self.side_effects = SideEffects(self.check_replayable)
        self.wrap = VariableBuilder(self)
        self.global_overrides: dict[tuple[int, str], VariableTracker] = {}
        self.keep_alive: list = []  # objects whose id() the builder remembers
        self.entered: list = []  # autocast contexts entered for real while tracing
        self.location = None  # (filename, lineno, function) of the instruction being traced
        self.output = self  # lets ListVariable.items(tx) be called with this graph as ``tx``

    # ----- inputs ---------------------------------------------------------------------------

    def add_input(self, value: torch.Tensor, source: Source | None) -> TensorVariable:
        """A tensor read from ``source``: a placeholder, with metadata and alias guards."""
        if source is None or value.layout != torch.strided or any(
                other is value for _, other, _ in self.inputs):
            return self.special_input(value, source)  # no source, read twice, sparse
        fake = self.fake_tensor(value, source)
        node = self.placeholder(placeholder_name(source), fake, source)
        node.meta["version"] = None if fake.is_inference() else fake._version  # see mutated()
        var = TensorVariable(node, fake, source, type(value))
        self.inputs.append((source, value, var))
        return var

    def special_input(self, value: torch.Tensor, source: Source | None) -> TensorVariable:
        """A tensor with no source (an error), read twice (one placeholder, valid only while
        both are one object) or sparse (guarded, then the frame runs eagerly)."""
        if source is None:
            raise Unsupported("a tensor read from a place with no source")
        if value.layout != torch.strided:  # sparse...: run eagerly
            raise self.eager_layout(value, source)
        other_source, var = next((s, var) for s, other, var in self.inputs if other is value)
        self.guards.alias_match(source, other_source, True)
        return TensorVariable(var.proxy, var.example, source, var.cls)

    def eager_layout(self, value: torch.Tensor, source: Source) -> EagerInputs:
        """A sparse (...) tensor has no strides to guard, trace or index: guarded, run eagerly."""
        self.guards.add(f"{source.name()}.layout == {value.layout}")  # (torch.sparse_coo)
        return EagerInputs(f"{source.name()} is a {value.layout} tensor (toycomp compiles "
                           "strided tensors only)")  # fmt: skip

    def placeholder(self, name: str, example: Any, source: Source) -> torch.fx.Node:
        """A new graph input, after the others, read from ``source`` on every call."""
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        with self.graph.inserting_before(first) if first else contextlib.nullcontext():
            node = self.graph.placeholder(name)  # (inserting_before(None): at the start)
        node.meta.update(example_value=example, source=source.name())
        self.graph_inputs.append(source)
        return node

    # ----- symbolic sizes (dynamic shapes) ----------------------------------------------------

    def fake_tensor(self, value: torch.Tensor, source: Source) -> torch.Tensor:
        """``value``'s fake tensor (sizes as symbols where they are dynamic), and its guards."""
        kinds = self.shapes.dim_kinds(value, source)
        if self.shape_env is not None:  # dynamic shapes: sizes as symbols
            return self.symbolic_fake_tensor(value, source, kinds)
        if any(k != "static" for k in kinds):
            raise RestartWithSymbols()
        self.guards.tensor_match(source, value)
        return self.fake_mode.from_tensor(value)

    def symbolic_fake_tensor(self, value: torch.Tensor, source: Source, kinds) -> torch.Tensor:
        """Each new symbol becomes a graph input (``s0``, read from ``x.size(0)``), before the
        tensor's, as in Dynamo's graphs."""
        fake = compat.fake_with_symbols(self.fake_mode, value, kinds, source.name())
        for symbol, size_source, size in new_symbols(fake, source, self.shapes.symbols):
            self.shapes.nodes[symbol] = self.placeholder(str(symbol), size, size_source)
        if any(k != "static" for k in kinds):
            dims = [d for d, n in enumerate(fake.shape) if is_symbolic(n)]
            self.shapes.dynamic_dims[source.name()] = dims
        sizes, strides = layout_guard_parts(fake, source, self.shapes.symbols)
        self.guards.tensor_match(source, value, sizes, strides)
        return fake

    def symbolic_int(self, value: int, source: Source) -> Any:
        """An int argument as a SymInt graph input, or None (specialised: guarded by value).

        Like Dynamo's automatic dynamic ints: an argument seen with another value in an earlier
        compile (or any, with ``dynamic=True``) becomes a symbol read from ``L['n']``. This is
        what keeps a resume function that receives ``n = x.shape[0]`` (a size live across a
        graph break) from recompiling for every batch size. Unlike Dynamo, only values >= 2
        (guarded ``L['n'] >= 2``), the range of a size's symbol: others stay specialised."""
        if not isinstance(source, LocalSource) or value < 2 or self.shapes.dynamic is False:
            return None
        changed = self.shapes.frame_state.update(f"{source.name()} (int)", (value,))
        if not changed and self.shapes.dynamic is not True:
            return None
        if self.shape_env is None:
            raise RestartWithSymbols()
        size = compat.symbolic_int(self.fake_mode, value, source.name())
        if not is_symbolic(size):
            return None
        self.guards.add(f"type({source.name()}) is int")
        self.shapes.symbols[sym_expr(size)] = source
        self.shapes.nodes[sym_expr(size)] = self.placeholder(str(sym_expr(size)), size, source)
        self.shapes.dynamic_dims[source.name()] = []  # (an int: no dimensions)
        return size

    def size_node(self, value: Any) -> Any:
        """The node computing a SymInt (``s0 * 2``) from the symbols' inputs; a number for a
        constant one ([Note: sizes are rebuilt from their symbols], toycomp/symbolic_shapes.py)."""
        expr = sym_expr(value)
        if expr not in self.shapes.nodes:
            node = to_fx(expr, self.graph, self.shapes.nodes.__getitem__, "example_value")
            if not isinstance(node, torch.fx.Node):
                return node
            self.shapes.nodes[expr] = node
        return self.shapes.nodes[expr]

    def install_shape_guards(self) -> DynamicShapes | None:
        """After stages 2-4 ran (they may assume things about sizes too): the shape guards."""
        if self.shape_env is None:
            return None
        lines = shape_guard_lines(self.shape_env, self.shapes.symbols)
        for line in lines:
            self.guards.add(line)
        symbols = {str(s): src.name() for s, src in self.shapes.symbols.items()}
        return DynamicShapes(symbols, dict(self.shapes.dynamic_dims), lines)

    # ----- calls ----------------------------------------------------------------------------

    def create_call(self, kind: str, target, args: list, kwargs: dict):
        """Add ``target(*args, **kwargs)`` to the graph; run it on fakes for the result."""
        node = self.graph.create_node(kind, target, tuple(self.as_node(a) for a in args),
                                      {k: self.as_node(v) for k, v in kwargs.items()})
        if self.location is not None:  # the user's line, as in Dynamo's graphs
            node.meta["stack_trace"] = '  File "{}", line {}, in {}\n'.format(*self.location)
        fake_args = [self.as_fake(a) for a in args]
        fake_kwargs = {k: self.as_fake(v) for k, v in kwargs.items()}
        try:
            with self.fake_mode:
                fn = getattr(fake_args.pop(0), target) if kind == "call_method" else target
                result = fn(*fake_args, **fake_kwargs)
        except Exception as e:
            raise self.failed_call(node, e) from e
        return self.wrap_result(node, result)

    def opaque_call(self, target, args: list) -> OpaqueVariable:
        """A node whose value is not a tensor (the autocast state): not run on fake tensors."""
        return OpaqueVariable(self.graph.call_function(target, tuple(map(self.as_node, args))))

    def failed_call(self, node: torch.fx.Node, e: Exception) -> Unsupported:
        """The op raised on fake tensors: no node, and an error naming the op."""
        self.graph.erase_node(node)
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", target)
        return Unsupported(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")

    def wrap_result(self, node, result) -> VariableTracker:
        if isinstance(result, torch.Tensor):
            node.meta["example_value"] = result
            return TensorVariable(node, result)
        return self.wrap_other_result(node, result)  # tuples of tensors, None, metadata

    def wrap_other_result(self, node, result) -> VariableTracker:
        """An op's result that is not a tensor: tensors in a tuple or list are nodes of their
        own (``getitem``), ``None`` keeps the node for its effect, metadata is a constant."""
        if isinstance(result, (tuple, list)) and _holds_tensor(result):
            node.meta["example_value"] = result
            # nested too: histogramdd returns (hist, [edges, ...]), each edge a node of its own
            items = [self.wrap_result(self.graph.call_function(operator.getitem, (node, i)), r)
                     if _holds_tensor(r) else ConstantVariable(r)
                     for i, r in enumerate(result)]
            if getattr(type(result), "n_fields", None) is not None:  # a structseq
                return NamedTupleVariable(items, type(result))
            return (ListVariable if isinstance(result, list) else TupleVariable)(items)
        if result is None:  # called for its effect (torch._C._set_grad_enabled): keep the node
            return ConstantVariable(None)
        self.graph.erase_node(node)  # metadata such as torch.numel(x): a constant
        if is_symbolic(result) or isinstance(result, (int, float, bool, torch.Size, torch.dtype,
                                                      torch.device, tuple)):
            return ConstantVariable(result)
        raise Unsupported(f"{node.target} returned a {type(result).__name__}")

    def as_node(self, var):
        return self._convert(var, lambda v: v.proxy, self.size_node)

    def as_fake(self, var):
        return self._convert(var, lambda v: v.example if isinstance(v, TensorVariable) else None)

    def _convert(self, var, leaf, size=None):
        if isinstance(var, (TensorVariable, OpaqueVariable)):
            return leaf(var)
        if isinstance(var, (BaseListVariable, DictVariable)):
            return self._convert_items(var, leaf, size)  # lists, tuples, dicts: item by item
        value = var.as_python_constant()
        if type(value) in (int, float, bool) or value is None:
            return value
        return self.convert_constant(value, size)  # sizes, shapes, slices, NumPy values

    def _convert_items(self, var, leaf, size):
        if isinstance(var, DictVariable):
            return {k: self._convert(v, leaf, size) for k, v in var.items.items()}
        items = [self._convert(v, leaf, size) for v in var.items(self)]
        return tuple(items) if isinstance(var, TupleVariable) else items

    def convert_constant(self, value, size=None):
        if size is not None and is_symbolic(value):  # a size (x.shape[0] * 2): graph nodes
            return size(value)
        if size is not None and isinstance(value, tuple) and any(map(is_symbolic, value)):
            return tuple(size(v) if is_symbolic(v) else v for v in value)  # a shape
        if size is not None and isinstance(value, slice):  # x[: n // 2]
            parts = [size(v) if is_symbolic(v) else v for v in (value.start, value.stop,
                                                                  value.step)]  # fmt: skip
            return slice(*parts)
        if callable(value) and not isinstance(value, type):  # checkpoint(torch.sin, x)
            # FX prints a graph's constants as Python, and a function has no literal
            raise Unsupported(f"a function ({getattr(value, '__qualname__', value)}) passed "
                              "to a torch function")
        if hasattr(value, "__array__") and not isinstance(value, (int, float, complex)):
            # an FX graph can hold only constants it can print as Python (not a NumPy array)
            raise Unsupported(f"a {type(value).__name__} passed to a tensor operation")
        if isinstance(value, (int, float)) and type(value) not in (int, float, bool):
            return value.item() if hasattr(value, "item") else float(value)  # numpy scalars
        return value

    # ----- finishing ------------------------------------------------------------------------

    def check_replayable(self, record) -> None:
        """Raise Unsupported now if ``record`` could not be written as Python later."""
        record.codegen(PyCodegen(self.shapes.symbols))

    def count_calls(self) -> int:
        return sum(n.op in ("call_function", "call_method") for n in self.graph.nodes)

    def graph_module(self, outputs: list[TensorVariable]) -> torch.fx.GraphModule:
        """Close the graph: it returns ``outputs``' tensors, as a tuple."""
        self.graph.output(tuple(v.proxy for v in outputs))
        self.graph.lint()
        if len(self.inputs) > 1:  # a mutated input may share memory with another: see the Note
            self.guard_mutated_inputs()
        return torch.fx.GraphModule(torch.nn.Module(), self.graph)

    def guard_mutated_inputs(self) -> None:
        """Guard whether each mutated input shares memory with another input; raise
        ``AliasedInputs`` if one does now ([Note: inputs that share memory])."""
        updated = [(s, v) for s, v, var in self.inputs if mutated(var)]
        shared, done = [], set()
        for ms, mv in updated:
            for s, v, _ in self.inputs:
                pair = frozenset((ms, s))
                if s is ms or pair in done or not (is_argument(s) or is_argument(ms)):
                    continue
                done.add(pair)
                overlap = shares_memory(mv, v)
                self.guards.storage_overlap(ms, s, overlap)
                if overlap:  # (the same object twice is one placeholder: compiled, not here)
                    self.guards.alias_match(ms, s, False)
                    shared.append(f"{ms.name()} and {s.name()}")
        if shared:
            raise AliasedInputs(
                f"the graph mutates an input that shares memory with another input "
                f"({', '.join(shared)}: views of one tensor); toycomp runs the function eagerly "
                "for such inputs (AOTAutograd would compile a synthetic base)")

    def example_inputs(self) -> list[torch.Tensor]:
        return [n.meta["example_value"] for n in self.graph.nodes if n.op == "placeholder"]


class EagerInputs(Exception):
    """Inputs the graph cannot take (a sparse tensor); guarded, they run the frame eagerly."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class AliasedInputs(Exception):
    """The graph cannot be used for these inputs; they are guarded, and run eagerly.

    [Note: inputs that share memory]
    Two input tensors may be views of one storage (``f(t, t.view(-1))``). The graph treats
    its placeholders as independent, and AOTAutograd functionalises in-place updates, so if the
    graph mutates one of them, the other would be read stale: silently wrong. Reads alone are
    harmless. So after tracing, for each input the graph mutates (its fake tensor's version
    counter moved) and each other input, a guard records whether they share memory now; if
    one pair does, this entry runs the function eagerly (with a warning) instead of compiling.
    The same object passed twice is one placeholder, guarded by ``is``. Dynamo guards
    ``STORAGE_OVERLAPPING`` and AOTAutograd compiles a "synthetic base" for such inputs
    (torch/_functorch/_aot_autograd/input_output_analysis.py)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def mutated(var: TensorVariable) -> bool:
    """Did the graph update this input in place (its fake tensor's version counter moved)?
    Inference tensors have no counter: they count as mutated (the safe side)."""
    return var.example.is_inference() or var.example._version != var.proxy.meta["version"]


def is_argument(source: Source) -> bool:
    """Sources that are the frame's arguments (or items of them), not attributes of objects."""
    while not isinstance(source, LocalSource):
        if isinstance(source, AttrSource) or not hasattr(source, "base"):
            return False
        source = source.base
    return True


def _holds_tensor(value) -> bool:
    """Whether an op's result holds a tensor, at any depth of tuples and lists."""
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(map(_holds_tensor, value))
