"""The compiled guard check agrees with the general path (toycomp/capture/guard_compiler.py)."""

import pytest
import torch
import torch.nn as nn

from toycomp.capture import guards as G
from toycomp.capture.tracer import capture

torch.manual_seed(0)
MODEL = nn.Linear(4, 3)


def slow_path(captured, args, kwargs):
    values = captured.current_values(args, kwargs)
    if values is None or G.first_failing(captured.guards, values) is not None:
        return None
    return [values[name] for name in captured.input_sources]


def same(a, b):
    return (a is None and b is None) or (
        a is not None and b is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b))
    )


x4 = torch.randn(4)
CASES = [
    (lambda x: x.sin(), (x4,)),
    (lambda x, n: x * n, (x4, 3)),
    (lambda x, y: x + y, (x4, x4)),  # the same tensor twice: an alias guard
    (lambda x: MODEL(x), (torch.randn(2, 4),)),  # lifted parameters, a module flag
]
CALLS = [
    lambda a: a,
    lambda a: tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in a),
    lambda a: tuple(t.double() if isinstance(t, torch.Tensor) else t for t in a),
    lambda a: tuple(torch.cat([t, t]) if isinstance(t, torch.Tensor) else t for t in a),
    lambda a: tuple(t.detach().requires_grad_() if isinstance(t, torch.Tensor) else t for t in a),
    lambda a: tuple(t + 1 if isinstance(t, int) else t for t in a),
    lambda a: tuple(float(t) if isinstance(t, int) else t for t in a),
    lambda a: a[:-1],
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_compiled_check_never_disagrees_with_the_general_path(case):
    fn, example = CASES[case]
    captured = capture(fn, *example)
    assert captured.fast_check is not None, "these simple signatures should compile"
    for make_call in CALLS:
        args = make_call(example)
        fast, slow = captured.fast_check(args, {}), slow_path(captured, args, {})
        assert same(fast, slow), (case, args, captured.fast_check.source)
        assert same(captured.guarded_inputs(args, {}), slow)


def test_module_flag_and_kwargs_fall_back_to_the_general_path():
    captured = capture(lambda x: MODEL(x), torch.randn(2, 4))
    inputs = torch.randn(2, 4)
    assert captured.fast_check((inputs,), {}) is not None
    MODEL.eval()
    try:
        assert captured.fast_check((inputs,), {}) is None  # the training flag guard fails
        assert captured.guarded_inputs((inputs,), {}) is None
    finally:
        MODEL.train()
    # keyword arguments are not compiled, but the general path still accepts them
    assert captured.fast_check((), {"x": inputs}) is None
    assert same(captured.guarded_inputs((), {"x": inputs}), slow_path(captured, (), {"x": inputs}))


def test_nested_arguments_keep_the_general_path():
    captured = capture(lambda pair: pair[0] + pair[1], (x4, x4 * 2))
    assert captured.fast_check is None
    assert captured.guarded_inputs(((x4, x4),), {}) is not None
