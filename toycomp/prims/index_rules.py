"""Stage 3b, the table (indexing): ATen's gathers and scatters -> ``prims.gather`` / ``scatter``.

Input IR -> output IR: like the other rule files, each function takes an ATen op's arguments and
returns its result computed with prims. Every read at positions held by a tensor (``embedding``,
``index_select``, ``gather``, ``a[idx]``) becomes ``prims.gather`` and every write there
(``embedding_dense_backward``, ``scatter``, ``scatter_add``, ``index_add``, ``index_put``)
``prims.scatter`` (see [Note: two indexing prims] in prims/__init__.py). Example,
``aten.embedding(w, idx)`` with ``w`` of (V, D) and ``idx`` of (N,)::

    idx = toycomp.check_indices(idx, V)              # eager's IndexError, before any read
    rows = prims.broadcast_in_dim(idx, [N, D], [0])  # a view: free
    out = prims.gather(w, 0, rows)                   # out[n, d] = w[idx[n], d]

NB: in PyTorch this lives in torch/_decomp/decompositions.py (``embedding``,
``embedding_dense_backward``, ``index_select``, ``index_add``) and torch/_inductor/lowering.py
(``index``, ``index_put``, ``scatter_add``, which Inductor lowers itself with
``ops.indirect_indexing``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

import toycomp.prims as prims
from toycomp.prims.decomp_table import Unsupported, register
from toycomp.prims.helpers import broadcast_shapes, broadcast_to, convert, reshape, upcast

aten = torch.ops.aten


def _extern(op: Any, *args: Any) -> Any:
    tracer = prims.current_tracer()
    return tracer.emit(op, args, {}) if tracer is not None else op(*args)


def _checked(index: Any, size: int, dim: int | None = None) -> Any:
    """``index`` as int64, once each value is known to lie in ``[0, size)``, else eager's error
    (a device-side assert on CUDA: [Note: checks that raise as eager does]): embedding's
    IndexError, or that of gather, scatter, index_select and index_add on ``dim``."""
    index = convert(index, torch.int64)
    if dim is None:
        return _extern(torch.ops.toycomp.check_indices.default, index, size)
    return _extern(torch.ops.toycomp.check_bounds.default, index, 0, size, dim, True)


def _wrapped(index: Any, size: int, dim: int) -> Any:
    """``a[idx]``'s indices checked (IndexError), then the negative ones counted from the end."""
    index = convert(index, torch.int64)
    index = _extern(torch.ops.toycomp.check_bounds.default, index, -size, size, dim, False)
    return prims.where(prims.lt(index, 0), prims.add(index, size), index)


def _dim(dim: int, ndim: int) -> int:
    return dim % max(ndim, 1)


def _one_d(*tensors: Any) -> list[Any]:
    """0-d tensors as 1-d (eager's index ops treat a 0-d tensor as one element)."""
    return [t if t.ndim else reshape(t, [1]) for t in tensors]


# --- reads -------------------------------------------------------------------------------------
@register(aten.embedding.default)
def embedding(weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> Any:  # fmt: skip
    if weight.ndim != 2:
        raise Unsupported(f"embedding of a {weight.ndim}-d weight")
    (v, d), n = weight.shape, math.prod(indices.shape)
    rows = _checked(reshape(indices, [n]), v)
    out = prims.gather(weight, 0, prims.broadcast_in_dim(rows, [n, d], [0]))
    return reshape(out, [*indices.shape, d])


@register(aten.index_select.default)
def index_select(a: Any, dim: int, index: Any) -> Any:
    if a.ndim == 0:  # one element, read at index 0
        return reshape(index_select(reshape(a, [1]), 0, index), [])
    dim, k = _dim(dim, a.ndim), math.prod(index.shape)
    shape = [*a.shape[:dim], k, *a.shape[dim + 1 :]]
    index = _checked(reshape(index, [k]), a.shape[dim], dim)
    return prims.gather(a, dim, prims.broadcast_in_dim(index, shape, [dim]))


@register(aten.gather.default)
def gather(a: Any, dim: int, index: Any, sparse_grad: bool = False) -> Any:
    if a.ndim == 0 or index.ndim == 0:
        return reshape(gather(*_one_d(a), 0, *_one_d(index)), list(index.shape))
    dim = _dim(dim, a.ndim)
    return prims.gather(a, dim, _checked(index, a.shape[dim], dim))


# [Note: advanced indexing as one gather]
# ``a[i, j]`` with index tensors ``i`` and ``j`` on dims 1 and 2 of ``a`` (P, M, N, Q) reads
# ``a[p, i[b], j[b], q]`` for each ``b`` of their broadcast shape B: it is a gather along ONE dim
# of ``a`` reshaped to (P, M*N, Q), at ``i*N + j``. When the indexed dims are not adjacent
# (``a[i, :, j]``) the broadcast dims come first in the result (NumPy's rule): ``a`` is
# permuted so that they lead. index_put is the same write: a scatter into the reshaped ``a``.
def _flat_index(a: Any, indices: Sequence[Any]) -> tuple[Any, list[int], int, list[int], Any]:
    """``(a permuted, the permutation, p0, B, flat index of shape B)``: ``a``'s indexed dims
    ``p0 ... p0+m-1`` read at the returned flat index (negatives wrapped, all checked)."""
    indices = list(indices) + [None] * (a.ndim - len(indices))
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        raise Unsupported("indexing with a boolean mask (a data-dependent shape)")
    positions = [k for k, i in enumerate(indices) if i is not None]
    if not positions:
        raise Unsupported("indexing with no index tensor")
    perm = list(range(a.ndim))
    if positions != list(range(positions[0], positions[-1] + 1)):  # not adjacent: lead
        perm = positions + [k for k in range(a.ndim) if k not in positions]
        a, indices = prims.permute(a, perm), [indices[k] for k in perm]
        positions = list(range(len(positions)))
    p0, sizes = positions[0], [a.shape[k] for k in positions]
    shape = list(broadcast_shapes(*(indices[k].shape for k in positions)))
    flat = None
    for k, size in zip(positions, sizes):
        term = broadcast_to(_wrapped(indices[k], size, k), shape)
        flat = term if flat is None else prims.add(prims.mul(flat, size), term)
    return a, perm, p0, shape, flat


def _gathered(a: Any, indices: Sequence[Any]) -> Any:
    a, _, p0, shape, flat = _flat_index(a, indices)
    m = sum(i is not None for i in indices)
    pre, post = list(a.shape[:p0]), list(a.shape[p0 + m :])
    n, nb = math.prod(a.shape[p0 : p0 + m]), math.prod(shape)
    rows = prims.broadcast_in_dim(reshape(flat, [nb]), [*pre, nb, *post], [len(pre)])
    out = prims.gather(reshape(a, [*pre, n, *post]), len(pre), rows)
    return reshape(out, [*pre, *shape, *post])


@register(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(a: Any, indices: Sequence[Any]) -> Any:
    return _gathered(a, indices)


# --- writes ------------------------------------------------------------------------------------
def _fit(src: Any, shape: Sequence[int]) -> Any:
    """``src`` cut to ``shape`` (scatter reads only the part of ``src`` that ``index`` covers)."""
    for k, n in enumerate(shape):
        if src.shape[k] != n:
            src = prims.slice(src, k, 0, n, 1)
    return src


@register(aten.scatter_add.default)
def scatter_add(a: Any, dim: int, index: Any, src: Any) -> Any:
    return _scatter(a, dim, index, src, True)


@register(aten.scatter.src)
def scatter_src(a: Any, dim: int, index: Any, src: Any) -> Any:
    return _scatter(a, dim, index, src, False)


@register(aten.scatter.value)
def scatter_value(a: Any, dim: int, index: Any, value: Any) -> Any:
    src = prims.full(list(index.shape), value, a.dtype, a.device)
    return _scatter(a, dim, index, src, False)


def _scatter(a: Any, dim: int, index: Any, src: Any, accumulate: bool) -> Any:
    if a.ndim == 0 or index.ndim == 0:
        out = _scatter(*_one_d(a), 0, *_one_d(index, src), accumulate)
        return reshape(out, list(a.shape))
    dim = _dim(dim, a.ndim)
    src = convert(_fit(src, index.shape), a.dtype)
    return prims.scatter(a, dim, _checked(index, a.shape[dim], dim), src, accumulate)


@register(aten.index_add.default)
def index_add(a: Any, dim: int, index: Any, source: Any, alpha: Any = 1) -> Any:
    if a.ndim == 0:
        return reshape(index_add(*_one_d(a), 0, index, *_one_d(source), alpha), [])
    dim = _dim(dim, a.ndim)
    k = math.prod(index.shape)
    index = _checked(reshape(index, [k]), a.shape[dim], dim)
    rows = prims.broadcast_in_dim(index, source.shape, [dim])
    if alpha != 1:
        source = prims.mul(source, alpha)
    return prims.scatter(a, dim, rows, convert(source, a.dtype), True)


@register(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(a: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Any:
    moved, perm, p0, shape, flat = _flat_index(a, indices)
    m = sum(i is not None for i in indices)
    pre, post = list(moved.shape[:p0]), list(moved.shape[p0 + m :])
    n, nb = math.prod(moved.shape[p0 : p0 + m]), math.prod(shape)
    values = reshape(broadcast_to(convert(values, a.dtype), [*pre, *shape, *post]),
                     [*pre, nb, *post])  # fmt: skip
    rows = prims.broadcast_in_dim(reshape(flat, [nb]), [*pre, nb, *post], [len(pre)])
    out = prims.scatter(reshape(moved, [*pre, n, *post]), len(pre), rows, values, accumulate)
    out = reshape(out, list(moved.shape))
    if perm != list(range(a.ndim)):
        out = prims.permute(out, [perm.index(k) for k in range(a.ndim)])
    return out


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad: Any, indices: Any, num_weights: int, padding_idx: int,
                             scale_grad_by_freq: bool) -> Any:  # fmt: skip
    if scale_grad_by_freq:
        raise Unsupported("embedding_dense_backward with scale_grad_by_freq")
    n, d = math.prod(indices.shape), grad.shape[-1]
    rows = _checked(reshape(indices, [n]), num_weights)
    g, dtype = upcast(reshape(grad, [n, d]))
    if padding_idx >= 0:  # the padding row gets no gradient
        pad = prims.broadcast_in_dim(prims.eq(rows, padding_idx), [n, d], [0])
        g = prims.where(pad, 0.0, g)
    zeros = prims.full([num_weights, d], 0.0, g.dtype, grad.device)
    out = prims.scatter(zeros, 0, prims.broadcast_in_dim(rows, [n, d], [0]), g, True)
    return convert(out, dtype)
