"""Sets while tracing: a set made by the traced code, of Python constants.

``s = {1, 2}; s.add(3); s | {4}`` is all known while tracing: the tracker holds a real Python
set of constants and applies each method to it; a set that escapes (returned, alive at a graph
break) is rebuilt as a literal. Items that are not constants (tensors hash by identity) are a
graph break that names the set operation.

>>> s = SetVariable({1, 2})
>>> _ = s.call_method(None, "add", [ConstantVariable(3)], {})
>>> sorted(s.as_python_constant()), s.call_method(None, "__contains__", [ConstantVariable(3)], {})
([1, 2, 3], ConstantVariable(True))

NB: in PyTorch this lives in torch/_dynamo/variables/dicts.py (SetVariable, a dict's keys).
"""

from __future__ import annotations

from toycomp.capture.variables.base import ConstantVariable, Unsupported, VariableTracker

_MUTATING = {"add", "discard", "remove", "update", "clear", "pop", "intersection_update",
             "difference_update", "symmetric_difference_update", "__ior__", "__iand__",
             "__isub__", "__ixor__"}


def constants(tx, args) -> list:
    try:
        return [a.as_python_constant() for a in args]
    except Unsupported:
        raise Unsupported(f"a set of values that are not Python constants ({args})") from None


def as_set_or_constant(value) -> VariableTracker:
    """A result of a set operation: a new ``SetVariable`` for a set, else a constant."""
    return SetVariable(value) if type(value) is set else ConstantVariable(value)


class SetVariable(VariableTracker):
    """A set made while tracing; ``value`` is the real set of constants."""

    def __init__(self, value: set):
        self.value = set(value)

    def python_type(self):
        return set

    def as_python_constant(self):
        return self.value

    def unpack_var_sequence(self, tx):
        return [ConstantVariable(v) for v in self.value]

    def truth(self, tx):
        return bool(self.value)

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            raise Unsupported(f"set.{name} with keyword arguments")
        if name == "update" or name.endswith("_update"):  # (several iterables, not one set)
            consts = [set(v for v in a.as_python_constant()) for a in args]
        else:
            consts = constants(tx, args)
        try:
            result = getattr(self.value, name)(*consts)
        except (KeyError, TypeError) as e:  # s.remove(missing), s.pop() of an empty set
            raise Unsupported(f"set.{name}: {type(e).__name__}: {e}") from None
        if name in _MUTATING:
            return self if name.startswith("__i") else as_set_or_constant(result)
        return as_set_or_constant(result)

    def reconstruct(self, codegen):
        if not self.value:
            return codegen.new_object(self, "set()")
        items = ", ".join(codegen.constant(v) for v in sorted(self.value, key=repr))
        return codegen.new_object(self, "{" + items + "}")

    def __repr__(self):
        return f"SetVariable({self.value!r})"
