"""Tests for stage 1 (toycomp/capture/): eager PyTorch is the oracle."""

import inspect
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from toycomp.capture.captured_graph import CapturedGraph
from toycomp.capture.source_lines import GraphBreak
from toycomp.capture.tracer import capture

RTOL, ATOL = 1e-4, 1e-5


def run_gm(cg: CapturedGraph, *args, **kwargs):
    """Run the captured graph directly (gm on flat inputs) and rebuild the user's structure."""
    assert cg.gm is not None, cg.graph_break
    flat = cg.gm(*cg.flatten_inputs(*args, **kwargs))
    assert isinstance(flat, tuple) and all(isinstance(t, torch.Tensor) for t in flat)
    return cg.unflatten_outputs(flat)


def line_of(fn, text: str) -> int:
    """Absolute line number of the line containing ``text`` inside ``fn``'s source."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def call_nodes(cg: CapturedGraph):
    return [n for n in cg.gm.graph.nodes if n.op in ("call_function", "call_method")]


def test_running_example_matches_eager():
    def f(x):
        return torch.sin(x) ** 2 + torch.cos(x) ** 2

    x = torch.randn(100)
    cg = capture(f, x)
    assert [n.name for n in cg.gm.graph.nodes if n.op == "placeholder"] == ["x"]
    assert [n.target for n in call_nodes(cg)] == [
        torch.sin,
        operator.pow,
        torch.cos,
        operator.pow,
        operator.add,
    ]
    x2 = torch.randn(100)
    torch.testing.assert_close(run_gm(cg, x2), f(x2), rtol=RTOL, atol=ATOL)
    assert cg.check_guards(x2) is None
    assert "torch.sin(x)" in cg.gm.code and "x.shape == (100,)" in repr(cg)


def test_every_node_has_meta_val_and_source_line():
    def f(x):
        y = x.t() @ x  # a non-contiguous intermediate
        return y.relu(), x.shape[0]

    x = torch.randn(4, 3)
    cg = capture(f, x)
    for node in cg.gm.graph.nodes:
        assert "val" in node.meta, node
    t_node = next(n for n in cg.gm.graph.nodes if n.target == "t")
    assert t_node.meta["val"].device.type == "meta"
    assert t_node.meta["val"].stride() == x.t().stride()
    lineno = line_of(f, "x.t() @ x")
    assert t_node.meta["source_line"].startswith(f"line {lineno}: y = x.t() @ x  # a non-")
    assert "x.t() @ x" in t_node.meta["stack_trace"]
    out, n = run_gm(cg, x)
    assert n == 4
    torch.testing.assert_close(out, f(x)[0])


def test_mlp_with_cross_entropy_lifts_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))

    def loss_fn(x, y):
        return F.cross_entropy(model(x), y)

    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    cg = capture(loss_fn, x, y)
    placeholders = [n.name for n in cg.gm.graph.nodes if n.op == "placeholder"]
    assert placeholders == [
        "x",
        "y",
        "model_0_weight",
        "model_0_bias",
        "model_2_weight",
        "model_2_bias",
    ]
    assert [lifted.fetch() for lifted in cg.lifted] == [p for p in model.parameters()]
    # Only the outermost calls are recorded (no aten ops from inside F.linear / F.cross_entropy).
    targets = [n.target for n in call_nodes(cg)]
    assert targets == [F.linear, F.gelu, F.linear, F.cross_entropy]
    torch.testing.assert_close(run_gm(cg, x, y), loss_fn(x, y), rtol=RTOL, atol=ATOL)
    assert any("model_0_weight.requires_grad == True" == str(g) for g in cg.guards)


def test_module_capture_names_parameters_and_buffers():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 4)
            self.register_buffer("scale", torch.full((4,), 3.0))

        def forward(self, inp):
            return self.fc1(inp) * self.scale

    net = Net()
    x = torch.randn(2, 8)
    cg = capture(net, x)
    names = [n.name for n in cg.gm.graph.nodes if n.op == "placeholder"]
    assert names == ["inp", "fc1_weight", "fc1_bias", "scale"]
    torch.testing.assert_close(run_gm(cg, x), net(x), rtol=RTOL, atol=ATOL)
    # Lifted tensors are fetched on every call: an updated buffer is seen by the graph.
    net.scale.fill_(-1.0)
    torch.testing.assert_close(run_gm(cg, x), net(x), rtol=RTOL, atol=ATOL)


def test_autograd_through_captured_graph():
    lin = nn.Linear(5, 3)

    def f(x):
        return torch.tanh(lin(x)).sum()

    x = torch.randn(4, 5, requires_grad=True)
    cg = capture(f, x)
    grads_eager = torch.autograd.grad(f(x), [x, lin.weight, lin.bias])
    grads_graph = torch.autograd.grad(run_gm(cg, x), [x, lin.weight, lin.bias])
    for a, b in zip(grads_eager, grads_graph):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    assert str(cg.guards[6]) == "x.requires_grad == True"


def test_control_flow_on_int_is_specialised():
    def f(x, n):
        for _ in range(n):
            x = x * 2
        if n > 2:
            return x + 1
        return x - 1

    x = torch.randn(3)
    cg = capture(f, x, 3)
    assert sum(n.target is operator.mul for n in cg.gm.graph.nodes) == 3
    torch.testing.assert_close(cg(x, 3), f(x, 3))
    assert cg.check_guards(x, 3) is None
    failed = cg.check_guards(x, 1)
    assert failed is not None and str(failed) == "n == 3"
    assert cg.check_guards(x, 3.0) is not None  # 3.0 == 3, but the type is guarded too


def test_tensor_guards():
    def f(x):
        return x.exp()

    x = torch.randn(4, 6)
    cg = capture(f, x)
    assert cg.check_guards(torch.randn(4, 6)) is None
    assert str(cg.check_guards(torch.randn(5, 6))) == "x.shape == (4, 6)"
    assert str(cg.check_guards(torch.randn(4, 6, dtype=torch.float64))) == (
        "x.dtype == torch.float32"
    )
    assert str(cg.check_guards(torch.randn(4, 6, requires_grad=True))) == (
        "x.requires_grad == False"
    )
    assert str(cg.check_guards(torch.randn(6, 4).t())) == "x.stride() == (6, 1)"
    assert str(cg.check_guards(x, x)) == "(*args, **kwargs) == (x: Tensor)"
    with torch.no_grad():
        assert str(cg.check_guards(x)) == "torch.is_grad_enabled() == True"


def test_argument_names_do_not_clash_with_guard_sources():
    # The structure guard's source must not be shadowed by an argument of the same name.
    def f(inputs, labels):
        return torch.sin(inputs) + labels

    a, b = torch.randn(3), torch.randn(3)
    cg = capture(f, a, b)
    assert cg.check_guards(torch.randn(3), torch.randn(3)) is None
    assert str(cg.check_guards(torch.randn(4), b)) == "inputs.shape == (3,)"
    torch.testing.assert_close(cg(a, b), f(a, b), rtol=RTOL, atol=ATOL)


def test_graph_break_on_tensor_condition():
    def f(x):
        y = x * 2
        if y.sum() > 0:
            return y
        return -y

    cg = capture(f, torch.randn(5))
    assert cg.gm is None and isinstance(cg.graph_break, GraphBreak)
    assert cg.graph_break.lineno == line_of(f, "if y.sum() > 0:")
    assert cg.graph_break.source_line == "if y.sum() > 0:"
    assert cg.graph_break.filename == __file__
    assert "Tensor.__bool__" in cg.graph_break.reason
    assert "if y.sum() > 0:" in repr(cg)


def test_graph_break_on_item():
    def f(x):
        scale = x.max().item()
        return x / scale

    cg = capture(f, torch.randn(5))
    assert cg.gm is None
    assert "item" in cg.graph_break.reason
    assert cg.graph_break.lineno == line_of(f, "x.max().item()")


@pytest.mark.parametrize(
    "body, construct",
    [
        (lambda x: x * int(x[0]), "__int__"),
        (lambda x: x.tolist(), "tolist"),
        (lambda x: torch.nonzero(x), "nonzero"),
        (lambda x: x[x > 0], "data-dependent"),
        (lambda x: x.unique(), "unique"),
        (lambda x: print(x), "Tensor.__repr__"),
    ],
)
def test_other_graph_breaks(body, construct):
    cg = capture(body, torch.randn(4))
    assert cg.gm is None and construct in cg.graph_break.reason
    assert cg.graph_break.lineno == body.__code__.co_firstlineno


def test_graph_break_on_custom_autograd_function():
    class STE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.round()

        @staticmethod
        def backward(ctx, g):
            return g

    def f(x):
        return STE.apply(x) * 2

    cg = capture(f, torch.randn(3, requires_grad=True))
    assert cg.gm is None and "STE.apply" in cg.graph_break.reason
    assert cg.graph_break.source_line == "return STE.apply(x) * 2"


def test_graph_break_is_reported_even_if_caught():
    def f(x):
        try:
            if x.sum() > 0:
                return x
        except Exception:
            pass
        return x + 1

    cg = capture(f, torch.randn(3))
    assert cg.gm is None and "__bool__" in cg.graph_break.reason


def test_dict_and_tuple_outputs_round_trip():
    def f(x, y):
        s = x + y
        return {"sum": s, "pair": (x, s, 7), "same": s, "none": None}

    x, y = torch.randn(3), torch.randn(3)
    cg = capture(f, x, y)
    out, expected = run_gm(cg, x, y), f(x, y)
    assert out.keys() == expected.keys() and out["none"] is None and out["pair"][2] == 7
    assert out["pair"][0] is x  # an input returned as-is comes back as the same tensor
    torch.testing.assert_close(out["sum"], expected["sum"])
    torch.testing.assert_close(out["same"], expected["sum"])
    assert isinstance(out["pair"], tuple)


def test_list_output_and_tuple_results():
    def f(x):
        a, b = x.split(2)
        values, indices = torch.max(x, dim=0)
        return [a * 2, b, values, indices]

    x = torch.randn(4, 3)
    cg = capture(f, x)
    for got, want in zip(run_gm(cg, x), f(x)):
        torch.testing.assert_close(got, want)


def test_inplace_on_input_replays_mutation():
    def f(x, y):
        x.mul_(2)
        y[0] = 5.0
        return x + y

    x0, y0 = torch.randn(4), torch.randn(4)
    x_eager, y_eager = x0.clone(), y0.clone()
    expected = f(x_eager, y_eager)
    cg = capture(f, x0.clone(), y0.clone())
    assert [n.target for n in call_nodes(cg)] == ["mul_", operator.setitem, operator.add]
    x_graph, y_graph = x0.clone(), y0.clone()
    out = run_gm(cg, x_graph, y_graph)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x_graph, x_eager)
    torch.testing.assert_close(y_graph, y_eager)


def test_closure_and_factory_tensors():
    bias = torch.randn(3)

    def f(x):
        offset = torch.tensor([1.0, 2.0, 3.0])
        return x + bias + offset + torch.ones(3)

    x = torch.randn(3)
    cg = capture(f, x)
    assert [lt.name for lt in cg.lifted] == ["bias"]
    torch.testing.assert_close(run_gm(cg, x), f(x))
    bias.add_(1.0)  # the lifted tensor's current value is used
    torch.testing.assert_close(run_gm(cg, x), f(x))


def test_unnamed_constant_is_lifted():
    table = {"w": torch.randn(3)}

    def helper():
        return table["w"]

    def f(x):
        return x * helper()

    x = torch.randn(3)
    cg = capture(f, x)
    assert [lt.name for lt in cg.lifted] == ["const_0"]
    torch.testing.assert_close(run_gm(cg, x), f(x))


def test_no_grad_block_is_recorded():
    w = torch.randn(3, requires_grad=True)

    def f(x):
        with torch.no_grad():
            w.mul_(0.5)  # in-place on a leaf that requires grad: only legal under no_grad
        return x * w

    x = torch.randn(3)
    w_before = w.detach().clone()
    cg = capture(f, x)
    torch.testing.assert_close(w.detach(), w_before * 0.5)
    out = run_gm(cg, x)
    torch.testing.assert_close(w.detach(), w_before * 0.25)
    torch.testing.assert_close(out, x * w)
    assert out.requires_grad and torch.is_grad_enabled()


def test_kwargs_varargs_and_duplicate_inputs():
    def f(x, *rest, scale=1.0, **extra):
        return x * scale + rest[0] + extra["z"]

    x, y, z = torch.randn(2), torch.randn(2), torch.randn(2)
    cg = capture(f, x, y, scale=2.0, z=z)
    names = [n.name for n in cg.gm.graph.nodes if n.op == "placeholder"]
    assert names == ["x", "rest_0", "extra_z"]
    torch.testing.assert_close(cg(x, y, scale=2.0, z=z), f(x, y, scale=2.0, z=z))
    assert str(cg.check_guards(x, y, scale=3.0, z=z)) == "scale == 2.0"

    def g(a, b):
        return a + b

    dup = capture(g, x, x)
    assert str(dup.check_guards(x, y)) == "b is a"
    torch.testing.assert_close(dup(x, x), x + x)


def test_repr_is_deterministic():
    def f(x):
        return x.sin()

    text = repr(capture(f, torch.randn(2)))
    assert text == repr(capture(f, torch.randn(2)))
    assert "0x" not in text


def test_parameter_made_inside_is_a_graph_break_not_a_frozen_constant():
    def f(x):
        p = nn.Parameter(x.detach() * 2)  # nn.Parameter(...) is not a torch function call
        return p + 1

    cg = capture(f, torch.randn(3))
    assert cg.gm is None and "cannot see" in cg.graph_break.reason


def test_module_training_flag_and_global_constants_are_guarded():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))

    def f(x):
        return model(x) * SCALE

    x = torch.randn(2, 4)
    cg = capture(f, x)
    assert cg.check_guards(x) is None
    model.eval()
    assert str(cg.check_guards(x)) == "model.training == True"
    model.train()
    globals()["SCALE"] = 3.0
    assert str(cg.check_guards(x)) == "G['SCALE'] == 2.0"
    globals()["SCALE"] = 2.0


SCALE = 2.0


def test_module_argument_is_a_graph_break():
    def f(m, x):
        return m(x)

    cg = capture(f, nn.Linear(2, 2), torch.randn(2))
    assert cg.gm is None and "nn.Module" in cg.graph_break.reason


def test_batchnorm_buffers_are_updated_by_the_graph():
    torch.manual_seed(0)
    bn_eager, bn_graph = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
    x = torch.randn(8, 4)
    cg = capture(bn_graph, x)  # runs once eagerly: buffers updated once
    bn_eager(x)
    out = run_gm(cg, x)
    torch.testing.assert_close(out, bn_eager(x))
    torch.testing.assert_close(bn_graph.running_mean, bn_eager.running_mean)
    assert bn_graph.num_batches_tracked.item() == bn_eager.num_batches_tracked.item() == 2


def test_graph_break_undoes_inplace_updates_of_inputs_and_buffers():
    buf = torch.zeros(3)
    bn = nn.BatchNorm1d(3)  # running stats are written by an op whose schema does not say so

    def f(x):
        x.mul_(2)
        x[0] = 7.0
        buf.add_(1)
        bn(x.expand(4, 3))
        if x.sum() > 0:
            return x
        return -x

    x = torch.ones(3)
    cg = capture(f, x)
    assert cg.gm is None
    torch.testing.assert_close(x, torch.ones(3))
    torch.testing.assert_close(buf, torch.zeros(3))
    torch.testing.assert_close(bn.running_mean, torch.zeros(3))
    assert bn.num_batches_tracked.item() == 0
    assert "NOT undone" not in cg.graph_break.reason


def test_undo_side_effects_lets_the_graph_replay_the_capturing_call():
    torch.manual_seed(0)
    bn_eager, bn_graph = nn.BatchNorm1d(3), nn.BatchNorm1d(3)

    def make_f(bn):
        def f(x):
            x.mul_(2)
            return F.dropout(bn(x), 0.5), x

        return f

    x0 = torch.randn(4, 3)
    x_eager, x_graph = x0.clone(), x0.clone()
    torch.manual_seed(1)
    expected = make_f(bn_eager)(x_eager)
    torch.manual_seed(1)
    cg = capture(make_f(bn_graph), x_graph)
    torch.testing.assert_close(cg.example_outputs, expected)
    cg.undo_side_effects()  # inputs, buffers and the RNG are back to before the capture
    torch.testing.assert_close(x_graph, x0)
    out = run_gm(cg, x_graph)
    torch.testing.assert_close(out, expected)  # same dropout mask: the RNG state was restored
    torch.testing.assert_close(x_graph, x_eager)
    torch.testing.assert_close(bn_graph.running_var, bn_eager.running_var)
    assert bn_graph.num_batches_tracked.item() == 1


def test_operators_and_methods_match_eager():
    def f(x, y):
        return (
            2 - x,
            1 / y,
            2 ** x.abs(),
            -x,
            x @ y,
            x // 0.7,
            x % 0.3,
            ~(x > y),
            x.add(y, alpha=2),
            x.T,
            x[1:, None],
            sum(row for row in x),
        )

    x, y = torch.randn(3, 3), torch.randn(3, 3)
    cg = capture(f, x, y)
    assert "sub = 2 - x" in cg.gm.code and "getattr_1 = x.T" in cg.gm.code
    x2, y2 = torch.randn(3, 3), torch.randn(3, 3)
    for got, want in zip(cg(x2, y2), f(x2, y2)):
        torch.testing.assert_close(got, want)
