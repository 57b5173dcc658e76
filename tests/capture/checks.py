"""Shared checks of the capture tests: run a function through the capture and compare it with
eager (values) and with real Dynamo (graph and break counts)."""

from __future__ import annotations

import warnings

import torch

from toycomp.capture.convert_frame import CompileContext, summarize


def compile_and_run(fn, *args):
    """Run ``fn`` through the capture (graphs run as captured); (result, ExplainOutput)."""
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a frame that runs eagerly warns: fail on it
        out = context.frame_for(fn)(*args)
    return out, summarize(context, out)


def dynamo_counts(fn, *args) -> tuple[int, int]:
    """Real Dynamo's (graph count, graph break count) for ``fn(*args)``."""
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    return ex.graph_count, ex.graph_break_count


def check(fn, *args, graphs=1):
    """Same result as eager, ``graphs`` graphs (no more than Dynamo), no graph break."""
    expected = fn(*args)
    out, ex = compile_and_run(fn, *args)
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count == graphs <= dynamo_counts(fn, *args)[0], ex.break_reasons
    return expected, out
