"""The capture corpus: every function, compiled by toycomp/capture/convert_frame.py, behaves like
eager after each of several calls (outputs, gradients, Python state, printed text, mutated
inputs), and breaks into as many graphs as TorchDynamo does."""

from __future__ import annotations

import contextlib
import copy
import io
import random

import numpy as np
import pytest
import torch

from tests.capture.corpus import CASES, KW
from tests.capture.test_convert_frame import functional_backend
from toycomp.capture.convert_frame import compile_frame, explain

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def split(call):
    if call and isinstance(call[-1], KW):
        return list(call[:-1]), dict(call[-1])
    return list(call), {}


def snapshot(value):
    """A copy of a result that later calls cannot change (tensors cloned and detached, keeping
    whether they required grad)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v) for v in value) if not hasattr(value, "_fields") \
            else tuple(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, torch.nn.Module):
        return None
    if hasattr(value, "__dict__") and not isinstance(value, type):  # a user object: its state
        return type(value).__qualname__, snapshot(vars(value))
    return copy.deepcopy(value)


def run(case, fn, calls):
    """Call ``fn`` on fresh copies of each call's arguments; record what eager would show."""
    if case.reset:
        case.reset()
    records = []
    for i, call in enumerate(calls):
        args, kwargs = split(copy.deepcopy(call))
        if case.before:
            case.before(i)
        torch.manual_seed(i)
        random.seed(i)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            out = fn(*args, **kwargs)
        grads = None
        if case.grad:
            outs = out if isinstance(out, (tuple, list)) else [out]
            with torch.enable_grad():  # (a case may call fn under no_grad)
                sum(o.sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad
                    ).backward()
            grads = [a.grad for a in args if isinstance(a, torch.Tensor)]
            grads += [p.grad for p in _models().parameters()]
            _models().zero_grad()
        state = case.state() if case.state else None
        records.append(snapshot((out, printed.getvalue(), state, args, kwargs, grads)))
    return records


def _models():
    from tests.capture import corpus
    return torch.nn.ModuleList([corpus.MODEL, corpus.BLOCKS])


def assert_same(expected, got, where):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: expected a tensor, got {got!r}"
        assert got.dtype == expected.dtype and got.shape == expected.shape, where
        assert got.requires_grad == expected.requires_grad, f"{where}: requires_grad"
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=where)
    elif isinstance(expected, np.ndarray):
        assert type(got) is np.ndarray and got.dtype == expected.dtype, f"{where}: {got!r}"
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=where)
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected), f"{where}: {got!r}"
        for i, (e, g) in enumerate(zip(expected, got)):
            assert_same(e, g, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert list(got) == list(expected), f"{where}: keys {list(got)} != {list(expected)}"
        for k in expected:
            assert_same(expected[k], got[k], f"{where}[{k!r}]")
    else:
        assert type(got) is type(expected) and got == expected, f"{where}: {got!r} != {expected!r}"


FIELDS = ("output", "printed text", "Python state", "arguments after the call",
          "keyword arguments after the call", "gradients")


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager(name):
    case = CASES[name]
    calls = case.calls()
    expected = run(case, case.fn, calls)
    compiled = compile_frame(case.fn, functional_backend)
    got = run(case, compiled, calls)
    for i, (e, g) in enumerate(zip(expected, got)):
        for field, ev, gv in zip(FIELDS, e, g):
            assert_same(ev, gv, f"{name}, call {i}, {field}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_count_matches_dynamo(name):
    case = CASES[name]
    if case.dynamo_differs:
        pytest.skip(case.dynamo_differs)
    args, kwargs = split(case.calls()[0])
    if case.reset:
        case.reset()
    if case.before:
        case.before(0)
    with contextlib.redirect_stdout(io.StringIO()):
        ours = explain(case.fn, *copy.deepcopy(args), **copy.deepcopy(kwargs))
        torch._dynamo.reset()
        theirs = torch._dynamo.explain(case.fn)(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    if case.reset:
        case.reset()
    assert ours.graph_count == theirs.graph_count, (ours.break_reasons, theirs.break_reasons)
    if case.whole_frame:  # Dynamo compiles it with no break: so must toycomp
        assert not ours.break_reasons and not theirs.break_reasons, ours.break_reasons


def test_corpus_size():
    assert len(CASES) >= 40
