"""Builtins and operators while tracing: ``len``, ``isinstance``, ``range``, ``a + b``, ...

Each builtin has a rule: on Python constants it is simply evaluated (constant folding), on
tensors it adds a graph node (``operator.add``), on containers it becomes a method of the tracker
(``list + list`` -> ``ListVariable.__add__``). ``print`` and ``id`` are graph breaks.

>>> from toycomp.capture.variables.base import ConstantVariable as C
>>> BuiltinVariable(max).call_function(None, [C(3), C(7)], {}).as_python_constant()
7
>>> BuiltinVariable(operator.mul).call_function(None, [C(6), C(7)], {}).as_python_constant()
42

NB: in PyTorch this lives in torch/_dynamo/variables/builtin.py (BuiltinVariable, with one
``call_<name>`` method per builtin).
"""

from __future__ import annotations

import builtins
import collections
import math
import operator

import torch

from toycomp.capture.variables.base import (
    ConstantVariable,
    MethodVariable,
    MissingAttribute,
    Unsupported,
    VariableTracker,
)
from toycomp.capture.variables.lists import (
    BaseListVariable,
    DictVariable,
    LazyIterator,
    ListIteratorVariable,
    ListVariable,
    TupleVariable,
    as_iterator,
)
from toycomp.capture.variables.functions import NestedUserFunctionVariable, UserFunctionVariable
from toycomp.capture.variables.objects import UserDefinedObjectVariable
from toycomp.capture.variables.sets import SetVariable, as_set_or_constant
from toycomp.capture.variables.tensor import TensorVariable
from toycomp.symbolic_shapes import specialized

# Builtins that may be evaluated when all their arguments are Python constants.
PURE_BUILTINS = {
    abs, all, any, bin, bool, chr, divmod, float, format, hash, hex, int, len, max, min, oct,
    ord, pow, repr, round, sorted, str, sum, tuple, list, dict, set, frozenset, slice, range,
    complex, enumerate, zip, reversed, callable,
} | {v for v in vars(math).values() if callable(v)} | {
    v for k, v in vars(operator).items() if callable(v) and not k.startswith("_")
}
# Builtins that would turn a size (SymInt) into the text of its symbol.
TEXT_BUILTINS = {str, repr, format, ascii, hash}
# Operators whose tensor form is a graph node.
TENSOR_OPERATORS = {v for k, v in vars(operator).items() if callable(v) and not k.startswith("_")
                    and k not in ("is_", "is_not", "not_", "truth", "contains", "countOf",
                                  "indexOf", "attrgetter", "itemgetter", "methodcaller",
                                  "length_hint", "call", "index")} | {abs}
# ``a += b`` where ``a`` is not a tensor (``k = 1; k += x``): Python falls back to ``a + b``, and
# a graph node ``operator.iadd(1, x)`` would print as ``1 += x``, which is not Python.
OUT_OF_PLACE = {getattr(operator, f"i{name.rstrip('_')}"): getattr(operator, name) for name in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor",
    "lshift", "rshift")}
# In-place set operators (``s |= t`` keeps one set object) and ``d | e`` / ``d |= e`` of dicts.
SET_AND_DICT_OPS = {operator.ior: "__ior__", operator.iand: "__iand__", operator.isub: "__isub__",
                    operator.ixor: "__ixor__", operator.or_: "__or__"}
# Operators on containers: the tracker's method that does it.
CONTAINER_METHODS = {operator.add: "__add__", operator.iadd: "__iadd__", operator.mul: "__mul__",
                     operator.getitem: "__getitem__", operator.setitem: "__setitem__",
                     operator.delitem: "__delitem__"}


class BuiltinVariable(VariableTracker):
    """A builtin function or operator (``len``, ``operator.add``, ``math.sqrt``...)."""

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def as_python_constant(self):
        return self.fn

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable(getattr(self.fn, name))
        attr = getattr(self.fn, name, None)
        if callable(attr) and any(attr == rule for rule in RULES):  # chain.from_iterable
            return BuiltinVariable(next(rule for rule in RULES if attr == rule))
        return super().var_getattr(tx, name)

    def call_function(self, tx, args, kwargs):
        rule = RULES.get(self.fn)
        if rule is not None:
            return rule(tx, *args, **kwargs)
        if any(isinstance(a, _OBJECTS) for a in args[:2]):  # user objects' operators, containers
            result = self.call_on_objects(tx, args)
            if result is not None:
                return result
        if any(isinstance(a, TensorVariable) for a in args):
            fn = self.fn
            if fn in OUT_OF_PLACE and not isinstance(args[0], TensorVariable):
                fn = OUT_OF_PLACE[fn]
            if fn in TENSOR_OPERATORS:
                return tx.output.create_call("call_function", fn, args, kwargs)
            raise Unsupported(f"{self.fn.__name__}() on a tensor")
        return self.call_on_values(tx, args, kwargs)  # containers' methods, constants folded

    def call_on_values(self, tx, args, kwargs):
        if self.fn is operator.getitem and isinstance(getattr(args[0], "fn", None), type):
            return fold(self.fn, args, kwargs)  # a type hint: list[torch.Tensor]
        if self.fn in CONTAINER_METHODS and not isinstance(args[0], ConstantVariable):
            return args[0].call_method(tx, CONTAINER_METHODS[self.fn], list(args[1:]), {})
        return fold(self.fn, args, kwargs)

    def call_on_objects(self, tx, args):
        """``a + b`` with a user object's ``__add__``, ``s | t`` of sets, ``l += m``...: the
        object's method, or None where none applies."""
        if self.fn in BINARY_DUNDERS and len(args) == 2:
            user = _user_operator(tx, self.fn, *args)
            if user is not None:
                return user
        if self.fn in SET_AND_DICT_OPS and isinstance(args[0], (SetVariable, DictVariable)):
            return args[0].call_method(tx, SET_AND_DICT_OPS[self.fn], list(args[1:]), {})
        if self.fn in CONTAINER_METHODS and isinstance(
                args[0], (BaseListVariable, DictVariable, UserDefinedObjectVariable)):
            method = CONTAINER_METHODS[self.fn]
            if method == "__iadd__" and isinstance(args[0], TupleVariable):
                method = "__add__"
            return args[0].call_method(tx, method, list(args[1:]), {})
        return None

    def reconstruct(self, codegen):
        return codegen.source(self.source) if self.source else codegen.constant(self.fn)

    def __repr__(self):
        return f"BuiltinVariable({getattr(self.fn, '__name__', self.fn)})"


# The trackers whose values may answer a builtin call themselves (BuiltinVariable.call_on_objects).
_OBJECTS = (UserDefinedObjectVariable, SetVariable, DictVariable, BaseListVariable)

# ``a + b`` where ``a`` or ``b`` is an object of a user class with ``__add__`` / ``__radd__``.
BINARY_DUNDERS = {getattr(operator, op): (f"__{op}__", f"__r{op}__") for op in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul")}


def _user_operator(tx, fn, a, b):
    """``a.__add__(b)``, or ``b.__radd__(a)`` when ``a`` has no ``__add__`` of its own (a
    tensor's returns NotImplemented for a user object), inlined; None if neither applies."""
    forward, reflected = BINARY_DUNDERS[fn]
    if isinstance(a, UserDefinedObjectVariable) and a.defines(forward):
        return a.call_method(tx, forward, [b], {})
    if isinstance(b, UserDefinedObjectVariable) and b.defines(reflected) and not (
            isinstance(a, UserDefinedObjectVariable)):
        return b.call_method(tx, reflected, [a], {})
    return None


def fold(fn, args, kwargs) -> ConstantVariable:
    """Evaluate a pure builtin on constant arguments."""
    if fn not in PURE_BUILTINS:
        raise Unsupported(f"builtin {getattr(fn, '__name__', fn)}")
    try:
        consts = [a.as_python_constant() for a in args]
        kw = {k: v.as_python_constant() for k, v in kwargs.items()}
    except Unsupported:
        raise Unsupported(f"{getattr(fn, '__name__', fn)}() on {args}") from None
    if fn in TEXT_BUILTINS:  # str(s0) is "s0": a size becomes its number, guarded
        consts = specialized(consts)
    return as_set_or_constant(fn(*consts, **kw))


def is_same(a: VariableTracker, b: VariableTracker) -> bool:
    """``a is b`` while tracing: same tracker, same constant, or the same real object."""
    if a is b:
        return True
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        return getattr(a, "proxy", None) is getattr(b, "proxy", 0)  # one node: one tensor
    if a.is_python_constant() and b.is_python_constant() and not isinstance(a, BaseListVariable):
        return a.as_python_constant() is b.as_python_constant()
    if hasattr(a, "value") and hasattr(b, "value") and not isinstance(a, ConstantVariable):
        return a.value is b.value
    return False


def _len(tx, obj):
    return obj.call_method(tx, "__len__", [], {})


def _isinstance(tx, obj, classinfo):
    """Answered from the tracker's Python type, which the builder's guards pin down."""
    return ConstantVariable(issubclass(obj.python_type(), classinfo.as_python_constant()))


def _iter(tx, obj):
    return as_iterator(tx, obj)


def _next(tx, it, *default):
    item = it.next_item() if isinstance(it, ListIteratorVariable) else None
    if item is None:
        if default:
            return default[0]
        raise Unsupported("next() on an exhausted iterator (StopIteration)")
    return item


def _enumerate(tx, seq, start=ConstantVariable(0)):
    return _lazy_zip(tx, "enumerate", [_count(start.as_python_constant()), as_iterator(tx, seq)],
                     lambda row: TupleVariable(row), lazy=isinstance(seq, LazyIterator))


def _zip(tx, *seqs):
    iterators = [as_iterator(tx, s) for s in seqs]
    lazy = any(isinstance(it, LazyIterator) for it in iterators)
    return _lazy_zip(tx, "zip", iterators, lambda row: TupleVariable(row), lazy)


def _map(tx, fn, *seqs):
    """Always lazy: ``fn`` runs as each item is taken, as in Python."""
    iterators = [as_iterator(tx, s) for s in seqs]
    return _lazy_zip(tx, "map", iterators, lambda row: fn.call_function(tx, row, {}), lazy=True)


def _lazy_zip(tx, what, iterators, make, lazy: bool) -> ListIteratorVariable:
    """An iterator of ``make(row)``, a row taking one item from each iterator in turn and
    stopping at the first exhausted one (as zip does); made up front unless ``lazy``."""
    def produce():
        row = []
        for it in iterators:
            item = it.next_item()
            if item is None:
                return None
            row.append(item)
        return make(row)
    iterator = LazyIterator(produce, what)
    return iterator if lazy else ListIteratorVariable(iterator.unpack_var_sequence(tx))


def _count(start: int) -> ListIteratorVariable:
    counter = iter(range(start, 2**62))
    return LazyIterator(lambda: ConstantVariable(next(counter)), "a counter")


def _sequence(kind):
    def rule(tx, seq=None):
        return kind([] if seq is None else list(seq.unpack_var_sequence(tx)))
    return rule


def _dict(user_cls):
    """``dict(...)`` or ``collections.OrderedDict(...)``: a new dict of that class."""
    def rule(tx, *args, **kwargs):
        new = DictVariable({}, user_cls=user_cls)
        new.mutate(tx, "update", list(args), kwargs)
        return new
    return rule


def _sum(tx, seq, start=ConstantVariable(0)):
    total = start
    for item in seq.unpack_var_sequence(tx):
        total = BuiltinVariable(operator.add).call_function(tx, [total, item], {})
    return total


def _minmax(fn):
    def rule(tx, *args, **kwargs):
        if len(args) == 1 and not args[0].is_python_constant():
            args = args[0].unpack_var_sequence(tx)
        if any(isinstance(a, TensorVariable) for a in args):
            return _minmax_tensors(tx, fn, args, kwargs)
        return fold(fn, args, kwargs)
    return rule


def _minmax_tensors(tx, fn, args, kwargs):
    """``max(a, b)`` of one-element tensors: ``b if b > a else a``, item by item, as a
    ``torch.where`` in the graph (Dynamo: torch.maximum). Tensors of more than one element
    have no truth value (eager raises): a graph break, as are mixed dtypes or shapes, whose
    result eager would not promote."""
    first = args[0]
    if kwargs or not all(isinstance(a, TensorVariable) and a.example.numel() == 1
                         and a.example.dtype == first.example.dtype
                         and a.example.shape == first.example.shape for a in args):
        raise Unsupported(f"{fn.__name__}() of tensors that are not one-element tensors of one "
                          "dtype and shape (it compares their values)")
    better = operator.gt if fn is max else operator.lt
    best = first
    for item in args[1:]:
        cond = tx.output.create_call("call_function", better, [item, best], {})
        best = tx.output.create_call("call_function", torch.where, [cond, item, best], {})
    return best


def _all_any(fn):
    """``all``/``any`` of an iterable: each item's truth in order, stopping where Python would
    (a tensor item is a data-dependent jump: its truth() raises Unsupported)."""
    stop_at = fn is any  # any() stops at the first true item, all() at the first false one

    def rule(tx, seq):
        if seq.is_python_constant():
            return fold(fn, [seq], {})
        iterator = as_iterator(tx, seq)
        while (item := iterator.next_item()) is not None:
            if item.truth(tx) == stop_at:
                return ConstantVariable(stop_at)
        return ConstantVariable(not stop_at)
    return rule


def _reversed(tx, seq):
    if seq.is_python_constant() and not isinstance(seq, DictVariable):
        return ListIteratorVariable([ConstantVariable(v) for v in
                                     reversed(seq.as_python_constant())])
    if isinstance(seq, (BaseListVariable, ListIteratorVariable)) or hasattr(seq, "view"):
        return ListIteratorVariable(seq.unpack_var_sequence(tx)[::-1])
    return seq.call_method(tx, "__reversed__", [], {})


def _getattr(tx, obj, name, *default):
    try:
        return obj.var_getattr(tx, name.as_python_constant())
    except Unsupported:
        if default:
            return default[0]
        raise


def _hasattr(tx, obj, name):
    try:
        obj.var_getattr(tx, name.as_python_constant())
        return ConstantVariable(True)
    except MissingAttribute:  # an object made while tracing, without that attribute
        return ConstantVariable(False)
    except Unsupported:
        if not hasattr(obj, "value"):
            raise
        return ConstantVariable(hasattr(obj.value, name.as_python_constant()))


def _setattr(tx, obj, name, value):
    if not hasattr(obj, "setattr"):
        raise Unsupported(f"setattr on {obj}")
    obj.setattr(tx, name.as_python_constant(), value)
    return ConstantVariable(None)


def _type(tx, obj):
    return tx.output.wrap(obj.python_type(), None, guard=False)


def _callable(tx, obj):
    """``callable(f)``: functions and methods made or read while tracing are; a user object
    is when its class has ``__call__``."""
    if isinstance(obj, (UserFunctionVariable, NestedUserFunctionVariable, MethodVariable,
                        BuiltinVariable)):
        return ConstantVariable(True)
    if isinstance(obj, TensorVariable):
        return ConstantVariable(False)
    if isinstance(obj, UserDefinedObjectVariable):
        return ConstantVariable(callable(obj.python_type()) and
                                hasattr(obj.python_type(), "__call__"))
    return fold(callable, [obj], {})


def _is(tx, a, b):
    return ConstantVariable(is_same(a, b))


def _is_not(tx, a, b):
    return ConstantVariable(not is_same(a, b))


def _not(tx, a):
    return ConstantVariable(not a.truth(tx))


def _bool(tx, a=ConstantVariable(False)):
    return ConstantVariable(a.truth(tx))


def _contains(tx, container, item):
    return container.call_method(tx, "__contains__", [item], {})


def _super(tx, *args):
    return tx.make_super(*args)


def _unsupported(reason):
    def rule(tx, *args, **kwargs):
        raise Unsupported(reason)
    return rule


def _eq(fn):
    def rule(tx, a, b):
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            return tx.output.create_call("call_function", fn, [a, b], {})
        if a.is_python_constant() and b.is_python_constant():
            return fold(fn, [a, b], {})
        same = is_same(a, b)
        return ConstantVariable(same if fn is operator.eq else not same)
    return rule


def _delattr(tx, obj, name):
    if not hasattr(obj, "delattr"):
        raise Unsupported(f"delattr on {obj}")
    obj.delattr(tx, name.as_python_constant())
    return ConstantVariable(None)


RULES = {
    len: _len, isinstance: _isinstance, iter: _iter, next: _next, enumerate: _enumerate,
    zip: _zip, map: _map, list: _sequence(ListVariable), tuple: _sequence(TupleVariable),
    callable: _callable, dict: _dict(dict), collections.OrderedDict: _dict(collections.OrderedDict),
    sum: _sum,
    all: _all_any(all), any: _all_any(any), min: _minmax(min),
    max: _minmax(max), getattr: _getattr, reversed: _reversed,
    hasattr: _hasattr, setattr: _setattr, delattr: _delattr, type: _type, operator.is_: _is,
    operator.is_not: _is_not, operator.not_: _not, bool: _bool, operator.truth: _bool,
    operator.contains: _contains, super: _super, operator.eq: _eq(operator.eq),
    operator.ne: _eq(operator.ne),
    print: _unsupported("print() is a graph break (as in Dynamo by default)"),
    id: _unsupported("id() of a traced value"), input: _unsupported("input()"),
    builtins.open: _unsupported("open()"),
}
