"""Guard lines -> the compiled function ``check(L, G)``, and the name of the line that failed.

``GuardBuilder`` (guard_builder.py) collects the lines; ``compile_check`` joins them with
``and`` into one function. With ``fast_guards``, ``compile_fast_check`` first makes two rewrites
that make it cheap to call on a model with hundreds of modules: paths shared by several lines
are read once and named ([Note: guards name shared prefixes]), and the metadata of every tensor
read from an attribute (a model's parameters and buffers) is checked by one C++ call at the end
([Note: tensor guards in one call])::

    def check(L, G):
        try:
            return (
                torch.is_grad_enabled() is True
                ...
                and type(L['self']) is Linear
                and type(L['input']) is torch.Tensor
                and L['input'].shape == (1, 2)
                ...
                and 'weight' not in (m0 := L['self'].__dict__)
                and 'bias' not in m0
                and check_tensors(
                    (m1 := L['self']._parameters)['weight'],  # Parameter (3, 2) float32 cpu ...
                    m1['bias'],  # Parameter (3,) float32 cpu requires_grad
                )
            )
        except Exception:  # a missing attribute or key: the guard fails
            return False

When ``check`` is False, ``check.failing_guard(L, G)`` evaluates the same lines one at a time
and names the first that failed as the user would write it (``L['self'].weight.shape == (3,
2)`` after ``weight.data`` got another shape), not as the check reads it.

>>> check = compile_check(["type(L['n']) is int", "L['n'] == 4"], {})
>>> check({"n": 4}, {}), check({"n": 4.0}, {}), check.failing_guard({"n": 5}, {})
(True, False, "L['n'] == 4")

NB: in PyTorch this lives in torch/_dynamo/guards.py (CheckFunctionManager, which builds a C++
GuardManager tree; ``get_guard_fail_reason``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

import toycomp._torch_compat as compat

# [Note: guards name shared prefixes]
# A module's guards repeat long paths: ``type(L['self'].encoder.layers._modules['encoder_layer_3'
# ].ln_1) is LayerNorm``, then its ``eps``, its weight... and each ``.encoder`` is a call to
# nn.Module.__getattr__. A vision transformer has 1,700 such lines, so walking every path from
# ``L['self']`` again costs more than all the checks themselves. So a path that starts two or
# more lines is named where it is first read, ``(m3 := L['self'].encoder.layers)``, and read
# through its name afterwards (``m3._modules['encoder_layer_3']``), as Dynamo's GuardManager
# tree reads each attribute once. Names are only made in lines whose every part is evaluated
# (no ``and``/``or``/``if`` inside), so a later line never reads a name that was not set. Every
# root is shared this way: a frame's locals ``L[...]``, its globals ``G[...]``, the builtins
# ``B[...]`` and the compiled function ``F`` (whose closure cells are ``F.__closure__[0]...``).
_ROOT = r"(?<![\w.])(?:[LGB]\[(?:'[^'\\]*'|-?\d+)\]|F(?=\.))"
_PATH = re.compile(_ROOT + r"(?:\.[A-Za-z_]\w*|\[(?:'[^'\\]*'|-?\d+)\])*")
_LINK = re.compile(r"\.[A-Za-z_]\w*|\[(?:'[^'\\]*'|-?\d+)\]")
_ROOT_RE = re.compile(_ROOT)


def _paths(condition: str) -> list[tuple[re.Match, str, list[str], str]]:
    """Each path in ``condition``: its match, root (``L['self']``), links, and what follows them
    in the match (a method's name before ``(``, which reads a method, not a value to share)."""
    found = []
    for m in _PATH.finditer(condition):
        root = _ROOT_RE.match(m.group()).group()
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


# [Note: tensor guards in one call]
# Each tensor input needs six checks (its exact type, shape, strides, dtype, device and
# requires_grad): six lines of Python, 0.8 us a tensor, 170 us for MobileNet-v2's 262
# parameters and buffers. Dynamo's ``TensorGuards`` checks all of them for a list of tensors in
# one C++ call, 0.07 us a tensor (and a little more: the dispatch keys, so a tensor that became
# a conjugate view fails too). So the tensors read from an attribute or an item (parameters,
# buffers, tensors in a list) are passed to one ``check_tensors(...)`` line at the end of the
# check, each commented with what it must be; a tensor given as an argument keeps its six
# readable lines (``L['x'].shape == (1000,)``), as do tensors with symbolic sizes. The same
# tensor passed twice makes ``TensorGuards`` fail (the trace saw two tensors: recompile).
# When the call fails, ``failing_guard`` evaluates each tensor's six lines to name the one
# that failed, and falls back to TensorGuards' own message (a dispatch key changed).
@dataclass
class TensorBatch:
    """The tensors one ``check_tensors(...)`` line checks: the paths it reads them from, and
    each tensor's checks as lines (for ``failing_guard``); ``text``: the line."""

    paths: list[str]
    lines: list[list[str]]
    check: Callable[..., bool]
    why: Callable[[list, list[str]], str]
    text: str

    @staticmethod
    def of(name: str, items: list[tuple[str, torch.Tensor, list[str]]]) -> TensorBatch:
        """``items``: (path, tensor, its lines); ``name``: what the check calls the batch."""
        check, why = compat.tensor_guards([t for _, t, _ in items])
        args = "".join(f"\n                {p},  # {_describe(t)}" for p, t, _ in items)
        text = f"{name}({args}\n            )"
        return TensorBatch([p for p, _, _ in items], [ls for _, _, ls in items], check, why, text)


def _describe(t: torch.Tensor) -> str:
    """``Parameter (32, 3, 3, 3) float32 cpu requires_grad``: what a batched tensor must be."""
    grad = " requires_grad" if t.requires_grad else ""
    return f"{type(t).__name__} {tuple(t.shape)} {str(t.dtype)[6:]} {t.device}{grad}"


# The check's source: its conditions joined with ``and`` as ``body``.
_CHECK = """def check(L, G):
    try:
        return (
            {body}
        )
    except Exception:  # a missing attribute or key: the guard fails
        return False
"""


def compile_check(conditions: list[str], env: dict[str, Any], named: dict | None = None,
                  readable: dict | None = None, texts: list | None = None,
                  batch: TensorBatch | None = None) -> Callable[[dict, dict], bool]:
    """``check(L, G)``: all ``conditions``; ``named``: t0 -> its path; ``readable``: paths as
    read -> as written; ``texts``: the conditions as written (fast_guards rewrote them)."""
    source = _CHECK.format(body="\n            and ".join(conditions) or "True")
    scope = dict(env)
    exec(compile(source, "<toycomp guards>", "exec"), scope)
    check = scope["check"]
    check.source, check.conditions = source, list(texts or conditions)
    explain = Explainer(conditions, env, named or {}, readable or {}, check.conditions, batch)
    check.failing_guard = explain.first_failing
    return check


def compile_fast_check(builder) -> Callable[[dict, dict], bool]:
    """fast_guards: the lines of ``builder`` (a GuardBuilder), its batched tensors checked in one
    call at the end and the paths that start several lines read once (the two Notes above)."""
    texts, env = list(builder.conditions), builder.env
    batch = None
    if builder.batch:  # the batched tensors' one check, bound in the guard's globals
        name = "check_tensors"
        while name in env:
            name += "_"
        batch = TensorBatch.of(name, builder.batch)
        env[name] = batch.check
        texts.append(batch.text)
    shared, prefixes = name_shared_prefixes(texts, {*env, *builder.named, "L", "G", "F", "B"})
    return compile_check(shared, env, builder.named | prefixes, builder.readable, texts, batch)


@dataclass
class Explainer:
    """``first_failing(L, G)``: the text of the first line that does not hold (None: all hold),
    as the user would write it (``t0.shape`` -> ``L['self'].weight.shape``)."""

    conditions: list[str]  # as compiled (paths named)
    env: dict
    named: dict[str, str]
    readable: dict[str, str]
    texts: list[str]  # as the builder wrote them
    batch: TensorBatch | None = None

    def first_failing(self, L: dict, G: dict) -> str | None:
        scope = {"L": L, "G": G}  # shared: a condition may name a value for the next (t0 := ...)
        for i, cond in enumerate(self.conditions):
            if not self.holds(cond, scope):
                if self.batch is not None and self.texts[i] == self.batch.text:
                    return self.failing_tensor(scope)
                return self.as_written(self.texts[i])
        return None

    def holds(self, cond: str, scope: dict) -> bool:
        try:
            return bool(eval(cond, dict(self.env), scope))  # noqa: S307 (our own guard text)
        except Exception:
            return False

    def failing_tensor(self, scope: dict) -> str:
        """The first failing line of the batch's tensors, or TensorGuards' own message."""
        for lines in self.batch.lines:
            for line in lines:
                if not self.holds(line, scope):
                    return self.as_written(line)
        tensors = [eval(p, dict(self.env), scope) for p in self.batch.paths]  # noqa: S307
        return self.batch.why(tensors, [self.as_written(p) for p in self.batch.paths])

    def as_written(self, cond: str) -> str:
        for name, text in self.named.items():
            cond = re.sub(rf"\b{name}\b(?! :=)", lambda _: text, cond)
        for path in sorted(self.readable, key=len, reverse=True):
            if path in cond:
                cond = cond.replace(path, self.readable[path])
        return cond
