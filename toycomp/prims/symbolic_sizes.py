"""Stage 3b, symbolic sizes in a prims graph: SymInt arguments -> the FX nodes that compute them.

Input -> output: with dynamic shapes, a decomposition computes with SymInts (``x.shape[0] * 4``
is the SymInt ``4*s77``) and passes them to prims (``prims.reshape(x, [4*s77, 3])``). A graph
must compute such a number itself, from its inputs, so ``SymbolicSizes.node`` turns it into
nodes: a symbol is read from the input that has it as a size (``aten.sym_size.int(x, 0)``) or
is a SymInt input itself (Dynamo passes ``s77`` as a graph input); sums, products and floor
divisions become ``operator`` nodes, built once per expression::

    sym_size_int = torch.ops.aten.sym_size.int(x, 0)
    mul = sym_size_int * 4
    reshape = toycomp_prims_reshape(x, [mul, 3])

The ATen graph's own size computations (``sym_size``, ``operator.mul`` nodes) are evaluated on
the fake values while decomposing (``is_size_computation``), and rebuilt here where a prim
uses them, so the prims graph still runs on real tensors (``gm(*inputs)``).

NB: in PyTorch, make_fx records the same nodes as it traces with SymInts
(torch/fx/experimental/proxy_tensor.py, ``SymNode`` proxies), and Inductor computes the sizes
its kernels need from the inputs in its wrapper (torch/_inductor/codegen/wrapper.py,
``codegen_input_symbol_assignment``).
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import sympy
import torch
from torch import fx

from toycomp._torch_compat import OpOverload, fake_mode_of, sym_expr as symbolic_expr

aten = torch.ops.aten

# ATen ops that return a size, not a tensor (their results are SymInts).
SIZE_OPS = {
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
}
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_ARITHMETIC = {"Add": operator.add, "Mul": operator.mul, "FloorDiv": operator.floordiv}


# [Note: meta values with symbolic sizes]
# Decompositions compute result shapes by running prims on meta tensors. A plain meta tensor
# may have SymInt sizes, but many ops refuse them outside a fake mode ("SymIntArrayRef expected
# to contain only concrete integers"), so with dynamic shapes the pass runs inside the fake mode
# of the example inputs, whose ShapeEnv owns the symbols: the meta values are then fake tensors
# (on the meta device), and any relation a decomposition relies on (``s0 == s1`` while
# broadcasting) is recorded in that ShapeEnv as a guard. A static graph runs as before.
def symbolic_fake_mode(example_inputs: list) -> Any:
    """The fake mode of ``example_inputs`` if some size among them is symbolic, else a no-op."""
    symbolic = any(
        isinstance(v, _SYMBOLIC)
        or isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape)
        for v in example_inputs
    )
    tensors = [v for v in example_inputs if isinstance(v, torch.Tensor)]
    mode = fake_mode_of(tensors) if symbolic else None
    return mode if mode is not None else contextlib.nullcontext()


def is_size_computation(node: fx.Node) -> bool:
    """A node computing a number from sizes (``sym_size``, ``operator.mul`` on SymInts...)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    if node.target in SIZE_OPS:
        return True
    is_op = isinstance(node.target, OpOverload)
    return not is_op and isinstance(node.meta.get("val"), _SYMBOLIC + (int, float, bool))


class SymbolicSizes:
    """Finds or builds the node computing each SymInt that a prim receives."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.nodes: dict[sympy.Expr, tuple[fx.Node, Any]] = {}  # expr -> (node, its SymInt)
        self.tensors: list[tuple[fx.Node, torch.Tensor]] = []  # inputs to read sizes from

    def add_input(self, node: fx.Node, value: Any) -> None:
        """A placeholder: a tensor (its sizes may be symbols) or a SymInt (a symbol itself)."""
        if isinstance(value, torch.Tensor):
            self.tensors.append((node, value))
        elif isinstance(value, _SYMBOLIC):
            self.nodes.setdefault(symbolic_expr(value), (node, value))

    def node(self, value: Any) -> Any:
        """The node computing the SymInt ``value`` (a Python number when it is constant)."""
        expr = symbolic_expr(value)
        if not isinstance(expr, sympy.Basic) or expr.is_number:
            return _python_number(value, expr)
        return self._build(expr)[0]

    def _build(self, expr: sympy.Expr) -> tuple[Any, Any]:
        """(node or number, SymInt or number) for ``expr``, made once."""
        if expr.is_Integer:
            return int(expr), int(expr)
        if expr in self.nodes:
            return self.nodes[expr]
        if expr.is_Symbol:
            built = self._read_size(expr)
        else:
            built = self._arithmetic(expr)
        self.nodes[expr] = built
        return built

    def _arithmetic(self, expr: sympy.Expr) -> tuple[fx.Node, Any]:
        name = type(expr).__name__
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            operands, fn = [expr.base] * int(expr.exp), operator.mul
        elif name in _ARITHMETIC:
            operands, fn = list(expr.args), _ARITHMETIC[name]
        else:
            raise NotImplementedError(f"toycomp.decompositions: symbolic size {expr} ({name})")
        node, value = self._build(operands[0])
        for operand in operands[1:]:
            other_node, other_value = self._build(operand)
            value = fn(value, other_value)
            node = self._emit(fn, (node, other_node), value)
        return node, value

    def _read_size(self, symbol: sympy.Symbol) -> tuple[fx.Node, Any]:
        for getter, op in ((torch.Tensor.size, aten.sym_size.int),
                           (torch.Tensor.stride, aten.sym_stride.int)):  # fmt: skip
            for placeholder, t in self.tensors:
                for dim, size in enumerate(getter(t)):
                    if isinstance(size, torch.SymInt) and symbolic_expr(size) == symbol:
                        return self._emit(op, (placeholder, dim), size), size
        raise NotImplementedError(f"toycomp.decompositions: no graph input has the size {symbol}")

    def _emit(self, target: Any, args: tuple, value: Any) -> fx.Node:
        node = self.graph.create_node("call_function", target, args)
        node.meta["val"], node.meta["aten_origin"] = value, str(symbolic_expr(value))
        return node


def _python_number(value: Any, expr: Any) -> Any:
    if isinstance(value, torch.SymBool):
        return bool(expr)
    return int(expr) if isinstance(value, torch.SymInt) else float(expr)
