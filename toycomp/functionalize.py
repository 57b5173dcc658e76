"""Functionalisation: ATen ops as they run (in place, ``out=``, views) -> a functional ATen graph.

Input: a function running on real tensors, one ATen op at a time, under a ``FunctionalRecorder``
(a ``TorchDispatchMode``). Output IR: a ``torch.fx.Graph`` of out-of-place ATen ops (no
``aten.add_``, no ``out=``), every node with ``meta["val"]`` (a meta tensor with the node's
shape, dtype and stride); ``toycomp.aot`` turns it into the joint / forward graph.

Tiny example, a write through a view::

    def f(x):                     # recorded as
        y = x * 2                 #   mul = aten.mul.Tensor(primals_1, 2)
        y[0].add_(1)              #   select = aten.select.int(mul, 0, 0)
                                  #   add = aten.add.Tensor(select, 1)
                                  #   scatter = aten.as_strided_scatter(mul, add, [2], [1], 0)
        return y                  #   return (scatter,)

Recording: every tensor operation in PyTorch goes through the *dispatcher*, which runs a stack
of handlers (autograd, then the backend kernel). A ``TorchDispatchMode`` adds a Python handler,
``__torch_dispatch__(func, types, args, kwargs)``, called *below* autograd with ``func`` an ATen
``OpOverload``. We run ``func`` for real and add a node to an fx graph, mapping each result
tensor to its node. Because we sit below autograd, we also see the ATen ops that autograd's
*backward* runs: ``torch.autograd.grad`` with the mode active records the backward into the
same graph (the joint graph). And composite ops (``F.gelu``, ``matmul``) arrive already turned
into the ATen ops that really run.

Functionalisation: in-place ATen ops (``aten.mul_``, ``aten.copy_``, ``out=`` ops) are recorded
as their out-of-place versions (``_functional_variant``), and the mutated tensor's "current
value" becomes the new node (``FunctionalRecorder._replace``). Writes through views
(``x[0].mul_(2)``) regenerate the base and its other views with ``as_strided_scatter`` /
``as_strided``; where that is impossible (a view that reinterprets the dtype) reading the
overwritten tensor raises an error naming the in-place op. Mutations of graph *inputs* are
left to ``toycomp.aot``, which returns their final values for its runtime wrapper to copy back.

NB: in PyTorch the recording is make_fx's ``ProxyTorchDispatchMode``
(torch/fx/experimental/proxy_tensor.py) and functionalisation is ``FunctionalTensorMode``
(torch/_subclasses/functional_tensor.py) over C++'s ``FunctionalTensorWrapper`` /
``FunctionalStorageImpl`` (aten/src/ATen/FunctionalTensorWrapper.cpp, which replays view
mutations on the base much like ``_replace`` here), with helpers in
torch/_functorch/_aot_autograd/functional_utils.py (``to_fun``, ``from_fun``,
``has_data_mutation``, ``gen_alias_from_base``). PyTorch traces with fake tensors; toycomp runs
every op on the real example inputs, which is simpler and slower.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import defaultdict
from typing import Any

import torch
import torch.fx as fx

from toycomp._torch_compat import TorchDispatchMode, tree_map

__all__ = [
    "BATCH_NORM_OPS",
    "DATA_DEPENDENT_OPS",
    "FUNCTIONAL_OVERRIDES",
    "FunctionalRecorder",
    "UNSUPPORTED_MUTATIONS",
    "copy_like",
    "is_dense",
    "storage_key",
]

aten = torch.ops.aten


def _ops(*names: str) -> set:
    """The ATen overloads named ``packet.overload`` that exist in this PyTorch build."""
    found = set()
    for name in names:
        packet, overload = name.split(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            found.add(op)
    return found


# Results that depend on tensor *values*: tracing them on one example would bake it in.
DATA_DEPENDENT_OPS = _ops(
    "_local_scalar_dense.default", "nonzero.default", "masked_select.default",
    "_unique2.default", "unique_dim.default", "unique_consecutive.default",
    "repeat_interleave.Tensor", "bincount.default",
)  # fmt: skip
UNSUPPORTED_MUTATIONS = _ops(
    "set_.source_Tensor", "set_.source_Storage", "set_.source_Storage_storage_offset",
    "resize_.default", "resize_as_.default", "cudnn_batch_norm.default",
    "miopen_batch_norm.default",
)  # fmt: skip
# Functional versions that are not "drop the trailing underscore".
FUNCTIONAL_OVERRIDES = dict(zip(_ops("normal_.default"), _ops("normal_functional.default")))
# [Note: batch norm's hidden mutation]
# native_batch_norm updates running_mean/running_var in place, but its schema does not say so
# (no `Tensor(a!)`). We rewrite it, in training mode, to _native_batch_norm_legit_functional,
# whose outputs 3 and 4 are the new running statistics (that is what PyTorch does too).
BATCH_NORM_OPS = _ops("native_batch_norm.default", "_native_batch_norm_legit.default")


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _meta_val(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _meta(value)
    if isinstance(value, (tuple, list)):
        return tuple(_meta_val(v) for v in value)
    return value


def copy_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A fresh copy of ``t``'s values with ``like``'s strides (contiguous if impossible)."""
    try:
        out = torch.empty_strided(like.shape, like.stride(), dtype=t.dtype, device=t.device)
        return out.copy_(t.detach())
    except RuntimeError:  # e.g. expanded (stride 0) layouts cannot be written to
        return t.detach().clone(memory_format=torch.contiguous_format)


def storage_key(t: torch.Tensor) -> tuple | None:
    storage = t.untyped_storage()
    return None if storage.nbytes() == 0 else (t.device, storage.data_ptr())


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte range [lo, hi) of its storage that ``t`` may touch."""
    size = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return t.storage_offset() * size, (t.storage_offset() + last + 1) * size


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape, a.stride(), a.storage_offset(), a.dtype) == (
        b.shape,
        b.stride(),
        b.storage_offset(),
        b.dtype,
    )


@dataclasses.dataclass
class _Tracked:
    """What the recorder knows about one real tensor: the node holding its current value."""

    tensor: torch.Tensor  # kept alive so that id(tensor) is never reused during a trace
    node: fx.Node
    stale: str | None = None  # name of the in-place op that overwrote it through an alias
    constant: bool = False


class FunctionalRecorder(TorchDispatchMode):
    """Runs every ATen op for real and records its functional version in ``self.graph``.

    make_fx's tracer and FunctionalTensorMode in one (see the module docstring). ``placeholder``
    registers an input, ``read`` gives the node holding a tensor's current value, ``values``
    maps nodes to their real values (the example inputs of the compiled graphs).
    """

    def __init__(self) -> None:
        super().__init__()
        self.graph = fx.Graph()
        self.constants: dict[str, torch.Tensor] = {}
        self.values: dict[fx.Node, torch.Tensor] = {}  # real value of each node
        self.placeholders: list[fx.Node] = []
        self._tracked: dict[int, _Tracked] = {}
        self._by_storage: dict[tuple, dict[int, _Tracked]] = defaultdict(dict)

    # -- tensor <-> node bookkeeping -------------------------------------------------------
    def placeholder(self, name: str, t: torch.Tensor) -> fx.Node:
        if self.placeholders:
            with self.graph.inserting_after(self.placeholders[-1]):
                node = self.graph.placeholder(name)
        else:
            node = self.graph.placeholder(name)
        node.meta["val"] = _meta(t)
        self.placeholders.append(node)
        self._track(t, node)
        return node

    def _track(self, t: torch.Tensor, node: fx.Node, constant: bool = False) -> _Tracked:
        entry = _Tracked(t, node, constant=constant)
        self._tracked[id(t)] = entry
        self.values.setdefault(node, t)
        key = storage_key(t)
        if key is not None:
            self._by_storage[key][id(t)] = entry
        return entry

    def _aliases(self, t: torch.Tensor) -> list[_Tracked]:
        """Tracked tensors (other than ``t``) whose memory overlaps ``t``'s."""
        key = storage_key(t)
        if key is None:
            return []
        lo, hi = _extent(t)
        entries = self._by_storage.get(key, {}).values()
        return [e for e in entries if e.tensor is not t and _overlaps(_extent(e.tensor), lo, hi)]

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

    def _unknown(self, t: torch.Tensor, op: str) -> _Tracked:
        # [Note: tensors the recorder did not see being made]
        # A tensor that no recorded op produced is a constant (closed over by fn, or the
        # argument of aten.lift_fresh for torch.tensor(...)). It becomes a get_attr node
        # holding a *copy*: the trace runs ops for real and could mutate the original.
        # If it shares memory with a traced tensor it was made by a non-ATen path (`.data`):
        # with the same view we can reuse that node, otherwise we refuse.
        aliases = self._aliases(t)
        for alias in aliases:
            if _same_view(alias.tensor, t) and not alias.stale:
                return self._track(t, alias.node)
        if aliases:
            raise RuntimeError(f"toycomp.aot: {op} got an untraced alias of a traced tensor")
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(
                f"toycomp.aot: {op} uses a closed-over tensor that requires grad "
                f"(shape {tuple(t.shape)}); pass it as an input so it gets a gradient."
            )
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = t.detach().clone()
        node = self.graph.get_attr(name)
        node.meta["val"] = _meta(t)
        return self._track(t, node, constant=True)

    def _emit(self, op: Any, args: tuple, kwargs: dict, val: Any) -> fx.Node:
        name = getattr(op, "overloadpacket", op).__name__
        node = self.graph.create_node("call_function", op, args, kwargs, name=name)
        node.meta["val"] = _meta_val(val)
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

    # -- the dispatch hook -----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DATA_DEPENDENT_OPS:
            raise RuntimeError(f"toycomp.aot: {func} is data-dependent (its result or shape "
                               "depends on tensor values); it cannot be traced ahead of time")
        mutated = _mutated_args(func, args, kwargs)
        nargs, nkwargs = tree_map(lambda a: self.read(a, str(func)), (args, kwargs))
        if mutated:
            self._snapshot([t for _, t in mutated])
        out = func(*args, **kwargs)
        if not mutated:
            results = self._emit_results(self._emit(func, nargs, nkwargs, out), out)
            for t, node in zip(_as_list(out), results):
                if node is not None:
                    self._track(t, node)
        elif func is aten.copy_.default:
            self._replace(args[0], self._copy_value(nargs[1], args[1], args[0]), str(func))
        else:
            self._functionalize(func, mutated, nargs, nkwargs, (args, kwargs), out)
        return out

    # -- functionalisation -----------------------------------------------------------------
    def _snapshot(self, tensors: list[torch.Tensor]) -> None:
        """Before an in-place op: keep copies of the values it is about to overwrite."""
        for t in tensors:
            for entry in [self._tracked.get(id(t))] + self._aliases(t):
                if entry is not None and self.values.get(entry.node) is entry.tensor:
                    self.values[entry.node] = copy_like(entry.tensor, entry.tensor)

    def _replace(self, t: torch.Tensor, node: fx.Node, op: str, view_op: bool = False) -> None:
        """``t`` was mutated by ``op`` and now holds ``node``'s value; update its aliases.

        Like ``FunctionalTensorWrapper::replace_`` followed by regenerating every view of the
        base (``FunctionalStorageImpl::apply_updates``).
        """
        old = self._tracked.get(id(t))
        if old is not None and old.constant:
            raise RuntimeError(f"toycomp.aot: {op} mutates a closed-over constant tensor")
        entry = self._retrack(self._track(t, node), node)
        aliases = self._aliases(t)
        if view_op:  # unsqueeze_ & co change metadata only, not values
            return
        for alias in aliases:
            if _same_view(alias.tensor, t):  # e.g. x and x.detach(): same value
                self._retrack(alias, node)
        others = [a for a in aliases if not _same_view(a.tensor, t)]
        if not others:
            return
        # [Note: mutating through views]
        # t shares memory with other tensors (x[0].mul_(2): t = x[0], alias x). We find a
        # "root" alias: a dense tensor covering all the memory involved (x). Its new value is
        # as_strided_scatter(root, new t, t's geometry) and every alias is regenerated as
        # as_strided(new root, alias geometry), offsets relative to the root, which must be a
        # fresh tensor (not a view with its own offset). Without a root (views reinterpreting
        # dtype...), the aliases are marked stale: reading one later raises naming `op`.
        root = self._root([entry, *aliases])
        if root is None:
            for alias in others:
                alias.stale = op
            return
        base = self._relayout(root.node, root.tensor, force=not _is_fresh(root.node))
        if root is not entry:
            geometry = _geometry(t, root.tensor)
            base = self._emit(aten.as_strided_scatter.default, (base, node, *geometry), {},
                              _meta(root.tensor))  # fmt: skip
        self._retrack(root, base)
        for alias in others:
            if alias is not root:
                args = (base, *_geometry(alias.tensor, root.tensor))
                self._retrack(alias, self._emit(aten.as_strided.default, args, {}, alias.tensor))

    def _retrack(self, entry: _Tracked, node: fx.Node) -> _Tracked:
        entry.node, entry.stale = node, None
        value, meta = self.values.get(node), node.meta["val"]
        if value is None or (value is entry.tensor and value.stride() != meta.stride()):
            self.values[node] = copy_like(entry.tensor, meta)
        return entry

    def _root(self, entries: list[_Tracked]) -> _Tracked | None:
        """A dense alias, not stale, that covers the memory of all ``entries`` (or None)."""
        lo = min(_extent(e.tensor)[0] for e in entries)
        hi = max(_extent(e.tensor)[1] for e in entries)
        if len({e.tensor.dtype for e in entries}) > 1:
            return None
        for e in entries:
            e_lo, e_hi = _extent(e.tensor)
            if not e.stale and e_lo <= lo and e_hi >= hi and is_dense(e.tensor):
                return e
        return None

    def _relayout(self, node: fx.Node, like: torch.Tensor, force: bool = False) -> fx.Node:
        """``node``'s value in a fresh tensor with ``like``'s strides (for as_strided)."""
        if not force and (node.meta["val"].stride() == like.stride() or like.numel() <= 1):
            return node
        size, stride = list(like.shape), list(like.stride())
        empty = self._emit(aten.empty_strided.default, (size, stride), _factory(like), like)
        args = (empty, node, size, stride, 0)
        return self._emit(aten.as_strided_scatter.default, args, {}, like)

    def _functionalize(self, func, mutated, nargs, nkwargs, real, out) -> None:
        op = str(func)
        functional, result_of, outputs = _functional_variant(func, [n for n, _ in mutated])
        schema = func._schema
        drop = {a.name for a in schema.arguments if a.is_out}
        # Defaults of the in-place schema (bernoulli_(p=0.5)) may be required by the functional.
        defaults = {a.name: a.default_value for a in schema.arguments[len(real[0]) :]
                    if a.has_default_value() and a.name not in drop and a.name not in nkwargs}
        nkwargs = {k: v for k, v in (defaults | nkwargs).items() if k not in drop}
        margs, mkwargs = tree_map(lambda a: _meta(a) if isinstance(a, torch.Tensor) else a, real)
        mkwargs = {k: v for k, v in (defaults | mkwargs).items() if k not in drop}
        try:
            val = functional(*margs, **mkwargs)
        except Exception as e:  # noqa: BLE001 - re-raised with the op's name
            raise NotImplementedError(f"toycomp.aot: cannot functionalise {op}: {e}") from e
        results = self._emit_results(self._emit(functional, nargs, nkwargs, val), val)
        view_op = torch.Tag.inplace_view in func.tags
        for (_, t), index in zip(mutated, result_of):
            self._replace(t, self._convert(results[index], t), op, view_op)
        for index, item in enumerate(outputs):
            self._track(out[index], results[item])

    def _convert(self, node: fx.Node, like: torch.Tensor) -> fx.Node:
        """In-place ops keep the mutated tensor's dtype; the functional op may promote."""
        val = node.meta["val"]
        if val.shape != like.shape:
            raise RuntimeError(f"toycomp.aot: {node.target} changed shape {like.shape}")
        if val.dtype == like.dtype:
            return node
        return self._emit(aten._to_copy.default, (node,), {"dtype": like.dtype}, like)

    def _copy_value(self, src: fx.Node, src_t: torch.Tensor, dst: torch.Tensor) -> fx.Node:
        """``dst.copy_(src)`` leaves ``src`` converted to ``dst``'s dtype and expanded."""
        node, val = src, src_t
        if src_t.dtype != dst.dtype or src_t.device != dst.device:
            kwargs: dict[str, Any] = {"dtype": dst.dtype}
            if src_t.device != dst.device:
                kwargs["device"] = dst.device
            val = torch.empty_strided(val.shape, val.stride(), dtype=dst.dtype, device="meta")
            node = self._emit(aten._to_copy.default, (node,), kwargs, val)
        if tuple(src_t.shape) != tuple(dst.shape):
            val = _meta(val).expand(dst.shape)
            node = self._emit(aten.expand.default, (node, list(dst.shape)), {}, val)
        return node


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: its elements fill a contiguous block of memory."""
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _geometry(t: torch.Tensor, root: torch.Tensor) -> tuple[list[int], list[int], int]:
    """(size, stride, storage offset relative to ``root``) of the view ``t``."""
    return list(t.shape), list(t.stride()), t.storage_offset() - root.storage_offset()


def _is_fresh(node: fx.Node) -> bool:
    """Is ``node``'s value a new tensor (storage offset 0), not a view of another value?"""
    if node.target is operator.getitem:
        node = node.args[0]
    target = node.target
    is_view = getattr(target, "is_view", True) or target is aten._unsafe_view.default
    return node.op == "call_function" and not is_view


def _factory(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": t.dtype, "device": t.device}


def _as_list(value: Any) -> list:
    return [value] if isinstance(value, torch.Tensor) else list(value)


def _overlaps(extent: tuple[int, int], lo: int, hi: int) -> bool:
    return extent[0] < hi and lo < extent[1]


def _mutated_args(func, args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """(argument name, tensor) for every tensor that ``func`` writes to, in schema order."""
    schema = func._schema
    bound = {a.name: v for a, v in zip(schema.arguments, args)} | kwargs
    if func in BATCH_NORM_OPS:
        training = bound.get("training", False)
        names = ["running_mean", "running_var"] if training else []
    else:
        names = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    mutated = [(n, bound[n]) for n in names if bound.get(n) is not None]
    if mutated and func in UNSUPPORTED_MUTATIONS:
        raise NotImplementedError(f"toycomp.aot: {func} (in-place) is not supported")
    for name, value in mutated:
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"toycomp.aot: {func} mutates a list of tensors ({name})")
    return mutated


def _functional_variant(func, mutated: list[str]) -> tuple[Any, list[int], list[int]]:
    """The out-of-place twin of ``func``.

    Returns ``(functional_op, result index per mutated arg, result index per op output that is
    not a mutated arg)``.
    """
    if func in BATCH_NORM_OPS:
        return aten._native_batch_norm_legit_functional.default, [3, 4], [0, 1, 2]
    schema = func._schema
    outs = [a.name for a in schema.arguments if a.is_out]
    if func in FUNCTIONAL_OVERRIDES:
        return FUNCTIONAL_OVERRIDES[func], [0], []
    name = func.overloadpacket.__name__
    base = name[:-1] if name.endswith("_") and not outs else name
    packet = getattr(aten, base, None)
    want = [(a.name, str(a.type)) for a in schema.arguments if a.name not in outs]
    for overload in packet.overloads() if packet is not None else []:
        candidate = getattr(packet, overload)
        args = [(a.name, str(a.type)) for a in candidate._schema.arguments]
        if not candidate._schema.is_mutable and args == want:
            return candidate, list(range(len(mutated))), []
    raise NotImplementedError(f"toycomp.aot: no out-of-place version of {func} to functionalise")
