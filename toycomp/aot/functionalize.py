"""Functionalisation: ATen ops as they run (in place, ``out=``, views) -> a functional ATen graph.

Input: a function running on real tensors, one ATen op at a time, under a ``FunctionalRecorder``
(a ``TorchDispatchMode``). Output IR: a ``torch.fx.Graph`` of out-of-place ATen ops (no
``aten.add_``, no ``out=``), every node with ``meta["val"]`` (a meta tensor with the node's
shape, dtype and stride), held by a ``TensorTracker`` (toycomp/aot/tensor_tracker.py);
toycomp/aot/aot_autograd.py turns it into the joint / forward graph. A write through a view:

    >>> import torch
    >>> from toycomp.aot.tensor_tracker import TensorTracker
    >>> tracker, x = TensorTracker(), torch.randn(2)
    >>> _ = tracker.placeholder("primals_1", x)
    >>> with FunctionalRecorder(tracker):
    ...     y = x * 2
    ...     _ = y[0].add_(1)
    >>> _ = tracker.graph.output((tracker.read(y, "output"),))
    >>> print(fx.GraphModule({}, tracker.graph).code.strip())
    def forward(self, primals_1):
        mul = torch.ops.aten.mul.Tensor(primals_1, 2);  primals_1 = None
        select = torch.ops.aten.select.int(mul, 0, 0)
        add = torch.ops.aten.add.Tensor(select, 1, alpha = 1);  select = None
        as_strided_scatter = torch.ops.aten.as_strided_scatter.default(mul, add, [], [], 0); ...
        return (as_strided_scatter,)

Recording: every tensor operation in PyTorch goes through the *dispatcher*, which runs a stack
of handlers (autograd, then the backend kernel). A ``TorchDispatchMode`` adds a Python handler,
``__torch_dispatch__(func, types, args, kwargs)``, called *below* autograd with ``func`` an ATen
``OpOverload``. We run ``func`` for real and add a node to an fx graph, mapping each result
tensor to its node. Because we sit below autograd, we also see the ATen ops that autograd's
*backward* runs: ``torch.autograd.grad`` with the mode active records the backward into the
same graph (the joint graph). And composite ops (``F.gelu``, ``matmul``) arrive already turned
into the ATen ops that really run.

Functionalisation: in-place ATen ops (``aten.mul_``, ``aten.copy_``, ``out=`` ops) are recorded
as their out-of-place versions (``functional_variant``), and the mutated tensor's "current
value" becomes the new node (``FunctionalRecorder._replace``). Writes through views
(``x[0].mul_(2)``) regenerate the base and its other views with ``as_strided_scatter`` /
``as_strided``; where that is impossible (a view that reinterprets the dtype) reading the
overwritten tensor raises an error naming the in-place op. Each node keeps its tensor's
strides ([Note: a node has its tensor's layout]) and ``as_strided``, which reads memory rather
than values, is taken on a fresh root ([Note: as_strided reads memory]). Mutations of graph
*inputs* are left to aot_autograd.py, which returns their final values for its runtime wrapper
to copy back. Schema and memory helpers live in toycomp/aot/functional_utils.py.

NB: in PyTorch the recording is make_fx's ``ProxyTorchDispatchMode``
(torch/fx/experimental/proxy_tensor.py) and functionalisation is ``FunctionalTensorMode``
(torch/_subclasses/functional_tensor.py) over C++'s ``FunctionalTensorWrapper`` /
``FunctionalStorageImpl`` (aten/src/ATen/FunctionalTensorWrapper.cpp, which replays view
mutations on the base much like ``_replace`` here), with helpers in
torch/_functorch/_aot_autograd/functional_utils.py (``to_fun``, ``from_fun``,
``has_data_mutation``, ``gen_alias_from_base``). Like PyTorch, toycomp.compile traces on fake
tensors: aot_function runs this recorder inside their ``FakeTensorMode``, so "running ``func``
for real" below computes metadata only; given real tensors it really computes.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
import torch.fx as fx

from toycomp._torch_compat import TorchDispatchMode, is_fake, schema_of, tree_flatten, tree_map
from toycomp.aot.functional_utils import (
    AS_STRIDED_OPS,
    DATA_DEPENDENT_OPS,
    bind_arguments,
    covers,
    extent,
    functional_variant,
    geometry,
    is_dense,
    mutated_args,
    non_overlapping,
    same_view,
    span,
)
from toycomp.aot.tensor_tracker import TensorTracker, Tracked
from toycomp.tensor_utils import same_strides, to_meta

__all__ = ["FunctionalRecorder"]

aten = torch.ops.aten
# FakeTensor's errors for an op whose output shape needs the data (x[mask] with a bool mask
# calls nonzero inside the fake kernel of aten.index), matched by name: the classes are private.
DATA_DEPENDENT_ERRORS = ("DynamicOutputShapeException", "DataDependentOutputException")
# Ops that answer a question about a tensor (no tensor result): a fake tensor answers its device
# through the dispatcher, so the recorder sees them when tracing on fake tensors.
METADATA_QUERIES = {torch.ops.prim.device.default, torch.ops.prim.layout.default}
_SPECIAL_OPS = DATA_DEPENDENT_OPS | AS_STRIDED_OPS


class FunctionalRecorder(TorchDispatchMode):
    """Runs every ATen op for real and records its functional version in ``tracker.graph``.

    make_fx's tracer and FunctionalTensorMode in one (see the module docstring). Which node
    holds which tensor is the ``TensorTracker``'s business (toycomp/aot/tensor_tracker.py):
    the caller makes one, adds the placeholders, runs the function under the recorder and reads
    the outputs' nodes from it.
    """

    def __init__(self, tracker: TensorTracker) -> None:
        super().__init__()
        self.tracker = tracker

    # -- the dispatch hook -----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in METADATA_QUERIES:  # a fake tensor's device asked through the dispatcher
            return func(*args, **kwargs)
        if func in _SPECIAL_OPS:  # data-dependent ops, as_strided
            return self._special_op(func, args, kwargs)
        mutated = mutated_args(func, args, kwargs)
        random = torch.Tag.nondeterministic_seeded in func.tags
        if random and (order := _memory_order(func, mutated, args)) is not None:
            return self._fill_in_memory_order(func, types, args, kwargs, order)
        if func.is_view or torch.Tag.inplace_view in func.tags:
            self._ensure_layout(args[0], str(func))
        nargs, nkwargs = tree_map(lambda a: self.tracker.read(a, str(func)), (args, kwargs))
        if mutated:
            self.tracker.snapshot([t for _, t in mutated])
        try:
            with _draws_nothing(args, kwargs) if random else contextlib.nullcontext():
                out = func(*args, **kwargs)
        except RuntimeError as e:
            _raise_if_data_dependent(func, e)  # x[mask]'s nonzero, in the fake kernel of index
            raise
        if mutated:  # in place or out=: recorded as the out-of-place op
            self._functionalize(func, mutated, nargs, nkwargs, (args, kwargs), out)
        elif isinstance(out, torch.Tensor):
            self.tracker.track(out, self.tracker.emit(func, nargs, nkwargs, out))
        else:  # sizes, tuples of results
            self._track_results(self.tracker.emit(func, nargs, nkwargs, out), out)
        return out

    def _track_results(self, node: fx.Node, out: Any) -> None:
        """Track each tensor of a result that is not one tensor: a size, or a tuple."""
        for t, result in zip(_as_list(out), self.tracker.emit_results(node, out)):
            if result is not None:
                self.tracker.track(t, result)

    def _special_op(self, func, args: tuple, kwargs: dict) -> Any:
        """A data-dependent op (refused) or ``as_strided``."""
        if func in DATA_DEPENDENT_OPS:  # the graph then runs as captured, with a warning
            raise _data_dependent(func, "is data-dependent (its result or shape depends on "
                                  "tensor values); it cannot be traced ahead of time")  # fmt: skip
        return self._as_strided(func, args, kwargs)

    def _fill_in_memory_order(self, func, types, args, kwargs, order: list[int]) -> Any:
        """Record an in-place random op on the contiguous permutation of the tensor it fills
        ([Note: random ops draw in memory order])."""
        view = self.__torch_dispatch__(aten.permute.default, types, (args[0], order), {})
        self.__torch_dispatch__(func, types, (view, *args[1:]), kwargs)
        return args[0]

    # -- functionalisation -----------------------------------------------------------------
    def _replace(self, t: torch.Tensor, node: fx.Node, op: str, view_op: bool = False) -> None:
        """``t`` was mutated by ``op`` and now holds ``node``'s value; update its aliases.

        Like ``FunctionalTensorWrapper::replace_`` followed by regenerating every view of the
        base (``FunctionalStorageImpl::apply_updates``).
        """
        old = self.tracker.lookup(t)
        if old is not None and old.constant:
            raise RuntimeError(f"toycomp.aot: {op} mutates a closed-over constant tensor")
        if not view_op and not non_overlapping(t):  # x.expand(2, 3).fill_(1) in eager
            raise NotImplementedError(f"toycomp.aot: {op} writes to a tensor whose elements "
                                      "share memory (e.g. an expand); clone it first")  # fmt: skip
        entry = self.tracker.track(t, node)
        if view_op:  # unsqueeze_ & co change metadata only, not values
            self.tracker.retrack(entry, node)
        else:
            self._update_aliases(entry, node, op)

    def _update_aliases(self, entry: Tracked, node: fx.Node, op: str) -> None:
        """``entry``'s tensor now holds ``node``'s value: regenerate (or mark stale) its aliases."""
        tracker, t = self.tracker, entry.tensor
        aliases = tracker.aliases(t)
        same = [a for a in aliases if same_view(a.tensor, t)]  # e.g. x and x.detach()
        others = [a for a in aliases if not same_view(a.tensor, t)]
        # [Note: mutating through views]
        # t shares memory with other tensors (x[0].mul_(2): t = x[0], alias x). We find a
        # "root" alias: a dense tensor covering all the memory involved (x). Its new value is
        # as_strided_scatter(root, new t, t's geometry) and every alias is regenerated as
        # as_strided(new root, alias geometry), offsets relative to the root, which must be a
        # fresh tensor (not a view with its own offset). Without a root (views reinterpreting
        # dtype...), the aliases are marked stale: reading one later raises naming `op`.
        # [Note: a node has its tensor's layout]
        # The new value may be laid out differently from t (r.copy_(a.t()) gives a.t()'s
        # strides; an expand gives stride 0). Later views of t are recorded on t's node, so its
        # value is first rewritten to t's strides (_relayout, or a view of the new root).
        root = self._root([entry, *aliases]) if others else None
        if root is None or root is entry:
            node = self._relayout(node, t, force=root is entry and not _is_fresh(node))
        for alias in (entry, *same):
            tracker.retrack(alias, node)
        if root is None:
            for alias in others:
                alias.stale = op
            return
        base, regenerate = node, [a for a in others if a is not root]
        if root is not entry:
            base = self._relayout(root.node, root.tensor, force=not _is_fresh(root.node))
            args = (base, node, *geometry(t, root.tensor))
            base = tracker.emit(aten.as_strided_scatter.default, args, {}, root.tensor)
            if not same_strides(node.meta["val"], t):
                regenerate += [entry, *same]
        tracker.retrack(root, base)
        for alias in regenerate:
            args = (base, *geometry(alias.tensor, root.tensor))
            tracker.retrack(alias, tracker.emit(aten.as_strided.default, args, {}, alias.tensor))

    def _ensure_layout(self, t: Any, op: str) -> None:
        """Before a view op on ``t``: make ``t``'s node have ``t``'s strides, or raise."""
        entry = self.tracker.lookup(t) if isinstance(t, torch.Tensor) else None
        if entry is None or entry.stale or same_strides(entry.node.meta["val"], t):
            return
        if not non_overlapping(t):
            raise RuntimeError(
                f"toycomp.aot: {op} views a tensor whose recorded strides "
                f"{tuple(entry.node.meta['val'].stride())} differ from its real strides "
                f"{tuple(t.stride())}, which overlap; toycomp cannot record this view"
            )
        self.tracker.retrack(entry, self._relayout(entry.node, t))

    def _as_strided(self, func, args: tuple, kwargs: dict) -> torch.Tensor:
        """Record ``as_strided`` / ``as_strided_``, which read *memory*, not values.

        [Note: as_strided reads memory] t.as_strided(size, stride, offset) may read elements
        outside t and depends on how t's storage is laid out; a node only knows its value. So
        we take it on a "root" alias, a dense current tensor covering the memory read, whose
        node is (or is rewritten to) a tensor with the root's strides and storage offset 0
        (a fresh result or an input: aot checks that inputs have offset 0), and make the
        offset relative to the root.
        """
        op = str(func)
        bound = bind_arguments(func, args, kwargs)
        t, size, stride = bound["self"], list(bound["size"]), list(bound["stride"])
        offset = bound.get("storage_offset")
        offset = t.storage_offset() if offset is None else offset
        root = self._strided_root(t, span(size, stride, offset, t.element_size()), op)
        out = func(*args, **kwargs)
        if _needs_relayout(root):
            self.tracker.retrack(root, self._relayout(root.node, root.tensor, force=True))
        args = (root.node, size, stride, offset - root.tensor.storage_offset())
        node = self.tracker.emit(aten.as_strided.default, args, {}, out)
        if func is aten.as_strided.default:
            self.tracker.track(out, node)
        else:
            self._replace(t, node, op, view_op=True)
        return out

    def _strided_root(self, t: torch.Tensor, read: tuple[int, int] | None, op: str) -> Tracked:
        """The tracked alias of ``t`` that ``t.as_strided`` reading bytes ``read`` is taken on."""
        entry = self.tracker.entry_for(t, op)
        if read is None:  # reads nothing
            return entry
        entries = [entry, *self.tracker.same_storage(t)]
        roots = [e for e in entries if not e.stale and e.tensor.dtype == t.dtype
                 and is_dense(e.tensor) and covers(extent(e.tensor), read)]  # fmt: skip
        if not roots:
            raise RuntimeError(
                f"toycomp.aot: {op} reading memory that no dense, up-to-date traced tensor covers "
                "(e.g. an as_strided reaching outside its input) is not supported"
            )
        return min(roots, key=_needs_relayout)  # stable: t itself if it can

    def _root(self, entries: list[Tracked]) -> Tracked | None:
        """A dense alias, not stale, that covers the memory of all ``entries`` (or None)."""
        lo = min(extent(e.tensor)[0] for e in entries)
        hi = max(extent(e.tensor)[1] for e in entries)
        if len({e.tensor.dtype for e in entries}) > 1:
            return None
        for e in entries:
            e_lo, e_hi = extent(e.tensor)
            if not e.stale and e_lo <= lo and e_hi >= hi and is_dense(e.tensor):
                return e
        return None

    def _relayout(self, node: fx.Node, like: torch.Tensor, force: bool = False) -> fx.Node:
        """``node``'s value in a fresh tensor (storage offset 0) with ``like``'s strides."""
        if not force and (same_strides(node.meta["val"], like) or like.numel() <= 1):
            return node
        size, stride = list(like.shape), list(like.stride())
        factory = {"dtype": like.dtype, "device": like.device}
        empty = self.tracker.emit(aten.empty_strided.default, (size, stride), factory, like)
        args = (empty, node, size, stride, 0)
        return self.tracker.emit(aten.as_strided_scatter.default, args, {}, like)

    def _functionalize(self, func, mutated, nargs, nkwargs, real, out) -> None:
        op = str(func)
        if func is aten.copy_.default:
            self._replace(real[0][0], self._copy_value(nargs[1], real[0][1], real[0][0]), op)
            return
        functional, result_of, outputs = functional_variant(func, [n for n, _ in mutated])
        arguments = schema_of(func).arguments
        drop = {a.name for a in arguments if a.is_out}
        # Defaults of the in-place schema (bernoulli_(p=0.5)) may be required by the functional.
        defaults = {a.name: a.default for a in arguments[len(real[0]) :]
                    if a.has_default and a.name not in drop and a.name not in nkwargs}
        nkwargs = {k: v for k, v in (defaults | nkwargs).items() if k not in drop}
        view_op = torch.Tag.inplace_view in func.tags
        if view_op:
            # [Note: in-place views are described by their result] squeeze_, unsqueeze_, t_...
            # have already changed the tensor's metadata when we get here, so running the
            # functional view on it would view it twice (matmul's squeeze_(0) of a (1, 1)
            # result gave a 0-d value for a (1,) tensor). The tensor now *is* the result.
            val = to_meta(mutated[0][1])
        else:
            val = self._functional_result(functional, real, defaults, drop, op)
        node = self.tracker.emit(functional, nargs, nkwargs, val, _devices_like(val, mutated))
        results = self.tracker.emit_results(node, val)
        for (_, t), index in zip(mutated, result_of):
            self._replace(t, self._convert(results[index], t), op, view_op)
        for index, item in enumerate(outputs):
            self.tracker.track(out[index], results[item])

    @staticmethod
    def _functional_result(functional, real: tuple, defaults: dict, drop: set, op: str) -> Any:
        """Meta tensors describing ``functional``'s results on the in-place op's arguments.

        The layout comes from running it for real (meta kernels do not always give the real
        strides: aten.zero in torch 2.11), except for random ops, whose real run would draw
        random numbers a second time: those run on meta tensors.
        """
        if torch.Tag.nondeterministic_seeded in functional.tags:
            real = tree_map(lambda a: to_meta(a) if isinstance(a, torch.Tensor) else a, real)
        cargs, ckwargs = real[0], {k: v for k, v in (defaults | real[1]).items() if k not in drop}
        try:
            val = functional(*cargs, **ckwargs)
        except Exception as e:  # noqa: BLE001 - re-raised with the op's name
            raise NotImplementedError(f"toycomp.aot: cannot functionalise {op}: {e}") from e
        return tree_map(lambda a: to_meta(a) if isinstance(a, torch.Tensor) else a, val)

    def _convert(self, node: fx.Node, like: torch.Tensor) -> fx.Node:
        """In-place ops keep the mutated tensor's dtype; the functional op may promote."""
        val = node.meta["val"]
        if val.shape != like.shape:
            raise RuntimeError(f"toycomp.aot: {node.target} changed shape {like.shape}")
        if val.dtype == like.dtype:
            return node
        return self.tracker.emit(aten._to_copy.default, (node,), {"dtype": like.dtype}, like)

    def _copy_value(self, src: fx.Node, src_t: torch.Tensor, dst: torch.Tensor) -> fx.Node:
        """``dst.copy_(src)`` leaves ``src`` converted to ``dst``'s dtype and expanded."""
        node, val = src, src_t
        if src_t.dtype != dst.dtype or src_t.device != dst.device:
            kwargs: dict[str, Any] = {"dtype": dst.dtype}
            if src_t.device != dst.device:
                kwargs["device"] = dst.device
            val = torch.empty_strided(val.shape, val.stride(), dtype=dst.dtype, device="meta")
            node = self.tracker.emit(aten._to_copy.default, (node,), kwargs, val, dst.device)
        if tuple(src_t.shape) != tuple(dst.shape):
            val = to_meta(val).expand(dst.shape)
            node = self.tracker.emit(aten.expand.default, (node, list(dst.shape)), {}, val,
                                     dst.device)  # fmt: skip
        return node


def _is_fresh(node: fx.Node) -> bool:
    """Is ``node``'s value a new tensor (storage offset 0), not a view of another value?"""
    if node.target is operator.getitem:
        node = node.args[0]
    target = node.target
    is_view = getattr(target, "is_view", True) or target is aten._unsafe_view.default
    return node.op == "call_function" and not is_view


def _needs_relayout(root: Tracked) -> bool:
    """Must ``root``'s node be copied before ``as_strided`` reads its memory?

    Inputs need not: ``AOTOutput`` (runtime_wrappers.py) checks at run time that they have
    storage offset 0.
    """
    node, fresh = root.node, _is_fresh(root.node) or root.node.op == "placeholder"
    return not fresh or not same_strides(node.meta["val"], root.tensor)


def _devices_like(val: Any, mutated: list) -> Any:
    """Where a functionalised op's results (meta ``val``) live: on the mutated tensor's device
    (an in-place op writes where its ``self`` lives, and makes its other results there)."""
    device = mutated[0][1].device
    if isinstance(val, (tuple, list)):
        return tuple(None if v is None else device for v in val)
    return device


def _data_dependent(func: Any, what: str) -> NotImplementedError:
    return NotImplementedError(f"toycomp.aot: {func} {what}")


def _raise_if_data_dependent(func: Any, e: RuntimeError) -> None:
    if type(e).__name__ in DATA_DEPENDENT_ERRORS:
        raise _data_dependent(func, f"has a data-dependent output shape here ({e})") from e


def _as_list(value: Any) -> list:
    return [value] if isinstance(value, torch.Tensor) else list(value)


# [Note: random ops draw nothing while tracing]
# Traced on real tensors (``aot_function`` called with real example inputs), each op runs once
# at compile time. A random op (bernoulli, native_dropout, an attention kernel with dropout: ATen
# tags them nondeterministic_seeded) would then draw from the user's generator, and the
# compiled function's first call would get the numbers eager's second call gets. So the
# generators' state is put back after it, as if nothing had been drawn. (On fake tensors
# nothing is drawn.)
def _draws_nothing(args: tuple, kwargs: dict) -> Any:
    """A context that restores the RNG state of the devices of a random op's tensor args."""
    tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    if any(is_fake(t) for t in tensors):
        return contextlib.nullcontext()
    cuda = sorted({t.device.index or 0 for t in tensors if t.is_cuda})
    return torch.random.fork_rng(devices=cuda, device_type="cuda")


# [Note: random ops draw in memory order]
# An in-place random op (the bernoulli_ of dropout on a transposed tensor) fills its tensor in
# memory order; its out-of-place twin (bernoulli.p) returns a new contiguous tensor filled in
# *its* order. On a tensor whose memory order is not its logical order the same numbers would
# land elsewhere, and the compiled dropout would drop other elements than eager's. So such an
# op is recorded on the permutation of its tensor that is contiguous (a view): the functional
# twin then draws the numbers where eager wrote them.
def _memory_order(func: Any, mutated: list, args: tuple) -> list[int] | None:
    """The dims of the tensor an in-place random op fills, outermost in memory first, when that
    is not their logical order (and the tensor is dense: a permutation makes it contiguous)."""
    if len(mutated) != 1:
        return None
    if not args or mutated[0][1] is not args[0]:  # (they all fill their first argument)
        return None
    t = mutated[0][1]
    if t.is_contiguous() or func is aten.permute.default:
        return None
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return order if t.permute(order).is_contiguous() else None
