"""Guards made cheap on module-heavy graphs, and still sound: after a model is compiled and
called once, one thing about it changes, and the compiled call must then match eager (and
recompile where eager could differ). Eager values and recompile counts are the oracle; the
guard text is only checked where it is what the user reads (``failing_guard``).

See [Note: guards read nn.Module attributes from its dicts] (sources.py), [Note: tuples of
constants] (guard_builder.py) and [Note: tensor guards in one call] (guard_check.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from toycomp.capture.convert_frame import compile_frame


def backend(gm, example_inputs):
    return gm.forward


def conv_block(stride=(2, 2)) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=stride, padding=1), nn.BatchNorm2d(4),
                         nn.ReLU6()).eval()


def run(model, x, change=None, recompiles=1):
    """Compile ``model``, call it, apply ``change(model)``, and check the compiled call against
    eager (values, parameter gradients, buffers) and its number of compiles; the compiled
    frame."""
    cf = compile_frame(model.forward, backend)
    check_same(cf, model, x)
    if change is not None:
        change(model)
    check_same(cf, model, x)
    check_same(cf, model, x)
    assert recompiles is None or len(cf.entries) == 1 + recompiles
    return cf


def check_same(cf, model, x):
    """One compiled call of ``model`` against one eager call of a copy taken just before."""
    eager = copy.deepcopy(model)
    got, want = cf(x), eager(x)
    torch.testing.assert_close(got, want)
    if got.requires_grad:
        got.sum().backward()
        want.sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
            p.grad = None
    for (name, b), c in zip(model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b, c, msg=name)


X = torch.randn(2, 3, 8, 8)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2), (1, 2)])
def test_a_conv_stride_replaced(stride):
    def change(m):
        m[0].stride = stride
    run(conv_block(stride=(1, 2)), X, change, recompiles=int(stride != (1, 2)))


@pytest.mark.parametrize("stride", [(True, 2), (1.0, 2), (1, 2.0)])
def test_a_stride_equal_to_the_traced_one_but_of_other_types(stride):
    model = conv_block(stride=(1, 2))
    cf = run(model, X, recompiles=0)
    model[0].stride = stride  # == (1, 2), but eager's conv2d rejects it: so must the compiled
    with pytest.raises(TypeError):
        model(X)
    with pytest.raises(TypeError):
        cf(X)


def test_a_float_attribute_changed():
    def change(m):
        m[1].eps = 0.5
    run(conv_block(), X, change)


def test_training_flipped():
    def change(m):
        m[1].train()
    run(conv_block(), X, change)


def test_a_submodule_replaced():
    def change(m):
        m[2] = nn.Identity()
    run(conv_block(), X, change)


def test_a_submodule_class_reassigned():
    class Doubled(nn.ReLU6):
        def forward(self, x):
            return super().forward(x) * 2

    def change(m):
        m[2].__class__ = Doubled
    run(conv_block(), X, change)


class Scaled(nn.Module):
    scale = 2.0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_a_class_attribute_changed():
    class Local(Scaled):
        pass

    def change(m):
        Local.scale = 3.0
    model = Local()
    cf = compile_frame(model.forward, backend)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), model(x))
    change(model)
    torch.testing.assert_close(cf(x), model(x))
    assert len(cf.entries) == 2


def test_a_parameter_replaced():
    def same_layout(m):
        m.lin.weight = nn.Parameter(torch.randn(4, 4))  # read again on every call: no compile

    def other_dtype(m):
        m.lin.weight = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

    def other_strides(m):
        m.lin.weight = nn.Parameter(torch.randn(4, 4).t())
    torch.manual_seed(0)
    run(Scaled(), torch.randn(2, 4), same_layout, recompiles=0)
    with pytest.raises(RuntimeError):
        run(Scaled(), torch.randn(2, 4), other_dtype)  # eager raises on float64 @ float32
    run(Scaled(), torch.randn(2, 4), other_strides)


def test_requires_grad_turned_off():
    def change(m):
        m[0].weight.requires_grad_(False)
    run(conv_block(), X, change)


def test_parameter_data_of_another_shape():
    def change(m):
        m.lin.weight.data = torch.randn(5, 4)  # a (2, 5) result
        m.lin.bias.data = torch.randn(5)
    run(Scaled(), torch.randn(2, 4), change)


def test_a_buffer_replaced():
    def same_layout(m):
        m[1].running_mean = torch.randn(4)  # read again on every call: no compile

    def other_strides(m):
        m[1].running_var = (torch.rand(8) + 0.5)[::2]
    run(conv_block(), X, same_layout, recompiles=0)
    run(conv_block(), X, other_strides)


class Sizes(nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = [1.0, 2.0]
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        for s in self.scales:
            x = self.lin(x) * s
        return x


def test_a_list_attribute_mutated_in_place():
    def change(m):
        m.scales.append(3.0)
    run(Sizes(), torch.randn(2, 4), change)

    def change_item(m):
        m.scales[0] = -1.0
    run(Sizes(), torch.randn(2, 4), change_item)


class PropertyWeight(nn.Module):
    """A property named like a parameter (the parameter set past ``register_parameter``,
    which refuses the name): ``self.weight`` is the property's value, never the parameter."""

    def __init__(self):
        super().__init__()
        self._parameters["weight"] = nn.Parameter(torch.randn(4, 4))

    @property
    def weight(self):
        return self._parameters["weight"] * 2

    def forward(self, x):
        return x @ self.weight


def test_a_property_named_like_a_parameter():
    # the tracer runs the property, as Python does ([Note: attribute lookup order]): one compile
    def change(m):
        m._parameters["weight"] = nn.Parameter(torch.randn(4, 4))  # read again: no compile
    run(PropertyWeight(), torch.randn(2, 4), change, recompiles=0)


def test_an_instance_dict_entry_shadowing_a_parameter():
    def change(m):
        m.lin.__dict__["weight"] = torch.randn(4, 4)  # past nn.Module.__setattr__: shadows it
    run(Scaled(), torch.randn(2, 4), change, recompiles=1)  # traced again: the dict's tensor
    model = Scaled()
    cf = compile_frame(model.forward, backend)
    cf(torch.randn(2, 4))
    change(model)
    assert not cf.entries[0].check({"self": model, "x": torch.randn(2, 4)}, {})


def test_one_module_under_two_names_then_split():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = self.a

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    def change(m):
        m.b = nn.Linear(4, 4)
    run(Twice(), torch.randn(2, 4), change)


class Tied(nn.Module):
    """Two Linears sharing one weight (also used by test_lean_reads)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def test_tied_parameters_untied():
    def change(m):
        m.b.weight = nn.Parameter(torch.randn(4, 4))
    run(Tied(), torch.randn(2, 4), change)


def make_closure():
    lin, k = nn.Linear(4, 4), 2.0

    def f(x):
        return lin(x) * k

    def rebind(new_k=None, new_lin=None):
        nonlocal k, lin
        k = k if new_k is None else new_k
        lin = lin if new_lin is None else new_lin
    return f, rebind


@pytest.mark.parametrize("what", ["constant", "module"])
def test_a_closure_cell_rebound(what):
    f, rebind = make_closure()
    cf = compile_frame(f, backend)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), f(x))
    rebind(new_k=3.0) if what == "constant" else rebind(new_lin=nn.Linear(4, 4))
    torch.testing.assert_close(cf(x), f(x))
    assert len(cf.entries) == (2 if what == "constant" else 1)  # (same layout: read again)
    rebind(new_lin=nn.Sequential(nn.Linear(4, 4)))
    torch.testing.assert_close(cf(x), f(x))


SCALE = 2.0
LIN = nn.Linear(4, 4)


def test_a_global_rebound():
    global SCALE, LIN

    def f(x):
        return LIN(x) * SCALE

    cf = compile_frame(f, backend)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), f(x))
    SCALE, LIN = 3.0, nn.Linear(4, 4, bias=False)
    try:
        torch.testing.assert_close(cf(x), f(x))
        assert len(cf.entries) == 2
    finally:
        SCALE, LIN = 2.0, nn.Linear(4, 4)


# ----- cheap: what the check reads, and what failing_guard says -------------------------------


def test_the_check_reads_no_attribute_through_module_getattr(monkeypatch):
    model = conv_block()
    cf = compile_frame(model.forward, backend)
    cf(X)
    calls = []
    real = nn.Module.__getattr__

    def counting(self, name):
        calls.append(name)
        return real(self, name)
    monkeypatch.setattr(nn.Module, "__getattr__", counting)
    assert cf.entries[0].check({"self": model, "input": X}, {})
    assert calls == []


def test_failing_guard_names_the_source_as_written():
    model = conv_block()
    cf = compile_frame(model.forward, backend)
    cf(X)
    check, L = cf.entries[0].check, {"self": model, "input": X}
    model[1].eps = 0.5
    assert check.failing_guard(L, {}) == "L['self']._modules['1'].eps == 1e-05"
    model[1].eps = 1e-5
    model[1].weight.data = torch.randn(5)
    assert check.failing_guard(L, {}) == "L['self']._modules['1'].weight.shape == (4,)"
    model[1].weight.data = torch.randn(4)
    model[0].stride = (True, 2)
    failed = check.failing_guard(L, {})
    assert "L['self']._modules['0'].stride == (2, 2)" in failed and "_parameters" not in failed
    model[0].stride = (2, 2)
    assert check(L, {}) and check.failing_guard(L, {}) is None


def test_a_tensor_that_fails_only_in_its_dispatch_keys_is_named():
    class Complex(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, dtype=torch.complex64), requires_grad=False)

        def forward(self, x):
            return x * self.w

    model = Complex()
    cf = compile_frame(model.forward, backend)
    x = torch.randn(3, dtype=torch.complex64)
    cf(x)
    w = model.w
    model.w = nn.Parameter(w.conj(), requires_grad=False)  # same layout, a conjugate view
    assert "L['self'].w" in cf.entries[0].check.failing_guard({"self": model, "x": x}, {})
    torch.testing.assert_close(cf(x), model(x))
