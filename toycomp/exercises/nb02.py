"""Checks for notebook 02 (AOTAutograd): the student's code against toycomp and PyTorch.

Each check takes what the exercise cell defined and prints a verdict (toycomp/exercises/checking.py):

1. ``check_tanh_joint(tanh_joint)``: the joint graph of ``tanh`` written by hand with ATen ops;
   values and gradients against eager autograd, and the forward's result reused by the backward
   (one ``aten.tanh``), as in toycomp's ``trace_joint(torch.tanh)``.
2. ``check_naive_partition(naive_partition)``: a default partitioner; the saved values against
   toycomp's ``default_partition``, forward and backward values against eager autograd.
3. ``check_size_of(size_of)``: the bytes a node's value occupies, against
   ``torch._functorch.partitioners._size_of`` (what PyTorch's min cut weighs a node by).
4. ``check_functionalize(functionalize_inplace)``: an FX pass that rewrites in-place ATen ops
   into out-of-place ones; values against eager, ops against PyTorch's ``torch.func.functionalize``.

NB: PyTorch's counterparts: torch/_functorch/partitioners.py (``default_partition``,
``_size_of``), torch/_subclasses/functional_tensor.py (functionalisation).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

from toycomp._torch_compat import OpOverload, make_fx, partitioner_size_of
from toycomp.aot.aot_autograd import trace_forward, trace_joint
from toycomp.aot.partitioners import default_partition
from toycomp.exercises.checking import Text, call, exercise, expect, expect_close, expect_equal

aten = torch.ops.aten


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _ops(gm: fx.GraphModule) -> Counter:
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


# -- 1. the joint graph of tanh ------------------------------------------------------------------
@exercise("02", 1, "tanh_joint", points=1)
def check_tanh_joint(tanh_joint: Callable) -> None:
    """``tanh_joint(primals_1, tangents_1) -> (tanh(x), gradient)`` with ATen ops."""
    cases = [("f32[5]", _randn(5)), ("f32[3, 4]", _randn(3, 4, seed=1)),
             ("f64[6]", _randn(6, dtype=torch.float64, seed=2))]  # fmt: skip
    for name, x in cases:
        tangent = _randn(*x.shape, dtype=x.dtype, seed=7)
        got = call(name, tanh_joint, x, tangent)
        expect(isinstance(got, (tuple, list)) and len(got) == 2, name, "(output, gradient)",
               got, "return a pair: tanh(primals_1) and the gradient")  # fmt: skip
        leaf = x.clone().requires_grad_(True)
        out = torch.tanh(leaf)
        (grad,) = torch.autograd.grad(out, leaf, tangent)
        expect_close(name, got[0], out.detach(), "the first output is tanh(primals_1)")
        expect_close(name, got[1], grad, "d tanh(x)/dx = 1 - tanh(x)**2, times the tangent")
    x, tangent = cases[0][1], _randn(5, seed=7)
    graph = call("f32[5]", trace_forward, tanh_joint, [x, tangent])
    reference = trace_joint(torch.tanh, [x.clone().requires_grad_(True)])
    want, got = (_ops(gm)["aten.tanh.default"] for gm in (reference, graph))
    expect(got == want, "f32[5]", Text(f"{want} aten.tanh, as in toycomp's trace_joint"),
           Text(f"{got} aten.tanh"), "the backward reuses tanh's *result*: TanhBackward0 saves "
           "it, so the joint graph computes tanh once")  # fmt: skip


# -- 2. a default partitioner ---------------------------------------------------------------------
def _partition_cases() -> list[tuple[str, Callable, list[torch.Tensor]]]:
    x = _randn(16).requires_grad_(True)
    w = _randn(8, 4, seed=3).requires_grad_(True)
    a = _randn(5, 8, seed=4)  # needs no gradient: its gradient output is None
    return [
        ("sin**2 + cos**2", lambda t: torch.sin(t) ** 2 + torch.cos(t) ** 2, [x]),
        ("tanh", torch.tanh, [x]),
        ("a @ w, then gelu", lambda a, w: F.gelu(a @ w).sum(0), [a, w]),
        ("two outputs", lambda t: (t.exp(), t.cos() * 3), [x]),
    ]


@exercise("02", 2, "naive_partition", points=2)
def check_naive_partition(naive_partition: Callable) -> None:
    """``naive_partition(joint) -> (forward, backward, saved_names)``."""
    for name, fn, inputs in _partition_cases():
        joint = trace_joint(fn, inputs)
        got = call(name, naive_partition, copy.deepcopy(joint))
        expect(isinstance(got, tuple) and len(got) == 3, name, "(forward, backward, saved)",
               got, "return the two GraphModules and the list of saved names")  # fmt: skip
        forward, backward, saved = got
        _, _, want = default_partition(joint)
        # Any order of the saved values is right, as long as the forward returns them and the
        # backward takes them in that order (_check_runs runs the pair).
        expect(sorted(saved) == sorted(want), name, sorted(want), sorted(saved),
               _saved_hint(saved, want))  # fmt: skip
        _check_runs(name, fn, inputs, joint, call(name, forward, *inputs), backward, len(want))


def _saved_hint(saved: list[str], want: list[str]) -> str:
    missing = [n for n in want if n not in saved]
    extra = [n for n in saved if n not in want]
    if not missing and not extra:
        return "save each value once"
    if missing:
        return (f"the backward also reads {missing} from the forward: walk back from the "
                "gradients to the first forward nodes you meet, and save those")  # fmt: skip
    return (f"the backward never reads {extra} directly (it reads what was computed from them): "
            "stop walking back at the first forward node")  # fmt: skip


def _check_runs(name, fn, inputs, joint, fw_out, backward, n_saved) -> None:
    """forward(*primals) -> outputs + saved; backward(*saved, *tangents) -> the gradients."""
    n_fwd = joint.meta["num_fwd_outputs"]
    outputs, saved = fw_out[:n_fwd], fw_out[n_fwd:]
    expect_equal(name, len(saved), n_saved, "the forward returns its outputs, then the saved values")
    leaves = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
    eager = fn(*leaves)
    eager = eager if isinstance(eager, tuple) else (eager,)
    for got, want in zip(outputs, eager):
        expect_close(name, got, want.detach(), "the forward graph returns fn's outputs first")
    tangents = [torch.ones_like(o) for o in eager]
    wrt = [t for t in leaves if t.requires_grad]
    want_grads = torch.autograd.grad(eager, wrt, tangents)
    got_grads = call(name, backward, *saved, *tangents)
    expect_equal(name, len(got_grads), len(want_grads), "one gradient per input that needs one")
    for got, want in zip(got_grads, want_grads):
        expect_close(name, got, want, "backward(*saved, *tangents) returns the gradients")


# -- 3. the size of a saved value -----------------------------------------------------------------
def _size_cases() -> list[tuple[str, fx.Node]]:
    torch.manual_seed(0)
    w1, b1, w2, b2 = _randn(16, 8, seed=1), _randn(16), _randn(4, 16, seed=2), _randn(4)
    params = [p.requires_grad_(True) for p in (w1, b1, w2, b2)]
    batch, targets = _randn(6, 8, seed=3), torch.arange(6) % 4

    def mlp(x, y, w1, b1, w2, b2):
        return F.cross_entropy(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2), y)

    forward, _, _ = default_partition(trace_joint(mlp, [batch, targets, *params]))
    half = trace_forward(lambda t: (t.half() * 2).sum(), [_randn(3, 5)])
    mask = trace_forward(lambda t: torch.where(t > 0, t, 0.0), [_randn(7)])
    graphs = [("mlp forward", forward), ("half", half), ("mask", mask)]
    return [(f"{g}: {n.name}", n) for g, gm in graphs for n in gm.graph.nodes if "val" in n.meta]


@exercise("02", 3, "size_of", points=1)
def check_size_of(size_of: Callable) -> None:
    """``size_of(node) -> int``: bytes of ``node.meta["val"]`` (tensor, tuple of them, other)."""
    for name, node in _size_cases():
        got = call(name, size_of, node)
        want = partitioner_size_of(node)
        val = node.meta["val"]
        what = type(val).__name__ if not isinstance(val, torch.Tensor) else (
            f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}")  # fmt: skip
        hint = (f"meta['val'] is {what}: numel() * element_size() per tensor "
                "(a tuple: the sum over its tensors; anything else: 0)")  # fmt: skip
        expect_equal(name, got, want, hint)


# -- 4. functionalising in-place ops --------------------------------------------------------------
def _inplace_programs() -> list[tuple[str, Callable]]:
    def scale_(x):
        y = aten.cos.default(x)
        aten.mul_.Tensor(y, 2)
        return aten.add.Tensor(y, aten.sin.default(x))

    def read_before(x):
        y = aten.exp.default(x)
        before = aten.mul.Tensor(y, 2)
        aten.sub_.Tensor(y, 1)
        return aten.add.Tensor(before, y)

    def chained(x):
        y = aten.mul.Tensor(x, 3)
        aten.add_.Tensor(y, 1)
        z = aten.relu_.default(y)
        return aten.mul.Tensor(z, y)

    def two_tensors(x):
        y, z = aten.sin.default(x), aten.cos.default(x)
        aten.mul_.Tensor(y, z)
        aten.add_.Tensor(z, y)
        return aten.sub.Tensor(y, z)

    return [("scale_", scale_), ("read_before", read_before), ("chained", chained),
            ("two_tensors", two_tensors)]  # fmt: skip


def _is_inplace(target) -> bool:
    return isinstance(target, OpOverload) and target.name().split(".")[0].endswith("_")


@exercise("02", 4, "functionalize_inplace", points=2)
def check_functionalize(functionalize_inplace: Callable) -> None:
    """``functionalize_inplace(gm) -> GraphModule`` with no in-place ATen op left."""
    x = _randn(10)
    for name, fn in _inplace_programs():
        gm = fx.symbolic_trace(fn)
        got = call(name, functionalize_inplace, gm)
        expect(isinstance(got, fx.GraphModule), name, "a GraphModule", type(got).__name__,
               "return fx.GraphModule(gm, graph)")  # fmt: skip
        left = [str(n.target) for n in got.graph.nodes if _is_inplace(n.target)]
        expect(not left, name, "no in-place op", left,
               "replace each aten.X_ node by a call of aten.X with the same arguments")
        expect_close(name, call(name, got, x.clone()), fn(x.clone()),
                     "uses *after* an in-place op read the new value: point them at the new node;"
                     " uses before it keep the old one")  # fmt: skip
        pytorch = make_fx(torch.func.functionalize(fn), x.clone())
        expect_equal(name, _ops(got), _ops(pytorch), "the same ATen ops as torch.func.functionalize")

