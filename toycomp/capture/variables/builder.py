"""VariableBuilder: a real Python value read from a source -> a variable tracker + its guards.

This is where the guards come from. Wrapping ``L['x']`` (a tensor) makes a graph input and guards
its metadata; wrapping ``L['n']`` (an int) guards its value; wrapping ``G['helper']`` guards its
identity; wrapping ``L['model']`` guards its type. The same real object read twice gives the same
tracker, so a list appended to through two names stays one list.

>>> import torch
>>> from toycomp.capture.output_graph import OutputGraph
>>> from toycomp.capture.sources import LocalSource
>>> out = OutputGraph(lambda: None, {})
>>> out.wrap(3, LocalSource("n"))
ConstantVariable(3)
>>> list(out.guards.conditions)[-1]
"L['n'] == 3"

NB: in PyTorch this lives in torch/_dynamo/variables/builder.py (VariableBuilder, which calls
``install_guards`` for each kind of value).
"""

from __future__ import annotations

import builtins
import collections
import functools
import inspect
import math
import operator
import os
import types
from typing import Any

import numpy as np
import torch

from toycomp.capture.sources import (
    AttrSource,
    GetItemSource,
    IteratorSeqSource,
    NumpyTensorSource,
    Source,
)
from toycomp.capture.variables.base import ConstantVariable, Unsupported, VariableTracker
from toycomp.capture.variables.builtin import RULES, BuiltinVariable
from toycomp.capture.variables.iter import PartialVariable
from toycomp.capture.variables.functions import (
    InspectSignatureVariable,
    UserFunctionVariable,
    UserMethodVariable,
)
from toycomp.capture.variables.lists import (
    DictVariable,
    ListIteratorVariable,
    ListVariable,
    NamedTupleVariable,
    TupleVariable,
)
from toycomp.capture.variables.classes import NamedTupleClassVariable, UserDefinedClassVariable
from toycomp.capture.variables.objects import (
    NNModuleVariable,
    PythonModuleVariable,
    SkipFunctionVariable,
    UserDefinedObjectVariable,
)
from toycomp.capture.variables.copying import CopyFunctionVariable, is_copy_function
from toycomp.capture.variables.tensor import NumpyArrayVariable
from toycomp.capture.variables.torch import TRACING_STATE, TorchVariable
from toycomp.capture.variables.user_dicts import (
    EnvironVariable,
    UserDefinedDictVariable,
    is_user_dict_class,
)

CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                  torch.dtype, torch.device, slice, range, torch.Size, torch.memory_format,
                  torch.layout, types.CodeType)
LITERAL_TYPES = (int, float, bool, str, type(None))
ITERATOR_TYPES = (type(iter(())), type(iter([])), type(iter(range(0))))
# Modules whose functions are never traced into: calling them is a graph break.
SKIP_MODULES = ("numpy", "random", "scipy", "pandas", "time", "os", "sys", "logging", "warnings",
                "copy", "pickle", "threading")
BUILTIN_MODULES = (builtins, math, operator)


# [Note: which torch callables the graph holds]
# Tensor methods, and what the torch package (not nn.Module's code, nor Dynamo's) defines. A
# method bound to a Python object that is not a tensor or a module is traced instead
# (``GradScaler.scale``: its side effects are replayed, not stored fakes), and so is a lambda or
# a local function (OpInfo's ops): FX could not print an import path for it.
def is_torch_function(value: Any) -> bool:
    """Functions put in the graph as opaque calls: torch.*, F.*, torch.Tensor methods."""
    if isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(value, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor)
    module = getattr(value, "__module__", None) or ""
    if module.split(".")[0] != "torch" or module.startswith(("torch.nn.modules", "torch._dynamo")):
        return False
    if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
        return isinstance(value.__self__, (torch.Tensor, torch.nn.Module))
    return not (isinstance(value, types.FunctionType) and "<" in value.__qualname__)


def is_literal_tuple(value: Any) -> bool:
    """A tuple (not a subclass) of ints, floats, bools, strings and None: guarded in one line."""
    return type(value) is tuple and all(type(v) in LITERAL_TYPES for v in value)


# NumPy dtypes torch.from_numpy takes (the guards compare an array's dtype by name).
NUMPY_TENSOR_DTYPES = tuple(np.dtype(n) for n in ("float64", "float32", "float16", "int64",
                                                   "int32", "int16", "int8", "uint8", "bool"))


def codegen_numpy_dtype(dtype) -> str:
    return f"{dtype.name!r}"


def is_hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


def is_skipped(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module.split(".")[0] in SKIP_MODULES


class VariableBuilder:
    """Wraps real values read from sources; ``output`` supplies guards and graph inputs."""

    def __init__(self, output):
        self.output = output
        self.seen: dict[int, VariableTracker] = {}  # id(mutable object) -> its one tracker

    def __call__(self, value: Any, source: Source | None, guard: bool = True) -> VariableTracker:
        if isinstance(value, torch.Tensor):
            return self.output.add_input(value, source)
        if isinstance(value, CONSTANT_TYPES) and not isinstance(value, tuple):
            return self.wrap_constant(value, source, guard)
        if id(value) in self.seen:  # a mutable object read again: its one tracker
            return self.seen_again(value, source, guard)
        var = self.wrap_object(value, source, guard)
        if isinstance(var, (ListVariable, DictVariable, UserDefinedObjectVariable)):
            self.seen[id(value)] = var
            self.output.keep_alive.append(value)
        return var

    def wrap_constant(self, value, source, guard) -> ConstantVariable:
        if type(value) is int and source is not None and guard:
            size = self.output.symbolic_int(value, source)  # automatic dynamic ints
            if size is not None:
                return ConstantVariable(size, source)
        if source is not None and guard:
            self.output.guards.constant_match(source, value)
        return ConstantVariable(value, source)

    def seen_again(self, value, source, guard) -> VariableTracker:
        var = self.seen[id(value)]
        if guard and source is not None and var.source not in (None, source):
            self.output.guards.alias_match(source, var.source, True)  # still the same one?
        return var

    def wrap_object(self, value, source, guard) -> VariableTracker:
        g = self.output.guards if (source is not None) else None
        if isinstance(value, (tuple, list, dict)):  # items wrapped from their own sources
            return self.wrap_container(value, source, g, guard)
        if type(value) is np.ndarray and g is not None and value.dtype in NUMPY_TENSOR_DTYPES:
            return self.wrap_numpy(value, source, g)
        if type(value) in ITERATOR_TYPES:
            return self.wrap_iterator(value, source)
        if isinstance(value, torch.nn.Module):
            return self.wrap_module(value, source, g)
        if isinstance(value, types.ModuleType):
            return PythonModuleVariable(value, source)
        if not isinstance(value, (type, functools._lru_cache_wrapper)) and (  # see wrap_callable
                is_torch_function(value) or any(value is f for f in TRACING_STATE)):
            g and guard and g.id_match(source, value)  # torch.sin, F.relu, Tensor methods
            return TorchVariable(value, source)
        return self.wrap_callable(value, source, g if guard else None)

    def wrap_container(self, value, source, g, guard) -> VariableTracker:
        if g and guard and is_literal_tuple(value):  # [Note: tuples of constants]
            g.constant_match(source, value)
            return TupleVariable([self(v, GetItemSource(source, i), guard=False)
                                  for i, v in enumerate(value)], source)
        if isinstance(value, tuple):
            g and g.type_match(source, value)
            g and g.length_match(source, len(value))
            items = [self(v, source and GetItemSource(source, i)) for i, v in enumerate(value)]
            if hasattr(type(value), "_fields") or hasattr(type(value), "n_fields"):
                return NamedTupleVariable(items, type(value), source)
            return TupleVariable(items, source)
        if isinstance(value, list):
            g and g.type_match(source, value)
            return ListVariable(None, source, value)
        if is_user_dict_class(type(value)):  # a dict subclass: ModelOutput, a registry...
            return self.wrap_user_dict(value, source, g)
        if not all(isinstance(k, (str, int)) for k in value):  # a dict
            raise Unsupported("a dict with keys that are not str or int")
        g and g.type_match(source, value)
        g and g.dict_keys_match(source, list(value))
        return DictVariable({k: self(v, source and GetItemSource(source, k))
                             for k, v in value.items()}, source, type(value))

    def wrap_module(self, value, source, g) -> NNModuleVariable:
        """An nn.Module, guarded by its type; guards may read its dicts (sources.py)."""
        g and g.type_match(source, value)
        g and g.note_module(source, value)
        return NNModuleVariable(value, source)

    def wrap_numpy(self, value, source, g) -> NumpyArrayVariable:
        g.type_match(source, value)  # (before the tensor's guards, which convert it)
        g.add(f"{source.name()}.dtype == {codegen_numpy_dtype(value.dtype)}")
        tensor = self.output.add_input(torch.from_numpy(value), NumpyTensorSource(source))
        return NumpyArrayVariable(tensor)

    def wrap_user_dict(self, value, source, g) -> UserDefinedDictVariable:
        if not all(isinstance(k, (str, int)) for k in value):
            raise Unsupported("a dict with keys that are not str or int")
        g and g.type_match(source, value)
        g and g.dict_keys_match(source, list(value))
        items = {k: self(dict.__getitem__(value, k), source and GetItemSource(source, k))
                 for k in value}
        return UserDefinedDictVariable(value, source, DictVariable(items))

    def wrap_partial(self, value, source, g) -> PartialVariable:
        g and g.type_match(source, value)
        src = lambda name, key: source and GetItemSource(AttrSource(source, name), key)  # noqa
        args = [self(a, src("args", i)) for i, a in enumerate(value.args)]
        kwargs = {k: self(v, src("keywords", k)) for k, v in value.keywords.items()}
        g and g.length_match(AttrSource(source, "args"), len(value.args))
        g and g.dict_keys_match(AttrSource(source, "keywords"), list(value.keywords))
        return PartialVariable(self(value.func, source and AttrSource(source, "func")), args,
                               kwargs, source)

    def wrap_iterator(self, value, source) -> ListIteratorVariable:
        """A list / tuple / range iterator (a resume function's loop): its remaining items."""
        _, (seq,), position = value.__reduce__()
        if source is None:
            raise Unsupported("an iterator without a source")
        self.output.guards.type_match(source, value)
        self.output.guards.add(f"{source.name()}.__reduce__()[2] == {position}")
        seq_source = IteratorSeqSource(source)
        self.output.guards.length_match(seq_source, len(seq))
        return ListIteratorVariable([self(seq[i], GetItemSource(seq_source, i))
                                     for i in range(position, len(seq))])

    def wrap_callable(self, value, source, g) -> VariableTracker:
        """What is not a torch function: builtins, functools' wrappers (of torch functions too),
        copy, skipped modules (numpy...), classes (torch's too), Python functions, objects."""
        if value is os.environ:
            return EnvironVariable(value, source)
        if is_hashable(value) and value in RULES:  # a builtin with a rule (itertools...)
            return BuiltinVariable(value, source)
        if isinstance(value, functools._lru_cache_wrapper):  # traced through, as in Dynamo
            return self(value.__wrapped__, source and AttrSource(source, "__wrapped__"))
        if isinstance(value, functools.partial):
            return self.wrap_partial(value, source, g)
        if is_copy_function(value):  # copy.copy, copy.deepcopy: on trackers (copying.py)
            g and g.id_match(source, value)
            return CopyFunctionVariable(value, source)
        if is_skipped(value):  # numpy, random...: np.finfo(np.float32) folds on constants
            return SkipFunctionVariable(value, source)
        if isinstance(value, type):
            return self.wrap_class(value, source, g)
        return self.wrap_python_callable(value, source, g)  # builtins, user functions, objects

    def wrap_python_callable(self, value, source, g) -> VariableTracker:
        if value is inspect.signature:
            return InspectSignatureVariable()
        if (isinstance(value, types.MethodType) and value.__name__ == "clone"
                and type(value.__self__) in (torch.no_grad, torch.enable_grad)):
            # ``@torch.no_grad()`` on a function: its wrapper enters ``ctx_factory()``, the
            # decorator's ``clone``, a new context manager of the same class
            return TorchVariable(type(value.__self__), None)
        if getattr(value, "__module__", None) in ("builtins", "math", "_operator", "operator") \
                or any(value is v for m in BUILTIN_MODULES for v in vars(m).values()):
            return BuiltinVariable(value, source)
        if isinstance(value, types.FunctionType):
            return self.wrap_function(value, source, g)
        if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
            obj = self(value.__self__, source and AttrSource(source, "__self__"))
            if g is not None:
                g.id_match(AttrSource(source, "__func__"), value.__func__)
            return UserMethodVariable(value.__func__, obj)
        if callable(value) and not hasattr(value, "__dict__"):
            return SkipFunctionVariable(value, source)
        g and g.type_match(source, value)
        return UserDefinedObjectVariable(value, source)

    def wrap_class(self, value: type, source, g) -> VariableTracker:
        if value in vars(builtins).values() or value is collections.OrderedDict:
            return BuiltinVariable(value, source)
        if issubclass(value, tuple) and hasattr(value, "_fields"):
            g and g.id_match(source, value)
            return NamedTupleClassVariable(value, source)
        if is_torch_function(value):
            return TorchVariable(value, source)
        g and g.id_match(source, value)
        return UserDefinedClassVariable(value, source)

    def wrap_function(self, value: types.FunctionType, source, g) -> UserFunctionVariable:
        if g is not None and "<locals>" in value.__qualname__:
            # a function made by a call (a lambda handed over at a graph break): a new
            # object each call, guarded by its code; its cells and defaults are read
            # through the source, each with its own guard
            g.id_match(AttrSource(source, "__code__"), value.__code__)
        elif g is not None:
            g.id_match(source, value)
        return UserFunctionVariable(value, source)

