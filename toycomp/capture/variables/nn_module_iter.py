"""``children()``, ``named_children()``, ``modules()`` and ``named_modules()`` of an nn.Module
while tracing: the submodules as trackers, each with its source, without inlining the method.

Inlining ``nn.Module.named_children`` would trace a generator that keeps the modules it has
yielded in a ``set`` (``module not in memo``), and a set of traced modules is not a Python
constant: the loop ``for block in self.children()`` (timm's RegNet stages) broke the graph.
What the methods yield depends only on the module tree, which the capture reads like any other
Python object: it asks the real module for the names, then reaches each submodule through its
source ``m._modules['body']._modules['0']`` (so guards see where it came from). Example::

    for block in self.children():  # self: a Stage with .conv and .act
        x = block(x)
    # traced as: L['self']._modules['conv'](x), then L['self']._modules['act'](...)

NB: in PyTorch this lives in torch/_dynamo/variables/nn_module.py (``NNModuleVariable.call_method``
answers ``children``, ``named_children``, ``modules`` and ``named_modules`` the same way).
"""

from __future__ import annotations

import inspect

import torch

from toycomp.capture.sources import AttrSource, GetItemSource
from toycomp.capture.variables.base import ConstantVariable, Unsupported
from toycomp.capture.variables.lists import ListIteratorVariable, TupleVariable

ITERATORS = ("children", "named_children", "modules", "named_modules")


def is_module_iterator(cls: type, name: str) -> bool:
    """``name`` is one of nn.Module's own iterators, not overridden by ``cls``."""
    return name in ITERATORS and getattr(cls, name, None) is getattr(torch.nn.Module, name)


def iterate(tx, module_var, name: str, args: list, kwargs: dict) -> ListIteratorVariable:
    """What ``module.<name>(*args, **kwargs)`` yields, as an iterator of trackers."""
    module = module_var.value
    method = getattr(torch.nn.Module, name)
    try:
        bound = inspect.signature(method).bind(
            module, *[a.as_python_constant() for a in args],
            **{k: v.as_python_constant() for k, v in kwargs.items()})  # fmt: skip
    except TypeError as e:
        raise Unsupported(f"nn.Module.{name}() with these arguments: {e}") from None
    if bound.arguments.get("memo") is not None:
        raise Unsupported(f"nn.Module.{name}() with a memo set")
    named = name.startswith("named_")
    recursive = name.endswith("modules")
    prefix = bound.arguments.get("prefix", "")
    options = {k: v for k, v in bound.arguments.items() if k not in ("self", "prefix")}
    # the real module says which submodules come out, in which order (None and repeats left out)
    listing = getattr(module, "named_modules" if recursive else "named_children")(**options)
    _guard_children(tx, module_var.source, module)
    items = []
    for path, sub in listing:
        source = _source(module_var.source, path)
        if recursive:
            _guard_children(tx, source, sub)
        tracked = tx.output.wrap(sub, source)
        full = ".".join(p for p in (prefix, path) if p) if recursive else path
        items.append(TupleVariable([ConstantVariable(full), tracked]) if named else tracked)
    return ListIteratorVariable(items)


def _guard_children(tx, source, module: torch.nn.Module) -> None:
    """A child added or removed later changes what the loop runs: guard the names."""
    guards = tx.output.guards
    if guards is not None and source is not None:
        guards.dict_keys_match(AttrSource(source, "_modules"), list(module._modules))


def _source(base, path: str):
    """``base._modules['a']._modules['b']`` for the dotted ``path`` ``a.b`` ('' is ``base``)."""
    for key in path.split(".") if path and base is not None else []:
        base = GetItemSource(AttrSource(base, "_modules"), key)
    return base
