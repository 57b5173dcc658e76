"""User-defined classes while tracing, and the objects the traced code makes by calling them.

Calling a class (``p = Point(x, y)``) makes no real object: a ``NewObjectVariable`` stands for
``object.__new__(cls)``, its ``__init__`` is inlined on it, and its attributes live in
``overrides``. If it escapes the graph it is rebuilt afterwards, in its final state. An nn.Module
made inside ``forward`` (``CrossEntropyLoss()``) is made for real (``make_module``); a namedtuple
class makes a ``NamedTupleVariable``; ``why_not_constructible`` names the classes that cannot be
traced this way.

NB: in PyTorch this lives in torch/_dynamo/variables/user_defined.py
(UserDefinedClassVariable) and side_effects.py (``track_object_new``).
"""

from __future__ import annotations

import inspect
import types

import torch

from toycomp.capture.sources import AttrSource
from toycomp.capture.variables.base import ConstantVariable, Unsupported, ValueVariable
from toycomp.capture.variables.functions import UserMethodVariable
from toycomp.capture.variables.lists import NamedTupleVariable
from toycomp.capture.variables.objects import NNModuleVariable, UserDefinedObjectVariable
from toycomp.capture.variables.torch import ContextManagerVariable


class UserDefinedClassVariable(ValueVariable):
    """A class (guarded by identity): usable in isinstance and attribute reads; calling it makes
    a ``NewObjectVariable`` (``why_not_constructible`` says which classes cannot)."""

    def var_getattr(self, tx, name):
        src = self.source and AttrSource(self.source, name)
        if not any(name in vars(klass) for klass in self.value.__mro__):
            return tx.output.wrap(getattr(self.value, name), src)  # from type: __name__...
        attr = inspect.getattr_static(self.value, name)
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
            if isinstance(inspect.getattr_static(self.value, name), classmethod):
                return UserMethodVariable(attr, self, None)
        return tx.output.wrap(attr, src)

    def call_function(self, tx, args, kwargs):
        """``Point(x, y)``: a new object, tracked while tracing, ``__init__`` inlined on it."""
        from toycomp.capture.variables import user_dicts  # (it subclasses this module's)

        cls = self.value
        if user_dicts.is_user_dict_class(cls):  # ModelOutput(loss=...): a dict and an object
            obj, init = user_dicts.construct(tx, cls, self.source)
            init.call_function(tx, args, kwargs)
            return obj
        if issubclass(cls, torch.nn.Module):
            return make_module(tx, cls, args, kwargs)
        why = why_not_constructible(cls)
        if why:
            raise Unsupported(f"creating an object of user class {cls.__qualname__}: {why}")
        obj = NewObjectVariable(cls, self.source)
        init = inspect.getattr_static(cls, "__init__")
        if init is object.__init__:
            if args or kwargs:
                raise Unsupported(f"{cls.__qualname__}() takes no arguments")
            return obj
        init_source = self.source and AttrSource(self.source, "__init__")
        UserMethodVariable(init, obj, init_source).call_function(tx, args, kwargs)
        return obj


def make_module(tx, cls, args, kwargs) -> NNModuleVariable:
    """``loss_fct = CrossEntropyLoss()`` inside ``forward``: made for real while tracing, from
    constant arguments, when it holds no tensor (no parameter or buffer: each call in eager
    would make new ones, randomly initialised). The graph calls its ``forward``, inlined; the
    object is kept for the transformed function, should it outlive the graph."""
    try:
        consts = [a.as_python_constant() for a in args]
        kw = {k: v.as_python_constant() for k, v in kwargs.items()}
    except Unsupported:
        raise Unsupported(f"creating a {cls.__qualname__} from non-constant arguments") from None
    module = cls(*consts, **kw)
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise Unsupported(f"creating a {cls.__qualname__}, which holds tensors, in the "
                          "compiled function")
    tx.output.keep_alive.append(module)
    return NNModuleVariable(module, None)


class NamedTupleClassVariable(UserDefinedClassVariable):
    """A ``collections.namedtuple`` / ``typing.NamedTuple`` class: calling it makes a
    ``NamedTupleVariable``, its arguments bound to the fields as ``cls.__new__`` binds them."""

    def call_function(self, tx, args, kwargs):
        cls = self.value
        try:
            bound = inspect.signature(cls).bind(*args, **kwargs).arguments
        except TypeError as e:
            raise Unsupported(f"{cls.__qualname__}(): {e}") from None
        defaults = getattr(cls, "_field_defaults", {})
        items = [bound[f] if f in bound else tx.output.wrap(defaults[f], None)
                 for f in cls._fields]
        return NamedTupleVariable(items, cls)


def why_not_constructible(cls) -> str | None:
    """Why a new object of ``cls`` cannot be traced (None: it can). The tracer models an
    object as ``object.__new__(cls)`` plus an instance ``__dict__`` of trackers."""
    if type(cls).__call__ is not type.__call__:  # (abc.ABCMeta makes objects as type does)
        return f"it has a metaclass ({type(cls).__name__})"
    if getattr(cls, "__abstractmethods__", None):
        return "it has abstract methods"
    if cls.__new__ is not object.__new__:
        return "it defines __new__ (or subclasses a builtin type)"
    if any(vars(klass).get("__slots__") for klass in cls.__mro__):  # (collections.abc: ())
        return "it has __slots__"
    for hook in ("__setattr__", "__getattribute__", "__delattr__"):
        if getattr(cls, hook) is not getattr(object, hook):
            return f"it defines {hook}"
    init = inspect.getattr_static(cls, "__init__")
    if init is not object.__init__ and not isinstance(init, types.FunctionType):
        return "its __init__ is not Python code"
    return None


class NewObjectVariable(UserDefinedObjectVariable):
    """An object made by the traced code (``p = Point(x, y)``): no real object exists while
    tracing; its attributes live in ``overrides``. Stores to it are not side effects: if it
    escapes (returned, stored in a list or a global, live at a graph break) it is rebuilt
    after the graph, in its final state::

        __tmp0 = object.__new__(G['Point'])
        __tmp0.x = __graph_out[0]
        __tmp0.y = __graph_out[1]

    NB: in PyTorch this is ``SideEffects.track_object_new`` and ``codegen_save_tempvars``."""

    def __init__(self, cls, cls_source=None):
        super().__init__(None, None)
        del self.value  # no real object (``is`` compares trackers)
        self.cls = cls
        self.cls_source = cls_source

    def python_type(self):
        return self.cls

    def instance_attr(self, tx, name):
        return None  # the instance dict is ``overrides``

    def class_source(self):
        return self.cls_source

    def plain_class_attr(self, tx, name):
        source = self.cls_source and AttrSource(self.cls_source, name)
        return tx.output.wrap(getattr(self.cls, name), source)

    def setattr(self, tx, name, value):
        if hasattr(inspect.getattr_static(self.cls, name, None), "__set__"):
            raise Unsupported(f"store to the descriptor {self.cls.__name__}.{name}")
        self.overrides[name] = value

    def reconstruct(self, codegen, store: str = "{obj}.{attr} = {value}"):
        """``object.__new__(cls)`` once, then each attribute written as ``store`` says (a
        format of ``obj``, ``attr`` and ``value``: here through the class's ``__setattr__``)."""
        if id(self) in codegen.temps:
            return codegen.temps[id(self)]
        cls = self.cls_source.code() if self.cls_source else codegen.constant(self.cls)
        name = codegen.new_object(self, f"object.__new__({cls})")
        for attr, value in self.overrides.items():
            value = codegen.reconstruct(value)
            codegen.lines.append(store.format(obj=name, attr=attr, value=value))
        return name

    def __repr__(self):
        return f"NewObjectVariable({self.cls.__name__})"


class UserContextManagerVariable(ContextManagerVariable):
    """``with cm:`` on an object whose class defines ``__enter__`` and ``__exit__`` in Python
    (``contextlib.nullcontext()``, a user's own): both are inlined, as any method. A graph
    break inside the block cannot re-enter it (``reenter`` raises). Dynamo:
    ``GenericContextWrappingVariable``."""

    def __init__(self, obj: UserDefinedObjectVariable):
        self.obj = obj

    @staticmethod
    def wraps(value) -> bool:
        if not isinstance(value, UserDefinedObjectVariable):
            return False
        cls = value.python_type()
        return all(isinstance(inspect.getattr_static(cls, name, None), types.FunctionType)
                   for name in ("__enter__", "__exit__"))

    def enter(self, tx):
        return self.obj.var_getattr(tx, "__enter__").call_function(tx, [], {})

    def exit(self, tx):
        none = ConstantVariable(None)
        self.obj.var_getattr(tx, "__exit__").call_function(tx, [none, none, none], {})
        return none

    def __repr__(self):
        return f"UserContextManagerVariable({self.obj.python_type().__qualname__})"
