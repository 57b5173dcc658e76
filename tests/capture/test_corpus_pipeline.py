"""Corpus cases whose behaviour depends on the later stages too (gradients of inputs, which
outputs require grad, grad mode switched inside the graph): compiled by ``toycomp.compile``
through aot, prims and inductor (C++), and compared with eager as tests/capture/test_corpus.py
compares them."""

from __future__ import annotations

import pytest

import toycomp
from tests.capture.corpus import CASES
from tests.capture.test_corpus import FIELDS, assert_same, run

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PIPELINE_CASES = [
    "unused_input_keeps_grad_none", "input_used_only_without_grad_keeps_grad_none",
    "tensor_stored_on_an_object", "grad_mode_blocks_requires_grad",
    "enable_grad_inside_a_call_under_no_grad", "set_grad_enabled_as_a_call_outlives_the_frame",
    "break_inside_set_grad_enabled", "no_grad_block_reads_a_local",
    "named_tuple_across_a_break", "dict_views_see_later_inserts", "arange_of_product_of_sizes",
    "max_min_of_tensors", "lambda_alive_across_a_break",
    "numpy_array_of_a_tensor_returned_and_across_a_break",
]


@pytest.mark.parametrize("name", PIPELINE_CASES)
def test_pipeline_matches_eager(name):
    case = CASES[name]
    calls = case.calls()
    expected = run(case, case.fn, calls)
    got = run(case, toycomp.compile(case.fn, backend="cpp"), calls)
    for i, (e, g) in enumerate(zip(expected, got)):
        for field, ev, gv in zip(FIELDS, e, g):
            assert_same(ev, gv, f"{name}, call {i}, {field}")
