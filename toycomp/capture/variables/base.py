"""The base variable tracker, trackers of real Python values and constants, and the exception
that means "graph break".

A variable tracker stands for one Python value while the bytecode interpreter runs: it knows
what the interpreter may do with the value (call it, read an attribute, iterate it) and, when the
value came from outside the traced code, its ``source``. The real value is never computed on:
tensors are fake, containers hold trackers.

>>> c = ConstantVariable(3)
>>> c.as_python_constant(), c.python_type().__name__
(3, 'int')
>>> c.call_method(None, "__add__", [ConstantVariable(4)], {}).as_python_constant()
7

NB: in PyTorch this lives in torch/_dynamo/variables/base.py (VariableTracker) and
torch/_dynamo/variables/constant.py (ConstantVariable); torch/_dynamo/exc.py has Unsupported.
"""

from __future__ import annotations

import types
from typing import Any

from toycomp.capture.sources import Source
from toycomp.symbolic_shapes import is_symbolic, specialized


class Unsupported(Exception):
    """Raised while tracing an instruction that cannot be traced: it becomes a graph break."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class MissingAttribute(Unsupported):
    """``obj.name`` raised AttributeError on an object made while tracing (``hasattr`` and
    ``getattr(obj, name, default)`` answer it; anything else breaks the graph)."""


class ObservedKeyError(Unsupported):
    """``d[key]`` of a missing key while tracing: ``Mapping.get`` and ``in`` answer it (see
    [Note: Mapping's mixin methods] in variables/functions.py); anything else breaks."""


class SkipFrame(Exception):
    """The frame cannot be compiled at all (a break where the frame cannot be rebuilt)."""


class VariableTracker:
    """One value on the interpreter's stack or in its locals."""

    source: Source | None = None

    def python_type(self) -> type:
        raise Unsupported(f"type of {self}")

    def as_python_constant(self) -> Any:
        raise Unsupported(f"{self} is not a Python constant")

    def is_python_constant(self) -> bool:
        try:
            self.as_python_constant()
            return True
        except Unsupported:
            return False

    def var_getattr(self, tx, name: str) -> VariableTracker:
        try:
            kind = self.python_type()
        except Unsupported:
            kind = None
        if callable(getattr(kind, name, None)):  # ``lst.append``: called through call_method
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of {self}")

    def call_function(self, tx, args: list, kwargs: dict) -> VariableTracker:
        raise Unsupported(f"call to {self}")

    def call_method(self, tx, name: str, args: list, kwargs: dict) -> VariableTracker:
        if name == "__getattribute__" or name == "__getattr__":
            return self.var_getattr(tx, args[0].as_python_constant())
        method = self.var_getattr(tx, name)
        if isinstance(method, MethodVariable) and method.obj is self:
            raise Unsupported(f"method {name} of {self}")
        return method.call_function(tx, args, kwargs)

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        raise Unsupported(f"iterating over {self}")

    def truth(self, tx) -> bool:
        """``bool(value)`` when it is known while tracing (for jumps); else Unsupported."""
        return bool(self.as_python_constant())

    def reconstruct(self, codegen) -> str:
        """A Python expression for this value in the transformed function."""
        if self.source is not None:
            return codegen.source(self.source)
        for attr in ("value", "fn"):  # a real object from outside the trace: the object itself
            if hasattr(self, attr):
                return codegen.constant(getattr(self, attr))
        raise Unsupported(f"cannot rebuild {self} after a graph break")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ValueVariable(VariableTracker):
    """A tracker that holds the real Python object, ``value``, as its own Python constant: a
    constant, or an object from outside the trace such as a torch function, class or module."""

    def __init__(self, value: Any, source: Source | None = None):
        self.value = value
        self.source = source

    def python_type(self) -> type:
        if is_symbolic(self.value):  # a size traced as a symbol is an int to the user's code
            return {"SymInt": int, "SymFloat": float}.get(type(self.value).__name__, bool)
        return type(self.value)

    def as_python_constant(self) -> Any:
        return self.value


class ConstantVariable(ValueVariable):
    """An immutable Python value known while tracing: ints, strings, None, dtypes, shapes..."""

    def __init__(self, value: Any, source: Source | None = None):
        if _holds_fake(value):  # it would reach the user's code: a bug, never a result
            raise AssertionError(f"a fake tensor held as a constant: {type(value).__name__}")
        super().__init__(value, source)

    def var_getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:  # getattr(None, "x", default), hasattr(...)
            raise MissingAttribute(str(e)) from None
        if isinstance(attr, types.BuiltinMethodType) or (
                callable(getattr(type(self.value), name, None))
                and not isinstance(self.value, type)):
            return MethodVariable(self, name)  # "relu".upper: folded when called
        return ConstantVariable(attr)

    def call_method(self, tx, name, args, kwargs):
        consts = [a.as_python_constant() for a in args]
        kw = {k: v.as_python_constant() for k, v in kwargs.items()}
        if name == "__len__":
            return ConstantVariable(len(self.value))
        value = self.value
        if name in ("__str__", "__repr__", "__format__", "__hash__"):  # a size: its number
            value = specialized(value)
        try:
            method = getattr(value, name)
        except AttributeError as e:
            raise Unsupported(f"{type(self.value).__name__}.{name}") from e
        result = method(*consts, **kw)
        if result is NotImplemented:
            raise Unsupported(f"{type(self.value).__name__}.{name} returned NotImplemented")
        return ConstantVariable(result)

    def unpack_var_sequence(self, tx):
        if isinstance(self.value, (tuple, list, range, str, dict, bytes)):
            return [ConstantVariable(v) for v in self.value]
        raise Unsupported(f"iterating over {type(self.value).__name__}")

    def reconstruct(self, codegen):
        return codegen.constant(self.value)

    def __repr__(self):
        return f"ConstantVariable({self.value!r})"


class MethodVariable(VariableTracker):
    """``obj.name`` for a method that the tracker implements in ``call_method``."""

    def __init__(self, obj: VariableTracker, name: str):
        self.obj = obj
        self.name = name

    def call_function(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def as_python_constant(self):  # a constant's bound method: sorted(xs, key="abc".index)
        if not isinstance(self.obj, ConstantVariable):  # (a list's: bound to a copy of it)
            raise Unsupported(f"{self} is not a Python constant")
        return getattr(self.obj.as_python_constant(), self.name)

    def reconstruct(self, codegen):
        return f"{codegen.reconstruct(self.obj)}.{self.name}"

    def __repr__(self):
        return f"MethodVariable({self.obj}, {self.name!r})"


class NullVariable(VariableTracker):
    """The NULL that 3.11+ pushes below a callable that is not a method (``PUSH_NULL``)."""

    def __repr__(self):
        return "NULL"


NULL = NullVariable()


class CellVariable(VariableTracker):
    """A closure cell made by the traced code (a local captured by an inner function)."""

    def __init__(self, contents: VariableTracker | None = None):
        self.contents = contents


def _holds_fake(value: Any) -> bool:
    """Whether ``value`` is, or a tuple or list holds, a fake tensor (a value only tracing sees)."""
    if isinstance(value, (tuple, list)):
        return any(map(_holds_fake, value))
    return type(value).__name__ == "FakeTensor"
