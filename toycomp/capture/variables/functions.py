"""User functions while tracing: called by *inlining*, i.e. interpreting their bytecode too.

``helper(x)`` in the traced code does not run ``helper``: the interpreter binds the argument
trackers to ``helper``'s parameters and interprets ``helper.__code__`` in a child translator whose
result is the call's result. Globals and closure cells it reads get sources rooted at the
function itself (``G['helper'].__globals__['SCALE']``,
``G['helper'].__closure__[0].cell_contents``), so they are guarded like the caller's own.

>>> import types
>>> from toycomp.capture.variables.base import ConstantVariable as C
>>> def f(a, b=2, *rest, c, **kw): pass
>>> bound = bind_args(f.__code__, [C(1), C(5), C(6)], {"c": C(3), "d": C(4)}, [C(2)], {})
>>> sorted(bound), bound["rest"]
(['a', 'b', 'c', 'kw', 'rest'], TupleVariable([ConstantVariable(6)]))

NB: in PyTorch this lives in torch/_dynamo/variables/functions.py (UserFunctionVariable,
UserMethodVariable, NestedUserFunctionVariable) and ``InliningInstructionTranslator`` in
torch/_dynamo/symbolic_convert.py.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass

from toycomp.capture.sources import AttrSource, GetItemSource
from toycomp.capture.variables.base import ConstantVariable, Unsupported, VariableTracker
from toycomp.capture.variables.lists import DictVariable, TupleVariable


def bind_args(code: types.CodeType, args: list, kwargs: dict, defaults: list,
              kwdefaults: dict) -> dict[str, VariableTracker]:
    """Parameter name -> tracker, as Python would bind ``f(*args, **kwargs)``."""
    n, nk = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    positional, kwonly = names[:n], names[n:n + nk]
    i = n + nk
    varargs = names[i] if code.co_flags & inspect.CO_VARARGS else None
    varkw = names[i + bool(varargs)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    if len(args) > n and varargs is None:
        raise Unsupported(f"{code.co_name}() got too many positional arguments")
    bound = dict(zip(positional, args))
    extra_kw = {}
    for key, value in kwargs.items():
        if key in bound:
            raise Unsupported(f"{code.co_name}() got multiple values for {key!r}")
        if key in positional[code.co_posonlyargcount:] or key in kwonly:
            bound[key] = value
        elif varkw is not None:
            extra_kw[key] = value
        else:
            raise Unsupported(f"{code.co_name}() got an unexpected keyword argument {key!r}")
    for name, default in zip(positional[n - len(defaults):], defaults):
        bound.setdefault(name, default)
    for name in kwonly:
        if name not in bound and name in kwdefaults:
            bound[name] = kwdefaults[name]
    missing = [p for p in (*positional, *kwonly) if p not in bound]
    if missing:
        raise Unsupported(f"{code.co_name}() missing arguments {missing}")
    if varargs is not None:
        bound[varargs] = TupleVariable(args[n:])
    if varkw is not None:
        bound[varkw] = DictVariable(extra_kw)
    return bound


class UserFunctionVariable(VariableTracker):
    """A Python function defined outside the trace (a global helper, a module's method)."""

    def __init__(self, fn: types.FunctionType, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return types.FunctionType

    def as_python_constant(self):
        return self.fn

    def defaults(self, tx) -> tuple[list, dict]:
        src = self.source
        defaults = [
            tx.output.wrap(v, src and GetItemSource(AttrSource(src, "__defaults__"), i))
            for i, v in enumerate(self.fn.__defaults__ or ())
        ]
        kwdefaults = {
            k: tx.output.wrap(v, src and GetItemSource(AttrSource(src, "__kwdefaults__"), k))
            for k, v in (self.fn.__kwdefaults__ or {}).items()
        }
        return defaults, kwdefaults

    def call_function(self, tx, args, kwargs):
        defaults, kwdefaults = self.defaults(tx)
        bound = bind_args(self.fn.__code__, args, kwargs, defaults, kwdefaults)
        closure = list(self.fn.__closure__ or ())
        return tx.inline_call(self.fn.__code__, self.fn.__globals__, bound, closure, self.source,
                              self.fn.__qualname__)

    def var_getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantVariable(getattr(self.fn, name))
        raise Unsupported(f"attribute {name!r} of function {self.fn.__qualname__}")

    def __repr__(self):
        return f"UserFunctionVariable({self.fn.__qualname__})"


class UserMethodVariable(UserFunctionVariable):
    """A function bound to an object tracker: ``self.helper`` or ``module.forward``."""

    def __init__(self, fn, obj: VariableTracker, source=None):
        super().__init__(fn, source)
        self.obj = obj

    def python_type(self):
        return types.MethodType

    def call_function(self, tx, args, kwargs):
        return super().call_function(tx, [self.obj, *args], kwargs)

    def reconstruct(self, codegen):
        """Bound again to its object (``source`` is the function's, read from the class)."""
        fn = codegen.source(self.source) if self.source is not None else codegen.constant(self.fn)
        return f"{codegen.constant(types.MethodType)}({fn}, {codegen.reconstruct(self.obj)})"


@dataclass(eq=False)  # trackers compare by identity
class NestedUserFunctionVariable(VariableTracker):
    """A function made by the traced code itself (``MAKE_FUNCTION``): lambdas, inner functions,
    comprehensions before 3.12. Its closure holds ``CellVariable``s of the enclosing frame."""

    code: types.CodeType
    f_globals: dict
    defaults: list
    kwdefaults: dict
    closure: list
    qualname: str

    def python_type(self):
        return types.FunctionType

    def call_function(self, tx, args, kwargs):
        bound = bind_args(self.code, args, kwargs, self.defaults, self.kwdefaults)
        return tx.inline_call(self.code, self.f_globals, bound, self.closure, None, self.qualname)

    def reconstruct(self, codegen):
        """``make_function(code, ...)``, once: a lambda alive at a graph break. Its cells are
        new cells holding the rebuilt values (a cell of a function from outside: that cell)."""
        if id(self) in codegen.temps:
            return codegen.temps[id(self)]
        cells = []
        for cell in self.closure:
            if getattr(cell, "real", None) is not None:
                cells.append(codegen.constant(cell.real))
            elif getattr(cell, "contents", None) is not None:
                cells.append(f"{codegen.constant(types.CellType)}"
                             f"({codegen.reconstruct(cell.contents)})")
            else:
                raise Unsupported(f"{self.qualname}: a closure variable not yet assigned")
        defaults = "".join(f"{codegen.reconstruct(d)}, " for d in self.defaults)
        kwdefaults = ", ".join(f"{k!r}: {codegen.reconstruct(v)}"
                               for k, v in self.kwdefaults.items())
        call = (f"{codegen.constant(make_function)}({codegen.constant(self.code)}, "
                f"{codegen.constant(self.f_globals)}, {self.qualname!r}, ({defaults}), "
                f"{{{kwdefaults}}}, ({''.join(c + ', ' for c in cells)}))")
        return codegen.new_object(self, call)


def make_function(code, f_globals, qualname, defaults, kwdefaults, cells):
    """A function object as ``MAKE_FUNCTION`` makes it (for ``NestedUserFunctionVariable``)."""
    fn = types.FunctionType(code, f_globals, code.co_name, defaults or None, cells or None)
    fn.__qualname__, fn.__kwdefaults__ = qualname, kwdefaults or None
    return fn

    def __repr__(self):
        return f"NestedUserFunctionVariable({self.qualname})"
