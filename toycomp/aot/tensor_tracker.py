"""Tensor <-> node bookkeeping for the ATen recorder: real tensors -> the fx nodes holding them.

Input -> output: the real tensors that ATen ops read and produce while a function runs -> the
``torch.fx.Graph`` being recorded and, for each live tensor, the node holding its *current*
value (``Tracked``). ``TensorTracker`` has no opinion about ops: it adds placeholders, nodes and
constants, maps each tensor to its node (``read``) and finds a tensor's aliases by storage
(``aliases``). The ``FunctionalRecorder`` (toycomp/aot/functionalize.py), a dispatch mode,
decides which nodes to add for each op and records them through a tracker:

    >>> import torch
    >>> from toycomp.aot.functionalize import FunctionalRecorder
    >>> tracker = TensorTracker()
    >>> x, w = torch.randn(3), torch.randn(3)   # w: made before recording started
    >>> tracker.placeholder("primals_1", x)
    primals_1
    >>> with FunctionalRecorder(tracker):       # mul = aten.mul.Tensor(primals_1, 2), ...
    ...     y = x * 2 + w
    >>> tracker.read(y, "output"), tracker.read(w, "output")  # w became a (copied) constant
    (add, _tensor_constant0)

[Note: a node's device] ``meta["val"]`` is a meta tensor (shape, dtype, strides: no device),
so every node that holds a real tensor's value also records that tensor's device in
``meta["device"]``, as the real op made it. Most results live where their inputs do, but not
all: on CUDA, ``aten._scaled_dot_product_efficient_attention`` returns its RNG seed and offset
as CPU scalars, which the backward then takes as inputs. Later stages read the device here
rather than assume one device per graph.

NB: in PyTorch this lives in torch/fx/experimental/proxy_tensor.py (``PythonKeyTracer``, its
``tensor_tracker`` and ``set_proxy_slot`` / ``get_proxy_slot``): make_fx's
``ProxyTorchDispatchMode(tracer)`` records into such a tracer as our recorder does.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import defaultdict
from typing import Any

import torch
import torch.fx as fx

from toycomp.aot.functional_utils import (
    copy_like,
    extent,
    overlaps,
    same_view,
    storage_key,
)
from toycomp._torch_compat import no_fake_mode, tree_map
from toycomp.symbolic_shapes import free_symbols, is_symbolic, sym_expr, to_fx
from toycomp.tensor_utils import to_meta_value

__all__ = ["TensorTracker", "Tracked"]

aten = torch.ops.aten


@dataclasses.dataclass
class Tracked:
    """What the recorder knows about one real tensor: the node holding its current value."""

    tensor: torch.Tensor  # kept alive so that id(tensor) is never reused during a trace
    node: fx.Node
    stale: str | None = None  # name of the in-place op that overwrote it through an alias
    constant: bool = False


class TensorTracker:
    """The graph being recorded and which node holds each real tensor's current value.

    Fields: ``graph``; ``constants`` (the ``get_attr`` tensors); ``values`` (each node's real
    value: the example inputs of the compiled graphs); ``placeholders`` in order; ``sym_nodes``
    (the node computing each size expression). Methods: ``placeholder``, ``emit`` /
    ``emit_results`` (add nodes), ``track`` / ``retrack`` (a tensor now holds a node's value),
    ``read`` (the node of a tensor's current value, or of a SymInt), ``lookup`` / ``entry_for``
    (its ``Tracked`` entry), ``aliases`` / ``same_storage`` (entries sharing its memory),
    ``snapshot`` (keep values an in-place op is about to overwrite) and ``bind_symbols``.

    [Note: sizes in the recorded graph] With dynamic shapes a size is a SymInt (``s0``, ``3*s0``)
    and an op may take it as an argument (``aten.view(x, [3*s0])``). Sizes are values like
    tensors: a SymInt input is a placeholder, and ``read`` gives the node computing a SymInt's
    expression, built from the nodes holding its symbols ([Note: sizes are rebuilt from their
    symbols] in toycomp/symbolic_shapes.py). A symbol with no SymInt input is read from the
    first input tensor that has it as a size or stride (``aten.sym_size.int(primals_1, 0)``).
    """

    def __init__(self) -> None:
        self.graph = fx.Graph()
        self.constants: dict[str, torch.Tensor] = {}
        self.values: dict[fx.Node, torch.Tensor] = {}  # real value of each node
        self.placeholders: list[fx.Node] = []
        self.sym_nodes: dict[Any, fx.Node] = {}  # size expression -> the node computing it
        self._tracked: dict[int, Tracked] = {}
        self._by_storage: dict[tuple, dict[int, Tracked]] = defaultdict(dict)
        self.rebound = False  # has a tracked tensor's node changed (a mutation, a relayout)?

    # -- adding nodes ----------------------------------------------------------------------
    def placeholder(self, name: str, t: Any) -> fx.Node:
        """Add an input ``name`` after the previous ones, holding ``t`` (a tensor or SymInt)."""
        with self.graph.inserting_after(self.placeholders[-1] if self.placeholders else None):
            node = self.graph.placeholder(name)
        node.meta["val"] = _plain_meta(t)
        self.placeholders.append(node)
        if isinstance(t, torch.Tensor):
            self.track(t, node)
        else:
            self._track_size(t, node)  # [Note: sizes in the recorded graph]
        return node

    def _track_size(self, size: Any, node: fx.Node) -> None:
        """``node`` (an input, or a result) holds the size ``size``, an int or a SymInt."""
        self.values[node] = size
        if is_symbolic(size):
            self.sym_nodes.setdefault(sym_expr(size), node)

    def emit(self, op: Any, args: tuple, kwargs: dict, val: Any, device: Any = None) -> fx.Node:
        """Add ``op(*args, **kwargs)``, whose result is like ``val`` ([Note: a node's device])."""
        args, kwargs = tree_map(self.read_size, (args, kwargs))
        name = getattr(op, "overloadpacket", op).__name__
        node = self.graph.create_node("call_function", op, args, kwargs, name=name)
        node.meta["val"] = _plain_meta(val)
        node.meta["device"] = device or tree_map(lambda v: getattr(v, "device", None), val)
        return node

    def emit_results(self, node: fx.Node, val: Any) -> list[fx.Node | None]:
        """One node per tensor result of ``node`` ([Note: results that are not tensors])."""
        if isinstance(val, torch.Tensor):
            return [node]
        return self._emit_other_results(node, val)  # sizes, tuples of results

    def _emit_other_results(self, node: fx.Node, val: Any) -> list[fx.Node | None]:
        """``emit_results`` for a size, or a tuple of tensors, sizes and None."""
        if is_symbolic(val):  # aten.sym_size.int & co: the node computes that size from now on
            self._track_size(val, node)
            return [node]
        if not isinstance(val, (tuple, list)):
            raise RuntimeError(f"toycomp.aot: {node.target} returned a non-tensor {val!r}")
        devices = node.meta["device"]
        nodes: list[fx.Node | None] = []
        for i, item in enumerate(val):
            device = devices[i] if isinstance(devices, (tuple, list)) else devices
            if isinstance(item, torch.Tensor):
                nodes.append(self.emit(operator.getitem, (node, i), {}, item, device))
                continue
            if is_symbolic(item) and sym_expr(item) not in self.sym_nodes:
                self.emit_results(self.emit(operator.getitem, (node, i), {}, item, None), item)
            elif item is not None and type(item) is not int and not is_symbolic(item):
                raise RuntimeError(f"toycomp.aot: {node.target} returned a {item!r}")
            nodes.append(None)
        return nodes

    # [Note: results that are not tensors]
    # An op may return numbers and None among its tensors: on CUDA, flash and cuDNN attention
    # return the sequence lengths (max_q, max_k: SymInts in the schema) for their backward, and
    # None for the cumulative lengths of nested inputs. They are not values to track: autograd
    # hands the backward the same numbers, which the graph holds as literals (an int) or as
    # the node computing them (a SymInt: a getitem of the op's result when no node computes
    # that size yet). Like make_fx, which records a returned int as a constant.

    # -- which node holds which tensor ---------------------------------------------------------
    def track(self, t: torch.Tensor, node: fx.Node, constant: bool = False) -> Tracked:
        """From now on ``t``'s current value is ``node``'s."""
        self.rebound |= id(t) in self._tracked
        entry = Tracked(t, node, constant=constant)
        self._tracked[id(t)] = entry
        self.values.setdefault(node, t)
        node.meta.setdefault("device", t.device)  # placeholders and constants
        self._by_storage[storage_key(t)][id(t)] = entry  # (None: an empty storage)
        return entry

    def retrack(self, entry: Tracked, node: fx.Node) -> Tracked:
        """``entry``'s tensor now holds ``node``'s value (it is up to date again)."""
        self.rebound = True
        entry.node, entry.stale = node, None
        value, meta = self.values.get(node), node.meta["val"]
        if value is None or (value is entry.tensor and value.stride() != meta.stride()):
            self.values[node] = copy_like(entry.tensor, meta)
        return entry

    def lookup(self, t: torch.Tensor) -> Tracked | None:
        """``t``'s entry, or None if no recorded op made it and it was never read."""
        return self._tracked.get(id(t))

    def entry_for(self, t: torch.Tensor, op: str) -> Tracked:
        """``t``'s entry; a tensor never seen before becomes a constant (``op`` reads it)."""
        return self._tracked.get(id(t)) or self._unknown(t, op)

    def aliases(self, t: torch.Tensor) -> list[Tracked]:
        """Tracked tensors (other than ``t``) whose memory overlaps ``t``'s."""
        lo, hi = extent(t)
        entries = self.same_storage(t)
        return [e for e in entries if e.tensor is not t and overlaps(extent(e.tensor), lo, hi)]

    def same_storage(self, t: torch.Tensor) -> list[Tracked]:
        """Every tracked tensor on ``t``'s storage (``t`` included if tracked)."""
        key = storage_key(t)
        return list(self._by_storage.get(key, {}).values()) if key is not None else []

    def snapshot(self, tensors: list[torch.Tensor]) -> None:
        """Before an in-place op: keep copies of the values it is about to overwrite."""
        for t in tensors:
            for entry in [self.lookup(t)] + self.aliases(t):
                if entry is not None and self.values.get(entry.node) is entry.tensor:
                    self.values[entry.node] = copy_like(entry.tensor, entry.tensor)

    def read(self, t: Any, op: str) -> Any:
        """The node holding tensor ``t``'s current value, or computing the SymInt ``t``."""
        if not isinstance(t, torch.Tensor):
            return self.read_size(t)
        entry = self._tracked.get(id(t)) or self._unknown(t, op)  # (unknown: a constant)
        if entry.stale:
            raise _stale_read_error(op, entry)
        return entry.node

    # -- sizes ---------------------------------------------------------------------------------
    def read_size(self, value: Any) -> Any:
        """The node computing a SymInt (built on first use); other values unchanged."""
        return self._size_node(sym_expr(value)) if is_symbolic(value) else value

    def _size_node(self, expr: Any) -> Any:
        """The node computing the size expression ``expr`` (a number if it is constant)."""
        if expr not in self.sym_nodes:
            node = to_fx(expr, self.graph, self._symbol_node)
            if not isinstance(node, fx.Node):  # a constant expression: the number itself
                return node
            self.sym_nodes[expr] = node
        return self.sym_nodes[expr]

    def _symbol_node(self, symbol: Any) -> fx.Node:
        """The node holding ``symbol``: a SymInt input, or a size of an input tensor."""
        if symbol in self.sym_nodes:
            return self.sym_nodes[symbol]
        for node in self.placeholders:
            val = self.values[node]
            if not isinstance(val, torch.Tensor):
                continue
            for op, sizes in ((aten.sym_size.int, val.shape), (aten.sym_stride.int, val.stride())):
                for dim, size in enumerate(sizes):
                    if is_symbolic(size) and sym_expr(size) == symbol:
                        with self.graph.inserting_after(self.placeholders[-1]):
                            read = self.graph.call_function(op, (node, dim))
                        read.meta["val"] = size
                        self.values[read] = size
                        self.sym_nodes[symbol] = read
                        return read
        raise RuntimeError(f"toycomp.aot: no input holds the size {symbol}")

    def bind_symbols(self) -> None:
        """A node for every symbol of the inputs' sizes (the backward may need them too)."""
        for node in list(self.placeholders):
            val = self.values[node]
            for size in (*val.shape, *val.stride()) if isinstance(val, torch.Tensor) else ():
                for symbol in free_symbols(size):  # (none for a number)
                    self._symbol_node(symbol)

    def _unknown(self, t: torch.Tensor, op: str) -> Tracked:
        # [Note: tensors the recorder did not see being made]
        # A tensor that no recorded op produced is a constant (closed over by fn, or the
        # argument of aten.lift_fresh for torch.tensor(...)). It becomes a get_attr node
        # holding a *copy*: the trace runs ops for real and could mutate the original.
        # If it shares memory with a traced tensor it was made by a non-ATen path (`.data`):
        # with the same view we can reuse that node, otherwise we refuse.
        aliases = self.aliases(t)
        for alias in aliases:
            if same_view(alias.tensor, t) and not alias.stale:
                return self.track(t, alias.node)
        if aliases:
            raise RuntimeError(f"toycomp.aot: {op} got an untraced alias of a traced tensor")
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"toycomp.aot: {op} uses a closed-over tensor that requires grad "
                f"(shape {tuple(t.shape)}); pass it as an input so it gets a gradient."
            )
        # An expanded constant is stored compact and expanded again, keeping t's strides.
        shape = [1 if st == 0 else n for n, st in zip(t.shape, t.stride())]
        name = f"_tensor_constant{len(self.constants)}"
        with no_fake_mode():  # a real tensor (torch.tensor(...)), also when tracing on fakes
            compact = t.detach().as_strided(shape, t.stride(), t.storage_offset())
            self.constants[name] = copy_like(compact, compact)  # t's strides where it can
        node = self.graph.get_attr(name)
        node.meta["val"] = _plain_meta(self.constants[name])
        if shape != list(t.shape):
            node = self.emit(aten.expand.default, (node, list(t.shape)), {}, t)
        return self.track(t, node, constant=True)


def _stale_read_error(op: str, entry: Tracked) -> RuntimeError:
    return RuntimeError(
        f"toycomp.aot: {op} reads a tensor that {entry.stale} overwrote through a "
        "view/alias (e.g. x[0].mul_(2) then reading x). In-place ops on views are not "
        "functionalised by toycomp; use an out-of-place op (x = x * 2, torch.where...)."
    )


def _plain_meta(val: Any) -> Any:
    """``to_meta_value``, plain meta tensors also under a ``FakeTensorMode`` (for later stages)."""
    with no_fake_mode():
        return to_meta_value(val)
