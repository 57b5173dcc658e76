"""Checks for notebook 03 (prims): the student's code against toycomp and PyTorch.

Each check takes what the exercise cell defined and prints a verdict (toycomp/exercises/checking.py):

1. ``check_result_dtype(result_dtype)``: ``torch.result_type``'s three tiers (tensors with dims,
   0-d tensors, Python numbers), against ``torch.result_type`` itself.
2. ``check_broadcast(broadcast)``: ATen's implicit broadcasting made explicit with
   ``prims.broadcast_in_dim``; the prims graph against toycomp's ``helpers.broadcast_to`` and the
   values against ``torch.broadcast_to``.
3. ``check_silu_backward(silu_backward)``: a decomposition of ``aten.silu_backward``, traced with
   toycomp's decomposition tracer (so the prims' contract is enforced), against the ATen op and
   PyTorch's own decomposition (torch/_decomp/decompositions.py).
4. ``check_softplus(softplus)``: a decomposition of ``aten.softplus`` (``beta``, ``threshold``),
   the same way.

Every decomposition is traced on :class:`~toycomp.prims.decompositions.Proxy` inputs, exactly as
``decompose`` calls the entries of ``DECOMPOSITIONS``, then the prims graph runs on real tensors.

NB: PyTorch's counterparts: torch/_prims_common/__init__.py (``elementwise_dtypes``),
torch/_refs/__init__.py (``_maybe_broadcast``), torch/_decomp/decompositions.py.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

import toycomp.prims as prims
from toycomp._torch_compat import aten_decomposition
from toycomp.exercises.checking import (call, exercise, expect, expect_close, expect_equal,
                                        hint_on_error)  # fmt: skip
from toycomp.prims import helpers
from toycomp.prims.decompositions import DecompTracer, Proxy
from toycomp.tensor_utils import to_meta

aten = torch.ops.aten


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 1.0):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale
    return t.to(dtype)


def trace_prims(fn: Callable, inputs: list[torch.Tensor], *consts: Any) -> fx.GraphModule:
    """The prims graph of ``fn(*proxies, *consts)``, traced as ``decompose`` traces a table
    entry: each tensor of ``inputs`` becomes a placeholder and a ``Proxy``."""
    graph = fx.Graph()
    tracer = DecompTracer(graph)
    proxies = [Proxy(graph.placeholder(f"a{i}"), to_meta(t), t.device)
               for i, t in enumerate(inputs)]  # fmt: skip
    with prims.tracing(tracer):
        out = fn(*proxies, *consts)
    if not isinstance(out, Proxy):
        raise TypeError(f"expected the result of prims, got {type(out).__name__}")
    graph.output(out.node)
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph)


def _targets(gm: fx.GraphModule) -> list[str]:
    return [getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
            if n.op == "call_function"]  # fmt: skip


def _proxy_hint(what: str) -> Callable[[BaseException], str]:
    """A hint for an exception raised while tracing the student's ``what`` on Proxy values."""

    def hint(error: BaseException) -> str:
        message = str(error)
        if "Proxy" in message:  # a torch or ATen function was given a Proxy
            return (f"the check traces {what} on Proxy values, which torch and ATen functions "
                    "refuse: write it with prims.* only (and toycomp.prims.helpers)")  # fmt: skip
        if message.startswith("expected the result of prims"):
            return f"{what} returns the value of its last prim (a Proxy while the check traces)"
        if "prims" in message or isinstance(error, (RuntimeError, ValueError)):
            return (f"a prim refused its arguments: each prim checks its contract (same shapes, "
                    f"same dtypes, valid dims); read its docstring in toycomp/prims/ and check "
                    f"what {what} passes it")  # fmt: skip
        return ""

    return hint


def _tolerances(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-3, "atol": 1e-3} if dtype in (torch.float16, torch.bfloat16) else {}


# -- 1. type promotion --------------------------------------------------------------------------
def _dtype_cases() -> list[tuple[str, tuple]]:
    t = lambda dtype, *shape: torch.zeros(shape, dtype=dtype)  # noqa: E731
    i64, i32, f16, f32 = torch.int64, torch.int32, torch.float16, torch.float32
    return [
        ("int64[4] + 0.5", (t(i64, 4), 0.5)),
        ("int32[4] + 2", (t(i32, 4), 2)),
        ("float16[4] + 2.5", (t(f16, 4), 2.5)),
        ("bool[4] + True", (t(torch.bool, 4), True)),
        ("bool[4] + 1", (t(torch.bool, 4), 1)),
        ("int32[4] + int64[4]", (t(i32, 4), t(i64, 4))),
        ("float16[4] + float32[] (0-d)", (t(f16, 4), t(f32))),
        ("uint8[4] + int64[] (0-d)", (t(torch.uint8, 4), t(i64))),
        ("int8[4] + float64[] (0-d)", (t(torch.int8, 4), t(torch.float64))),
        ("float32[] + 2 (both 0-d)", (t(f32), 2)),
        ("int32[] (0-d) + 2.5", (t(i32), 2.5)),
        ("3 + int16[2, 2]", (3, t(torch.int16, 2, 2))),
        ("bfloat16[2] + float16[2]", (t(torch.bfloat16, 2), t(f16, 2))),
    ]


@exercise("03", 1, "result_dtype", points=1)
def check_result_dtype(result_dtype: Callable) -> None:
    """``result_dtype(a, b) -> torch.dtype`` for tensors and Python numbers."""
    for name, operands in _dtype_cases():
        got = call(name, result_dtype, *operands)
        want = torch.result_type(*operands)
        hint = ("tiers: tensors with dims > 0-d tensors > Python numbers; a lower tier decides "
                "only when its category (bool < int < float) is higher")  # fmt: skip
        expect_equal(name, got, want, hint)
        expect_equal(name, got, helpers.result_type(*operands), "toycomp's helpers agree")


# -- 2. broadcast_in_dim ------------------------------------------------------------------------
@exercise("03", 2, "broadcast", points=1)
def check_broadcast(broadcast: Callable) -> None:
    """``broadcast(a, shape)``: ``a`` broadcast to ``shape`` with ``prims.broadcast_in_dim``."""
    cases = [([3], [2, 3]), ([2, 1], [2, 3]), ([], [4]), ([5, 1, 3], [2, 5, 4, 3]),
             ([4, 8], [4, 8]), ([1], [3, 1, 2])]  # fmt: skip
    for src, dst in cases:
        name = f"{src} -> {dst}"
        a = _randn(*src, seed=len(src))
        hint = ("shapes align on the right, as in NumPy: broadcast_dimensions[i] is the output "
                "dim that dim i of a becomes; a is returned as it is when the shapes agree")
        with hint_on_error(_broadcast_error_hint):
            gm = call(name, trace_prims, lambda p: broadcast(p, dst), [a])
        want_gm = trace_prims(lambda p: helpers.broadcast_to(p, dst), [a])
        got_calls = [(t, n.args[1:]) for t, n in zip(_targets(gm), _calls(gm))]
        want_calls = [(t, n.args[1:]) for t, n in zip(_targets(want_gm), _calls(want_gm))]
        expect_equal(name, got_calls, want_calls, hint)
        expect_close(name, gm(a), torch.broadcast_to(a, dst), hint)


def _broadcast_error_hint(error: BaseException) -> str:
    if "Proxy" in str(error):
        return _proxy_hint("broadcast")(error)
    return ("prims.broadcast_in_dim(a, shape, broadcast_dimensions): dim i of a becomes output "
            "dim broadcast_dimensions[i], whose size must equal a's (or a's be 1); shapes align "
            "on the right")  # fmt: skip


def _calls(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


# -- 3 and 4. decompositions --------------------------------------------------------------------
def _check_decomposition(name: str, fn: Callable, inputs: list[torch.Tensor], consts: tuple,
                         want: torch.Tensor, hint: str) -> fx.GraphModule:  # fmt: skip
    with hint_on_error(_proxy_hint("the decomposition")):
        gm = call(name, trace_prims, fn, inputs, *consts)
    not_prims = [t for t, n in zip(_targets(gm), _calls(gm)) if not prims.is_prim(n.target)]
    expect(not not_prims, name, "prims only", not_prims, "write the decomposition with prims.*")
    got = gm(*inputs)
    expect(got.dtype == want.dtype, name, want.dtype, got.dtype,
           "the result has the input's dtype: upcast computes float16 in float32, then convert "
           "the result back (helpers.convert)")  # fmt: skip
    expect_close(name, got, want, hint, **_tolerances(want.dtype))
    return gm


def _activation_inputs() -> list[tuple[str, torch.Tensor]]:
    return [
        ("f32[8]", _randn(8)),
        ("f32[4, 8]", _randn(4, 8, seed=1, scale=3.0)),
        ("f32[6], large values", torch.tensor([-100.0, -25.0, -5.0, 5.0, 25.0, 100.0])),
        ("f16[16]", _randn(16, dtype=torch.float16, seed=2, scale=4.0)),
        ("f64[5]", _randn(5, dtype=torch.float64, seed=3)),
    ]


@exercise("03", 3, "silu_backward", points=2)
def check_silu_backward(silu_backward: Callable) -> None:
    """``silu_backward(grad_output, a)`` with prims: the gradient of ``a * sigmoid(a)``."""
    pytorch = aten_decomposition(aten.silu_backward.default)
    for name, a in _activation_inputs():
        grad = _randn(*a.shape, dtype=a.dtype, seed=9)
        want = aten.silu_backward.default(grad, a)
        hint = ("d/da (a * sigmoid(a)) = sigmoid(a) * (1 + a * (1 - sigmoid(a))), "
                "with sigmoid(a) = 1 / (1 + exp(-a)); compute float16 in float32 (upcast)")
        _check_decomposition(name, silu_backward, [grad, a], (), want, hint)
        expect_close(name, pytorch(grad, a), want, "PyTorch's decomposition", **_tolerances(a.dtype))


@exercise("03", 4, "softplus", points=2)
def check_softplus(softplus: Callable) -> None:
    """``softplus(a, beta, threshold)`` with prims, like ``F.softplus``."""
    for beta, threshold in [(1.0, 20.0), (2.0, 20.0), (0.5, 1.0)]:
        for name, a in _activation_inputs():
            case = f"{name}, beta={beta}, threshold={threshold}"
            want = F.softplus(a, beta, threshold)
            hint = ("log1p(exp(beta * a)) / beta, but a itself where beta * a > threshold "
                    "(exp would overflow there)")  # fmt: skip
            _check_decomposition(case, softplus, [a], (beta, threshold), want, hint)
    reference = aten_decomposition(aten.softplus.default)
    a = _activation_inputs()[2][1]
    expect_close("PyTorch's decomposition", reference(a, 1.0, 20.0), F.softplus(a), "")


__all__ = ["check_broadcast", "check_result_dtype", "check_silu_backward", "check_softplus",
           "trace_prims"]  # fmt: skip
