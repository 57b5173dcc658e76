"""Stage 1, graph capture: a Python function -> torch.fx.GraphModule of torch calls + guards.

``capture(fn, *example_inputs)`` runs ``fn`` once, eagerly, on the real example inputs, while a
``TorchFunctionMode`` watches every torch-level call (operators on tensors, ``torch.*``, tensor
methods, ``torch.nn.functional``). Each call is executed for real *and* appended to a
``torch.fx.Graph``; each result tensor is remembered as the output of its node::

    def f(x):                             def forward(self, x):
        return sin(x) ** 2 + cos(x) ** 2      sin = torch.sin(x)
                                              pow_1 = sin ** 2
    capture(f, torch.randn(1000))  ───►       cos = torch.cos(x)
                                              pow_2 = cos ** 2
                                              add = pow_1 + pow_2
                                              return (add,)
    guards: x.shape == (1000,), x.dtype == torch.float32, ...

nn.Modules are inlined (their ``forward`` just runs); parameters, buffers and tensors read from
globals or closures are *lifted* to extra graph inputs after the user's inputs.

How this differs from TorchDynamo: Dynamo does not run ``fn``. It interprets the *bytecode* of the
frame symbolically (with fake tensors), so it sees every Python operation, not only torch calls.
When it meets something it cannot trace it compiles the partial graph so far, emits bytecode that
runs the offending instruction eagerly, and continues in a generated *resume function* that is
captured again. toycomp's tracer only sees torch calls, so on such a construct it gives up on the
whole function: it reports a ``GraphBreak`` and the caller runs ``fn`` eagerly.

[Note: why a TorchFunctionMode tracer specialises control flow]
Python code between torch calls (``if n > 2:``, loops over ``range(x.shape[0])``, attribute lookups)
is invisible to the mode; it simply runs with the real values, and the graph records the one path
that was taken. That is sound as long as every value the path depended on is guarded: Python
arguments get value guards, shapes get shape guards. But ``if x.sum() > 0:`` depends on tensor
*data*, which no guard covers (the next call has new data), so ``Tensor.__bool__`` - and
``.item()``, ``int(t)``, ops whose output shape depends on data - must stop the capture: a graph
break.

NB: in PyTorch this lives in torch/_dynamo/ (symbolic_convert.py interprets bytecode,
output_graph.py builds the FX graph, guards.py builds guards).
"""

from __future__ import annotations

import inspect
import linecache
import operator
import os
import types
import weakref
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
import torch.fx
from torch.overrides import TorchFunctionMode

from toycomp import guards as G
from toycomp._torch_compat import TorchDispatchMode, _set_grad_enabled, tensor_version
from toycomp._torch_compat import written_tensor_args
from toycomp._torch_compat import tree_flatten, tree_unflatten


@dataclass(frozen=True)
class GraphBreak:
    """Why capture stopped, and the user's source line where it happened."""

    reason: str
    filename: str
    lineno: int
    source_line: str

    def __str__(self) -> str:
        return f"graph break at line {self.lineno}: `{self.source_line}`\n  {self.reason}"


class GraphBreakError(Exception):
    """Raised inside the tracer when it meets a construct it cannot capture."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class LiftedTensor:
    """A tensor read by ``fn`` that is neither an input nor computed inside: a graph input."""

    name: str  # placeholder name, e.g. "fc1_weight" or "const_0"
    source: str  # where it is read from, e.g. "self.fc1.weight"
    fetch: Callable[[], torch.Tensor]  # reads its *current* value on every call


@dataclass
class CapturedGraph:
    """The result of :func:`capture`: an FX graph plus what is needed to call it safely."""

    fn: Callable
    gm: torch.fx.GraphModule | None
    guards: list[G.Guard]
    graph_break: GraphBreak | None = None
    example_inputs: list[torch.Tensor] = field(default_factory=list)
    lifted: list[LiftedTensor] = field(default_factory=list)
    example_outputs: Any = None  # what fn returned during capture (it ran eagerly once)
    signature: inspect.Signature | None = None
    state_readers: dict[str, Callable[[], Any]] = field(default_factory=dict)
    output_spec: Any = None
    output_leaves: list = field(default_factory=list)  # int: index into gm's outputs; else const
    _side_effects: Any = field(default=None, repr=False)

    def _user_leaves(self, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
        return G.flatten_user_inputs(self.signature, args, kwargs)[0]

    def check_guards(self, *args: Any, **kwargs: Any) -> G.Guard | None:
        """Return the first guard that fails for these arguments, or None when all pass."""
        try:
            leaves, structure = G.flatten_user_inputs(self.signature, args, kwargs)
        except TypeError:
            return self.guards[0]  # the structure guard
        values = {G.STRUCTURE: structure, G.GRAD_MODE: torch.is_grad_enabled(), **dict(leaves)}
        readers = {**self.state_readers, **{lt.name: lt.fetch for lt in self.lifted}}
        for source, read in readers.items():
            try:
                values[source] = read()
            except (AttributeError, KeyError, ValueError):
                pass  # a missing source fails its guards
        return G.first_failing(self.guards, values)

    def flatten_inputs(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """The tensors to call ``gm`` with: user tensors, then current values of lifted ones."""
        user = [v for _, v in self._user_leaves(args, kwargs) if isinstance(v, torch.Tensor)]
        return user + [lifted.fetch() for lifted in self.lifted]

    def unflatten_outputs(self, flat: tuple | list) -> Any:
        """Rebuild the structure ``fn`` returned from ``gm``'s flat tuple of tensors."""
        leaves = [flat[x] if isinstance(x, int) else x.value for x in self.output_leaves]
        return tree_unflatten(leaves, self.output_spec)

    def undo_side_effects(self) -> None:
        """Undo the capture run's in-place updates of input / lifted tensors and its RNG use.

        Raises:
            RuntimeError: if some tensor was updated in a way that could not be undone (then
                the update stays, and running the same call again applies it twice).
        """
        if self._side_effects is not None:
            self._side_effects.undo()
            missed, self._side_effects = self._side_effects.missed, None
            if missed:
                raise RuntimeError(f"capture could not undo in-place updates of {missed}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Check guards, run ``gm`` and rebuild the outputs (raises if a guard fails)."""
        if self.gm is None:
            raise RuntimeError(f"nothing to run, capture hit a {self.graph_break}")
        failed = self.check_guards(*args, **kwargs)
        if failed is not None:
            raise RuntimeError(f"guard failed: {failed}")
        return self.unflatten_outputs(self.gm(*self.flatten_inputs(*args, **kwargs)))

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        if self.gm is None:
            return f"CapturedGraph({name}): {self.graph_break}"
        guards = "\n".join(f"  {g}" for g in self.guards)
        return f"CapturedGraph({name}):\n{self.gm.code.strip()}\n\nguards:\n{guards}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


class _Const(NamedTuple):
    value: Any  # a non-tensor leaf of fn's output


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
    result._side_effects = tracer.side_effects
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

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TOYCOMP_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_AUTOGRAD_FUNCTION_FILE = os.path.join(_TORCH_DIR, "autograd", "function.py")


class _Location(NamedTuple):
    filename: str
    lineno: int
    function: str
    text: str


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


class _CreationTracker(TorchDispatchMode):
    """Remembers every tensor produced by an ATen op while tracing.

    [Note: tensors the tracer did not see]
    A tensor that reaches a torch call without being a known node is normally a constant from
    outside (a global, a closure) and is lifted to a graph input. But a tensor can also be made
    inside ``fn`` by something the TorchFunctionMode does not intercept
    (``autograd.Function.apply``, ``nn.Parameter(...)``). Lifting it would silently freeze one
    run's value into the graph; so if the dispatcher saw it being created during tracing, or it
    shares memory with a tensor that a graph node computed (``nn.Parameter(y)`` wraps ``y``'s
    storage without any ATen op), the tracer breaks instead.
    """

    def __init__(self, side_effects: _SideEffects):
        super().__init__()
        self.created: dict[int, weakref.ref] = {}
        self.side_effects = side_effects

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in written_tensor_args(func, args, kwargs or {}):
            self.side_effects.before_write(t)
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.created[id(t)] = weakref.ref(t)
        return out

    def made(self, t: torch.Tensor) -> bool:
        ref = self.created.get(id(t))
        return ref is not None and ref() is t


class _SideEffects:
    """Remembers how to undo what the capture run did to tensors that outlive it.

    [Note: side effects of the capture run]
    capture() runs ``fn`` for real, so in-place updates of inputs, parameters and buffers (a
    BatchNorm's running stats) happen, and random numbers are drawn. If the caller then runs the
    graph for that same call (or ``fn`` eagerly after a graph break), they would happen twice.
    So before the first write to an input or lifted tensor (seen at the ATen level, from the op's
    schema) its storage is copied, and the RNG state is saved when ``fn`` starts; ``undo()``
    puts both back. Python side effects (appending to a list) cannot be undone.
    """

    def __init__(self):
        self.storages: dict[int, torch.UntypedStorage] = {}  # of inputs and lifted tensors
        self.snapshots: dict[int, torch.UntypedStorage] = {}  # their contents before a write
        self.versions: list[tuple[str, torch.Tensor, int]] = []  # (name, tensor, version)
        self.missed: list[str] = []  # tensors written in a way the schema did not announce
        self.rng: list[torch.Tensor] = []

    def watch(self, name: str, t: torch.Tensor) -> None:
        self.versions.append((name, t, tensor_version(t)))
        self.storages.setdefault(_storage_ptr(t), t.untyped_storage())

    def start(self) -> None:
        self.rng = [torch.get_rng_state()]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.rng += torch.cuda.get_rng_state_all()

    def before_write(self, t: torch.Tensor) -> None:
        ptr = _storage_ptr(t)
        if ptr in self.storages and ptr not in self.snapshots:
            self.snapshots[ptr] = self.storages[ptr].clone()

    def finish(self) -> None:
        """Called when ``fn`` returns: note unannounced writes, drop what undo() does not need."""
        self.missed = [
            name
            for name, t, version in self.versions
            if tensor_version(t) != version and _storage_ptr(t) not in self.snapshots
        ]
        self.storages = {ptr: self.storages[ptr] for ptr in self.snapshots}
        self.versions = []

    def undo(self) -> None:
        """Restore written inputs / lifted tensors and the RNG state; usable once."""
        for ptr, saved in self.snapshots.items():
            self.storages[ptr].copy_(saved)
        if self.rng:
            torch.set_rng_state(self.rng[0])
        if len(self.rng) > 1:
            torch.cuda.set_rng_state_all(self.rng[1:])
        self.storages, self.snapshots, self.rng = {}, {}, []


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
        self.side_effects = _SideEffects()
        self.creations = _CreationTracker(self.side_effects)
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
                _check_tensor_type(value, f"input {source}")
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
                leaves.append(_Const(value))
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
        node.meta["val"] = _meta(t)
        self.last_placeholder = node
        self.side_effects.watch(node.name, t)
        return node

    def _bind(self, t: torch.Tensor, node: torch.fx.Node) -> None:
        self.env[id(t)] = (t, node)
        if node.op != "placeholder":
            self.traced_storages.add(_storage_ptr(t))  # env keeps t alive: no pointer reuse

    def _node_for(self, t: torch.Tensor) -> torch.fx.Node:
        """The node computing ``t``; unknown tensors from outside ``fn`` are lifted."""
        entry = self.env.get(id(t))
        if entry is not None and entry[0] is t:
            return entry[1]
        _check_tensor_type(t, "a tensor")
        if self.creations.made(t) or _storage_ptr(t) in self.traced_storages - {0}:
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
                _check_tensor_type(t, "argument")
            _check_supported(func, args, kwargs)
            node_args, node_kwargs = self._to_nodes(args), self._to_nodes(kwargs)
        except GraphBreakError as e:
            self.graph_break = self.graph_break or _graph_break(e.reason, where)
            raise
        result = func(*args, **kwargs)
        try:
            return self._record(func, node_args, node_kwargs, result, where)
        except GraphBreakError as e:
            self.graph_break = self.graph_break or _graph_break(e.reason, where)
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

    def _record(self, func, node_args, node_kwargs, result, where: _Location) -> Any:
        name = _func_name(func)
        tensors_in = any(isinstance(a, torch.fx.Node) for a in tree_flatten(node_args)[0])
        tensors_in |= any(isinstance(a, torch.fx.Node) for a in tree_flatten(node_kwargs)[0])
        if isinstance(result, torch.Tensor):
            node = self._call(func, node_args, node_kwargs, where, _meta(result))
            self._bind(result, node)
        elif _is_tensor_sequence(result):
            vals = tuple(None if r is None else _meta(r) for r in result)
            node = self._call(func, node_args, node_kwargs, where, vals)
            for i, r in enumerate(result):
                if r is not None:
                    item = self.graph.call_function(operator.getitem, (node, i))
                    item.meta.update(node.meta, val=vals[i])
                    self._bind(r, item)
        elif func is _set_grad_enabled or name == "__setitem__":
            self._call(func, node_args, node_kwargs, where, None)
        elif tensors_in and name not in _METADATA:
            raise GraphBreakError(
                f"{_display_name(func)} returns a Python {type(result).__name__}, not a tensor: "
                "a graph cannot hold it and no guard covers it"
            )
        return result

    def _call(self, func, args, kwargs, where: _Location, val: Any) -> torch.fx.Node:
        op, target, args, kwargs = _target_for(func, args, kwargs)
        node = self.graph.create_node(op, target, args, kwargs)
        node.meta["val"] = val
        node.meta["stack_trace"] = (
            f'  File "{where.filename}", line {where.lineno}, in {where.function}\n'
            f"    {where.text}\n"
        )
        node.meta["source_line"] = f"line {where.lineno}: {where.text}"
        return node

    # -- where are we in the user's code? ----------------------------------------------------

    def _where(self) -> _Location:
        """The innermost user frame (outside torch and toycomp) of the current torch call.

        Also refuses calls made inside a custom ``autograd.Function``: recording its forward ops
        would silently drop its custom backward.
        """
        frame, user = inspect.currentframe(), None
        innermost_library = None
        while frame is not None and frame is not self.root_frame:
            filename = frame.f_code.co_filename
            if filename == _AUTOGRAD_FUNCTION_FILE and frame.f_code.co_name == "apply":
                caller = _location(frame.f_back)
                name = getattr(frame.f_locals.get("cls"), "__name__", "autograd.Function")
                reason = f"custom autograd.Function {name}.apply (its backward cannot be traced)"
                self.graph_break = self.graph_break or _graph_break(reason, caller)
                raise GraphBreakError(reason)
            is_library = filename.startswith((_TORCH_DIR, _TOYCOMP_DIR))
            if user is None and not is_library:
                user = frame
            if innermost_library is None and filename.startswith(_TORCH_DIR):
                if not filename.endswith("overrides.py"):
                    innermost_library = frame
            frame = frame.f_back
        return _location(user or innermost_library)

    def locate(self, reason: str) -> GraphBreak:
        """A GraphBreak pointing at ``fn``'s definition (for breaks outside any torch call)."""
        code = self.fn_code
        if code is None:
            return GraphBreak(reason, "<unknown>", 0, "")
        text = linecache.getline(code.co_filename, code.co_firstlineno).strip()
        return GraphBreak(reason, code.co_filename, code.co_firstlineno, text)


def _location(frame: types.FrameType | None) -> _Location:
    if frame is None:
        return _Location("<unknown>", 0, "<unknown>", "")
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(filename, lineno).strip()
    return _Location(filename, lineno, frame.f_code.co_name, text)


def _graph_break(reason: str, where: _Location) -> GraphBreak:
    return GraphBreak(reason, where.filename, where.lineno, where.text)


def _constant(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: t


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return 0


def _meta(t: torch.Tensor) -> torch.Tensor:
    """A meta-device tensor with ``t``'s shape, stride and dtype: the node's ``meta['val']``."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _is_tensor_sequence(result: Any) -> bool:
    if not isinstance(result, (tuple, list)):
        return False
    is_tensor = [isinstance(r, torch.Tensor) for r in result]
    return any(is_tensor) and all(t or r is None for t, r in zip(is_tensor, result))


def _check_tensor_type(t: torch.Tensor | type, what: str) -> None:
    cls = t if isinstance(t, type) else type(t)
    if cls not in (torch.Tensor, torch.nn.Parameter):
        raise GraphBreakError(f"{what} is a tensor subclass ({cls.__name__})")


# ----------------------------------------------------------------------------------------------
# Which calls are supported, and how they are written in the graph
# ----------------------------------------------------------------------------------------------

_VALUE_DEPENDENT = {
    "__bool__": "Python control flow on a tensor's value (`if t:`, `while t:`, `and`/`or`)",
    "item": "Tensor.item() turns a tensor value into a Python number",
    "tolist": "Tensor.tolist() turns tensor values into Python numbers",
    "numpy": "Tensor.numpy() leaves PyTorch",
    "__array__": "converting a tensor to a NumPy array leaves PyTorch",
    "__int__": "int() of a tensor turns a tensor value into a Python number",
    "__float__": "float() of a tensor turns a tensor value into a Python number",
    "__complex__": "complex() of a tensor turns a tensor value into a Python number",
    "__index__": "using a tensor as a Python index turns its value into a Python int",
    "backward": "calling .backward() inside the captured function",
}
_DATA_DEPENDENT_SHAPE = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"}
_DATA_DEPENDENT_SHAPE |= {"bincount"}

# Calls returning Python values that depend only on metadata (covered by the tensor guards).
_METADATA = {"size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset"}
_METADATA |= {"is_contiguous", "is_floating_point", "is_complex", "is_signed", "element_size"}
_METADATA |= {"get_device", "__len__", "__hash__", "is_same_size", "shape", "ndim", "dtype"}
_METADATA |= {"device", "layout", "requires_grad", "is_leaf", "is_cuda", "is_cpu", "is_meta"}
_METADATA |= {"is_sparse", "is_quantized", "is_nested", "itemsize", "nbytes", "type"}


def _check_supported(func: Callable, args: tuple, kwargs: dict) -> None:
    name = _func_name(func)
    if name in _VALUE_DEPENDENT:
        raise GraphBreakError(f"{_display_name(func)}: {_VALUE_DEPENDENT[name]}")
    shape_from_values = name in _DATA_DEPENDENT_SHAPE
    shape_from_values |= name == "where" and len(args) + len(kwargs) == 1
    shape_from_values |= name == "repeat_interleave" and isinstance(
        args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor
    )
    shape_from_values |= name == "__getitem__" and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
        for i in (args[1] if isinstance(args[1], tuple) else (args[1],))
    )
    if shape_from_values:
        raise GraphBreakError(
            f"{_display_name(func)}: the output shape depends on tensor values (data-dependent)"
        )


def _is_property_getter(func: Callable) -> bool:
    owner = getattr(func, "__self__", None)
    return getattr(func, "__name__", None) == "__get__" and isinstance(
        owner, (types.GetSetDescriptorType, property)
    )


def _func_name(func: Callable) -> str:
    if _is_property_getter(func):
        owner = func.__self__
        return getattr(owner, "__name__", None) or owner.fget.__name__
    return getattr(func, "__name__", type(func).__name__)


def _is_tensor_method(func: Callable) -> bool:
    name = _func_name(func)
    qualname = getattr(func, "__qualname__", "")
    if getattr(torch.Tensor, name, None) is func:
        return True
    return qualname.startswith(("Tensor.", "TensorBase."))


def _display_name(func: Callable) -> str:
    if _is_tensor_method(func) or _is_property_getter(func):
        return f"Tensor.{_func_name(func)}"
    module = getattr(func, "__module__", None) or "torch"
    return f"{module}.{_func_name(func)}"


# x.add(y) and x + y are the same call to PyTorch; the graph prints the operator form.
_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
_BINARY |= {"matmul": operator.matmul, "pow": operator.pow, "__floordiv__": operator.floordiv}
_BINARY |= {"remainder": operator.mod, "__getitem__": operator.getitem, "eq": operator.eq}
_BINARY |= {"__eq__": operator.eq, "ne": operator.ne, "__ne__": operator.ne, "gt": operator.gt}
_BINARY |= {"lt": operator.lt, "ge": operator.ge, "le": operator.le, "__and__": operator.and_}
_BINARY |= {"__or__": operator.or_, "__xor__": operator.xor}
_UNARY = {"neg": operator.neg, "__invert__": operator.invert}
_REVERSED = {"__rsub__": operator.sub, "__rdiv__": operator.truediv, "__rpow__": operator.pow}
_REVERSED |= {"__rtruediv__": operator.truediv, "__rmatmul__": operator.matmul}
_REVERSED |= {"__rfloordiv__": operator.floordiv}


def _drop_defaults(func: Callable, kwargs: dict) -> dict:
    """Python torch functions (F.cross_entropy) pass every keyword on; keep non-default ones."""
    if not kwargs or not inspect.isfunction(func):
        return kwargs
    params = inspect.signature(func).parameters
    return {
        k: v
        for k, v in kwargs.items()
        if k not in params or type(v) is not type(params[k].default) or v != params[k].default
    }


def _target_for(func: Callable, args: tuple, kwargs: dict) -> tuple[str, Any, tuple, dict]:
    """How a torch call is written in the graph: (op, target, args, kwargs)."""
    name = _func_name(func)
    if _is_property_getter(func):
        return "call_function", getattr, (args[0], name), {}
    if not _is_tensor_method(func):
        return "call_function", func, args, _drop_defaults(func, kwargs)
    if name == "__setitem__":
        return "call_function", operator.setitem, args, kwargs
    if name in _REVERSED and len(args) == 2 and not kwargs:
        return "call_function", _REVERSED[name], (args[1], args[0]), {}
    if name in _BINARY and len(args) == 2 and not kwargs:
        return "call_function", _BINARY[name], args, {}
    if name in _UNARY and len(args) == 1 and not kwargs:
        return "call_function", _UNARY[name], args, {}
    return "call_method", name, args, kwargs
