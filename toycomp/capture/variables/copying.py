"""``copy.copy`` and ``copy.deepcopy`` while tracing: configs, dataclasses, dicts and lists
(transformers' ``get_text_config`` deep-copies the config in T5's forward).

The copy is built from trackers as ``copy`` builds it from objects: new ``ListVariable`` and
``DictVariable``, an object as ``object.__new__(cls)`` plus its copied ``__dict__`` (a
``CopiedObjectVariable``, rebuilt after the graph if it escapes); immutable values are shared.
Reading the original's attributes guards them, and its ``__dict__`` keys. A tensor inside breaks
the graph, as in Dynamo; so does a class that customises copying (``__deepcopy__``...).

NB: Dynamo inlines the ``copy`` module's own code (torch/_dynamo/trace_rules.py).
"""

from __future__ import annotations

import copy
import types

from toycomp.capture.sources import AttrSource
from toycomp.capture.variables.base import ConstantVariable, MissingAttribute, Unsupported
from toycomp.capture.variables.base import ValueVariable, VariableTracker
from toycomp.capture.variables.functions import UserMethodVariable
from toycomp.capture.variables.lists import DictVariable, ListVariable, NamedTupleVariable
from toycomp.capture.variables.lists import TupleVariable
from toycomp.capture.variables.classes import NewObjectVariable
from toycomp.capture.variables.objects import MISSING, class_lookup
from toycomp.capture.variables.objects import UserDefinedObjectVariable, is_data_descriptor
from toycomp.capture.variables.tensor import TensorVariable

# Methods by which a class takes over its own copying (its copy is not its __dict__'s copy).
COPY_HOOKS = ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__",
              "__setstate__", "__getnewargs__", "__getnewargs_ex__")


class CopyFunctionVariable(ValueVariable):
    """``copy.copy`` or ``copy.deepcopy`` (guarded by identity)."""

    def call_function(self, tx, args, kwargs):
        name = self.value.__name__
        if len(args) != 1 or kwargs:
            raise Unsupported(f"copy.{name} with a memo")
        return copy_variable(tx, args[0], deep=name == "deepcopy", memo={})


class CopiedObjectVariable(NewObjectVariable):
    """An object made by ``copy.copy`` / ``copy.deepcopy``: ``object.__new__(cls)`` and its
    ``__dict__``, written without the class's ``__setattr__`` (as ``copy`` writes it)."""

    def generic_getattr(self, tx, name):
        if name == "__dict__":  # the instance dict: the attributes, shared (read or written)
            attrs = DictVariable({})
            attrs.items = self.overrides
            return attrs
        if name == "__class__" and name not in self.overrides:
            return tx.output.wrap(self.cls, self.cls_source)
        return super().generic_getattr(tx, name)

    def setattr(self, tx, name, value):
        hook = class_lookup(self.cls, "__setattr__")
        if isinstance(hook, types.FunctionType):  # the class's own (a config's attribute_map)
            UserMethodVariable(hook, self).call_function(tx, [ConstantVariable(name), value], {})
        else:
            self.object_setattr(tx, name, value)

    def object_setattr(self, tx, name, value):
        """``object.__setattr__(self, name, value)`` (``super().__setattr__`` reaches it)."""
        super().setattr(tx, name, value)
        return ConstantVariable(None)

    def delattr(self, tx, name):
        if class_lookup(self.cls, "__delattr__") is not object.__delattr__:
            raise Unsupported(f"delattr on a {self.cls.__name__}, which defines __delattr__")
        if is_data_descriptor(class_lookup(self.cls, name)) or name not in self.overrides:
            raise Unsupported(f"delattr of {self.cls.__name__}.{name}, not an instance attribute")
        del self.overrides[name]

    def getattr_fallback(self, tx, name):
        hook = class_lookup(self.cls, "__getattr__")
        if isinstance(hook, types.FunctionType):
            return UserMethodVariable(hook, self).call_function(tx, [ConstantVariable(name)], {})
        raise MissingAttribute(f"{self.cls.__name__} object has no attribute {name!r}")

    def reconstruct(self, codegen):  # as ``copy`` writes the attributes: not via __setattr__
        return super().reconstruct(codegen, store="object.__setattr__({obj}, {attr!r}, {value})")


def copy_variable(tx, var: VariableTracker, deep: bool, memo: dict) -> VariableTracker:
    """The tracker of ``copy.deepcopy(var)`` (``deep``) or ``copy.copy(var)``. ``memo`` maps
    trackers already copied to their copies: shared parts stay shared, cycles end."""
    if id(var) in memo:
        return memo[id(var)]
    what = "deepcopy" if deep else "copy"
    if isinstance(var, TensorVariable):
        raise Unsupported(f"copy.{what} of a tensor (Dynamo breaks the graph here too)")
    if isinstance(var, ValueVariable):  # a constant, a function, a class, a module
        value = var.value
        if isinstance(value, (list, dict, set, bytearray)):  # (a mutable constant: a new one)
            return ConstantVariable(copy.deepcopy(value) if deep else copy.copy(value))
        return var  # immutable, or atomic to copy (functions, classes): itself
    if type(var) in (ListVariable, TupleVariable, NamedTupleVariable):
        items = var.items(tx)
        new = [copy_variable(tx, v, deep, memo) for v in items] if deep else list(items)
        if type(var) is ListVariable:
            result = ListVariable(new)
        elif all(a is b for a, b in zip(new, items)):  # a tuple of the same items: itself
            result = var
        else:
            result = (NamedTupleVariable(new, var.tuple_cls) if type(var) is NamedTupleVariable
                      else TupleVariable(new))
        memo[id(var)] = result
        return result
    if type(var) is DictVariable:
        result = DictVariable({}, user_cls=var.user_cls)
        memo[id(var)] = result
        for k, v in var.items.items():
            result.items[k] = copy_variable(tx, v, deep, memo) if deep else v
        return result
    if type(var) in (UserDefinedObjectVariable, NewObjectVariable, CopiedObjectVariable):
        return copy_object(tx, var, deep, memo)
    raise Unsupported(f"copy.{what} of {var}")


def copy_object(tx, var, deep: bool, memo: dict) -> CopiedObjectVariable:
    cls = var.python_type()
    what = "deepcopy" if deep else "copy"
    hooks = [h for h in COPY_HOOKS
             if class_lookup(cls, h) not in (MISSING, vars(object).get(h, MISSING))]
    if hooks:
        raise Unsupported(f"copy.{what} of a {cls.__qualname__}, which defines {hooks[0]}")
    if cls.__new__ is not object.__new__ or any(vars(k).get("__slots__") for k in cls.__mro__):
        raise Unsupported(f"copy.{what} of a {cls.__qualname__} (own __new__ or __slots__)")
    attrs = dict(var.overrides)
    if not isinstance(var, NewObjectVariable):  # a real object: its __dict__, guarded
        d = var.value.__dict__
        if var.source is not None:
            tx.output.guards.dict_keys_match(AttrSource(var.source, "__dict__"), list(d))
        attrs = {name: attrs[name] if name in attrs else tx.output.wrap(
            d[name], var.source and AttrSource(var.source, name)) for name in d} | attrs
    result = CopiedObjectVariable(cls, var.class_source())
    memo[id(var)] = result
    for name, value in attrs.items():
        result.overrides[name] = copy_variable(tx, value, deep, memo) if deep else value
    return result


def is_copy_function(value) -> bool:
    return isinstance(value, types.FunctionType) and value in (copy.copy, copy.deepcopy)
