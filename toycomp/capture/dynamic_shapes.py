"""Dynamic shapes in capture: which sizes become symbols, where each is read, the shape guards.

Input -> output: a real tensor read from a source (and the sizes that source had in the frame's
earlier compiles) -> the kind of each dimension of its fake tensor ("static", "dynamic": a fresh
symbol, "duck": the symbol of an earlier size with the same value); after the trace, the
ShapeEnv's symbols and the facts the trace relied on -> guard lines over the frame's inputs.

    >>> import torch
    >>> from toycomp.capture.sources import LocalSource
    >>> sizes, x = SymbolicSizes(None, FrameState()), LocalSource("x")
    >>> sizes.dim_kinds(torch.ones(8, 3), x)    # first compile: static
    ['static', 'static']
    >>> sizes.dim_kinds(torch.ones(5, 3), x)    # the batch size changed: a symbol
    ['dynamic', 'static']
    >>> sizes.dim_kinds(torch.ones(9, 3), x)    # and stays one
    ['dynamic', 'static']

[Note: automatic dynamic shapes] Like Dynamo's ``automatic_dynamic_shapes``, the first compile
of a frame specialises every size: most functions only ever see one. ``FrameState`` remembers
each input's sizes; when a guard fails and the frame is traced again, a dimension whose size
changed since then is traced as a symbol (``s0``) from this compile on: one recompile, then one
graph for every batch size. ``dynamic=True`` makes every dimension a symbol at once, with "duck
sizing" (two inputs of equal size share a symbol, and a guard checks they stay equal);
``dynamic=False`` never makes one, except for dimensions marked with ``mark_dynamic``.
Parameters and tensors reached through attributes stay static (Dynamo's
``force_parameter_static_shapes``): their sizes do not change between calls.

[Note: 0 and 1 stay specialised] A symbol is created only for a size of at least 2: for 0 or 1
the ShapeEnv hands back the number itself, and the guard checks it. A size-1 dimension
broadcasts (``x + y`` with ``y`` of shape (1, 3) is a different computation from (4, 3)), and an
empty one has no elements at all; every symbol is known to be >= 2, which keeps such questions
answerable without guarding on them (``s0 == 1`` is False for every s0 the graph runs with).

NB: in PyTorch this lives in torch/_dynamo/variables/builder.py (``_automatic_dynamic``,
``wrap_to_fake_tensor_and_record``), torch/_dynamo/pgo.py (``FrameStateSizeEntry``),
torch/_dynamo/decorators.py (``mark_dynamic``) and torch/fx/experimental/symbolic_shapes.py
(``ShapeEnv.create_symbol``, ``produce_guards``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import toycomp._torch_compat as compat
from toycomp.capture.sources import AttrSource, ChainedSource, Source, TensorPropertySource
from toycomp.capture.variables.base import SkipFrame
from toycomp.symbolic_shapes import is_symbolic, sym_expr, to_text

__all__ = [
    "DynamicShapes", "FrameState", "RestartWithSymbols", "SymbolicSizes", "layout_guard_parts",
    "mark_dynamic", "marked_dims", "new_symbols", "shape_guard_lines",
]  # fmt: skip

_MARK = "_toycomp_dynamic_dims"


def mark_dynamic(t: torch.Tensor, dim: int | list[int]) -> None:
    """Trace dimension ``dim`` of ``t`` as a symbol from its first compile on (``dynamic=False``
    too), as ``torch._dynamo.mark_dynamic`` does. A size of 0 or 1 is still specialised."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not -t.dim() <= d < t.dim():
            raise IndexError(f"mark_dynamic: dimension {d} of a {t.dim()}-d tensor")
    marked = set(getattr(t, _MARK, set())) | {d % t.dim() for d in dims}
    setattr(t, _MARK, marked)


def marked_dims(t: torch.Tensor) -> set[int]:
    """Dimensions marked dynamic by ``mark_dynamic`` (toycomp's or Dynamo's)."""
    return set(getattr(t, _MARK, set())) | compat.dynamo_marked_dims(t)


@dataclasses.dataclass
class FrameState:
    """The sizes each input had in the frame's earlier compiles (None: a size seen changing)."""

    sizes: dict[str, list[int | None]] = dataclasses.field(default_factory=dict)

    def update(self, name: str, shape: torch.Size) -> set[int]:
        """Record ``shape`` for the input ``name``; return its dimensions seen changing."""
        old = self.sizes.get(name, list(shape))
        if len(old) != len(shape):  # another number of dimensions: all dynamic (as in Dynamo)
            old = [None] * len(shape)
        self.sizes[name] = new = [a if a == b else None for a, b in zip(old, shape)]
        return {d for d, n in enumerate(new) if n is None}

    def has_dynamic(self) -> bool:
        return any(None in sizes for sizes in self.sizes.values())


class RestartWithSymbols(SkipFrame):
    """A trace without a ShapeEnv met a size that must be a symbol: trace again with one.
    (A ``SkipFrame``, so that the interpreter lets it through; convert_frame.py restarts.)"""


def _is_static_source(t: torch.Tensor, source: Source) -> bool:
    """Parameters and tensors reached through attributes (module buffers...) stay static."""
    while isinstance(source, ChainedSource) and not isinstance(source, AttrSource):
        source = source.base
    return isinstance(source, AttrSource) or isinstance(t, torch.nn.Parameter)


@dataclasses.dataclass
class SymbolicSizes:
    """One trace's sizes: which become symbols (``dim_kinds``), and the symbols made so far."""

    dynamic: bool | None  # None: automatic, True: every size, False: only mark_dynamic's
    frame_state: FrameState  # the sizes of the frame's earlier compiles
    symbols: dict = dataclasses.field(default_factory=dict)  # symbol -> its source (x.size(0))
    nodes: dict = dataclasses.field(default_factory=dict)  # size expression -> its graph node
    dynamic_dims: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # input -> dims

    def dim_kinds(self, t: torch.Tensor, source: Source) -> list[str]:
        """How each dimension of ``t``'s fake tensor is made ([Note: automatic dynamic shapes])."""
        static = _is_static_source(t, source)
        dynamic_dims = marked_dims(t)
        if self.dynamic is None and not static:  # automatic: the dimensions seen changing
            dynamic_dims |= self.frame_state.update(source.name(), t.shape)
        others = "duck" if self.dynamic is True and not static else "static"
        return ["dynamic" if d in dynamic_dims else others for d in range(t.dim())]


def _parts(fake: torch.Tensor) -> list[tuple[str, int | None, Any]]:
    """(property, index, value) for each size, stride and the storage offset of ``fake``."""
    parts = [("size", d, n) for d, n in enumerate(fake.shape)]
    parts += [("stride", d, st) for d, st in enumerate(fake.stride())]
    return parts + [("storage_offset", None, fake.storage_offset())]


def new_symbols(fake: torch.Tensor, source: Source, known: dict) -> list[tuple]:
    """(symbol, its source, its SymInt) for each symbol first met in ``fake``'s sizes, strides
    or storage offset: the graph takes it as an input, read from that source."""
    found = []
    for prop, index, value in _parts(fake):
        expr = sym_expr(value) if is_symbolic(value) else None
        if expr is not None and expr.is_Symbol and expr not in known:
            known[expr] = TensorPropertySource(source, prop, index)
            found.append((expr, known[expr], value))
    return found


def layout_guard_parts(fake: torch.Tensor, source: Source, known: dict) -> tuple[list, list]:
    """What the guards check of ``fake``'s sizes and strides: per dimension a number, None
    (the size defines a symbol: the range guards check it) or the text of the expression it
    must equal (``L['x'].size(0)`` for a second tensor duck-sized like x)."""
    names = {s: src.name() for s, src in known.items()}
    sizes, strides = [], []
    for prop, index, value in _parts(fake)[:-1]:
        out = sizes if prop == "size" else strides
        if not is_symbolic(value):
            out.append(value)
        elif known.get(sym_expr(value)) == TensorPropertySource(source, prop, index):
            out.append(None)
        else:
            out.append(to_text(sym_expr(value), names))
    return sizes, strides


def shape_guard_lines(shape_env: Any, known: dict) -> list[str]:
    """The shape guards: each symbol's range (``L['x'].size(0) >= 2``), then every fact the
    trace relied on (``L['x'].size(0) == L['y'].size(0)``, what a view needed...), as Python
    over the frame's inputs."""
    names = {s: src.name() for s, src in known.items()}
    lines = []
    for symbol, name in names.items():
        lower, upper = compat.symbol_range(shape_env, symbol)
        if lower is not None and lower == upper:  # specialised (str(s0), range(s0)...)
            lines.append(f"{name} == {lower}")
            continue
        lines += [f"{name} >= {lower}"] if lower is not None else []
        lines += [f"{name} <= {upper}"] if upper is not None else []
    return lines + [to_text(e, names) for e in compat.shape_env_guards(shape_env)]


@dataclasses.dataclass
class DynamicShapes:
    """What one compile made dynamic, for ``toycomp.explain``."""

    symbols: dict[str, str]  # "s0" -> "L['x'].size(0)"
    dynamic_dims: dict[str, list[int]]  # "L['x']" -> [0]
    guards: list[str]  # the shape guards (ranges, then the trace's assumptions)

    def __str__(self) -> str:
        lines = [f"{s} = {src}" for s, src in self.symbols.items()]
        lines += [f"{src}: dynamic dims {dims}" for src, dims in self.dynamic_dims.items()]
        return "\n".join(lines + self.guards)
