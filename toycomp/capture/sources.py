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
>>> import torch
>>> module_lookups(torch.nn.Linear(2, 3))  # how guards read its attributes (see the Note)
{'weight': '_parameters', 'bias': '_parameters'}

NB: in PyTorch this lives in torch/_dynamo/source.py (LocalSource, GlobalSource, ChainedSource,
AttrSource, GetItemSource, TensorPropertySource...; ``Source.name()`` is the guard expression).
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

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


@dataclass(frozen=True)
class NumpyTensorSource(Source):
    """The tensor sharing the memory of the NumPy array at ``base`` (``torch.from_numpy``):
    an array handed over at a graph break (``a = y.numpy()``) is a graph input again."""

    base: Source

    def render(self, local):
        return f"torch.from_numpy({self.base.render(local)})"


def placeholder_name(source: Source) -> str:
    """A graph input's name, spelled like Dynamo's: ``L['self'].fc.weight`` ->
    ``l_self_fc_weight``."""
    return re.sub(r"[\W_]+", "_", source.name().lower()).strip("_") or "arg"


# [Note: guards read nn.Module attributes from its dicts]
# ``m.weight`` is not in ``m.__dict__``: Python searches type(m)'s MRO, then the instance dict,
# fails, and calls nn.Module.__getattr__ (Python code), which looks in ``m._parameters``, then
# ``m._buffers``, then ``m._modules``. That costs 0.7 us a parameter and 1 us a buffer on the
# 2-core CPU, against 0.06 us for ``m._parameters['weight']``, and MobileNet-v2's guards read
# 330 of them on every call. So guards read ``m._parameters['weight']`` (as Dynamo's
# GuardManager does: ``getattr_on_nn_module`` in torch/_dynamo/guards.py) where that is
# exactly the lookup ``m.weight`` makes:
#   1. type(m) keeps nn.Module's ``__getattr__`` and object's ``__getattribute__``;
#   2. no class in type(m).__mro__ has the name, nor the table's name (no property, method or
#      class attribute ``weight`` comes before the parameter);
#   3. the instance dict has no ``weight``;
#   4. no table that __getattr__ searches first has the name.
# 1 and 2 are facts about the class, checked here while tracing; the ``type(m) is Conv2d`` line
# that every traced module has makes the class the same on every call. 4 holds while nn.Module's
# own __setattr__ / register_* keep each name in one table (they remove it from the others). 3
# is checked by the guard itself (``'weight' not in m.__dict__``: 0.03 us), since writing
# ``m.__dict__`` or ``object.__setattr__`` directly can shadow the parameter. Not seen: a class
# changed after compiling (``Conv2d.weight = property(...)``); Dynamo assumes the same. The
# readable text (``failing_guard``, the graph inputs' names) stays ``m.weight``; the transformed
# function reads its inputs the lean way too, each commented with its source ([Note: graph
# inputs read as the guards read them], transformed_code.py).
MODULE_TABLES = ("_parameters", "_buffers", "_modules")


def module_lookups(m: torch.nn.Module) -> dict[str, str]:
    """name -> the table (``_parameters``, ``_buffers`` or ``_modules``) that ``m.name`` reads,
    for the names a guard may read from the table directly (see the Note above)."""
    cls = type(m)
    if cls.__getattr__ is not torch.nn.Module.__getattr__ \
            or cls.__getattribute__ is not object.__getattribute__:
        return {}
    class_names = {name for klass in cls.__mro__ for name in vars(klass)}
    if class_names.intersection(MODULE_TABLES):
        return {}
    found: dict[str, str] = {}
    for table in MODULE_TABLES:
        for name in vars(m).get(table, {}):
            if name not in found and name not in class_names and name not in vars(m):
                found[name] = table
    return found
