"""PyCodegen: variable trackers -> Python expressions in the transformed function.

After tracing, the values that must exist in plain Python (a return value, the frame's live
values at a graph break, the values of replayed side effects) are written as expressions:
a constant as a literal, a value from outside by its source, a tensor computed in the graph as
``__graph_out[i]``, a new list as a literal bound once to a temporary (so it stays one object).

>>> from toycomp.capture.variables.base import ConstantVariable
>>> from toycomp.capture.variables.lists import ListVariable
>>> cg = PyCodegen()
>>> cg.reconstruct(ListVariable([ConstantVariable(1), ConstantVariable("a")]))
'__tmp0'
>>> cg.lines
["__tmp0 = [1, 'a']"]
>>> known_text(3, {}, (int,)), known_text(len, {"n": len}, ())  # a literal, a known name
('3', 'n')

NB: in PyTorch this lives in torch/_dynamo/codegen.py (PyCodegen, which emits bytecode).
"""

from __future__ import annotations

import builtins
from typing import Any

import torch

from toycomp.capture.sources import Source
from toycomp.capture.variables.base import Unsupported
from toycomp.symbolic_shapes import is_symbolic, sym_expr, to_text

_LITERALS = (int, float, str, bool, type(None), bytes)


def known_text(value: Any, env: dict[str, Any], scalars: tuple[type, ...]) -> str | None:
    """A literal of exactly ``scalars`` (not nan/inf), a dtype, its name in ``env``, or None."""
    if type(value) in scalars and repr(value) not in ("nan", "inf", "-inf"):
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)
    return next((name for name, known in env.items() if known is value), None)


class PyCodegen:
    """Collects statements (``lines``), globals for them (``env``) and the graph's outputs."""

    def __init__(self, symbols: dict | None = None) -> None:
        self.symbols: dict = symbols or {}  # symbol -> its Source (``L['x'].size(0)``)
        self.lines: list[str] = []
        self.env: dict[str, Any] = {"torch": torch}
        self.outputs: dict = {}  # FX node -> the TensorVariable the graph returns, in order
        self.temps: dict[int, str] = {}

    def reconstruct(self, var) -> str:
        return var.reconstruct(self)

    def bind(self, expr: str, name: str) -> str:
        """``name = expr``, after the lines ``expr`` needs: a rebuilt value in a temporary."""
        self.lines.append(f"{name} = {expr}")
        return name

    def source(self, source: Source) -> str:
        return source.code()

    def constant(self, value: Any) -> str:
        """``value`` as a literal, or as a name bound to it in ``env`` (``__sin_3``)."""
        if is_symbolic(value) or isinstance(value, tuple) and any(map(is_symbolic, value)):
            return self.size_expression(value)
        text = known_text(value, self.env, _LITERALS)
        if text is not None:
            return text
        name = getattr(value, "__name__", None)
        if isinstance(name, str) and getattr(torch, name, None) is value:
            return f"torch.{name}"  # torch.set_grad_enabled, torch.autocast, torch.sin...
        if isinstance(name, str) and getattr(builtins, name, None) is value:
            return name  # setattr, len...
        if isinstance(value, tuple) and all(isinstance(v, _LITERALS) for v in value):
            return repr(value)
        name = getattr(value, "__name__", type(value).__name__)
        name = f"__{''.join(c if c.isalnum() else '_' for c in name)}_{len(self.env)}"
        self.env[name] = value
        return name

    def size_expression(self, value: Any) -> str:
        """A size (a SymInt, or a shape holding some) as Python over the frame's inputs: with
        dynamic shapes ``n = x.shape[0]`` is ``x.size(0)`` after a graph break, never the
        value it had while tracing."""
        if isinstance(value, tuple):
            items = "".join(f"{self.constant(v)}, " for v in value)
            return f"torch.Size(({items}))" if isinstance(value, torch.Size) else f"({items})"
        expr = sym_expr(value)
        missing = expr.free_symbols - set(self.symbols)
        if missing:
            raise Unsupported(f"a size ({expr}) whose symbols are not read from an input")
        return f"({to_text(expr, {s: src.code() for s, src in self.symbols.items()})})"

    def graph_output(self, var) -> str:
        self.outputs.setdefault(var.proxy, var)
        return f"__graph_out[{list(self.outputs).index(var.proxy)}]"

    def new_object(self, var, expr: str) -> str:
        """A mutable object made by the traced code: built once, then named."""
        if id(var) not in self.temps:
            self.temps[id(var)] = name = f"__tmp{len(self.temps)}"
            self.lines.append(f"{name} = {expr}")
        return self.temps[id(var)]
