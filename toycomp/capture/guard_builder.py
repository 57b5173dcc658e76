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
>>> print("\\n".join(b.conditions[:4]))
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
a time to name the first that failed: that text goes into the recompile message.

NB: in PyTorch this lives in torch/_dynamo/guards.py (GuardBuilder, CheckFunctionManager).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch

from toycomp.capture.codegen import known_text
from toycomp.capture.sources import Source, _BUILTINS

_LITERAL_TYPES = (int, float, str, bool, type(None))


class GuardBuilder:
    """Collects guard lines (deduplicated, in the order they were asked for)."""

    def __init__(self) -> None:
        self.conditions: list[str] = []
        self.env: dict[str, Any] = {"torch": torch, "B": _BUILTINS}
        self.local_names: list[str] = []  # tensors read once and named: see tensor_match
        self.named: dict[str, str] = {}  # t0 -> the source it names (for failing_guard)

    def add(self, condition: str) -> None:
        if condition not in self.conditions:
            self.conditions.append(condition)

    def constant(self, value: Any) -> str:
        """``value`` as text: a literal, a torch dtype, or a name bound in the guard's globals."""
        text = known_text(value, self.env, _LITERAL_TYPES)
        if text is not None:
            return text
        if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            return repr(tuple(value))  # a torch.Size too
        if isinstance(value, torch.device):
            name = f"device_{value.type}{'' if value.index is None else value.index}"
        else:
            name = "".join(c if c.isalnum() else "_" for c in getattr(value, "__name__", "E"))
        # unique, never the check's own names
        while name in self.env or name in ("L", "G", "F") or name in self.local_names:
            name += "_"
        self.env[name] = value
        return name

    # ----- one method per kind of guard (Dynamo: GuardBuilder.TENSOR_MATCH, ID_MATCH, ...) -----

    def tensor_match(self, source: Source, t: torch.Tensor, sizes=None, strides=None) -> None:
        """Type, shape, strides, dtype, device and requires_grad of a tensor.

        With dynamic shapes, ``sizes`` / ``strides`` say what to check of each dimension: a
        number, None (a symbol: checked by the shape guards, ``L['x'].size(0) >= 2``) or the
        text of an expression it must equal (``L['x'].size(0)``)."""
        v = source.name()
        cls = "torch.Tensor" if type(t) is torch.Tensor else self.constant(type(t))
        if "." in v or v.count("[") > 1:  # an attribute chain: read it once, name it (t0, ...)
            name = f"t{len(self.local_names)}"
            self.local_names.append(name)
            self.named[name] = v
            self.add(f"type({name} := {v}) is {cls}")
            v = name
        else:
            self.add(f"type({v}) is {cls}")
        if sizes is None:
            self.add(f"{v}.shape == {tuple(t.shape)!r}")
            self.add(f"{v}.stride() == {tuple(t.stride())!r}")
        else:
            self.symbolic_layout(v, sizes, strides)
        self.add(f"{v}.dtype == {t.dtype}")
        self.add(f"{v}.device == {self.constant(t.device)}")
        self.add(f"{v}.requires_grad is {t.requires_grad}")

    def symbolic_layout(self, v: str, sizes: list, strides: list) -> None:
        """A tensor's layout when some sizes are symbols: its number of dimensions, then each
        size and stride that is not a symbol of its own (``L['x'].size(1) == 3``)."""
        self.add(f"{v}.dim() == {len(sizes)}")
        for d, size in enumerate(sizes):
            if size is not None:
                self.add(f"{v}.size({d}) == {size}")
        if all(isinstance(st, int) for st in strides):  # one check for all (contiguous...)
            self.add(f"{v}.stride() == {tuple(strides)!r}")
            return
        for d, stride in enumerate(strides):
            if stride is not None:
                self.add(f"{v}.stride({d}) == {stride}")

    def constant_match(self, source: Source, value: Any) -> None:
        """A Python value, by type and value (``True == 1``, so the type is checked too)."""
        v = source.name()
        if value is None or isinstance(value, bool):
            self.add(f"{v} is {value!r}")
            return
        plain = type(value) in (int, float, str)
        cls = type(value).__name__ if plain else self.constant(type(value))
        self.add(f"type({v}) is {cls}")
        self.add(f"{v} == {self.constant(value)}")

    def id_match(self, source: Source, value: Any) -> None:
        """The very same object (functions, classes, modules of Python code)."""
        self.add(f"{source.name()} is {self.constant(value)}")

    def type_match(self, source: Source, value: Any) -> None:
        """An object of the same class (nn.Modules, user objects, lists, dicts)."""
        self.add(f"type({source.name()}) is {self.constant(type(value))}")

    def length_match(self, source: Source, n: int) -> None:
        self.add(f"len({source.name()}) == {n}")

    def dict_keys_match(self, source: Source, keys: list) -> None:
        self.add(f"list({source.name()}.keys()) == {self.constant(list(keys))}")

    def alias_match(self, a: Source, b: Source, same: bool) -> None:
        """Which tensor inputs are the same object (``a.add_(1); return c * 2``)."""
        self.add(f"{a.name()} {'is' if same else 'is not'} {b.name()}")

    def storage_overlap(self, a: Source, b: Source, overlap: bool) -> None:
        """Whether two tensor inputs share memory (``t`` and ``t.view(-1)``), when the graph
        mutates one of them (Dynamo: ``STORAGE_OVERLAPPING``)."""
        self.env["shares_memory"] = shares_memory
        self.add(f"{'' if overlap else 'not '}shares_memory({a.name()}, {b.name()})")

    def global_state(self) -> None:
        """Grad mode, autocast state and the default dtype, as they are now."""
        self.add(f"torch.is_grad_enabled() is {torch.is_grad_enabled()}")
        for device in ("cpu", "cuda"):
            on = torch.is_autocast_enabled(device)
            self.add(f"torch.is_autocast_enabled({device!r}) is {on}")
            if on:
                dtype = torch.get_autocast_dtype(device)
                self.add(f"torch.get_autocast_dtype({device!r}) == {dtype}")
        self.add(f"torch.get_default_dtype() == {torch.get_default_dtype()}")

    def compile(self) -> Callable[[dict, dict], bool]:
        """All conditions as one function ``check(L, G)``; ``check.source`` is its text."""
        return compile_check(self.conditions, self.env, self.named)


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Are ``a`` and ``b`` the same tensor or views of one storage? (Tensors with no memory,
    on the meta device or empty, share none.)"""
    if a is b:
        return True
    ptr = a.untyped_storage().data_ptr()
    return ptr != 0 and ptr == b.untyped_storage().data_ptr() and a.device == b.device


# [Note: guards name shared prefixes]
# A module's guards repeat long paths: ``type(L['self'].encoder.layers._modules['encoder_layer_3'
# ].ln_1) is LayerNorm``, then its ``eps``, its weight... and each ``.encoder`` is a call to
# nn.Module.__getattr__. A vision transformer has 1,700 such lines, so walking every path from
# ``L['self']`` again costs more than all the checks themselves. So a path that starts two or
# more lines is named where it is first read, ``(m3 := L['self'].encoder.layers)``, and read
# through its name afterwards (``m3._modules['encoder_layer_3']``), as Dynamo's GuardManager
# tree reads each attribute once. Names are only made in lines whose every part is evaluated
# (no ``and``/``or``/``if`` inside), so a later line never reads a name that was not set.
_PATH = re.compile(r"\b[LG]\[(?:'[^'\\]*'|-?\d+)\](?:\.[A-Za-z_]\w*|\[(?:'[^'\\]*'|-?\d+)\])*")
_LINK = re.compile(r"\.[A-Za-z_]\w*|\[(?:'[^'\\]*'|-?\d+)\]")


def _paths(condition: str) -> list[tuple[re.Match, str, list[str], str]]:
    """Each path in ``condition``: its match, root (``L['self']``), links, and what follows them
    in the match (a method's name before ``(``, which reads a method, not a value to share)."""
    found = []
    for m in _PATH.finditer(condition):
        root = m.group()[: m.group().index("]") + 1]
        links = _LINK.findall(m.group()[len(root):])
        if condition[m.end():m.end() + 1] == "(" and links:
            links = links[:-1]
        found.append((m, root, links, m.group()[len(root) + len("".join(links)):]))
    return found


def name_shared_prefixes(conditions: list[str], taken) -> tuple[list[str], dict[str, str]]:
    """``conditions`` reading each path that starts two or more of them through a name set at
    its first read (see [Note: guards name shared prefixes]); and name -> the path's text."""
    uses: dict[str, int] = {}
    for cond in conditions:
        for _, root, links, _ in _paths(cond):
            for i in range(1, len(links) + 1):
                key = root + "".join(links[:i])
                uses[key] = uses.get(key, 0) + 1
    names: dict[str, str] = {}  # path -> its name
    rewritten = []
    for cond in conditions:
        may_name = not re.search(r"\b(and|or|if)\b", cond)
        out, end = [], 0
        for m, root, links, rest in _paths(cond):
            text = key = root
            for link in links:
                key, text = key + link, text + link
                if key in names:
                    text = names[key]
                elif may_name and uses[key] >= 2:
                    name = f"m{len(names)}"
                    while name in taken:
                        name += "_"
                    names[key] = name
                    text = f"({name} := {text})"
            out += [cond[end:m.start()], text + rest]
            end = m.end()
        rewritten.append("".join(out) + cond[end:])
    return rewritten, {name: key for key, name in names.items()}


def compile_check(
    conditions: list[str], env: dict[str, Any], named: dict[str, str] | None = None
) -> Callable[[dict, dict], bool]:
    named = dict(named or {})
    shared, prefixes = name_shared_prefixes(conditions, {*env, *named, "L", "G"})
    named.update(prefixes)
    body = "\n            and ".join(shared) or "True"
    source = (
        "def check(L, G):\n"
        "    try:\n"
        f"        return (\n            {body}\n        )\n"
        "    except Exception:  # a missing attribute or key: the guard fails\n"
        "        return False\n"
    )
    scope = dict(env)
    exec(compile(source, "<toycomp guards>", "exec"), scope)
    check = scope["check"]
    check.source = source
    check.conditions = list(conditions)
    check.failing_guard = lambda L, G: first_failing(shared, env, L, G, named, conditions)
    return check


def first_failing(
    conditions: list[str], env: dict, L: dict, G: dict, named: dict[str, str] | None = None,
    texts: list[str] | None = None,
) -> str | None:
    """The text of the first condition that does not hold for ``L``, ``G`` (None: all hold);
    ``texts``: the conditions as written, before their paths were named."""
    scope = {"L": L, "G": G}  # shared: a condition may name a value for the next (t0 := ...)
    for i, cond in enumerate(conditions):
        try:
            ok = eval(cond, dict(env), scope)  # noqa: S307 (our own guard text)
        except Exception:
            ok = False
        if not ok:  # named with the sources' own text: t0.shape -> G['m'].weight.shape
            cond = texts[i] if texts else cond
            for name, text in (named or {}).items():
                cond = re.sub(rf"\b{name}\b(?! :=)", lambda _: text, cond)
            return cond
    return None
