"""Containers while tracing: lists, tuples, dicts and iterators, holding variable trackers.

A list read from outside (an argument, a global) is a ``ListVariable`` with a source. Its items
are read *lazily*, the first time the trace needs them (see [Note: lists are read lazily]);
a list made by the traced code has no source and is rebuilt as a literal after the graph.

>>> from toycomp.capture.variables.base import ConstantVariable as C
>>> t = TupleVariable([C(1), C(2)])
>>> [v.as_python_constant() for v in t.unpack_var_sequence(None)]
[1, 2]
>>> t.call_method(None, "__getitem__", [C(1)], {}).as_python_constant()
2

[Note: lists are read lazily]
``LOG.append(1)`` on a global list must be replayed on every call, but it does not depend on what
the list holds: guarding its length would recompile on every call as the list grows. So a list
with a source starts unread (``_items is None``, guarded only by its type); appends are recorded
and kept as ``pending``; the first read of its contents (``len``, iteration, indexing) reads the
real list, guards its length and wraps each item with a ``GetItemSource``.

NB: in PyTorch this lives in torch/_dynamo/variables/lists.py (ListVariable, TupleVariable,
ListIteratorVariable) and torch/_dynamo/variables/dicts.py (ConstDictVariable); laziness is
torch/_dynamo/variables/lazy.py (LazyVariableTracker).
"""

from __future__ import annotations

import operator
from typing import Any

from toycomp.capture.sources import GetItemSource
from toycomp.capture.variables.base import (
    ConstantVariable,
    ObservedKeyError,
    Unsupported,
    VariableTracker,
)

_MUTATING = {"append", "extend", "insert", "pop", "clear", "remove", "reverse", "sort",
             "__setitem__", "__delitem__", "__iadd__", "update", "setdefault", "popitem"}


class BaseListVariable(VariableTracker):
    """Shared by lists and tuples: ``items`` are trackers."""

    literal = ("[", "]")

    def __init__(self, items: list | None, source=None, value: Any = None):
        self._items = None if items is None else list(items)
        self.source = source
        self.value = value  # the real list, when read from a source
        self.pending: list[VariableTracker] = []  # appended before the items were read

    def items(self, tx) -> list[VariableTracker]:
        if self._items is None:  # first read: guard the length, wrap each item
            tx.output.guards.length_match(self.source, len(self.value))
            self._items = [
                tx.output.wrap(v, GetItemSource(self.source, i)) for i, v in enumerate(self.value)
            ] + self.pending
        return self._items

    def python_type(self):
        return list if isinstance(self, ListVariable) else tuple

    def as_python_constant(self):
        if self._items is None:
            raise Unsupported("unread list")
        return self.python_type()(v.as_python_constant() for v in self._items)

    def unpack_var_sequence(self, tx):
        return list(self.items(tx))

    def truth(self, tx):
        return bool(self.items(tx))

    def call_method(self, tx, name, args, kwargs):
        if name in _MUTATING:
            return self.mutate(tx, name, args)
        items = self.items(tx)
        if name == "__len__":
            return ConstantVariable(len(items))
        if name == "__getitem__":
            index = args[0].as_python_constant()
            if isinstance(index, slice):
                return type(self)(items[index])
            return items[index]
        if name == "__contains__":
            value = args[0].as_python_constant()
            return ConstantVariable(any(v.is_python_constant() and v.as_python_constant() == value
                                        for v in items))
        if name in ("__add__", "__radd__"):
            other = args[0].unpack_var_sequence(tx)
            return type(self)(items + other if name == "__add__" else other + items)
        if name == "__mul__":
            return type(self)(items * args[0].as_python_constant())
        if name in ("index", "count", "__eq__", "__ne__", "__lt__", "__gt__", "copy"):
            if name == "copy":
                return type(self)(items)
            return ConstantVariable(getattr(self.as_python_constant(), name)(
                *[a.as_python_constant() for a in args]))
        if name == "__iter__":
            return ListIteratorVariable(items)
        raise Unsupported(f"{self.python_type().__name__}.{name}")

    def mutate(self, tx, name, args):
        raise Unsupported(f"tuple.{name}")

    def reconstruct(self, codegen):
        if self.source is not None:
            return codegen.source(self.source)
        parts = [codegen.reconstruct(v) for v in self._items]
        if isinstance(self, TupleVariable):
            return "(" + "".join(p + ", " for p in parts) + ")"
        return codegen.new_object(self, "[" + ", ".join(parts) + "]")

    def __repr__(self):
        return f"{type(self).__name__}({self._items if self._items is not None else '<unread>'})"


class TupleVariable(BaseListVariable):
    pass


class ListVariable(BaseListVariable):
    def mutate(self, tx, name, args):
        """Apply the mutation to the tracked items; record it for replay if the list is old."""
        if self.source is not None:
            tx.output.side_effects.record_method_call(self, name, args)
        if name == "append" and self._items is None:
            self.pending.append(args[0])
            return ConstantVariable(None)
        items = self.items(tx)
        consts = lambda: [a.as_python_constant() for a in args]  # noqa: E731
        if name == "append":
            items.append(args[0])
        elif name in ("extend", "__iadd__"):
            items.extend(args[0].unpack_var_sequence(tx))
            return self if name == "__iadd__" else ConstantVariable(None)
        elif name == "insert":
            items.insert(args[0].as_python_constant(), args[1])
        elif name == "pop":
            return items.pop(*consts())
        elif name == "clear":
            items.clear()
        elif name == "reverse":
            items.reverse()
        elif name == "__setitem__":
            items[args[0].as_python_constant()] = args[1]
        elif name == "__delitem__":
            del items[args[0].as_python_constant()]
        else:
            raise Unsupported(f"list.{name}")
        return ConstantVariable(None)


class DictVariable(VariableTracker):
    """A dict with constant keys; ``items`` maps each key to a tracker."""

    def __init__(self, items: dict, source=None):
        self.items = dict(items)
        self.source = source

    def python_type(self):
        return dict

    def as_python_constant(self):
        return {k: v.as_python_constant() for k, v in self.items.items()}

    def unpack_var_sequence(self, tx):
        return [ConstantVariable(k) for k in self.items]

    def truth(self, tx):
        return bool(self.items)

    def call_method(self, tx, name, args, kwargs):
        if name in _MUTATING:
            return self.mutate(tx, name, args, kwargs)
        keys = [ConstantVariable(k) for k in self.items]
        if name == "__getitem__":
            key = args[0].as_python_constant()
            if key not in self.items:
                raise ObservedKeyError(f"KeyError: {key!r}")
            return self.items[key]
        if name == "get":
            default = args[1] if len(args) > 1 else ConstantVariable(None)
            return self.items.get(args[0].as_python_constant(), default)
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__":
            return ConstantVariable(args[0].as_python_constant() in self.items)
        if name == "keys" or name == "__iter__":
            seq = TupleVariable(keys)
            return seq if name == "keys" else ListIteratorVariable(keys)
        if name == "values":
            return TupleVariable(list(self.items.values()))
        if name == "items":
            return TupleVariable([TupleVariable([k, v]) for k, v in zip(keys, self.items.values())])
        if name == "copy":
            return DictVariable(self.items)
        raise Unsupported(f"dict.{name}")

    def mutate(self, tx, name, args, kwargs):
        if self.source is not None:
            tx.output.side_effects.record_method_call(self, name, args, kwargs)
        if name == "__setitem__":
            self.items[args[0].as_python_constant()] = args[1]
        elif name == "update":
            other = args[0].items if args else {}
            self.items.update(other)
            self.items.update(kwargs)
        elif name == "pop":
            key = args[0].as_python_constant()
            return self.items.pop(key, *args[1:])
        elif name == "setdefault":
            return self.items.setdefault(args[0].as_python_constant(), args[1])
        elif name == "__delitem__":
            del self.items[args[0].as_python_constant()]
        else:
            raise Unsupported(f"dict.{name}")
        return ConstantVariable(None)

    def reconstruct(self, codegen):
        if self.source is not None:
            return codegen.source(self.source)
        parts = [f"{k!r}: {codegen.reconstruct(v)}" for k, v in self.items.items()]
        return codegen.new_object(self, "{" + ", ".join(parts) + "}")


class ListIteratorVariable(VariableTracker):
    """``iter(x)`` of a list, tuple, range, dict, zip or enumerate: the items, and a position."""

    def __init__(self, items: list[VariableTracker], index: int = 0):
        self.items = list(items)
        self.index = index

    def next_item(self) -> VariableTracker | None:
        """The next item, or None when exhausted (FOR_ITER then jumps out of the loop)."""
        if self.index >= len(self.items):
            return None
        self.index += 1
        return self.items[self.index - 1]

    def call_method(self, tx, name, args, kwargs):
        if name == "__iter__":
            return self
        raise Unsupported(f"iterator.{name}")

    def unpack_var_sequence(self, tx):
        rest, self.index = self.items[self.index:], len(self.items)
        return rest

    def reconstruct(self, codegen):
        parts = [codegen.reconstruct(v) for v in self.items[self.index:]]
        return "iter((" + "".join(p + ", " for p in parts) + "))"


# [Note: generators run lazily]
# Python runs a generator's body only as its items are taken: ``any(log.append(i) or i > 0 for
# i in range(3))`` appends 0 and 1, then stops. Running the generator to its end when it is
# created would append 2 as well, a silently wrong side effect. So a generator is a
# ``LazyIterator`` whose ``produce`` runs the generator's frame to its next ``yield``
# (InstructionTranslatorBase.resume); ``map`` (always) and ``zip``/``enumerate`` over a lazy
# iterator are lazy too, so the items are made in the order Python makes them. A lazy iterator
# cannot be rebuilt as Python after the graph (its frame is half-run): one that outlives the
# traced code is Unsupported, and the instruction that needs it runs for real.
class LazyIterator(ListIteratorVariable):
    """An iterator whose next item is made when it is asked for (see [Note: generators run
    lazily]): ``produce()`` returns the next item, or None when the iterator is exhausted."""

    def __init__(self, produce, what: str):
        super().__init__([])
        self.produce = produce
        self.what = what
        self.exhausted = False

    def next_item(self) -> VariableTracker | None:
        item = None if self.exhausted else self.produce()
        self.exhausted = item is None
        return item

    def unpack_var_sequence(self, tx):
        items = []
        while (item := self.next_item()) is not None:
            items.append(item)
        return items

    def reconstruct(self, codegen):
        raise Unsupported(f"{self.what} used after the traced code (returned, or alive at a "
                          "graph break)")


def as_iterator(tx, var: VariableTracker) -> ListIteratorVariable:
    """``iter(var)``: an iterator stays itself (it may be lazy); anything else is unpacked."""
    if isinstance(var, ListIteratorVariable):
        return var
    return ListIteratorVariable(var.unpack_var_sequence(tx))


def unpack(tx, var: VariableTracker) -> list[VariableTracker]:
    """The items of anything iterable (``for``, ``*args``, ``list(x)``, unpacking)."""
    return var.unpack_var_sequence(tx)


BINARY_SEQUENCE_OPS = {operator.add: "__add__", operator.mul: "__mul__",
                       operator.iadd: "__iadd__", operator.contains: "__contains__"}
