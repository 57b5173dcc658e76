"""A stand-in for the few parts of torch that notebook 01's bytecode interpreter uses.

``python torch_standin.py ROOT`` runs under any Python from 3.10 on, with no torch installed: it
reads from stdin a JSON object ``{"cells": [...], "solution": "..."}`` (the notebook's interpreter
cells and exercise 1's solution cell, taken from the solved notebook by
tests/exercises/test_nb01_pythons.py), installs this stand-in as ``torch``, runs the cells, then
exercise 1's check from ``ROOT/toycomp/exercises/nb01.py`` on the reference and on wrong answers,
and prints what it saw as one JSON object.

The stand-in tensor is a list of floats; ``torch.fx`` is a list of nodes that a GraphModule runs
in order; the "fake" tensor of an input is a tensor of NaNs of its size (it has no data).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import operator
import random
import sys
import types
from pathlib import Path


class Tensor:
    """A 1-d float32 tensor: a list of floats with the operators the examples use."""

    dtype = "float32"

    def __init__(self, values):
        self.values = [float(v) for v in values]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.values),)

    def numel(self) -> int:
        return len(self.values)

    def all(self) -> bool:
        return all(self.values)

    def _map(self, other, op):
        others = other.values if isinstance(other, Tensor) else [other] * len(self.values)
        return Tensor(op(a, b) for a, b in zip(self.values, others))

    def __add__(self, other):
        return self._map(other, operator.add)

    def __sub__(self, other):
        return self._map(other, operator.sub)

    def __mul__(self, other):
        return self._map(other, operator.mul)

    def __pow__(self, other):
        return self._map(other, operator.pow)

    def __rsub__(self, other):
        return self._map(other, lambda a, b: b - a)

    __radd__, __rmul__ = __add__, __mul__

    def __neg__(self):
        return Tensor(-v for v in self.values)

    def __repr__(self) -> str:
        return f"tensor({[round(v, 4) for v in self.values]})"


def sin(t: Tensor) -> Tensor:
    return Tensor(map(math.sin, t.values))


def cos(t: Tensor) -> Tensor:
    return Tensor(map(math.cos, t.values))


def isclose(a: Tensor, b: Tensor, rtol: float, atol: float, equal_nan: bool = False) -> Tensor:
    def close(x, y):
        return (equal_nan and math.isnan(x) and math.isnan(y)) or abs(x - y) <= atol + rtol * abs(y)

    return Tensor(close(x, y) for x, y in zip(a.values, b.values))


class Generator:
    def manual_seed(self, seed: int) -> Generator:
        self.seed = seed
        return self


def randn(n: int, generator: Generator | None = None, dtype: str = "float32") -> Tensor:
    rng = random.Random(generator.seed if generator else 0)
    return Tensor(rng.gauss(0, 1) for _ in range(n))


class Node:
    def __init__(self, op: str, target, args: tuple, name: str):
        self.op, self.target, self.args, self.name, self.meta = op, target, args, name, {}


class Graph:
    def __init__(self):
        self.nodes: list[Node] = []

    def _add(self, op, target, args=()):
        self.nodes.append(Node(op, target, args, f"{op}_{len(self.nodes)}"))
        return self.nodes[-1]

    def placeholder(self, name):
        return self._add("placeholder", name)

    def call_function(self, fn, args):
        return self._add("call_function", fn, args)

    def output(self, value):
        return self._add("output", "output", (value,))


class GraphModule:
    """Runs its graph's nodes in order on real (stand-in) tensors."""

    def __init__(self, root, graph: Graph):
        self.graph = graph

    def __call__(self, *inputs):
        env, inputs = {}, list(inputs)

        def value(a):
            return env[a] if isinstance(a, Node) else a

        for node in self.graph.nodes:
            if node.op == "placeholder":
                env[node] = inputs.pop(0)
            elif node.op == "call_function":
                env[node] = node.target(*map(value, node.args))
            else:
                return value(node.args[0])


class FakeTensorMode(contextlib.nullcontext):
    def from_tensor(self, t: Tensor) -> Tensor:
        return Tensor([math.nan] * t.numel())


def install(root: Path) -> None:
    """Make ``import torch`` give this stand-in, and ``toycomp.exercises.*`` importable without
    running toycomp's ``__init__`` (which imports the whole compiler)."""
    torch = types.ModuleType("torch")
    torch.Tensor, torch.sin, torch.cos, torch.isclose = Tensor, sin, cos, isclose
    torch.randn, torch.Generator, torch.float32, torch.dtype = randn, Generator, "float32", str
    torch.fx = types.SimpleNamespace(Graph=Graph, Node=Node, GraphModule=GraphModule)
    torch.nn = types.SimpleNamespace(Module=object)
    sys.modules["torch"] = torch
    for name, folder in [("toycomp", "toycomp"), ("toycomp.exercises", "toycomp/exercises")]:
        package = types.ModuleType(name)
        package.__path__ = [str(root / folder)]
        sys.modules[name] = package
    compat = types.ModuleType("toycomp._torch_compat")
    compat.fake_tensor_mode = FakeTensorMode
    sys.modules["toycomp._torch_compat"] = compat


def f(x):  # the running example
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def branchy(x):
    if x:
        return torch.sin(x)
    return x


def main() -> None:
    install(Path(sys.argv[1]))
    global torch
    import torch

    from toycomp.exercises import nb01

    given = json.load(sys.stdin)
    ns = {"dis": __import__("dis"), "operator": operator, "sys": sys, "torch": torch}
    for cell in given["cells"]:
        exec(compile(cell, "<notebook 01 cell>", "exec"), ns)
    x, x2 = randn(6, Generator().manual_seed(0)), randn(6, Generator().manual_seed(1))
    gm = ns["trace_bytecode"](f, x)
    fake_output = gm.graph.nodes[-1].args[0].meta["val"]
    report = {
        "python": list(sys.version_info[:2]),
        "ops": [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"],
        "graph_matches_eager": isclose(gm(x2), f(x2), 1e-6, 1e-6).all(),
        "fake_output_has_no_data": all(map(math.isnan, fake_output.values)),
    }
    try:
        ns["trace_bytecode"](branchy, x)
    except NotImplementedError as e:
        report["unsupported"] = str(e)
    exec(compile(given["solution"], "<exercise 1 solution>", "exec"), ns)
    handlers, verdicts = ns["HANDLERS"], {}
    answers = {
        "reference": ns["unary_negative"],
        "stub": lambda frame, inst: (_ for _ in ()).throw(NotImplementedError()),
        "drops the minus": lambda frame, inst: None,  # the operand stays on the stack unchanged
        "negates twice": lambda frame, inst: frame.stack.append(
            frame.call(operator.neg, [frame.call(operator.neg, [frame.stack.pop()])])),
    }  # fmt: skip
    for name, handler in answers.items():
        handlers["UNARY_NEGATIVE"] = handler
        with contextlib.redirect_stdout(io.StringIO()):
            verdict = nb01.check_unary_negative(ns["trace_bytecode"])
        verdicts[name] = [verdict.status, verdict.text]
    report["verdicts"] = verdicts
    print(json.dumps(report))


if __name__ == "__main__":
    main()
