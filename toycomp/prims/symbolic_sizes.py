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

import toycomp.prims as prims
from toycomp._torch_compat import OpOverload, fake_mode_of, is_fake
from toycomp._torch_compat import sym_expr as symbolic_expr
from toycomp.symbolic_shapes import free_symbols, to_fx

aten = torch.ops.aten

# ATen ops that return a size, not a tensor (their results are SymInts).
SIZE_OPS = {
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
}
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


# [Note: meta values with symbolic sizes]
# Decompositions compute result shapes by running prims on meta tensors. A plain meta tensor
# may have SymInt sizes, but many ops refuse them outside a fake mode ("SymIntArrayRef expected
# to contain only concrete integers"), so with dynamic shapes the pass runs inside the fake mode
# of the example inputs, whose ShapeEnv owns the symbols: the meta values are then fake tensors
# (on the meta device), and any relation a decomposition relies on (``s0 == s1`` while
# broadcasting) is recorded in that ShapeEnv as a guard. A static graph runs as before.
def symbolic_fake_mode(example_inputs: list) -> Any:
    """The fake mode of ``example_inputs`` if some size among them is symbolic, else a no-op."""
    tensors = [v for v in example_inputs if isinstance(v, torch.Tensor)]
    mode = fake_mode_of(tensors) if free_symbols(list(example_inputs)) else None
    return mode if mode is not None else contextlib.nullcontext()


# With dynamic shapes (fake meta values), a pointwise prim's number operands become 0-d fake
# tensors of the operands' dtype, as the prim's reference would make them (its ``torch.tensor``
# would not be fake); a SymInt operand becomes 1 (the value does not matter for the shape, and
# reading it would specialise the size).
def numbers_as_fake(prim: Any, args: tuple) -> tuple:
    """``args`` with numbers as 0-d fake tensors when the tensors among them are fake."""
    operands = args[1:] if prim is prims.where else args  # where's numbers follow a or b
    tensors = [a for a in operands if isinstance(a, torch.Tensor)]
    if not any(is_fake(t) for t in tensors):
        return args
    return _numbers_as_tensors(args, tensors[0])


def _numbers_as_tensors(args: tuple, like: torch.Tensor) -> tuple:
    return tuple(
        torch.full((), 1 if isinstance(a, _SYMBOLIC) else a, dtype=like.dtype, device="meta")
        if isinstance(a, (bool, int, float) + _SYMBOLIC)
        else a
        for a in args
    )


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
        self.nodes: dict[sympy.Expr, fx.Node] = {}  # expression -> the node computing it
        self.tensors: list[tuple[fx.Node, torch.Tensor]] = []  # inputs to read sizes from

    def add_input(self, node: fx.Node, value: Any) -> None:
        """A placeholder: a tensor (its sizes may be symbols) or a SymInt (a symbol itself)."""
        if isinstance(value, torch.Tensor):
            self.tensors.append((node, value))
        elif isinstance(value, _SYMBOLIC):
            self.nodes.setdefault(symbolic_expr(value), node)

    def node(self, value: Any) -> Any:
        """The node computing the SymInt ``value`` (a Python number when it is constant):
        arithmetic nodes over the nodes that hold its symbols (``symbolic_shapes.to_fx``)."""
        expr = symbolic_expr(value)
        if not isinstance(expr, sympy.Basic) or expr.is_number:
            return _python_number(value, expr)
        if expr not in self.nodes:
            first_new = len(self.graph.nodes)
            self.nodes[expr] = to_fx(expr, self.graph, self._symbol_node)
            for node in list(self.graph.nodes)[first_new:]:
                node.meta.setdefault("aten_origin", str(symbolic_expr(node.meta["val"])))
        return self.nodes[expr]

    def _symbol_node(self, symbol: sympy.Symbol) -> fx.Node:
        if symbol not in self.nodes:
            self.nodes[symbol] = self._read_size(symbol)
        return self.nodes[symbol]

    def _read_size(self, symbol: sympy.Symbol) -> fx.Node:
        """``aten.sym_size.int(x, d)`` (or ``sym_stride``) of the first input holding it."""
        for getter, op in ((torch.Tensor.size, aten.sym_size.int),
                           (torch.Tensor.stride, aten.sym_stride.int)):  # fmt: skip
            for placeholder, t in self.tensors:
                for dim, size in enumerate(getter(t)):
                    if isinstance(size, torch.SymInt) and symbolic_expr(size) == symbol:
                        node = self.graph.create_node("call_function", op, (placeholder, dim))
                        node.meta["val"], node.meta["aten_origin"] = size, str(symbol)
                        return node
        raise NotImplementedError(f"toycomp.decompositions: no graph input has the size {symbol}")


def _python_number(value: Any, expr: Any) -> Any:
    if isinstance(value, torch.SymBool):
        return bool(expr)
    return int(expr) if isinstance(value, torch.SymInt) else float(expr)
