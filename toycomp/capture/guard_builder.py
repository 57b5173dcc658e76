"""Guards from sources -> one readable Python function ``check(L, G) -> bool``.

While the bytecode interpreter traces a frame, every value it reads from outside (an argument,
a global, a closure cell, an attribute) comes with a source, and the interpreter asks the
``GuardBuilder`` for the checks that keep the trace valid: a tensor's metadata, a Python value,
a module's type, a function's identity, the global grad / autocast / dtype state. The builder
renders each as one line of Python and compiles them all into one function:

>>> import torch
>>> from toycomp.capture.sources import LocalSource
>>> b = GuardBuilder()
>>> b.tensor_match(LocalSource("x"), torch.zeros(2, 3))
>>> b.constant_match(LocalSource("n"), 4)
>>> print("\\n".join(list(b.conditions)[:4]))
type(L['x']) is torch.Tensor
L['x'].shape == (2, 3)
L['x'].stride() == (3, 1)
L['x'].dtype == torch.float32
>>> check = b.compile()
>>> check({"x": torch.ones(2, 3), "n": 4}, {}), check({"x": torch.ones(2, 3), "n": 5}, {})
(True, False)
>>> check.failing_guard({"x": torch.ones(2, 3), "n": 5}, {})
"L['n'] == 4"

[Note: guards are lines of Python]
Dynamo compiles its guards into a C++ tree (GuardManager) for speed; toycomp keeps the lines of
Python, joined by ``and`` in one function, because a student can print it and see exactly what
is checked on every call. When ``check`` fails, ``failing_guard`` evaluates the same lines one at
a time to name the first that failed: that text goes into the recompile message. Three things
keep the lines cheap on a model of hundreds of modules (MobileNet-v2: 3,500 lines and 0.5 ms a
call before them): a module's parameters, buffers and submodules are read from its dicts
([Note: guards read nn.Module attributes from its dicts], sources.py), a tuple of constants is
compared whole ([Note: tuples of constants]), and the tensors read from attributes are checked
in one C++ call ([Note: tensor guards in one call], guard_check.py, which compiles the lines).

NB: in PyTorch this lives in torch/_dynamo/guards.py (GuardBuilder, CheckFunctionManager).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

import toycomp.config as config
from toycomp.capture.codegen import known_text
from toycomp.capture.guard_check import compile_check, compile_fast_check
from toycomp.capture.sources import (
    AttrSource,
    ChainedSource,
    GetItemSource,
    Source,
    _BUILTINS,
    module_lookups,
)

_LITERAL_TYPES = (int, float, str, bool, type(None))


class GuardBuilder:
    """Collects guard lines (deduplicated, in the order they were asked for)."""

    def __init__(self, fn: Any = None) -> None:
        self.conditions: dict[str, None] = {}  # each line once, in order (a dict as an ordered set)
        self.env: dict[str, Any] = {"torch": torch, "B": _BUILTINS, "F": fn}  # F: fn's cells
        self.named: dict[str, str] = {}  # values read once and named: t0 -> its path
        self.lookups: dict[Source, dict[str, str]] = {}  # a module's source -> module_lookups
        self.leans: dict[Source, Source] = {}  # a source -> as the guards read it (see lean)
        self.readable: dict[str, str] = {}  # that text -> the source's name(), where they differ
        self.batch: list[tuple[str, torch.Tensor, list[str]]] = []  # [Note: tensor guards ...]

    def add(self, condition: str) -> None:
        self.conditions[condition] = None

    def constant(self, value: Any) -> str:
        """``value`` as text: a literal, a torch dtype, or a name bound in the guard's globals."""
        text = known_text(value, self.env, _LITERAL_TYPES)
        if text is not None:
            return text
        if isinstance(value, torch.device):  # t.device is a new object each time: one name
            name = f"device_{value}".replace(":", "")
            if self.env.get(name) == value:
                return name
        else:
            name = "".join(c if c.isalnum() else "_" for c in getattr(value, "__name__", "E"))
        while name in self.env or name in ("L", "G", "F") or name in self.named:  # a new name
            name += "_"
        self.env[name] = value
        return name

    def new_name(self, prefix: str, source: Source) -> str:
        """A name for the value at ``source``, read once in a line (``t0 := ...``)."""
        name = f"{prefix}{len(self.named)}"
        self.named[name] = self.path(source)
        return name

    # ----- how a guard reads a source ---------------------------------------------------------

    def note_module(self, source: Source, module: torch.nn.Module) -> None:
        """``module`` is read from ``source`` and guarded by its type: its parameters, buffers
        and submodules may be read from its dicts ([Note: guards read nn.Module attributes
        from its dicts], sources.py)."""
        self.lookups[source] = module_lookups(module)

    def path(self, source: Source) -> str:
        """``source`` as the guards read it: the text of ``lean(source)`` (for ``m.weight``)."""
        return (self.lean(source) if isinstance(source, ChainedSource) else source).name()

    def lean(self, source: Source) -> Source:
        """``source``, but ``m._parameters['weight']`` for ``m.weight`` where that is the same
        read (see lean_chained)."""
        if not isinstance(source, ChainedSource):  # a local or a global: read as written
            return source
        if source not in self.leans:
            self.leans[source] = self.lean_chained(source)
        return self.leans[source]

    def lean_chained(self, source: ChainedSource) -> Source:
        """``m._parameters['weight']`` for ``m.weight``, after a line that checks the instance
        dict does not shadow it (``'weight' not in m.__dict__``). The transformed function reads
        its graph inputs the same way, right after this check ([Note: graph inputs read as the
        guards read them], transformed_code.py)."""
        base = self.lean(source.base)
        table = None
        if type(source) is AttrSource:
            table = self.lookups.get(source.base, {}).get(source.member)
        if table is None:
            lean = source if base == source.base else replace(source, base=base)
        else:
            self.add(f"{source.member!r} not in {base.name()}.__dict__")
            lean = GetItemSource(AttrSource(base, table), source.member)
        if lean != source:
            self.readable[lean.name()] = source.name()
        return lean

    # ----- one method per kind of guard (Dynamo: GuardBuilder.TENSOR_MATCH, ID_MATCH, ...) -----

    def tensor_match(self, source: Source, t: torch.Tensor, sizes=None, strides=None) -> None:
        """Type, shape, strides, dtype, device, requires_grad (sizes: see symbolic_layout)."""
        v = self.path(source)
        cls = "torch.Tensor" if type(t) is torch.Tensor else self.constant(type(t))
        if "." in v or v.count("[") > 1:  # an attribute chain: batched, or read once and named
            return self.chained_tensor(source, t, v, cls, sizes, strides)
        for line in [f"type({v}) is {cls}", *self.layout_lines(v, t, sizes, strides)]:
            self.add(line)

    def chained_tensor(self, source: Source, t: torch.Tensor, v: str, cls: str, sizes,
                       strides) -> None:
        """A tensor read from an attribute or an item: with static sizes, checked with the
        others in one call at the end ([Note: tensor guards in one call], guard_check.py);
        else read once and named (``t0 := ...``)."""
        if sizes is None and config.fast_guards and _batchable(t):
            self.batch.append((v, t, [f"type({v}) is {cls}", *self.layout_lines(v, t)]))
            return
        name = self.new_name("t", source)
        self.add(f"type({name} := {v}) is {cls}")
        for line in self.layout_lines(name, t, sizes, strides):
            self.add(line)

    def layout_lines(self, v: str, t: torch.Tensor, sizes=None, strides=None) -> list[str]:
        if sizes is not None:  # dynamic shapes
            return self.symbolic_layout(v, t, sizes, strides)
        return [f"{v}.shape == {tuple(t.shape)!r}", f"{v}.stride() == {tuple(t.stride())!r}",
                f"{v}.dtype == {t.dtype}", f"{v}.device == {self.constant(t.device)}",
                f"{v}.requires_grad is {t.requires_grad}"]

    def symbolic_layout(self, v: str, t: torch.Tensor, sizes: list, strides: list) -> list[str]:
        """A tensor's layout when some sizes are symbols. ``sizes`` / ``strides`` say what to
        check of each dimension: a number, None (a symbol: checked by the shape guards,
        ``L['x'].size(0) >= 2``) or the text of an expression it must equal (``L['x'].size(0)``).
        Its number of dimensions, then each size and stride that is not a symbol of its own
        (``L['x'].size(1) == 3``), then dtype, device and requires_grad."""
        lines = [f"{v}.dim() == {len(sizes)}"]
        lines += [f"{v}.size({d}) == {size}" for d, size in enumerate(sizes) if size is not None]
        if all(isinstance(st, int) for st in strides):  # one check for all (contiguous...)
            lines.append(f"{v}.stride() == {tuple(strides)!r}")
        else:
            lines += [f"{v}.stride({d}) == {st}" for d, st in enumerate(strides) if st is not None]
        return lines + [f"{v}.dtype == {t.dtype}", f"{v}.device == {self.constant(t.device)}",
                        f"{v}.requires_grad is {t.requires_grad}"]

    def constant_match(self, source: Source, value: Any) -> None:
        """A Python value, by type and value (``True == 1``, so the type is checked too)."""
        v = self.path(source)
        if value is None or isinstance(value, bool):
            self.add(f"{v} is {value!r}")
            return
        if type(value) is tuple:
            self.tuple_match(source, value)
            return
        plain = type(value) in (int, float, str)
        cls = type(value).__name__ if plain else self.constant(type(value))
        self.add(f"type({v}) is {cls}")
        if isinstance(value, tuple) and all(isinstance(x, int) for x in value):  # torch.Size...
            self.add(f"{v} == {tuple(value)!r}")
        else:
            self.add(f"{v} == {self.constant(value)}")

    # [Note: tuples of constants]
    # A conv's ``stride`` is ``(2, 2)``. Guarded item by item it takes six lines (``type(s) is
    # tuple``, ``len(s) == 2``, ``type(s[0]) is int``, ``s[0] == 2``...), and a conv has three
    # such tuples. A tuple of literals (ints, floats, bools, strings, None: ``is_literal_tuple``
    # in variables/builder.py) is compared whole instead, in one line: ``type(c0 := m.stride)
    # is tuple and c0 == (2, 2) and type(c0[0]) is int and type(c0[1]) is int``. The items'
    # types are still checked one by one, because ``==`` does not see them: ``(True, 2) == (1,
    # 2)`` and ``(2.0, 2) == (2, 2)`` hold, and what was traced with ``1`` may differ for
    # ``True`` (``F.conv2d`` rejects a float stride that a compiled graph would accept).
    def tuple_match(self, source: Source, value: tuple) -> None:
        v = first = self.path(source)
        if "." in v or v.count("[") > 1:  # read the attribute once: (c0 := ...)
            v = self.new_name("c", source)
            first = f"({v} := {first})"
        items = ", ".join(self.constant(x) for x in value) + ("," if len(value) == 1 else "")
        types = [f"{v}[{i}] is None" if x is None else f"type({v}[{i}]) is {type(x).__name__}"
                 for i, x in enumerate(value)]
        self.add(" and ".join([f"type({first}) is tuple", f"{v} == ({items})", *types]))

    def id_match(self, source: Source, value: Any) -> None:
        """The very same object (functions, classes, modules of Python code)."""
        self.add(f"{self.path(source)} is {self.constant(value)}")

    def type_match(self, source: Source, value: Any) -> None:
        """An object of the same class (nn.Modules, user objects, lists, dicts)."""
        self.add(f"type({self.path(source)}) is {self.constant(type(value))}")

    def length_match(self, source: Source, n: int) -> None:
        self.add(f"len({self.path(source)}) == {n}")

    def dict_keys_match(self, source: Source, keys: list) -> None:
        self.add(f"list({self.path(source)}.keys()) == {self.constant(list(keys))}")

    def alias_match(self, a: Source, b: Source, same: bool) -> None:
        """Which tensor inputs are the same object (``a.add_(1); return c * 2``). (None for one
        buffer read twice from its module's dict: ``m._buffers['x'] is m._buffers['x']``.)"""
        if same and a == b and self.path(a).endswith(f"[{getattr(a, 'member', None)!r}]"):
            return
        self.add(f"{self.path(a)} {'is' if same else 'is not'} {self.path(b)}")

    def storage_overlap(self, a: Source, b: Source, overlap: bool) -> None:
        """Whether two tensor inputs share memory (``t`` and ``t.view(-1)``), when the graph
        mutates one of them (Dynamo: ``STORAGE_OVERLAPPING``)."""
        self.env["shares_memory"] = shares_memory
        self.add(f"{'' if overlap else 'not '}shares_memory({self.path(a)}, {self.path(b)})")

    def global_state(self) -> None:
        """Grad mode, autocast state and the default dtype, as they are now."""
        self.add(f"torch.is_grad_enabled() is {torch.is_grad_enabled()}")
        for d in ("cpu", "cuda"):
            self.add(f"torch.is_autocast_enabled({d!r}) is {torch.is_autocast_enabled(d)}")
            if torch.is_autocast_enabled(d):  # and its dtype
                self.add(f"torch.get_autocast_dtype({d!r}) == {torch.get_autocast_dtype(d)}")
        self.add(f"torch.get_default_dtype() == {torch.get_default_dtype()}")

    def compile(self) -> Callable[[dict, dict], bool]:
        """All conditions as one function ``check(L, G)``; ``check.source`` is its text."""
        if config.fast_guards:  # shared paths read once, tensors batched: guard_check.py
            return compile_fast_check(self)
        return compile_check(list(self.conditions), self.env, self.named, self.readable)


def _batchable(t: torch.Tensor) -> bool:
    """Can TensorGuards check ``t``? (A dense tensor or Parameter: not sparse, nested, fake.)"""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided \
        and not t.is_nested


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Are ``a`` and ``b`` the same tensor or views of one storage? (Tensors with no memory,
    on the meta device or empty, share none.)"""
    if a is b:
        return True
    ptr = a.untyped_storage().data_ptr()
    return ptr != 0 and ptr == b.untyped_storage().data_ptr() and a.device == b.device
