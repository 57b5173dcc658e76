"""The transformed function reads its graph inputs as its guards read them (``m._parameters[
'weight']`` for ``m.weight``, each shared path once), and stays right when a module changes
between calls: eager values, gradients and recompile counts are the oracle.

See [Note: graph inputs read as the guards read them] (transformed_code.py)."""

from __future__ import annotations

import torch
from torch import nn

from tests.capture.test_guard_speed import Tied, check_same, conv_block, run
from toycomp.capture.convert_frame import compile_frame

X = torch.randn(2, 3, 8, 8)


def backend(gm, example_inputs):
    return gm.forward


class Net(nn.Module):
    """Two levels of submodules, a parameter and a buffer of its own."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Tanh()))
        self.scale = nn.Parameter(torch.randn(4))
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x):
        return self.body(x) * self.scale + self.shift


def net_run(change, recompiles=1):
    return run(Net(), torch.randn(2, 4), change, recompiles)


def test_a_compiled_call_reads_nothing_through_module_getattr(monkeypatch):
    for model, x in [(conv_block(), X), (Net(), torch.randn(2, 4))]:
        cf = compile_frame(model.forward, backend)
        want = model(x)
        cf(x)
        calls = []
        real = nn.Module.__getattr__

        def counting(self, name, real=real):
            calls.append(name)
            return real(self, name)
        monkeypatch.setattr(nn.Module, "__getattr__", counting)
        torch.testing.assert_close(cf(x), want)
        monkeypatch.undo()
        assert calls == [] and len(cf.entries) == 1


def test_each_shared_path_is_read_once():
    model = Net()
    cf = compile_frame(model.forward, backend)
    cf(torch.randn(2, 4))
    code = "\n".join(line.split("#")[0] for line in cf.entries[0].transformed.source.splitlines())
    assert code.count("._modules") == 3  # self's, body's and body[1]'s
    assert code.count("._parameters") == 3  # self's, body[0]'s and body[1][0]'s


def test_inputs_read_otherwise_are_commented_with_their_source():
    model = nn.Linear(2, 3)
    cf = compile_frame(model.forward, backend)
    cf(torch.randn(1, 2))
    lines = cf.entries[0].transformed.source.splitlines()
    call = lines.index("    __graph_out = __compiled_fn_0(")
    assert [ln.split("#")[-1].strip() for ln in lines[call + 1:call + 4]] == \
        ["input,", "self.weight", "self.bias"]


def test_a_small_function_keeps_one_call_line():
    def f(x, n):
        return x * n
    cf = compile_frame(f, backend)
    cf(torch.randn(3), 2)
    assert "    __graph_out = __compiled_fn_0(x)\n" in cf.entries[0].transformed.source


def test_a_parameter_replaced_with_the_same_layout_is_read_again():
    def change(m):
        m.body[1][0].weight = nn.Parameter(torch.randn(4, 4))
        m.scale = nn.Parameter(torch.randn(4))
    net_run(change, recompiles=0)


def test_a_buffer_replaced():
    def change(m):
        m.shift = torch.randn(4)
    net_run(change, recompiles=0)


def test_a_submodule_replaced_by_one_of_its_type():
    def change(m):
        m.body[1] = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    net_run(change, recompiles=0)


def test_a_submodule_replaced_by_another_type():
    def change(m):
        m.body[1] = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    net_run(change)


def test_instance_dict_entries_shadowing_a_parameter_a_buffer_and_a_submodule():
    def parameter(m):
        m.body[0].__dict__["weight"] = torch.randn(4, 4)  # past nn.Module.__setattr__

    def buffer(m):
        m.__dict__["shift"] = torch.randn(4)

    def submodule(m):
        object.__setattr__(m, "body", nn.Sequential(nn.Linear(4, 4), nn.Sigmoid()))
    for change in (parameter, buffer, submodule):
        net_run(change)


def test_a_parameter_moved_to_the_buffers():
    def change(m):
        scale = m._parameters.pop("scale")
        m.register_buffer("scale", scale.detach() * 3)
    net_run(change)


def test_a_class_reassigned_to_one_with_a_property_named_like_the_parameter():
    class Halved(nn.Linear):
        @property
        def weight(self):
            return self._parameters["weight"] / 2

    def change(m):
        m.body[0].__class__ = Halved
    net_run(change)


def test_tied_weights_retied():
    """Both names given one new weight: the same graph serves (untying: test_guard_speed)."""
    def retie(m):
        m.a.weight = m.b.weight = nn.Parameter(torch.randn(4, 4))
    run(Tied(), torch.randn(2, 4), retie, recompiles=0)


def test_a_global_module_mutated():
    global MODEL
    MODEL = Net()

    def f(x):
        return MODEL(x) * 2

    cf = compile_frame(f, backend)
    x = torch.randn(2, 4)
    torch.testing.assert_close(cf(x), f(x))
    MODEL.body[0].weight = nn.Parameter(torch.randn(4, 4))
    torch.testing.assert_close(cf(x), f(x))
    MODEL.body[0].__dict__["bias"] = torch.randn(4)
    torch.testing.assert_close(cf(x), f(x))
    assert len(cf.entries) == 2


def test_a_module_mutated_by_the_traced_code_after_its_inputs_were_read():
    class SwapsItsWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            self.lin.__dict__["weight"] = torch.zeros(4, 4)  # a side effect: eager's next
            return y                                          # call reads it

    model, x = SwapsItsWeight(), torch.randn(2, 4)
    eager = SwapsItsWeight()
    eager.load_state_dict(model.state_dict())
    cf = compile_frame(model.forward, backend)
    for _ in range(3):
        torch.testing.assert_close(cf(x), eager(x))


def test_mutations_in_turn_on_one_compiled_frame():
    model, x = Net(), torch.randn(2, 4)
    cf = compile_frame(model.forward, backend)
    check_same(cf, model, x)
    for change in (lambda m: setattr(m.body[0], "bias", nn.Parameter(torch.randn(4))),
                   lambda m: m.body[0].__dict__.__setitem__("bias", torch.randn(4)),
                   lambda m: m.body[0].__dict__.pop("bias"),
                   lambda m: setattr(m, "shift", torch.randn(4))):
        change(model)
        check_same(cf, model, x)
    assert len(cf.entries) == 2


# ----- the tracer's attribute lookup follows Python's ([Note: attribute lookup order]) --------


def test_a_class_attribute_over_a_parameter_wins_as_in_python():
    class ClassScale(nn.Module):
        scale = 2.0  # found before nn.Module.__getattr__ would look in _parameters

        def __init__(self):
            super().__init__()
            self._parameters["scale"] = nn.Parameter(torch.randn(4))  # past register_parameter

        def forward(self, x):
            return x * self.scale
    run(ClassScale(), torch.randn(2, 4), lambda m: setattr(type(m), "scale", 3.0))


class Config:
    def __init__(self):
        self.__dict__["scale"] = 5.0  # under the property: never read by cfg.scale
        self._scale = 2.0

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = value * 10


def test_a_property_over_an_instance_dict_entry():
    def f(x, cfg):
        return x * cfg.scale
    cfg, x = Config(), torch.randn(3)
    cf = compile_frame(f, backend)
    torch.testing.assert_close(cf(x, cfg), f(x, cfg))
    cfg._scale = 4.0
    torch.testing.assert_close(cf(x, cfg), f(x, cfg))
    assert len(cf.entries) == 2


def test_a_store_through_a_property_setter():
    def f(x, cfg):
        cfg.scale = 3.0
        return x * cfg.scale
    x = torch.randn(3)
    got_cfg, want_cfg = Config(), Config()
    torch.testing.assert_close(compile_frame(f, backend)(x, got_cfg), f(x, want_cfg))
    assert vars(got_cfg) == vars(want_cfg)
