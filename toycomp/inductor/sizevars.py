"""Stage 4, symbolic sizes: PyTorch's SymInts -> sympy expressions over ``s0, s1, ...``.

Input -> output: the sizes, strides and SymInt inputs of a graph traced with dynamic shapes
(SymInts of a torch ``ShapeEnv``, whose symbols PyTorch names ``s77``, ``s27``...) -> Python ints
where a size is static, else sympy expressions over toycomp's size symbols ``s0, s1, ...``,
numbered in the order the ShapeEnv created them (so the forward and the backward graphs of one
trace agree, and the kernels read the same on every PyTorch version)::

    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> gm = make_fx(lambda a: a * 2, tracing_mode="symbolic")(torch.empty(8, 3))
    >>> fake = next(iter(gm.graph.nodes)).meta["val"]  # a fake tensor of size (s77, s27)
    >>> sizes = SizeVars()
    >>> sizes.shape(fake), sizes.stride(fake), sizes.shape(torch.empty(8, 3))
    ((s0, s1), (s1, 1), (8, 3))

A SymFloat (``2.0 / (s0*s1 - 1)``, the scale of ``var``'s backward) becomes a scalar symbol
``f0``: the wrapper computes it from the sizes with Python's float arithmetic, as eager does,
and passes it to the kernels (``scalars`` keeps its expression, in PyTorch's sympy functions).

Static tensors give plain ints, so a static graph compiles exactly as before. Sizes 0 and 1 are
always specialised: a symbol that PyTorch allows to be 0 or 1 is refused (NotImplementedError,
so the graph runs eagerly, visibly), since toycomp's decisions assume every symbol >= 2 (see
[Note: size symbols] in indexing.py).

NB: in PyTorch this lives in torch/_inductor/sizevars.py (``SizeVarAllocator``: simplification
with ranges, ``statically_known_*``, the kernel size arguments ``ks0, ks1``) and
torch/fx/experimental/symbolic_shapes.py (``ShapeEnv``, the symbols and their guards).
"""

from __future__ import annotations

import functools
from typing import Any

import sympy
import torch

from toycomp._torch_compat import (
    implied_by_guards,
    shape_env_of,
    sym_expr,
    symbol_order,
    symbol_range,
)
from toycomp.inductor import indexing

Size = int | sympy.Expr


def is_symbolic(value: Any) -> bool:
    """A SymInt / SymFloat / SymBool (PyTorch's symbolic numbers)."""
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


class SizeVars:
    """Translates one graph's SymInts into expressions over ``s0, s1, ...``.

    ``values`` (the graph's example inputs) name the ShapeEnv when a SymInt does not (AOT may
    hand its SymInt inputs over without one: the sizes of the fake tensors have it).
    """

    def __init__(self, values: list | None = None) -> None:
        self.renames: dict[sympy.Symbol, sympy.Symbol] = {}  # ShapeEnv symbol -> s<k>
        self.scalars: dict[sympy.Expr, sympy.Symbol] = {}  # a SymFloat's expression -> f<k>
        self.values = values or []

    @functools.cached_property
    def shape_env(self) -> Any:
        """The first ShapeEnv that a SymInt among ``values``' sizes and strides names, or None."""
        for v in self.values:
            for s in (*v.shape, *v.stride()) if isinstance(v, torch.Tensor) else (v,):
                if is_symbolic(s) and shape_env_of(s) is not None:
                    return shape_env_of(s)
        return None

    def expr(self, value: Any) -> Size:
        """An int or SymInt -> an int or an expression over toycomp's size symbols."""
        return self._symbolic_expr(value) if is_symbolic(value) else value  # dynamic shapes

    def _symbolic_expr(self, value: torch.SymInt | torch.SymFloat) -> Size:
        expr = sym_expr(value)
        if not isinstance(expr, sympy.Basic) or expr.is_number:
            return int(expr) if isinstance(value, torch.SymInt) else expr
        for symbol in expr.free_symbols:
            if symbol not in self.renames:
                shape_env = shape_env_of(value) or self.shape_env
                self.renames[symbol] = self._rename(shape_env, symbol)
        if isinstance(value, torch.SymFloat):  # computed by the wrapper: a kernel argument
            return self.scalars.setdefault(
                expr.xreplace(self.renames), indexing.scalar_symbol(len(self.scalars))
            )
        return to_toycomp(expr, self.renames, shape_env_of(value) or self.shape_env)

    def known_equal(self, a: Size, b: Size) -> bool:
        """``a == b`` by algebra, else under the guards ([Note: sizes equal under guards])."""
        return indexing.known_equal(a, b) or self._equal_under_guards(a, b)

    # [Note: sizes equal under guards]
    # The ShapeEnv knows the guards tracing recorded. A slice ``x[1::3]`` of a dimension ``s0``
    # has ``(s0 + 1) // 3`` rows, and the ShapeEnv may have specialised that to 1 under a guard:
    # the node's meta then says 1 where the lowering computed ``FloorDiv(s0 + 1, 3)``, and both
    # are right for every call the guards let through.
    def _equal_under_guards(self, a: Size, b: Size) -> bool:
        a, b = sympy.sympify(a), sympy.sympify(b)
        if self.shape_env is None or not (a.free_symbols | b.free_symbols):
            return False
        back = {toycomp: symbol for symbol, toycomp in self.renames.items()}
        return implied_by_guards(self.shape_env, sympy.Eq(a.xreplace(back), b.xreplace(back)))

    def same_sizes(self, a: tuple, b: tuple) -> bool:
        """Two shapes equal dimension by dimension (``known_equal``)."""
        return len(a) == len(b) and all(self.known_equal(m, n) for m, n in zip(a, b))

    def shape(self, t: torch.Tensor) -> tuple[Size, ...]:
        return tuple(self.expr(s) for s in t.shape)

    def stride(self, t: torch.Tensor) -> tuple[Size, ...]:
        return tuple(self.expr(s) for s in t.stride())

    def _rename(self, shape_env: Any, symbol: sympy.Symbol) -> sympy.Symbol:
        if shape_env is None:
            raise NotImplementedError(f"toycomp: size {symbol} belongs to no ShapeEnv")
        order, (lower, _) = symbol_order(shape_env, symbol), symbol_range(shape_env, symbol)
        if order < 0:
            raise NotImplementedError(f"toycomp: size {symbol} has no example value (unbacked)")
        if lower is None or lower < indexing.SIZE_SYMBOL_MIN:
            raise NotImplementedError(
                f"toycomp: size {symbol} may be smaller than {indexing.SIZE_SYMBOL_MIN} "
                "(toycomp needs sizes 0 and 1 specialised)"
            )
        return indexing.size_symbol(order)


def to_toycomp(
    expr: sympy.Expr, renames: dict[sympy.Symbol, sympy.Symbol], shape_env: Any = None
) -> sympy.Expr:
    """A ShapeEnv expression with its symbols renamed and PyTorch's integer functions
    (``FloorDiv``, ``ModularIndexing``, ``CleanDiv``, ``Mod``) spelled with toycomp's FloorDiv.
    A ``Max`` or ``Min`` of two sizes becomes the one that algebra, or else ``shape_env``'s
    guards, prove the larger (smaller); toycomp's sizes hold neither function."""
    if isinstance(expr, sympy.Symbol):
        return renames[expr]
    if not expr.args:
        return expr
    args = [to_toycomp(a, renames, shape_env) for a in expr.args]
    name = type(expr).__name__
    if name in ("FloorDiv", "CleanDiv"):
        return indexing.FloorDiv(*args)
    if name == "ModularIndexing":  # (base // divisor) % modulus
        base, divisor, modulus = args
        return _mod(indexing.FloorDiv(base, divisor), modulus)
    if name in ("Mod", "PythonMod"):
        return _mod(*args)
    if name in ("Max", "Min") and len(args) == 2:  # Max(1, s0 // 2): s0 // 2, as s0 >= 2
        a, b = args if name == "Max" else args[::-1]
        ours, theirs = (a, b), expr.args if name == "Max" else expr.args[::-1]
        for (x, y), (x_env, y_env) in ((ours, theirs), (ours[::-1], theirs[::-1])):
            if indexing.known_nonnegative(x - y) or (  # a contiguous stride Max(1, s0 // 4)
                shape_env is not None and implied_by_guards(shape_env, sympy.Ge(x_env, y_env))
            ):
                return x
    if isinstance(expr, (sympy.Add, sympy.Mul)) or (
        isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0
    ):
        return expr.func(*args)
    raise NotImplementedError(f"toycomp: symbolic size {expr} ({name} is not supported)")


def _mod(base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr:
    return base - divisor * indexing.FloorDiv(base, divisor)
