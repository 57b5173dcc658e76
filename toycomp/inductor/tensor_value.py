"""Stage 4b, the values of lowering: an unrealized tensor (``TensorValue``) and views as index maps.

Input -> output: a ``TensorValue`` (size, dtype, and a loop body computing element
``(i0, i1, ...)``) -> another ``TensorValue`` whose body reads the same buffers at new indices
(``reindex``), or the ``ir.TensorArg`` that describes it when it is exactly a strided view of one
buffer (``as_strided_view``). No data moves: a view is a substitution of index variables.
Example, the transpose of a contiguous (2, 3) buffer ``buf0``::

    >>> from toycomp.inductor.indexing import index_vars
    >>> i0, i1 = index_vars("i", 2)
    >>> a = strided_load("buf0", (2, 3), (3, 1), torch.float32)
    >>> a
    TensorValue([2, 3], torch.float32, load(buf0, 3*i0 + i1))
    >>> t = reindex(a, (3, 2), (i1, i0))  # element (i0, i1) of t is element (i1, i0) of a
    >>> t
    TensorValue([3, 2], torch.float32, load(buf0, i0 + 3*i1))
    >>> as_strided_view(t)
    TensorArg(buffer='buf0', size=(3, 2), stride=(1, 3), offset=0)

NB: in PyTorch this lives in torch/_inductor/ir.py (``TensorBox``, ``StorageBox``, ``View``,
``ReinterpretView``, ``View.dynamic_reshape_indexer``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy
import torch

from toycomp.inductor import indexing, ir


@dataclass(frozen=True)
class TensorMeta:
    """What a lowering rule knows of its result: ``shape`` (ints, or sympy expressions in the
    size symbols ``s0, s1...`` with dynamic shapes) and ``dtype``; like a meta tensor's."""

    shape: tuple
    dtype: torch.dtype


@dataclass(frozen=True)
class TensorValue:
    """An unrealized tensor: ``body`` computes element ``(i0, i1, ...)`` of a ``size`` tensor
    (PyTorch's ``TensorBox``). ``origins``: the FX nodes whose work is inlined in ``body``."""

    size: tuple[int, ...]
    dtype: torch.dtype
    body: ir.Expr
    origins: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"TensorValue({list(self.size)}, {self.dtype}, {self.body!r})"


def strided_load(name: str, size, stride, dtype: torch.dtype) -> TensorValue:
    """Buffer ``name`` read with ``stride``: element ``(i0, ...)`` is ``load(name, sum(s*i))``."""
    index = indexing.linear_index(indexing.index_vars("i", len(size)), stride)
    return TensorValue(tuple(size), dtype, ir.Load(name, index, dtype))


def as_strided_view(value: TensorValue) -> ir.TensorArg | None:
    """A TensorArg if ``value`` is one load at ``offset + sum(stride_k * i_k)``, else None."""
    if not isinstance(value.body, ir.Load):
        return None
    index, ivars = sympy.expand(value.body.index), indexing.index_vars("i", len(value.size))
    strides = [_as_size(sympy.diff(index, v)) for v in ivars]
    offset = _as_size(sympy.sympify(index.xreplace({v: 0 for v in ivars})))
    if not all(_size_like(s) and indexing.known_nonnegative(s) for s in strides + [offset]):
        return None
    if sympy.expand(index - indexing.linear_index(ivars, strides, offset)) != 0:
        return None
    return ir.TensorArg(value.body.buffer, value.size, tuple(strides), offset)


def _size_like(e: int | sympy.Expr) -> bool:
    """An int, or an expression in the size symbols only (a symbolic stride: ``s1``)."""
    return indexing.is_static(e) or all(indexing.is_size_symbol(v) for v in e.free_symbols)


def _as_size(e: sympy.Expr):
    return int(e) if e.is_Integer else e


def tree_size(expr: ir.Expr, limit: int) -> int:
    """Number of nodes in ``expr`` seen as a tree, counting stops a little past ``limit``."""
    count, stack = 0, [expr]
    while stack and count <= limit:
        e = stack.pop()
        count += 1
        if isinstance(e, ir.Op):
            stack.extend(e.args)
    return count


def reindex(value: TensorValue, size, index: tuple[sympy.Expr, ...], ranges=None) -> TensorValue:
    """A view: element ``(i0, i1, ...)`` of the result is element ``index`` of ``value``.

    ``ranges`` (variable -> extent) defaults to ``i0 < size[0], i1 < size[1], ...``.
    """
    if ranges is None:
        ranges = dict(zip(indexing.index_vars("i", len(size)), size))
    mapping = tuple(zip(indexing.index_vars("i", len(value.size)), index))
    ranges = tuple(ranges.items())  # (hashable: see [Note: substituting indices])

    def move(e: ir.Expr) -> ir.Expr | None:
        if isinstance(e, (ir.Load, ir.IndexValue)):
            return replace(e, index=indexing.substitute(e.index, mapping, ranges))
        return None

    return TensorValue(tuple(size), value.dtype, ir.map_expr(value.body, move), value.origins)

