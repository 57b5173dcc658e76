"""Symbolic sizes: a SymInt's sympy expression -> Python text, FX nodes or a number.

With dynamic shapes a size is a ``torch.SymInt``: a Python int whose value is a sympy expression
over *symbols* (``s0``, ``s1``...), one per input size that may vary, kept by the fake tensors'
``ShapeEnv``. Every stage needs the expression back in its own language: capture writes its shape
guards as Python text over the inputs (``L['x'].size(0) >= 2``), AOT rebuilds a size as FX nodes
from the nodes holding its symbols, and the runtime evaluates sizes on the real inputs' numbers.
One small interpreter (``interpret``) does all three, with Python's operators as its semantics:

    >>> import sympy
    >>> s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    >>> to_text(3 * s0 - s1 - 1, {s0: "L['x'].size(0)", s1: "L['y'].size(0)"})
    "3 * L['x'].size(0) - L['y'].size(0) - 1"
    >>> to_text(sympy.Ge(s0, 2), {s0: "L['x'].size(0)"})
    "L['x'].size(0) >= 2"
    >>> evaluate(3 * s0 - s1 - 1, {s0: 5, s1: 4})
    10

NB: in PyTorch this lives in torch/fx/experimental/symbolic_shapes.py (``ShapeEnv``, ``SymNode``,
``produce_guards``) and torch/utils/_sympy/ (``interp.py``'s ``sympy_interp``, ``printers.py``,
``functions.py``: ``FloorDiv``, ``Mod``, ``Max``...).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Callable, Sequence

import sympy
import torch
import torch.fx as fx

from toycomp._torch_compat import sym_expr, sym_hint

__all__ = [
    "SYM_TYPES", "SymbolicInputs", "compile_exprs", "evaluate", "free_symbols", "has_symbols",
    "hint", "interpret", "is_symbolic", "specialized", "sym_expr", "symbolic_inputs", "to_fx",
    "to_text",
]  # fmt: skip

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(x: Any) -> bool:
    """A ``SymInt`` / ``SymFloat`` / ``SymBool`` (a size expression, not a plain number)."""
    return isinstance(x, SYM_TYPES)


def hint(x: Any) -> Any:
    """The example value of a size: a SymInt's value on the inputs it was traced with."""
    return sym_hint(x) if is_symbolic(x) else x


def free_symbols(value: Any) -> set[sympy.Symbol]:
    """The symbols in a SymInt, or in a tensor's sizes, strides and storage offset (or a
    tuple of those); a plain number or static tensor has none."""
    if isinstance(value, torch.Tensor):
        value = (*value.shape, *value.stride(), value.storage_offset())
    if isinstance(value, (tuple, list)):
        return set().union(*[free_symbols(v) for v in value])
    return set(sym_expr(value).free_symbols) if is_symbolic(value) else set()


def has_symbols(value: Any) -> bool:
    return bool(free_symbols(value))


# -- one interpreter, three meanings -------------------------------------------------------
def _add(*terms):
    return functools.reduce(operator.add, terms)


def _mul(*factors):
    return functools.reduce(operator.mul, factors)


# sympy function name -> the Python operation it stands for (torch's FloorDiv is Python's //,
# its Mod and PythonMod are %, on the non-negative sizes they are used for).
OPS: dict[str, Callable] = {
    "Add": _add, "Mul": _mul, "Pow": operator.pow, "PowByNatural": operator.pow,
    "FloorDiv": operator.floordiv, "CleanDiv": operator.floordiv,
    "CeilDiv": lambda a, b: -(-a // b), "Mod": operator.mod, "PythonMod": operator.mod,
    "Max": lambda *a: functools.reduce(torch.sym_max, a),
    "Min": lambda *a: functools.reduce(torch.sym_min, a),
    "Equality": operator.eq, "Unequality": operator.ne, "StrictLessThan": operator.lt,
    "LessThan": operator.le, "StrictGreaterThan": operator.gt, "GreaterThan": operator.ge,
    "And": lambda *a: functools.reduce(operator.and_, a),
    "Or": lambda *a: functools.reduce(operator.or_, a), "Not": operator.not_,
    # float sizes (var's 1 / (N - 1) is a SymFloat) and their conversions
    "ToFloat": torch.sym_float, "FloatTrueDiv": operator.truediv,
    "IntTrueDiv": operator.truediv, "FloatPow": operator.pow, "TruncToInt": torch.sym_int,
    "FloorToInt": math.floor, "CeilToInt": math.ceil, "RoundToInt": round,
    "Identity": lambda a: a,
}  # fmt: skip


def interpret(expr: sympy.Basic, symbol: Callable[[sympy.Symbol], Any], ops=OPS) -> Any:
    """Evaluate ``expr`` bottom-up: ``symbol(s)`` for each symbol, Python numbers for numbers,
    ``ops[function name](*arguments)`` for everything else.

    Raises:
        NotImplementedError: naming a sympy function ``ops`` does not know.
    """
    if expr.is_Symbol:
        return symbol(expr)
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if expr.is_Integer:
        return int(expr)
    if expr.is_Number:
        return float(expr)
    name = type(expr).__name__
    if name not in ops:
        raise NotImplementedError(f"toycomp: size expression {expr} uses {name}, not supported")
    return ops[name](*[interpret(arg, symbol, ops) for arg in expr.args])


def evaluate(expr: sympy.Basic, env: dict[sympy.Symbol, int]) -> Any:
    """The number ``expr`` stands for when each symbol has the value ``env`` gives it."""
    return interpret(sympy.sympify(expr), env.__getitem__)


# -- as Python text (guards, error messages) --------------------------------------------------
# Python's operator precedence, for as few parentheses as the text needs.
_ATOM, _POW, _NEG, _MUL, _ADD, _CMP, _NOT, _AND, _OR = 9, 8, 7, 6, 5, 4, 3, 2, 1


class _Code:
    """Python source text with its precedence; ``negated`` is ``x``'s text when this is ``-x``
    (an Add writes ``a - x`` rather than ``a + -x``)."""

    def __init__(self, text: str, prec: int = _ATOM, negated: str | None = None):
        self.text, self.prec, self.negated = text, prec, negated

    def at(self, prec: int) -> str:
        """The text as an operand of an operator of precedence ``prec``."""
        return self.text if self.prec >= prec else f"({self.text})"

    def __str__(self) -> str:
        return self.text


def _code(x: Any) -> _Code:
    return x if isinstance(x, _Code) else _Code(repr(x), _ATOM if x >= 0 else _NEG)


def _binary(symbol: str, prec: int) -> Callable:
    # the right operand binds tighter: a // (b * c), a - (b - c)
    return lambda a, b: _Code(f"{_code(a).at(prec)} {symbol} {_code(b).at(prec + 1)}", prec)


def _text_add(*terms):
    """``a + b - c - 1``: symbolic terms first, then the subtracted ones, the number last."""
    number = sum(t for t in terms if not isinstance(t, _Code))
    codes = [t for t in terms if isinstance(t, _Code)]
    plus = [c.at(_ADD) for c in codes if c.negated is None]
    minus = [c.negated for c in codes if c.negated is not None]
    text = " + ".join(plus) if plus else f"-{minus.pop(0)}"
    text += "".join(f" - {m}" for m in minus)
    if number:
        text += f" - {-number}" if number < 0 else f" + {number}"
    return _Code(text, _ADD)


def _text_mul(*factors):
    number = functools.reduce(operator.mul, [f for f in factors if not isinstance(f, _Code)], 1)
    parts = [f.at(_MUL + 1) for f in factors if isinstance(f, _Code)]  # (a // b) * c
    codes = " * ".join(parts)
    if number < 0:  # -x binds tighter than *, -x * y does not
        negated = codes if number == -1 else f"{-number} * {codes}"
        single = number == -1 and len(parts) == 1
        return _Code(f"-{negated}", _NEG if single else _MUL, negated=negated)
    return _Code(codes if number == 1 else f"{number} * {codes}", _MUL)


def _call(name: str) -> Callable:
    return lambda *a: _Code(f"{name}({', '.join(str(_code(x)) for x in a)})")


def _joined(word: str, prec: int) -> Callable:
    return lambda *a: _Code(f" {word} ".join(_code(x).at(prec + 1) for x in a), prec)


TEXT_OPS = {
    **{name: _binary(sym, prec) for name, sym, prec in [
        ("Pow", "**", _POW), ("PowByNatural", "**", _POW), ("FloorDiv", "//", _MUL),
        ("CleanDiv", "//", _MUL), ("Mod", "%", _MUL), ("PythonMod", "%", _MUL),
        ("Equality", "==", _CMP), ("Unequality", "!=", _CMP), ("StrictLessThan", "<", _CMP),
        ("LessThan", "<=", _CMP), ("StrictGreaterThan", ">", _CMP),
        ("GreaterThan", ">=", _CMP)]},
    "Add": _text_add, "Mul": _text_mul, "Max": _call("max"), "Min": _call("min"),
    "CeilDiv": lambda a, b: _Code(f"-(-{_code(a).at(_NEG)} // {_code(b).at(_MUL + 1)})", _NEG),
    "And": _joined("and", _AND), "Or": _joined("or", _OR),
    "Not": lambda a: _Code(f"not {_code(a).at(_NOT)}", _NOT),
    "ToFloat": _call("float"), "FloatTrueDiv": _binary("/", _MUL), "IntTrueDiv": _binary("/", _MUL),
    "FloatPow": _binary("**", _POW), "TruncToInt": _call("int"), "RoundToInt": _call("round"),
    "FloorToInt": lambda a: _Code(f"int({_code(a).at(_MUL + 1)} // 1)"),
    "CeilToInt": lambda a: _Code(f"-int(-{_code(a).at(_NEG)} // 1)", _NEG),
    "Identity": lambda a: a,
}  # fmt: skip


def to_text(expr: sympy.Basic, names: dict[sympy.Symbol, str]) -> str:
    """``expr`` as a Python expression, each symbol written as ``names[symbol]``."""
    return str(_code(interpret(sympy.sympify(expr), lambda s: _Code(names[s]), TEXT_OPS)))


# -- as FX nodes (AOT's graphs) ---------------------------------------------------------------
def _node_call(fn: Callable) -> Callable:
    """``fn`` as a graph node when an argument is an FX proxy (``float(proxy)`` cannot be
    traced by Python's operators), else ``fn`` itself."""

    def call(*args):
        proxy = next((a for a in args if isinstance(a, fx.Proxy)), None)
        if proxy is None:
            return fn(*args)
        return proxy.tracer.create_proxy("call_function", fn, args, {})

    return call


FX_OPS = OPS | {name: _node_call(OPS[name]) for name in (
    "ToFloat", "TruncToInt", "FloorToInt", "CeilToInt", "RoundToInt")}
def to_fx(
    expr: sympy.Basic,
    graph: fx.Graph,
    symbol_node: Callable[[sympy.Symbol], fx.Node],
    meta_key: str = "val",
) -> fx.Node | int:
    """``expr`` computed by new nodes of ``graph`` (``operator.mul``, ``operator.floordiv``...,
    as in PyTorch's graphs) from the nodes ``symbol_node`` gives for its symbols; a number for
    a constant expression. Every new node gets ``meta[meta_key]`` (``"val"``; capture's graphs
    say ``"example_value"``), computed on the symbols' values.

    [Note: sizes are rebuilt from their symbols] A SymInt does not remember the operations that
    made it, only its expression (``3*s0``): the recorder sees ``aten.view(x, [3*s0])`` but
    never the multiplication, which ran in plain Python. So the graph computes it again from
    the node holding ``s0``. make_fx records the arithmetic as it happens instead, through a
    dispatch mode for SymInt operations (``ProxySymDispatchMode``).
    """
    tracer = fx.proxy.GraphAppendingTracer(graph)
    first_new = len(graph.nodes)
    result = interpret(sympy.sympify(expr), lambda s: fx.Proxy(symbol_node(s), tracer), FX_OPS)
    for node in list(graph.nodes)[first_new:]:
        if meta_key not in node.meta:
            args = fx.node.map_arg(node.args, lambda n: n.meta[meta_key])
            node.meta[meta_key] = node.target(*args)
    return result.node if isinstance(result, fx.Proxy) else result



def compile_exprs(exprs: list, symbols: list[sympy.Symbol]) -> Callable[[Any], tuple]:
    """One Python function computing every expression of ``exprs`` (a nested list of sympy
    expressions and numbers) from the values of ``symbols``, given as a sequence: for the
    runtime, which evaluates the same sizes on every call.

        >>> s0 = sympy.Symbol("s0", integer=True, positive=True)
        >>> compile_exprs([[s0, 3], [3, 1]], [s0])((5,))
        ((5, 3), (3, 1))
    """
    names = {s: f"v[{i}]" for i, s in enumerate(symbols)}

    def text(e: Any) -> str:
        if isinstance(e, (list, tuple)):
            return "(" + "".join(f"{text(x)}, " for x in e) + ")"
        return to_text(e, names) if isinstance(e, sympy.Basic) else repr(e)

    return eval(f"lambda v: {text(exprs)}", {"max": max, "min": min})  # noqa: S307 (our text)


class SymbolicInputs:
    """Real inputs -> the values of the symbols in their traced sizes -> their expected layouts.

    Each symbol is read from the first traced input that holds it: a size input (``s0`` passed
    as an int), else a tensor's size, else a stride. ``layouts(args)`` then gives the (shape,
    strides) every tensor input must have in this call (None for size inputs), and checks the
    size inputs that are not plain symbols.

    NB: in PyTorch, Inductor's wrapper reads the symbols from the inputs the same way
    (torch/_inductor/codegen/wrapper.py, ``codegen_input_symbol_assignment``).
    """

    def __init__(self, vals: list) -> None:
        self.symbols: list[sympy.Symbol] = []
        self._reads: list[tuple[int, str | None, int]] = []  # input, "size"/"stride"/None, dim
        for i, v in enumerate(vals):
            if is_symbolic(v) and sym_expr(v).is_Symbol:
                self._bind(sym_expr(v), (i, None, 0))
        for kind in ("size", "stride"):
            for i, v in enumerate(vals):
                parts = (v.shape if kind == "size" else v.stride()) if _is_tensor(v) else ()
                for dim, part in enumerate(parts):
                    if is_symbolic(part) and sym_expr(part).is_Symbol:
                        self._bind(sym_expr(part), (i, kind, dim))
        missing = free_symbols(list(vals)) - set(self.symbols)
        if missing:
            names = sorted(map(str, missing))
            raise NotImplementedError(f"toycomp: no input holds the sizes {names}")
        self._layouts = self._compile_layouts(vals)

    def _compile_layouts(self, vals: list) -> Callable[[Sequence], list]:
        """One function of the inputs (run on every call): read the symbols, check the size
        inputs, return each tensor input's expected (shape, strides)::

            def layouts(a):
                v0 = a[1].size(0)
                return [None, ((v0, 3), (3, 1))]
        """
        names = {s: f"v{i}" for i, s in enumerate(self.symbols)}
        lines = [f"    v{i} = a[{k}]" + ("" if kind is None else f".{kind}({dim})")
                 for i, (k, kind, dim) in enumerate(self._reads)]  # fmt: skip
        text = lambda e: to_text(e, names) if isinstance(e, sympy.Basic) else repr(e)  # noqa
        own = {k for k, kind, _ in self._reads if kind is None}
        outs = []
        for i, v in enumerate(vals):
            want = self._expected(v)
            if not _is_tensor(v):
                if i not in own:
                    lines.append(f"    if a[{i}] != {text(want)}: mismatch({i}, {text(want)}, a)")
                outs.append("None")
                continue
            shape, stride = ("(" + "".join(f"{text(e)}, " for e in part) + ")" for part in want)
            outs.append(f"({shape}, {stride})")
        source = "def layouts(a):\n" + "\n".join(lines) + f"\n    return [{', '.join(outs)}]\n"
        scope = {"mismatch": _size_mismatch, "max": max, "min": min}
        exec(compile(source, "<toycomp input layouts>", "exec"), scope)  # noqa: S102 (our text)
        return scope["layouts"]

    def _bind(self, symbol: sympy.Symbol, read: tuple) -> None:
        if symbol not in self.symbols:
            self.symbols.append(symbol)
            self._reads.append(read)

    @staticmethod
    def _expected(v: Any) -> Any:
        as_expr = lambda x: sym_expr(x) if is_symbolic(x) else x  # noqa: E731
        if _is_tensor(v):
            return [[as_expr(n) for n in v.shape], [as_expr(st) for st in v.stride()]]
        return as_expr(v)

    def values(self, args: Sequence) -> tuple:
        """Each symbol's value in the call with inputs ``args``."""
        out = []
        for i, kind, dim in self._reads:
            arg = args[i]
            out.append(arg if kind is None else getattr(arg, kind)(dim))
        return tuple(out)

    def layouts(self, args: Sequence) -> list:
        """Per input: the (shape, strides) it must have in this call; None for a size input,
        whose value is checked here."""
        return self._layouts(args)

    def evaluate(self, meta: torch.Tensor, args: Sequence) -> tuple[tuple, tuple]:
        """The (shape, strides) of a traced value ``meta`` in the call with inputs ``args``."""
        fn = compile_exprs(self._expected(meta), self.symbols)
        shape, stride = fn(self.values(args))
        return torch.Size(shape), stride


def _is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def _size_mismatch(i: int, want: int, args: Sequence) -> None:
    raise RuntimeError(f"toycomp: input {i} should be the size {want}, got {args[i]!r}")


def symbolic_inputs(vals: list) -> SymbolicInputs | None:
    """A ``SymbolicInputs`` for traced inputs with symbolic sizes; None if all are static."""
    return SymbolicInputs(vals) if free_symbols(list(vals)) else None


def specialized(value: Any) -> Any:
    """``value`` with every SymInt / SymFloat / SymBool in it replaced by its number, guarded
    (``int(s0)`` records ``s0 == 4``): for Python that must see the number itself. ``str(s0)``
    is ``"s0"``, so a size formatted into text (``f"{x.shape[0]}"``) is specialised first."""
    if isinstance(value, (tuple, list)) and any(map(is_symbolic, value)):
        return type(value)(specialized(v) for v in value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    return int(value) if isinstance(value, torch.SymInt) else value
