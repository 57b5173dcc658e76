"""Sources: where a traced value came from, as a Python expression a guard can evaluate.

Every variable tracker read from outside the traced code remembers its source. A guard is a
source plus a check (``L['x'].shape == (3,)``), and the transformed function reads its graph
inputs back through the same sources on every call. A source renders two ways:

* ``name()`` for guards, which run on the frame's arguments ``L`` and globals ``G``;
* ``code()`` for the transformed function, where arguments are plain local variables.

>>> s = AttrSource(LocalSource("self"), "scale")
>>> s.name(), s.code()
("L['self'].scale", 'self.scale')
>>> GetItemSource(GlobalSource("LOG"), 0).name()
"G['LOG'][0]"
>>> cell_source(GlobalSource("helper"), 1).name()
"G['helper'].__closure__[1].cell_contents"
>>> TensorPropertySource(LocalSource("x"), "size", 0).code()
'x.size(0)'

NB: in PyTorch this lives in torch/_dynamo/source.py (LocalSource, GlobalSource, ChainedSource,
AttrSource, GetItemSource, TensorPropertySource...; ``Source.name()`` is the guard expression).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Callable

_BUILTINS = vars(builtins)


@dataclass(frozen=True)
class Source:
    """Base class: subclasses implement ``render(local)``; ``local`` spells a frame local."""

    def render(self, local: Callable[[str], str]) -> str:
        raise NotImplementedError

    def name(self) -> str:
        """The expression inside the guard function ``check(L, G)``."""
        return self.render(lambda n: f"L[{n!r}]")

    def code(self) -> str:
        """The expression inside the transformed function (frame locals are its parameters)."""
        return self.render(lambda n: n)

    def read(self, L: dict, G: dict, F: Any = None) -> Any:
        """The value this source names, in the frame with locals ``L`` and globals ``G`` of the
        function ``F`` (closure cells are read through it, as in the guard function)."""
        env = {"L": L, "G": G, "B": _BUILTINS, "F": F}
        return eval(self.name(), env)  # noqa: S307 (our own text)


@dataclass(frozen=True)
class LocalSource(Source):
    local_name: str

    def render(self, local):
        return local(self.local_name)


@dataclass(frozen=True)
class GlobalSource(Source):
    global_name: str

    def render(self, local):
        return f"G[{self.global_name!r}]"


@dataclass(frozen=True)
class BuiltinSource(Source):
    """A builtin such as ``len`` or ``print``; ``B`` is the builtins' dict."""

    builtin_name: str

    def render(self, local):
        return f"B[{self.builtin_name!r}]"


@dataclass(frozen=True)
class ChainedSource(Source):
    """A source reached from another one, ``base``: the base's text and then ``suffix()``."""

    base: Source

    def render(self, local):
        return self.base.render(local) + self.suffix()

    def suffix(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class AttrSource(ChainedSource):
    member: str

    def suffix(self):
        return f".{self.member}"


@dataclass(frozen=True)
class GetItemSource(ChainedSource):
    index: Any  # an int, a str or another constant key

    def suffix(self):
        return f"[{self.index!r}]"


@dataclass(frozen=True)
class TensorPropertySource(ChainedSource):
    """A size, stride or the storage offset of the tensor at ``base``: ``L['x'].size(0)``
    (where a symbol of dynamic shapes is read)."""

    prop: str  # "size", "stride" or "storage_offset"
    index: int | None = None

    def suffix(self):
        return f".{self.prop}({'' if self.index is None else self.index})"


@dataclass(frozen=True)
class IteratorSeqSource(ChainedSource):
    """The sequence under a list / tuple / range iterator (``__reduce__`` reads it unconsumed)."""

    def suffix(self):
        return ".__reduce__()[1][0]"


@dataclass(frozen=True)
class FunctionSource(Source):
    """The function being compiled itself (``F``): the root of its closure cells' sources."""

    def render(self, local):
        return "F"


def cell_source(fn_source: Source, index: int) -> Source:
    """The contents of closure cell ``index`` of the function at ``fn_source``."""
    return AttrSource(GetItemSource(AttrSource(fn_source, "__closure__"), index), "cell_contents")


def placeholder_name(source: Source) -> str:
    """A graph input's name, spelled like Dynamo's: ``L['self'].fc.weight`` ->
    ``l_self_fc_weight``."""
    text = source.name().lower()
    out = "".join(ch if ch.isalnum() else "_" for ch in text)
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "arg"
