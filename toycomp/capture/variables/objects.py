"""Objects while tracing: nn.Modules, user-defined objects, Python modules, super().

Attribute reads look where Python would, in its order ([Note: attribute lookup order]), and
wrap what they find with an ``AttrSource``, so each read becomes a guard: a float attribute by
value, a function by identity, a parameter by its tensor metadata. Attribute *stores* are
recorded as side effects and kept in ``overrides`` so later reads in the same trace see them.

Example: tracing ``self.scale * x`` with ``m.scale = 2.0`` guards ``L['self'].scale == 2.0``;
after ``m.scale = 10.0`` the guard fails and the function is recompiled.

NB: in PyTorch this lives in torch/_dynamo/variables/nn_module.py (NNModuleVariable,
UnspecializedNNModuleVariable), variables/user_defined.py (UserDefinedObjectVariable) and
variables/misc.py (SuperVariable, PythonModuleVariable). Classes, and the objects the traced code
makes by calling them, are in classes.py.
"""

from __future__ import annotations

import collections.abc
import inspect
import types

import torch

from toycomp.capture.sources import AttrSource, GetItemSource
from toycomp.capture.variables import nn_module_iter
from toycomp.capture.variables.base import (
    ConstantVariable,
    MethodVariable,
    Unsupported,
    ValueVariable,
    VariableTracker,
)
from toycomp.capture.variables.functions import UserFunctionVariable, UserMethodVariable
from toycomp.capture.variables.lists import (
    ListIteratorVariable,
    TupleVariable,
    as_iterator,
)
from toycomp.capture.variables.tensor import NumpyArrayVariable


MISSING = object()


# [Note: attribute lookup order]
# ``obj.name`` (object.__getattribute__) looks first for ``name`` in type(obj).__mro__; if that
# is a data descriptor (a property: it has __set__ or __delete__) it wins; else the instance
# ``__dict__``; else the class attribute (a method, bound; a constant); and only when all of
# these fail does Python call ``__getattr__``, which for an nn.Module searches ``_parameters``,
# ``_buffers`` and ``_modules``. The tracer follows the same order, so ``self.weight`` is the
# property where a class defines one over a parameter, and the tensor where ``m.__dict__`` holds
# one, as in eager: guards and graph inputs read through the source (``m.weight``) get the same
# value as the trace did, and the frame compiles once. (Tracing the parameter there gave values
# read right, but guards that failed on every call: a recompile each time, up to the limit.)
def class_lookup(cls: type, name: str):
    """``name`` as found in ``cls.__mro__`` (not run: a property stays a property), or MISSING."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return MISSING


def is_data_descriptor(attr) -> bool:
    return hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")


class UserDefinedObjectVariable(VariableTracker):
    """An instance of a Python class, read from a source (guarded by its type)."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source
        self.overrides: dict[str, VariableTracker] = {}  # attributes stored while tracing

    def python_type(self):
        return type(self.value)

    def var_getattr(self, tx, name):
        hook = class_lookup(self.python_type(), "__getattribute__")
        if isinstance(hook, types.FunctionType):  # the class's own, in Python: inline it
            return UserMethodVariable(hook, self).call_function(tx, [ConstantVariable(name)], {})
        return self.generic_getattr(tx, name)

    def generic_getattr(self, tx, name):
        """``object.__getattribute__(self, name)``: the lookup of [Note: attribute lookup
        order], then ``__getattr__``."""
        if name in self.overrides:
            return self.overrides[name]
        if name == "__class__":
            return tx.output.wrap(type(self.value), self.source and AttrSource(self.source, name))
        on_class = class_lookup(self.python_type(), name)  # [Note: attribute lookup order]
        if is_data_descriptor(on_class):
            return self.class_attr(tx, name)
        found = self.instance_attr(tx, name)
        if found is not None:
            return found
        if on_class is not MISSING:
            return self.class_attr(tx, name)
        return self.getattr_fallback(tx, name)

    def instance_attr(self, tx, name):
        """``name`` in the instance ``__dict__``, or None."""
        d = getattr(self.value, "__dict__", {})
        if name in d:
            return tx.output.wrap(d[name], self.source and AttrSource(self.source, name))
        return None

    def getattr_fallback(self, tx, name):
        """What ``__getattr__`` gives when the lookup found nothing (here: an error)."""
        raise Unsupported(f"{self.python_type().__name__} has no attribute {name!r}")

    def class_attr(self, tx, name):
        """Look ``name`` up on the class (functions become bound methods, properties run)."""
        cls = self.python_type()
        try:
            attr = inspect.getattr_static(cls, name)
        except AttributeError:
            raise Unsupported(f"{cls.__name__} has no attribute {name!r}") from None
        cls_source = self.class_source()
        fn_source = cls_source and AttrSource(cls_source, name)
        if isinstance(attr, staticmethod):
            return tx.output.wrap(attr.__func__, fn_source)
        if isinstance(attr, classmethod):
            return UserMethodVariable(attr.__func__, tx.output.wrap(cls, None), None)
        if isinstance(attr, property):
            getter_source = fn_source and AttrSource(fn_source, "fget")
            return UserMethodVariable(attr.fget, self, getter_source).call_function(tx, [], {})
        if isinstance(attr, types.FunctionType):
            return UserMethodVariable(attr, self, fn_source)
        if callable(attr) and not isinstance(attr, type):
            raise Unsupported(f"method {cls.__name__}.{name} is not Python code")
        return self.plain_class_attr(tx, name)

    def class_source(self):
        return self.source and AttrSource(self.source, "__class__")

    def plain_class_attr(self, tx, name):
        """A class attribute that is not a method (a constant, a nested class...)."""
        source = self.source and AttrSource(self.source, name)
        return tx.output.wrap(getattr(self.value, name), source)

    def setattr(self, tx, name, value):
        if self.source is None:
            raise Unsupported(f"attribute store on a {type(self.value).__name__} without a source")
        if is_data_descriptor(class_lookup(self.python_type(), name)):  # (a property's setter)
            raise Unsupported(f"store to the descriptor {self.python_type().__name__}.{name}")
        tx.output.side_effects.record_setattr(self, name, value)
        self.overrides[name] = value

    def call_function(self, tx, args, kwargs):
        return self.class_attr(tx, "__call__").call_function(tx, args, kwargs)

    def defines(self, name: str) -> bool:
        """Does the class define the special method ``name`` in Python (to inline)?"""
        return isinstance(class_lookup(self.python_type(), name), types.FunctionType)

    def unpack_var_sequence(self, tx):
        if class_lookup(self.python_type(), "__iter__") is collections.abc.Sequence.__iter__:
            return self.sequence_items(tx)
        if not self.defines("__iter__"):
            raise Unsupported(f"iterating over {self}")
        return as_iterator(tx, self.class_attr(tx, "__iter__").call_function(tx, [], {})) \
            .unpack_var_sequence(tx)

    def sequence_items(self, tx):
        """A ``collections.abc.Sequence``: ``self[i]`` for ``i < len(self)``, which is what
        its mixin ``__iter__`` yields (it stops at the IndexError that ``len`` predicts)."""
        n = self.call_method(tx, "__len__", [], {}).as_python_constant()
        return [self.call_method(tx, "__getitem__", [ConstantVariable(i)], {}) for i in range(n)]

    def __repr__(self):
        return f"{type(self).__name__}({type(self.value).__name__})"


class NNModuleVariable(UserDefinedObjectVariable):
    """An ``nn.Module``: parameters and buffers are graph inputs, submodules are modules too."""

    def getattr_fallback(self, tx, name):
        """nn.Module.__getattr__: its parameters, then buffers, then submodules."""
        m = self.value
        for table in (m._parameters, m._buffers, m._modules):
            if name in table:
                return tx.output.wrap(table[name], self.source and AttrSource(self.source, name))
        return super().getattr_fallback(tx, name)

    def call_function(self, tx, args, kwargs):
        m = self.value
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
            raise Unsupported(f"{type(m).__name__} has hooks")
        return self.var_getattr(tx, "forward").call_function(tx, args, kwargs)

    def class_attr(self, tx, name):
        if nn_module_iter.is_module_iterator(self.python_type(), name):  # (not inlined)
            return MethodVariable(self, name)
        return super().class_attr(tx, name)

    def submodules(self, tx):
        """The children of a ModuleList / Sequential / ModuleDict, as trackers."""
        base = self.source and AttrSource(self.source, "_modules")
        return [tx.output.wrap(sub, base and GetItemSource(base, key))
                for key, sub in self.value._modules.items()]

    def call_method(self, tx, name, args, kwargs):
        m = self.value
        keys = list(m._modules)
        if nn_module_iter.is_module_iterator(type(m), name):
            return nn_module_iter.iterate(tx, self, name, args, kwargs)
        if name == "__len__":
            return ConstantVariable(len(m._modules))
        if name == "__iter__":
            items = self.submodules(tx) if not isinstance(m, torch.nn.ModuleDict) else keys
            return ListIteratorVariable([ConstantVariable(k) for k in keys]
                                        if isinstance(m, torch.nn.ModuleDict) else items)
        if name == "__getitem__" and isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential,
                                                    torch.nn.ModuleDict)):
            index = args[0].as_python_constant()
            subs = self.submodules(tx)
            if isinstance(index, slice):  # (a new ModuleList in eager: its items, here)
                return TupleVariable(subs[index])
            return subs[keys.index(index) if isinstance(m, torch.nn.ModuleDict) else index]
        if name == "values" and isinstance(
                m, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
            return TupleVariable(self.submodules(tx))
        if name in ("keys", "items") and isinstance(m, torch.nn.ModuleDict):
            subs = self.submodules(tx)
            if name == "keys":
                return TupleVariable([ConstantVariable(k) for k in keys])
            pairs = [TupleVariable([ConstantVariable(k), s]) for k, s in zip(keys, subs)]
            return TupleVariable(pairs)
        if name in ("train", "eval", "register_buffer", "register_parameter", "apply", "to"):
            raise Unsupported(f"nn.Module.{name}() inside the compiled function")
        return super().call_method(tx, name, args, kwargs)

    def unpack_var_sequence(self, tx):
        return self.call_method(tx, "__iter__", [], {}).unpack_var_sequence(tx)


class SuperVariable(VariableTracker):
    """``super()`` inside a method: attribute lookup starts after ``cls`` in the object's MRO."""

    def __init__(self, cls, obj: UserDefinedObjectVariable):
        self.cls = cls
        self.obj = obj

    def var_getattr(self, tx, name):
        from toycomp.capture.variables import user_dicts  # (it subclasses this module's)

        mro = self.obj.python_type().__mro__
        for klass in mro[mro.index(self.cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return UserMethodVariable(attr, self.obj, None)
                if attr is object.__init__:  # super().__init__() at the top of a hierarchy
                    return ObjectInitVariable()
                if attr is object.__getattribute__:  # past the class's own __getattribute__
                    return GenericGetattrVariable(self.obj)
                if attr is object.__setattr__ and hasattr(self.obj, "object_setattr"):
                    return user_dicts.DictSuperMethod(self.obj, name)  # (a copied config's)
                found = user_dicts.super_method(self.obj, klass, name)
                if found is not None:  # dict's own method on a dict subclass's items
                    return found
                raise Unsupported(f"super().{name} is not a Python function")
        raise Unsupported(f"super() has no attribute {name!r}")


class GenericGetattrVariable(VariableTracker):
    """``object.__getattribute__`` bound to an object (``super().__getattribute__(key)`` in a
    class that defines its own ``__getattribute__``)."""

    def __init__(self, obj: UserDefinedObjectVariable):
        self.obj = obj

    def call_function(self, tx, args, kwargs):
        return self.obj.generic_getattr(tx, args[0].as_python_constant())


class ObjectInitVariable(VariableTracker):
    """``object.__init__`` bound to an object: takes no arguments, does nothing."""

    def call_function(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("object.__init__() takes no arguments")
        return ConstantVariable(None)


class PythonModuleVariable(ValueVariable):
    """A Python module such as ``torch``, ``math`` or ``numpy`` (not guarded)."""

    def python_type(self):
        return types.ModuleType

    def var_getattr(self, tx, name):
        if not hasattr(self.value, name):
            raise Unsupported(f"module {self.value.__name__} has no attribute {name!r}")
        value = getattr(self.value, name)
        source = self.source and AttrSource(self.source, name)
        return tx.output.wrap(value, source, guard=not callable(value))


class SkipFunctionVariable(VariableTracker):
    """A function toycomp does not trace into (numpy, random, C extensions): calling it is a
    graph break whose reason names it."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def as_python_constant(self):
        return self.value

    def call_function(self, tx, args, kwargs):
        module = getattr(self.value, "__module__", None) or type(self.value).__module__
        operands = args + list(kwargs.values())
        if module.split(".")[0] == "numpy" and all(a.is_python_constant() for a in operands):
            consts = [a.as_python_constant() for a in args]  # numpy on constants: fold it
            return ConstantVariable(self.value(*consts, **{k: v.as_python_constant()
                                                           for k, v in kwargs.items()}))
        name = getattr(self.value, "__qualname__", repr(self.value))
        if any(isinstance(a, NumpyArrayVariable) for a in operands):
            raise Unsupported(f"{module}.{name}() on a tensor's data (toycomp does not trace "
                              "NumPy; Dynamo does, through torch._numpy)")
        raise Unsupported(f"call to {module}.{name}: not traceable")
