"""Instances of dict subclasses while tracing: transformers' ``ModelOutput`` (a dataclass that
subclasses ``OrderedDict``), registries that subclass ``dict`` with their own ``get``...

Such an object is two things at once: a dict (its items) and an object (its ``__dict__`` of
attributes, its class's methods). The tracker keeps both: ``items``, a ``DictVariable``, and
``overrides``, the attributes set while tracing. Methods the class defines in Python are inlined
as for any user object (``ModelOutput.__getitem__``, ``__setattr__``, ``to_tuple``); dict's own
methods, reached directly or through ``super()``, act on ``items``. So the dataclass
``__init__`` of ``CausalLMOutput(loss=l, logits=y)`` runs ``self.loss = l``, which runs the
class's ``__setattr__``, whose ``super().__setitem__("loss", l)`` stores the item and whose
``super().__setattr__`` the attribute, exactly as in eager.

An object made by the traced code is rebuilt after the graph in its final state::

    __tmp0 = dict.__new__(G['CausalLMOutput'])
    OrderedDict.__setitem__(__tmp0, 'loss', __graph_out[0])
    object.__setattr__(__tmp0, 'loss', __graph_out[0])

One read from outside the trace (a resume function's argument) is guarded by its type and
keys, and read-only: a mutation of it is a graph break.

NB: in PyTorch this lives in torch/_dynamo/variables/user_defined.py (UserDefinedDictVariable)
and variables/dicts.py.
"""

from __future__ import annotations

import collections
import inspect
import types

from toycomp.capture.sources import AttrSource
from toycomp.capture.variables.base import (
    ConstantVariable,
    MethodVariable,
    MissingAttribute,
    Unsupported,
)
from toycomp.capture.variables.functions import UserMethodVariable
from toycomp.capture.variables.lists import DictVariable
from toycomp.capture.variables.classes import NewObjectVariable
from toycomp.capture.variables.objects import MISSING, UserDefinedObjectVariable, class_lookup

DICT_TYPES = (collections.OrderedDict, collections.defaultdict, dict)
MUTATING = {"__setitem__", "__delitem__", "update", "pop", "popitem", "setdefault", "clear"}


def dict_base(cls: type) -> type:
    """The builtin dict type ``cls`` derives from (its methods keep the items in order)."""
    return next(k for k in cls.__mro__ if k in DICT_TYPES)


def is_user_dict_class(cls: type) -> bool:
    """A subclass of dict / OrderedDict that the tracker can model (plain ``__new__``)."""
    return (isinstance(cls, type) and issubclass(cls, dict) and cls not in DICT_TYPES
            and cls.__new__ is dict.__new__ and type(cls) is type)


class UserDefinedDictVariable(UserDefinedObjectVariable):
    """An instance of a dict subclass read from a source: its items, guarded by key."""

    def __init__(self, value, source, items: DictVariable):
        super().__init__(value, source)
        self.items = items

    def generic_getattr(self, tx, name):
        if name in self.overrides:
            return self.overrides[name]
        if name == "__dict__" and self.source is None:  # the attributes set so far, shared
            attrs = DictVariable({})
            attrs.items = self.overrides
            return attrs
        attr = class_lookup(self.python_type(), name)
        if attr is not MISSING and _owners(self.python_type(), name)[0] in DICT_TYPES:
            return MethodVariable(self, name)  # dict's own method: call_method runs it
        try:
            return super().generic_getattr(tx, name)
        except Unsupported as e:
            raise MissingAttribute(e.reason) from None

    def call_method(self, tx, name, args, kwargs):
        method = class_lookup(self.python_type(), name)
        if isinstance(method, types.FunctionType):  # the subclass's own, in Python: inline it
            return UserMethodVariable(method, self).call_function(tx, args, kwargs)
        return self.dict_method(tx, name, args, kwargs)

    def dict_method(self, tx, name, args, kwargs):
        """dict's (or OrderedDict's) ``name`` on the items, past the subclass's overrides."""
        if name == "__init__":
            return self.dict_init(tx, args, kwargs)
        if name in MUTATING and self.source is not None:
            raise Unsupported(f"mutating a {self.python_type().__name__} made outside the "
                              "compiled function")
        return self.items.call_method(tx, name, args, kwargs)

    def dict_init(self, tx, args, kwargs):
        other = args[0] if args else DictVariable({})
        if not isinstance(other, DictVariable):
            raise Unsupported(f"{self.python_type().__name__}() from {other}")
        self.items.items.update(other.items)
        self.items.items.update(kwargs)
        return ConstantVariable(None)

    def object_setattr(self, tx, name, value):
        """``object.__setattr__(self, name, value)``: the attribute, not the items."""
        if self.source is not None:
            raise Unsupported(f"attribute store on a {self.python_type().__name__} made outside "
                              "the compiled function")
        self.overrides[name] = value
        return ConstantVariable(None)

    def setattr(self, tx, name, value):
        hook = class_lookup(self.python_type(), "__setattr__")
        if isinstance(hook, types.FunctionType):  # the class's own __setattr__: inline it
            UserMethodVariable(hook, self).call_function(tx, [ConstantVariable(name), value], {})
            return
        self.object_setattr(tx, name, value)

    def unpack_var_sequence(self, tx):
        if isinstance(class_lookup(self.python_type(), "__iter__"), types.FunctionType):
            raise Unsupported(f"iterating a {self.python_type().__name__} (own __iter__)")
        return self.items.unpack_var_sequence(tx)

    def truth(self, tx):
        return self.call_method(tx, "__len__", [], {}).as_python_constant() > 0

    def as_python_constant(self):
        raise Unsupported(f"{self} is not a Python constant")


def _owners(cls: type, name: str) -> list[type]:
    """The first class of ``cls.__mro__`` that defines ``name``, in a list (or none)."""
    return [k for k in cls.__mro__ if name in vars(k)][:1]


class NewUserDefinedDictVariable(UserDefinedDictVariable, NewObjectVariable):
    """A dict subclass instance made by the traced code: ``dict.__new__(cls)``, then its
    ``__init__`` inlined (a dataclass's generated ``__init__``, ``ModelOutput.__post_init__``)."""

    def __init__(self, cls, cls_source=None):
        NewObjectVariable.__init__(self, cls, cls_source)
        self.items = DictVariable({})

    def instance_attr(self, tx, name):
        return None

    def reconstruct(self, codegen):
        if id(self) in codegen.temps:
            return codegen.temps[id(self)]
        cls = self.cls_source.code() if self.cls_source else codegen.constant(self.cls)
        name = codegen.new_object(self, f"dict.__new__({cls})")
        base = codegen.constant(dict_base(self.cls))
        for key, value in self.items.items.items():
            codegen.lines.append(f"{base}.__setitem__({name}, {key!r}, "
                                 f"{codegen.reconstruct(value)})")
        for attr, value in self.overrides.items():
            codegen.lines.append(f"object.__setattr__({name}, {attr!r}, "
                                 f"{codegen.reconstruct(value)})")
        return name

    def __repr__(self):
        return f"NewUserDefinedDictVariable({self.cls.__name__})"


def construct(tx, cls, cls_source):
    """``cls(*args, **kwargs)`` for a dict subclass: the new tracker, ``__init__`` to inline."""
    obj = NewUserDefinedDictVariable(cls, cls_source)
    init = inspect.getattr_static(cls, "__init__")
    return obj, (UserMethodVariable(init, obj, None) if isinstance(init, types.FunctionType)
                 else MethodVariable(obj, "__init__"))


class DictSuperMethod(MethodVariable):
    """``super().name`` that resolves to dict's or object's own method on a user dict."""

    def call_function(self, tx, args, kwargs):
        if self.name == "__setattr__":
            return self.obj.object_setattr(tx, args[0].as_python_constant(), args[1])
        return self.obj.dict_method(tx, self.name, args, kwargs)


def super_method(obj, klass, name):
    """What ``super()`` finds in a builtin ``klass`` of a user dict's MRO, or None."""
    if not isinstance(obj, UserDefinedDictVariable):
        return None
    if klass in DICT_TYPES or (klass is object and name == "__setattr__"):
        return DictSuperMethod(obj, name)
    return None


class EnvironVariable(UserDefinedObjectVariable):
    """``os.environ``: each key read is a constant, guarded by the value it had (a new value
    recompiles, as Dynamo's guard on an environment variable does)."""

    def call_method(self, tx, name, args, kwargs):
        if name not in ("get", "__getitem__", "__contains__") or kwargs or self.source is None:
            raise Unsupported(f"os.environ.{name}")
        key = args[0].as_python_constant()
        value = self.value.get(key)
        tx.output.guards.add(f"{self.source.name()}.get({key!r}) == {value!r}")
        if name == "__contains__":
            return ConstantVariable(value is not None)
        if value is None and name == "__getitem__":
            raise Unsupported(f"os.environ[{key!r}]: KeyError")
        return args[1] if value is None and len(args) > 1 else ConstantVariable(value)

    def var_getattr(self, tx, name):
        return MethodVariable(self, name)
