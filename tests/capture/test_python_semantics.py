"""Python semantics that the corpus (tests/capture/test_corpus.py) cannot see on its own:
how often a frame recompiles, and which breaks name the construct and the user's line."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

from toycomp.capture.convert_frame import CompileContext, explain


def _discarded_item(x):
    y = x * 2
    y.sum().item()  # the value is dropped: no guard on it
    return y + 1


def _two_discarded_values_in_a_loop_free_frame(x):
    y = x.cos()
    y.tolist()
    z = y.sin()
    z.max().item()
    return y * 2, z


@pytest.mark.parametrize("fn", [_discarded_item, _two_discarded_values_in_a_loop_free_frame])
def test_discarded_value_after_a_break_is_not_guarded(fn):
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    compiled = context.frame_for(fn)
    torch._dynamo.reset()
    counter = CompileCounter()
    dynamo = torch.compile(fn, backend=counter)
    for seed in range(4):
        x = torch.randn(3, generator=torch.Generator().manual_seed(seed))
        expected = fn(x)
        for got in (compiled(x), dynamo(x)):
            torch.testing.assert_close(got, expected)
    frames = [record.frame for record in context.log]
    assert len(frames) == counter.frame_count, (frames, counter.frame_count)


def _numpy_sum_of_tensor(x):
    y = x * 2
    s = y.numpy().sum()
    return y + float(s)


def test_numpy_on_a_tensor_breaks_naming_the_call_and_line():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = explain(_numpy_sum_of_tensor, torch.ones(3))
    reason = out.break_reasons[0]
    assert "NumPy ndarray.sum()" in reason and "s = y.numpy().sum()" in reason, reason
    torch.testing.assert_close(out.out, torch.ones(3) * 2 + 6)
    assert isinstance(np.asarray(out.out), np.ndarray)


def _numpy_function_of_tensor(x):
    return torch.from_numpy(np.cos(x.numpy())) + 1


def test_numpy_function_on_a_tensor_breaks_naming_it():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = explain(_numpy_function_of_tensor, torch.ones(3))
    assert "numpy.cos() on a tensor's data" in out.break_reasons[0], out.break_reasons
    torch.testing.assert_close(out.out, _numpy_function_of_tensor(torch.ones(3)))
