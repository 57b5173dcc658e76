"""convert_frame: the cache of guarded entries, recompiles, and the regressions of issue 7's
"silently wrong" list (each compared with eager after several calls)."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from toycomp.capture.convert_frame import compile_frame, explain


def backend(gm, example_inputs):
    return gm.forward


class Holder:
    pass


HOLDER = Holder()
HOLDER.t = torch.ones(3)
GLOBAL_LIST = [1.0, 2.0]


def test_object_attribute_holding_a_tensor_that_is_replaced():
    def f(x):
        return x + HOLDER.t

    cf = compile_frame(f, backend)
    assert torch.equal(cf(torch.zeros(3)), torch.ones(3))
    HOLDER.t = torch.full((3,), 5.0)
    assert torch.equal(cf(torch.zeros(3)), torch.full((3,), 5.0))


def test_contents_of_a_global_list_are_guarded():
    def f(x):
        return x * GLOBAL_LIST[1]

    cf = compile_frame(f, backend)
    assert cf(torch.ones(1)).item() == 2.0
    GLOBAL_LIST[1] = 7.0
    assert cf(torch.ones(1)).item() == 7.0
    GLOBAL_LIST[1] = 2.0


def test_random_random_is_drawn_on_every_call():
    def f(x):
        return x * random.random()

    cf = compile_frame(f, backend)
    random.seed(0)
    values = {cf(torch.ones(1)).item() for _ in range(3)}
    assert len(values) == 3


def test_autocast_state_outside_is_guarded():
    def f(x):
        return x @ x

    cf = compile_frame(f, backend)
    x = torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cf(x).dtype == torch.bfloat16
    assert cf(x).dtype == torch.float32
    assert len(cf.entries) == 2


def test_grad_mode_outside_is_guarded():
    def f(x):
        return x * 2

    cf = compile_frame(f, backend)
    x = torch.ones(2, requires_grad=True)
    assert cf(x).requires_grad
    with torch.no_grad():
        assert not cf(x).requires_grad


def test_recompile_limit_warns_with_the_failing_guard_and_keeps_entries():
    calls = []

    def counting_backend(gm, example_inputs):
        calls.append(1)
        return gm.forward

    def f(x, n):
        return x * n

    cf = compile_frame(f, counting_backend, recompile_limit=2)
    x = torch.ones(1)
    cf(x, 1), cf(x, 2)
    with pytest.warns(UserWarning, match=r"L\['n'\] == 2"):
        assert cf(x, 3).item() == 3.0  # eager
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cf(x, 1).item() == 1.0  # the first entry still serves
    assert len(calls) == 2


def test_entries_hold_no_real_tensors():
    def f(x):
        return x.sin()

    cf = compile_frame(f, backend)
    cf(torch.ones(3))
    entry = cf.entries[0]
    examples = entry.transformed.example_inputs
    assert all(type(t).__name__ == "FakeTensor" for t in examples)


class CountRealOps(TorchDispatchMode):
    """Counts the ATen ops that run on real (non-fake) tensors."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in (*args, out) if isinstance(a, torch.Tensor)]
        if not any(type(t).__name__ == "FakeTensor" for t in tensors):
            self.ops.append(str(func))
        return out


def test_compiling_does_no_computation_on_real_tensors():
    def f(x, w):
        y = torch.relu(x @ w)
        return (y * torch.randn(3)).sum()

    compiled_ops, rng_at_run = [], []

    def recording_backend(gm, example_inputs):
        def run(*args):
            rng_at_run.append(torch.get_rng_state())
            compiled_ops.append(len(mode.ops))
            out = gm.forward(*args)
            compiled_ops.append(len(mode.ops))
            return out
        return run

    cf = compile_frame(f, recording_backend)
    torch.manual_seed(0)
    x, w = torch.randn(2, 3), torch.randn(3, 3)
    state = torch.get_rng_state()
    with CountRealOps() as mode:
        cf(x, w)
    before, after = compiled_ops
    assert before == 0, mode.ops[:before]  # nothing ran on real tensors while compiling
    assert after == len(mode.ops)  # every later op ran inside the compiled graph
    assert any("mm" in op for op in mode.ops[before:after])
    assert torch.equal(rng_at_run[0], state)  # compiling drew no random numbers


def test_explain_works_on_meta_tensors():
    def f(x):
        y = x.sin()
        print("shape", y.shape)
        return y.cos()

    report = explain(f, torch.empty(3, device="meta"))
    assert (report.graph_count, report.graph_break_count) == (2, 1)
    assert "print() is a graph break" in report.break_reasons[0]
    assert "test_convert_frame.py:" in report.break_reasons[0]


def test_unsupported_opcode_breaks_with_its_name():
    def f(x):
        try:
            return x + 1
        except ValueError:
            return x

    report = explain(f, torch.ones(1))
    assert report.out.item() == 2.0
    assert report.graph_count == 1 or "frame skipped" in report.break_reasons[0]


def test_a_break_inside_autocast_leaves_no_autocast_behind():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            print("inside autocast")
        return y

    x = torch.randn(3, 3)
    out = compile_frame(f, backend)(x)
    assert out.dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu")


def test_module_with_hooks_still_runs_its_hooks():
    seen = []
    lin = torch.nn.Linear(2, 2)
    lin.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))

    def f(x):
        return lin(x) * 2

    cf = compile_frame(f, backend)
    torch.testing.assert_close(cf(torch.ones(1, 2)), f(torch.ones(1, 2)))
    assert len(seen) == 2


def test_attribute_chain_tensors_are_read_once_in_the_check():
    import warnings

    lin = torch.nn.Linear(3, 2)

    def f(x):
        return lin(x)

    cf = compile_frame(f, lambda gm, example_inputs: gm.forward, recompile_limit=1)
    cf(torch.ones(1, 3))
    source = cf.entries[0].check.source
    # (lin: a cell) its parameters are read once, into one call ([Note: tensor guards in one
    # call]), each commented with what it must be
    assert "._parameters)['weight'],  # Parameter (2, 3) float32 cpu requires_grad" in source
    assert source.count("check_tensors(") == 1
    lin.weight = torch.nn.Parameter(torch.ones(2, 3).t().contiguous().t())  # other strides
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(cf(torch.ones(1, 3)), f(torch.ones(1, 3)))
    assert ".weight.stride() == (3, 1)`" in str(caught[0].message)  # t0 named by its source
    assert "t0" not in str(caught[0].message)


def test_a_break_inside_autocast_compiles_both_sides_and_reenters_it():
    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ x
            print("inside autocast")
            z = y @ x
        return z

    x = torch.randn(3, 3)
    report = explain(f, x)
    assert report.graph_count == 2  # (before: the frame was skipped, 0 graphs)
    assert "with torch.autocast('cpu', torch.bfloat16, True, True):" in report.transformed_code[0]
    assert "_exit_autocast" in report.graphs[0].code  # the graph leaves the region at its end
    assert "_enter_autocast" in report.graphs[1].code  # the resume function re-enters it
    assert report.out.dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu")
    torch.testing.assert_close(report.out, f(x))


def test_an_exception_after_a_break_inside_no_grad_restores_grad_mode():
    def f(x):
        with torch.no_grad():
            y = x * 2
            print("before raising")
            raise ValueError(f"boom {y.shape[0]}")

    cf = compile_frame(f, backend)
    for _ in range(2):
        with pytest.raises(ValueError, match="boom 3"):
            cf(torch.ones(3, requires_grad=True))
        assert torch.is_grad_enabled()


def test_a_break_inside_a_try_block_compiles_up_to_the_try():
    def f(x):
        y = x.sin()
        z = y.cos()
        try:
            w = z + torch.ones(4)  # a shape error, caught below
        except RuntimeError:
            print("caught")
            w = z * 2
        return w

    x = torch.randn(3)
    report = explain(f, x)
    assert report.graph_count == 1  # sin, cos: the try block runs eagerly, as in Dynamo
    assert "inside a try block" in report.break_reasons[0]
    torch.testing.assert_close(report.out, f(x))


def test_an_unsupported_opcode_is_a_break_that_names_it():
    def f(x):
        y = x.sin()
        z = y.cos()
        del x.shape_cache
        return z

    x = torch.randn(3)
    x.shape_cache = 1
    report = explain(f, x)
    assert report.graph_count == 1 and "DELETE_ATTR" in report.break_reasons[0]
    assert not hasattr(x, "shape_cache")


class Vec:
    def __init__(self, x, scale=2.0):
        self.x = x * scale

    def double(self):
        self.x = self.x * 2
        return self


class Slotted:
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x


class WithNew:
    def __new__(cls, x):
        obj = super().__new__(cls)
        obj.made_by_new = True
        return obj

    def __init__(self, x):
        self.x = x


def test_a_new_user_object_is_traced_not_a_break():
    def f(x):
        v = Vec(x.sin()).double()
        return v, v.x + 1

    x = torch.randn(3)
    report = explain(f, x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
    assert "object.__new__(" in report.transformed_code[0]
    v, y = report.out
    assert type(v) is Vec and y is not v.x
    torch.testing.assert_close(v.x, x.sin() * 4)
    torch.testing.assert_close(y, x.sin() * 4 + 1)


@pytest.mark.parametrize("cls, why", [(Slotted, "__slots__"), (WithNew, "__new__")])
def test_classes_the_tracer_cannot_model_break_with_a_named_reason(cls, why):
    def f(x):
        obj = cls(x.cos())
        return obj.x * 2, type(obj).__name__

    x = torch.randn(3)
    report = explain(f, x)
    assert any(why in r and cls.__name__ in r for r in report.break_reasons), report.break_reasons
    torch.testing.assert_close(report.out[0], x.cos() * 2)
    assert report.out[1] == cls.__name__


def functional_backend(gm, example_inputs):
    """Runs the graph on copies of its inputs and copies the mutated ones back, as AOTAutograd's
    functionalised graphs behave: a placeholder never sees another one's updates, and grad mode
    switched inside the graph does not outlive it."""
    def run(*args):
        with torch.enable_grad():  # (a graph may turn grad mode on: keep the inputs' history)
            copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        versions = [getattr(c, "_version", None) for c in copies]
        with torch.set_grad_enabled(torch.is_grad_enabled()):
            out = gm.forward(*copies)
        with torch.no_grad():  # (kernels such as batch_norm's update buffers unversioned)
            for a, c, v in zip(args, copies, versions):
                if isinstance(c, torch.Tensor) and (c._version != v or not torch.equal(a, c)):
                    a.copy_(c)
        return out
    return run


def _mutate_one_read_other(a, c):
    a.add_(1)
    return c * 2


ALIASED_CALLS = {
    "view": lambda t: (t, t.view(-1)),
    "slice": lambda t: (t[:3], t[1:]),
    "same object": lambda t: (t, t),
    "distinct": lambda t: (t, t.clone()),
}


def test_arguments_that_share_memory_match_eager_when_the_graph_mutates_one():
    cf = compile_frame(_mutate_one_read_other, functional_backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ["distinct", "view", "slice", "same object", "distinct", "view"]:
            got_t, want_t = torch.arange(4.0), torch.arange(4.0)
            got = cf(*ALIASED_CALLS[name](got_t))
            want = _mutate_one_read_other(*ALIASED_CALLS[name](want_t))
            torch.testing.assert_close(got, want, msg=name)
            torch.testing.assert_close(got_t, want_t, msg=name)
    messages = [str(w.message) for w in caught]
    assert any("shares memory" in m and "L['a'] and L['c']" in m for m in messages), messages
    source = "\n".join(e.check.source for e in cf.entries)
    assert "not shares_memory(L['a'], L['c'])" in source and "L['c'] is L['a']" in source


def test_reading_two_views_of_one_tensor_needs_no_guard():
    def f(a, c):
        return a + c

    cf = compile_frame(f, functional_backend)
    t = torch.arange(3.0)
    torch.testing.assert_close(cf(t, t.clone()), f(t, t.clone()))
    torch.testing.assert_close(cf(t, t.view(-1)), f(t, t.view(-1)))
    assert len(cf.entries) == 1 and "shares_memory" not in cf.entries[0].check.source


GLOBAL_W = torch.ones(3)


def test_an_argument_that_is_a_global_tensor_is_guarded():
    def reads(x):
        return x + GLOBAL_W

    def mutates(x):
        x.add_(1)
        return GLOBAL_W * 2

    for fn in (reads, mutates):
        cf = compile_frame(fn, functional_backend)
        for arg in ["other", "global", "other", "global"]:
            GLOBAL_W.fill_(1.0)
            got = cf(GLOBAL_W if arg == "global" else torch.zeros(3)).clone()
            GLOBAL_W.fill_(1.0)
            want = fn(GLOBAL_W if arg == "global" else torch.zeros(3))
            torch.testing.assert_close(got, want, msg=f"{fn.__name__}, {arg}")
    GLOBAL_W.fill_(1.0)


def test_views_sharing_memory_through_the_whole_pipeline():
    import toycomp

    cf = toycomp.compile(_mutate_one_read_other)
    for name in ["distinct", "view"]:
        got_t, want_t = torch.arange(3.0), torch.arange(3.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = cf(*ALIASED_CALLS[name](got_t))
        torch.testing.assert_close(got, _mutate_one_read_other(*ALIASED_CALLS[name](want_t)))
        torch.testing.assert_close(got_t, want_t)


def test_grad_mode_switched_by_a_call_stays_switched_after_the_frame():
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2

    try:
        for cf in (f, compile_frame(f, functional_backend)):
            torch.set_grad_enabled(True)
            out = cf(torch.ones(2, requires_grad=True))
            assert not out.requires_grad and not torch.is_grad_enabled(), cf
    finally:
        torch.set_grad_enabled(True)


@pytest.mark.parametrize("call", ["positional", "default", "keyword", "mixed", "star"])
def test_arguments_bind_as_in_eager_however_they_are_passed(call):
    """Calls that pass every parameter by position skip inspect's binding: every other way of
    passing them must still bind (and guard) as eager does."""
    def f(x, n=2, *rest, scale=1.0):
        return x * n * scale + sum(rest)

    def g(x, n=2):
        return x * n

    x = torch.randn(3)
    calls, entries = {  # the calls, and how many bindings (so cache entries) they make
        "positional": ([(g, (x, 3), {}), (g, (x, 4), {})], 2),
        "default": ([(g, (x,), {}), (g, (x, 2), {}), (g, (x,), {})], 1),
        "keyword": ([(g, (), {"x": x, "n": 5}), (g, (x,), {"n": 6}), (g, (x, 6), {})], 2),
        "mixed": ([(f, (x, 3), {"scale": 2.0}), (f, (x,), {}), (f, (x, 4, 1.0, 2.0), {})], 3),
        "star": ([(f, (x, 3, 1.0), {}), (f, (x, 3, 1.0, 5.0), {}), (f, (x, 3), {})], 3),
    }[call]
    compiled = {fn: compile_frame(fn, backend) for fn in (f, g)}
    for fn, args, kwargs in calls * 2:
        torch.testing.assert_close(compiled[fn](*args, **kwargs), fn(*args, **kwargs))
    assert sum(len(c.entries) for c in compiled.values()) == entries
    with pytest.raises(TypeError):
        compiled[g](x, 1, 2)
    with pytest.raises(TypeError):
        compiled[g](x, n=1, m=2)


@pytest.mark.parametrize("fn", [
    lambda x: x.max(dim=1),
    lambda x: (x.sort(0), x.min(1).indices),
    lambda x: {"top": x.topk(2, dim=1), "lse": torch.linalg.slogdet(x[:, :4])},
    lambda x: torch.aminmax(x.sin(), dim=0),
    lambda x: x.max(dim=1).values * 2,
])
def test_ops_returning_named_tuples_return_them_as_eager_does(fn):
    """torch.return_types.* results keep their type and field names when returned."""
    x = torch.randn(4, 5)
    want, cf = fn(x), compile_frame(fn, backend)
    got = cf(x)
    assert explain(fn, x).graph_count == 1 and explain(fn, x).graph_break_count == 0

    def same(a, b):
        assert type(a) is type(b)
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, tuple):
            assert getattr(a, "__match_args__", None) == getattr(b, "__match_args__", None)
            assert len(a) == len(b)
            for p, q in zip(a, b):
                same(p, q)
        else:
            torch.testing.assert_close(a, b)

    same(got, want)
