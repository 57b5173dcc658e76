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

import collections
import operator
from typing import Any

from toycomp.capture.sources import GetItemSource
from toycomp.capture.variables.base import (
    ConstantVariable,
    MethodVariable,
    Unsupported,
    VariableTracker,
)

_MUTATING = {"append", "extend", "insert", "pop", "clear", "remove", "reverse", "sort",
             "__setitem__", "__delitem__", "__iadd__", "update", "setdefault", "popitem",
             "move_to_end"}


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
        kind = list if isinstance(self, ListVariable) else tuple  # (a named tuple: its items)
        return kind(v.as_python_constant() for v in self._items)

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
                return self.plain_type()(items[index])
            return items[index]
        if name == "__contains__":
            value = args[0].as_python_constant()
            return ConstantVariable(any(v.is_python_constant() and v.as_python_constant() == value
                                        for v in items))
        if name in ("__add__", "__radd__"):
            other = args[0].unpack_var_sequence(tx)
            return self.plain_type()(items + other if name == "__add__" else other + items)
        if name == "__mul__":
            return self.plain_type()(items * args[0].as_python_constant())
        if name in ("index", "count", "__eq__", "__ne__", "__lt__", "__gt__", "copy"):
            if name == "copy":
                return self.plain_type()(items)
            return ConstantVariable(getattr(self.as_python_constant(), name)(
                *[a.as_python_constant() for a in args]))
        if name == "__iter__":
            return ListIteratorVariable(items)
        raise Unsupported(f"{self.python_type().__name__}.{name}")

    def plain_type(self) -> type:
        """The tracker of a new list or tuple made from this one's items (a named tuple's
        slice is a plain tuple)."""
        return ListVariable if isinstance(self, ListVariable) else TupleVariable

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


class NamedTupleVariable(TupleVariable):
    """A named tuple: a ``collections.namedtuple`` / ``typing.NamedTuple`` instance, or a
    structseq such as ``torch.max(x, dim=0)``'s result (``torch.return_types.max``). Its items,
    read by index or by field name, keep their type (``isinstance``, ``_fields``, ``_asdict``)
    and are rebuilt as that type after the graph."""

    def __init__(self, items, tuple_cls: type, source=None):
        super().__init__(items, source)
        self.tuple_cls = tuple_cls
        # (a structseq has no _fields)
        self.fields = tuple(getattr(tuple_cls, "_fields", None) or tuple_cls.__match_args__)

    def python_type(self):
        return self.tuple_cls

    def as_python_constant(self):
        items = super().as_python_constant()
        return self.tuple_cls(items) if self.is_structseq() else self.tuple_cls(*items)

    def is_structseq(self) -> bool:
        return not hasattr(self.tuple_cls, "_fields")

    def reconstruct(self, codegen):
        if self.source is not None:
            return codegen.source(self.source)
        items = super().reconstruct(codegen)
        cls = codegen.constant(self.tuple_cls)
        return f"{cls}({items})" if self.is_structseq() else f"{cls}(*{items})"

    def var_getattr(self, tx, name):
        if name in self.fields:
            return self.items(tx)[self.fields.index(name)]
        if name == "_fields" and not self.is_structseq():
            return ConstantVariable(self.fields)
        if name in ("_asdict", "_replace", "count", "index"):
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of the named tuple {self.tuple_cls.__name__}")

    def call_method(self, tx, name, args, kwargs):
        if name == "_asdict":
            return DictVariable(dict(zip(self.fields, self.items(tx))))
        if name == "_replace":
            if set(kwargs) - set(self.fields):
                raise Unsupported(f"{self.tuple_cls.__name__}._replace of unknown fields")
            new = [kwargs.get(f, v) for f, v in zip(self.fields, self.items(tx))]
            return NamedTupleVariable(new, self.tuple_cls)
        return super().call_method(tx, name, args, kwargs)


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
    """A dict with constant keys; ``items`` maps each key to a tracker. ``user_cls`` is its
    class: ``dict``, ``collections.OrderedDict`` (or, read from a source, a subclass)."""

    def __init__(self, items: dict, source=None, user_cls: type = dict):
        self.items = dict(items)
        self.source = source
        self.user_cls = user_cls

    def python_type(self):
        return self.user_cls

    def as_python_constant(self):
        return {k: v.as_python_constant() for k, v in self.items.items()}

    def unpack_var_sequence(self, tx):
        return [ConstantVariable(k) for k in self.items]

    def truth(self, tx):
        return bool(self.items)

    def call_method(self, tx, name, args, kwargs):
        if name == "__ior__":  # d |= e
            self.mutate(tx, "update", args, {})
            return self
        if name == "__or__" and isinstance(args[0], DictVariable):  # d | e: a new dict
            new = DictVariable(self.items, user_cls=self.user_cls)
            new.items.update(args[0].items)
            return new
        if name in _MUTATING:
            return self.mutate(tx, name, args, kwargs)
        keys = [ConstantVariable(k) for k in self.items]
        if name == "__getitem__":
            return self.items[args[0].as_python_constant()]
        if name == "get":
            default = args[1] if len(args) > 1 else ConstantVariable(None)
            return self.items.get(args[0].as_python_constant(), default)
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__":
            return ConstantVariable(args[0].as_python_constant() in self.items)
        if name == "__iter__":
            return ListIteratorVariable(keys)
        if name in ("keys", "values", "items"):
            return DictViewVariable(self, name)
        if name == "copy":
            return DictVariable(self.items, user_cls=self.user_cls)
        if name == "__reversed__":
            return ListIteratorVariable(keys[::-1])
        raise Unsupported(f"{self.user_cls.__name__}.{name}")

    def pairs(self) -> list[VariableTracker]:
        return [TupleVariable([ConstantVariable(k), v]) for k, v in self.items.items()]

    def mutate(self, tx, name, args, kwargs):
        if self.source is not None:
            tx.output.side_effects.record_method_call(self, name, args, kwargs)
        if name == "__setitem__":
            self.items[args[0].as_python_constant()] = args[1]
        elif name == "update":
            for pair in (args[0].pairs() if isinstance(args[0], DictVariable) else
                         args[0].unpack_var_sequence(tx)) if args else ():
                key, value = pair.unpack_var_sequence(tx)
                self.items[key.as_python_constant()] = value
            self.items.update(kwargs)
        elif name == "pop":
            key = args[0].as_python_constant()
            return self.items.pop(key, *args[1:])
        elif name == "setdefault":
            return self.items.setdefault(args[0].as_python_constant(), args[1])
        elif name == "__delitem__":
            del self.items[args[0].as_python_constant()]
        elif name == "clear":
            self.items.clear()
        elif name == "popitem":
            last = (args[0] if args else kwargs.get("last", ConstantVariable(True)))
            last = last.as_python_constant()
            key = list(self.items)[-1 if last else 0]
            return TupleVariable([ConstantVariable(key), self.items.pop(key)])
        elif name == "move_to_end" and self.user_cls is not dict:
            key = args[0].as_python_constant()
            last = (args[1] if len(args) > 1 else kwargs.get("last", ConstantVariable(True)))
            value = self.items.pop(key)
            self.items = {key: value, **self.items} if not last.as_python_constant() else \
                {**self.items, key: value}
        else:
            raise Unsupported(f"{self.user_cls.__name__}.{name}")
        return ConstantVariable(None)

    def reconstruct(self, codegen):
        if self.source is not None:
            return codegen.source(self.source)
        parts = [f"{k!r}: {codegen.reconstruct(v)}" for k, v in self.items.items()]
        literal = "{" + ", ".join(parts) + "}"
        if self.user_cls not in (dict, collections.OrderedDict):  # (a defaultdict's factory...)
            raise Unsupported(f"rebuilding a new {self.user_cls.__name__} after the graph")
        if self.user_cls is not dict:  # collections.OrderedDict({...})
            literal = f"{codegen.constant(self.user_cls)}({literal})"
        return codegen.new_object(self, literal)


class DictViewVariable(VariableTracker):
    """``d.keys()``, ``d.values()`` or ``d.items()``: a live view, which sees the dict's later
    insertions and deletions, as Python's views do (a copy taken when the view is made would
    not)."""

    def __init__(self, dict_var: DictVariable, kind: str):
        self.dict_var = dict_var
        self.kind = kind

    def python_type(self):
        return type(getattr({}, self.kind)())

    def view(self) -> list[VariableTracker]:
        d = self.dict_var
        if self.kind == "keys":
            return [ConstantVariable(k) for k in d.items]
        return list(d.items.values()) if self.kind == "values" else d.pairs()

    def as_python_constant(self):
        if self.kind == "keys":  # (the keys are constants whatever the values are)
            return dict.fromkeys(self.dict_var.items).keys()
        return getattr(self.dict_var.as_python_constant(), self.kind)()

    def unpack_var_sequence(self, tx):
        return self.view()

    def truth(self, tx):
        return bool(self.dict_var.items)

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return ConstantVariable(len(self.dict_var.items))
        if name == "__iter__":
            return ListIteratorVariable(self.view())
        if name == "__contains__" and self.kind == "keys":
            return ConstantVariable(args[0].as_python_constant() in self.dict_var.items)
        if name == "__reversed__":
            return ListIteratorVariable(self.view()[::-1])
        return TupleVariable(self.view()).call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen):
        return f"{codegen.reconstruct(self.dict_var)}.{self.kind}()"


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
