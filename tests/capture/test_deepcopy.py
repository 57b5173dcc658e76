"""``copy.deepcopy`` and ``copy.copy`` of configs inside a compiled function (transformers'
``get_text_config`` deep-copies the model's config in T5's forward): dataclasses, plain objects,
dicts and lists with no tensor are copied while tracing, as Dynamo does, with no graph break;
a tensor inside breaks the graph, as in Dynamo. Eager is the oracle for results and for the
state of every object afterwards, Dynamo for graph and break counts.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch

from tests.capture.checks import compile_and_run, dynamo_counts
from toycomp.capture.convert_frame import CompileContext, summarize


@dataclasses.dataclass
class Config:
    scale: float = 2.0
    names: list = dataclasses.field(default_factory=lambda: ["a", "b"])
    sub: dict = dataclasses.field(default_factory=lambda: {"k": 1, "dims": [4, 8]})
    act: str = "relu"


class PlainConfig:
    def __init__(self):
        self.scale = 3.0
        self.layers = [1, 2]
        self.inner = Config(scale=0.5)


class MappedConfig:
    """transformers' PretrainedConfig in small: an attribute_map that ``__setattr__`` and
    ``__getattribute__`` translate (``hidden_size`` is stored as ``d_model``)."""

    attribute_map = {"hidden_size": "d_model"}

    def __init__(self):
        self.d_model = 4
        self.is_encoder_decoder = True
        self.decoder_layers = 3

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def to_dict(self):
        return copy.deepcopy(self.__dict__)

    def text_config(self):  # get_text_config's legacy branch
        config = copy.deepcopy(self)
        for key in config.to_dict():
            if key.startswith("decoder_"):
                setattr(config, "num_" + key[len("decoder_"):], getattr(config, key))
                delattr(config, key)
        config.hidden_size = config.hidden_size * 2
        return config


def deep_dataclass(x, cfg):
    c = copy.deepcopy(cfg)
    c.scale = 5.0
    c.names.append("z")
    c.sub["dims"].append(16)
    return x * c.scale + len(c.names) + sum(c.sub["dims"]) + cfg.scale + len(cfg.names)


def deep_plain(x, cfg):
    c = copy.deepcopy(cfg)
    c.layers.append(3)
    c.inner.scale = 9.0
    return x * c.scale * len(c.layers) + cfg.inner.scale + c.inner.scale


def deep_literal_dict(x, cfg):
    shared = [1, 2]
    d = copy.deepcopy({"a": shared, "b": (3, [4]), "c": shared})
    d["a"].append(5)  # the copy keeps "a" and "c" one list, as copy's memo does
    return x + sum(d["c"]) + d["b"][1][0] + len(shared)


def shallow_copy_shares(x, cfg):
    c = copy.copy(cfg)
    c.scale = 7.0  # the copy's own attribute
    c.names.append("q")  # the list is shared: the original sees it, as in eager
    return x * c.scale + cfg.scale + len(cfg.names)


def copy_list_and_dict(x, cfg):
    a = copy.copy(cfg.names)
    a.append("y")
    b = copy.deepcopy(cfg.sub)
    b["k"] += 10
    return x * len(a) + b["k"] + cfg.sub["k"] + len(cfg.names)


def mapped_text_config(x, cfg):
    text = cfg.text_config()
    return x * text.hidden_size + text.num_layers + hasattr(text, "decoder_layers") + cfg.d_model


def escapes(x, cfg):
    c = copy.deepcopy(cfg)
    c.names.append("w")
    return x + 1, c


CASES = [
    (deep_dataclass, Config),
    (deep_plain, PlainConfig),
    (deep_literal_dict, Config),
    (shallow_copy_shares, Config),
    (copy_list_and_dict, Config),
    (mapped_text_config, MappedConfig),
]


def state(obj):
    return {k: state(v) if hasattr(v, "__dict__") else v for k, v in vars(obj).items()}


@pytest.mark.parametrize("fn, make", CASES, ids=[f.__name__ for f, _ in CASES])
def test_copy_inside_a_compiled_function(fn, make):
    x = torch.randn(4)
    cfg_eager, cfg = make(), make()
    expected = fn(x, cfg_eager)
    out, ex = compile_and_run(fn, x, cfg)
    torch.testing.assert_close(out, expected)
    assert state(cfg) == state(cfg_eager)  # the original, as eager left it
    assert ex.graph_break_count == 0, ex.break_reasons
    assert (ex.graph_count, 0) == dynamo_counts(fn, x, make())


def test_a_copy_that_escapes_is_rebuilt():
    x, cfg = torch.randn(3), Config()
    (y, c), ex = compile_and_run(escapes, x, cfg)
    assert ex.graph_break_count == 0
    torch.testing.assert_close(y, x + 1)
    assert type(c) is Config and c is not cfg and c.names is not cfg.names
    assert c == Config(names=["a", "b", "w"]) and cfg == Config()
    c.sub["dims"].append(1)
    assert cfg.sub["dims"] == [4, 8]  # deep: nothing shared


def test_a_changed_config_recompiles():
    """The copy reads the original's attributes: they are guarded (another value, another
    graph), as are its attribute names."""
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    compiled = context.frame_for(deep_plain)
    x, cfg = torch.randn(3), PlainConfig()
    torch.testing.assert_close(compiled(x, cfg), deep_plain(x, PlainConfig()))
    for change in (lambda c: setattr(c, "scale", 10.0), lambda c: c.layers.append(7),
                   lambda c: setattr(c.inner, "extra", 1)):
        cfg_eager, cfg = PlainConfig(), PlainConfig()
        change(cfg_eager), change(cfg)
        torch.testing.assert_close(compiled(x, cfg), deep_plain(x, cfg_eager))
        assert state(cfg) == state(cfg_eager)


def tensor_in_copy(x):
    y = x * 2
    d = copy.deepcopy({"t": y, "n": 3})
    d["t"].add_(1)
    return y + d["t"] * d["n"]


def test_deepcopy_of_a_tensor_breaks_as_in_dynamo():
    x = torch.randn(3)
    out, ex = compile_and_run(tensor_in_copy, x)
    torch.testing.assert_close(out, tensor_in_copy(x))
    assert any("copy.deepcopy of a tensor" in r for r in ex.break_reasons), ex.break_reasons
    assert (ex.graph_count, ex.graph_break_count) == dynamo_counts(tensor_in_copy, x) == (2, 1)


class OwnDeepcopy:
    def __init__(self):
        self.n = 2

    def __deepcopy__(self, memo):
        new = OwnDeepcopy()
        new.n = self.n + 1
        return new


def test_a_class_with_its_own_deepcopy_breaks_naming_it():
    def fn(x, obj):
        return x * copy.deepcopy(obj).n

    x = torch.randn(3)
    context = CompileContext(lambda gm, example_inputs: gm.forward)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = context.frame_for(fn)(x, OwnDeepcopy())
    ex = summarize(context, out)
    torch.testing.assert_close(out, x * 3)
    assert any("__deepcopy__" in r for r in ex.break_reasons), ex.break_reasons


def test_transformers_get_text_config():
    """The copy T5's forward makes: ``config.get_text_config(decoder=True)`` of a legacy
    encoder-decoder config deep-copies it and renames its decoder keys."""
    transformers = pytest.importorskip("transformers")
    make = lambda: transformers.T5Config(d_model=8, num_layers=2, num_heads=2)  # noqa: E731

    def fn(x, config):
        text = config.get_text_config(decoder=True)
        return x * text.num_hidden_layers + text.hidden_size, text.num_layers

    x = torch.randn(3)
    expected = fn(x, make())
    out, ex = compile_and_run(fn, x, make())
    torch.testing.assert_close(out[0], expected[0])
    assert out[1] == expected[1]
    assert ex.graph_break_count == 0, ex.break_reasons
    assert ex.graph_count <= dynamo_counts(fn, x, make())[0]
