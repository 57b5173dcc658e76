"""What real libraries do in a forward, on small hand-written functions: dict subclasses that are
dataclasses (transformers' ModelOutput), decorated functions with ``*args, **kwargs``, code
objects, ``__getattribute__`` hooks, Mapping mixins, sets, ``os.environ``, ``inspect.signature``,
modules made in ``forward``. Each compiled function must give eager's results (the oracle), in
no more graphs than Dynamo makes, with no frame run eagerly.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import os
import warnings
from collections.abc import Mapping, Sequence

import torch

from tests.capture.checks import check, compile_and_run
from toycomp.capture.convert_frame import CompileContext, summarize


# --- dict subclasses: ModelOutput's shape ---------------------------------------------------------
class ModelOutput(collections.OrderedDict):
    """transformers' ModelOutput, cut down: a dataclass whose non-None fields are also items."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __getitem__(self, k):
        return dict(self.items())[k] if isinstance(k, str) else self.to_tuple()[k]

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class Output(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def test_dataclass_dict_made_and_returned():
    def f(x):
        out = Output(logits=x.sin(), loss=x.sum())
        return out

    expected, out = check(f, torch.randn(3))
    assert type(out) is Output and list(out.keys()) == list(expected.keys()) == ["loss", "logits"]
    assert out.hidden is None and isinstance(out, collections.OrderedDict)
    torch.testing.assert_close(out.logits, expected.logits)
    torch.testing.assert_close(out["loss"], expected["loss"])
    torch.testing.assert_close(out[1], expected[1])


def test_dataclass_dict_read_in_the_trace():
    def f(x):
        out = Output(x.cos(), logits=x * 2)
        total = out.loss + out["logits"].sum() + len(out) + out.to_tuple()[1].mean()
        return total, "hidden" in out, out.get("hidden", 7), hasattr(out, "nothing")

    expected, out = check(f, torch.randn(4))
    assert out[1:] == expected[1:] == (False, 7, False)
    torch.testing.assert_close(out[0], expected[0])


def test_dataclass_dict_across_a_graph_break():
    """Made before a break, read in the resume function: still an Output, same items."""

    def f(x):
        out = Output(loss=x.sum(), logits=x.sin())
        print("a break")
        return out.loss * 2, type(out).__name__, list(out)

    expected = f(torch.ones(2))
    out, ex = compile_and_run(f, torch.ones(2))
    assert ex.graph_break_count == 1 and out[1:] == expected[1:]
    torch.testing.assert_close(out[0], expected[0])


class Registry(dict):
    """A dict subclass with its own ``get`` (transformers' _CanRecordRegistry)."""

    def get(self, model):
        return super().get(type(model).__name__) or {}


REGISTRY = Registry(Linear={"scale": 3.0})


def test_dict_subclass_with_its_own_methods():
    model = torch.nn.Linear(3, 3)

    def f(x):
        return x * REGISTRY.get(model)["scale"] + len(REGISTRY.get(x))

    check(f, torch.randn(3))


# --- decorated functions, code objects, signatures ---------------------------------------------------
def with_defaults_from(config):
    def decorator(func):
        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            for name in ("scale", "shift"):
                if name in func.__code__.co_varnames and kwargs.get(name) is None:
                    kwargs[name] = config[name]
            return func(self, *args, **kwargs)

        return wrapper

    return decorator


class Decorated(torch.nn.Module):
    @with_defaults_from({"scale": 2.0, "shift": 1.0})
    def forward(self, x, scale=None, shift=None):
        return x * scale + shift


def test_forward_decorated_with_args_and_kwargs():
    """The compiled frame is the wrapper: its own ``*args, **kwargs``, not ``__wrapped__``'s."""
    m, x = Decorated(), torch.randn(3)
    check(m.forward, x)
    expected, out = check(lambda x: m(x, shift=5.0), x)
    torch.testing.assert_close(out, expected)


def test_code_object_and_signature_are_constants():
    def helper(a, b, *, c=1):
        return a + b + c

    def f(x):
        n = helper.__code__.co_argcount + len(inspect.signature(helper).parameters)
        return x * n + (1 if "b" in helper.__code__.co_varnames else 0)

    check(f, torch.randn(2))


def test_bound_method_signature_drops_self():
    m = torch.nn.Linear(2, 2)

    def f(x):
        return x * len(inspect.signature(m.forward).parameters)  # 1, as for the bound method

    expected, out = check(f, torch.randn(2))
    torch.testing.assert_close(out, expected)


# --- attribute hooks, Mapping mixins, sets, the environment -------------------------------------
class Config:
    attribute_map = {"hidden": "width"}

    def __init__(self):
        self.width = 4

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


def test_getattribute_hook_is_honoured():
    config = Config()
    check(lambda x: x * config.hidden + config.width, torch.randn(2))


class Interface(Mapping):
    _global = {"sdpa": torch.sin}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global)


INTERFACE = Interface()


def test_mapping_get_and_contains_over_a_missing_key():
    def f(x):
        fn = INTERFACE.get("eager", torch.cos)
        return fn(x) + INTERFACE.get("sdpa")(x), "eager" in INTERFACE, "sdpa" in INTERFACE

    expected, out = check(f, torch.randn(3))
    assert out[1:] == expected[1:] == (False, True)
    torch.testing.assert_close(out[0], expected[0])


class Layers(Sequence):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        return i + 1


def test_sequence_mixin_iteration_and_sets():
    def f(x):
        names = {f.name for f in dataclasses.fields(Output)}
        seen = set()
        for k in Layers(3):
            seen.add(k)
        return x * sum(Layers(3)) + len(names | {"other"}), sorted(seen), "loss" in names

    expected, out = check(f, torch.randn(2))
    assert out[1:] == expected[1:]
    torch.testing.assert_close(out[0], expected[0])


def test_environment_variable_read_is_guarded(monkeypatch):
    def f(x):
        return x * 2 if os.environ.get("TOYCOMP_TEST_FLAG", "0") == "1" else x - 1

    monkeypatch.delenv("TOYCOMP_TEST_FLAG", raising=False)
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    compiled = context.frame_for(f)
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), x - 1)
    monkeypatch.setenv("TOYCOMP_TEST_FLAG", "1")
    torch.testing.assert_close(compiled(x), x * 2)  # the guard on the value: a recompile
    assert len(compiled.entries) == 2


# --- modules made in forward, imports, in-place operators on numbers --------------------------
def test_module_made_in_forward_without_tensors():
    def f(x, target):
        loss_fct = torch.nn.CrossEntropyLoss(reduction="sum")
        return loss_fct(x, target)

    check(f, torch.randn(4, 5), torch.tensor([0, 1, 2, 3]))


def test_module_made_in_forward_with_parameters_breaks():
    def f(x):
        return torch.nn.Linear(3, 3)(x)  # new random weights each call: never traced

    out, ex = compile_and_run(f, torch.randn(3))  # a graph break: the call runs in Python
    assert out.shape == (3,) and len(ex.break_reasons) == 1
    assert "creating a Linear, which holds tensors" in ex.break_reasons[0]


def test_dotted_import_and_number_plus_tensor():
    def f(x):
        import torch.nn.functional

        n = 1
        n += x.sum()
        return torch.nn.functional.relu(x) + n

    check(f, torch.randn(3))


def test_jump_to_an_extended_arg():
    """A loop whose head lies past offset 255: its back jump lands on an EXTENDED_ARG prefix."""
    lines = ["def f(x):"] + [f"    x = x + {i}" for i in range(70)] + [
        "    for i in range(3):", "        x = x * 2", "    return x"]
    namespace = {}
    exec("\n".join(lines), namespace)  # noqa: S102 (a generated test function)
    check(namespace["f"], torch.randn(2))
