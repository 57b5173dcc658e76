"""Python side effects seen while tracing -> lines of Python replayed after the graph, every call.

The graph only computes tensors. Mutations of Python state that the traced code makes (``LOG
.append(x)``, ``self.calls += 1``, ``global COUNT``, ``d["k"] = v``) are recorded here, in program
order, and the transformed function replays them after calling the graph::

    G['LOG'].append(__graph_out[0])
    self.calls = 3
    G['COUNT'] = 8

Mutations of objects the traced code created itself are not recorded: such an object is rebuilt
whole, in its final state, wherever it escapes. A mutation whose target or value cannot be
written as Python (e.g. a lambda made inside the trace) raises ``Unsupported`` when recorded, so
the instruction becomes a graph break and runs for real: a side effect is never dropped.

>>> from toycomp.capture.codegen import PyCodegen
>>> from toycomp.capture.sources import GlobalSource
>>> from toycomp.capture.variables.base import ConstantVariable as C
>>> from toycomp.capture.variables.lists import ListVariable
>>> log = ListVariable([], source=GlobalSource("LOG"))
>>> effects = SideEffects(check=lambda record: None)
>>> effects.record_method_call(log, "append", [C(1)])
>>> effects.record_method_call(log, "__setitem__", [C(0), C(7)])
>>> effects.codegen(PyCodegen())
["G['LOG'].append(1)", "G['LOG'][0] = 7"]

[Note: why replaying after the graph is enough]
The graph reads no Python state and the replayed lines read no tensor the graph has not already
produced, so moving every Python mutation after the graph keeps each one's value; and replaying
them in the order they were recorded keeps their relative order, which is all Python can see.

NB: in PyTorch this lives in torch/_dynamo/side_effects.py (SideEffects, AttributeMutation,
``codegen_update_mutated``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toycomp.capture.sources import Source

# Methods replayed as a statement rather than a call ({0}, {1}: the arguments).
STATEMENTS = {
    "__setitem__": "{target}[{0}] = {1}",
    "__delitem__": "del {target}[{0}]",
    "__iadd__": "{target}.extend({0})",
}


@dataclass
class MethodCall:
    """``target.method(*args, **kwargs)`` on an object read from a source (list.append...)."""

    target: Any
    method: str
    args: list
    kwargs: dict = field(default_factory=dict)

    def codegen(self, cg) -> str:
        target = cg.reconstruct(self.target)
        parts = [cg.reconstruct(a) for a in self.args]
        parts += [f"{k}={cg.reconstruct(v)}" for k, v in self.kwargs.items()]
        statement = STATEMENTS.get(self.method)
        if statement is not None:
            return statement.format(*parts, target=target)
        return f"{target}.{self.method}({', '.join(parts)})"



@dataclass
class SetAttr:
    target: Any
    name: str
    value: Any

    def codegen(self, cg) -> str:
        return f"{cg.reconstruct(self.target)}.{self.name} = {cg.reconstruct(self.value)}"


@dataclass
class StoreGlobal:
    globals_source: Source | None  # None: the frame's own globals, G
    name: str
    value: Any

    def codegen(self, cg) -> str:
        where = "G" if self.globals_source is None else cg.source(self.globals_source)
        return f"{where}[{self.name!r}] = {cg.reconstruct(self.value)}"


@dataclass
class SetGradMode:
    """The frame leaves grad mode switched (``torch.set_grad_enabled(False)`` as a call): the
    graph's own switch does not outlive it, so the mode is set again after it."""

    mode: bool

    def codegen(self, cg) -> str:
        return f"torch.set_grad_enabled({self.mode})"


class SideEffects:
    """The recorded mutations, in program order. ``check`` tries to write one as Python."""

    def __init__(self, check):
        self.records: list = []
        self.check = check  # record -> None, or raises Unsupported if it cannot be replayed

    def add(self, record) -> None:
        self.check(record)
        self.records.append(record)

    def record_method_call(self, target, method, args, kwargs=None):
        self.add(MethodCall(target, method, list(args), dict(kwargs or {})))

    def record_setattr(self, target, name, value):
        self.add(SetAttr(target, name, value))

    def record_store_global(self, globals_source, name, value):
        self.add(StoreGlobal(globals_source, name, value))

    def record_grad_mode(self, mode: bool):
        self.add(SetGradMode(mode))

    def codegen(self, cg) -> list[str]:
        return [record.codegen(cg) for record in self.records]
