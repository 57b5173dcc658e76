"""Sets of constants while tracing: ``{f.name for f in fields(self)}``, ``set(keys)``, ``in``.

A ``SetVariable`` holds a real Python set of the items' constant values (strings, ints, types:
what code puts in sets of names); an item that is not a constant (a tensor) is a graph break.
A set made by the traced code that is live at a graph break is rebuilt as a literal.

>>> from toycomp.capture.variables.base import ConstantVariable as C
>>> s = SetVariable([C("a"), C("b")])
>>> s.call_method(None, "__contains__", [C("a")], {}).as_python_constant()
True

NB: in PyTorch this lives in torch/_dynamo/variables/sets.py (SetVariable).
"""

from __future__ import annotations

from toycomp.capture.variables.base import ConstantVariable, Unsupported, VariableTracker
from toycomp.capture.variables.lists import ListIteratorVariable

# Methods that read the set (and, for set algebra, other iterables of constants).
READS = {"__contains__", "__len__", "issubset", "issuperset", "isdisjoint", "union",
         "intersection", "difference", "symmetric_difference", "copy", "__or__", "__and__",
         "__sub__", "__xor__", "__eq__", "__ne__"}
MUTATES = {"add", "update", "discard", "remove", "clear", "difference_update",
           "intersection_update"}


def constant_items(tx, var: VariableTracker) -> list:
    """The constant values of an iterable tracker (a set, list, tuple, dict's keys...)."""
    if isinstance(var, SetVariable):
        return list(var.value)
    if var.is_python_constant():
        return list(var.as_python_constant())
    return [item.as_python_constant() for item in var.unpack_var_sequence(tx)]


class SetVariable(VariableTracker):
    """A ``set`` (or ``frozenset``) of constants made by the traced code."""

    def __init__(self, items: list, frozen: bool = False):
        self.value = {item.as_python_constant() for item in items}
        self.frozen = frozen

    def python_type(self):
        return frozenset if self.frozen else set

    def as_python_constant(self):
        return frozenset(self.value) if self.frozen else set(self.value)

    def unpack_var_sequence(self, tx):
        return [ConstantVariable(v) for v in self.value]

    def truth(self, tx):
        return bool(self.value)

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            raise Unsupported(f"set.{name} with keyword arguments")
        if name == "__iter__":
            return ListIteratorVariable(self.unpack_var_sequence(tx))
        if name == "__contains__":
            return ConstantVariable(args[0].as_python_constant() in self.value)
        if name in MUTATES and not self.frozen:
            operands = [constant_items(tx, a) if name != "add" and name[-6:] != "remove"
                        and name != "discard" else a.as_python_constant() for a in args]
            getattr(self.value, name)(*operands)
            return ConstantVariable(None)
        if name in READS:
            operands = [set(constant_items(tx, a)) for a in args]
            result = getattr(self.value, name)(*operands)
            if isinstance(result, (set, frozenset)):
                return SetVariable([ConstantVariable(v) for v in result], self.frozen)
            return ConstantVariable(result)
        raise Unsupported(f"set.{name}")

    def reconstruct(self, codegen):
        items = ", ".join(codegen.constant(v) for v in sorted(self.value, key=repr))
        text = f"{{{items}}}" if items else "set()"
        return f"frozenset({text})" if self.frozen else text

    def __repr__(self):
        return f"SetVariable({sorted(self.value, key=repr)!r})"
