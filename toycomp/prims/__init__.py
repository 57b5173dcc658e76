"""Stage 3, prims: an ATen graph -> a graph of toycomp's 42 primitives, which this file defines.

Input IR -> output IR: an ATen-level ``torch.fx.GraphModule`` (targets ``torch.ops.aten.X.Y``, as
``toycomp.aot`` hands it on) -> a ``GraphModule`` whose targets are the primitives below, the
extern matmuls of ``decomp_table.EXTERN_OPS``, and visible ATen fallbacks. The forward of
``f(x) = sin(x)**2 + cos(x)**2`` (``pow`` by 2 becomes ``mul``, as Inductor does it)::

    >>> import torch
    >>> from toycomp.prims.decompositions import decompose
    >>> aten = torch.ops.aten
    >>> def f(a):  # the ATen graph that toycomp.aot records for sin(a)**2 + cos(a)**2
    ...     sin, cos = aten.sin.default(a), aten.cos.default(a)
    ...     return aten.add.Tensor(aten.pow.Tensor_Scalar(sin, 2), aten.pow.Tensor_Scalar(cos, 2))
    >>> gm = decompose(torch.fx.symbolic_trace(f), [torch.randn(1000)])
    >>> print(gm.code.strip())
    def forward(self, a):
        sin = toycomp_prims_sin(a)
        cos = toycomp_prims_cos(a);  a = None
        mul = toycomp_prims_mul(sin, sin);  sin = None
        mul_1 = toycomp_prims_mul(cos, cos);  cos = None
        add = toycomp_prims_add(mul, mul_1);  mul = mul_1 = None
        return add

Every primitive is a plain Python function with an eager reference, so a graph of prims still
runs (``gm(*inputs)``) and can be checked against the ATen graph it came from::

    >>> x = torch.randn(3)
    >>> torch.allclose(add(mul(sin(x), sin(x)), mul(cos(x), cos(x))), torch.ones(3))
    True

The contract that makes lowering simple (the first two rules are PrimTorch's too):

* pointwise prims take tensors of the SAME shape and dtype (or Python numbers) - broadcasting
  and type promotion are explicit (``broadcast_in_dim``, ``convert_element_type``);
* reductions remove the reduced dimensions (no ``keepdim``);
* views (``broadcast_in_dim``, ``reshape``, ``permute``, ``slice``) never copy in the compiler:
  inductor turns them into index arithmetic (toycomp's rule: ``torch._prims.reshape`` returns a
  new tensor);
* matmul-like ops are not prims: they stay ATen "extern" calls (``aten.mm``, ``aten.bmm``).

Files, in reading order:

* ``__init__.py``: the primitives (``PRIMS``, ``PRIM_INFO``) and ``tracing``, which records
  prim calls instead of running them;
* ``decomp_table.py``: the ``DECOMPOSITIONS`` table, ``register``, ``EXTERN_OPS``;
* ``helpers.py``: explicit type promotion and broadcasting (``elementwise``, ``broadcast_to``);
* ``pointwise_rules.py``, ``activation_rules.py``, ``loss_rules.py``, ``nn_rules.py``,
  ``norm_rules.py``, ``pool_rules.py``, ``view_rules.py``: the decompositions, by kind;
* ``symbolic_sizes.py``: dynamic shapes: the nodes computing the SymInts that prims take;
* ``decomp_tracer.py``: ``Proxy`` and ``DecompTracer``, which turn the prims a rule calls into
  FX nodes (checking the prims' contract);
* ``decompositions.py``: the pass, ``decompose``, and ``fallbacks``.

NB: in PyTorch this lives in torch/_prims/__init__.py (about 100 prims, with meta functions and
nvFuser/ATen implementations), torch/_refs (the ATen-to-prims "references"), torch/_decomp
(the decomposition tables) and torch/_prims_common (type promotion).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterator, Sequence

import torch

Number = int | float | bool


class PrimKind(Enum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    VIEW = "view"
    CREATION = "creation"
    INDEXING = "indexing"


@dataclass(frozen=True)
class PrimInfo:
    """What later stages need to know about a prim: its kind and its eager reference."""

    name: str
    kind: PrimKind
    ref: Callable[..., Any]


# name -> prim function; PRIM_INFO: prim function -> PrimInfo. Later stages key their rule
# tables by the prim function itself (LOWERINGS[prims.sin], CPP_OPS["sin"] ...).
PRIMS: dict[str, Callable[..., Any]] = {}
PRIM_INFO: dict[Callable[..., Any], PrimInfo] = {}

# [Note: tracing prims]
# A prim called normally runs its eager reference. While a tracer is installed with
# ``tracing(tracer)`` (the decomposition pass does this), every prim call is handed to
# ``tracer.emit(prim, args, kwargs)`` instead, which records an FX node and returns a proxy.
# This is the same trick as torch.fx's Proxy / make_fx's proxy mode, in a dozen lines.
_active_tracer: contextvars.ContextVar[Any] = contextvars.ContextVar("toycomp_prims_tracer")


@contextlib.contextmanager
def tracing(tracer: Any) -> Iterator[None]:
    """Route every prim call to ``tracer.emit(prim, args, kwargs)`` inside the ``with`` block."""
    token = _active_tracer.set(tracer)
    try:
        yield
    finally:
        _active_tracer.reset(token)


def current_tracer() -> Any:
    """The tracer installed by ``tracing``, or None (decompositions use it to emit extern ops)."""
    return _active_tracer.get(None)


def _register(kind: PrimKind) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(ref: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(ref)
        def prim(*args: Any, **kwargs: Any) -> Any:
            tracer = _active_tracer.get(None)
            if tracer is not None:
                return tracer.emit(prim, args, kwargs)
            return ref(*args, **kwargs)

        PRIMS[ref.__name__] = prim
        PRIM_INFO[prim] = PrimInfo(ref.__name__, kind, ref)
        return prim

    return wrap


def _as_tensor(value: torch.Tensor | Number, like: torch.Tensor) -> torch.Tensor:
    """Python numbers become 0-d tensors of ``like``'s dtype, so they never promote the result."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def _first_tensor(*args: Any) -> torch.Tensor:
    return next(a for a in args if isinstance(a, torch.Tensor))


# --- pointwise, one input (15) -------------------------------------------------------------
def _unary(name: str, torch_fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
    def ref(a: torch.Tensor) -> torch.Tensor:
        return torch_fn(a)

    ref.__name__ = ref.__qualname__ = name
    ref.__doc__ = f"Pointwise ``{name}(a)``; the eager reference is ``torch.{name}``."
    return _register(PrimKind.POINTWISE)(ref)


neg = _unary("neg", torch.neg)
abs = _unary("abs", torch.abs)  # noqa: A001 (PyTorch's name)
exp = _unary("exp", torch.exp)
log = _unary("log", torch.log)
log1p = _unary("log1p", torch.log1p)
sqrt = _unary("sqrt", torch.sqrt)
rsqrt = _unary("rsqrt", torch.rsqrt)
reciprocal = _unary("reciprocal", torch.reciprocal)
sin = _unary("sin", torch.sin)
cos = _unary("cos", torch.cos)
tanh = _unary("tanh", torch.tanh)
erf = _unary("erf", torch.erf)
floor = _unary("floor", torch.floor)
sign = _unary("sign", torch.sign)
logical_not = _unary("logical_not", torch.logical_not)


# --- pointwise, two inputs (14): tensors of one shape and dtype, or a Python number ---------
def _binary(name: str, torch_fn: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    def ref(a: torch.Tensor | Number, b: torch.Tensor | Number) -> torch.Tensor:
        like = a if isinstance(a, torch.Tensor) else b
        return torch_fn(_as_tensor(a, like), _as_tensor(b, like))

    ref.__name__ = ref.__qualname__ = name
    ref.__doc__ = f"Pointwise ``{name}(a, b)`` (``div`` is true division on floats)."
    return _register(PrimKind.POINTWISE)(ref)


add = _binary("add", torch.add)
sub = _binary("sub", torch.sub)
mul = _binary("mul", torch.mul)
div = _binary("div", torch.div)
pow = _binary("pow", torch.pow)  # noqa: A001
# [Note: maximum, minimum, NaN and signed zero]
# maximum(a, b) is NaN where a or b is NaN (as torch.maximum; C's fmax would drop the NaN), else
# a where a > b, else b; minimum likewise with <. Only -0.0 and +0.0 compare equal yet differ,
# and on them this returns b. ATen's CPU kernel has no one rule there: its vectorised loop
# returns b and its scalar loop (short tensors, the tail of long ones) returns a, so eager's
# torch.maximum(x, zeros) of a -0.0 depends on x's length. The prims keep one rule, the one of
# Inductor's max_propagate_nan and triton_helpers.maximum, spelled the same by both codegens;
# the references below spell it out rather than call torch.maximum, so that a prim graph gives
# the same bits as the kernels. Ops that do have one eager answer on a tie put the value that
# wins it second: relu and clamp return x itself when it equals the bound (relu(-0.0) = -0.0),
# so they decompose to maximum(bound, x), as Inductor writes relu. (These are CPU eager's
# answers, the oracle in CI. CUDA eager differs on zeros only: its maximum and clamp order -0.0
# below +0.0, so relu(-0.0) is +0.0 there, and its clamp ignores a NaN bound.)
maximum = _binary("maximum", lambda a, b: torch.where((a > b) | (a != a), a, b))
minimum = _binary("minimum", lambda a, b: torch.where((a < b) | (a != a), a, b))
eq = _binary("eq", torch.eq)
ne = _binary("ne", torch.ne)
lt = _binary("lt", torch.lt)
le = _binary("le", torch.le)
gt = _binary("gt", torch.gt)
ge = _binary("ge", torch.ge)
logical_and = _binary("logical_and", torch.logical_and)


@_register(PrimKind.POINTWISE)
def where(
    cond: torch.Tensor, a: torch.Tensor | Number, b: torch.Tensor | Number
) -> torch.Tensor:
    """``a`` where ``cond`` (bool) is true, else ``b``; ``a`` and ``b`` share one dtype."""
    like = _first_tensor(a, b) if any(isinstance(v, torch.Tensor) for v in (a, b)) else None
    if like is None:
        raise TypeError("prims.where needs at least one tensor among a and b")
    return torch.where(cond, _as_tensor(a, like), _as_tensor(b, like))


@_register(PrimKind.POINTWISE)
def convert_element_type(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to ``dtype`` (the only prim that changes dtype, besides comparisons)."""
    return a.to(dtype)


# --- reductions (3): the reduced dims disappear ---------------------------------------------
@_register(PrimKind.REDUCTION)
def sum(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:  # noqa: A001 (PyTorch's name)
    """Sum over ``dims``."""
    return torch.sum(a, dim=tuple(dims)) if dims else a.clone()


@_register(PrimKind.REDUCTION)
def amax(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Maximum over ``dims`` (NaN propagates, like torch.amax)."""
    return _extremum(torch.amax, a, dims)


@_register(PrimKind.REDUCTION)
def amin(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Minimum over ``dims``."""
    return _extremum(torch.amin, a, dims)


def _extremum(fn: Any, a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """torch.amax/amin over ``dims``; an empty result is fine even when a reduced dim is empty.

    torch.amax refuses a zero-size reduced dim (no identity) even when the output has no
    elements, e.g. softmax over dim -1 of a (5, 0, 0) tensor; eager softmax returns an empty
    tensor there, so no reduction value is ever needed: give the empty output directly.
    """
    if not dims:
        return a.clone()
    out_shape = [s for i, s in enumerate(a.shape) if i not in {d % max(a.dim(), 1) for d in dims}]
    if a.numel() == 0 and math.prod(out_shape) == 0:
        return a.new_empty(out_shape)
    return fn(a, dim=tuple(dims))


# --- views (4): free in the compiler (index arithmetic), copies are never needed -------------
@_register(PrimKind.VIEW)
def broadcast_in_dim(
    a: torch.Tensor, shape: Sequence[int], broadcast_dimensions: Sequence[int]
) -> torch.Tensor:
    """Broadcast ``a`` to ``shape``; dim ``i`` of ``a`` becomes dim ``broadcast_dimensions[i]``.

    Example: a row of 10 biases to a (32, 10) batch is ``broadcast_in_dim(b, (32, 10), (1,))``.
    """
    view_shape = [1] * len(shape)
    for src_dim, dst_dim in enumerate(broadcast_dimensions):
        view_shape[dst_dim] = a.shape[src_dim]
    return a.reshape(view_shape).expand(tuple(shape))


@_register(PrimKind.VIEW)
def reshape(a: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Same elements in row-major order, new ``shape`` (no -1: sizes are explicit)."""
    return a.reshape(tuple(shape))


@_register(PrimKind.VIEW)
def permute(a: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Reorder dimensions: output dim ``i`` is input dim ``dims[i]``."""
    return a.permute(tuple(dims))


@_register(PrimKind.VIEW)
def slice(  # noqa: A001 (PyTorch's name)
    a: torch.Tensor, dim: int, start: int, end: int, step: int = 1
) -> torch.Tensor:
    """Elements ``start, start+step, ... < end`` along ``dim`` (bounds already clamped)."""
    return torch.ops.aten.slice.Tensor(a, dim, start, end, step)


# --- creation (2) ------------------------------------------------------------------------------
@_register(PrimKind.CREATION)
def full(
    shape: Sequence[int], value: Number, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """A tensor of ``shape`` filled with ``value``."""
    return torch.full(tuple(shape), value, dtype=dtype, device=device)


@_register(PrimKind.CREATION)
def iota(length: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``0, 1, ..., length-1``: with ``eq`` and ``where`` it replaces gathers (one-hot tricks)."""
    return torch.arange(length, dtype=dtype, device=device)


# --- indexing (2): read and write at positions read from a tensor -----------------------------
# [Note: two indexing prims]
# embedding, index_select, gather and advanced indexing (``a[idx]``) all read ``a`` at positions
# that a tensor holds; their backwards and index_put write there. Two prims cover them, as
# ``torch.gather`` and ``torch.scatter`` do: the decompositions make the index tensor as big as
# the result with ``broadcast_in_dim`` (a view: free) and fold several index tensors into one
# (``i*n + j`` on a reshaped ``a``). The indices are in ``[0, a.shape[dim])``: decompositions
# check them first (``toycomp::check_indices``, eager's IndexError) and wrap negative ones where
# the op allows them. Inductor lowers both with ``ops.indirect_indexing`` (loop_body.py).
@_register(PrimKind.INDEXING)
def gather(a: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``out[p] = a[p with p[dim] = index[p]]``: ``index`` (int64, ``a.ndim`` dims, at most
    ``a``'s size in each other dim) gives the result's shape (``torch.gather``)."""
    return torch.gather(a, dim, index)


@_register(PrimKind.INDEXING)
def scatter(a: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor,
            accumulate: bool) -> torch.Tensor:  # fmt: skip
    """A copy of ``a`` where ``src[p]`` is stored (``accumulate``: added) at ``p`` with ``p[dim] =
    index[p]``; ``src`` has ``index``'s shape and ``a``'s dtype (``torch.scatter(_add)``)."""
    if accumulate:
        return torch.scatter_add(a, dim, index, src)
    return torch.scatter(a, dim, index, src)


def is_prim(target: Any) -> bool:
    """True for the prim functions of this module (the FX targets of a decomposed graph)."""
    return target in PRIM_INFO


def prim_kind(target: Any) -> PrimKind:
    return PRIM_INFO[target].kind


def reduction_identity(name: str, dtype: torch.dtype) -> Number:
    """The starting value of a reduction: 0 for sum, -inf/+inf (or int limits) for amax/amin."""
    if name == "sum":
        return 0
    big = math.inf if dtype.is_floating_point else torch.iinfo(dtype).max
    return -big if name == "amax" else big
