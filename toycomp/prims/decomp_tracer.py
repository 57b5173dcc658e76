"""Stage 3b's tracer: the prims a decomposition calls -> FX nodes with meta values.

``decompose`` (decompositions.py) runs each rule under ``prims.tracing(DecompTracer(graph))``.
A tensor the rule receives is a ``Proxy`` (an FX node, its meta value, its real device); every
prim it calls reaches ``DecompTracer.emit``, which checks the prim's contract (see [Note: the
prim contract is checked at trace time]), runs the prim's eager reference on meta tensors for the
result's shape, dtype and strides, and adds a ``call_function`` node to the graph::

    >>> import toycomp.prims as prims
    >>> graph = fx.Graph()
    >>> tracer = DecompTracer(graph)
    >>> x = Proxy(graph.placeholder("x"), torch.empty(2, 3, device="meta"), torch.device("cpu"))
    >>> with prims.tracing(tracer):
    ...     y = prims.mul(prims.sin(x), 2.0)
    >>> y, [(n.name, n.args) for n in tracer.emitted]
    (Proxy(mul: torch.float32 [2, 3]), [('sin', (x,)), ('mul', (sin, 2.0))])
    >>> b = Proxy(graph.placeholder("b"), torch.empty(3, device="meta"), torch.device("cpu"))
    >>> with prims.tracing(tracer):
    ...     prims.add(x, b)  # no implicit broadcasting: the decomposition must say it
    Traceback (most recent call last):
    TypeError: prims.add: operands of different shapes (Proxy(x: ...), Proxy(b: ...))

NB: in PyTorch this lives in torch/fx/experimental/proxy_tensor.py (``make_fx``'s
``PythonKeyTracer`` and ``ProxyTorchDispatchMode``: decompositions run on proxies, each op they
call becomes a node) and torch/_prims_common (the checks of the prims' contract).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import operator
from typing import Any

import torch
from torch import fx

import toycomp.prims as prims
from toycomp._torch_compat import OpOverload, schema_of
from toycomp.prims.helpers import is_symbolic
from toycomp.prims.symbolic_sizes import SymbolicSizes, numbers_as_fake


# --- the tracer ------------------------------------------------------------------------------
class Proxy:
    """A traced tensor: an FX node plus its meta value and real device.

    Decompositions may read ``.shape``, ``.dtype``, ``.ndim``, ``.device``, ``size()``, ``dim()``
    and ``numel()`` (the same names as on a real tensor), and pass proxies to prims. There are no
    operator overloads on purpose: ``a * b`` on tensors broadcasts and promotes implicitly, and
    the point of a decomposition is to make both explicit.
    """

    __slots__ = ("node", "val", "device")

    def __init__(self, node: fx.Node, val: Any, device: torch.device) -> None:
        self.node, self.val, self.device = node, val, device

    shape = property(lambda self: self.val.shape)
    dtype = property(lambda self: self.val.dtype)
    ndim = property(lambda self: self.val.ndim)

    def size(self, dim: int | None = None) -> Any:
        return self.val.size() if dim is None else self.val.size(dim)

    def dim(self) -> int:
        return self.val.dim()

    def numel(self) -> int:
        return self.val.numel()

    def __bool__(self) -> bool:
        raise TypeError(f"data-dependent control flow on traced value {self.node.name}")

    def __repr__(self) -> str:
        return f"Proxy({self.node.name}: {self.dtype} {list(self.shape)})"


def _node_of(value: Any, sym_node: Any) -> Any:
    """Proxies -> their FX nodes; SymInts -> ``sym_node(value)`` (the node computing them)."""

    def to_node(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            raise TypeError("a decomposition captured a real tensor; use prims.full for constants")
        if is_symbolic(v):
            return sym_node(v)
        return v.node if isinstance(v, Proxy) else v

    return fx.node.map_aggregate(value, to_node)


def _meta_of(value: Any) -> Any:
    return fx.node.map_aggregate(value, lambda v: v.val if isinstance(v, Proxy) else v)


class DecompTracer:
    """Records prim calls as FX nodes (the ``tracer.emit`` protocol of ``prims.tracing``)."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.origin = ""  # name of the ATen node being decomposed
        self.emitted: list[fx.Node] = []
        self.alias_root: dict[fx.Node, fx.Node] = {}  # in-place result -> storage owner
        self.sizes = SymbolicSizes(graph)  # SymInt arguments -> the nodes that compute them

    def emit(self, target: Any, args: tuple, kwargs: dict, val: Any = None) -> Proxy:
        """Add ``target(*args, **kwargs)`` to the graph; return a proxy for its result."""
        if prims.is_prim(target):
            _check_contract(target, args)
            val, device = _eval_prim(target, args, kwargs)
        elif val is None:
            val, device = _eval_op_on_meta(target, args, kwargs)
        else:  # ``val`` given: the meta value of an ATen op that cannot run on meta tensors
            device = _first_device((args, kwargs))
        name = target.__name__ if prims.is_prim(target) else _op_name(target)
        node_args, node_kwargs = _node_of((tuple(args), dict(kwargs)), self.sizes.node)
        node = self.graph.create_node("call_function", target, node_args, node_kwargs, name)
        node.meta["val"] = val
        node.meta["aten_origin"] = self.origin
        self.emitted.append(node)
        return Proxy(node, val, device)


def _op_name(target: Any) -> str:
    """``aten.mm.default`` -> ``mm`` (FX makes it unique: ``mm_1``...)."""
    if isinstance(target, OpOverload):
        return schema_of(target).name.split("::")[-1]
    return getattr(target, "__name__", "op")


def _first_device(values: Any) -> torch.device:
    flat: list[Any] = []
    fx.node.map_aggregate(values, flat.append)
    return next((v.device for v in flat if isinstance(v, Proxy)), torch.device("cpu"))


# The context in which meta values are computed: the example inputs' fake mode when some size
# is symbolic (see [Note: meta values with symbolic sizes] in symbolic_sizes.py), else none.
# Only there: decompositions themselves may make real tensors (``torch.zeros(()).item()``).
_META_MODE: contextvars.ContextVar[Any] = contextvars.ContextVar("toycomp_meta_mode")


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta value with ``t``'s sizes, strides and dtype, made where meta values are made."""
    with _META_MODE.get(contextlib.nullcontext()):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _eval_prim(prim: Any, args: tuple, kwargs: dict) -> tuple[Any, torch.device]:
    """The prim's reference run on meta values: its result, and the device it will have."""
    bound = inspect.signature(prims.PRIM_INFO[prim].ref).bind(*args, **kwargs)
    device = _first_device(bound.arguments)
    if "device" in bound.arguments:  # creation prims: evaluate on meta, remember the real device
        device = torch.device(bound.arguments["device"])
        bound.arguments["device"] = "meta"
    args, kwargs = _meta_of(bound.args), _meta_of(bound.kwargs)
    with _META_MODE.get(contextlib.nullcontext()) as fake_mode:  # (a fake mode: dynamic shapes)
        if fake_mode is not None and prims.prim_kind(prim) is prims.PrimKind.POINTWISE:
            args = numbers_as_fake(prim, args)
        return prims.PRIM_INFO[prim].ref(*args, **kwargs), device


def _eval_op_on_meta(op: Any, args: tuple, kwargs: dict) -> tuple[Any, torch.device]:
    with _META_MODE.get(contextlib.nullcontext()):
        return _eval_op(op, args, kwargs)


def _eval_op(op: Any, args: tuple, kwargs: dict) -> tuple[Any, torch.device]:
    device = _first_device((args, kwargs))
    if kwargs.get("device") is not None:
        device = torch.device(kwargs["device"])
    meta_kwargs = {k: ("meta" if k == "device" else v) for k, v in _meta_of(kwargs).items()}
    if op is operator.getitem:
        return args[0].val[args[1]], device
    try:
        return op(*_meta_of(tuple(args)), **meta_kwargs), device
    except Exception as e:  # noqa: BLE001 - re-raised with the op's name
        raise RuntimeError(f"toycomp.decompositions: cannot compute the shape of {op}") from e


# [Note: the prim contract is checked at trace time]
# The eager references would happily broadcast and promote (they call torch ops), so a buggy
# decomposition would still run and even give the right numbers, and the bug would only show up
# in inductor. So ``emit`` checks PrimTorch's contract on every pointwise prim call: tensor
# operands share one shape and dtype, and a Python number must be representable in that dtype
# (``prims.mul(int_tensor, 0.5)`` would silently compute ``* 0``).
def _check_contract(prim: Any, args: tuple) -> None:
    if prims.prim_kind(prim) is not prims.PrimKind.POINTWISE or prim is prims.convert_element_type:
        return
    operands = _where_operands(args) if prim is prims.where else args
    tensors = [a for a in args if isinstance(a, Proxy)]
    if any(tuple(t.shape) != tuple(tensors[0].shape) for t in tensors[1:]):  # (SymInts: no set)
        raise TypeError(f"prims.{prim.__name__}: operands of different shapes {operands}")
    dtypes = {t.dtype for t in operands if isinstance(t, Proxy)}
    if len(dtypes) > 1:
        raise TypeError(f"prims.{prim.__name__}: operands of different dtypes {operands}")
    if not dtypes:
        return  # only numbers: the reference itself refuses
    for number in (a for a in operands if not isinstance(a, Proxy)):
        if not isinstance(number, (bool, int, float, torch.SymInt, torch.SymFloat)):
            raise TypeError(f"prims.{prim.__name__}: unexpected operand {number!r}")
        dtype = next(iter(dtypes))
        if isinstance(number, (float, torch.SymFloat)) and not dtype.is_floating_point:
            raise TypeError(f"prims.{prim.__name__}: float {number} with a {dtype} tensor")


def _where_operands(args: tuple) -> tuple:
    """The operands of ``prims.where(condition, a, b)`` that must agree: ``a`` and ``b``."""
    if args[0].dtype is not torch.bool:
        raise TypeError(f"prims.where needs a bool condition, got {args[0].dtype}")
    return args[1:]
