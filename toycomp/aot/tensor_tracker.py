"""Tensor <-> node bookkeeping for the ATen recorder: real tensors -> the fx nodes holding them.

Input -> output: the real tensors that ATen ops read and produce while a function runs -> the
``torch.fx.Graph`` being recorded and, for each live tensor, the node holding its *current*
value (``Tracked``). ``TensorTracker`` is the half of ``toycomp.functionalize``'s
``FunctionalRecorder`` that has no opinion about ops: it adds placeholders, nodes and constants,
maps each tensor to its node (``read``), and finds a tensor's aliases by storage (``_aliases``).
The recorder's dispatch hook and its functionalisation live in toycomp/functionalize.py.

Tiny example (inside ``FunctionalRecorder``, a ``TensorTracker``)::

    x, w = torch.randn(3), torch.randn(3)   # w: made before recording started
    recorder.placeholder("primals_1", x)    # primals_1 = placeholder()
    y = x * 2                               # mul = aten.mul.Tensor(primals_1, 2); y -> mul
    recorder.read(y, "aten.sin")            # the node mul
    recorder.read(w, "aten.sin")            # _tensor_constant0 = get_attr (a copy of w)

NB: in PyTorch this lives in torch/fx/experimental/proxy_tensor.py (``PythonKeyTracer``, its
``tensor_tracker`` and ``set_proxy_slot`` / ``get_proxy_slot``), the bookkeeping half of make_fx's
``ProxyTorchDispatchMode``.
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
from toycomp.tensor_utils import to_meta, to_meta_value

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

    ``placeholder`` registers an input, ``read`` gives the node holding a tensor's current
    value, ``values`` maps nodes to their real values (the example inputs of the compiled
    graphs).
    """

    def __init__(self) -> None:
        super().__init__()
        self.graph = fx.Graph()
        self.constants: dict[str, torch.Tensor] = {}
        self.values: dict[fx.Node, torch.Tensor] = {}  # real value of each node
        self.placeholders: list[fx.Node] = []
        self._tracked: dict[int, Tracked] = {}
        self._by_storage: dict[tuple, dict[int, Tracked]] = defaultdict(dict)

    def placeholder(self, name: str, t: torch.Tensor) -> fx.Node:
        if self.placeholders:
            with self.graph.inserting_after(self.placeholders[-1]):
                node = self.graph.placeholder(name)
        else:
            node = self.graph.placeholder(name)
        node.meta["val"] = to_meta(t)
        self.placeholders.append(node)
        self._track(t, node)
        return node

    def _track(self, t: torch.Tensor, node: fx.Node, constant: bool = False) -> Tracked:
        entry = Tracked(t, node, constant=constant)
        self._tracked[id(t)] = entry
        self.values.setdefault(node, t)
        key = storage_key(t)
        if key is not None:
            self._by_storage[key][id(t)] = entry
        return entry

    def _aliases(self, t: torch.Tensor) -> list[Tracked]:
        """Tracked tensors (other than ``t``) whose memory overlaps ``t``'s."""
        key = storage_key(t)
        if key is None:
            return []
        lo, hi = extent(t)
        entries = self._by_storage.get(key, {}).values()
        return [e for e in entries if e.tensor is not t and overlaps(extent(e.tensor), lo, hi)]

    def read(self, t: Any, op: str) -> Any:
        """The node holding ``t``'s current value (non-tensors are returned unchanged)."""
        if not isinstance(t, torch.Tensor):
            return t
        entry = self._tracked.get(id(t))
        if entry is None:
            entry = self._unknown(t, op)
        if entry.stale:
            raise RuntimeError(
                f"toycomp.aot: {op} reads a tensor that {entry.stale} overwrote through a "
                "view/alias (e.g. x[0].mul_(2) then reading x). In-place ops on views are not "
                "functionalised by toycomp; use an out-of-place op (x = x * 2, torch.where...)."
            )
        return entry.node

    def _unknown(self, t: torch.Tensor, op: str) -> Tracked:
        # [Note: tensors the recorder did not see being made]
        # A tensor that no recorded op produced is a constant (closed over by fn, or the
        # argument of aten.lift_fresh for torch.tensor(...)). It becomes a get_attr node
        # holding a *copy*: the trace runs ops for real and could mutate the original.
        # If it shares memory with a traced tensor it was made by a non-ATen path (`.data`):
        # with the same view we can reuse that node, otherwise we refuse.
        aliases = self._aliases(t)
        for alias in aliases:
            if same_view(alias.tensor, t) and not alias.stale:
                return self._track(t, alias.node)
        if aliases:
            raise RuntimeError(f"toycomp.aot: {op} got an untraced alias of a traced tensor")
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"toycomp.aot: {op} uses a closed-over tensor that requires grad "
                f"(shape {tuple(t.shape)}); pass it as an input so it gets a gradient."
            )
        # An expanded constant is stored compact and expanded again, keeping t's strides.
        shape = [1 if st == 0 else n for n, st in zip(t.shape, t.stride())]
        compact = t.detach().as_strided(shape, t.stride(), t.storage_offset())
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = copy_like(compact, compact)  # t's strides where it can
        node = self.graph.get_attr(name)
        node.meta["val"] = to_meta(self.constants[name])
        if shape != list(t.shape):
            node = self._emit(aten.expand.default, (node, list(t.shape)), {}, t)
        return self._track(t, node, constant=True)

    def _emit(self, op: Any, args: tuple, kwargs: dict, val: Any) -> fx.Node:
        name = getattr(op, "overloadpacket", op).__name__
        node = self.graph.create_node("call_function", op, args, kwargs, name=name)
        node.meta["val"] = to_meta_value(val)
        return node

    def _emit_results(self, node: fx.Node, val: Any) -> list[fx.Node | None]:
        """One node per tensor result of ``node``: itself, or a getitem per tuple element."""
        if isinstance(val, torch.Tensor):
            return [node]
        if not isinstance(val, (tuple, list)):
            raise RuntimeError(f"toycomp.aot: {node.target} returned a non-tensor {val!r}")
        nodes: list[fx.Node | None] = []
        for i, item in enumerate(val):
            if item is not None and not isinstance(item, torch.Tensor):
                raise RuntimeError(f"toycomp.aot: {node.target} returned a non-tensor {item!r}")
            getitem = None if item is None else self._emit(operator.getitem, (node, i), {}, item)
            nodes.append(getitem)
        return nodes

    def _retrack(self, entry: Tracked, node: fx.Node) -> Tracked:
        entry.node, entry.stale = node, None
        value, meta = self.values.get(node), node.meta["val"]
        if value is None or (value is entry.tensor and value.stride() != meta.stride()):
            self.values[node] = copy_like(entry.tensor, meta)
        return entry
