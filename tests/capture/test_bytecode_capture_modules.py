"""Unit tests of the bytecode capture's modules: sources, guards, the interpreter, resume
functions and the transformed function's text; plus every module's docstring examples."""

from __future__ import annotations

import dis
import doctest
import importlib
import operator

import pytest
import torch

from toycomp.capture.convert_frame import compile_frame, explain
from toycomp.capture.guard_builder import GuardBuilder
from toycomp.capture.output_graph import OutputGraph
from toycomp.capture.resume_execution import make_resume_function
from toycomp.capture.sources import AttrSource, GetItemSource, LocalSource
from toycomp.capture.symbolic_convert import BreakRequest, InstructionTranslator

MODULES = [
    "toycomp.capture.sources", "toycomp.capture.guard_builder", "toycomp.capture.guard_check",
    "toycomp.capture.instructions",
    "toycomp.capture.instructions_containers", "toycomp.capture.instructions_flow",
    "toycomp.capture.symbolic_convert", "toycomp.capture.output_graph",
    "toycomp.capture.side_effects_replay", "toycomp.capture.codegen",
    "toycomp.capture.resume_execution", "toycomp.capture.transformed_code",
    "toycomp.capture.convert_frame", "toycomp.capture.variables.base",
    "toycomp.capture.variables.lists", "toycomp.capture.variables.functions",
    "toycomp.capture.variables.builtin", "toycomp.capture.variables.builder",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(importlib.import_module(name), optionflags=flags, report=False)
    assert result.failed == 0


def test_sources_render_for_guards_and_for_code():
    s = GetItemSource(AttrSource(LocalSource("m"), "_modules"), "0")
    assert s.name() == "L['m']._modules['0']"
    assert s.code() == "m._modules['0']"
    assert s.read({"m": torch.nn.Sequential(torch.nn.ReLU())}, {}).__class__ is torch.nn.ReLU


def test_guards_reject_the_wrong_type_and_name_the_failure():
    b = GuardBuilder()
    b.constant_match(LocalSource("flag"), True)
    b.tensor_match(LocalSource("x"), torch.ones(2))
    check = b.compile()
    assert check({"flag": True, "x": torch.zeros(2)}, {})
    assert not check({"flag": 1, "x": torch.zeros(2)}, {})  # 1 == True, but not the same
    assert check.failing_guard({"flag": True, "x": torch.zeros(3)}, {}) == "L['x'].shape == (2,)"
    assert not check({"flag": True}, {})  # a missing argument fails, it does not raise


def trace(fn, **frame_locals):
    out = OutputGraph(fn, fn.__globals__)
    tx = InstructionTranslator(fn, frame_locals, out)
    tx.run()
    return tx, out


def test_graph_is_torch_level():
    def f(x):
        return torch.sin(x).add(1) * 2

    tx, out = trace(f, x=torch.ones(3))
    calls = [(n.op, n.target) for n in out.graph.nodes if n.op.startswith("call")]
    assert calls == [("call_function", torch.sin), ("call_method", "add"),
                     ("call_function", operator.mul)]
    assert all(f", line {f.__code__.co_firstlineno + 1}, in f" in n.meta["stack_trace"]
               for n in out.graph.nodes if n.op.startswith("call"))


def test_break_request_names_the_step_and_reason():
    def f(x):
        y = x + 1
        return y.item()

    with pytest.raises(BreakRequest) as info:
        trace(f, x=torch.ones(()))
    assert "item" in info.value.reason
    assert info.value.location[1] == f.__code__.co_firstlineno + 2


def test_resume_function_continues_mid_loop():
    def f(x, n):
        y = x + 1
        for i in range(n):
            y = y * 2 + i
        return y

    insts = [i for i in dis.get_instructions(f) if i.opname != "EXTENDED_ARG"]
    store_i = next(i for i in insts if i.opname == "STORE_FAST" and i.argval == "i")
    # at STORE_FAST i the stack is [iterator, next value]
    resume = make_resume_function(f, store_i.offset, [False, False], ["x", "n", "y"])
    assert resume(iter(range(1, 3)), 0, 5, 3, 5) == f(4, 3)
    assert resume.__code__.co_varnames[:5] == ("__stack0", "__stack1", "x", "n", "y")


LOG = []


def test_transformed_code_is_readable_python():
    def f(x):
        y = x.sin()
        LOG.append(len(LOG))
        print("between graphs")
        return y.cos()

    report = explain(f, torch.ones(2))
    text = report.transformed_code[0]
    assert text.startswith("def __transformed_f(x):")
    for piece in ("__compiled_fn_0(x)", "G['LOG'].append(", "# graph break at",
                  "__result = __callee(__arg0)", "return __resume_at_"):
        assert piece in text, text
    assert report.graph_count == 2


def test_break_inside_helper_captures_the_helper_as_its_own_frame():
    def helper(y):
        z = y * 3
        print("in helper")
        return z + 1

    def f(x):
        return helper(x.sin()).cos()

    report = explain(f, torch.ones(2))
    frames = [t.splitlines()[0] for t in report.transformed_code]
    assert frames[0] == "def __transformed_f(x):"
    assert "__compile_frame(__callee)" in report.transformed_code[0]
    assert "def __transformed_helper(y):" in frames
    assert torch.allclose(report.out, f(torch.ones(2)))


def test_multihead_attention_is_one_graph():
    # nn.MultiheadAttention.forward reads ``query.is_nested`` and asks ``all(... for x in
    # tensor_args)``: both are answered while tracing, so a transformer layer is not broken up
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    report = explain(lambda x: attention(x, x, x, need_weights=False)[0], x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons


def test_a_generator_that_outlives_the_trace_runs_eagerly_and_says_why():
    def f(x):
        return (x * i for i in range(3))
    x = torch.randn(3)
    report = explain(f, x)
    assert "generator" in str(report)
    assert [v.tolist() for v in compile_frame(f, lambda gm, ex: gm)(x)] == \
        [v.tolist() for v in f(x)]


def test_tracing_state_questions_have_dynamos_answers():
    from torch.nn.modules.activation import _is_make_fx_tracing

    def f(x):
        asked = (torch.jit.is_scripting(), torch.compiler.is_compiling(), _is_make_fx_tracing())
        return x * 2, asked
    report = explain(f, torch.randn(3))
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    assert compile_frame(f, lambda gm, ex: gm)(torch.randn(3))[1] == (False, True, True)


class _CountingModule(torch.nn.Module):
    reads = 0

    def __getattr__(self, name):
        _CountingModule.reads += 1
        return super().__getattr__(name)


class _Block(_CountingModule):
    def __init__(self):
        super().__init__()
        self.lin, self.scale = torch.nn.Linear(4, 4), 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


class _Net(_CountingModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(_Block(), _Block())

    def forward(self, x):
        return self.body(x)


def test_guards_read_each_module_attribute_once():
    # [Note: guards name shared prefixes]: .body is read once, not once per line under it
    net, x = _Net(), torch.randn(2, 4)
    compiled = compile_frame(net.forward, lambda gm, ex: gm)
    compiled(x)
    check = compiled.entries[0].check
    _CountingModule.reads = 0
    assert check({"self": net, "x": x}, {})
    assert _CountingModule.reads == 3  # body, and each block's lin
    net.body[1].scale = 3.0
    assert not check({"self": net, "x": x}, {})
    assert check.failing_guard({"self": net, "x": x}, {}) == \
        "L['self'].body._modules['1'].scale == 2.0"


def test_graph_inputs_read_each_module_attribute_once():
    net, x = _Net(), torch.randn(2, 4)
    compiled = compile_frame(net.forward, lambda gm, ex: gm)
    want = net(x)
    compiled(x)
    _CountingModule.reads = 0
    torch.testing.assert_close(compiled(x), want)
    assert _CountingModule.reads == 6  # the guards', then the inputs': body and each lin
    assert "__path0 = self.body" in compiled.entries[0].transformed.source
